"""The asynchronous checkpoint's CPU copy reuses the previous copy's memory: what the writer
gets must still be a snapshot of the state at the save (never the live tensors, never the
previous save's values), whatever changed shape in between, and also when the copy of the
optimizer's tensors is left to the writer thread (train/staging.py). The writer thread
outlives a save that fails, and the step times it keeps stay bounded."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from launch_node import checkpoint_files as files
from train.checkpoint import STEP_SAMPLE, Stats, Writer
from train.staging import Staging, cpu_copy


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _train_one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()


def test_a_second_copy_reuses_the_first_ones_memory_and_holds_the_new_values():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _train_one_step(model, optimizer)
    first = cpu_copy(_state(model, optimizer))
    weight_memory = first["model"]["weight"].data_ptr()
    moment_memory = first["optimizer"]["state"][0]["exp_avg"].data_ptr()

    _train_one_step(model, optimizer)
    second = cpu_copy(_state(model, optimizer), first)

    assert second["model"]["weight"].data_ptr() == weight_memory
    assert second["optimizer"]["state"][0]["exp_avg"].data_ptr() == moment_memory
    assert torch.equal(second["model"]["weight"], model.weight.detach())
    assert torch.equal(second["optimizer"]["state"][0]["exp_avg"],
                       optimizer.state[model.weight]["exp_avg"])
    # A snapshot: training on does not reach into it.
    before = second["model"]["weight"].clone()
    _train_one_step(model, optimizer)
    assert torch.equal(second["model"]["weight"], before)
    assert not torch.equal(second["model"]["weight"], model.weight.detach())
    assert second["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]


def test_what_changed_shape_or_type_gets_new_memory():
    previous = {"a": torch.zeros(3), "b": torch.zeros(2, dtype=torch.float64),
                "c": [torch.zeros(1)]}
    live = {"a": torch.ones(4), "b": torch.ones(2, dtype=torch.float32),
            "c": [torch.ones(1), torch.ones(1)], "d": torch.ones(2)}
    copy = cpu_copy(live, previous)
    for key in ("a", "b", "d"):
        assert torch.equal(copy[key], live[key]) and copy[key].dtype == live[key].dtype
        assert copy[key].data_ptr() != live[key].data_ptr()
    assert [t.tolist() for t in copy["c"]] == [[1.0], [1.0]]
    assert previous["a"].tolist() == [0.0, 0.0, 0.0]   # the old one, not resized in place


# ---- the deferred copy and its fence (train/staging.py) ---------------------------------


class _WithBuffer(torch.nn.Module):
    """A layer and a buffer that changes outside optimizer.step (as DDP's broadcast of
    buffers does in every forward)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 3)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        self.seen += 1
        return self.layer(x)


def _late(copy, delay_s: float = 0.3) -> threading.Thread:
    """The writer thread, slow to start: whatever training does first meets the fence."""
    def run():
        time.sleep(delay_s)
        copy.run()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _trained():
    torch.manual_seed(0)
    model = _WithBuffer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()
    return model, optimizer


def _snapshot(model, optimizer) -> dict:
    return copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_the_next_step_waits_for_the_deferred_copy_which_holds_the_saved_values():
    model, optimizer = _trained()
    at_save = _snapshot(model, optimizer)
    waits, writers = [], []
    # The writer starts its (slow) copy only when the next step begins, before the fence
    # (hooks run in the order they were registered): the step always meets an unfinished copy,
    # however long forward and backward take on a busy machine.
    optimizer.register_step_pre_hook(lambda *_: writers.append(_late(deferred)))
    staging = Staging(waits.append)
    state, deferred = staging.take(model, optimizer)
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()    # the next step's forward and backward
    optimizer.step()                                    # waits for the copy: the fence
    writers[0].join()
    assert len(waits) == 1 and waits[0] > 0
    assert _equal(state, at_save)
    assert not torch.equal(state["model"]["layer.weight"], model.layer.weight.detach())
    assert state["model"]["seen"].item() == 1 and model.seen.item() == 2


def test_a_load_state_dict_waits_for_the_deferred_copy_too():
    """comm_hook auto's trial puts a snapshot back with load_state_dict, right after a save."""
    model, optimizer = _trained()
    other_model, other_optimizer = _trained()
    with torch.no_grad():
        for p in other_model.parameters():
            p.add_(1.0)
    at_save = _snapshot(model, optimizer)
    waits, writers = [], []
    # As in the step's test: the writer starts when the load begins, before the fence's hook.
    model.register_load_state_dict_pre_hook(lambda *_: writers.append(_late(deferred)))
    staging = Staging(waits.append)
    state, deferred = staging.take(model, optimizer)
    model.load_state_dict(other_model.state_dict())
    optimizer.load_state_dict(other_optimizer.state_dict())
    writers[0].join()
    assert len(waits) == 1 and waits[0] > 0
    assert _equal(state, at_save)


def test_the_second_save_reuses_the_first_ones_memory_and_holds_its_own_values():
    model, optimizer = _trained()
    staging = Staging(lambda s: None)
    first, deferred = staging.take(model, optimizer)
    deferred.run()
    weight = first["model"]["layer.weight"].data_ptr()
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()
    at_save = _snapshot(model, optimizer)
    second, deferred = staging.take(model, optimizer)
    deferred.run()
    assert second["model"]["layer.weight"].data_ptr() == weight
    assert _equal(second, at_save)


