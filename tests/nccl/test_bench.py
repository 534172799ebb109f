"""`launch bench`: sizes, the program and commands it plans, the sweep's correctness check, and
a real two-node gloo sweep whose printed table `launch inspect` reads back."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from launcher.nccl.sweep import (BenchError, bench_args, mpirun_argv, nccl_tests_argv,
                                 parse_size, results_table, sweep_sizes)
from launcher.job.runplan import Placement, workload_program
from launcher.job.spec import workload
from launcher.nccl.busbw import bus_bandwidth
from launcher.nccl.nccl_tests import parse_nccl_tests
from launch_bench import bench as sweep


@pytest.mark.parametrize("text, size", [
    ("8", 8), ("1K", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("2g", 2 << 30),
    ("512KiB", 512 << 10), ("16MB", 16 << 20),
])
def test_parse_size(text, size):
    assert parse_size(text, "--max-bytes") == size


@pytest.mark.parametrize("text", ["", "1.5G", "-8", "64X", "0"])
def test_parse_size_refuses(text):
    with pytest.raises(BenchError, match="--max-bytes"):
        parse_size(text, "--max-bytes")


def test_sweep_doubles_like_nccl_tests():
    assert sweep_sizes(8, 128) == [8, 16, 32, 64, 128]
    assert sweep_sizes(1000, 5000) == [1000, 2000, 4000]
    with pytest.raises(BenchError, match="--min-bytes 64 is larger than --max-bytes 8"):
        sweep_sizes(64, 8)


def test_program_is_train_bench_with_the_sweep():
    place = Placement(python="python3", code_dir="/opt/code", run_dir="/runs/b/node1")
    job = workload("launch_bench/bench.py", *bench_args("all_gather", [8, 16], "bfloat16", 5, 20))
    assert workload_program(job)(place) == [
        "/opt/code/launch_bench/bench.py", "--op", "all_gather", "--sizes", "8,16", "--dtype",
        "bfloat16", "--warmup-iters", "5", "--iters", "20", "--out-dir", "/runs/b/node1"]


def test_nccl_tests_commands():
    test = nccl_tests_argv("/opt/launch/nccl-tests/bin/all_reduce_perf", min_bytes=8,
                           max_bytes=1 << 30, dtype="float", warmup_iters=5, iters=20, gpus=8)
    assert test == ["/opt/launch/nccl-tests/bin/all_reduce_perf", "-b", "8", "-e", "1073741824",
                    "-f", "2", "-d", "float", "-w", "5", "-n", "20", "-c", "1", "-g", "8"]
    assert mpirun_argv("/opt/amazon/openmpi", "/tmp/h", 2, 8,
                       {"NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa"}, test) == [
        "/opt/amazon/openmpi/bin/mpirun", "--allow-run-as-root", "--prefix", "/opt/amazon/openmpi",
        "--hostfile", "/tmp/h", "-np", "16", "--map-by", "ppr:8:node", "--bind-to", "none",
        "--mca", "pml", "^cm,ucx", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_exclude", "lo,docker0",
        "-x", "NCCL_DEBUG=INFO", "-x", "FI_PROVIDER=efa", *test[:-1], "1"]


RESULTS = {
    "op": "all_reduce", "dtype": "float", "world_size": 2, "backend": "gloo",
    "warmup_iters": 5, "iters": 20, "nccl_version": None,
    "ranks": [{"node": "node0", "hostname": "vm", "pid": 11, "device": 0, "bus_id": "cpu",
               "gpu": "cpu (gloo)"},
              {"node": "node1", "hostname": "vm", "pid": 12, "device": 0, "bus_id": "cpu",
               "gpu": "cpu (gloo)"}],
    "rows": [{"size": 1048576, "count": 262144, "out_of_place": None,
              "in_place": {"time_s": 0.0025, "wrong": 0}},
             {"size": 2097152, "count": 524288, "out_of_place": None,
              "in_place": {"time_s": 0.004, "wrong": 3}}],
}


def test_results_print_as_nccl_tests_rows_with_its_formulas():
    text = results_table(RESULTS, "launch bench test")
    lines = text.splitlines()
    assert lines[0] == "# launch bench test"
    assert "#  Rank  1 Group  0 Pid     12 on      node1 device  0 [cpu] cpu (gloo)" in lines
    # 1 MiB in 2.5 ms: algbw 0.42 GB/s, busbw x 2(n-1)/n = 1 for two ranks; out-of-place N/A.
    assert ("     1048576        262144     float     sum      -1      N/A     N/A     N/A    "
            "N/A  2500.00    0.42    0.42       0") in lines
    assert "# Out of bounds values : 3 FAILED" in lines
    run = parse_nccl_tests(text, "table")
    assert (run.collective, run.ranks, run.hosts, run.wrong_total) == \
        ("all_reduce", 2, ["node0", "node1"], 3)
    assert run.rows[1].in_place.busbw == round(bus_bandwidth("all_reduce", 2097152, 0.004, 2), 2)


@pytest.mark.parametrize("op", sweep.OPS)
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_the_sweep_checks_results_exactly(op, world):
    """What every rank sends, combined as the collective does, is what the check expects; a
    result missing one rank's contribution is counted wrong."""
    count = 12
    sent = [sweep.init_pattern(op, r, world, count * world if op == "reduce_scatter" else count,
                               torch.bfloat16, "cpu") for r in range(world)]
    if op == "all_reduce":
        results = [sum(sent)] * world
    elif op == "reduce_scatter":
        results = [sum(sent)[r * count:(r + 1) * count] for r in range(world)]
    elif op == "all_gather":
        results = [torch.cat(sent)] * world
    else:
        results = [sent[0]] * world
    for rank in range(world):
        want = sweep.expected(op, rank, world, count, torch.bfloat16, "cpu")
        assert torch.equal(results[rank], want)
        assert not (want == 0).any()  # a cleared buffer never passes the check
    if world > 1 and op in ("all_reduce", "all_gather"):
        lost_rank0 = (sum(sent[1:]) if op == "all_reduce"
                      else torch.cat([torch.zeros_like(sent[0]), *sent[1:]]))
        # rank 0 adds to every world-th element of a sum, and owns count elements of a gather
        lost = len(range(0, count, world)) if op == "all_reduce" else count
        assert int((lost_rank0 != results[0]).sum()) == lost


