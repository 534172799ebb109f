"""A fleet of stand-in nodes for what one box cannot hold (issue 37): the launcher's own pipeline
(launcher/execute/attempt.py: the supervisor, the many-node screen, the line router, the step
lines, the hang watch's looks, the timeline, the summary and the report) driven against N nodes
that answer in-process, as the backend contract (launcher/execute/backend.py) asks, without
running Python, torch or SSH.

Each node prints what a node of a command job that starts torchrun prints: torchrun's start,
each rank's start, a LAUNCH_STEP line per rank per step (docs/jobs.md), each rank's end, and
exits 0; or, on the node told to fail, a rank's traceback at a step and exit 1. It answers the
hang watch's looks (its ranks' processes, their CPU time growing) and stops when signalled.

What it leaves out is the transport: the SSH connection, channels and threads fabric keeps per
node (launcher/backends/ssh/), measured on the lab instead (benchmarks/scale.py --lab). A
benchmark's stand-in, not a backend a user can pick (launcher/backends/__init__.py lists those).
"""

from __future__ import annotations

import posixpath
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from launcher.cluster.inventory import Node
from launcher.execute.backend import YES, Capabilities, GroupResult, NodeResult, no
from launcher.job.plans import plan_request
from launcher.job.request import RunRequest
from launcher.job.runplan import NodeCommand, Placement, RunPlan

_NOT_HERE = no("a benchmark's stand-in fleet")
CAPABILITIES = Capabilities(
    attached={"restarts": YES, "resume": _NOT_HERE, "hang watch": YES, "gate": _NOT_HERE,
              "stragglers": YES, "report": YES, "checkpoint mirror": _NOT_HERE,
              "spot notices": _NOT_HERE, "machine recovery": _NOT_HERE,
              "nccl-tests": _NOT_HERE},
    detached={feature: _NOT_HERE for feature in
              ("restarts", "resume", "hang watch", "gate", "stragglers", "report",
               "checkpoint mirror", "spot notices", "machine recovery", "nccl-tests")},
    controller="nowhere: the stand-in fleet runs in the benchmark's process")


class Script:
    """What every stand-in node does: `ranks` ranks, `steps` steps of `step_s` seconds each;
    `fail` names a node whose rank 1 raises at step `fail_step`."""

    def __init__(self, ranks: int = 8, steps: int = 5, step_s: float = 1.0,
                 fail: str | None = None, fail_step: int = 2):
        self.ranks, self.steps, self.step_s = ranks, steps, step_s
        self.fail, self.fail_step = fail, fail_step
        self.lock = threading.Lock()
        self.started: dict[str, float] = {}     # node -> when launch started it
        self.first_seen: dict[str, float] = {}  # node -> when launch's reader took its 1st line

    def mark(self, table: dict[str, float], node: str) -> None:
        with self.lock:
            table.setdefault(node, time.monotonic())


