"""comm_hook auto's trial round: the run forked into a plain and a PowerSGD branch.

From one saved state (weights, optimizer, comm hook, random generators) the run takes a
round's steps with plain all-reduce, as any steps (logged, timed, checkpointed), keeping the
batches it drew; then the state is put back and the same steps run again on the same batches
with PowerSGD. Both branches start equal and see the same data, so step i of one is step i of
the other: their times pair up without the machine's noise between different batches, and
their losses differ only by what compression did. train/autocomm.py judges the round; the run
goes on from the branch it keeps, and the other is dropped whole (its error-feedback residual
with it, so no gradient of the kept trajectory is lost).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

_HOOK_FIELDS = ("iter", "start_powerSGD_iter", "flush_residual", "error_dict", "p_memory_dict",
                "q_memory_dict", "rng", "total_numel_before_compression",
                "total_numel_after_compression", "bucket_params", "held")


@dataclass
class Snapshot:
    """What a step changes, copied: restoring it puts the run back exactly."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    hook: dict[str, Any]
    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None

    @classmethod
    def take(cls, run) -> Snapshot:
        module = run.ddp.module
        return cls({k: v.detach().clone() for k, v in module.state_dict().items()},
                   copy.deepcopy(run.optimizer.state_dict()),
                   {f: copy.deepcopy(getattr(run.hook_state, f)) for f in _HOOK_FIELDS},
                   torch.get_rng_state(),
                   torch.cuda.get_rng_state(run.device) if run.device.type == "cuda" else None)

    def restore(self, run) -> None:
        run.ddp.module.load_state_dict(self.model)
        run.optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        for name, value in self.hook.items():
            setattr(run.hook_state, name, copy.deepcopy(value))
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, run.device)


class _Keeping:
    """An iterator that keeps what it hands out, for the second branch."""

    def __init__(self, inner: Iterator, kept: list):
        self.inner, self.kept = inner, kept

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.inner)
        self.kept.append(item)
        return item


def trial_round(run, batches: Iterator, one_step: Callable, train_step: Callable):
    """One round of the trial at the run's current step; returns auto's decision, if the
    round made one. `one_step` takes a step with its bookkeeping, `train_step` only the
    step itself."""
    auto = run.auto
    start = Snapshot.take(run)
    drawn: list = []
    auto.use(False)
    plain = []
    for _ in range(auto.round_steps):
        loss = one_step(run, _Keeping(batches, drawn))
        times = run.comm.steps[-1]
        # The plain branch waited for the loader, the replay does not: compare the rest.
        plain.append((times.step_time_s - times.data_wait_s, loss))
    plain_end = Snapshot.take(run)
    done = run.step
    start.restore(run)
    auto.use(True)
    run.step = done - auto.round_steps
    replay = iter(drawn)
    powersgd = []
    try:
        for _ in range(auto.round_steps):
            t0 = time.perf_counter()
            loss = train_step(run, replay)
            powersgd.append((time.perf_counter() - t0, loss))
            run.step += 1
    finally:
        run.step = done
    decision, keep = auto.take_round(plain, powersgd, done, run.device)
    if keep:
        run.last_loss = powersgd[-1][1]
    else:
        plain_end.restore(run)
        auto.use(False)
    return decision
