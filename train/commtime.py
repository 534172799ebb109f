"""How much of each training step is spent waiting on gradient communication.

Method. DDP overlaps its all-reduces with the backward pass: a bucket is handed to the comm
hook (the built-in all-reduce, fp16/bf16 compression or PowerSGD) as soon as its gradients
exist, and `loss.backward()` returns only once every bucket's future has completed and its
result is back in the gradients. Communication hidden under the remaining backward compute
costs nothing; what costs step time is the part still running when the last gradient has been
computed. So the exposed wait of a step is

    comm_wait = (backward returned) - (last gradient accumulated)

The "last gradient accumulated" time comes from a post-accumulate-grad hook on every parameter
(each call only reads the clock, or re-records one CUDA event), not from wrapping the comm
hook: the same measurement then covers every hook, including DDP's built-in all-reduce, which
has no Python hook to wrap; and the gradients, buckets and hook are untouched, so numerics are
unchanged. The last gradient is also what makes the last bucket ready, so this is the time from
the last bucket's hook call to the end of backward, compression work included.

On CUDA the host returns from backward before NCCL finishes (DDP only makes the stream wait),
so both ends are CUDA events on the current stream and read after the step's synchronize.

Only the syncing micro-step of gradient accumulation communicates; the others add no wait.
The time the data loader's next() takes is timed too: a step splits into compute, data wait
and communication wait (train/stepsplit.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from train.stepsplit import StepTimes


class _TimedIterator:
    """The data loader's iterator, adding the time spent waiting for each batch to a timer."""

    def __init__(self, inner: Iterator, timer: CommTimer):
        self.inner, self.timer = inner, timer

    def __iter__(self):
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.timer.data_wait_s += time.perf_counter() - started


class CommTimer:
    """Per-step split of a DDP model's steps: exposed communication wait and data wait.

        timer = CommTimer(ddp.module, device)
        batches = timer.timed(iter(loader))        # counts the time next() waits
        loss.backward(); timer.backward_done()     # after the syncing backward only
        ...; step = timer.step_done(step_time_s)   # after the step (and cuda synchronize)

    `steps` holds one StepTimes per step, for logging and for choosing a comm hook.
    """

    def __init__(self, module: nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[StepTimes] = []
        self.data_wait_s = 0.0                    # since the last step_done
        self._last_grad_at = self._backward_end_at = 0.0
        if self.cuda:
            # One event re-recorded by every gradient: after backward it marks the last one.
            self._last_grad = torch.cuda.Event(enable_timing=True)
            self._backward_end = torch.cuda.Event(enable_timing=True)
        self._grad_seen = self._backward_seen = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                         for p in module.parameters() if p.requires_grad]

    def _on_grad(self, _param: torch.Tensor) -> None:
        if self.cuda:
            self._last_grad.record()
        else:
            self._last_grad_at = time.perf_counter()
        self._grad_seen = True

    def backward_done(self) -> None:
        """Call right after the backward that synchronises gradients returns."""
        if self.cuda:
            self._backward_end.record()
        else:
            self._backward_end_at = time.perf_counter()
        self._backward_seen = True

    def _wait_s(self) -> float:
        if not (self._grad_seen and self._backward_seen):
            return 0.0
        if self.cuda:
            # Both events are complete: the caller synchronized the device before step_done.
            return max(0.0, self._last_grad.elapsed_time(self._backward_end) / 1000.0)
        return max(0.0, self._backward_end_at - self._last_grad_at)

    def timed(self, iterator: Iterator) -> Iterator:
        return _TimedIterator(iterator, self)

    def step_done(self, step_time_s: float) -> StepTimes:
        comm = min(self._wait_s(), step_time_s)
        data, self.data_wait_s = self.data_wait_s, 0.0
        step = StepTimes(step_time_s, comm, min(data, step_time_s - comm))
        self.steps.append(step)
        self._grad_seen = self._backward_seen = False
        return step

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class InterfaceCounter:
    """Bytes this node sent on the interface its ranks talk over (GLOO/NCCL_SOCKET_IFNAME),
    from the kernel's counter: what really crossed the wire, compression and all."""

    def __init__(self):
        self.iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
        self.path = Path(f"/sys/class/net/{self.iface}/statistics/tx_bytes") if self.iface \
            else None
        self.start: tuple[int, int] | None = None
        self.per_step: float | None = None

    def counter_id(self) -> tuple[str, str | None]:
        """Which kernel counter this is: nodes in one network namespace (local nodes on
        loopback) read the same one."""
        try:
            netns = os.readlink("/proc/self/ns/net")
        except OSError:
            netns = socket.gethostname()
        return netns, self.iface

    def _read(self) -> int | None:
        try:
            return int(self.path.read_text()) if self.path else None
        except (OSError, ValueError):
            return None

    def mark_start(self, step: int) -> None:
        value = self._read()
        self.start = None if value is None else (step, value)

    def mark_end(self, step: int) -> None:
        value = self._read()
        if self.start and value is not None and step > self.start[0]:
            self.per_step = (value - self.start[1]) / (step - self.start[0])

