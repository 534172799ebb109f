"""The run report, from fixture run folders (exact report.json) and from a real `--local` run."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from launcher.report.build import (RED, RESET, ReportError, build_report, job_folder_lines,
                                   print_run_report, render_markdown, write_run_report)
from tests.nccl.runfolders import build_runs
from tests.run.conftest import write_recipe

RUNS = ["p4d-socket", "p4d-efa", "g6e-single", "bench-sock"]  # bench-tree: its own test


@pytest.fixture
def runs(tmp_path, data_dir):
    return build_runs(data_dir, tmp_path)


@pytest.mark.parametrize("name", RUNS)
def test_report_json_is_exactly_the_expected(runs, data_dir, name):
    folder, facts = runs
    expected = json.loads((data_dir / f"report_{name}.json").read_text())
    assert build_report(folder / name, facts_from=[facts]) == expected


def test_efa_expected_but_sockets_used_is_a_warning_and_red_on_a_terminal(runs):
    folder, facts = runs
    report = build_report(folder / "p4d-socket", facts_from=[facts])
    warning = "p4d-a: p4d.24xlarge has 4 EFA interfaces but NCCL used NET/Socket"
    assert warning in report["warnings"]
    assert f"- warning: {warning}\n" in render_markdown(report)
    assert f"{RED}- warning: {warning}{RESET}\n" in render_markdown(report, color=True)
    assert RED not in render_markdown(report)


def test_markdown_states_wiring_bandwidth_and_comm_share(runs):
    folder, facts = runs
    text = render_markdown(build_report(folder / "p4d-socket", facts_from=[facts]))
    assert ("| p4d-a | p4d.24xlarge | 8 | nvswitch, worst link NV12 (p4d-a/topology.txt) | "
            "2.21.5 | Socket; NET/Socket x4 | 4 / no |") in text
    # Two nodes: what crosses each node's network is compared with its rate, and said so.
    assert ("reduce_scatter: algbw x 0.5 4.58 GB/s at 256 MiB = 9% of the catalog's "
            "p4d.24xlarge network 4x 100 Gigabit = 50 GB/s per node (across 2 nodes each node's "
            "network carries at least reduce_scatter's algbw x 0.5 whatever algorithm NCCL "
            "picks; busbw assumes one ring of all ranks); peak busbw 8.02 GB/s; from "
            "../bench-sock/bandwidth.json.") in text
    # The median step behind images/s, and the mean step beside the parts that add up to it.
    assert "1871.8 images/s (median step 0.4103 s), from p4d-a/result.json." in text
    assert ("A step takes 0.4167 s on average = 0.2458 s compute + 0.0000 s data wait + 0.1709 s "
            "waiting on communication (means over 197 steps): 41% of step time waits on "
            "communication (comm hook none).") in text


SPLIT_LINE = re.compile(r"A step takes ([\d.]+) s on average = ([\d.]+) s compute \+ ([\d.]+) s "
                        r"data wait \+ ([\d.]+) s waiting on communication")
RANK_PART = re.compile(r"rank \d+ ([\d.]+) s = ([\d.]+) \+ ([\d.]+) \+ ([\d.]+) s")


def adds_up(whole: str, *parts: str) -> bool:
    """Four decimals each: the printed parts may miss the printed whole by three half-units."""
    return abs(sum(map(float, parts)) - float(whole)) <= 1.5e-4 + 1e-12


@pytest.mark.parametrize("name", ["p4d-socket", "p4d-efa", "g6e-single"])
def test_the_printed_step_split_adds_up(runs, name):
    """report.md once printed "0.1645 s per step" beside "0.0366 s waiting and 0.1638 s the
    rest": a median beside means. Every split it prints now adds up to the step beside it."""
    folder, facts = runs
    text = render_markdown(build_report(folder / name, facts_from=[facts]))
    [whole] = SPLIT_LINE.findall(text)
    assert adds_up(*whole)


