"""What launch knows of a user's job's progress: its output, and the optional step lines.

A job of the user's own reports nothing to launch by default: launch sees its output and its
processes (CPU time, the hang watch). A script may opt in with one line per step, printed by
any rank, which costs nothing without launch and needs no import (docs/jobs.md):

    print(f"LAUNCH_STEP step={step} loss={loss:.4f} busy_s={busy:.4f}", flush=True)

`step` is required; `loss`, `busy_s` (the part of the step the rank spent on its own work,
e.g. loading data and the forward pass: what a slow rank takes longer at; DDP makes every
rank's whole step equally long) and `samples` (per step, for throughput) are optional. From
them launch keeps the step reached and the last loss, counts a step as progress for the hang
watch, and names a straggler with the trainer's rule (train/options.py STRAGGLER_*): a rank
whose busy time is above THRESHOLD x the median rank's for INTERVALS blocks of BLOCK steps
in a row. Rank 0's lines (the head node's local rank 0) go to `<run>/progress.jsonl`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from launcher.core.safefile import open_append
from train.options import STRAGGLER_INTERVALS, STRAGGLER_THRESHOLD

STEP_LINE = re.compile(r"^LAUNCH_STEP\s+(?P<fields>.*)$")
_FIELD = re.compile(r"(?P<key>[a-z_]+)=(?P<value>\S+)")
BLOCK = 10          # steps per straggler interval
PROGRESS_FILE = "progress.jsonl"


@dataclass
class Step:
    step: int
    loss: float | None = None
    busy_s: float | None = None
    samples: int | None = None


# Bounds on a step line, so that reading one costs time linear in its length and nothing
# after it can overflow: a longer line, a step or sample count past MAX_COUNT, a busy time past
# MAX_BUSY_S is not a step line (it stays the job's output, as any other line).
MAX_LINE = 4096
MAX_COUNT = 10**12
MAX_BUSY_S = 10**6


def _count(text: str) -> int:
    if len(text) > len(str(MAX_COUNT)) or not text.isascii() or not text.isdigit():
        raise ValueError(text)
    value = int(text)
    if value > MAX_COUNT:
        raise ValueError(text)
    return value


def parse_step(text: str) -> Step | None:
    """A LAUNCH_STEP line's fields; None for any other line or a malformed one."""
    if len(text) > MAX_LINE:
        return None
    m = STEP_LINE.match(text.strip())
    if not m:
        return None
    values = {f["key"]: f["value"] for f in _FIELD.finditer(m["fields"])}
    try:
        step = _count(values["step"])
        loss = float(values["loss"]) if "loss" in values else None
        busy = float(values["busy_s"]) if "busy_s" in values else None
        samples = _count(values["samples"]) if "samples" in values else None
    except (KeyError, ValueError):
        return None
    if busy is not None and not (math.isfinite(busy) and 0 <= busy <= MAX_BUSY_S):
        return None
    return Step(step, loss if loss is None or math.isfinite(loss) else None, busy, samples)


@dataclass
class _Rank:
    step: int = -1
    loss: float | None = None
    blocks: dict[int, list[float]] = field(default_factory=dict)   # block -> busy values
    busy: list[float] = field(default_factory=list)                # recent, for the summary


