"""The plots of a run's report page, each drawn from what the run folder holds.

Every function returns a matplotlib Figure, or a sentence saying why there is none (a run that
lacks the data gets the sentence, never an empty plot). Figures are made without pyplot (no
global state, no display) and carry the run's own numbers as text: the last step on the step
axis, ranks and nodes in the legends, the measured values in the titles.
"""

from __future__ import annotations

import math

import statistics
from dataclasses import dataclass
from typing import Any

from launcher.nccl.links import LinkPeak
from launcher.nccl.plot import SIDES, draw_busbw, legend
from train.stepsplit import STATISTIC

COMPUTE, DATA, COMM = "#4c72b0", "#dd8452", "#c44e52"
SLOW = "#d62728"
WIDE, TALL = (10, 3.6), 3.2
MAX_RANK_BARS = 32     # more ranks: the slowest this many (stragglers first) are drawn
MAX_RANK_LINES = 8     # more ranks: a labelled line for the stragglers, the rest grey


@dataclass
class Attempt:
    """The metrics of one process lifetime: a restart starts a new one (steps go back to the
    checkpoint, the trainer's clock starts again)."""

    number: int
    records: list[dict[str, Any]]
    offset_s: float = 0.0          # training time of the attempts before it


def attempts(records: list[dict[str, Any]], *, clock_per_attempt: bool = True
             ) -> list[Attempt]:
    """The records split where the step goes back (a resume from a checkpoint) or, with
    `clock_per_attempt` (the trainer's time_s starts at 0 in every process), where the time
    does; such attempts are then laid end to end in time."""
    out: list[Attempt] = []
    last_step = last_time = None
    for r in records:
        if not isinstance(r.get("step"), (int, float)):
            continue
        back = last_step is not None and r["step"] <= last_step
        back = back or (clock_per_attempt and last_time is not None
                        and r.get("time_s") is not None and r["time_s"] < last_time)
        if not out or back:
            out.append(Attempt(len(out) + 1, []))
        out[-1].records.append(r)
        last_step, last_time = r["step"], r.get("time_s")
    offset = 0.0
    for a in out if clock_per_attempt else []:
        a.offset_s = offset
        times = [r["time_s"] for r in a.records if r.get("time_s") is not None]
        offset += max(times) if times else 0.0
    return out


def job_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """progress.jsonl (rank 0's LAUNCH_STEP lines, `t` on launch's clock since the run began)
    as metrics.jsonl's terms: time_s, and samples/s between two reported steps when the job
    said how many samples a step takes."""
    out, prev = [], None
    for r in records:
        record = {"step": r.get("step"), "loss": r.get("loss"), "time_s": r.get("t")}
        if (prev is not None and r.get("samples") and _ordered(prev, r, "t")
                and _ordered(prev, r, "step")):
            record["samples_per_sec"] = (r["samples"] * (r["step"] - prev["step"])
                                         / (r["t"] - prev["t"]))
        out.append(record)
        prev = r
    return out