# ---- the copy plan: later saves copy by the first one's plan (train/staging.py CopyPlan) --


def _step(model, optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()


def test_every_later_save_holds_the_state_at_its_own_step_in_the_first_saves_memory():
    model, optimizer = _trained()
    staging = Staging(lambda s: None)
    first, deferred = staging.take(model, optimizer)
    deferred.run()
    memory = {name: t.data_ptr() for name, t in first["model"].items()}
    for _ in range(3):
        _step(model, optimizer)
        optimizer.param_groups[0]["lr"] *= 0.5     # the schedule: param_groups change too
        at_save = _snapshot(model, optimizer)
        state, deferred = staging.take(model, optimizer)
        writer = _late(deferred, 0.05)               # the writer copies while the next step
        _step(model, optimizer)                      # waits at the fence
        writer.join()
        assert _equal(state, at_save)
        assert {name: t.data_ptr() for name, t in state["model"].items()} == memory
        assert not torch.equal(state["model"]["layer.weight"], model.layer.weight.detach())


def test_a_save_after_the_optimizers_state_was_loaded_holds_the_loaded_values():
    """load_state_dict gives the optimizer new tensors: a save must copy those, not the
    tensors the previous save read (which no longer are the optimizer's)."""
    model, optimizer = _trained()
    staging = Staging(lambda s: None)
    staging.take(model, optimizer)[1].run()
    other_model, other_optimizer = _trained()
    for _ in range(3):
        _step(other_model, other_optimizer)
    model.load_state_dict(other_model.state_dict())
    optimizer.load_state_dict(other_optimizer.state_dict())
    at_save = _snapshot(model, optimizer)
    state, deferred = staging.take(model, optimizer)
    deferred.run()
    assert _equal(state, at_save)
    assert _equal(state["optimizer"]["state"], other_optimizer.state_dict()["state"])


def test_a_save_after_a_parameter_got_new_data_or_a_new_shape_holds_it():
    model, optimizer = _trained()
    staging = Staging(lambda s: None)
    staging.take(model, optimizer)[1].run()
    with torch.no_grad():
        model.layer.bias.data = torch.full((3,), 7.0)     # the same Parameter, new storage
        model.seen.resize_(2).fill_(5.0)                  # a buffer resized in place
    at_save = _snapshot(model, optimizer)
    state, deferred = staging.take(model, optimizer)
    deferred.run()
    assert _equal(state, at_save)
    assert state["model"]["layer.bias"].tolist() == [7.0] * 3
    assert state["model"]["seen"].tolist() == [5.0, 5.0]


def test_a_save_after_the_optimizer_made_its_state_holds_it():
    """A save before the first step (no AdamW moments yet), then one after."""
    torch.manual_seed(0)
    model = _WithBuffer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    staging = Staging(lambda s: None)
    first, deferred = staging.take(model, optimizer)
    deferred.run()
    assert first["optimizer"]["state"] == {}
    _step(model, optimizer)
    at_save = _snapshot(model, optimizer)
    state, deferred = staging.take(model, optimizer)
    deferred.run()
    assert _equal(state, at_save) and state["optimizer"]["state"]


# ---- the writer thread -------------------------------------------------------------------


def test_a_save_that_fails_in_the_writer_thread_is_reported_and_the_next_one_is_written(
        tmp_path, capsys):
    stats = Stats()
    writer = Writer(tmp_path, keep=2, asynchronous=True, stats=stats)

    def broken():
        raise RuntimeError("the copy failed")

    writer.submit({"w": torch.ones(2)}, {"step": 10}, broken)
    writer.wait()
    assert stats.failures == ["checkpoint at step 10 not written: the copy failed"]
    assert "RuntimeError: the copy failed" in capsys.readouterr().err
    writer.submit({"w": torch.ones(2)}, {"step": 20})
    writer.wait()
    assert [c.step for c in files.complete(tmp_path)] == [20]
    assert torch.equal(torch.load(files.latest(tmp_path).state, weights_only=True)["w"],
                       torch.ones(2))


def test_the_step_times_kept_stay_bounded_and_the_whole_cost_counts_every_step():
    """The keeper times every step; a run of millions must not grow its memory with them. The
    medians come from the last STEP_SAMPLE steps, the whole cost from every overlapped step."""
    stats = Stats(saves=2)
    for _ in range(STEP_SAMPLE * 3):
        stats.step_timed(0.1, writing=False)
    for _ in range(STEP_SAMPLE + 10):   # every overlapped step 0.05 s slower
        stats.step_timed(0.15, writing=True)
    assert len(stats.steps_clear) == len(stats.steps_writing) == STEP_SAMPLE
    out = stats.to_json()
    assert out["steps_while_writing"] == STEP_SAMPLE + 10
    assert out["step_s_otherwise"] == 0.1 and out["step_s_while_writing"] == 0.15
    assert out["cost_s_per_save"] == pytest.approx(0.05 * (STEP_SAMPLE + 10) / 2)