def test_two_node_bench_compares_algbw_with_the_network_and_says_so(runs):
    """nccl #527's numbers: busbw 57.2 GB/s on two p4d nodes whose network carries 50 GB/s.
    Each node's network carries algbw of an all_reduce on 2 nodes, whatever the algorithm:
    30.51 GB/s = 61% of the line rate, which is what the report compares."""
    folder, facts = runs
    report = build_report(folder / "bench-tree", facts_from=[facts])
    compared = report["bandwidth"]["compared"]
    assert (compared["figure"], compared["measured"], compared["size"]) == \
        ("algbw", 30.51, 1 << 30)
    assert compared["link_peak"] == {
        "gbps": 50.0, "label": "p4d.24xlarge network 4x 100 Gigabit = 50 GB/s per node"}
    assert (compared["ratio"], compared["busbw"], compared["above_line_rate"]) == \
        (0.6102, 57.2, True)
    assert report["warnings"] == []  # busbw above the wire is no fault of the links
    text = render_markdown(report)
    assert ("all_reduce: algbw 30.51 GB/s at 1 GiB = 61% of the catalog's p4d.24xlarge network "
            "4x 100 Gigabit = 50 GB/s per node (across 2 nodes each node's network carries at "
            "least all_reduce's algbw whatever algorithm NCCL picks; busbw assumes one ring of "
            "all ranks); peak busbw 57.20 GB/s, above the network's line rate: NCCL's tree "
            "algorithm sends less across nodes than busbw assumes (NCCL_ALGO=Ring measures the "
            "ring); from bandwidth.json.") in text


def test_an_explicit_bench_replaces_the_sibling_search(runs):
    folder, facts = runs
    report = build_report(folder / "p4d-efa", facts_from=[facts],
                          bench=folder / "bench-sock" / "bandwidth.json")
    assert report["bandwidth"]["source"] == "../bench-sock/bandwidth.json"
    assert report["bandwidth"]["compared"]["ratio"] == 0.0916


def test_an_all_reduce_bench_is_preferred_to_a_newer_one_of_another_collective(runs):
    folder, facts = runs
    shutil.copytree(folder / "bench-sock", folder / "bench-bcast")
    older = folder / "bench-sock" / "bandwidth.json"
    newer = folder / "bench-bcast" / "bandwidth.json"

    def benches(old_collective, new_collective):
        for path, collective, mtime in ((older, old_collective, 1000),
                                        (newer, new_collective, 2000)):
            path.write_text(json.dumps({**json.loads(path.read_text()), "collective": collective}))
            os.utime(path, (mtime, mtime))
        return build_report(folder / "p4d-socket", facts_from=[facts])["bandwidth"]["source"]

    assert benches("reduce_scatter", "broadcast") == "../bench-bcast/bandwidth.json"  # newest
    assert benches("all_reduce", "broadcast") == "../bench-sock/bandwidth.json"
    assert benches("all_reduce", "all_reduce") == "../bench-bcast/bandwidth.json"


def test_a_bench_on_other_nodes_is_not_quoted(runs):
    folder, facts = runs
    assert build_report(folder / "g6e-single", facts_from=[facts])["bandwidth"] == \
        {"source": None}


def test_unreadable_nccl_log_is_a_warning_not_a_crash(runs):
    folder, facts = runs
    (folder / "g6e-single" / "g6e-box" / "nccl-debug.g6e-box.7.log").write_text("hello\n")
    report = build_report(folder / "g6e-single", facts_from=[facts])
    assert report["nodes"][0]["nccl"] is None
    assert report["warnings"][0].startswith("g6e-box: NCCL log not read: ")
    assert "not an NCCL_DEBUG=INFO log" in report["warnings"][0]


def test_half_written_result_is_a_warning_not_a_crash(runs):
    folder, facts = runs
    result = folder / "g6e-single" / "g6e-box" / "result.json"
    result.write_text('{"images_per_sec": 71')
    report = build_report(folder / "g6e-single", facts_from=[facts])
    assert report["training"] is None
    assert report["warnings"] == [f"{result}: not valid JSON (Expecting ',' delimiter: line 1 "
                                  "column 22 (char 21)); the run may have been killed while "
                                  "writing it"]
    assert "No training step was logged." in render_markdown(report)


def test_not_a_run_folder(tmp_path):
    with pytest.raises(ReportError, match="no plan.json, so not a run folder"):
        build_report(tmp_path)


def test_after_a_run_the_warnings_and_advice_are_printed(runs, tmp_path, monkeypatch, capsys):
    folder, _ = runs
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "empty-home"))
    print_run_report(folder / "p4d-socket")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"launch: report in {folder / 'p4d-socket' / 'report.md'}; with plots: "
                      f"{folder / 'p4d-socket' / 'report.html'}")
    assert "launch: warning: p4d-b: p4d.24xlarge has 4 EFA interfaces but NCCL used " \
           "NET/Socket" in out
    assert out[-1].startswith("launch: advice: 41% of each step (0.1709 s of 0.4167 s, mean of "
                              "197 steps) waits on communication over TCP between hosts: set "
                              "ddp.comm_hook: auto and ddp.bucket_cap_mb: auto; launch's "
                              "benchmark measured")
    assert (folder / "p4d-socket" / "report.json").exists()


