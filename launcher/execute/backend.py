"""What every backend offers, and the values they exchange.

A backend owns placement (where each node's folder, interpreter, code and GPUs are) and
execution. Commands use three things (the split torchx makes between a scheduler's dry run and
its submit):

    backend.plan(recipe, nodes, run_id)     -> RunPlan     pure: what --dry-run prints
    backend.launch(recipe, nodes, run_id)   -> summary     preflight, plan, run, collect
    backend.run_on_all(nodes, argv)         -> GroupResult one command on every node (topo,
                                                           check, nccl-tests): partial failure
                                                           as data, like fabric's GroupResult
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher.cluster.inventory import Node
from launcher.job.recipe import Recipe
from launcher.job.runplan import Placement

Program = Callable[[Placement], list[str]]


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


@dataclass(frozen=True)
class Recover:
    """`launch run --recover`: how many lost machines a run may replace, and how long each
    replacement may take (launcher/backends/ssh/replace.py)."""

    max_recoveries: int = 2
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class LaunchOptions:
    """How to carry out a run (not what to run): the same for every backend."""

    runs_dir: str = "runs"
    grace_s: float = 5.0
    display: Any = None                  # launcher.report.display.*; None: chosen by the terminal
    # Continue the run in its existing folder (a new attempt, launcher/runs/resume.py checked it).
    resume: bool = False
    # Replace a lost machine and go on (SSH backends whose inventory names its fleet).
    recover: Recover | None = None
    # Whether a node's machine is gone (why, or None): its agent is then not restarted there.
    node_lost: Callable[[Node], str | None] | None = None


class Backend(Protocol):
    kind: str          # "local" | "ssh" | "slurm"

    def describe(self, count: int) -> str:
        """One line for people: where `count` nodes would run."""

    def nodes(self, count: int | None) -> list[Node]:
        """The nodes of a run of `count` (None: the backend's default), head first."""

    def gpus(self, nodes: list[Node]) -> list[int]:
        """GPUs per node as far as known without starting anything (for sizes and checks)."""

    def plan(self, recipe: Recipe, nodes: list[Node], run_id: str, *,
             program: Program | None = None, rdzv_port: int | None = None) -> Any:
        """The printable plan (RunPlan, or the backend's own with render()/to_json())."""

    def launch(self, recipe: Recipe, nodes: list[Node], run_id: str, options: LaunchOptions,
               *, program: Program | None = None, rdzv_port: int | None = None) -> dict:
        """Runs to the end; returns the run's summary or raises RunFailed (logs kept)."""

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        """argv (with `env` added to the node's environment) on every node at once."""


def print_plan(plan: Any, as_json: bool) -> None:
    print(plan.dumps() if as_json else plan.render())


def in_parallel(fn: Callable[[Any], Any], items: Iterable[Any], max_workers: int = 32) -> dict:
    """fn(item) for every item at once; returns {item: result or exception}."""
    items = list(items)
    out: dict = {}
    if not items:
        return out
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
        futures = {item: pool.submit(fn, item) for item in items}
    for item, future in futures.items():
        out[item] = future.exception() or future.result()
    return out
