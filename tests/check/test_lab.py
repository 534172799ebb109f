"""`launch check --collective`, `launch run --gate` and straggler detection on the SSH lab: three
hosts in network namespaces, one link capped with tc, one rank stopped and resumed from outside.

The outcomes do not hang on a measured share: the capped link (10 Mbit/s, 1.25 MB/s) carries a
1 MiB all-reduce at about 0.001 GB/s, uncapped links on this kind of box at 0.2-0.9 GB/s, the
floor sits at 0.02 GB/s between them; the stopped rank is held 70% of the time."""

from __future__ import annotations

import json

import pytest

from tests.run.conftest import (FAST, LaunchProcess, stopped_most_of_the_time, wait_for,
                                write_recipe)
from tests.ssh.conftest import lab_worker_pid

pytestmark = [pytest.mark.slow, pytest.mark.lab]

CAP = "10mbit"
FLOOR = 0.02


def table_rows(stdout: str) -> dict[str, dict[str, str]]:
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("host "))
    header = lines[at].split()
    rows = {}
    for line in lines[at + 1:]:
        if not line.strip() or line.startswith("evidence:"):
            break
        cells = dict(zip(header, line.split()))
        rows[cells["host"]] = cells
    return rows


def test_check_collective_passes_without_the_cap(lab3, run_launch):
    for host in lab3.hosts:
        lab3.uncap(host.name)
    proc = run_launch("check", "-i", str(lab3.inventory), "--collective", "--min-busbw",
                      str(FLOOR), "--min-free-gb", "0", "--rdzv-port", "29631", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    assert {h: r["busbw"] for h, r in rows.items()} == {"host0": "ok", "host1": "ok",
                                                        "host2": "ok"}
    assert {r["transport"] for r in rows.values()} == {"ok"}
    assert "launch: gate: passed" in proc.stdout


def test_check_collective_names_the_capped_host(lab3, run_launch):
    lab3.cap("host1", CAP)
    # No floor: each node is held against the others (three rounds of one pair each).
    proc = run_launch("check", "-i", str(lab3.inventory), "--collective", "--min-free-gb", "0",
                      "--rdzv-port", "29632", timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    assert {h: r["busbw"] for h, r in rows.items()} == {"host0": "ok", "host1": "FAIL",
                                                        "host2": "ok"}
    evidence = [line for line in proc.stdout.splitlines()
                if line.strip().startswith("host1") and " busbw " in line]
    assert evidence and "slow:" in evidence[0] and "with host0" in evidence[0]
    assert proc.stdout.splitlines()[-1] == \
        "launch check: 1 of 3 host(s) failed a check (host1: busbw)"


def _gate_recipe(tmp_path, name: str):
    return write_recipe(tmp_path, name=name, gate={"min_busbw_gbs": FLOOR})


def test_run_gate_refuses_on_the_capped_lab(lab3, run_launch, tmp_path):
    lab3.cap("host1", CAP)
    recipe = _gate_recipe(tmp_path, "gate.yml")
    proc = run_launch("run", str(recipe), "-i", str(lab3.inventory), "--nodes", "3", "--gate",
                      "--run-id", "refused", "--rdzv-port", "29633", timeout=400)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "the collective gate names host1; nothing was started" in proc.stderr
    assert "host1: busbw: slow:" in proc.stderr
    # The gate's folder is kept; the run never started.
    assert (tmp_path / "runs/refused-gate/gate.json").exists()
    assert not (tmp_path / "runs/refused").exists()


def test_run_gate_exclude_bad_runs_on_the_good_hosts_and_names_no_straggler(lab3, run_launch, tmp_path):
    lab3.cap("host1", CAP)
    recipe = _gate_recipe(tmp_path, "spare.yml")
    proc = run_launch("run", str(recipe), "-i", str(lab3.inventory), "--nodes", "2", "--gate",
                      "--exclude-bad", "--run-id", "spared", "--rdzv-port", "29634",
                      timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "launch: gate: leaving out host1; the run uses host0, host2" in proc.stdout
    summary = json.loads((tmp_path / "runs/spared/summary.json").read_text())
    assert summary["status"] == "succeeded"
    assert [n["name"] for n in summary["nodes"]] == ["host0", "host2"]
    # An even run (four log intervals on two healthy hosts) names nobody.
    assert "straggler" not in proc.stdout
    assert summary["stragglers"] == []
    assert sorted(r["node"] for r in summary["rank_times"]) == ["host0", "host2"]
    assert all(r["compute_s"] > 0 for r in summary["rank_times"])


def _progress_seen(run_dir) -> bool:
    return any("step 5/" in log.read_text() for log in run_dir.glob("*/node.log"))


def test_a_rank_slowed_from_outside_is_named(lab3, tmp_path):
    for host in lab3.hosts:
        lab3.uncap(host.name)
    # Batches large enough that each step is mostly compute: a stop lands in the rank's own
    # work (what the watch measures) far more often than in its communication wait. With the
    # FAST recipe's 32 images a step was ~80% communication and a few intervals in three ran
    # got no stop inside compute at all: the rank went unnamed now and then.
    recipe = write_recipe(tmp_path, name="slow.yml", nodes=3,
                          train={**FAST["train"], "batch_size": 256, "steps": 40,
                                 "log_every": 5})
    run = LaunchProcess(["run", str(recipe), "-i", str(lab3.inventory), "--nodes", "3",
                         "--run-id", "slowed", "--rdzv-port", "29635"], tmp_path)
    try:
        run_dir = tmp_path / "runs/slowed"
        wait_for(lambda: _progress_seen(run_dir), 300, "the first progress line")
        worker = wait_for(lambda: lab_worker_pid(lab3, "host2", "slowed"), 60, "host2's rank")
        # Stopped 70% of the time, from the sixth step to the end.
        with stopped_most_of_the_time(worker):
            code = run.wait(timeout=400)
    finally:
        run.kill()
    output = run.output()
    assert code == 0, output[-3000:]
    assert "straggler: node host2 rank" in output
    summary = json.loads((tmp_path / "runs/slowed/summary.json").read_text())
    [slow] = summary["stragglers"]
    assert slow["node"] == "host2" and slow["ratio"] > 1.25 and slow["intervals"] >= 3
    assert sorted(r["node"] for r in summary["rank_times"]) == ["host0", "host1", "host2"]
    report = (tmp_path / "runs/slowed/report.md").read_text()
    assert "Straggler: node host2" in report and "--limit host2`" in report
