"""Slurm: the run is one batch job, submitted from the login node; Slurm picks the nodes.

    launch run RECIPE --slurm --nodes N [--partition P] [--account A] [--time HH:MM:SS]
                      [--sbatch-arg=--qos=high]... [--python PATH] [--gpus-per-node G]

The job script (launcher/backends/slurm/sbatch.py) starts one torchrun agent per node with srun and the
rendezvous store on the first node; the run folder, where the code and every node's output
go, must be on a filesystem the compute nodes share with the login node (Slurm's normal
setup: home directories or a parallel filesystem). launch follows the nodes' files, shows the
job's state, and stops the run by cancelling the job.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from launcher.backends.slurm.flags import SLURM_FLAGS
from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError, RecipeError
from launcher.execute.backend import GroupResult, LaunchOptions, NodeResult, Program
from launcher.job.recipe import Recipe, Slurm, check_recipe_for_hardware
from launcher.job.runplan import Placement, plan_run
from launcher.job.setup import setup_key
from launcher.job.spec import Job, default_job, workdir_folder_name
from launcher.backends.slurm.sbatch import (ADDR, ATTEMPT, HEAD_ADDR, IFACE, NODE, NODE_ADDRS, NODE_RANK,
                             OMP_THREADS, SlurmJob)
from launcher.job.sbatch_args import batch_path_problem
from launcher.backends.slurm.slurmctl import (Partition, SlurmError, missing_clients, partitions, slurm,
                               where_conf)

MAX_SLURM_NODES = 4096


def slurm_workdir(runs: Path, workdir: str, digest: str | None) -> Path:
    """The workdir's shipped copy the nodes share: beside the runs, on the filesystem they see,
    one per content (`digest`). A job waits in the queue holding nothing, so a copy shared by
    every version of the project would change under a submitted job when its author edits
    and submits again; one copy per content never does. Runs of the same content share it
    (setup runs once; a change of content runs setup again anyway: its key holds the
    digest)."""
    folder = runs / ".workdirs" / workdir_folder_name(workdir)
    return folder / digest[:16] if digest else folder


def slurm_settings(recipe_block: Slurm | None, flags: dict[str, Any]) -> Slurm:
    """The recipe's slurm block with the flags given on the command line on top (extra sbatch
    arguments add to the recipe's: sbatch takes the last of a repeated option)."""
    data = (recipe_block or Slurm()).model_dump()
    for key, value in flags.items():
        if value is None or value == []:
            continue
        data[key] = [*data[key], *value] if key == "sbatch_args" else value
    try:
        return Slurm.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        where = SLURM_FLAGS.get(key, key) if key in flags and flags[key] not in (None, []) \
            else f"slurm.{key}"
        raise LauncherError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


