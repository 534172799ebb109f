"""Bus bandwidth against message size, with the link's peak when it is known: bandwidth.png of
a bench, and the same axes on a run's report page."""

from __future__ import annotations

from pathlib import Path

from launcher.nccl.links import LinkPeak
from launcher.nccl.nccl_tests import NcclTestsRun
from launcher.nccl.summary import human_bytes

SIDES = ("out_of_place", "in_place")


def legend(ax, **options) -> None:
    """The axes' legend, where something on them has a label: matplotlib warns on stderr
    ("No artists with labels found") for an empty one, and a run's end printed that warning
    to the user (a resumed run with no restart: its timeline has nothing to name). Here,
    the lowest of the modules that draw (the report's plots use it too)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)


def draw_busbw(ax, series: dict[str, list[tuple[int, float]]], sizes: list[int], *,
               title: str, peak: LinkPeak | None) -> None:
    """series: per side (out_of_place, in_place) its (message size, busbw) points."""
    for side, style in zip(SIDES, ("o-", "s--")):
        points = series.get(side) or []
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, markersize=3, label=side.replace("_", "-"))
    if peak is not None:
        ax.axhline(peak.gbps, color="red", linestyle=":", label=f"peak: {peak.label}")
    ax.set_xscale("log", base=2)
    # A tick every other power of two, named like nccl-tests' sizes (8 B ... 1 GiB).
    ticks = [s for i, s in enumerate(sizes) if i % 2 == 0]
    ax.set_xticks(ticks, [human_bytes(s) for s in ticks], rotation=45, fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    # Room above the highest point and the peak line, which autoscaling leaves at the edge.
    top = max([peak.gbps if peak else 0.0] + [y for pts in series.values() for _, y in pts])
    ax.set_ylim(0, top * 1.12 or 1)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    legend(ax, fontsize=8, loc="upper left")   # no points, no peak: no legend


def plot_bandwidth(run: NcclTestsRun, path: Path, *, title: str,
                   peak: LinkPeak | None) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no display on nodes, CI or over SSH

    fig = Figure(figsize=(8, 4.5), dpi=100)
    series = {side: [(row.size, getattr(row, side).busbw) for row in run.rows
                     if getattr(row, side) is not None and getattr(row, side).busbw is not None]
              for side in SIDES}
    draw_busbw(fig.subplots(), series, [row.size for row in run.rows], title=title, peak=peak)
    fig.tight_layout()
    fig.savefig(path)
    return path
