"""Where a run's wall time went: phases that add up to it, and goodput.

The pipeline marks each phase's beginning on a monotonic clock as it goes (Timeline.begin:
launcher/pipeline/run.py, launcher/execute/attempt.py), from the launch process's start (the
controller's, for a detached run) to summary.json's write, so the phases partition the wall
time by construction: nothing is reconstructed from logs afterwards. The job's part ("job",
from the nodes' start to the last one's exit) is split where the job's own reports say:

    to first step   until the first step the job reported (a LAUNCH_STEP line, the bundled
                    trainer's step lines), its first step's own time included
    training        from there to the last step reported
    stop            from the last step to every node's exit

and inside training, what was lost (restarts from their detection to the first step after
them, the steps recomputed after a restart or a resume, hang waits, the trainer's checkpoint
blocking time). goodput = (training - losses) / wall: the time spent in steps that were kept.
A job that reported no step has no goodput: launch invents none.

    Timeline(start)                    start: process_start() for a launch process
    timeline.begin("preflight")        the next phase begins now
    timeline.line(node, rank, text)    every job line (the router feeds it): steps seen
    timeline.to_json(incidents=..., hangs=..., checkpoint_blocking_s=...)
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from launcher.runs.logs import parse_progress
from launcher.runs.progress import parse_step

_IMPORTED_AT = time.monotonic()
# The bundled trainer (train/main.py): its first step of each start, and its progress lines
# (parse_progress) every log_every steps.
_FIRST_STEP = re.compile(r"^step (?P<step>\d+): first step")
JOB = "job"        # the phase split by the job's steps (to first step, training, stop)
LAST = "summary"   # the phase summary.json's write ends
FOLLOWING = "following"   # a handed-over run followed from here (handed_over)


def process_start(clock: Callable[[], float] = time.monotonic) -> float:
    """This process's start on `clock` (Linux: /proc/self/stat against the boot clock), so
    that the interpreter's start and launch's imports are counted too; elsewhere, when this
    module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")   # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT
    if not 0 <= age < time.monotonic() - _IMPORTED_AT + 600:
        return _IMPORTED_AT    # a clock that disagrees: the import's time is a floor
    return clock() - age


@dataclass(frozen=True)
class Seen:
    at: float
    node: str
    step: int


