"""report.html: the run report as a page a person reads at a glance, next to report.md.

The same facts, one source: report.md's sentences and tables (launcher/report/build.py) are shown
section by section, and under them the plots of what the run folder holds (metrics.jsonl,
summary.json, the bench's bandwidth.json; launcher/report/plots.py). A run that lacks a plot's
data gets a sentence in its place: a user's own job with no trainer lines still shows its
duration, each node's exit and the restart history. One self-contained file (launcher/report/page.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from launcher.core.errors import LauncherError
from launcher.report import page
from launcher.report import plots
from launcher.runs.progress import PROGRESS_FILE
from launcher.runs.timeline import before_first_step, describe as describe_timeline
from launcher.runs.schema import (BandwidthRecord, MetricsLine, ProgressLine, SummaryRecord,
                                read_lines, read_record)

REPORT_HTML = "report.html"


def _json(model: type[BaseModel], path: Path, within: Path | None) -> dict | None:
    """A file the page can do without, read as launch reads run folders (launcher/core/safefile.py,
    launcher/runs/schema.py: no link followed, no FIFO waited on, a wrong key refused); report.py
    already warned about an unreadable one."""
    try:
        return read_record(model, path, within=within).model_dump(exclude_unset=True)
    except LauncherError:
        return None


def read_metrics(path: Path, model: type[BaseModel] = MetricsLine) -> list[dict[str, Any]]:
    """metrics.jsonl's (or progress.jsonl's) records; a line cut short by a killed run, or
    one that is not what launch writes, is skipped."""
    try:
        return [r.model_dump(exclude_unset=True)
                for r in read_lines(model, path, within=path.parent.parent)]
    except LauncherError:
        return []


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _progress(report: dict) -> dict:
    """What a user's job reported in LAUNCH_STEP lines (summary.json's `progress`)."""
    return (report.get("job") or {}).get("progress") or {}


def _headline(report: dict, summary: dict) -> list[tuple[str, str]]:
    """The numbers people decide from, each only when the run has it."""
    training = report.get("training") or {}
    progress = _progress(report)
    items = []
    steps = summary.get("steps") if _num(summary.get("steps")) else progress.get("step")
    if _num(steps):
        items.append((f"{steps}", "steps"))
    if _num(summary.get("final_loss")):
        items.append((f"{summary['final_loss']:.4f}", "final loss"))
    elif _num(progress.get("loss")):
        items.append((f"{progress['loss']:.4f}", "last loss"))
    if _num(summary.get("eval_accuracy")):
        items.append((f"{summary['eval_accuracy']:.2%}", "held-out accuracy"))
    if _num(training.get("images_per_sec")):
        items.append((f"{training['images_per_sec']:.1f}", "images/s"))
    split = training.get("split") or {}
    if _num(split.get("step_s")):
        items.append((f"{split['step_s'] * 1e3:.1f} ms", "per step"))
    if _num(split.get("comm_share")):
        items.append((f"{split['comm_share']:.0%}", "waiting on communication"))
    stragglers = [f"rank {s['rank']}" for s in training.get("stragglers") or []] + [
        f"{s['node']}/{s['local_rank']}" for s in progress.get("stragglers") or []]
    if stragglers:
        items.append((", ".join(stragglers), "straggler"))
    if summary.get("restarts"):
        items.append((str(sum(r.get("restarted", True) for r in summary["restarts"])),
                      "restart(s)"))
    if _num(summary.get("duration_s")):
        items.append((f"{summary['duration_s']:.1f} s", "duration"))
    return items


# Phases drawn in the timeline's bar: training's kept time green, its losses red, the rest in
# greys and blues (launcher/runs/timeline.py names them).
_PHASE_COLOURS = {"training": "#2e9d5b", "lost in training": "#d64545",
                  "to first step": "#6b8fd6", "preflight": "#9aa6bd", "preparation": "#b4bdd0",
                  "start-up": "#c9cfdc", "stop": "#e3a24a", "collection": "#d9c07a",
                  "summary": "#cfc7a5", "report": "#bdb59a", "machine recovery": "#a35fb5",
                  "gate": "#7fb3c9", "bandwidth sweep": "#93c4c0",
                  "hand-over": "#8fa0c4", "queue and follow": "#7d8aa6",
                  "controller start-up": "#c9cfdc", "controller report": "#bdb59a"}


def timeline_bar(timeline: dict | None) -> str:
    """One horizontal bar of the run's wall time (summary.json `timeline`): each phase's
    width its share, training split into the time in kept steps and what it lost; goodput and
    the largest losses beside it."""
    if not isinstance(timeline, dict) or not _num(timeline.get("wall_s")) or \
            timeline["wall_s"] <= 0:
        return ""
    wall = timeline["wall_s"]
    parts: list[tuple[str, float]] = []
    for phase in timeline.get("phases") or []:
        if phase["name"] == "training" and _num(timeline.get("kept_steps_s")):
            parts += [("training", timeline["kept_steps_s"]),
                      ("lost in training", phase["s"] - timeline["kept_steps_s"])]
        else:
            parts.append((phase["name"], phase["s"]))
    cells = "".join(
        f"<span style=\"width:{100 * s / wall:.3f}%;background:"
        f"{_PHASE_COLOURS.get(name, '#8c96a8')}\" title=\"{page.esc(name)}: {s:.2f} s\">"
        "</span>" for name, s in parts if s > 0)
    legend = "".join(
        f"<li><i style=\"background:{_PHASE_COLOURS.get(name, '#8c96a8')}\"></i>"
        f"{page.esc(name)} {s:.1f} s</li>" for name, s in parts if s > 0)
    return (f"<div class=\"timeline\"><p><b>{page.esc(describe_timeline(timeline))}</b></p>"
            f"<div class=\"bar\">{cells}</div><ul class=\"legend\">{legend}</ul></div>")


def _lead(report: dict, summary: dict) -> str:
    status = report["status"]
    parts = [f"<span class=\"status-{page.esc(status)}\">{page.esc(status)}</span>"]
    job = report.get("job") or {}
    what = (f"{job['kind']} job" + (f" {job['target']}" if job.get("target") else "")
            if job else report["workload"])
    parts += [page.esc(what), f"backend {page.esc(report['backend'] or 'unknown')}",
              f"{report['nnodes']} node(s), world size {page.esc(report['world_size'])}"]
    if summary.get("recipe"):
        parts.append(f"recipe {page.esc(summary['recipe'])}")
    hook = (report.get("training") or {}).get("comm_hook")
    if hook:
        parts.append(f"comm hook {page.esc(hook)}")
    if summary.get("started_at"):
        parts.append(f"started {page.esc(summary['started_at'])}")
    return f"<p class=\"lead\">{' · '.join(parts)}</p>"


def _plot(ident: str, result) -> str:
    fig, sentence = result
    if fig is not None:
        return page.svg(fig, ident)
    return page.none(sentence) if sentence else ""


def _exits(summary: dict) -> str:
    nodes = summary.get("nodes") or []
    if not summary:
        return page.none("No summary.json: the run may still be running, or launch was killed "
                         "before writing it (`launch runs` tells which).")
    if not nodes:
        return page.none("summary.json lists no node exits (an older launch wrote it).")
    rows = [(n.get("name", "?"), n.get("status", "?"),
             "-" if n.get("exit_code") is None else str(n["exit_code"]),
             str(n.get("restarts", 0))) for n in nodes]
    return page.table(("node", "status", "exit code", "restarts"), rows, numeric=(2, 3))


def step_curves(run_dir: Path, report: dict) -> list[plots.Attempt]:
    """The logged steps: the trainer's metrics.jsonl, or a user's job's progress.jsonl."""
    if report["workload"] == "job":
        return plots.attempts(plots.job_records(read_metrics(run_dir / PROGRESS_FILE,
                                                             ProgressLine)),
                              clock_per_attempt=False)
    return plots.attempts(read_metrics(run_dir / "metrics.jsonl"))


