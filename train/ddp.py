"""DistributedDataParallel built from the recipe's `ddp` block, with its communication hook."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")


@dataclass(frozen=True)
class DDPSettings:
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float = 25.0
    comm_hook: str = "none"
    powersgd_rank: int = 1
    powersgd_start_iter: int = 10
    powersgd_warm_start: bool = True
    powersgd_error_feedback: bool = True


def wrap_ddp(model: nn.Module, settings: DDPSettings, device: torch.device) -> tuple[DDP, Any]:
    """Returns the DDP module and the hook's state (PowerSGDState for powersgd, else None)."""
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
    elif settings.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=settings.powersgd_rank,
            start_powerSGD_iter=settings.powersgd_start_iter,
            use_error_feedback=settings.powersgd_error_feedback,
            warm_start=settings.powersgd_warm_start,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif settings.comm_hook != "none":
        raise ValueError(f"unknown comm_hook {settings.comm_hook!r}; expected one of {COMM_HOOKS}")
    return ddp, state
