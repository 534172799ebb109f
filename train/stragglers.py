"""Stragglers: ranks whose own work holds every step back.

DDP hides them: the all-reduce makes every rank's step time equal, the fast ranks simply wait.
What differs is how each rank's step splits: a slow rank computes (or waits for data) longer
and waits on communication less. Every rank splits its own steps (train/commtime.py: compute,
data wait, communication wait); its busy time is compute plus data wait. At each log interval
rank 0 gathers every rank's interval means with one small all_gather. A rank whose busy time
is above THRESHOLD x the median rank's for INTERVALS intervals in a row is a straggler: rank 0
prints a line saying so (the live display shows it), and result.json gets the stragglers and
every rank's split (rank_times: means over its steps after warm-up, which add up to its mean
step, the same definition as the run's step_split). Each interval's rows also go into rank 0's
metrics.jsonl record (`ranks`: the report page draws every rank's split over the run), and on a
run of several nodes rank 0 prints one `per node at step N:` line per interval: each node's step
time, communication share, loss and straggler flag, which launch's terminal view keeps in place
(launcher/report/live.py reads it). Imports nothing from launcher/.
"""

from __future__ import annotations

import os
import socket
import statistics
from typing import Any

import torch
import torch.distributed as dist

from train.options import STRAGGLER_INTERVALS as INTERVALS  # the rule launch uses too
from train.options import STRAGGLER_THRESHOLD as THRESHOLD
from train.stepsplit import StepTimes, split_of_totals

SKIP_STEPS = 3         # first steps pay for allocation and bucket rebuilds (main.py's warm-up)
REPEAT_EVERY = 10      # a straggler that goes on is said again every this many intervals


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


class StragglerJudge:
    """Rank 0's side, pure: each interval's per-rank means in, straggler lines and the summary
    out."""

    def __init__(self, where: list[tuple[str, int]]):
        self.where = where                      # rank -> (node, local rank)
        world = len(where)
        # Per rank: steps, then total compute, data wait and communication wait.
        self.totals = [[0, 0.0, 0.0, 0.0] for _ in range(world)]
        self.streak = [0] * world
        self.slow_ratios: list[list[float]] = [[] for _ in range(world)]
        self._recent: list[list[float]] = [[] for _ in range(world)]
        # The latest interval: its step and every rank's (compute, data wait, comm wait).
        self.last: tuple[int, list[tuple[float, float, float]]] | None = None

    def observe(self, step: int, rows: list[tuple[float, float, float, int]]) -> list[str]:
        """rows: per rank (compute, data wait, communication wait) means of one interval and
        the number of steps they are means of. Returns the lines to print."""
        busy = [row[0] + row[1] for row in rows]
        self.last = (step, [tuple(row[:3]) for row in rows])
        for rank, (compute, data, comm, n) in enumerate(rows):
            total = self.totals[rank]
            total[0] += n
            total[1] += compute * n
            total[2] += data * n
            total[3] += comm * n
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
        """Stragglers and every rank's split (means over its steps) for result.json."""
        stragglers = []
        for rank, ratios in enumerate(self.slow_ratios):
            if ratios:
                node, local = self.where[rank]
                stragglers.append({"node": node, "rank": rank, "local_rank": local,
                                   "ratio": round(statistics.median(ratios), 3),
                                   "intervals": len(ratios)})
        rank_times = []
        for rank, (n, compute, data, comm) in enumerate(self.totals):
            if not n:
                continue
            node, local = self.where[rank]
            rank_times.append({"rank": rank, "node": node, "local_rank": local,
                               **split_of_totals(int(n), compute + data + comm, data, comm)})
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
        self._steps: list[StepTimes] = []     # this interval's, after warm-up
        self._losses: list[float] = []        # this interval's step losses

    def step_done(self, step: int, times: StepTimes, loss: float = float("nan")) -> None:
        self._losses.append(loss)
        if step > SKIP_STEPS:
            self._steps.append(times)

    def end_interval(self, step: int) -> None:
        """Every rank: gather the interval's means; rank 0 judges and prints."""
        n = len(self._steps)
        means = [sum(part(s) for s in self._steps) / n if n else 0.0
                 for part in (lambda s: s.compute_s, lambda s: s.data_wait_s,
                              lambda s: s.comm_wait_s)]
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
        for line in self.judge.observe(step, [(*row[:3], int(row[3])) for row in rows]):
            print(line, flush=True)
        line = self.judge.node_line(step, [row[4] for row in rows])
        if line:
            print(line, flush=True)

    def interval_record(self, step: int) -> dict[str, Any]:
        return self.judge.interval_record(step) if self.judge else {}

    def result(self) -> dict[str, Any]:
        return self.judge.result() if self.judge else {}