def _training_parts(report: dict, summary: dict, runs: list[plots.Attempt]) -> list[str]:
    if report["workload"] == "bench":
        return []
    if report["workload"] == "job":
        if not runs:
            return [page.none("No step curve to draw: the job printed no LAUNCH_STEP line. "
                              "What launch knows of it is below: each node's exit, restarts "
                              "and hangs, the run's duration.")]
        timeline = summary.get("timeline") if isinstance(summary.get("timeline"), dict) \
            else {}
        # What came before the first step (connect, ship, setup, rendezvous...): the steps'
        # times count from the run's start (a handed-over run's: from its controller's,
        # placed on the run's timeline at controller_at_s).
        before = before_first_step(timeline)
        shift = timeline.get("controller_at_s") or 0.0
        for a in runs:
            a.offset_s = shift if _num(shift) else 0.0
        return [_plot("plot-loss", plots.loss_plot(
                    runs, total_steps=_progress(report).get("step"), accuracy=None,
                    time_label=plots.RUN_TIME, before=before)),
                _plot("plot-throughput", plots.throughput_plot(
                    runs, key="samples_per_sec", unit="samples/s", time_label=plots.RUN_TIME,
                    missing="The job's LAUNCH_STEP lines carry no samples=: no throughput "
                            "to draw.", before=before))]
    if not runs:
        return [page.none("This run logged no step to metrics.jsonl: no loss, throughput or "
                          "communication curve to draw. What launch knows of it is below: "
                          "each node's exit, restarts and hangs, the run's duration.")]
    accuracy = summary.get("eval_accuracy")
    return [_plot("plot-loss", plots.loss_plot(runs, total_steps=summary.get("steps"),
                                               accuracy=accuracy if _num(accuracy) else None)),
            _plot("plot-throughput", plots.throughput_plot(runs))]


