"""The split of a training step, one definition for the progress log, metrics.jsonl,
result.json, summary.json, the stragglers' rank_times, comm_hook auto and the run report:

    step = compute + data wait + communication wait

Data wait is the time the data loader's next() takes, communication wait the exposed wait on
gradient communication (train/commtime.py), compute the rest (forward, backward compute,
optimizer). Over many steps each part is a MEAN: means add up, so the parts of the mean step
add up to it; medians do not (a report once printed a median step of 0.1645 s beside means of
0.0366 s and 0.1638 s). Throughput (images/s) is the separate, median-based figure.

Standard library only: launch's report reads it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass

STATISTIC = "mean"


@dataclass(frozen=True)
class StepTimes:
    """One step's time and its parts (the parts never exceed the step)."""

    step_time_s: float
    comm_wait_s: float
    data_wait_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_time_s - self.comm_wait_s - self.data_wait_s)

    @property
    def comm_share(self) -> float:
        return self.comm_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0


def split_of_totals(steps: int, step_s: float, data_wait_s: float,
                    comm_wait_s: float) -> dict[str, float | int | str]:
    """The mean step and its mean parts from totals over `steps` steps. Compute is what is
    left, so the parts add up to the step (to rounding); the share is total wait over total
    time, so long steps weigh more."""
    n = max(1, steps)
    compute = max(0.0, step_s - data_wait_s - comm_wait_s)
    return {"statistic": STATISTIC, "steps": steps,
            "step_s": round(step_s / n, 6), "compute_s": round(compute / n, 6),
            "data_wait_s": round(data_wait_s / n, 6), "comm_wait_s": round(comm_wait_s / n, 6),
            "comm_share": round(comm_wait_s / step_s, 4) if step_s > 0 else 0.0}


def split(steps: list[StepTimes]) -> dict[str, float | int | str]:
    """The mean step of `steps` and its mean parts: step = compute + data wait + comm wait."""
    return split_of_totals(len(steps), sum(s.step_time_s for s in steps),
                           sum(s.data_wait_s for s in steps),
                           sum(s.comm_wait_s for s in steps))
