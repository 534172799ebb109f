"""DistributedDataParallel built from the recipe's `ddp` block, with its communication hook
and the hook's state in checkpoints. The measured choices behind `comm_hook: auto` and
`bucket_cap_mb: auto` are train/autocomm.py's."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from train.options import AUTO, COMM_HOOKS, default, options_under
from train.powersgd import powersgd_hook

# PowerSGD all-reduces plainly while state.iter < start_powerSGD_iter: "never" until auto
# decides otherwise. (A constructor check wants > 1 when error feedback is on.)
NEVER = 2**62


@dataclass(frozen=True)
class DDPSettings:
    """The recipe's ddp block as the trainer received it (train/options.py declares it)."""

    static_graph: bool = default("ddp.static_graph")
    gradient_as_bucket_view: bool = default("ddp.gradient_as_bucket_view")
    bucket_cap_mb: float = default("ddp.bucket_cap_mb")
    comm_hook: str = default("ddp.comm_hook")
    powersgd_rank: int = default("ddp.powersgd.rank")
    powersgd_start_iter: int = default("ddp.powersgd.start_iter")
    powersgd_warm_start: bool = default("ddp.powersgd.warm_start")
    powersgd_error_feedback: bool = default("ddp.powersgd.error_feedback")
    powersgd_wire: str = default("ddp.powersgd.wire")
    powersgd_hook: str = default("ddp.powersgd.hook")

    @classmethod
    def from_args(cls, args) -> DDPSettings:
        return cls(**{o.dest: getattr(args, o.dest) for o in options_under("ddp")})

    def describe(self) -> str:
        """For people: 'static_graph, gradient_as_bucket_view, buckets 5.25 MiB, comm_hook auto
        (PowerSGD rank 4 if it pays)'."""
        parts = [name for name in ("static_graph", "gradient_as_bucket_view")
                 if getattr(self, name)]
        parts.append(f"buckets {self.bucket_cap_mb:g} MiB")
        hook = f"comm_hook {self.comm_hook}"
        if self.comm_hook == "powersgd":
            hook += (f" (rank {self.powersgd_rank} from step {self.powersgd_start_iter}, "
                     f"error feedback {'on' if self.powersgd_error_feedback else 'off'})")
        elif self.comm_hook == AUTO:
            hook += f" (PowerSGD rank {self.powersgd_rank} if it pays)"
        parts.append(hook)
        return ", ".join(parts)


class OneBucketAtATime:
    """Runs a comm hook for one bucket only after the previous bucket's hook has finished.

    PowerSGD issues two more all-reduces per bucket from its futures' callbacks. NCCL runs
    those callbacks in issue order on the calling thread; gloo runs them on its worker
    threads as work completes, so with several buckets the ranks issued their collectives in
    different orders and gloo aborted ("Received data size doesn't match expected size",
    seen here on a 2-host run with 1 MiB buckets). Chaining buckets makes the order the same
    on every rank. Gloo on CPU barely overlaps buckets anyway, so little is lost.
    """

    def __init__(self, hook):
        self.hook = hook
        # DDP reads both names (its logger; its bf16 check).
        self.__name__ = self.__qualname__ = hook.__name__
        self._tail: torch.futures.Future | None = None

    # No annotations: DDP compares them against the real classes, and this module's
    # `from __future__ import annotations` would turn them into strings.
    def __call__(self, state, bucket):
        previous = self._tail
        if previous is None or previous.done():
            fut = self.hook(state, bucket)
        else:
            fut = torch.futures.Future()

            def start(_done):
                try:
                    inner = self.hook(state, bucket)
                except Exception as err:  # surface it to DDP instead of losing it in a thread
                    fut.set_exception(err)
                    return

                def forward(result):
                    try:
                        fut.set_result(result.value())
                    except Exception as err:
                        fut.set_exception(err)

                inner.add_done_callback(forward)

            previous.add_done_callback(start)
        self._tail = fut
        return fut