def _rank_parts(report: dict, summary: dict, runs: list[plots.Attempt]) -> list[str]:
    if report["workload"] == "job":
        progress = _progress(report)
        if not progress.get("ranks"):
            return []
        return [_plot("plot-rank-busy", plots.job_busy_plot(progress["ranks"],
                                                            progress.get("stragglers") or []))]
    training = report.get("training") or {}
    rank_times = training.get("rank_times") or summary.get("rank_times") or []
    stragglers = training.get("stragglers") or summary.get("stragglers") or []
    if report["workload"] == "bench" or (not rank_times and not runs):
        return []
    parts = [_plot("plot-rank-split", plots.rank_split_plot(rank_times, stragglers))]
    if rank_times:
        parts.append(_plot("plot-rank-busy", plots.rank_busy_plot(runs, rank_times, stragglers)))
    return parts


def _comm_parts(report: dict, runs: list[plots.Attempt]) -> list[str]:
    if report["workload"] in ("bench", "job") or not runs:
        return []     # a user's job reports no communication wait
    training = report.get("training") or {}
    return [_plot("plot-comm-share", plots.comm_share_plot(runs, training.get("auto"),
                                                            training.get("comm_hook")))]


def _bandwidth_parts(run_dir: Path, report: dict) -> list[str]:
    bw = report["bandwidth"]
    doc = _json(BandwidthRecord, run_dir / bw["source"], None) if bw.get("source") else None
    return [_plot("plot-bandwidth", plots.bandwidth_plot(
        doc if isinstance(doc, dict) else None, bw.get("compared"), bw.get("source") or ""))]


def _recovery_parts(summary: dict) -> list[str]:
    fig, _ = plots.timeline_plot(summary)
    if fig is not None:
        return [page.svg(fig, "plot-timeline"), _exits(summary)]
    calm = summary and not (summary.get("restarts") or summary.get("hang")
                            or summary.get("resumed_from_step"))
    return ([page.none("No restart, hang or resume.")] if calm else []) + [_exits(summary)]


def _linker(run_dir: Path):
    """`code` spans of report.md that name a file of the run folder (hang stacks, the failing
    node's log) become links, relative to the page: only a regular file reached without a
    link at any step (what launch wrote, not what a tampered folder points at), and only a
    path page.href can make a relative URL of."""
    def link(text: str) -> str | None:
        if page.href(text) is None:
            return None
        where = run_dir
        for part in Path(text).parts:
            where = where / part
            try:
                info = os.lstat(where)
            except (OSError, ValueError):
                return None
            if stat.S_ISLNK(info.st_mode):
                return None
        return text if stat.S_ISREG(info.st_mode) else None
    return link