def test_nccl_tests_not_installed_says_so(run_launch, tmp_path):
    proc = run_launch("bench", "--local", "--nccl-tests", "--nccl-tests-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"launch: error: nccl-tests are not installed on this "
                                  f"machine: no executable {tmp_path}/all_reduce_perf.")
    assert not (tmp_path / "runs").exists()


def test_nccl_tests_output_is_parsed_and_saved(run_launch, tmp_path, data_dir):
    """A stand-in for the nccl-tests binary prints a recorded p4d run and keeps its argv."""
    fake = tmp_path / "bin" / "all_reduce_perf"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {data_dir}/ar_current_p4d.txt\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    proc = run_launch("bench", "--local", "--nccl-tests", "--nccl-tests-dir", str(fake.parent),
                      "--instance-type", "p4d.24xlarge", "--max-bytes", "2G", "--run-id", "nt",
                      check=True)
    assert (tmp_path / "argv").read_text().split()[:10] == [
        "-b", "8", "-e", str(2 << 30), "-f", "2", "-d", "float", "-w", "5"]
    run = tmp_path / "runs" / "nt"
    doc = json.loads((run / "bandwidth.json").read_text())
    recorded = json.loads((data_dir / "ar_current_p4d.json").read_text())
    assert {k: doc[k] for k in recorded} == recorded
    assert doc["link_peak"] == {"gbps": 300.0,
                                "label": "p4d.24xlarge NVLink3 300 GB/s per GPU"}
    assert (doc["compared"]["figure"], doc["compared"]["ratio"]) == \
        ("busbw", round(237.31 / 300, 4))
    assert ("launch: peak bus bandwidth 237.31 GB/s at 2 GiB = 79% of p4d.24xlarge NVLink3 "
            "300 GB/s per GPU (one node: busbw is nccl-tests' figure for a GPU link)"
            ) in proc.stdout
    compared = json.loads((run / "report.json").read_text())["bandwidth"]["compared"]
    assert (compared["figure"], compared["ratio"]) == ("busbw", 0.791)


def test_bad_sizes_stop_before_anything_runs(run_launch, tmp_path):
    proc = run_launch("bench", "--local", "--min-bytes", "1G", "--max-bytes", "1M")
    assert proc.returncode == 2
    assert "--min-bytes 1073741824 is larger than --max-bytes 1048576" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_plans_the_sweep_through_torchrun(run_launch, tmp_path, repo_root):
    proc = run_launch("bench", "--local", "--nodes", "2", "--max-bytes", "64", "--dry-run",
                      "--json", "--run-id", "plan", check=True)
    plan = json.loads(proc.stdout)
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1"]
    for node in plan["nodes"]:
        argv = node["argv"]
        assert argv[1:3] == ["-m", "torch.distributed.run"]
        start = argv.index(f"{repo_root}/launch_bench/bench.py")
        assert argv[start + 1:] == ["--op", "all_reduce", "--sizes", "8,16,32,64", "--dtype",
                                    "float", "--warmup-iters", "5", "--iters", "20",
                                    "--out-dir", str(tmp_path / "runs" / "plan" / node["name"])]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_real_two_node_sweep_on_gloo(run_launch, tmp_path):
    proc = run_launch("bench", "--local", "--nodes", "2", "--op", "all_reduce",
                      "--max-bytes", "256K", "--warmup-iters", "1", "--iters", "3",
                      "--run-id", "b", timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs" / "b"
    # The table as printed, node lines and all, reads back as nccl-tests output ...
    printed = parse_nccl_tests(proc.stdout, "stdout")
    sizes = [8 << i for i in range(16)]  # 8 B .. 256 KiB
    assert [r.size for r in printed.rows] == sizes
    assert [r.count for r in printed.rows] == [s // 4 for s in sizes]
    assert printed.hosts == ["node0", "node1"] and printed.wrong_total == 0
    for row in printed.rows:
        assert row.out_of_place.busbw is None  # torch's all_reduce works in place only
        side = row.in_place
        # ... and its busbw is nccl-tests' formula applied to its own size and time column.
        assert side.busbw == pytest.approx(
            bus_bandwidth("all_reduce", row.size, side.time_us / 1e6, 2), abs=0.006)
    # ... and the saved files say the same.
    doc = json.loads((run / "bandwidth.json").read_text())
    assert doc["rows"] == [r.to_json() for r in printed.rows]
    assert (doc["kind"], doc["backend"], doc["nnodes"], doc["link_peak"]) == \
        ("nccl-tests", "gloo", 2, None)
    assert (run / "bandwidth.txt").read_text() in proc.stdout
    png = (run / "bandwidth.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    inspected = run_launch("inspect", "--json", str(run / "bandwidth.txt"), check=True)
    assert json.loads(inspected.stdout)["rows"] == doc["rows"]
    report = json.loads((run / "report.json").read_text())
    assert (report["workload"], report["backend"], report["bandwidth"]["source"]) == \
        ("bench", "gloo", "bandwidth.json")
