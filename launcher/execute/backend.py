"""What a backend is, and the values it exchanges with the pipeline.

A backend says where a run's nodes are and how a process is started, watched and reaped on one
of them; the pipeline (launcher/execute/attempt.py for one attempt, launcher/pipeline/ for the
whole run: gate, bench, attempts, machine recovery, detach) does everything else, the same for
every backend. The verbs, after torchx's scheduler API and SkyPilot's backend:

    backend.nodes(count)                    -> [Node]       the nodes, head first
    backend.plan(request, nodes)            -> RunPlan      pure: what --dry-run prints
    backend.open(request, nodes, uid)       -> Session      preflight: every node reached and
                                                            checked, code and workdir shipped
        session.plan(request, uid, attempt) -> RunPlan      with what preflight found
        session.process(command, stamp, label) -> NodeProcess   start / lines / poll / signal,
                                                            and the hang watch's looks
        session.run(command, stamp, label, line) -> code    one command to its end on its node
                                                            (setup, the mirror's restores)
        session.collect(plan, folder, skip)                 leftovers reaped, node folders home
        session.close()
    backend.run_on_all(nodes, argv)         -> GroupResult  one command on every node (check,
                                                            topo, nccl-tests): partial failure
                                                            as data, like fabric's GroupResult
    backend.hand_over(request, nodes)       -> handle       a detached run: the pipeline
                                                            started where the run lives
    backend.home(handle)                    -> RunHome      that run's folder and controller,
                                                            from here (attach, logs, stop)
    backend.fetch_job_files(targets, dest)  -> [NodeFiles]  what a run wrote in its nodes' job
                                                            folders, copied here (fetch
                                                            --workdir)

and what it can do (`capabilities`): docs/backends.md's table is made from these, and nothing
outside launcher/backends/ asks which backend it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher.cluster.inventory import Node
from launcher.job.request import RunRequest
from launcher.job.runplan import NodeCommand, RunPlan


@dataclass(frozen=True)
class NodeResult:
    """One node's answer to run_on_all: the command's exit code and output, or why the node
    could not be asked (`error`: unreachable, host key, not started)."""

    node: str
    exit_code: int | None = None   # 127: the command is not installed there
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


@dataclass
class GroupResult:
    """Per-node results of one fan-out, in the order of the nodes asked."""

    results: dict[str, NodeResult] = field(default_factory=dict)

    @property
    def succeeded(self) -> dict[str, NodeResult]:
        return {n: r for n, r in self.results.items() if r.ok}

    @property
    def failed(self) -> dict[str, NodeResult]:
        return {n: r for n, r in self.results.items() if not r.ok}

    def __getitem__(self, node: str) -> NodeResult:
        return self.results[node]

    def __iter__(self):
        return iter(self.results.values())


# ---- what a backend can do -------------------------------------------------------------------

@dataclass(frozen=True)
class Support:
    """Whether a backend offers a feature; `why` says why not (or, for a yes, how)."""

    ok: bool
    why: str = ""


YES = Support(True)


def no(why: str) -> Support:
    return Support(False, why)


# The features the table in docs/backends.md lists, in its order, with what each is. Every
# backend declares each one, attached and detached (tests/run/test_architecture.py holds the
# docs' table equal to the declarations).
FEATURES = {
    "restarts": "restart after a failed worker, node agent or hang (--max-restarts)",
    "resume": "continue a stopped run in its folder (--resume)",
    "hang watch": "a run without progress found, every rank's stack dumped, the rank named",
    "gate": "the collective gate before the run (--gate)",
    "stragglers": "ranks whose compute holds every step back, named in the report",
    "report": "report.md/.json/.html of the run",
    "checkpoint mirror": "checkpoints copied off the head as written (checkpoint.mirror)",
    "spot notices": "EC2's interruption notice turned into a last checkpoint (spot nodes)",
    "machine recovery": "a lost machine replaced and the run resumed (--recover)",
    "nccl-tests": "launch bench --nccl-tests",
}


@dataclass(frozen=True)
class Capabilities:
    """What a backend does, and the facts about its nodes the pipeline plans by."""

    attached: dict[str, Support]
    detached: dict[str, Support]
    # Where the pipeline of a detached run lives (for people: docs, --dry-run).
    controller: str
    # The nodes are processes of this one machine: one answer covers all of them (check,
    # topo), the gate plans for loopback, checkpoints are on this disk.
    one_machine: bool = False
    # The nodes write into the run folder launch reads (this machine's disk, Slurm's shared
    # filesystem): nothing is fetched afterwards, and nodes share one copy of the workdir.
    shared_files: bool = False
    # The nodes are known only once the run has them (a Slurm allocation).
    placed_later: bool = False
    # The pipeline runs in this process when attached (else: it is handed over and followed).
    attached_here: bool = True

    def support(self, feature: str, detached: bool = False) -> Support:
        return (self.detached if detached else self.attached)[feature]


class NodeProcess(Protocol):
    """One node's process (a torchrun agent, the store, a sidecar) as the supervisor sees it."""

    name: str

    def start(self) -> None: ...
    def lines(self) -> Iterator[str]: ...
    def poll(self) -> int | None: ...
    def signal(self, sig: int) -> None: ...