class StandinProcess:
    """One node's process as the supervisor sees it (launcher/execute/backend.py NodeProcess),
    and the hang watch's looks at it (activity, dump_ranks, kill_ranks)."""

    def __init__(self, command: NodeCommand, script: Script, index: int, world: int,
                 label: str | None = None):
        self.name, self.label, self.command = command.name, label, command
        self.script, self.index, self.world = script, index, world
        self.code: int | None = None
        self.stopped = threading.Event()
        self.began = 0.0
        self.attempt_offset = 0

    def start(self) -> None:
        self.code, self.began = None, time.monotonic()
        self.stopped.clear()
        self.script.mark(self.script.started, self.name)

    def lines(self) -> Iterator[str]:
        s, node = self.script, self.name
        yield (f"I1203 10:00:00.000000 {1000 + self.index} torch/distributed/run.py:792] "
               f"Starting elastic_operator with launch configs: nnodes: {self.world}, "
               f"nproc_per_node: {s.ranks}")
        # The reader came back for the next line: the first one went through launch's router.
        s.mark(s.first_seen, node)
        base = self.index * s.ranks
        for r in range(s.ranks):
            yield f"[default{r}]:rank {base + r} of {self.world * s.ranks} on {node}: starting"
        for step in range(1, s.steps + 1):
            if self.stopped.wait(s.step_s):
                self.code = -signal.SIGTERM
                return
            if node == s.fail and step == s.fail_step:
                yield "[default1]:Traceback (most recent call last):"
                yield '[default1]:  File "/srv/job/train.py", line 42, in <module>'
                yield f"[default1]:RuntimeError: stand-in failure on {node} at step {step}"
                yield ("E1203 10:00:05.000000 1000 torch/distributed/elastic/multiprocessing/"
                       "api.py:869] failed (exitcode: 1) local_rank: 1")
                self.code = 1
                return
            for r in range(s.ranks):
                yield (f"[default{r}]:LAUNCH_STEP step={step} loss={1.0 / step:.4f} "
                       f"busy_s={s.step_s * 0.9:.4f}")
        for r in range(s.ranks):
            yield f"[default{r}]:rank {base + r}: done"
        self.code = 0

    def poll(self) -> int | None:
        return self.code

    def signal(self, sig: int) -> None:
        self.stopped.set()

    # ---- the hang watch's looks (launch_node/node_probe.py activity, as a node answers) ------
    def activity(self) -> dict[str, Any]:
        ticks = int((time.monotonic() - self.began) * 100)
        return {"beats": [], "ticks_per_s": 100, "procs": [
            {"pid": 10000 + r, "ppid": 9999, "state": "R", "cpu_ticks": ticks, "rank": r,
             "local_rank": r, "agent": False, "python": True, "cmd": "python train.py"}
            for r in range(self.script.ranks)]}

    def dump_ranks(self, timeout: float) -> dict[str, Any]:
        return {"ranks": [], "py_spy": None}

    def kill_ranks(self, pids: list[int]) -> dict[str, Any]:
        return {"killed": [], "skipped": pids}


class StandinSession:
    def __init__(self, backend: StandinBackend, nodes: list[Node]):
        self.backend, self.nodes = backend, nodes
        self.index = {n.name: i for i, n in enumerate(nodes)}

    def plan(self, request: RunRequest, uid: str, attempt: int) -> RunPlan:
        return self.backend.plan(request, self.nodes, uid=uid, attempt=attempt)

    def announce(self) -> list[str]:
        return []

    def code_record(self) -> dict | None:
        return None

    def process(self, command: NodeCommand, stamp: str, label: str | None = None):
        return StandinProcess(command, self.backend.script, self.index[command.name],
                              len(self.nodes), label)

    def run(self, command: NodeCommand, stamp: str, label: str, line) -> int | None:
        return 0

    def collect(self, plan: RunPlan, folder: Any, skip: set[str] = frozenset()) -> None:
        pass   # the nodes' files are the node logs launch wrote itself

    def close(self) -> None:
        pass


class StandinBackend:
    name = "standin"
    capabilities = CAPABILITIES

    def __init__(self, count: int, script: Script | None = None, gpus: int = 8):
        self.count, self.script, self.gpu_count = count, script or Script(), gpus

    def describe(self, count: int) -> str:
        return f"{count} stand-in node(s) in this process"

    def where_nodes(self, nodes: list[Node]) -> str:
        return "this process (stand-ins)"

    def nodes(self, count: int | None) -> list[Node]:
        count = self.count if count is None else count
        return [Node(name=f"node{i:04d}", address=f"10.{i >> 16 & 255}.{i >> 8 & 255}."
                     f"{i & 255}", private_address=f"10.{i >> 16 & 255}.{i >> 8 & 255}."
                     f"{i & 255}", gpus=self.gpu_count) for i in range(count)]

    def gpus(self, nodes: list[Node]) -> list[int]:
        return [n.gpus or 0 for n in nodes]

    def plan(self, request: RunRequest, nodes: list[Node], *, uid: str = "UID",
             attempt: int = 0) -> RunPlan:
        root = f"/standin/runs/{request.run_id}"
        placements = {n.name: Placement(
            python="/opt/venv/bin/python", code_dir=posixpath.join(root, n.name, "code"),
            run_dir=posixpath.join(root, n.name), cwd=posixpath.join(root, n.name), cpus=96)
            for n in nodes}
        return plan_request(request, nodes, placements, rdzv_port=29400, uid=uid,
                            attempt=attempt)

    def open(self, request: RunRequest, nodes: list[Node], uid: str) -> StandinSession:
        return StandinSession(self, nodes)

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        return GroupResult({n.name: NodeResult(n.name, exit_code=0) for n in nodes})

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count}
