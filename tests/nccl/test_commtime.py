"""The trainer's measurement of time spent waiting on communication (train/commtime.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from train.commtime import CommTimer, StepComm, summarize
from train.ddp import DDPSettings, wrap_ddp
from train.model import build_vit


def test_step_numbers():
    step = StepComm(step_time_s=0.5, comm_wait_s=0.125)
    assert (step.compute_s, step.comm_share) == (0.375, 0.25)
    assert StepComm(0.0, 0.0).comm_share == 0.0


def test_summary_weighs_long_steps_more():
    steps = [StepComm(0.1, 0.05), StepComm(0.3, 0.05)]
    assert summarize(steps) == {"comm_wait_s": 0.05, "compute_s": 0.15, "comm_share": 0.25}
    assert summarize([]) == {"comm_wait_s": 0.0, "compute_s": 0.0, "comm_share": 0.0}


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _train(hook: str, timed: bool, steps: int = 3):
    torch.manual_seed(0)
    model = build_vit("vit_tiny", 8, 4, 1, 10, depth=1)
    settings = DDPSettings(comm_hook=hook, powersgd_start_iter=2)
    ddp, _ = wrap_ddp(model, settings, torch.device("cpu"))
    timer = CommTimer(ddp.module, torch.device("cpu")) if timed else None
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(16) % 10
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(ddp(images), labels).backward()
        if timer:
            timer.backward_done()
        optimizer.step()
        if timer:
            timer.step_done(1.0)
    return model.state_dict(), timer


@pytest.mark.parametrize("hook", ["none", "fp16", "powersgd"])
def test_timing_changes_no_parameter_and_records_every_step(gloo, hook):
    plain, _ = _train(hook, timed=False)
    timed, timer = _train(hook, timed=True)
    for name, value in plain.items():
        assert torch.equal(timed[name], value), name
    assert len(timer.steps) == 3
    for step in timer.steps:
        assert step.step_time_s == 1.0
        assert 0.0 <= step.comm_wait_s <= step.step_time_s


def test_a_step_without_backward_waits_nothing(gloo):
    _, timer = _train("none", timed=True, steps=1)
    assert timer.step_done(0.2) == StepComm(0.2, 0.0)
    timer.close()
    assert timer._handles == []
