"""The job a run starts on every node, as a value: the user's own script, module or command,
or the bundled trainer. Pure: built from a recipe (or the command line), printed by --dry-run.

    script   torchrun on every node runs `python <script> ARGS` in the shipped workdir
    module   torchrun on every node runs `python -m <module> ARGS` there
    command  started once per node without torchrun (the user's own launcher), with the
             LAUNCH_* variables saying where the other nodes are (docs/jobs.md)
    trainer  the bundled ViT trainer (train/main.py), from the recipe's train: and ddp:
    workload launch's own measurements (`launch bench`, the collective gate): a program of
             launch's node code torchrun starts (`target` relative to the code folder, its
             `args`, then `--out-dir` the node's folder), given by the command that runs it

Every rank of a script, module or the trainer starts through launch's worker entry
(launch_node/worker.py), which counts LAUNCH_ATTEMPT across torchrun's own restarts, puts the workdir
first on PYTHONPATH, ties the rank's life to its agent, and then becomes the user's program.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError
from launcher.job.recipe import Recipe

KINDS = ("script", "module", "command", "trainer", "workload")
# Where a script's or module's arguments reach launch_node/worker.py (its JOB_ARGV: that file
# imports nothing of launch's; a test checks that the names agree).
JOB_ARGV_ENV = "LAUNCH_JOB_ARGV"


@dataclass(frozen=True)
class Job:
    kind: str                      # one of KINDS
    target: str | None = None      # the script (relative to the workdir, or absolute on the
    #                                nodes), the module, or a workload's program (relative to
    #                                launch's code folder); None for command and trainer
    args: tuple[str, ...] = ()     # after the script/module; the whole argv for a command
    workdir: str | None = None     # the local folder shipped to every node (absolute)
    setup: tuple[str, ...] = ()    # shell lines run in the shipped folder before the job

    @property
    def uses_torchrun(self) -> bool:
        return self.kind != "command"

    @property
    def is_trainer(self) -> bool:
        return self.kind == "trainer"

    def describe(self) -> str:
        """One line for people: what runs on every node."""
        if self.kind == "script":
            what = f"script {self.target}"
        elif self.kind == "module":
            what = f"module {self.target} (python -m)"
        elif self.kind == "command":
            what = "command (once per node, without launch's torchrun)"
        elif self.kind == "workload":
            what = "launch's own workload (launch_bench/bench.py, launch_bench/gate.py)"
        else:
            what = "the bundled ViT trainer (train/main.py)"
        if self.kind in ("script", "module") and self.args:
            what += f" with arguments {shlex.join(self.args)}"
        where = f" in {self.workdir} (shipped to every node)" if self.workdir else ""
        return what + where

    def worker_argv(self) -> list[str]:
        """What launch's worker entry (launch_node/worker.py) is given on torchrun's command
        line: the kind and the program, never the job's arguments (worker_env carries them).
        torchrun's parser reads every item of its argv, the program's too: an argument it can
        take for one of its own options (`--nn`, an ambiguous `--max`) would be taken, or end
        the run. A script named `-x.py` is given as `./-x.py` for the same reason."""
        if self.kind == "module":
            return ["module", str(self.target)]
        if self.kind == "script":
            target = str(self.target)
            return ["script", f"./{target}" if target.startswith("-") else target]
        raise ValueError(f"a {self.kind} job has no worker entry")

    def worker_env(self) -> dict[str, str]:
        """The job's arguments, verbatim, for the worker entry: a JSON list in JOB_ARGV_ENV,
        which no parser but the worker's reads (ASCII: bytes that are not UTF-8 travel as
        \\udcXX escapes and come back as the same bytes)."""
        if self.kind not in ("script", "module"):
            return {}
        return {JOB_ARGV_ENV: json.dumps(list(self.args))}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "args": list(self.args),
                "workdir": self.workdir, "setup": list(self.setup)}


def workload(program: str, *args: str) -> Job:
    """launch's own measuring program (launch_bench/...) as the job torchrun starts."""
    return Job("workload", program, tuple(args))


def job_of(recipe: Recipe) -> Job:
    """The recipe's job; its workdir made absolute from the recipe's folder."""
    workdir = None
    if recipe.workdir is not None:
        workdir = str((Path(recipe.base_dir) / recipe.workdir).resolve())
    setup = tuple(recipe.setup)
    spec = recipe.job
    if spec is None:
        return Job("trainer", workdir=workdir, setup=setup)
    if spec.command is not None:
        return Job("command", args=(*spec.command, *spec.args), workdir=workdir, setup=setup)
    if spec.module is not None:
        return Job("module", spec.module, tuple(spec.args), workdir, setup)
    return Job("script", spec.script, tuple(spec.args), workdir, setup)


class JobError(LauncherError):
    """The job names something that is not there: refused before anything starts."""


def check_target(job: Job, manifest: Any, source: str) -> None:
    """A script or a module the shipped workdir must hold, looked up in its manifest (what is
    shipped, not what is on this disk): a missing one, or one .gitignore leaves out, is named
    now rather than by a rank's traceback on every node. A module that is not in the workdir
    may be installed on the nodes: preflight looks there (launcher/backends/ssh/preflight.py)."""
    if manifest is None or job.kind not in ("script", "module") or \
            str(job.target).startswith("/"):
        return
    shipped = {e.path for e in manifest.entries}
    if job.kind == "script":
        wanted = posixpath.normpath(str(job.target))
        if wanted in shipped:
            return
        # An excluded folder is named with a trailing `/`: it leaves out all below it.
        why = next((e.reason for e in manifest.excluded
                    if e.path == wanted or (e.path.endswith("/") and wanted.startswith(e.path))),
                   None)
        raise JobError(f"{source}: job.script {job.target}: "
                       + (f"left out of the shipped workdir ({why}): change that rule"
                          if why else f"no such file in the workdir {manifest.root}"))


def module_in_workdir(job: Job, manifest: Any) -> bool:
    """Whether the module's top-level package or module is among the shipped files."""
    top = str(job.target).split(".")[0]
    return any(e.path == f"{top}.py" or e.path.startswith(f"{top}/")
               for e in manifest.entries)


def workdir_folder_name(local_workdir: str) -> str:
    """The name of a workdir's shipped copy on a node: its folder's name (made safe as a
    folder name) and a hash of its full local path, so that two projects called `src` never
    share a copy, and the same project always ships into the same one (its setup's outputs
    stay there; only what changed ships again)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", Path(local_workdir).name).lstrip(".-") or "workdir"
    digest = hashlib.sha256(local_workdir.encode()).hexdigest()[:12]
    return f"{base[:48]}-{digest}"


def script_recipe(*, script: str | None, module: str | None, args: list[str] | tuple = (),
                  workdir: str = ".", nproc_per_node: int | None = None,
                  setup: list[str] | tuple = (), nodes: int | None = None) -> dict[str, Any]:
    """The recipe (as YAML data) that `launch run SCRIPT.py -- ARGS` and `launch run -m MODULE`
    stand for; `launch init --script` writes the same."""
    stem = Path(script).stem if script else str(module).split(".")[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip(".-_")[:64] or "job"
    job: dict[str, Any] = {"script": script} if script else {"module": module}
    if args:
        job["args"] = list(args)
    data: dict[str, Any] = {"name": name}
    if nodes is not None:
        data["nodes"] = nodes
    if nproc_per_node is not None:
        data["nproc_per_node"] = nproc_per_node
    data.update(job=job, workdir=workdir)
    if setup:
        data["setup"] = list(setup)
    return data
