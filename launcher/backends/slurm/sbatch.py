"""A run as one Slurm batch job, as a value: the sbatch command line and the job script.

The script keeps only what sbatch needs: it starts the run's pipeline (launch's controller,
launcher/commands/controller.py: the same Python as every backend's, with restarts, the hang
watch, the checkpoint mirror and the report) on the allocation's first node, from the run's
own copy of launch in the run folder. The controller starts every node's processes as job
steps (srun), so Slurm's accounting, limits and `scancel` cover all of them.

    sbatch --parsable --job-name=RUN_ID --nodes=N --ntasks-per-node=1 ... RUN_DIR/job.sbatch

Pure: built from the request and the run folder only, so `--dry-run` prints exactly what a
real run submits, and contacts nothing. Every value reaches the script through `shell_word`
(shlex), never pasted.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from launcher.job.recipe import Slurm
from launcher.job.runplan import RunPlan

SCRIPT_NAME = "job.sbatch"
JOB_OUT = "slurm-{job_id}.out"  # the batch script's own output (sbatch --output)
CONTROLLER_MODULE = "launcher.commands.controller"


def shell_word(value: str) -> str:
    """One argument as one shell word (shlex): the one place where recipe values meet the
    batch script."""
    return shlex.quote(value) if value else "''"


def comment(text: str) -> str:
    """A shell comment line: a newline in a path must not end it."""
    return "# " + re.sub(r"[\r\n]", " ", text)


@dataclass(frozen=True)
class SlurmJob:
    """The batch job of one run: what --dry-run prints and what a real run submits."""

    run_id: str
    recipe_name: str
    recipe_source: str
    run_dir: str                 # absolute; on a filesystem the compute nodes share
    nnodes: int
    settings: Slurm
    controller_python: str       # launch's interpreter, as the compute nodes see it
    plan: RunPlan | None = None  # what the controller would start, with stand-in nodes

    @property
    def world_size(self) -> int:
        return self.plan.world_size if self.plan is not None else self.nnodes

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/{SCRIPT_NAME}"

    # ---- the sbatch command line ------------------------------------------------------
    def sbatch_argv(self, sbatch: str = "sbatch") -> list[str]:
        s = self.settings
        # The extra arguments first: one missing its value (`--qos` alone) then swallows one
        # of launch's options, which sbatch refuses, rather than the script's path.
        argv = [sbatch, "--parsable", *s.sbatch_args, f"--job-name={self.run_id}",
                f"--nodes={self.nnodes}",
                # One run is one attempt: a job Slurm requeued (its node failed) would start
                # again into the same run folder while launch reports the first one's end.
                "--ntasks-per-node=1", "--no-requeue", f"--chdir={self.run_dir}",
                f"--output={self.run_dir}/{JOB_OUT.format(job_id='%j')}"]
        if s.exclusive:
            argv.append("--exclusive")
        if s.partition:
            argv.append(f"--partition={s.partition}")
        if s.account:
            argv.append(f"--account={s.account}")
        if s.time:
            argv.append(f"--time={s.time}")
        if s.gpus_per_node:
            argv.append(f"--gpus-per-node={s.gpus_per_node}")
        return [*argv, self.script_path]

    # ---- the script --------------------------------------------------------------------
    def controller_argv(self) -> list[str]:
        return [self.controller_python, "-m", CONTROLLER_MODULE, self.run_dir]

    def script(self) -> str:
        header = comment(f"launch run {self.run_id}: recipe {self.recipe_name} "
                         f"({self.recipe_source}), {self.nnodes} node(s)")
        submitted = comment(f"Submitted by launch: {shlex.join(self.sbatch_argv())}")
        code = shell_word(f"{self.run_dir}/code")
        controller = " ".join(shell_word(a) for a in self.controller_argv())
        return f"""#!/bin/bash
{header}
{submitted}
# The run's pipeline (launch itself, from the run's own copy of it in code/) on the
# allocation's first node: it starts every node's processes as job steps (srun), restarts
# them, watches for hangs and writes the run's summary and report; its console is
# console.jsonl here (`launch attach {self.run_id}`).
PYTHONPATH={code}${{PYTHONPATH:+:$PYTHONPATH}} exec {controller}
"""

    # ---- printing ----------------------------------------------------------------------
    def render(self) -> str:
        s = self.settings
        where = ", ".join(x for x in (f"partition {s.partition}" if s.partition else
                                      "the default partition",
                                      f"account {s.account}" if s.account else "",
                                      f"time limit {s.time}" if s.time else "") if x)
        lines = [
            f"run {self.run_id}: recipe {self.recipe_name} ({self.recipe_source})",
            f"  Slurm batch job: {self.nnodes} node(s), {where}; the run's pipeline runs in "
            "it, on the allocation's first node",
            "",
            "submit:",
            "  " + shlex.join(self.sbatch_argv()),
            "",
            f"{self.script_path}:",
            self.script(),
        ]
        if self.plan is not None:
            lines += ["what the pipeline starts in the job (the nodes' names and addresses "
                      "are Slurm's, known once it runs; shown here as allocated0..):", "",
                      self.plan.render()]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "backend": "slurm",
            "recipe": {"name": self.recipe_name, "source": self.recipe_source},
            "nnodes": self.nnodes,
            "run_dir": self.run_dir,
            "sbatch": {"argv": self.sbatch_argv(), "script": self.script_path},
            "script": self.script(),
            "plan": self.plan.to_json() if self.plan is not None else None,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)
