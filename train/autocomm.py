"""The measured choices behind `bucket_cap_mb: auto` and `comm_hook: auto`.

Both decide on a measurement repeated until it is clear, and "undecided" is an answer: a
shared 2-core machine made single timings swing 3x within one run, and a choice taken on a few
noisy steps once switched PowerSGD on (and accuracy down) on loopback, where nothing was to be
gained.

bucket_cap_mb: auto times all-reduces of two sizes in rounds (every rank takes part; the
slowest rank's times count) and sizes the buckets from each round's fit; it takes the median
once the last MIN_ROUNDS rounds agree within BUCKET_MARGIN, else keeps DDP's default.

comm_hook: auto, on the same rule with the same numbers on every rank (all-reduced first; the
constants are train/options.py's):
1. Measure plain all-reduce after the first AUTO_SKIP_STEPS steps: each step's share of time
   spent waiting on communication. A one-sided sign test at AUTO_ALPHA says whether the share
   is above AUTO_MIN_COMM_SHARE (go on to 2) or below it ("none: nothing to gain") once
   AUTO_MIN_SAMPLES steps are in; AUTO_MAX_SAMPLES steps without a clear answer end
   "undecided", plain all-reduce kept.
2. The trial, not before PowerSGD's warm-up is over: the larger of `ddp.powersgd.start_iter`
   and the learning-rate warm-up (the PowerSGD hook's documentation: compressing before the
   warm-up ends can set training on a trajectory it does not recover from; the paper trains
   with a learning-rate warm-up, warm start and error feedback, which auto keeps on). A round
   forks the run (train/trial.py): AUTO_ROUND_STEPS steps with plain all-reduce, then the same
   steps again from the same state on the same batches with PowerSGD. Step i of one branch and
   step i of the other did the same work, so their times pair up (the first pair, which
   allocates PowerSGD's matrices, is left out) and their losses differ only by what compression
   did to the trajectory. Each pair's gain is 1 - t_powersgd / t_plain; the sign test against
   AUTO_MIN_GAIN decides "powersgd" (the run goes on from the PowerSGD branch) or "none" (from
   the plain one) once AUTO_MIN_PAIRS pairs are in; AUTO_MAX_ROUNDS rounds without a clear
   answer end "undecided", plain all-reduce kept.
3. The guard, in every round: when the PowerSGD branch's loss over the round's second half lies
   more than AUTO_GUARD_EXCESS above the plain branch's on the same batches, compression is
   steering training off the plain trajectory; auto falls back to plain all-reduce, whatever
   the speed, and says so in the log, result.json and the report.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from train.ddp import NEVER
from train.options import (AUTO_ALPHA, AUTO_CHECK_EVERY, AUTO_GUARD_EXCESS, AUTO_MAX_ROUNDS,
                           AUTO_MAX_SAMPLES, AUTO_MIN_COMM_SHARE, AUTO_MIN_GAIN,
                           AUTO_MIN_PAIRS, AUTO_MIN_SAMPLES, AUTO_ROUND_STEPS,
                           AUTO_SKIP_STEPS, auto_trial_from)
from train.stepsplit import StepTimes

BUCKET_MARGIN = 0.25
MIN_ROUNDS = 3
MAX_ROUNDS = 8
DDP_DEFAULT_BUCKET_MB = 25.0


# ---- the sign test -------------------------------------------------------------------------


def binomial_tail(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2**n


def sign_test(values: list[float], bound: float, alpha: float = AUTO_ALPHA) -> str | None:
    """"above" when significantly more values lie above `bound` than below (one-sided sign
    test at `alpha`, ties counting for neither), "below" for the mirror case, None when the
    values do not say yet. Distribution-free: a few steps slowed by another process weigh as
    much as any other step, not as much as their seconds."""
    n = len(values)
    if n == 0:
        return None
    if binomial_tail(n, sum(v > bound for v in values)) <= alpha:
        return "above"
    if binomial_tail(n, sum(v < bound for v in values)) <= alpha:
        return "below"
    return None


# ---- bucket_cap_mb: auto ---------------------------------------------------------------


@dataclass(frozen=True)
class LinkProbe:
    """All-reduce cost model t(S) = latency + S / bandwidth, fitted on this process group."""

    latency_s: float
    bandwidth_bytes_per_s: float
    small_bytes: int
    large_bytes: int
    small_s: float
    large_s: float


def probe_link(device: torch.device, small: int = 1 << 14, large: int = 1 << 22,
               iters: int = 3, warmup: int = 2) -> LinkProbe:
    """Times all-reduces of two sizes on the real process group (every rank takes part).
    Medians, reduced with MAX across ranks, so every rank fits the same numbers."""
    times = []
    for size in (small, large):
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        samples = []
        for i in range(iters + warmup):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup:  # the first calls set up connections
                samples.append(time.perf_counter() - t0)
        times.append(statistics.median(samples))
    agreed = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    t_small, t_large = agreed.tolist()
    per_byte = max((t_large - t_small) / (large - small), 1e-12)
    latency = max(t_small - small * per_byte, 0.0)
    return LinkProbe(latency, 1.0 / per_byte, small, large, t_small, t_large)


def choose_bucket_cap_mb(probe: LinkProbe, gradient_bytes: int,
                         compressing: bool = False) -> float:
    """A quarter of the gradients: four buckets, so the first all-reduce starts early in the
    backward pass, and few calls, which matters once compression makes each call small (with
    1 MiB buckets PowerSGD's three chained calls per bucket made auto 35% slower than
    PowerSGD with 5 MiB buckets on a capped link). Raised where the link's fixed per-call
    cost would exceed 5% of a bucket's transfer time. Between 1 and 256 MiB.

    `compressing` (comm_hook powersgd, or auto, which may choose it): at least DDP's default
    25 MiB. PowerSGD's cost per bucket is fixed work (its matrices, an orthogonalisation, two
    chained calls) whatever the bucket holds, and what it sends is small, so fewer buckets win:
    on the capped link launch's hook with 25 MiB buckets ran 601 img/s against 516 with 5 MiB
    (benchmarks/README.md, PowerSGD on the capped link), while plain all-reduce was the same
    with either size (33.7 and 32.9 img/s capped, 526 free)."""
    latency_floor = 20.0 * probe.latency_s * probe.bandwidth_bytes_per_s
    chosen = max(gradient_bytes / 4, latency_floor, 1 << 20)
    if compressing:
        chosen = max(chosen, DDP_DEFAULT_BUCKET_MB * (1 << 20))
    return round(min(chosen, 256 << 20) / (1 << 20), 2)


@dataclass
class BucketChoice:
    choice: str                     # "decided" or "undecided" (DDP's default kept)
    bucket_cap_mb: float
    rounds: list[float]             # the size each probe round gave
    probe: LinkProbe                # the last round's fit

    def to_json(self) -> dict:
        return {"choice": self.choice, "bucket_cap_mb": self.bucket_cap_mb,
                "rounds": self.rounds, "link_probe": asdict(self.probe)}


def decide_bucket_cap_mb(device: torch.device, gradient_bytes: int,
                         probe=probe_link, compressing: bool = False) -> BucketChoice:
    """Probe rounds until the last MIN_ROUNDS sizes agree within BUCKET_MARGIN of their
    median (that median is the choice), at most MAX_ROUNDS (then DDP's default stays).
    `compressing`: choose_bucket_cap_mb's."""
    rounds: list[float] = []
    for _ in range(MAX_ROUNDS):
        link = probe(device)
        rounds.append(choose_bucket_cap_mb(link, gradient_bytes, compressing))
        last = rounds[-MIN_ROUNDS:]
        middle = statistics.median(last)
        if len(last) == MIN_ROUNDS and all(abs(s - middle) <= BUCKET_MARGIN * middle
                                           for s in last):
            return BucketChoice("decided", middle, rounds, link)
    return BucketChoice("undecided", DDP_DEFAULT_BUCKET_MB, rounds, link)


# ---- comm_hook: auto ----------------------------------------------------------------------


@dataclass
class AutoDecision:
    choice: str                   # "powersgd", "none" or "undecided" (plain all-reduce kept)
    reason: str
    decided_at_step: int | None
    comm_share: float | None      # mean share of the measured plain steps (stepsplit's)
    share_steps: int = 0          # steps measured...
    share_above: int = 0          # ...and how many of them were above AUTO_MIN_COMM_SHARE
    allreduce_step_s: float | None = None   # median plain step of the trial's pairs
    powersgd_step_s: float | None = None    # median PowerSGD step of the trial's pairs
    trial_pairs: int = 0
    trial_faster: int = 0         # pairs whose PowerSGD step was >= AUTO_MIN_GAIN faster
    loss_excess: float | None = None  # the guard's measure in the last round (see loss_excess)

    def to_json(self) -> dict:
        return asdict(self)


def loss_excess(plain: list[float], powersgd: list[float]) -> float:
    """How far the PowerSGD branch's loss lies above the plain branch's over the second half
    of a round (same start, same batches), relative to the plain branch's."""
    half = len(plain) // 2
    reference = statistics.fmean(plain[half:])
    return (statistics.fmean(powersgd[half:]) - reference) / reference if reference > 0 else 0.0


class AutoCompression:
    """`comm_hook: auto` (the module docstring says how), on every rank: `after_step` after
    every step while plain all-reduce is measured, `trial_due` before each step, and a round's
    numbers to `take_round` (train/trial.py runs the round)."""

    def __init__(self, state, *, total_steps: int, lr_warmup_steps: int,
                 start_iter: int, min_share: float = AUTO_MIN_COMM_SHARE,
                 min_gain: float = AUTO_MIN_GAIN, skip: int = AUTO_SKIP_STEPS,
                 min_samples: int = AUTO_MIN_SAMPLES, max_samples: int = AUTO_MAX_SAMPLES,
                 min_pairs: int = AUTO_MIN_PAIRS, round_steps: int = AUTO_ROUND_STEPS,
                 max_rounds: int = AUTO_MAX_ROUNDS, check_every: int = AUTO_CHECK_EVERY):
        self.state = state
        self.total_steps = total_steps
        self.trial_from = auto_trial_from(start_iter, lr_warmup_steps)
        self.min_share, self.min_gain, self.skip = min_share, min_gain, skip
        self.min_samples, self.max_samples = min_samples, max_samples
        self.min_pairs, self.round_steps, self.max_rounds = min_pairs, round_steps, max_rounds
        self.check_every = check_every
        self.decision: AutoDecision | None = None
        self.phase = "measure"        # measure | trial | done
        self.step_offset = 0          # steps before this process started (a resume)
        self._pending: list[tuple[int, float, float]] = []   # (run step, t, comm), unagreed
        self._shares: list[float] = []
        self._share_totals = [0.0, 0.0]
        self._pairs: list[tuple[float, float]] = []  # (plain step s, PowerSGD step s)
        self._rounds = 0
        self._excess: float | None = None

    def use(self, powersgd: bool) -> None:
        """PowerSGD on or off from the next step. Off, its error-feedback residual goes into
        the next plain all-reduce (train/ddp.py): no gradient is dropped."""
        self.state.flush_residual = not powersgd
        self.state.start_powerSGD_iter = 0 if powersgd else NEVER

    def uses_powersgd(self) -> bool:
        """Whether the steps now run PowerSGD."""
        return self.state.start_powerSGD_iter != NEVER

    # -- 1: plain all-reduce's share --
    def after_step(self, run_step: int, times: StepTimes, device) -> AutoDecision | None:
        """Every rank, after every step (`run_step` steps done). Returns the decision the step
        it is made (the caller logs it), else None."""
        if self.phase != "measure":
            return None
        if run_step > self.skip + self.step_offset:
            self._pending.append((run_step, times.step_time_s, times.comm_wait_s))
        if not self._pending or (len(self._pending) < self.check_every
                                 and run_step < self.total_steps):
            return None
        flat = [x for _, t, comm in self._pending for x in (t, comm)]
        agreed = _mean_over_ranks(flat, device)
        said = None
        for i, (done, _, _) in enumerate(self._pending):
            t, comm = agreed[2 * i], agreed[2 * i + 1]
            self._shares.append(comm / t if t > 0 else 0.0)
            self._share_totals[0] += t
            self._share_totals[1] += comm
            if self.phase == "measure":
                said = said or self._judge_share(done)
        self._pending = []
        return said

    def _share(self) -> float:
        total, comm = self._share_totals
        return comm / total if total > 0 else 0.0

    def _share_evidence(self) -> str:
        above = sum(s > self.min_share for s in self._shares)
        return (f"communication {self._share():.0%} of the step (mean of {len(self._shares)} "
                f"plain steps; above {self.min_share:.0%} in {above} of them)")

    def _judge_share(self, done: int) -> AutoDecision | None:
        n = len(self._shares)
        verdict = sign_test(self._shares, self.min_share) if n >= self.min_samples else None
        if verdict == "below":
            return self._decide("none", done, f"{self._share_evidence()}: nothing to gain")
        if verdict == "above":
            self.phase = "trial"
        elif n >= self.max_samples:
            return self._decide("undecided", done, f"{self._share_evidence()}: not clearly "
                                f"above or below {self.min_share:.0%}; plain all-reduce kept")
        return None

    # -- 2 and 3: the trial's rounds --
    def trial_due(self, run_step: int, steps_left: int) -> bool:
        """Whether a round starts at this step: after the warm-up, with a round's steps left
        (in the epoch and in the run)."""
        return (self.phase == "trial" and run_step >= self.trial_from
                and steps_left >= self.round_steps)

    def take_round(self, plain: list[tuple[float, float]], powersgd: list[tuple[float, float]],
                   done: int, device) -> tuple[AutoDecision | None, bool]:
        """A round's (step s, loss) per step of each branch; every rank. Returns the decision
        if one is made, and whether the run goes on from the PowerSGD branch."""
        n = len(plain)
        agreed = _mean_over_ranks([x for row in (*plain, *powersgd) for x in row], device)
        plain_t, plain_loss = agreed[0:2 * n:2], agreed[1:2 * n:2]
        psgd_t, psgd_loss = agreed[2 * n::2], agreed[2 * n + 1::2]
        first = 1 if self._rounds == 0 else 0   # the step that allocated PowerSGD's matrices
        self._pairs += list(zip(plain_t[first:], psgd_t[first:]))
        self._rounds += 1
        self._excess = loss_excess(plain_loss, psgd_loss)
        if self._excess > AUTO_GUARD_EXCESS:
            return self._decide(
                "none", done, f"{self._trial_evidence()}; but the loss guard stopped it: over "
                f"the round's last {n - n // 2} steps the PowerSGD branch's loss was "
                f"{self._excess:.1%} above plain all-reduce's on the same batches (more than "
                f"{AUTO_GUARD_EXCESS:.0%}): plain all-reduce kept"), False
        gains = [1.0 - q / p if p > 0 else 0.0 for p, q in self._pairs]
        verdict = sign_test(gains, self.min_gain) if len(gains) >= self.min_pairs else None
        guard = (f"; loss guard: PowerSGD's loss {self._excess:+.1%} against plain "
                 "all-reduce's on the same batches")
        if verdict == "above":
            return self._decide("powersgd", done, self._trial_evidence() + guard), True
        if verdict == "below":
            return self._decide("none", done, self._trial_evidence() + guard), False
        if self._rounds >= self.max_rounds:
            return self._decide("undecided", done, f"{self._trial_evidence()}{guard}; not "
                                f"clear after {self._rounds} round(s), plain all-reduce "
                                "kept"), False
        return None, False

    def _trial_evidence(self) -> str:
        plain_s = statistics.median(p for p, _ in self._pairs)
        psgd_s = statistics.median(q for _, q in self._pairs)
        faster = sum(1 - q / p >= self.min_gain for p, q in self._pairs if p > 0)
        gain = 1 - psgd_s / plain_s if plain_s > 0 else 0.0
        than = f"{gain:.0%} faster" if gain >= 0 else f"{-gain:.0%} slower"
        return (f"{self._share_evidence()}; in the trial PowerSGD steps took {psgd_s:.3f}s "
                f"against {plain_s:.3f}s for plain ones on the same batches (medians, "
                f"{than}), at least {self.min_gain:.0%} faster in {faster} of "
                f"{len(self._pairs)} pairs")

    def _decide(self, choice: str, done: int, reason: str) -> AutoDecision:
        plain = [p for p, _ in self._pairs]
        psgd = [q for _, q in self._pairs]
        self.decision = AutoDecision(
            choice, reason, done, round(self._share(), 4), len(self._shares),
            sum(s > self.min_share for s in self._shares),
            round(statistics.median(plain), 6) if plain else None,
            round(statistics.median(psgd), 6) if psgd else None, len(self._pairs),
            sum(1 - q / p >= self.min_gain for p, q in self._pairs if p > 0),
            None if self._excess is None else round(self._excess, 4))
        self.phase = "done"
        self.use(choice == "powersgd")
        return self.decision

    # -- the outcome, and checkpoints --
    def outcome(self, steps_done: int) -> dict:
        """For result.json: the decision, or, when the run ended before one, why not and what
        the last steps used."""
        if self.decision is not None:
            out = self.decision.to_json()
        else:
            during = ("the measurement of plain all-reduce" if self.phase == "measure" else
                      f"the wait for the PowerSGD trial (from step {self.trial_from + 1}, "
                      f"{self.round_steps} steps within one epoch)")
            out = AutoDecision("undecided", f"run ended at step {steps_done} during {during}",
                               None, round(self._share(), 4) if self._shares else None,
                               len(self._shares),
                               sum(s > self.min_share for s in self._shares)).to_json()
        return {**out, "last_steps_used": "powersgd" if self.uses_powersgd() else "all-reduce"}

    def state_dict(self) -> dict[str, Any]:
        return {"decision": None if self.decision is None else self.decision.to_json()}

    def load_state_dict(self, saved: dict[str, Any], resumed_at_step: int) -> None:
        """A decision made before the checkpoint stands (the hook's restored state carries it
        out). One still being measured starts again from the resumed step, with plain
        all-reduce: the timings it had are gone with the process that took them."""
        self.step_offset = resumed_at_step
        decision = (saved or {}).get("decision")
        if decision is not None:
            self.decision = AutoDecision(**decision)
            self.phase = "done"
            return
        self.phase = "measure"
        self.use(False)


def _mean_over_ranks(values: list[float], device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()