def test_launch_report_cli_regenerates_and_prints(run_launch, runs):
    folder, _ = runs
    proc = run_launch("report", str(folder / "g6e-single"), check=True)
    assert proc.stdout == (folder / "g6e-single" / "report.md").read_text()
    assert "| g6e-box | g6e.12xlarge | 4 | pcie, worst link SYS" in proc.stdout
    as_json = run_launch("report", "--json", str(folder / "g6e-single"), check=True)
    assert json.loads(as_json.stdout) == json.loads(
        (folder / "g6e-single" / "report.json").read_text())


def test_launch_report_cli_on_a_folder_that_is_no_run(run_launch, tmp_path):
    proc = run_launch("report", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == (f"launch: error: {tmp_path}: no plan.json, so not a run folder "
                           "launch wrote; pass runs/<run_id>\n")


@pytest.mark.slow
def test_report_of_a_real_local_run(run_launch, tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path, train={"steps": 8, "log_every": 4},
                          ddp={"comm_hook": "fp16"})
    proc = run_launch("run", "--local", "--nodes", "2", str(recipe), "--run-id", "real",
                      timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "real"
    assert f"launch: report in {run / 'report.md'}" in proc.stdout
    report = json.loads((run / "report.json").read_text())
    assert (report["run_id"], report["status"], report["workload"], report["backend"]) == \
        ("real", "succeeded", "train", "gloo")
    for node in report["nodes"]:
        # No NCCL on a CPU run: said plainly, not a crash or an empty cell.
        assert node["nccl"] is None and node["interconnect"] is None
        assert node["efa"] == {"expected": None, "used": None, "nics": None}
    assert report["bandwidth"] == {"source": None}
    training = report["training"]
    rank0 = json.loads((run / "summary.json").read_text())["rank0_node"]
    assert training["source"] == f"{rank0}/result.json"
    assert training["comm_hook"] == "fp16" and report["link"] == "one machine"
    split = training["split"]
    assert 0.0 <= split["comm_share"] <= 1.0 and split["steps"] == 5   # 8 steps, 3 warm-up
    assert split["comm_wait_s"] >= 0 and split["compute_s"] > 0
    assert split["compute_s"] + split["data_wait_s"] + split["comm_wait_s"] == \
        pytest.approx(split["step_s"], abs=2e-6)
    text = (run / "report.md").read_text()
    assert "| node0 | unknown | 0 | none: CPU node | not used (gloo) | gloo over TCP (lo) | n/a |" \
        in text
    # The mean step and its parts, for the run and for each rank, add up as printed.
    [whole] = SPLIT_LINE.findall(text)
    assert adds_up(*whole)
    ranks = RANK_PART.findall(text)
    assert len(ranks) == 2 and all(adds_up(*r) for r in ranks)
    # Every logged step carries the trainer's split of its interval.
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [4, 8]
    for m in metrics:
        part = m["split"]
        assert part["steps"] == 4 and part["step_s"] == pytest.approx(m["step_time_s"], abs=2e-6)
        assert part["compute_s"] + part["data_wait_s"] + part["comm_wait_s"] == \
            pytest.approx(part["step_s"], abs=2e-6)
        assert part["comm_share"] == pytest.approx(part["comm_wait_s"] / part["step_s"],
                                                   abs=1e-4)
    # `launch report` rewrites the same report from the folder.
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "launch-home"))
    before = (run / "report.json").read_text()
    (run / "report.json").unlink()
    shutil.rmtree(run / "node0" / "torchrun")  # logs the report does not read
    write_run_report(run)
    assert json.loads((run / "report.json").read_text()) == json.loads(before)


def test_the_job_folders_are_a_line_per_node_up_to_the_screen_limit_then_one(tmp_path):
    few = {f"node{i}": f"/w/copy.runs/r.u/node{i}" for i in range(8)}
    fetch = (f"launch: what the job wrote there comes here with `launch fetch {tmp_path.name} "
             f"--workdir --runs-dir {tmp_path.parent}` (into {tmp_path}/workdir/NODE/)")
    assert job_folder_lines(few, tmp_path) == [
        *(f"launch: job folder of node{i}: /w/copy.runs/r.u/node{i}" for i in range(8)), fetch]
    many = {f"host{i}": f"/w/copy.runs/r.u/host{i}" for i in range(256)}
    assert job_folder_lines(many, tmp_path) == [
        "launch: job folder of host0: /w/copy.runs/r.u/host0",
        f"launch: the job folders of the other 255 node(s) are in {tmp_path / 'report.md'} (Job)",
        fetch]
    assert job_folder_lines({}, tmp_path) == []