class SlurmBackend:
    kind = "slurm"

    def __init__(self, flags: dict[str, Any] | None = None, cwd: str | None = None):
        self.flags = flags or {}
        self.cwd = cwd or os.getcwd()
        slurm_settings(None, self.flags)   # a bad flag is reported before anything else

    def settings(self, recipe: Recipe | None) -> Slurm:
        return slurm_settings(recipe.slurm if recipe else None, self.flags)

    # ---- Backend -------------------------------------------------------------------------
    def describe(self, count: int) -> str:
        part = self.flags.get("partition")
        where = f"partition {part}" if part else "the default partition"
        return f"{count} node(s) of a Slurm allocation ({where})"

    def nodes(self, count: int | None) -> list[Node]:
        """Stand-ins for the nodes Slurm will allocate, in the allocation's order: their names
        and addresses are known once the job runs."""
        count = 2 if count is None else count
        if not 1 <= count <= MAX_SLURM_NODES:
            raise LauncherError(f"--nodes {count}: a Slurm job has 1 to {MAX_SLURM_NODES} nodes")
        gpus = self.flags.get("gpus_per_node")
        return [Node(name=f"allocated{i}", address="", private_address="", gpus=gpus)
                for i in range(count)]

    def gpus(self, nodes: list[Node]) -> list[int]:
        return [n.gpus or 0 for n in nodes]

    def plan(self, recipe: Recipe, nodes: list[Node], run_id: str, *, runs_dir: str = "runs",
             program: Program | None = None, rdzv_port: int | None = None,
             job: Job | None = None, workdir: Any = None, attempt: int = 0,
             shipped_to: str | None = None) -> SlurmJob:
        """The batch job, pure: nothing is asked of Slurm (a real run asks it in preflight).
        `shipped_to`: the copy the workdir went to (launch ships before it plans)."""
        if recipe.checkpoint is not None and recipe.checkpoint.mirror is not None:
            # The watcher would run beside the job script; not built yet (docs/recovery.md).
            raise RecipeError(recipe.source, "checkpoint.mirror",
                              "is not on Slurm yet (the run folder is on the shared "
                              "filesystem already); run with -i/--cluster or --local, or "
                              "leave it out")
        job = job or default_job(recipe, program)
        settings = self.settings(recipe)
        gpus = nodes[0].gpus if nodes[0].gpus is not None else settings.gpus_per_node
        notes = []
        if gpus is None:
            notes.append("GPUs per node not known without asking Slurm: a real run takes "
                         "them from the partition's GRES (gpu:N) or --gpus-per-node; "
                         "nproc_per_node auto counts 1 here")
        else:
            check_recipe_for_hardware(recipe, [gpus] * len(nodes))
            settings = settings.model_copy(update={"gpus_per_node": gpus})
        notes.append("Slurm picks the nodes: the job script finds the first node (the head, "
                     "where the rendezvous store runs) and each node's own address and "
                     "interface when it runs")
        runs = Path(self.cwd, runs_dir).resolve()
        run_dir = str(runs / run_id)
        if batch_path_problem(run_dir):
            raise LauncherError(f"--runs-dir: {batch_path_problem(run_dir)}")
        template = Node(name=NODE, address=ADDR, private_address=ADDR, interface=IFACE,
                        gpus=gpus or 0)
        # Every path absolute: the job runs in the workdir, its files go to the node's folder.
        # The nodes share the workdir's copy, beside the runs on the shared filesystem.
        place = Placement(python=settings.python, code_dir=f"{run_dir}/code",
                          run_dir=f"{run_dir}/{NODE}", cwd=f"{run_dir}/{NODE}",
                          extra_env={"OMP_NUM_THREADS": OMP_THREADS},
                          workdir=shipped_to or (str(slurm_workdir(
                              runs, job.workdir, workdir.digest if workdir else None))
                              if job.workdir else None),
                          checkpoint_dir=f"{run_dir}/checkpoints")
        port = rdzv_port or recipe.rendezvous.port
        planned = plan_run(recipe, [template] * len(nodes), run_id, {NODE: place},
                           rdzv_port=port, rdzv_host=HEAD_ADDR, program=program, job=job,
                           workdir=workdir, attempt=ATTEMPT,
                           node_cluster_env={
                               "LAUNCH_NODE_RANK": NODE_RANK,
                               "LAUNCH_NUM_NODES": str(len(nodes)),
                               "LAUNCH_NODE_ADDRS": NODE_ADDRS, "LAUNCH_HEAD_ADDR": HEAD_ADDR,
                               "LAUNCH_RDZV_PORT": str(port),
                               "LAUNCH_GPUS_PER_NODE": str(gpus or 0)})
        key = setup_key(workdir.digest if workdir is not None else None, job.setup)
        return SlurmJob(run_id=run_id, recipe_name=recipe.name,
                        recipe_source=recipe.source, run_dir=run_dir, nnodes=len(nodes),
                        nproc_per_node=planned.nproc_per_node, rdzv_port=port,
                        settings=settings, node=planned.nodes[0], store=planned.store,
                        notes=tuple(notes), job=job, workdir=workdir,
                        setup_key=key if job.setup else None, recovery=planned.recovery,
                        attempt_base=attempt, recipe_base_dir=planned.recipe_base_dir)

    def preflight(self, recipe: Recipe | None, count: int) -> Partition:
        """Slurm's client commands are here and the partition has `count` nodes that take
        jobs; every problem is an exit-2 error naming what to do."""
        missing = missing_clients()
        if missing:
            raise SlurmError(f"the Slurm client commands {', '.join(missing)} are not on PATH: "
                             "launch --slurm runs on a Slurm login node (apt-get install "
                             "slurm-client; or load the cluster's slurm module)")
        settings = self.settings(recipe)
        found = partitions()
        listing = "; ".join(p.describe() for p in found.values()) or "none"
        if settings.partition:
            names = settings.partition.split(",")
            unknown = [n for n in names if n not in found]
            if unknown:
                raise SlurmError(f"--partition {settings.partition}: no partition "
                                 f"{', '.join(unknown)} in {where_conf()}; partitions: {listing}")
        else:
            names = [p.name for p in found.values() if p.default]
            if not names:
                raise SlurmError(f"{where_conf()} has no default partition: pass --partition "
                                 f"(or slurm.partition); partitions: {listing}")
        chosen = [found[n] for n in names]
        down = [p.name for p in chosen if not p.up]
        if down and len(down) == len(chosen):
            raise SlurmError(f"partition {', '.join(down)} is down; partitions: {listing}")
        usable = sorted({n for p in chosen if p.up for n in p.usable})
        if len(usable) < count:
            raise SlurmError(
                f"--nodes {count}: partition {', '.join(names)} has {len(usable)} node(s) that "
                f"take jobs ({', '.join(usable) or 'none'}); partitions: {listing}")
        merged = Partition(",".join(names), nodes={n: s for p in chosen
                                                   for n, s in p.nodes.items()})
        for p in chosen:
            merged.cpus.update(p.cpus)
            merged.gpus.update(p.gpus)
        return merged

    def launch(self, recipe: Recipe, nodes: list[Node], run_id: str, options: LaunchOptions,
               *, program: Program | None = None, rdzv_port: int | None = None,
               job: Job | None = None, workdir: Any = None) -> dict:
        from launcher.backends.slurm.job import ATTEMPT_FILES, run_job
        from launcher.runs.folder import RunFolder

        partition = self.preflight(recipe, len(nodes))
        if nodes[0].gpus is None and self.settings(recipe).gpus_per_node is None:
            # A job gets the GPUs it asks for; ask for what every usable node has.
            have = [partition.gpus.get(n, 0) for n in partition.usable]
            nodes = [replace(n, gpus=min(have) if have else 0) for n in nodes]
        # Restarts happen inside the job (its script starts every node again); `--resume` is a
        # new job continuing in the run's folder, its earlier attempt's files moved aside.
        job = job or default_job(recipe, program)
        shipped = None
        if workdir is not None:
            from launcher.workdir.sync import ship_local

            # Staged once on the shared filesystem, before the plan: the copy used is where
            # the nodes run (a sibling when a running job changed files in its own).
            runs = Path(self.cwd, options.runs_dir).resolve()
            shipped = ship_local(workdir, slurm_workdir(runs, job.workdir, workdir.digest))
        folder = RunFolder.for_launch(Path(self.cwd, options.runs_dir), run_id,
                                      resume=options.resume, also=ATTEMPT_FILES)
        batch = self.plan(recipe, nodes, run_id, runs_dir=options.runs_dir, program=program,
                          rdzv_port=rdzv_port, job=job, workdir=workdir,
                          attempt=folder.attempt_base(),
                          shipped_to=shipped.dest if shipped else None)
        return run_job(batch, folder, options,
                       recipe.source if Path(recipe.source).is_file() else None, recipe.text,
                       shipped=shipped)

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        """argv once on each of len(nodes) nodes, through srun in an allocation of its own;
        results by the allocated nodes' names, in the allocation's order."""
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        self.preflight(None, len(nodes))
        return srun_on_nodes(self.settings(None), len(nodes), argv, timeout)


