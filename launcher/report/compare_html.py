"""`launch compare --html FILE`: the runs side by side as a page: the comparison's tables
(launcher/report/compare.py) and plots of which run was faster and why (throughput, where the step
time went, loss against step and against training time)."""

from __future__ import annotations

from pathlib import Path

from launcher.core.errors import LauncherError
from launcher.report import page
from launcher.report.compare import (Comparison, cells, data_wait_s, difference_cells,
                                     split_part, timeline_cells)
from launcher.report.html import step_curves
from launcher.nccl.plot import legend
from launcher.report.plots import COMM, COMPUTE, DATA


def _bars(comparison: Comparison):
    """images/s per run with its ratio, and each run's step split into compute, data wait and
    communication wait."""
    runs = comparison.runs
    speeds = [r.training.get("images_per_sec") for r in runs]
    if all(s is None for s in speeds):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 1.6 + 0.5 * len(runs)), dpi=100, layout="constrained")
    speed_ax, split_ax = fig.subplots(1, 2)
    labels = [r.label for r in runs]
    ys = list(range(len(runs)))[::-1]
    first = speeds[0]
    speed_ax.barh(ys, [s or 0 for s in speeds], color="tab:purple", height=0.6)
    for y, s in zip(ys, speeds):
        if s is not None:
            text = f"{s:.1f}" + (f" ({s / first:.2f}x)" if first else "")
            speed_ax.annotate(text, (s, y), xytext=(3, 0), textcoords="offset points",
                              va="center", fontsize=8)
    speed_ax.set_yticks(ys, labels, fontsize=8)
    speed_ax.set_xlabel("images/s")
    speed_ax.set_xlim(0, max(s or 0 for s in speeds) * 1.35 or 1)
    left = [0.0] * len(runs)
    for get, color, name in ((lambda r: split_part(r, "compute_s"), COMPUTE, "compute"),
                             (data_wait_s, DATA, "data wait"),
                             (lambda r: split_part(r, "comm_wait_s"), COMM,
                              "communication wait")):
        widths = [(get(r) or 0) * 1e3 for r in runs]
        split_ax.barh(ys, widths, left=left, color=color, label=name, height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    split_ax.set_yticks(ys, labels, fontsize=8)
    split_ax.set_xlabel("mean ms per step")
    legend(split_ax, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3,
           frameon=False)
    for ax in (speed_ax, split_ax):
        ax.grid(True, axis="x", alpha=0.3)
    return fig


def _curves(comparison: Comparison):
    """Every run's loss against step and against training time, on the same axes."""
    # The trainer's metrics.jsonl, or a job's LAUNCH_STEP lines (progress.jsonl).
    series = [(r.label, step_curves(r.run_dir, r.report)) for r in comparison.runs]
    if not any(r.get("loss") is not None for _, runs in series for a in runs
               for r in a.records):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), dpi=100, layout="constrained")
    by_step, by_time = fig.subplots(1, 2)
    for label, runs in series:
        for i, a in enumerate(runs):
            points = [r for r in a.records if r.get("loss") is not None]
            line, = by_step.plot([r["step"] for r in points], [r["loss"] for r in points],
                                 "-", marker=".", label=label if i == 0 else None)
            timed = [r for r in points if r.get("time_s") is not None]
            by_time.plot([a.offset_s + r["time_s"] for r in timed], [r["loss"] for r in timed],
                         "-", marker=".", color=line.get_color())
    by_step.set_xlabel("step")
    by_time.set_xlabel("training time (s)")
    for ax in (by_step, by_time):
        ax.set_ylabel("training loss")
        ax.grid(True, alpha=0.3)
    legend(by_step, fontsize=8)
    return fig


def render_compare_html(comparison: Comparison) -> str:
    runs = comparison.runs
    title = " vs ".join(r.label for r in runs)
    body = [f"<h1>Runs compared: {page.esc(title)}</h1>",
            "<p class=\"lead\">" + " · ".join(
                f"{page.esc(r.label)}: <span class=\"status-{page.esc(r.report['status'])}\">"
                f"{page.esc(r.report['status'])}</span>, {r.report['nnodes']} node(s)"
                for r in runs) + "</p>",
            "<h2>Side by side</h2>"]
    header, rows = cells(comparison)
    body.append(page.table(header, rows, numeric=range(1, len(header))))
    if len(runs) > 1:
        body.append(f"<p>Ratios (1.25x) are against the first run, {page.esc(runs[0].label)}."
                    "</p>")
    header, rows = timeline_cells(comparison)
    if rows:
        body += ["<h2>Where the wall time went</h2>",
                 page.table(header, rows, numeric=range(1, len(header)))]
    body.append("<h2>Recipe differences</h2>")
    if comparison.recipe_differences:
        header, rows = difference_cells(comparison)
        body.append(page.table(header, rows))
    else:
        body.append(page.none("The recipes kept in the run folders are the same."
                              if all(r.recipe is not None for r in runs) else
                              "Fewer than two runs kept their recipe (recipe.yml)."))
    body += [f"<p class=\"none\">note: {page.esc(n)}</p>" for n in comparison.notes]
    body.append("<h2>Throughput and where the step time went</h2>")
    bars = _bars(comparison)
    body.append(page.svg(bars, "plot-side-by-side") if bars is not None else
                page.none("No run logged images/s: nothing to draw side by side."))
    curves = _curves(comparison)
    if curves is not None:
        body += ["<h2>Loss</h2>", page.svg(curves, "plot-loss")]
    return page.document(f"launch compare {title}", body)


def write_compare_html(comparison: Comparison, path: Path) -> Path:
    try:
        path.write_text(render_compare_html(comparison))
    except OSError as err:
        raise LauncherError(f"--html {path}: cannot write it: {err.strerror or err}") from None
    return path
