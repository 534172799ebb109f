"""bandwidth.png: bus bandwidth against message size, with the link's peak when it is known."""

from __future__ import annotations

from pathlib import Path

from launcher.nccl.links import LinkPeak
from launcher.nccl.nccl_tests import NcclTestsRun
from launcher.nccl.summary import human_bytes


def plot_bandwidth(run: NcclTestsRun, path: Path, *, title: str,
                   peak: LinkPeak | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on nodes, CI or over SSH
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for side, style in (("out_of_place", "o-"), ("in_place", "s--")):
            points = [(row.size, getattr(row, side).busbw) for row in run.rows
                      if getattr(row, side) is not None and getattr(row, side).busbw is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, markersize=3, label=side.replace("_", "-"))
        if peak is not None:
            ax.axhline(peak.gbps, color="red", linestyle=":", label=f"peak: {peak.label}")
        ax.set_xscale("log", base=2)
        sizes = [row.size for row in run.rows]
        # A tick every other power of two, named like nccl-tests' sizes (8 B ... 1 GiB).
        ticks = [s for i, s in enumerate(sizes) if i % 2 == 0]
        ax.set_xticks(ticks, [human_bytes(s) for s in ticks], rotation=45, fontsize=8)
        ax.set_xlabel("message size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
