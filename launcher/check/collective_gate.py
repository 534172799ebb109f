"""The collective gate's job and verdict: one short job (launch_bench/bench.py --gate, started
through the same pipeline as any run: launcher/pipeline/gate.py) that all-reduces over all nodes
and, when that is under the floor or there is no floor, over pairs of nodes until the slow one
is named (launch_bench/gate.py, launch_bench/gatesearch.py). Its verdict, and the transport each
node's NCCL used against the one its instance type should use (EFA or sockets, from the run
report), become two columns of the `launch check` table; `launch run --gate` refuses to start on
a failed gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from launcher.check.health import FAIL, OK, SKIP, WARN, Check
from launcher.core.errors import LauncherError
from launcher.job.recipe import Recipe, recipe_from_mapping
from launcher.job.spec import Job, workload

# One size, large enough to reach a link's plateau: NVLink/EFA flatten out from a few hundred
# MiB; gloo on CPU moves ~0.2 GB/s on this kind of box, where 1 MiB already is bandwidth-bound
# and a slow link shows in seconds rather than minutes.
GATE_BYTES_GPU = 256 << 20
GATE_BYTES_CPU = 1 << 20
WARMUP_ITERS = 3
ITERS = 10
# Any one collective of the gate fails after this long: a hung pair is an answer, not a wait.
COLLECTIVE_TIMEOUT_S = 120.0
RESULTS_FILE = "gate-results.json"   # launch_bench/gate.py writes it in the node folder of rank 0


class GateRefused(LauncherError):
    """`launch run --gate` found a node that would hold the run back; nothing was started."""

    exit_code = 3


@dataclass
class GateResult:
    run_dir: Path
    nodes: list[str]
    results: dict | None = None                  # gate-results.json, None when the job failed
    failure: str | None = None
    transports: dict[str, Check] = field(default_factory=dict)

    @property
    def verdict(self) -> dict:
        return (self.results or {}).get("search") or {}

    @property
    def bad(self) -> list[str]:
        """Nodes the gate names: slow ones, suspects it could not tell apart, and nodes whose
        NCCL fell back to another transport than their hardware's."""
        named = list(self.verdict.get("bad", [])) + list(self.verdict.get("suspects", []))
        named += [n for n, c in self.transports.items() if c.status == FAIL]
        return list(dict.fromkeys(n for n in self.nodes if n in named))

    @property
    def passed(self) -> bool:
        return self.failure is None and not self.bad

    def busbw_checks(self) -> dict[str, Check]:
        if self.failure is not None:
            return {n: Check("busbw", FAIL, f"the gate's all-reduce failed: {self.failure}")
                    for n in self.nodes}
        results = self.results or {}
        verdict = self.verdict
        overall = results.get("all_nodes", {}).get("busbw_gbs")
        size = results.get("size")
        where = f"all-reduce of {_size(size)} over {len(self.nodes)} node(s): {overall:.4g} GB/s"
        bar = verdict.get("bar_gbs")
        floor = verdict.get("floor_gbs")
        bar_text = (f"floor {floor:g} GB/s" if floor is not None
                    else f"bar {bar:.4g} GB/s = {verdict.get('ratio'):g} x the median node's "
                         "best pair" if bar is not None else "")
        out = {}
        evidence = verdict.get("evidence", {})
        for node in self.nodes:
            pairs = evidence.get(node)
            if node in verdict.get("bad", []):
                out[node] = Check("busbw", FAIL, f"slow: {pairs}; {bar_text}: this node holds "
                                                 "the collective back")
            elif node in verdict.get("suspects", []):
                out[node] = Check("busbw", FAIL, f"under the bar ({pairs}; {bar_text}) and no "
                                                 "healthy partner to tell it from its pair")
            elif not results.get("pairwise") and floor is not None and overall >= floor:
                out[node] = Check("busbw", OK, f"{where}, at or above the floor {floor:g} GB/s")
            elif not verdict.get("judged"):
                out[node] = Check("busbw", SKIP, f"{where}; nothing to judge it by: two nodes "
                                                 "and no floor (gate.min_busbw_gbs, "
                                                 "--min-busbw)")
            else:
                out[node] = Check("busbw", OK, f"{pairs or where}; {bar_text}")
        return out

    def story(self) -> list[str]:
        """The verdict in a line (the job's own `gate:` lines were shown as it ran)."""
        if self.failure is not None:
            return [f"gate: the all-reduce job failed ({self.failure}); logs in {self.run_dir}"]
        if self.bad:
            return [f"gate: {', '.join(self.bad)} named (evidence in the table); run folder "
                    f"{self.run_dir}"]
        return [f"gate: passed; run folder {self.run_dir}"]

    def to_json(self) -> dict:
        return {"run_dir": str(self.run_dir), "nodes": self.nodes, "failure": self.failure,
                "passed": self.passed, "bad": self.bad, "results": self.results,
                "transports": {n: c.to_json() for n, c in self.transports.items()}}


