"""This machine: N node agents as child processes, meeting at a rendezvous on 127.0.0.1.

Each agent is a real torchrun with its own folder; GPUs, when there are any, are split between
the agents by CUDA_VISIBLE_DEVICES (gloo on CPU otherwise).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.execute.backend import GroupResult, LaunchOptions, NodeResult, Program
from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from launcher.core.node_code import code_root
from launcher.job.environment import login_env
from launcher.job.recipe import Recipe, check_recipe_for_hardware
from launcher.job.runplan import Placement, RunPlan, plan_run
from launcher.job.spec import Job, JobError, default_job, module_in_workdir, workdir_folder_name

# Each agent is a torchrun and a Python process per rank: more than this on one machine is a
# typo (--nodes 100000 once tried to start them all).
MAX_LOCAL_NODES = 64


CHECKPOINTS = "checkpoints"   # LAUNCH_CHECKPOINT_DIR, in the run folder


def local_workdir(workdir: str) -> Path:
    """Where this machine keeps the shipped copy of a workdir (kept between runs)."""
    from launcher.core.home import launch_home

    return launch_home() / "workdirs" / workdir_folder_name(workdir)


def local_nodes(count: int) -> list[Node]:
    """N node agents on this machine; they all talk over loopback."""
    return [
        Node(name=f"node{i}", address="127.0.0.1", private_address="127.0.0.1", interface="lo")
        for i in range(count)
    ]


class LocalBackend:
    kind = "local"

    def __init__(self, *, gpus_total: int | None = None, cpus_total: int | None = None,
                 port: int | None = None, cwd: str | None = None,
                 environ: dict[str, str] | None = None):
        # Facts of this machine, looked up on first use (torch's import costs a second):
        # given explicitly, planning is pure and repeatable (the tests do that).
        self._gpus_total, self._cpus_total, self._port = gpus_total, cpus_total, port
        self.cwd = cwd or os.getcwd()
        # launch's environment, of which the ranks get what a login would set
        # (launcher/job/environment.py): they share this machine, not launch's shell.
        self.environ = dict(os.environ) if environ is None else environ

    # ---- facts of this machine ------------------------------------------------------------
    @functools.cached_property
    def gpus_total(self) -> int:
        if self._gpus_total is not None:
            return self._gpus_total
        from launcher.backends.local.agent import local_gpu_count

        return local_gpu_count()

    @functools.cached_property
    def cpus_total(self) -> int:
        return self._cpus_total or os.cpu_count() or 1

    @functools.cached_property
    def port(self) -> int:
        if self._port is not None:
            return self._port
        from launcher.backends.local.agent import free_port

        return free_port()

    # ---- Backend -------------------------------------------------------------------------
    def describe(self, count: int) -> str:
        return f"{count} node(s) on this machine"

    def nodes(self, count: int | None) -> list[Node]:
        count = 2 if count is None else count
        if not 1 <= count <= MAX_LOCAL_NODES:
            raise LauncherError(f"--nodes {count}: this machine runs 1 to {MAX_LOCAL_NODES} "
                                "local node agents")
        gpus = self.gpus_total
        if gpus and gpus < count:
            raise LauncherError(
                f"--nodes {count} on this machine needs at least one GPU per node but it has "
                f"{gpus}; use --nodes {gpus}, or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run "
                "on CPU with gloo")
        per_node = gpus // count if gpus else 0
        return [replace(n, gpus=per_node) for n in local_nodes(count)]

    def gpus(self, nodes: list[Node]) -> list[int]:
        return [n.gpus or 0 for n in nodes]

    def plan(self, recipe: Recipe, nodes: list[Node], run_id: str, *, runs_dir: str = "runs",
             program: Program | None = None, rdzv_port: int | None = None,
             job: Job | None = None, workdir: Any = None, attempt: int = 0,
             uid: str = "UID", shipped_to: str | None = None) -> RunPlan:
        """`shipped_to`: the copy the workdir went to (a sibling of the usual one when another
        run held that with other content: launcher/workdir/sync.py)."""
        from launcher.job.mirror import with_mirror

        check_recipe_for_hardware(recipe, self.gpus(nodes))
        job = job or default_job(recipe, program)
        root = Path(self.cwd, runs_dir).resolve() / run_id
        code = str(code_root())
        per_node = nodes[0].gpus or 0
        # The local nodes share this machine, so they share one shipped copy of the workdir.
        shipped = shipped_to or (str(local_workdir(job.workdir)) if job.workdir else None)
        placements = {
            n.name: Placement(
                python=sys.executable, code_dir=code, run_dir=str(root / n.name), cwd=self.cwd,
                cpus=max(1, self.cpus_total // len(nodes)),
                visible_gpus=tuple(range(i * per_node, (i + 1) * per_node)) if per_node
                else None, workdir=shipped, checkpoint_dir=str(root / CHECKPOINTS),
                login_env=login_env(self.environ),
            )
            for i, n in enumerate(nodes)
        }
        port = rdzv_port or self.port
        notes = (f"rendezvous port {port} on 127.0.0.1 was free when planned (the recipe's "
                 f"port {recipe.rendezvous.port} is for clusters)",)
        plan = plan_run(recipe, nodes, run_id, placements, rdzv_port=port, notes=notes,
                        program=program, job=job, workdir=workdir, attempt=attempt)
        return with_mirror(plan, recipe, placements, uid)

    def launch(self, recipe: Recipe, nodes: list[Node], run_id: str, options: LaunchOptions,
               *, program: Program | None = None, rdzv_port: int | None = None,
               job: Job | None = None, workdir: Any = None) -> dict:
        from launcher.backends.local.agent import LocalNodeProcess, reap_run
        from launcher.execute.mirrored import watcher, with_restore
        from launcher.execute.prepare import prepare_local
        from launcher.execute.runner import execute_plan
        from launcher.runs.folder import RunFolder

        # What the machine refuses is refused before the run folder exists.
        check_recipe_for_hardware(recipe, self.gpus(nodes))
        job = job or default_job(recipe, program)
        if job.kind == "module" and not (workdir is not None and
                                         module_in_workdir(job, workdir)):
            # The local nodes run launch's own interpreter: the module must be installed in it.
            import importlib.util

            if importlib.util.find_spec(str(job.target).split(".")[0]) is None:
                raise JobError(f"{recipe.source}: job.module {job.target}: no module or "
                               f"package {str(job.target).split('.')[0]} in the workdir nor "
                               f"in {sys.executable}")
        shipped = None
        if workdir is not None:
            from launcher.workdir.sync import ship_local

            # Before the plan: the copy used decides where the nodes run.
            shipped = ship_local(workdir, local_workdir(job.workdir))
        folder = RunFolder.for_launch(Path(self.cwd, options.runs_dir), run_id,
                                      resume=options.resume)
        plan = self.plan(recipe, nodes, run_id, runs_dir=options.runs_dir, program=program,
                         rdzv_port=rdzv_port, job=job, workdir=workdir,
                         attempt=folder.attempt_base(), uid=folder.uid or "UID",
                         shipped_to=shipped.dest if shipped else None)
        procs = [LocalNodeProcess(cmd, folder.stamp) for cmd in plan.nodes]
        store = LocalNodeProcess(plan.store, folder.stamp, label="store") if plan.store else None
        prepare = with_restore(prepare_local(plan, workdir, shipped), plan)
        return execute_plan(plan, folder, procs, grace_s=options.grace_s,
                            display=options.display, after=lambda: reap_run(folder.stamp),
                            store=store, prepare=prepare,
                            services=watcher(plan, lambda cmd: LocalNodeProcess(
                                cmd, folder.stamp, label="mirror")))

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        """Local nodes share one machine: the command runs once, answered for every node."""
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
            result = dict(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
        except FileNotFoundError:
            result = dict(exit_code=127, stderr=f"{argv[0]}: not found")
        except (OSError, subprocess.TimeoutExpired) as err:
            result = dict(error=f"{argv[0]} failed: {err}")
        return GroupResult({n.name: NodeResult(n.name, **result) for n in nodes})
