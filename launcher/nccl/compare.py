"""Which measured figure a link's rated speed is held against, and the sentence that says so.

One node: every hop is a GPU link, and busbw is the figure nccl-tests makes for exactly that
comparison (doc/PERFORMANCE.md): busbw against the catalog's per-GPU link rate.

Across nodes: busbw scales algbw by the rank count (2(n-1)/n for all_reduce) as if all ranks
formed one flat ring. NCCL's tree algorithm, its choice on 2 nodes, sends less than that over
the network, so busbw there exceeds the NICs' line rate (nccl-tests #22, #196; 57 GB/s on two
p4d nodes whose network carries 50, nccl #527). What each node's network must carry, whatever
the algorithm, is the same formula applied to nodes instead of ranks: algbw x 2(m-1)/m for m
nodes for all_reduce, (m-1)/m for all_gather and reduce_scatter, 1 for broadcast and reduce,
and for alltoall (m-1)/m of every local rank's buffer. On 2 nodes all_reduce's is algbw itself.
That figure is held against the node's network rate, and busbw is quoted beside it.

The two bracket what the network carried: a ring sends busbw's worth per node, the tree less,
never below the node figure. So "the network is under-used" is only said when even busbw, the
upper bound, is low (`busbw_ratio`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from launcher.nccl.busbw import bus_factor
from launcher.nccl.links import LinkPeak, gpu_peak, network_peak
from launcher.nccl.nccl_tests import NcclTestsRun
from launcher.nccl.summary import human_bytes


@dataclass(frozen=True)
class Point:
    """One placement of one row: what a comparison needs of it."""

    size: int
    algbw: float
    busbw: float


@dataclass(frozen=True)
class Comparison:
    figure: str  # "busbw", "algbw", or "algbw x 0.5"
    measured: float  # GB/s, the figure's largest value over the rows
    size: int  # bytes, the row it was measured at
    peak: LinkPeak
    basis: str  # why this figure is the one held against this peak
    busbw: float  # the peak busbw (the figure itself when that is busbw)
    above_line_rate: bool  # busbw above the network's rate: the 2-node tree effect

    @property
    def ratio(self) -> float:
        return round(self.measured / self.peak.gbps, 4)

    @property
    def busbw_ratio(self) -> float:
        """busbw over the peak: the most of the link the run can have used."""
        return round(self.busbw / self.peak.gbps, 4)

    def sentence(self) -> str:
        """`algbw 30.49 GB/s at 1 GiB = 61% of p4d.24xlarge network ... (why)`"""
        text = (f"{self.figure} {self.measured:.2f} GB/s at {human_bytes(self.size)} = "
                f"{self.ratio:.0%} of {self.peak.label} ({self.basis}")
        if self.above_line_rate:
            text += (f"; busbw {self.busbw:.2f} GB/s is above the network's line rate because "
                     "NCCL's tree algorithm sends less across nodes than busbw assumes: set "
                     "NCCL_ALGO=Ring to measure the ring")
        return text + ")"

    def to_json(self) -> dict:
        return {"figure": self.figure, "measured": self.measured, "size": self.size,
                "link_peak": self.peak.to_json(), "ratio": self.ratio, "basis": self.basis,
                "busbw": self.busbw, "busbw_ratio": self.busbw_ratio,
                "above_line_rate": self.above_line_rate}


def points_of_run(run: NcclTestsRun) -> list[Point]:
    return [Point(row.size, m.algbw, m.busbw) for row in run.rows for m in row.measurements
            if m.algbw is not None and m.busbw is not None]


def points_of_json(rows: Iterable[dict]) -> list[Point]:
    """The same from `bandwidth.json`'s rows (`launch inspect --json`'s shape)."""
    points = []
    for row in rows:
        for side in ("out_of_place", "in_place"):
            m = row.get(side) or {}
            if m.get("algbw") is not None and m.get("busbw") is not None:
                points.append(Point(row["size"], m["algbw"], m["busbw"]))
    return points


def node_factor(collective: str | None, nnodes: int, nranks: int | None) -> Fraction | None:
    """The share of algbw each node's network must carry; None when it cannot be known."""
    if collective is None or nnodes < 2:
        return None
    if collective == "alltoall":
        if not nranks or nranks % nnodes:
            return None
        return Fraction(nnodes - 1, nnodes) * (nranks // nnodes)
    try:
        return bus_factor(collective, nnodes)
    except ValueError:
        return None


def compare(collective: str | None, points: Sequence[Point], *, nnodes: int,
            nranks: int | None, instance_type: str | None,
            peak: LinkPeak | None = None) -> Comparison | None:
    """The comparison a report states; `peak` stands in for the catalog's when the instance
    type is unknown (a bandwidth.json written with one). None: nothing to compare with."""
    if not points:
        return None
    busbw = max(p.busbw for p in points)
    net = network_peak(instance_type) if nnodes > 1 else None
    factor = node_factor(collective, nnodes, nranks)
    if net is not None and factor is not None:
        best = max(points, key=lambda p: p.algbw)
        figure = "algbw" if factor == 1 else f"algbw x {float(factor):g}"
        return Comparison(
            figure=figure, measured=round(best.algbw * float(factor), 4), size=best.size,
            peak=net, basis=f"across {nnodes} nodes each node's network carries at least "
                            f"{collective}'s {figure} whatever algorithm NCCL picks; busbw "
                            f"assumes one ring of all ranks",
            busbw=busbw, above_line_rate=busbw > net.gbps)
    link = gpu_peak(instance_type) if nnodes <= 1 else None
    link = link or peak
    if link is None:
        return None
    best = max(points, key=lambda p: p.busbw)
    basis = ("one node: busbw is nccl-tests' figure for a GPU link" if nnodes <= 1 else
             "busbw, since which share of it crosses the network is not known "
             f"({'collective not known' if collective is None else 'no network rate'})")
    return Comparison(figure="busbw", measured=best.busbw, size=best.size, peak=link,
                      basis=basis, busbw=busbw, above_line_rate=False)


def bench_verdict(run: NcclTestsRun, *, nnodes: int, instance_type: str | None,
                  peak: LinkPeak | None) -> str:
    """The line `launch bench` ends with: the peak busbw, then what it is compared with."""
    points = points_of_run(run)
    if not points:
        return f"peak bus bandwidth {run.peak_busbw:.2f} GB/s (no algbw printed beside it)"
    best = max(points, key=lambda p: p.busbw)
    text = f"peak bus bandwidth {best.busbw:.2f} GB/s at {human_bytes(best.size)}"
    comparison = compare(run.collective, points, nnodes=nnodes, nranks=run.ranks,
                         instance_type=instance_type, peak=peak)
    if comparison is None:
        return text + " (no instance type known: no peak to compare with)"
    if comparison.figure == "busbw":
        return (f"{text} = {comparison.ratio:.0%} of {comparison.peak.label} "
                f"({comparison.basis})")
    return f"{text}; {comparison.sentence()}"