def _size(size: int | None) -> str:
    if not size:
        return "?"
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"


def gate_job(size: int, floor_gbs: float | None) -> Job:
    """launch_bench/bench.py --gate as the job torchrun starts on every node."""
    args = ["--gate", "--op", "all_reduce", "--sizes", str(size), "--warmup-iters",
            str(WARMUP_ITERS), "--iters", str(ITERS), "--no-check", "--timeout",
            f"{COLLECTIVE_TIMEOUT_S:g}"]
    if floor_gbs is not None:
        args += ["--floor-gbs", repr(floor_gbs)]
    return workload("launch_bench/bench.py", *args)


def gate_recipe(count: int, base: Recipe | None, local: bool) -> Recipe:
    """The run's own env and processes per node (they decide the transport NCCL picks); the
    training block is a placeholder the gate never reads."""
    data: dict = {"name": "gate", "nodes": count, "train": {"steps": 1},
                  "rendezvous": {"timeout": 60 if local else 120}}
    if base is not None:
        data["env"] = dict(base.env)
        data["nproc_per_node"] = base.nproc_per_node
        if not local:
            data["rendezvous"]["port"] = base.rendezvous.port
    return recipe_from_mapping(data, base.source if base else "<launch gate>")


class GateDisplay:
    """The gate job's lines stay in its node logs; rank 0's `gate:` lines are shown."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def line(self, node: str, rank: str, text: str) -> None:
        if text.startswith("gate: "):
            self.stream.write(f"launch: {text}\n")
            self.stream.flush()

    def progress(self, progress) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def transport_checks(run_dir: Path, nodes: list[str]) -> dict[str, Check]:
    """Per node: the network NCCL used against what the node's instance type has (the run
    report's reading of the NCCL_DEBUG logs), or gloo's TCP on CPU nodes."""
    from launcher.report.build import build_report

    try:
        report = build_report(run_dir)
    except LauncherError as err:
        return {n: Check("transport", WARN, f"not read: {err}") for n in nodes}
    out = {}
    for entry in report["nodes"]:
        name = entry["name"]
        efa = entry["efa"]
        nccl = entry["nccl"]
        if report["backend"] == "gloo":
            iface = entry.get("gloo_interface")
            out[name] = Check("transport", OK, f"gloo over TCP{f' ({iface})' if iface else ''}: "
                                               "CPU nodes have nothing faster")
        elif nccl is None:
            out[name] = Check("transport", WARN, "no NCCL_DEBUG log from this node: transport "
                                                 "unknown")
        elif efa.get("expected") and len(nodes) > 1:
            if efa.get("used"):
                out[name] = Check("transport", OK, f"EFA as expected ({efa.get('nics')} NICs; "
                                                   f"{nccl.get('network')})")
            else:
                used = ", ".join(nccl.get("transports") or {}) or nccl.get("network") or "?"
                out[name] = Check("transport", FAIL, f"expected EFA ({efa['expected']} devices) "
                                                     f"but NCCL used {used}: the aws-ofi-nccl "
                                                     "plugin did not load (launch setup, role "
                                                     "efa)")
        else:
            out[name] = Check("transport", OK, f"NCCL network {nccl.get('network') or '?'} "
                                               f"({', '.join(nccl.get('transports') or {}) or 'one node'})")
    return out
