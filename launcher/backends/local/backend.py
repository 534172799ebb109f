"""This machine: N node agents as child processes, meeting at a rendezvous on 127.0.0.1.

Each agent is a real torchrun with its own folder; GPUs, when there are any, are split between
the agents by CUDA_VISIBLE_DEVICES (gloo on CPU otherwise). A detached run's pipeline is a
process of its own session on this machine (launcher/backends/local/home.py).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from launcher.core.node_code import code_root
from launcher.execute.backend import (YES, Capabilities, GroupResult, NodeResult, no)
from launcher.job.request import RunRequest
from launcher.job.environment import login_env
from launcher.job.plans import plan_request
from launcher.job.recipe import check_recipe_for_hardware
from launcher.job.runplan import NodeCommand, Placement, RunPlan
from launcher.job.spec import JobError, module_in_workdir, workdir_folder_name

# Each agent is a torchrun and a Python process per rank: more than this on one machine is a
# typo (--nodes 100000 once tried to start them all).
MAX_LOCAL_NODES = 64


CHECKPOINTS = "checkpoints"   # LAUNCH_CHECKPOINT_DIR, in the run folder

_EVERYWHERE = {
    "restarts": YES, "resume": YES, "hang watch": YES, "gate": YES, "stragglers": YES,
    "report": YES, "checkpoint mirror": YES,
    "spot notices": no("no EC2 spot instance here: the nodes are processes of this machine"),
    "machine recovery": no("the nodes are processes of this machine: there is no other "
                           "machine to put in its place"),
    "nccl-tests": YES,
}
CAPABILITIES = Capabilities(attached=_EVERYWHERE, detached=_EVERYWHERE,
                            controller="this machine, as a process of its own session",
                            one_machine=True, shared_files=True)


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
    name = "local"
    capabilities = CAPABILITIES

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

    def to_json(self) -> dict[str, Any]:
        return {"cwd": self.cwd}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LocalBackend:
        return cls(cwd=settings.get("cwd"))

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

    def where_nodes(self, nodes: list[Node]) -> str:
        return "this machine"

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

    def plan(self, request: RunRequest, nodes: list[Node], *, uid: str = "UID",
             attempt: int = 0, shipped_to: str | None = None) -> RunPlan:
        """`shipped_to`: the copy the workdir went to (a sibling of the usual one when another
        run held that with other content: launcher/workdir/sync.py)."""
        recipe, job = request.recipe, request.job
        check_recipe_for_hardware(recipe, self.gpus(nodes))
        root = Path(self.cwd, request.runs_dir).resolve() / request.run_id
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
        port = request.rdzv_port or self.port
        notes = (f"rendezvous port {port} on 127.0.0.1 was free when planned (the recipe's "
                 f"port {recipe.rendezvous.port} is for clusters)",)
        return plan_request(request, nodes, placements, rdzv_port=port, uid=uid,
                            attempt=attempt, notes=notes)

    def open(self, request: RunRequest, nodes: list[Node], uid: str) -> LocalSession:
        """What the machine refuses is refused before the run folder exists; the workdir is
        shipped into this machine's copy before the plan (the copy used decides where the
        nodes run)."""
        check_recipe_for_hardware(request.recipe, self.gpus(nodes))
        job, workdir = request.job, request.workdir
        if job.kind == "module" and not (workdir is not None and
                                         module_in_workdir(job, workdir)):
            # The local nodes run launch's own interpreter: the module must be installed in it.
            import importlib.util

            top = str(job.target).split(".")[0]
            if importlib.util.find_spec(top) is None:
                raise JobError(f"{request.recipe.source}: job.module {job.target}: no module or "
                               f"package {top} in the workdir nor in {sys.executable}")
        shipped = None
        if workdir is not None:
            from launcher.workdir.sync import ship_local

            shipped = ship_local(workdir, local_workdir(job.workdir))
        return LocalSession(self, nodes, shipped, workdir)

    # ---- detached runs --------------------------------------------------------------------
    def hand_over(self, request: RunRequest, nodes: list[Node]) -> dict[str, Any]:
        """The run folder made here, the controller started in a session of its own."""
        from launcher.backends.local.home import start_controller
        from launcher.pipeline.handover import HANDOVER, HANDOVER_MODE, handover_doc
        from launcher.runs.folder import RunFolder

        runs = Path(self.cwd, request.runs_dir).resolve()
        uid = RunFolder.uid_for(runs, request.run_id, request.resume)
        folder = RunFolder.for_launch(runs, request.run_id, resume=request.resume, uid=uid)
        folder.write_json(HANDOVER, handover_doc(self, request, uid, str(runs)), mode=HANDOVER_MODE)
        pid = start_controller(folder.root, self.cwd)
        return {"run_dir": str(folder.root), "pid": pid, "where": f"this machine (pid {pid})"}

    def describe_hand_over(self, request: RunRequest, nodes: list[Node]) -> list[str]:
        from launcher.backends.local.home import controller_argv

        root = Path(self.cwd, request.runs_dir).resolve() / request.run_id
        return [f"  {' '.join(controller_argv(sys.executable, str(root)))} (its own session; "
                "output in controller.log and console.jsonl there)"]

    def controller_of(self, run_id: str) -> str:
        return "this machine"

    def find_run(self, run_id: str, runs_dir: str) -> dict[str, Any] | None:
        """A detached run of this machine whose record is gone: its folder's controller."""
        import json

        root = Path(self.cwd, runs_dir).resolve() / run_id
        try:
            pid = json.loads((root / "controller.json").read_text())["pid"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return {"run_id": run_id, "backend": self.name, "settings": self.to_json(),
                "run_dir": str(root), "pid": pid, "where": f"this machine (pid {pid})"}

    def home(self, handle: dict[str, Any]):
        from launcher.backends.local.home import local_home

        return local_home(handle)

    def fetch_job_files(self, targets, dest, dry_run: bool = False):
        """What the run wrote in its job folders: on this machine's disk (its nodes' files
        are here; launcher/workdir/job_files.py)."""
        from launcher.workdir.job_files import fetch_here

        return fetch_here(targets, dest, dry_run)

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


class LocalSession:
    """One attempt on this machine: the node processes are children of this process."""

    def __init__(self, backend: LocalBackend, nodes: list[Node], shipped, workdir):
        self.backend, self.nodes, self.shipped, self.workdir = backend, nodes, shipped, workdir

    def plan(self, request: RunRequest, uid: str, attempt: int) -> RunPlan:
        return self.backend.plan(request, self.nodes, uid=uid, attempt=attempt,
                                 shipped_to=self.shipped.dest if self.shipped else None)

    def announce(self) -> list[str]:
        if self.shipped is None:
            return []
        return [f"workdir {self.workdir.root}: {self.shipped.files_sent} of "
                f"{self.shipped.files_total} file(s) shipped to {self.shipped.dest}"]

    def code_record(self) -> dict | None:
        return None   # the nodes run launch's own copy, in place

    def process(self, command: NodeCommand, stamp: str, label: str | None = None):
        from launcher.backends.local.agent import LocalNodeProcess

        return LocalNodeProcess(command, stamp, label=label)

    def run(self, command: NodeCommand, stamp: str, label: str, line) -> int | None:
        from launcher.backends.local.agent import run_to_end

        return run_to_end(command, stamp, line)

    def collect(self, plan: RunPlan, folder, skip: set[str] = frozenset()) -> None:
        from launcher.backends.local.agent import reap_run

        reap_run(folder.stamp)

    def close(self) -> None:
        pass