TIME = "Time"     # report.md's section of the run's timeline


def timed(name: str, part: str) -> str:
    """A part of the page drawn from the run's timeline, between the markers that let it be
    drawn again alone (launcher/report/retime.py): HTML comments, which no part contains."""
    return f"<!--launch:timeline {name}-->{part}<!--/launch:timeline {name}-->"


def timeline_parts(run_dir: str | Path, report: dict, summary: dict, time_section: str,
                   runs: list[plots.Attempt] | None = None) -> dict[str, str]:
    """Every part of the page drawn from the run's timeline (summary.json's), by name: the bar
    at the top, report.md's Time section (`time_section`, its text), and a user's job's step
    curves, whose time axis counts from the run's start (a handed-over run's: the launch
    process's, on the timeline's controller_at_s). The page is these and parts that do not
    depend on the timeline: the only way to draw them, whole page or alone."""
    run_dir = Path(run_dir)
    parts = {"bar": timeline_bar(summary.get("timeline")),
             "time": page.markdown(time_section, _linker(run_dir))}
    if report["workload"] == "job":
        runs = step_curves(run_dir, report) if runs is None else runs
        parts["steps"] = "".join(p for p in _training_parts(report, summary, runs) if p)
    return parts


def page_summary(run_dir: Path) -> dict:
    """summary.json as the page reads it ({} when there is none to read)."""
    summary = _json(SummaryRecord, run_dir / "summary.json", run_dir.parent)
    return summary if isinstance(summary, dict) else {}


def render_report_html(run_dir: str | Path, report: dict, markdown: str) -> str:
    """The page of `report` (launcher.report.build.build_report) and its report.md text."""
    run_dir = Path(run_dir)
    summary = page_summary(run_dir)
    runs = step_curves(run_dir, report)
    _, sections = page.markdown_sections(markdown)
    link = _linker(run_dir)
    drawn = timeline_parts(run_dir, report, summary, sections.get(TIME, ""), runs)
    body = [f"<h1>Run report: {page.esc(report['run_id'])}</h1>", _lead(report, summary),
            timed("bar", drawn["bar"]), page.figures_strip(_headline(report, summary))]
    steps_heading = "Job" if report["workload"] == "job" else "Training"  # as report.md's
    steps = ([timed("steps", drawn["steps"])] if drawn.get("steps") else []) \
        if "steps" in drawn else _training_parts(report, summary, runs)
    # (heading, report.md's section shown under it, what the page adds)
    layout = [
        ("Failure", "Failure", []),
        (steps_heading, steps_heading, steps),
        ("Where each rank's step went", None, _rank_parts(report, summary, runs)),
        ("Communication", None, _comm_parts(report, runs)),
        ("Bus bandwidth", "Bus bandwidth", _bandwidth_parts(run_dir, report)),
        ("Restarts, hangs and exits", "Restarts and hangs", _recovery_parts(summary)),
        ("Nodes", "Nodes", []),
        ("Warnings", "Warnings", []),
        ("What to change", "What to change", []),
    ]
    used = set()
    for heading, section, parts in layout:
        text = sections.get(section, "") if section else ""
        used.add(section)
        if not text.strip() and not any(parts):
            continue
        body.append(f"<h2>{page.esc(heading)}</h2>")
        if text.strip():
            body.append(page.markdown(text, link))
        body += [p for p in parts if p]
    for section, text in sections.items():   # sections report.md gained since
        if section not in used:
            body += [f"<h2>{page.esc(section)}</h2>",
                     timed("time", drawn["time"]) if section == TIME
                     else page.markdown(text, link)]
    body.append("<p class=\"none\">Written by launch from this run folder (plan.json, "
                "summary.json, the logged steps); report.md and report.json hold the same facts "
                "as text.</p>")
    return page.document(f"launch run {report['run_id']}", body)


def write_report_html(run_dir: str | Path, report: dict, markdown: str) -> Path:
    run_dir = Path(run_dir)
    path = run_dir / REPORT_HTML
    tmp = run_dir / f"{REPORT_HTML}.tmp"
    tmp.write_text(render_report_html(run_dir, report, markdown))
    tmp.replace(path)
    return path