def wrap_ddp(model: nn.Module, settings: DDPSettings, device: torch.device) -> tuple[DDP, Any]:
    """Returns the DDP module and the hook's state (PowerSGDState for powersgd and auto)."""
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(
        model,
        device_ids=device_ids,
        static_graph=settings.static_graph,
        gradient_as_bucket_view=settings.gradient_as_bucket_view,
        bucket_cap_mb=settings.bucket_cap_mb,
    )
    state = None
    if settings.comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif settings.comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif settings.comm_hook in ("powersgd", AUTO):
        state = ResumablePowerSGDState(
            parameters=list(model.parameters()),
            process_group=None,
            matrix_approximation_rank=settings.powersgd_rank,
            start_powerSGD_iter=NEVER if settings.comm_hook == AUTO
            else settings.powersgd_start_iter,
            use_error_feedback=settings.powersgd_error_feedback,
            warm_start=settings.powersgd_warm_start,
        )
        state.wire = settings.powersgd_wire
        hook = track_buckets(powerSGD_hook.powerSGD_hook if settings.powersgd_hook == "torch"
                             else powersgd_hook)
        ddp.register_comm_hook(state, hook if device.type == "cuda" else OneBucketAtATime(hook))
    elif settings.comm_hook != "none":
        raise ValueError(f"unknown comm_hook {settings.comm_hook!r}; expected one of {COMM_HOOKS}")
    return ddp, state


# ---- the hook's state in a checkpoint --------------------------------------------------------


class ResumablePowerSGDState(powerSGD_hook.PowerSGDState):
    """PowerSGD's state, kept so that a checkpoint can restore it exactly into any bucket layout.

    PowerSGD keys its per-bucket tensors (error-feedback residual, warm-start P and Q) by bucket
    index, each a concatenation over the bucket's parameters in the bucket's order. A fresh DDP
    runs its first iteration on buckets in parameter order and then rebuilds them in the order
    gradients became ready: the layout a checkpoint's tensors were made in is not the one a
    resumed run starts with (and `bucket_cap_mb` may change between them). So a checkpoint
    holds them per parameter, and they are put together again for whichever layout a bucket
    has when the hook is called; when DDP's rebuild changes the layout, the live tensors are
    taken apart and put together the same way. PowerSGD works tensor by tensor, so this is
    exact."""

    def __init__(self, *args, parameters: list[torch.Tensor] = (), **kwargs):
        super().__init__(*args, **kwargs)
        # comm_hook auto switching PowerSGD off: the error-feedback residual (gradient not yet
        # applied) goes into the next plain all-reduce instead of being dropped.
        self.flush_residual = False
        self.param_index = {id(p): i for i, p in enumerate(parameters)}
        self.param_shapes = [tuple(p.shape) for p in parameters]
        self.bucket_params: dict[int, tuple[int, ...]] = {}   # bucket index -> its parameters
        self.held: dict[int, dict[str, torch.Tensor]] = {}    # parameter -> its pieces

    # -- per-parameter pieces of the per-bucket tensors --
    def _sizes(self, param: int) -> tuple[int, int | None, int | None]:
        """(numel, P length, Q length) of one parameter; None: not compressed (PowerSGD
        all-reduces it plainly and keeps no P/Q for it)."""
        shape = self.param_shapes[param]
        n = shape[0] if shape else 1
        numel = 1
        for d in shape:
            numel *= d
        m = numel // n if n else 0
        rank = min(n, m, self.matrix_approximation_rank)
        compress = powerSGD_hook._should_compress(n, m, rank, self.min_compression_rate)[0]
        return numel, (n * rank if compress else None), (m * rank if compress else None)

    def pieces(self) -> dict[int, dict[str, torch.Tensor]]:
        """Per-parameter pieces of the live per-bucket tensors, and of those still held."""
        tables = {"error": self.error_dict, "p": self.p_memory_dict, "q": self.q_memory_dict}
        out = {param: dict(parts) for param, parts in self.held.items()}
        for index, params in self.bucket_params.items():
            offsets = {"error": 0, "p": 0, "q": 0}
            for param in params:
                numel, p_len, q_len = self._sizes(param)
                for name, length in (("error", numel), ("p", p_len), ("q", q_len)):
                    if length is None or index not in tables[name]:
                        continue
                    start = offsets[name]
                    out.setdefault(param, {})[name] = tables[name][index][start:start + length]
                    offsets[name] += length
        return out

    def take_apart(self) -> None:
        """Every bucket's live tensors into per-parameter pieces (`held`), dicts emptied."""
        self.held = self.pieces()
        self.error_dict.clear()
        self.p_memory_dict.clear()
        self.q_memory_dict.clear()

    def put_together(self, index: int, params: tuple[int, ...], device: torch.device) -> None:
        """The bucket's tensors from the held pieces of its parameters, if all are held."""
        if not all(param in self.held for param in params):
            for param in params:  # a partial set would misalign: PowerSGD starts afresh
                self.held.pop(param, None)
            return
        tables = {"error": self.error_dict, "p": self.p_memory_dict, "q": self.q_memory_dict}
        for name, table in tables.items():
            parts = []
            for param in params:
                size = self._sizes(param)[{"error": 0, "p": 1, "q": 2}[name]]
                if size is None:
                    continue
                if name not in self.held[param]:
                    parts = None
                    break
                parts.append(self.held[param][name])
            if parts:
                table[index] = torch.cat(parts).to(device)
        for param in params:
            del self.held[param]


