"""The run report's advice (launcher/nccl/advice.py): a change only where launch's benchmark
measured that it helps on the run's kind of link, else what holds the run and why nothing is
advised; the evidence (the step split, auto's trial) in the words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.nccl import advice
from launcher.nccl.advice import (ADVISED, FAST, MEASURED, ONE_MACHINE, ONE_NODE, TCP,
                                  link_kind, training_advice)

REPO = Path(__file__).resolve().parents[2]


def split(share: float, step: float = 0.2, steps: int = 327) -> dict:
    comm = round(share * step, 6)
    return {"statistic": "mean", "steps": steps, "step_s": step, "compute_s": step - comm,
            "data_wait_s": 0.0, "comm_wait_s": comm, "comm_share": share}


@pytest.mark.parametrize("addresses, transports, backend, kind", [
    (["127.0.0.1"], [], "gloo", ONE_NODE),
    (["127.0.0.1", "127.0.0.1"], [], "gloo", ONE_MACHINE),
    (["10.1.0.10", "10.1.0.11"], [], "gloo", TCP),
    (["a", "b"], ["NET/Socket/0", "P2P/IPC"], "nccl", TCP),
    (["a", "b"], ["NET/AWS Libfabric/1/GDRDMA"], "nccl", FAST),
    (["a", "b"], ["NET/IB/0/GDRDMA"], "nccl", FAST),
    (["a", "b"], [], "nccl", None),            # no NCCL log: not known
])
def test_link_kind(addresses, transports, backend, kind):
    assert link_kind(addresses, transports, backend) == kind


def test_compute_dominates_says_so_with_its_numbers():
    [said] = training_advice(split(0.08), "none", None, TCP, False)
    assert said == ("nothing to change: compute dominates: 8% of each step (0.0160 s of 0.2000 s, "
                    "mean of 327 steps) waits on communication; below 15% compression has "
                    "nothing to gain")


def test_on_one_machine_nothing_is_advised_and_the_benchmark_is_quoted():
    """The demo's case: 23% waits on loopback; the advice once said to compress there."""
    [said] = training_advice(split(0.23), "none", None, ONE_MACHINE, False)
    assert said.startswith("nothing to change: 23% of each step (0.0460 s of 0.2000 s, mean of "
                           "327 steps) waits on communication, but over loopback between nodes "
                           "on one machine, not a cluster's links; launch's benchmark measured ")
    assert "on --local, 2 nodes, gloo over loopback" in said
    assert advice.BENCHMARK in said and "set" not in said.split(";")[0]


def test_over_tcp_the_measured_change_is_advised_with_its_evidence():
    assert MEASURED[TCP].helps
    [said] = training_advice(split(0.41), "none", None, TCP, False)
    assert said.startswith(f"41% of each step (0.0820 s of 0.2000 s, mean of 327 steps) waits "
                           f"on communication over TCP between hosts: set {ADVISED}; ")
    assert f"at {MEASURED[TCP].speed:.2f}x the speed" in said and advice.BENCHMARK in said


@pytest.mark.parametrize("kind", [FAST, ONE_NODE, None])
def test_where_nothing_was_measured_nothing_is_advised(kind):
    [said] = training_advice(split(0.3), "none", None, kind, kind == FAST)
    assert said.startswith("no compression advised: 30% of each step")
    assert ADVISED not in said
    assert ("check the transports above" in said) == (kind == FAST)


def test_no_pointer_to_transports_that_were_not_printed():
    [said] = training_advice(split(0.3), "none", None, FAST, False)
    assert "transports" not in said


def test_with_auto_the_advice_carries_the_split_and_the_trial():
    auto = {"choice": "none", "decided_at_step": 30, "reason": "in the trial PowerSGD steps "
            "took 0.115s against 0.089s"}
    [said] = training_advice(split(0.19), "auto", auto, ONE_MACHINE, False)
    assert said == ("nothing to change: 19% of each step (0.0380 s of 0.2000 s, mean of 327 "
                    "steps) waits on communication over loopback between nodes on one machine; "
                    "comm_hook auto kept plain all-reduce after step 30: in the trial PowerSGD "
                    "steps took 0.115s against 0.089s")
    ended = {"choice": "undecided", "decided_at_step": None,
             "reason": "run ended at step 6 during the measurement of plain all-reduce"}
    [said] = training_advice(split(0.19), "auto", ended, TCP, False)
    assert said.endswith("comm_hook auto had no time to decide (run ended at step 6 during the "
                         "measurement of plain all-reduce): give the run more steps")


def test_a_compression_chosen_by_hand_gets_no_unmeasured_advice():
    assert training_advice(split(0.5), "fp16", None, TCP, False) == []
    assert training_advice(None, "none", None, TCP, False) == []


def test_the_measured_table_is_what_the_benchmark_measured():
    """MEASURED quotes benchmarks/results/comm_advice.json: a new measurement that changes
    the claim must change the advice with it."""
    results = json.loads((REPO / "benchmarks/results/comm_advice.json").read_text())
    assert results["advised_ddp"] == advice.ADVISED_DDP
    for regime, kind in (("local", ONE_MACHINE), ("capped", TCP)):
        summary = results["summary"][regime]
        measured = MEASURED[kind]
        assert (measured.pairs, measured.speed, measured.worst_accuracy_points) == \
            (summary["pairs"], summary["speed"], summary["worst_accuracy_points"])
    assert results["link_cap"] in MEASURED[TCP].link


def test_a_measurement_that_shows_no_gain_advises_nothing(monkeypatch):
    """Should a new benchmark find the change no faster on TCP, the advice follows it."""
    monkeypatch.setitem(MEASURED, TCP, advice.Measured("a link", 3, 0.97, 0.0))
    [said] = training_advice(split(0.41), "none", None, TCP, False)
    assert said.startswith("nothing to change: 41% of each step (0.0820 s of 0.2000 s, mean of "
                           "327 steps) waits on communication over TCP between hosts; launch's "
                           "benchmark measured the demo with ddp.comm_hook: auto and "
                           "ddp.bucket_cap_mb: auto at 0.97x the speed")
