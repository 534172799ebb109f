"""Stragglers: ranks whose own work holds every step back.

DDP hides them: the all-reduce makes every rank's step time equal, the fast ranks simply wait.
What differs is how each rank's step splits: a slow rank computes (or waits for data) longer
and waits on communication less. So every rank measures its own busy time per step, the step
minus the exposed communication wait that train/commtime.py measures (forward, backward,
optimizer and the data wait), and the data wait alone (time spent in the loader's next()).
At each log interval rank 0 gathers every rank's interval means with one small all_gather.
A rank whose busy time is above THRESHOLD x the median rank's for INTERVALS intervals in a row
is a straggler: rank 0 prints a line saying so (the live display shows it), and result.json
gets the stragglers and every rank's medians. Each interval's rows also go into rank 0's
metrics.jsonl record (`ranks`: the report page draws every rank's split over the run), and on
a run of several nodes rank 0 prints one `per node at step N:` line per interval: each node's
step time, communication share, loss and straggler flag, which launch's terminal view keeps
in place (launcher/live.py reads it). Imports nothing from launcher/.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from train.options import STRAGGLER_INTERVALS as INTERVALS  # the rule launch uses too
from train.options import STRAGGLER_THRESHOLD as THRESHOLD

SKIP_STEPS = 3         # first steps pay for allocation and bucket rebuilds (main.py's warm-up)
REPEAT_EVERY = 10      # a straggler that goes on is said again every this many intervals


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


class _TimedIterator:
    def __init__(self, inner: Iterator, watch: StragglerWatch):
        self.inner, self.watch = inner, watch

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.watch.data_s += time.perf_counter() - started


class StragglerJudge:
    """Rank 0's side, pure: each interval's per-rank means in, straggler lines and the summary
    out."""

    def __init__(self, where: list[tuple[str, int]]):
        self.where = where                      # rank -> (node, local rank)
        world = len(where)
        self.intervals: list[list[tuple[float, float, float]]] = [[] for _ in range(world)]
        self.streak = [0] * world
        self.slow_ratios: list[list[float]] = [[] for _ in range(world)]
        self._recent: list[list[float]] = [[] for _ in range(world)]
        self.last: tuple[int, list[tuple[float, float, float]]] | None = None

    def observe(self, step: int, rows: list[tuple[float, float, float]]) -> list[str]:
        """rows: per rank (compute, data wait, communication wait) means of one interval.
        Returns the lines to print."""
        busy = [row[0] + row[1] for row in rows]
        for rank, row in enumerate(rows):
            self.intervals[rank].append(tuple(row))
        self.last = (step, [tuple(row) for row in rows])
        median = statistics.median(busy)
        if median <= 0:
            return []
        lines = []
        for rank, value in enumerate(busy):
            ratio = value / median
            if ratio <= THRESHOLD:
                self.streak[rank] = 0
                self._recent[rank] = []
                continue
            self.streak[rank] += 1
            self._recent[rank].append(ratio)
            if self.streak[rank] == INTERVALS:
                self.slow_ratios[rank] += self._recent[rank]
            elif self.streak[rank] > INTERVALS:
                self.slow_ratios[rank].append(ratio)
            if self.streak[rank] >= INTERVALS and \
                    (self.streak[rank] - INTERVALS) % REPEAT_EVERY == 0:
                node, local = self.where[rank]
                data = rows[rank][1]
                line = (f"straggler: node {node} rank {rank} (local {local}): compute "
                        f"{_seconds(value)} vs median {_seconds(median)} ({ratio:.1f}x) for "
                        f"{self.streak[rank]} intervals in a row, up to step {step}: it holds "
                        "every step back")
                if data > 0.1 * value:
                    line += f" ({_seconds(data)} of it waiting for data)"
                lines.append(line)
        return lines

    def interval_record(self, step: int) -> dict[str, Any]:
        """For the metrics.jsonl record of `step`: every rank's (compute, data wait,
        communication wait) means of the interval that ended there."""
        if self.last is None or self.last[0] != step:
            return {}
        return {"ranks": [[round(v, 6) for v in row] for row in self.last[1]]}

    def node_line(self, step: int, losses: list[float]) -> str | None:
        """`per node at step 20: h0 21.9 ms/step, comm 29%, loss 2.0944; h1 ..., straggler`:
        per node the mean over its ranks of the interval's step time and loss, the share of
        it spent waiting on communication, and whether one of its ranks is a straggler now.
        None on one node (the progress line already says it all)."""
        if self.last is None or self.last[0] != step:
            return None
        nodes: dict[str, list[int]] = {}
        for rank, (node, _) in enumerate(self.where):
            nodes.setdefault(node, []).append(rank)
        if len(nodes) < 2:
            return None
        rows = self.last[1]
        parts = []
        for node, ranks in nodes.items():
            step_s = sum(sum(rows[r]) for r in ranks) / len(ranks)
            comm = sum(rows[r][2] for r in ranks) / len(ranks)
            loss = sum(losses[r] for r in ranks) / len(ranks)
            part = (f"{node} {step_s * 1e3:.1f} ms/step, comm {comm / step_s if step_s else 0:.0%}"
                    f", loss {loss:.4f}")
            if any(self.streak[r] >= INTERVALS for r in ranks):
                part += ", straggler"
            parts.append(part)
        return f"per node at step {step}: " + "; ".join(parts)

    def result(self) -> dict[str, Any]:
        """Stragglers and per-rank medians (of the interval means) for result.json."""
        stragglers = []
        for rank, ratios in enumerate(self.slow_ratios):
            if ratios:
                node, local = self.where[rank]
                stragglers.append({"node": node, "rank": rank, "local_rank": local,
                                   "ratio": round(statistics.median(ratios), 3),
                                   "intervals": len(ratios)})
        rank_times = []
        for rank, rows in enumerate(self.intervals):
            if not rows:
                continue
            node, local = self.where[rank]
            rank_times.append({
                "rank": rank, "node": node, "local_rank": local,
                "compute_s": round(statistics.median(r[0] for r in rows), 6),
                "data_s": round(statistics.median(r[1] for r in rows), 6),
                "comm_s": round(statistics.median(r[2] for r in rows), 6)})
        return {"stragglers": stragglers, "rank_times": rank_times}


class StragglerWatch:
    """One per rank; every rank calls step_done() after each step and end_interval() at each
    log interval (a collective)."""

    def __init__(self, rank: int, world: int, device: torch.device, local_rank: int):
        self.rank, self.world, self.device = rank, world, device
        node = os.environ.get("LAUNCH_NODE") or socket.gethostname()
        where: list = [None] * world
        dist.all_gather_object(where, (node, local_rank))
        self.judge = StragglerJudge([tuple(w) for w in where]) if rank == 0 else None
        self.data_s = 0.0                       # data wait since the last step_done
        self._steps: list[tuple[float, float, float]] = []   # (compute, data, comm) this interval
        self._losses: list[float] = []          # this interval's step losses

    def timed(self, iterator: Iterator) -> Iterator:
        """The data loader's iterator, with the time spent waiting for batches counted."""
        return _TimedIterator(iterator, self)

    def step_done(self, step: int, step_time_s: float, comm_wait_s: float,
                  loss: float = float("nan")) -> None:
        data, self.data_s = self.data_s, 0.0
        self._losses.append(loss)
        if step <= SKIP_STEPS:
            return
        comm = min(comm_wait_s, step_time_s)
        data = min(data, step_time_s - comm)
        self._steps.append((max(0.0, step_time_s - comm - data), data, comm))

    def end_interval(self, step: int) -> None:
        """Every rank: gather the interval's means; rank 0 judges and prints."""
        n = len(self._steps)
        means = [sum(s[i] for s in self._steps) / n if n else 0.0 for i in range(3)]
        loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        self._steps, self._losses = [], []
        mine = torch.tensor([*means, float(n), loss], dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        if self.judge is None:
            return
        rows = [t.tolist() for t in gathered]
        if any(row[3] == 0 for row in rows):
            return                      # warm-up steps only: nothing to compare yet
        for line in self.judge.observe(step, [tuple(row[:3]) for row in rows]):
            print(line, flush=True)
        line = self.judge.node_line(step, [row[4] for row in rows])
        if line:
            print(line, flush=True)

    def interval_record(self, step: int) -> dict[str, Any]:
        return self.judge.interval_record(step) if self.judge else {}

    def result(self) -> dict[str, Any]:
        return self.judge.result() if self.judge else {}
