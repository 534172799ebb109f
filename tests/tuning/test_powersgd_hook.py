"""launch's PowerSGD hook (train/powersgd.py) on a real gloo group and DDP: with a rank high
enough to be exact it hands back the gradient itself; with bf16 on the wire the gradient it
hands back plus the residual it keeps is the gradient (error feedback loses nothing)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from train.ddp import OneBucketAtATime, ResumablePowerSGDState, track_buckets
from train.powersgd import powersgd_hook


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))


def _grads(module, x, y) -> list[torch.Tensor]:
    module.zero_grad()
    F.cross_entropy(module(x), y).backward()
    return [p.grad.detach().clone() for p in module.parameters()]


def _hooked(wire: str):
    model = _model()
    reference = copy.deepcopy(model)
    ddp = DDP(model)
    # min_compression_rate 0.1: these small matrices are compressed too; rank 8 = min(n, m) of
    # every matrix here, so P Q^T can be exact.
    state = ResumablePowerSGDState(parameters=list(model.parameters()), process_group=None,
                                   matrix_approximation_rank=8, start_powerSGD_iter=2,
                                   min_compression_rate=0.1, use_error_feedback=True,
                                   warm_start=True)
    state.wire = wire
    ddp.register_comm_hook(state, OneBucketAtATime(track_buckets(powersgd_hook)))
    return ddp, reference, state


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 6, generator=g), torch.randint(0, 4, (16,), generator=g)


def test_an_exact_rank_hands_back_the_gradient(world_of_one):
    ddp, reference, state = _hooked("fp32")
    for seed in range(2):        # plain all-reduce while DDP settles its buckets
        _grads(ddp, *_batch(seed))
    x, y = _batch(2)
    got = _grads(ddp, x, y)
    assert state.iter > state.start_powerSGD_iter - 1 and state.p_memory_dict
    for g, want in zip(got, _grads(reference, x, y)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


def test_bf16_on_the_wire_keeps_what_it_rounds_in_the_residual(world_of_one):
    ddp, reference, state = _hooked("bf16")
    for seed in range(2):
        _grads(ddp, *_batch(seed))
    x, y = _batch(2)
    got = _grads(ddp, x, y)
    want = _grads(reference, x, y)
    pieces = state.pieces()                            # each parameter's residual
    assert any(not torch.equal(g, w) for g, w in zip(got, want))   # bf16 did round
    for index, (g, w) in enumerate(zip(got, want)):
        residual = pieces[index]["error"].view_as(w)
        assert float(residual.abs().max()) <= 1e-2 * float(w.abs().max()) + 1e-6
        torch.testing.assert_close(g + residual, w, rtol=1e-4, atol=1e-6)
