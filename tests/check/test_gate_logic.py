"""The pure parts of the collective gate and of straggler detection: which pairs are measured
in which round, who is named, and the lines and summary the trainer writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.check.collective_gate import GateResult, gate_job
from launcher.check.health import FAIL, OK, SKIP
from launcher.core.errors import RecipeError
from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import Placement
from launch_bench.gatesearch import GateSearch
from train.stragglers import StragglerJudge

FAST, SLOW = 10.0, 0.1


def search(n: int, slow: set[str], floor: float | None = None) -> GateSearch:
    """Measure every round the search asks for: a pair is as fast as its slower node."""
    gate = GateSearch([f"h{i}" for i in range(n)], floor=floor)
    while pairs := gate.next_round():
        for a, b in pairs:
            gate.record(a, b, SLOW if a in slow or b in slow else FAST)
    return gate


def test_round_one_pairs_neighbours_round_two_re_pairs():
    gate = search(4, {"h1"})
    assert gate.rounds == [[("h0", "h1"), ("h2", "h3")], [("h0", "h2"), ("h1", "h3")]]
    assert gate.verdict()["bad"] == ["h1"]


@pytest.mark.parametrize("slow", ["h0", "h1", "h2"])
def test_three_nodes_relative_names_any_slow_node(slow):
    gate = search(3, {slow})
    verdict = gate.verdict()
    assert verdict["bad"] == [slow] and verdict["suspects"] == []
    assert verdict["mode"] == "relative" and verdict["bar_gbs"] == pytest.approx(FAST / 2)
    # Three nodes: one pair per round, every node with two partners.
    assert len(gate.rounds) == 3


def test_floor_mode_stops_when_the_slow_node_is_confirmed():
    gate = search(3, {"h1"}, floor=1.0)
    assert gate.rounds == [[("h0", "h1")], [("h2", "h0")]]
    assert gate.verdict()["bad"] == ["h1"]


def test_eight_nodes_two_slow_in_two_rounds():
    gate = search(8, {"h2", "h5"})
    assert len(gate.rounds) == 2
    assert gate.verdict()["bad"] == ["h2", "h5"]


def test_healthy_nodes_are_not_named_and_a_failed_pair_counts_as_slow():
    assert search(5, set()).verdict()["bad"] == []
    gate = GateSearch(["a", "b", "c"], floor=1.0)
    gate.next_round()
    gate.record("a", "b", None)          # the pair's all-reduce failed
    gate.next_round()
    gate.record("c", "a", 5.0)
    assert gate.verdict()["bad"] == ["b"]


def test_two_nodes_cannot_be_told_apart():
    relative = search(2, {"h1"}).verdict()
    assert relative["judged"] is False and relative["bad"] == []
    floor = search(2, {"h1"}, floor=1.0).verdict()
    assert floor["bad"] == [] and floor["suspects"] == ["h0", "h1"]


def _result(verdict: dict, all_busbw: float, pairwise: bool = True) -> GateResult:
    return GateResult(Path("/runs/gate"), ["h0", "h1", "h2"],
                      results={"size": 1 << 20, "pairwise": pairwise, "search": verdict,
                               "all_nodes": {"busbw_gbs": all_busbw}})


def test_gate_columns_name_the_slow_node_with_its_pairs():
    result = _result(search(3, {"h1"}, floor=1.0).verdict(), all_busbw=SLOW)
    checks = result.busbw_checks()
    assert checks["h1"].status == FAIL
    assert checks["h1"].evidence == ("slow: 0.1 GB/s with h0; floor 1 GB/s: this node holds "
                                     "the collective back")
    assert checks["h0"].status == OK and checks["h2"].status == OK
    assert result.bad == ["h1"] and not result.passed


def test_gate_passes_over_the_floor_without_pairs():
    result = _result(GateSearch(["h0", "h1", "h2"], floor=1.0).verdict(), all_busbw=5.0,
                     pairwise=False)
    assert {c.status for c in result.busbw_checks().values()} == {OK}
    assert result.passed


def test_gate_two_nodes_without_floor_is_skipped_not_passed_silently():
    verdict = search(2, set()).verdict()
    result = GateResult(Path("/r"), ["h0", "h1"],
                        results={"size": 1 << 20, "pairwise": False, "search": verdict,
                                 "all_nodes": {"busbw_gbs": 3.0}})
    assert {c.status for c in result.busbw_checks().values()} == {SKIP}


def test_gate_program_is_bench_in_gate_mode():
    from launcher.job.runplan import workload_program

    argv = workload_program(gate_job(1 << 20, 0.02))(Placement(python="python3",
                                                               code_dir="code", run_dir="."))
    assert argv[:2] == ["code/launch_bench/bench.py", "--gate"]
    assert argv[-2:] == ["--out-dir", "."]
    assert argv[argv.index("--sizes") + 1] == "1048576"
    assert argv[argv.index("--floor-gbs") + 1] == "0.02"


def test_recipe_gate_floor_is_validated():
    base = {"name": "r", "train": {"steps": 1}}
    assert recipe_from_mapping({**base, "gate": {"min_busbw_gbs": 0.5}}, "r.yml") \
        .gate.min_busbw_gbs == 0.5
    assert recipe_from_mapping(base, "r.yml").gate.min_busbw_gbs is None
    with pytest.raises(RecipeError, match="gate.min_busbw_gbs"):
        recipe_from_mapping({**base, "gate": {"min_busbw_gbs": -1}}, "r.yml")
    with pytest.raises(RecipeError, match="gate.min_busbw_gbs"):
        recipe_from_mapping({**base, "gate": {"min_busbw_gbs": True}}, "r.yml")


# ----------------------------------------------------------------------------- stragglers

WHERE = [("h0", 0), ("h1", 0), ("h2", 0)]


def rows(slow_busy: float) -> list[tuple[float, float, float, int]]:
    """(compute, data, comm) means of 5 steps per rank; rank 2 computes `slow_busy` s, the
    others 0.1 s."""
    return [(0.1, 0.0, 0.2, 5), (0.1, 0.0, 0.2, 5), (slow_busy, 0.0, 0.05, 5)]


def test_a_rank_slow_for_three_intervals_in_a_row_is_named():
    judge = StragglerJudge(WHERE)
    assert judge.observe(5, rows(0.21)) == [] and judge.observe(10, rows(0.21)) == []
    [line] = judge.observe(15, rows(0.21))
    assert line == ("straggler: node h2 rank 2 (local 0): compute 0.21 s vs median 0.1 s "
                    "(2.1x) for 3 intervals in a row, up to step 15: it holds every step back")
    judge.observe(20, rows(0.3))
    result = judge.result()
    assert result["stragglers"] == [{"node": "h2", "rank": 2, "local_rank": 0,
                                     "ratio": 2.1, "intervals": 4}]
    # Its split, means over its 20 steps: (15 x 0.21 + 5 x 0.3) / 20 = 0.2325 s of compute.
    assert result["rank_times"][2] == {
        "rank": 2, "node": "h2", "local_rank": 0, "statistic": "mean", "steps": 20,
        "step_s": 0.2825, "compute_s": 0.2325, "data_wait_s": 0.0, "comm_wait_s": 0.05,
        "comm_share": 0.177}


def test_an_interrupted_streak_names_nobody():
    judge = StragglerJudge(WHERE)
    for step, busy in ((5, 0.2), (10, 0.2), (15, 0.12), (20, 0.2), (25, 0.2), (30, 0.1)):
        assert judge.observe(step, rows(busy)) == []
    assert judge.result()["stragglers"] == []


def test_data_wait_counts_and_is_said():
    judge = StragglerJudge(WHERE)
    slow = [(0.1, 0.0, 0.2, 5), (0.1, 0.0, 0.2, 5), (0.1, 0.2, 0.0, 5)]
    judge.observe(5, slow)
    judge.observe(10, slow)
    [line] = judge.observe(15, slow)
    assert line.endswith("(0.2 s of it waiting for data)")