class StepLines:
    """Fed every worker line (thread-safe); asked by the hang watch and the summary."""

    def __init__(self, clock=time.monotonic, origin: float | None = None):
        """`origin`: the run's start on `clock` (its timeline's: launcher/runs/timeline.py),
        from which progress.jsonl's `t` counts, so the run page's time axis starts with the
        run and shows what came before the first step; else now."""
        self.clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, str], _Rank] = {}
        # How many ranks are at each step: the slowest rank's step is the least key, found
        # without walking every rank at every line (8,192 ranks made that O(ranks^2) per step:
        # minutes of CPU under the lock every reader takes, issue 37).
        self._at_step: dict[int, int] = {}
        self._judged = -1
        self._streak: dict[tuple[str, str], int] = {}
        self._ratios: dict[tuple[str, str], list[float]] = {}
        self.stragglers: dict[tuple[str, str], dict[str, Any]] = {}
        self.last_output: float | None = None     # any worker line: the job is alive
        self.last_step_at: float | None = None
        self._max_step = -1
        self._step_gaps: list[float] = []             # seconds per step, recent
        self.lines = 0
        self._record: TextIO | None = None
        self._record_key: tuple[str, str] | None = None
        self._origin = clock() if origin is None else origin

    def record_to(self, run_dir: Path, head: str) -> None:
        """Keep the head node's local rank 0's steps in progress.jsonl (the run page plots
        them)."""
        # No link in the run folder is followed (launcher/core/safefile.py).
        self._record = open_append(run_dir / PROGRESS_FILE, within=run_dir.parent)
        self._record_key = (head, "0")

    def line(self, node: str, rank: str, text: str) -> None:
        now = self.clock()
        step = parse_step(text)
        with self._lock:
            self.last_output = now
            if step is None:
                return
            self.lines += 1
            if step.step > self._max_step:
                if self._max_step >= 0 and self.last_step_at is not None:
                    gap = (now - self.last_step_at) / (step.step - self._max_step)
                    self._step_gaps = [*self._step_gaps[-49:], gap]
                self._max_step = step.step
                self.last_step_at = now
            key = (node, rank)
            state = self._ranks.setdefault(key, _Rank())
            if step.step > state.step:
                self._moved(state.step, step.step)
                state.step = step.step
            if step.loss is not None:
                state.loss = step.loss
            if step.busy_s is not None:
                state.blocks.setdefault(step.step // BLOCK, []).append(step.busy_s)
                state.busy = [*state.busy[-99:], step.busy_s]
                self._judge()
            if self._record is not None and key == self._record_key:
                self._record.write(json.dumps({
                    "step": step.step, "loss": step.loss, "busy_s": step.busy_s,
                    "samples": step.samples, "t": round(now - self._origin, 3)}) + "\n")

    def _moved(self, before: int, now: int) -> None:
        """A rank went from step `before` (-1: its first LAUNCH_STEP line) to `now`."""
        if before >= 0:
            left = self._at_step[before] - 1
            if left:
                self._at_step[before] = left
            else:
                del self._at_step[before]
        self._at_step[now] = self._at_step.get(now, 0) + 1

    def _judge(self) -> None:
        """Every block that all ranks have left behind, once, in order."""
        if len(self._ranks) < 2:
            return
        # The steps ranks are at are few (the ranks move together): not a walk of every rank.
        done = min(self._at_step) // BLOCK - 1
        if done <= self._judged:
            return      # no block newly left behind by every rank
        # The blocks that hold busy times, not every number up to `done`: a job that jumps
        # to step 10^12 costs one pass, not 10^11 (this runs under the lock every line takes).
        held = sorted({b for r in self._ranks.values() for b in r.blocks
                       if self._judged < b <= done})
        self._judged = max(self._judged, done)
        for block in held:
            means = {k: statistics.fmean(r.blocks.pop(block))
                     for k, r in self._ranks.items() if r.blocks.get(block)}
            if len(means) < 2:
                continue
            median = statistics.median(means.values())
            for key, mean in means.items():
                ratio = mean / median if median > 0 else 1.0
                if ratio > STRAGGLER_THRESHOLD:
                    self._streak[key] = self._streak.get(key, 0) + 1
                    self._ratios.setdefault(key, []).append(ratio)
                else:
                    self._streak[key] = 0
                    self._ratios[key] = []
                if self._streak.get(key, 0) >= STRAGGLER_INTERVALS:
                    self.stragglers[key] = {
                        "node": key[0], "local_rank": key[1],
                        "ratio": round(statistics.median(self._ratios[key]), 3),
                        "intervals": self._streak[key], "block_steps": BLOCK}

    def median_step_s(self) -> float | None:
        """The median time per step, once a few steps were reported (the hang watch's default
        timeout is 20x it)."""
        with self._lock:
            return statistics.median(self._step_gaps) if len(self._step_gaps) >= 3 else None

    def summary(self) -> dict[str, Any] | None:
        """The steps the job reported, or None when it printed no LAUNCH_STEP line."""
        with self._lock:
            if self._record is not None:
                self._record.close()
                self._record = None
            if not self._ranks:
                return None
            head = self._ranks.get(self._record_key) if self._record_key else None
            reached = max(r.step for r in self._ranks.values())
            loss = head.loss if head is not None and head.loss is not None else next(
                (r.loss for r in self._ranks.values() if r.loss is not None), None)
            return {
                "source": "LAUNCH_STEP lines",
                "step": reached, "loss": loss, "lines": self.lines,
                "ranks": {f"{n}/{r}": {"step": s.step, "busy_s_median":
                                       round(statistics.median(s.busy), 6) if s.busy else None}
                          for (n, r), s in sorted(self._ranks.items())},
                "stragglers": sorted(self.stragglers.values(),
                                     key=lambda s: (s["node"], s["local_rank"])),
            }
