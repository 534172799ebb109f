"""The keeper's copy of the model and optimizer for a checkpoint, taken without holding up
training: what only the optimizer changes is copied while the next step's forward and backward
run, and whatever would change it next (optimizer.step, a load_state_dict) first waits for the
copy to end.

The parameters the optimizer updates and the optimizer's own tensors (AdamW's moments and step
counts) change only in optimizer.step and in a load_state_dict (comm_hook auto's trial puts a
snapshot back with one): their copy is deferred to the writer thread, before it writes. The
rest of the state is copied at the save, as before: buffers (DDP overwrites them in every
forward when it broadcasts them), parameters no optimizer owns, the param groups (the learning
rate is set every step). The comm hook's state, which backward changes, is copied by its own
code (train/ddp.py hook_checkpoint) at the save.

On a GPU the deferred copies are queued on a side stream into pinned memory after the step's
kernels (an event), the writer waits for them on the host, and the next optimizer.step's
kernels wait for them on the GPU: the host does not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

Pairs = list[tuple[torch.Tensor, torch.Tensor]]   # (copy, original)


def cpu_copy(obj: Any, into: Any = None, defer: frozenset[int] = frozenset(),
             later: Pairs | None = None) -> Any:
    """Tensors copied to CPU (training goes on changing the originals in place), into the
    tensors at the same place in `into` (a previous copy no one reads any more) where shape
    and dtype match: fresh memory costs a page fault per page, which was half of the copy's
    time (64 MB: 10.4 ms a save, benchmarks/recovery.py). A tensor whose id is in `defer` gets
    its place now and its values later: (copy, original) is appended to `later`."""
    if isinstance(obj, torch.Tensor):
        if id(obj) in defer:
            pinned = obj.is_cuda   # an asynchronous copy from the GPU needs it
            target = into if _fits(into, obj, pinned) else torch.empty(
                obj.shape, dtype=obj.dtype, pin_memory=pinned)
            later.append((target, obj))
            return target
        source = obj.detach()
        return into.copy_(source) if _fits(into, source, False) else \
            source.to("cpu", copy=True)
    if isinstance(obj, dict):
        into = into if isinstance(into, dict) else {}
        return {k: cpu_copy(v, into.get(k), defer, later) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        into = into if isinstance(into, (list, tuple)) and len(into) == len(obj) else \
            [None] * len(obj)
        return type(obj)(cpu_copy(v, old, defer, later) for v, old in zip(obj, into))
    return obj


def _fits(into: Any, source: torch.Tensor, pinned: bool) -> bool:
    return isinstance(into, torch.Tensor) and into.is_cpu and into.shape == source.shape and \
        into.dtype == source.dtype and (not pinned or into.is_pinned())


def optimizer_owned(optimizer: torch.optim.Optimizer) -> frozenset[int]:
    """ids of the tensors only optimizer.step and load_state_dict change: the parameters it
    updates and its per-parameter state."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    ids.update(id(t) for state in optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor))
    return frozenset(ids)


class DeferredCopy:
    """The copies left for later; `run` (the writer thread) makes them, `wait` (the training
    thread) returns once nothing it does next can change what they read."""

    def __init__(self, pairs: Pairs, side_stream: torch.cuda.Stream | None):
        self.pairs = pairs
        self.copied = threading.Event()
        self.on_gpu = [(t, s) for t, s in pairs if s.is_cuda]
        self.side_stream = side_stream
        self._ready = self._done = None
        if self.on_gpu:
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(side_stream.device))  # after the step

    def run(self) -> float:
        """The copies; returns the seconds they took (on a GPU: to be queued and to end)."""
        t0 = time.perf_counter()
        try:
            with torch.no_grad():   # the originals are parameters
                if self.on_gpu:
                    with torch.cuda.device(self.side_stream.device), \
                            torch.cuda.stream(self.side_stream):
                        self.side_stream.wait_event(self._ready)
                        for target, source in self.on_gpu:
                            target.copy_(source, non_blocking=True)
                        done = torch.cuda.Event()
                        done.record(self.side_stream)
                    self._done = done
                for target, source in self.pairs:
                    if not source.is_cuda:
                        target.copy_(source)
        finally:
            self.copied.set()   # a failed copy must not leave training waiting
        if self._done is not None:
            self._done.synchronize()   # the write reads the pinned copies
        return time.perf_counter() - t0

    def wait(self) -> None:
        self.copied.wait()
        if self._done is not None:
            torch.cuda.current_stream(self.side_stream.device).wait_event(self._done)


class Staging:
    """The keeper's copies, one save at a time, each into the previous one's memory; the
    fence that keeps training from changing what a deferred copy reads before it is read.
    `on_wait` is told each time the fence held training up, in seconds."""

    def __init__(self, on_wait: Callable[[float], None]):
        self.previous: dict[str, Any] | None = None
        self.pending: DeferredCopy | None = None
        self.on_wait = on_wait
        self._armed: set[int] = set()
        self._side_stream: torch.cuda.Stream | None = None

    def arm(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The fence before whatever changes the deferred copies' originals (once each)."""
        if id(module) not in self._armed:
            module.register_load_state_dict_pre_hook(lambda *_: self.fence())
            self._armed.add(id(module))
        if id(optimizer) not in self._armed:
            optimizer.register_step_pre_hook(lambda *_: self.fence())
            optimizer.register_load_state_dict_pre_hook(lambda *_: self.fence())
            self._armed.add(id(optimizer))

    def take(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[dict[str, Any], DeferredCopy]:
        """The model's and optimizer's state with the copies of the optimizer's tensors
        deferred: `run` the DeferredCopy before reading them. The previous copy's reader (its
        write) must have ended."""
        self.fence()
        self.arm(module, optimizer)
        owned, later = optimizer_owned(optimizer), []
        previous = self.previous or {}
        state = {
            "model": cpu_copy(module.state_dict(keep_vars=True), previous.get("model"), owned,
                              later),
            "optimizer": cpu_copy(optimizer.state_dict(), previous.get("optimizer"), owned,
                                  later),
        }
        self.previous = state
        on_gpu = next((s.device for _, s in later if s.is_cuda), None)
        if on_gpu is not None and self._side_stream is None:
            self._side_stream = torch.cuda.Stream(on_gpu)
        self.pending = DeferredCopy(later, self._side_stream)
        return state, self.pending

    def fence(self) -> None:
        """Returns once the pending deferred copy no longer reads what training changes next."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        t0 = time.perf_counter()
        pending.wait()
        self.on_wait(time.perf_counter() - t0)