def track_buckets(hook):
    """The PowerSGD hook, keeping its per-bucket state aligned with DDP's bucket layout, and
    feeding a switched-off PowerSGD's residual into the plain all-reduce."""

    @functools.wraps(hook)
    def tracked(state, bucket):
        index = bucket.index()
        params = tuple(state.param_index[id(p)] for p in bucket.parameters())
        known = state.bucket_params.get(index)
        if known is not None and known != params:
            state.take_apart()  # DDP rebuilt its buckets: every bucket's layout changed
        state.bucket_params[index] = params
        if state.held:
            state.put_together(index, params, bucket.buffer().device)
        if state.flush_residual and state.iter < state.start_powerSGD_iter:
            # The residual is this rank's gradient PowerSGD left out; the plain all-reduce
            # averages the buffers, as PowerSGD's next step would have averaged it in.
            residual = state.error_dict.pop(index, None)
            if residual is not None:
                bucket.buffer().add_(residual)
        return hook(state, bucket)

    return tracked


def _np_state(rng: np.random.RandomState) -> dict[str, Any]:
    """A numpy generator's state as tensors and numbers (loadable with weights_only)."""
    name, keys, pos, has_gauss, cached = rng.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_np_state(rng: np.random.RandomState, saved: dict[str, Any]) -> None:
    rng.set_state((saved["name"], saved["keys"].numpy().astype(np.uint32), saved["pos"],
                   saved["has_gauss"], saved["cached_gaussian"]))


def hook_checkpoint(state) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(shared, this rank's) state of the comm hook for a checkpoint, on CPU. Shared: the same
    on every rank (iteration counter, when PowerSGD starts, its random generator). Per rank:
    each parameter's error-feedback residual and warm-start P/Q."""
    if not isinstance(state, ResumablePowerSGDState):
        return None, None
    shared = {"iter": state.iter, "start_powerSGD_iter": state.start_powerSGD_iter,
              "flush_residual": state.flush_residual, "rng": _np_state(state.rng),
              "numel_before": state.total_numel_before_compression,
              "numel_after": state.total_numel_after_compression}
    pieces = {param: {name: t.detach().to("cpu", copy=True) for name, t in parts.items()}
              for param, parts in state.pieces().items()}
    return shared, {"pieces": pieces}


def rebuild_buckets_first(ddp: DDP, state, sample: torch.Tensor) -> None:
    """Forward/backward passes of a zero loss with plain all-reduce, before a resumed run's
    first step, until DDP has rebuilt its buckets: PowerSGD cannot run on the buckets of a
    fresh DDP (its gradients are not yet views of the bucket: the reason PowerSGD wants
    start_iter > 1). DDP rebuilds after its first iteration, with static_graph after its
    second (seen here). Measured: without this a resumed run drifted from an uninterrupted
    one by 1e-3 in the first step's gradients; with it the final loss is identical. The
    weights are untouched and the gradients cleared; PowerSGD's counter is put back."""
    if not isinstance(state, ResumablePowerSGDState):
        return
    kept = state.iter, state.start_powerSGD_iter, state.flush_residual
    state.start_powerSGD_iter, state.flush_residual = NEVER, False  # the residual stays held
    try:
        for _ in range(2 if ddp.static_graph else 1):
            ddp(sample).float().sum().mul(0.0).backward()
    finally:
        state.iter, state.start_powerSGD_iter, state.flush_residual = kept
        for param in ddp.parameters():
            param.grad = None


def restore_hook(state, shared: dict[str, Any] | None, mine: dict[str, Any] | None) -> None:
    if not isinstance(state, ResumablePowerSGDState) or shared is None:
        return
    state.iter = shared["iter"]
    state.start_powerSGD_iter = shared["start_powerSGD_iter"]
    state.flush_residual = shared.get("flush_residual", False)
    _set_np_state(state.rng, shared["rng"])
    state.total_numel_before_compression = shared["numel_before"]
    state.total_numel_after_compression = shared["numel_after"]
    state.error_dict.clear()
    state.p_memory_dict.clear()
    state.q_memory_dict.clear()
    state.bucket_params = {}
    state.held = {int(param): dict(parts)
                  for param, parts in (mine or {}).get("pieces", {}).items()}