class Session(Protocol):
    """One attempt's hold on its nodes, from preflight to collection."""

    nodes: list[Node]

    def plan(self, request: RunRequest, uid: str, attempt: int) -> RunPlan: ...
    def announce(self) -> list[str]: ...          # what preflight did, for the run's log
    def code_record(self) -> dict | None: ...     # code.json: what every node runs
    def process(self, command: NodeCommand, stamp: str,
                label: str | None = None) -> NodeProcess: ...
    def run(self, command: NodeCommand, stamp: str, label: str,
            line: Callable[[str], None]) -> int | None: ...
    def collect(self, plan: RunPlan, folder: Any, skip: set[str]) -> None: ...
    def close(self) -> None: ...


class RunHome(Protocol):
    """A detached run's folder and controller, seen from this machine."""

    where: str                                    # for people: "host0 (10.0.0.1)", "job 42"

    def read(self, name: str, limit: int) -> bytes | None: ...
    def follow(self, name: str, offset: int, done: Callable[[], bool]) -> Iterator[bytes]: ...
    def alive(self) -> bool | None: ...           # the controller; None: cannot tell now
    def stop(self) -> str: ...                    # asks it to stop; what was done
    def fetch(self, dest: Any) -> int: ...        # the run folder copied into dest; files
    def local_folder(self) -> Any: ...            # the run folder when it is here, else None


class Backend(Protocol):
    name: str          # its key in launcher/backends/__init__.py's table
    capabilities: Capabilities

    def describe(self, count: int) -> str: ...
    def where_nodes(self, nodes: list[Node]) -> str: ...
    def nodes(self, count: int | None) -> list[Node]: ...
    def gpus(self, nodes: list[Node]) -> list[int]: ...
    def plan(self, request: RunRequest, nodes: list[Node]) -> Any: ...
    def open(self, request: RunRequest, nodes: list[Node], uid: str) -> Session: ...
    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult: ...
    def fetch_job_files(self, targets: list, dest: Any, dry_run: bool = False) -> list: ...
    def to_json(self) -> dict[str, Any]: ...      # how its controller makes it again


def print_plan(plan: Any, as_json: bool) -> None:
    print(plan.dumps() if as_json else plan.render())


def in_parallel(fn: Callable[[Any], Any], items: Iterable[Any], max_workers: int = 32) -> dict:
    """fn(item) for every item, at most `max_workers` at a time (a window: as one ends the next
    starts, on at most that many threads); returns {item: result or exception}."""
    items = list(items)
    out: dict = {}
    if not items:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
        futures = {item: pool.submit(fn, item) for item in items}
    for item, future in futures.items():
        out[item] = future.exception() or future.result()
    return out