class Timeline:
    """Thread-safe: the router's threads report steps while the pipeline marks phases."""

    def __init__(self, start: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock() if start is None else start
        self._marks: list[tuple[str, float]] = [("start-up", self.start)]
        self._steps: list[Seen] = []
        self._last_kept: int | None = None
        self._nodes: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    # ---- marking ------------------------------------------------------------------------
    def begin(self, phase: str) -> float:
        """The phase `phase` begins now (the one before ends); returns the time."""
        now = self.clock()
        with self._lock:
            self._marks.append((phase, now))
        return now

    def node(self, name: str, part: str, seconds: float) -> None:
        """A per-node fact in seconds (e.g. its setup's time)."""
        with self._lock:
            self._nodes.setdefault(name, {})[part] = seconds

    def node_at(self, name: str, part: str) -> None:
        """A per-node moment (e.g. its exit), kept as seconds since the start."""
        self.node(name, part, self.clock() - self.start)

    def step(self, node: str, step: int, at: float | None = None) -> None:
        """A step the job reported, as launch saw it."""
        at = self.clock() if at is None else at
        with self._lock:
            first = self._nodes.setdefault(node, {})
            first.setdefault("first_step_s", at - self.start)
            # Every rank of every node reports the same step: the first report of each is the
            # one the accounting reads, so memory grows with the steps, not steps x ranks.
            if step != self._last_kept:
                self._last_kept = step
                self._steps.append(Seen(at, node, step))

    def line(self, node: str, rank: str, text: str) -> None:
        """Every line of the job: the steps it reports (LAUNCH_STEP, the trainer's own)."""
        text = text.strip()
        if not text.startswith(("LAUNCH_STEP", "step ")):
            return
        seen = parse_step(text)
        if seen is not None:
            self.step(node, seen.step)
            return
        first = _FIRST_STEP.match(text)
        if first is not None:
            self.step(node, int(first["step"]))
            return
        progress = parse_progress(text)
        if progress is not None:
            self.step(node, progress.step)

    # ---- accounting ---------------------------------------------------------------------
    def to_json(self, end: float | None = None, *, incidents: list[dict[str, Any]] = (),
                hangs: list[dict[str, Any]] = (), checkpoint_blocking_s: float | None = None,
                steps_redone_at_start: int | None = None) -> dict[str, Any]:
        """The phases from the start to `end` (now), adding up to the wall time; goodput and
        the losses. `incidents`: summary.json's restarts[] (at_time_s from the job's start);
        `hangs`: its hangs (detected_at_s, idle_s); `steps_redone_at_start`: steps a resumed
        run recomputes (the trainer's count)."""
        end = self.clock() if end is None else end
        with self._lock:
            marks = list(self._marks)
            steps = sorted(self._steps, key=lambda s: s.at)
            nodes = {name: dict(parts) for name, parts in self._nodes.items()}
        spans: list[tuple[str, float, float]] = []
        for (name, begun), (_, until) in zip(marks, [*marks[1:], (LAST, end)]):
            spans.append((name, begun, max(begun, until)))
        phases: dict[str, float] = {}
        losses: list[dict[str, Any]] = []
        training = 0.0
        job_starts: list[float] = []
        first_step = last_step = None
        for name, begun, until in spans:
            if name != JOB:
                phases[name] = phases.get(name, 0.0) + (until - begun)
                continue
            job_starts.append(begun)
            inside = [s for s in steps if begun <= s.at <= until]
            if not inside:
                phases["job, no steps reported"] = \
                    phases.get("job, no steps reported", 0.0) + (until - begun)
                continue
            first, last = inside[0].at, inside[-1].at
            first_step = first if first_step is None else first_step
            last_step = last
            phases["to first step"] = phases.get("to first step", 0.0) + (first - begun)
            phases["training"] = phases.get("training", 0.0) + (last - first)
            phases["stop"] = phases.get("stop", 0.0) + (until - last)
            training += last - first
            losses += training_losses(inside, begun, first, last, incidents, hangs)
        if checkpoint_blocking_s and training > 0:
            losses.append({"kind": "checkpoint", "what": "checkpoint writes blocking training",
                           "s": checkpoint_blocking_s})
        if steps_redone_at_start and first_step is not None:
            pace = step_seconds(steps)
            if pace is not None:
                losses.append({"kind": "recomputed", "s": steps_redone_at_start * pace,
                               "what": f"{steps_redone_at_start} step(s) recomputed after "
                                       "the resume"})
        lost = min(training, sum(loss["s"] for loss in losses))
        wall = end - self.start
        kept = training - lost if first_step is not None else None
        outside = [{"kind": "phase", "what": name, "s": s} for name, s in phases.items()
                   if name != "training"]
        return {
            "clock": "monotonic, from the launch process's start to the run report's write",
            "wall_s": round(wall, 3),
            "phases": [{"name": name, "s": round(s, 3)} for name, s in phases.items()],
            "training_losses": [{**loss, "s": round(loss["s"], 3)} for loss in losses],
            "kept_steps_s": None if kept is None else round(kept, 3),
            "goodput": None if kept is None or wall <= 0 else round(kept / wall, 4),
            "largest_losses": [{**loss, "s": round(loss["s"], 3)} for loss in sorted(
                [*losses, *outside], key=lambda loss: -loss["s"])[:5] if loss["s"] > 0],
            "first_step_s": None if first_step is None else round(first_step - self.start, 3),
            "last_step_s": None if last_step is None else round(last_step - self.start, 3),
            "nodes": {name: {part: round(s, 3) for part, s in sorted(parts.items())}
                      for name, parts in sorted(nodes.items())},
        }


def handed_over(own: Timeline, inner: dict[str, Any], end: float | None = None
                ) -> dict[str, Any]:
    """A handed-over run's timeline as this process saw it (a Slurm job followed by `launch
    run`): this process's phases until the hand-over's end (`own`'s marks: start-up,
    hand-over, ...), then the wait for the run's controller and for its end to be seen here
    ("queue and follow": what this machine's wall time holds beyond the other parts), then
    the controller's own phases (`inner`, summary.json's timeline as the controller wrote it;
    its start-up and report named "controller start-up" and "controller report"), then what
    this process did once the run ended (`own`'s marks after FOLLOWING: the report written
    again from the amended summary, "report").
    Only durations cross between the machines: the controller's host has its own clock, so
    its moments (first step, each node's exit) are placed after this process's parts and the
    wait, whose end-of-run share (how long the controller's end took to be seen here: a poll
    of the run folder) is counted before them."""
    end = own.clock() if end is None else end
    with own._lock:
        marks = list(own._marks)
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    followed = False
    for (name, begun), (_, until) in zip(marks, [*marks[1:], ("", end)]):
        if name == FOLLOWING:
            followed = True   # the wait and the controller's part: the rest of the wall time
            continue
        (after if followed else before).append(
            {"name": name, "s": round(max(0.0, until - begun), 3)})
    wall = end - own.start
    ours = sum(p["s"] for p in [*before, *after])
    theirs = float(inner.get("wall_s") or 0.0)
    waited = max(0.0, wall - ours - theirs)
    offset = sum(p["s"] for p in before) + waited
    renamed = {"start-up": "controller start-up", "report": "controller report"}
    phases = [*before, {"name": "queue and follow", "s": round(waited, 3)},
              *({"name": renamed.get(p["name"], p["name"]), "s": p["s"]}
                for p in inner.get("phases") or []),
              *after]
    kept = inner.get("kept_steps_s")
    losses = list(inner.get("training_losses") or [])
    outside = [{"kind": "phase", "what": p["name"], "s": p["s"]} for p in phases
               if p["name"] != "training"]

    def moved(at: Any) -> Any:
        return None if at is None else round(at + offset, 3)

    moments = ("first_step_s", "exited_s")
    return {
        **inner,
        "clock": "this machine's monotonic clock, from the launch process's start to the run "
                 "report's write; the controller's parts are its own host's durations",
        "wall_s": round(wall, 3),
        "controller_wall_s": round(theirs, 3),
        # Where the controller's start is placed on this timeline: its moments (and the run
        # page's step times, progress.jsonl's `t`) count from there.
        "controller_at_s": round(offset, 3),
        "phases": phases,
        "goodput": None if kept is None or wall <= 0 else round(kept / wall, 4),
        "largest_losses": [loss for loss in sorted([*losses, *outside],
                                                   key=lambda loss: -loss["s"])[:5]
                           if loss["s"] > 0],
        "first_step_s": moved(inner.get("first_step_s")),
        "last_step_s": moved(inner.get("last_step_s")),
        "nodes": {name: {part: moved(s) if part in moments else s
                         for part, s in parts.items()}
                  for name, parts in (inner.get("nodes") or {}).items()},
    }


def step_seconds(steps: list[Seen]) -> float | None:
    """The median seconds per step between consecutive reports of a higher step (a report
    every N steps counts as N steps)."""
    gaps = []
    top: Seen | None = None
    for seen in steps:
        if top is not None and seen.step > top.step:
            gaps.append((seen.at - top.at) / (seen.step - top.step))
        if top is None or seen.step > top.step:
            top = seen
    return statistics.median(gaps) if gaps else None


def training_losses(steps: list[Seen], job_start: float, first: float, last: float,
                    incidents: list[dict[str, Any]], hangs: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """What training lost between its first and last step: each restart from its detection
    to the next step reported, the steps it recomputed (at the run's pace), each hang's wait
    before it was found. Clipped to [first, last]."""
    def clip(a: float, b: float) -> float:
        return max(0.0, min(b, last) - max(a, first))

    out: list[dict[str, Any]] = []
    pace = None
    for incident in incidents:
        if incident.get("at_time_s") is None:
            continue
        detected = job_start + incident["at_time_s"]
        if not first <= detected <= last:
            continue
        after = next((s.at for s in steps if s.at > detected), last)
        node = incident.get("node")
        why = incident.get("reason") or incident.get("kind") or "a failure"
        where = f"node {node} " if node and node != "all" else ""
        out.append({"kind": "restart", "node": node, "s": clip(detected, after),
                    "what": f"restart after {where}failed ({why})"})
        redone = incident.get("steps_lost")
        if redone is None and incident.get("reached_step") is not None and \
                incident.get("next_step") is not None:
            redone = max(0, incident["reached_step"] - incident["next_step"] + 1)
        if redone:
            pace = pace if pace is not None else step_seconds(steps)
            if pace is not None:
                out.append({"kind": "recomputed", "node": node, "s": redone * pace,
                            "what": f"{redone} step(s) recomputed after the restart"})
    for hang in hangs:
        if hang.get("detected_at_s") is None or hang.get("idle_s") is None:
            continue
        detected = job_start + hang["detected_at_s"]
        out.append({"kind": "hang", "s": clip(detected - hang["idle_s"], detected),
                    "what": f"hang wait ({hang['idle_s']:.1f} s without progress)"})
    return out


def before_first_step(timeline: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    """The phases before the job's first step, each (name, from_s, to_s) since the run
    started: the phases are in their order, and "to first step" ends at the first step; none
    when no step was reported."""
    out: list[tuple[str, float, float]] = []
    at = 0.0
    for phase in (timeline or {}).get("phases") or []:
        out.append((phase["name"], at, at + phase["s"]))
        at += phase["s"]
        if phase["name"] == "to first step":
            first = timeline.get("first_step_s")
            if first is not None and abs(at - first) > 0.01 * len(out):
                # A phase repeated before the first step (a machine lost before it) is summed
                # under its first name: the order no longer places it. One band, then.
                return [("before the first step", 0.0, first)]
            return out
    return []


def describe(timeline: dict[str, Any] | None, count: int = 3) -> str:
    """One line: goodput and the largest losses ("goodput 62% of 33.7 s; largest losses:
    restart after node host1 failed (...): 14.2 s, ...")."""
    if not timeline:
        return ""
    goodput = timeline.get("goodput")
    head = (f"goodput {goodput:.0%} of {timeline['wall_s']:.1f} s" if goodput is not None
            else f"wall {timeline['wall_s']:.1f} s (no steps reported: no goodput)")
    largest = [f"{loss['what']}: {loss['s']:.1f} s"
               for loss in (timeline.get("largest_losses") or [])[:count]]
    return head + (f"; largest losses: {', '.join(largest)}" if largest else "")
