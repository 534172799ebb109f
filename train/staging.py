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

From one save to the next the state's tensors are the same objects (optimizer.step, DDP and
the buffers' updates write into them), so where each goes is planned at the first save and
reused (CopyPlan): a save then checks each tensor is still the one planned, with its shape,
dtype and device, instead of walking the state again to decide what to copy where (the walk
was most of the copy's time at the save: ~930 nodes, 608 tensors for the demo's ViT-Tiny and
AdamW). Anything else (a load_state_dict's new optimizer tensors, state the optimizer made
since, a parameter moved or resized, a value that is no tensor) takes the full walk, which
plans again.
"""

from __future__ import annotations

import operator
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
        self.plan: CopyPlan | None = None
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
        model_state = module.state_dict(keep_vars=True)
        optimizer_state = optimizer.state_dict()
        planned = self.plan.follow(model_state, optimizer_state, optimizer, self.previous) \
            if self.plan is not None else None
        if planned is not None:
            state, later = planned
        else:
            owned, later = optimizer_owned(optimizer), []
            previous = self.previous or {}
            state = {
                "model": cpu_copy(model_state, previous.get("model"), owned, later),
                "optimizer": cpu_copy(optimizer_state, previous.get("optimizer"), owned, later),
            }
            self.plan = CopyPlan.of(model_state, optimizer_state, optimizer, state, owned)
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


def _entries(optimizer_state: dict[str, Any]) -> tuple[list, list]:
    """The keys ((index, its names) per parameter) and the values of optimizer.state_dict()'s
    "state", in its order."""
    state = optimizer_state["state"]
    return ([(index, tuple(entries)) for index, entries in state.items()],
            [value for entries in state.values() for value in entries.values()])


def _groups(groups: list[dict[str, Any]], previous: Any) -> list[dict[str, Any]]:
    """optimizer.state_dict()'s param_groups, a snapshot: its dicts and "params" lists are
    made afresh by every state_dict call, its other values are numbers and tuples, or a
    tensor (a learning rate as a tensor), which is copied."""
    previous = previous if isinstance(previous, list) and len(previous) == len(groups) else \
        [{}] * len(groups)
    return [{k: v if k == "params" else cpu_copy(v, old.get(k)) for k, v in group.items()}
            for group, old in zip(groups, previous)]


class CopyPlan:
    """Where the last full walk put each tensor of the model's state_dict and of the
    optimizer's per-parameter state, and which were deferred: `follow` copies a new save
    into the previous save's tensors by this plan when every tensor is the one planned (the
    same object, shape and dtype, in the same place) and the optimizer updates the same
    parameters; otherwise it returns None. The optimizer's param_groups (the learning rate
    changes every step) are walked each time: they hold no large tensor. A tensor moved to
    another device in place (`param.data = ...`) is still copied right, by copy_."""

    def __init__(self, model_keys: list[str], optimizer_keys: list, sources: list,
                 targets: list, deferred: list[bool], params: list[int]):
        # The model's keys and the optimizer's ((index, names) per parameter); every tensor
        # planned (the model's, then the optimizer's, in their orders), its copy, whether it
        # is copied later; the optimizer's parameters (ids, in its order).
        self.model_keys, self.optimizer_keys, self.params = model_keys, optimizer_keys, params
        self.sources, self.targets = sources, targets
        self.layouts = ([t.shape for t in sources], [t.dtype for t in sources])
        self.now = [(t, s) for t, s, d in zip(targets, sources, deferred) if not d]
        self.later = [(t, s) for t, s, d in zip(targets, sources, deferred) if d]

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> list[int]:
        return [id(p) for group in optimizer.param_groups for p in group["params"]]

    @classmethod
    def of(cls, model_state: dict[str, Any], optimizer_state: dict[str, Any],
           optimizer: torch.optim.Optimizer, copied: dict[str, Any],
           owned: frozenset[int]) -> CopyPlan | None:
        """The plan of a full walk's result (`copied`), or None when its state is not all
        tensors (a module's extra state, an optimizer's non-tensor entries)."""
        keys, values = _entries(optimizer_state)
        if not all(isinstance(v, torch.Tensor) for v in [*model_state.values(), *values]):
            return None
        sources = [*model_state.values(), *values]
        targets = [*(copied["model"][k] for k in model_state),
                   *(copied["optimizer"]["state"][index][name]
                     for index, names in keys for name in names)]
        return cls(list(model_state), keys, sources, targets,
                   [id(t) in owned for t in sources], cls._params(optimizer))

    def follow(self, model_state: dict[str, Any], optimizer_state: dict[str, Any],
               optimizer: torch.optim.Optimizer, previous: dict[str, Any] | None
               ) -> tuple[dict[str, Any], Pairs] | None:
        if previous is None or list(model_state) != self.model_keys or \
                self._params(optimizer) != self.params:
            return None
        keys, values = _entries(optimizer_state)
        if keys != self.optimizer_keys:
            return None
        # The same objects as planned: tensors all, as the plan's are.
        sources = [*model_state.values(), *values]
        if len(sources) != len(self.sources) or \
                not all(map(operator.is_, sources, self.sources)) or \
                ([t.shape for t in sources], [t.dtype for t in sources]) != self.layouts:
            return None
        with torch.no_grad():
            for target, source in self.now:
                target.copy_(source)
        n = len(self.model_keys)
        model = dict(zip(self.model_keys, self.targets[:n]))
        state: dict[Any, dict[str, torch.Tensor]] = {}
        targets = iter(self.targets[n:])
        for index, names in self.optimizer_keys:
            state[index] = {name: next(targets) for name in names}
        groups = _groups(optimizer_state["param_groups"], previous["optimizer"]["param_groups"])
        rest = {k: v for k, v in optimizer_state.items() if k not in ("state", "param_groups")}
        return ({"model": model, "optimizer": {**rest, "state": state, "param_groups": groups}},
                list(self.later))
