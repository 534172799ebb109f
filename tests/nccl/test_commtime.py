"""The trainer's measurement of time spent waiting on communication (train/commtime.py)."""

from __future__ import annotations

import random
import statistics
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from train.commtime import CommTimer
from train.stepsplit import StepTimes, split, split_of_totals
from train.ddp import DDPSettings, wrap_ddp
from train.model import build_vit


def test_step_numbers():
    step = StepTimes(step_time_s=0.5, comm_wait_s=0.125, data_wait_s=0.075)
    assert (step.compute_s, step.comm_share) == (0.3, 0.25)
    assert StepTimes(0.0, 0.0).comm_share == 0.0


def test_split_is_means_that_add_up_and_weighs_long_steps_more():
    steps = [StepTimes(0.1, 0.05, 0.01), StepTimes(0.3, 0.05, 0.03)]
    assert split(steps) == {"statistic": "mean", "steps": 2, "step_s": 0.2, "compute_s": 0.13,
                            "data_wait_s": 0.02, "comm_wait_s": 0.05, "comm_share": 0.25}
    assert split([])["step_s"] == 0.0 and split([])["comm_share"] == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_the_parts_add_up_to_the_step_within_rounding(seed):
    """The report's arithmetic: whatever the steps, compute + data wait + communication wait
    is the mean step to the last digit rounding can move (three parts rounded to 1e-6)."""
    rng = random.Random(seed)
    steps = []
    for _ in range(rng.randint(1, 400)):
        total = rng.lognormvariate(-2, 1)
        comm = total * rng.random() * 0.9
        steps.append(StepTimes(total, comm, (total - comm) * rng.random() * 0.3))
    parts = split(steps)
    assert parts["compute_s"] + parts["data_wait_s"] + parts["comm_wait_s"] == \
        pytest.approx(parts["step_s"], abs=2e-6)
    assert parts["step_s"] == pytest.approx(statistics.fmean(s.step_time_s for s in steps),
                                            abs=1e-6)
    assert parts["comm_share"] == pytest.approx(parts["comm_wait_s"] / parts["step_s"],
                                                abs=1e-3)
    # Interval means weighted by their steps (how rank_times and the report's fallback
    # combine them) give the same split as all the steps at once.
    cut = len(steps) // 2
    halves = [split(part) for part in (steps[:cut], steps[cut:]) if part]
    combined = split_of_totals(
        sum(h["steps"] for h in halves), *(sum(h[k] * h["steps"] for h in halves)
                                          for k in ("step_s", "data_wait_s", "comm_wait_s")))
    for key in ("step_s", "data_wait_s", "comm_wait_s"):
        assert combined[key] == pytest.approx(parts[key], abs=2e-6)


def test_data_wait_is_the_time_in_the_loaders_next(gloo):
    _, timer = _train("none", timed=True, steps=1)

    def slow():
        time.sleep(0.05)
        yield "batch"

    batches = timer.timed(slow())
    assert next(batches) == "batch"
    step = timer.step_done(1.0)
    assert 0.05 <= step.data_wait_s <= 1.0
    assert timer.step_done(1.0).data_wait_s == 0.0  # counted once, for its own step


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
    assert timer.step_done(0.2) == StepTimes(0.2, 0.0, 0.0)
    timer.close()
    assert timer._handles == []