def _ordered(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    return isinstance(a.get(key), (int, float)) and isinstance(b.get(key), (int, float)) \
        and b[key] > a[key]


def _figure(size=WIDE, cols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    axes = fig.subplots(1, cols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def _with_tick(ax, value: float) -> None:
    """The x axis ending at `value`, which is one of its ticks (the run's step count shows)."""
    ax.set_xlim(0, value)
    ticks = [t for t in ax.get_xticks() if 0 <= t < value * 0.93]
    ax.set_xticks([*ticks, value], [f"{t:g}" for t in ticks] + [f"{value:g}"])


# What a plot draws: a value beyond it (a job's loss of 1e308, finite) is left out, as a
# missing one is; matplotlib's tick arithmetic overflows on a range near the float limit
# (1e308 - -1e308) and the whole run page was lost with it.
PLOTTABLE = 1e100


def _value(record: dict[str, Any], key: str) -> Any:
    """record[key] when it can be drawn, else None; "split.comm_share" reaches into the
    record's step split."""
    for part in key.split("."):
        record = record.get(part) if isinstance(record, dict) else None
    if isinstance(record, bool) or not isinstance(record, (int, float)):
        return None
    return record if math.isfinite(record) and abs(record) <= PLOTTABLE else None


def _series(attempt: Attempt, key: str, x: str) -> tuple[list[float], list[float]]:
    pairs = [((r["step"] if x == "step" else attempt.offset_s + r["time_s"]), _value(r, key))
             for r in attempt.records
             if _value(r, key) is not None and (x == "step" or r.get("time_s") is not None)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _label(runs: list[Attempt], a: Attempt) -> str | None:
    return None if len(runs) == 1 else f"attempt {a.number}"


def _colour(runs: list[Attempt], a: Attempt, own: str) -> str:
    """The plot's own colour for a run of one attempt; with several, each attempt its colour
    of matplotlib's cycle (C0, C1, ...), as the loss plot draws it: a legend of attempts drawn
    in one colour could not tell them apart."""
    return own if len(runs) == 1 else f"C{(a.number - 1) % 10}"


def _restart_lines(ax, runs: list[Attempt]) -> None:
    for a in runs[1:]:
        ax.axvline(a.offset_s, color="grey", linestyle="--", linewidth=1)


TRAINING_TIME = "training time (s)"
RUN_TIME = "seconds since the run started"


def _phase_bands(ax, before: list[tuple[str, float, float]]) -> None:
    """The run's phases before its first step (launcher/runs/timeline.py before_first_step)
    as shaded bands, each named, on a plot whose x axis is seconds since the run started."""
    for i, (name, begun, until) in enumerate(before):
        if until <= begun:
            continue
        ax.axvspan(begun, until, color=PHASE_SHADES[i % len(PHASE_SHADES)], alpha=0.6,
                   linewidth=0, zorder=0)
        ax.text((begun + until) / 2, 0.98, name, transform=ax.get_xaxis_transform(),
                rotation=90, ha="center", va="top", fontsize=7, color="dimgray", clip_on=True)


PHASE_SHADES = ("#d9d9d9", "#eeeeee")


def _time_label(runs: list[Attempt], label: str) -> str:
    return label + (", attempts end to end" if len(runs) > 1 and label == TRAINING_TIME
                    else "")


def loss_plot(runs: list[Attempt], *, total_steps: int | None, accuracy: float | None,
              time_label: str = TRAINING_TIME, before: list[tuple[str, float, float]] = ()):
    """Loss against step and against time; the held-out accuracy where it was measured
    (once, after the last step). `before`: the run's phases before its first step, drawn on
    the time plot (its x axis then seconds since the run started)."""
    if not any(r.get("loss") is not None for a in runs for r in a.records):
        return None, "No loss was logged: the run printed no step lines with a loss."
    fig, (by_step, by_time) = _figure(cols=2)
    for a in runs:
        label = _label(runs, a)
        colour = _colour(runs, a, "C0")
        by_step.plot(*_series(a, "loss", "step"), "-", marker=".", color=colour, label=label)
        by_time.plot(*_series(a, "loss", "time"), "-", marker=".", color=colour, label=label)
    last = total_steps or max(r["step"] for a in runs for r in a.records)
    _with_tick(by_step, last)
    by_step.set_xlabel("step")
    by_step.set_ylabel("training loss")
    title = f"training loss over {last} steps"
    if accuracy is not None:
        acc = by_step.twinx()
        acc.plot([last], [accuracy], "D", color="tab:green", markersize=8, clip_on=False,
                 label=f"held-out accuracy {accuracy:.4f}")
        acc.set_ylim(0, 1.02)
        acc.set_ylabel("held-out accuracy", color="tab:green")
        legend(acc, loc="center right", fontsize=8)
        title += f"; held-out accuracy {accuracy:.4f} after the last"
    by_step.set_title(title, fontsize=10)
    if time_label == TRAINING_TIME:
        _restart_lines(by_time, runs)
    _phase_bands(by_time, before)
    by_time.set_xlabel(_time_label(runs, time_label))
    by_time.set_ylabel("training loss")
    by_time.set_xlim(left=0)
    if len(runs) > 1:
        legend(by_step, fontsize=8, loc="upper right")
    return fig, None


def throughput_plot(runs: list[Attempt], *, key: str = "images_per_sec",
                    unit: str = "images/s", time_label: str = TRAINING_TIME,
                    missing: str = "No throughput was logged (images/s per logged step).",
                    before: list[tuple[str, float, float]] = ()):
    if not any(r.get(key) is not None and r.get("time_s") is not None
               for a in runs for r in a.records):
        return None, missing
    fig, (ax,) = _figure(size=(10, TALL))
    values = []
    for a in runs:
        xs, ys = _series(a, key, "time")
        values += ys
        ax.plot(xs, ys, "-", marker=".", color=_colour(runs, a, "tab:purple"),
                label=_label(runs, a))
    if time_label == TRAINING_TIME:
        _restart_lines(ax, runs)
    _phase_bands(ax, before)
    median = statistics.median(values)
    ax.axhline(median, color="grey", linestyle=":", label=f"median {median:.1f} {unit}")
    ax.set_xlabel(_time_label(runs, time_label))
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    legend(ax, fontsize=8, loc="lower right")
    return fig, None


def _rank_name(r: dict[str, Any]) -> str:
    return f"rank {r['rank']} ({r['node']})"


def rank_split_plot(rank_times: list[dict[str, Any]], stragglers: list[dict[str, Any]]):
    """Per rank, its mean step split into compute, data wait and communication wait (the
    trainer's rank_times, train/stepsplit.py); a straggler computes longer and waits on
    communication less than the others."""
    if not rank_times:
        return None, ("No per-rank times: the trainer did not report them (a user's own job, "
                      "or a run that ended before its first log interval).")
    slow = {s["rank"]: s for s in stragglers}
    ranks = list(rank_times)
    left_out = 0
    if len(ranks) > MAX_RANK_BARS:
        busy = sorted(ranks, key=lambda r: (r["rank"] not in slow,
                                            -(r["compute_s"] + r["data_wait_s"])))
        keep = {r["rank"] for r in busy[:MAX_RANK_BARS]}
        left_out = len(ranks) - len(keep)
        ranks = [r for r in ranks if r["rank"] in keep]
    fig, (ax,) = _figure(size=(10, 1.2 + 0.32 * len(ranks)))
    names = [_rank_name(r) for r in ranks]
    ys = list(range(len(ranks)))[::-1]
    left = [0.0] * len(ranks)
    for key, color, label in (("compute_s", COMPUTE, "compute"),
                              ("data_wait_s", DATA, "data wait"),
                              ("comm_wait_s", COMM, "communication wait")):
        widths = [r[key] * 1e3 for r in ranks]
        ax.barh(ys, widths, left=left, color=color, label=label, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    for y, r, total in zip(ys, ranks, left):
        if r["rank"] in slow:
            s = slow[r["rank"]]
            ax.barh([y], [total], fill=False, edgecolor=SLOW, linewidth=2.5, height=0.8,
                    label=f"straggler: rank {s['rank']} on {s['node']} ({s['ratio']:g}x)")
    ax.set_yticks(ys, names, fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), ranks):
        if r["rank"] in slow:
            tick.set_color(SLOW)
            tick.set_fontweight("bold")
    ax.set_xlabel(f"{STATISTIC} time per step (ms)")
    title = "where each rank's step went"
    if left_out:
        title += f" ({len(ranks)} slowest of {len(ranks) + left_out} ranks drawn)"
    ax.set_title(title, fontsize=10)
    legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig, None


def job_busy_plot(ranks: dict[str, dict[str, Any]], stragglers: list[dict[str, Any]]):
    """A user's job's ranks (node/local rank) by the median busy time their LAUNCH_STEP
    lines reported, the straggler launch named outlined."""
    busy = {name: r["busy_s_median"] for name, r in ranks.items()
            if r.get("busy_s_median") is not None}
    if not busy:
        return None, ("The job's LAUNCH_STEP lines carry no busy_s: no per-rank picture (the "
                      "line's busy_s= opts in, docs/jobs.md).")
    slow = {f"{s['node']}/{s['local_rank']}": s for s in stragglers}
    names = list(busy)
    left_out = 0
    if len(names) > MAX_RANK_BARS:
        # As rank_split_plot: the stragglers and the slowest ranks, in the ranks' order. A bar
        # and a label per rank of 1,024 nodes of 8 ranks took matplotlib minutes (issue 37).
        keep = set(sorted(names, key=lambda n: (n not in slow, -busy[n]))[:MAX_RANK_BARS])
        left_out = len(names) - len(keep)
        names = [n for n in names if n in keep]
    fig, (ax,) = _figure(size=(10, 1.2 + 0.32 * len(names)))
    ys = list(range(len(names)))[::-1]
    ax.barh(ys, [busy[n] * 1e3 for n in names], color=COMPUTE, height=0.7,
            label="busy (the job's busy_s)")
    for y, name in zip(ys, names):
        if name in slow:
            s = slow[name]
            ax.barh([y], [busy[name] * 1e3], fill=False, edgecolor=SLOW, linewidth=2.5,
                    height=0.8, label=f"straggler: {s['node']} local rank {s['local_rank']} "
                                      f"({s['ratio']:g}x)")
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlabel("median busy time per step (ms)")
    title = "each rank's own work per step, as the job reported it"
    if left_out:
        title += f" ({len(names)} slowest of {len(names) + left_out} ranks drawn)"
    ax.set_title(title, fontsize=10)
    legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig, None


def rank_busy_plot(runs: list[Attempt], where: list[dict[str, Any]],
                   stragglers: list[dict[str, Any]]):
    """Each rank's busy time (compute + data wait) per log interval: a straggler's line stands
    above the others for the intervals it held the run back."""
    points = [(r["step"], r["ranks"]) for a in runs for r in a.records if r.get("ranks")]
    if not points:
        return None, ("No per-interval rank times in metrics.jsonl (trainers before this page, "
                      "or a user's own job): the split above is all there is.")
    nodes = {w["rank"]: w["node"] for w in where}
    slow = {s["rank"] for s in stragglers}
    world = len(points[-1][1])
    steps = [p[0] for p in points]

    def busy(rank: int) -> list[float]:
        return [(rows[rank][0] + rows[rank][1]) * 1e3 if rank < len(rows) else float("nan")
                for _, rows in points]

    fig, (ax,) = _figure(size=(10, TALL))
    labelled = world <= MAX_RANK_LINES
    for rank in range(world):
        name = f"rank {rank}" + (f" on {nodes[rank]}" if rank in nodes else "")
        if rank in slow:
            ax.plot(steps, busy(rank), "-", marker=".", color=SLOW, linewidth=2.5,
                    label=f"{name} (straggler)", zorder=3)
        else:
            ax.plot(steps, busy(rank), "-", marker="." if labelled else None, linewidth=1,
                    color=None if labelled else "#9aa3b5", alpha=1 if labelled else 0.6,
                    label=name if labelled else None)
    if not labelled:
        ax.plot([], [], color="#9aa3b5", label=f"the other {world - len(slow)} ranks")
    _with_tick(ax, max(steps))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)      # room for the legend above the lines
    ax.set_xlabel("step")
    ax.set_ylabel("busy ms per step\n(compute + data wait)")
    legend(ax, fontsize=8, loc="upper left", ncol=2)
    return fig, None


def comm_share_plot(runs: list[Attempt], auto: dict[str, Any] | None, hook: str | None):
    """The share of each logged interval's step time spent waiting on communication, and
    where `comm_hook: auto` measured and decided."""
    if not any(_value(r, "split.comm_share") is not None for a in runs for r in a.records):
        return None, "No communication share was logged (the trainer's comm timer is off)."
    fig, (ax,) = _figure(size=(10, TALL))
    shares = []
    for a in runs:
        xs, ys = _series(a, "split.comm_share", "step")
        shares += ys
        ax.plot(xs, [y * 100 for y in ys], "-", marker=".", color=_colour(runs, a, COMM),
                label=_label(runs, a))
    last = max(r["step"] for a in runs for r in a.records)
    _with_tick(ax, last)
    ax.set_ylim(0, 100)
    ax.set_xlabel("step")
    ax.set_ylabel("waiting on communication (%)")
    title = f"comm hook {hook or 'unknown'}; median {statistics.median(shares):.0%} of step time"
    if auto and auto.get("decided_at_step") is not None:
        step = auto["decided_at_step"]
        timed = [f"{name} {auto[key] * 1e3:.1f} ms per step"
                 for name, key in (("all-reduce", "allreduce_step_s"),
                                   ("PowerSGD", "powersgd_step_s"))
                 if auto.get(key) is not None]
        ax.axvline(step, color="black", linestyle="--",
                   label=f"auto chose {auto['choice']} at step {step}"
                         + (f" ({', '.join(timed)})" if timed else ""))
    elif auto:
        title += f"; auto undecided: {auto.get('reason')}"
    legend(ax, fontsize=8, loc="upper right")     # the attempts, auto's decision
    ax.set_title(title, fontsize=10)
    return fig, None


def bandwidth_plot(doc: dict[str, Any] | None, compared: dict[str, Any] | None, source: str):
    """Bus bandwidth against message size from a bench's bandwidth.json, with the link peak
    the report holds it against. Without one no sentence: report.md's says what to run."""
    if not doc or not doc.get("rows"):
        return None, None
    rows = doc["rows"]
    series = {side: [(r["size"], r[side]["busbw"]) for r in rows
                     if (r.get(side) or {}).get("busbw") is not None] for side in SIDES}
    peak = None
    if compared:
        p = compared["link_peak"]
        peak = LinkPeak(p["gbps"], p["label"])
    elif doc.get("link_peak"):
        peak = LinkPeak(doc["link_peak"]["gbps"], doc["link_peak"]["label"])
    title = f"{doc.get('collective')}: peak busbw {doc.get('peak_busbw', 0) or 0:.2f} GB/s"
    if compared:
        title += f", {compared['ratio']:.0%} of the link's peak ({compared['figure']})"
    fig, (ax,) = _figure(size=(10, 4))
    draw_busbw(ax, series, [r["size"] for r in rows], title=f"{title} - {source}", peak=peak)
    if compared and compared["figure"].startswith("algbw"):
        # Across nodes the peak is the network's, held against what each node's network
        # carries (launcher/nccl/compare.py): that figure is drawn too, busbw overstates it.
        factor = float(compared["figure"].partition(" x ")[2] or 1)
        points = [(r["size"], r["out_of_place"]["algbw"] * factor) for r in rows
                  if (r.get("out_of_place") or {}).get("algbw") is not None]
        if points:
            ax.plot(*zip(*points), "^-", color="tab:green", markersize=4,
                    label=f"{compared['figure']}: what each node's network carried")
            ax.set_ylabel("GB/s")
            legend(ax, fontsize=8, loc="upper left")
    return fig, None


def timeline_plot(summary: dict[str, Any]):
    """Per node, the run from start to end: restarts (and how long training took to come
    back), the hang, each node's exit."""
    restarts = summary.get("restarts") or []
    hang = summary.get("hang")
    resumed = summary.get("resumed_from_step")
    nodes = summary.get("nodes") or []
    duration = summary.get("duration_s")
    if not (restarts or hang or resumed) or not nodes or not duration:
        return None, None
    fig, (ax,) = _figure(size=(10, 1.4 + 0.45 * len(nodes)))
    names = [n["name"] for n in nodes]
    ys = {name: i for i, name in enumerate(reversed(names))}
    for node in nodes:
        ok = node.get("status") == "succeeded"
        ax.barh([ys[node["name"]]], [duration], color="#e3e8f2", height=0.5)
        ax.annotate(f"exit {node.get('exit_code')}", (duration, ys[node["name"]]),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
                    color="#1a7f37" if ok else SLOW)
    for i, r in enumerate(restarts):
        y = ys.get(r["node"], 0)
        ax.plot([r["at_time_s"]], [y], "X", color=SLOW, markersize=10,
                label="restart" if i == 0 else None)
        if r.get("recovered_in_s") is not None:
            ax.barh([y], [r["recovered_in_s"]], left=r["at_time_s"], color="#f4b183",
                    height=0.5, label="until training again" if i == 0 else None)
        back = ("" if r.get("resumed_from_step") is None
                else f", resumed from step {r['resumed_from_step']}")
        ax.annotate(f"{r['kind']}: restart {i + 1}{back}", (r["at_time_s"], y),
                    xytext=(6, 12), textcoords="offset points", ha="left", fontsize=8)
    if hang:
        ax.axvline(hang["detected_at_s"], color="black", linestyle="--",
                   label=f"hang found at {hang['detected_at_s']:.1f} s "
                         f"(no step for {hang['idle_s']:.0f} s)")
    if resumed:
        # Above the bars, in the axes' own coordinates: placed in data coordinates above
        # the top bar it fell outside the axes, and matplotlib drew nothing there.
        ax.annotate(f"attempt {summary.get('attempt')}: resumed from step {resumed} "
                    "(launch run --resume)", (0, 1), xycoords="axes fraction", xytext=(2, 2),
                    textcoords="offset points", va="bottom", fontsize=8)
    ax.set_yticks(list(ys.values()), list(ys.keys()), fontsize=8)
    ax.set_xlim(0, duration * 1.08)
    ax.set_xlabel(f"seconds since the run started (it took {duration:.1f} s)")
    legend(ax, fontsize=8, loc="upper left",
           bbox_to_anchor=(0, -0.35 if len(nodes) < 3 else -0.2), ncol=3)
    return fig, None