# ---- run_on_all ----------------------------------------------------------------------------

# Each task names its node first and reports its command's exit code last.
TASK_SCRIPT = 'echo "@launch-node $SLURMD_NODENAME"; "$@"; echo "@launch-exit $?"'


def srun_takes() -> set[str]:
    """The long options the installed srun takes (its --help): a recipe's sbatch arguments
    that srun would refuse (--mail-type, --array, ...) are a batch job's only."""
    proc = slurm(["srun", "--help"], timeout=30)
    return set(re.findall(r"--([a-z][a-z0-9-]*)", proc.stdout + proc.stderr))


def srun_argv(settings: Slurm, count: int, argv: list[str], timeout: float,
              takes: set[str]) -> list[str]:
    """srun in an allocation of its own, with the sbatch arguments srun also `takes` (they are
    stored spelled out in full: launcher/job/sbatch_args.py)."""
    minutes = max(1, math.ceil(timeout / 60))
    out = ["srun", f"--nodes={count}", "--ntasks-per-node=1", "--label",
           "--kill-on-bad-exit=0", f"--time={minutes}", "--job-name=launch-run-on-all"]
    if settings.partition:
        out.append(f"--partition={settings.partition}")
    if settings.account:
        out.append(f"--account={settings.account}")
    shared = [a for a in settings.sbatch_args
              if a.startswith("--") and a[2:].split("=", 1)[0] in takes]
    return [*out, *shared, "bash", "-c", TASK_SCRIPT, "launch-task", *argv]


def parse_labelled(text: str) -> dict[int, list[str]]:
    """srun --label output: "<task>: line" -> lines by task."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+): ?(.*)$", line)
        if m:
            out.setdefault(int(m[1]), []).append(m[2])
    return out


def srun_on_nodes(settings: Slurm, count: int, argv: list[str], timeout: float) -> GroupResult:
    cmd = srun_argv(settings, count, argv, timeout, srun_takes())
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        # The allocation may have to wait for nodes: a minute on top of the command's time.
        out, err = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)   # srun cancels its step and gives the nodes back
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    stdout, stderr = parse_labelled(out), parse_labelled(err)
    results: dict[str, NodeResult] = {}
    for task in range(count):
        lines = stdout.get(task, [])
        name = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("@launch-node ")),
                    f"task{task}")
        code = next((int(ln.split(" ", 1)[1]) for ln in lines
                     if ln.startswith("@launch-exit ") and ln.split(" ", 1)[1].isdigit()), None)
        body = [ln for ln in lines if not ln.startswith(("@launch-node ", "@launch-exit "))]
        if code is None:
            own = [ln for ln in err.splitlines() if ln.startswith("srun:")]
            why = " ".join(own[-3:]) or f"no answer from the node (srun exit {proc.returncode})"
            results[name] = NodeResult(name, error=why)
        else:
            results[name] = NodeResult(name, code, "\n".join(body) + ("\n" if body else ""),
                                       "\n".join(stderr.get(task, [])))
    return GroupResult(results)
