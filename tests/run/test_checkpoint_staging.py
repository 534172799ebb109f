"""The asynchronous checkpoint's CPU copy reuses the previous copy's memory: what the writer
gets must still be a snapshot of the state at the save (never the live tensors, never the
previous save's values), whatever changed shape in between."""

from __future__ import annotations

import torch

from train.checkpoint import _cpu_copy


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
    first = _cpu_copy(_state(model, optimizer))
    weight_memory = first["model"]["weight"].data_ptr()
    moment_memory = first["optimizer"]["state"][0]["exp_avg"].data_ptr()

    _train_one_step(model, optimizer)
    second = _cpu_copy(_state(model, optimizer), first)

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
    copy = _cpu_copy(live, previous)
    for key in ("a", "b", "d"):
        assert torch.equal(copy[key], live[key]) and copy[key].dtype == live[key].dtype
        assert copy[key].data_ptr() != live[key].data_ptr()
    assert [t.tolist() for t in copy["c"]] == [[1.0], [1.0]]
    assert previous["a"].tolist() == [0.0, 0.0, 0.0]   # the old one, not resized in place
