"""`launch check` on this machine, and the errors bad input gets."""

from __future__ import annotations

import json
import shutil

import pytest

from launcher.check.health import GPU_COLUMNS

HAS_GPU = shutil.which("nvidia-smi") is not None


def test_local_check_prints_the_table(run_launch):
    proc = run_launch("check", "--local", "--min-free-gb", "0", timeout=120)
    header, row = proc.stdout.splitlines()[:2]
    assert header.split() == ["host", "reach", "gpus", "ecc", "remap", "reset", "throttle",
                              "persist", "xid", "nvlink", "fabric", "efa", "memlock", "iface",
                              "clock", "versions", "disk"]
    cells = dict(zip(header.split(), row.split()))
    assert cells["host"] == "local" and cells["reach"] == "ok"
    assert cells["versions"] == "ok" and cells["iface"] == "ok"
    if not HAS_GPU:
        assert all(cells[c] == "skip" for c in ("gpus", *GPU_COLUMNS))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("launch check: 1 host(s)")


def test_local_check_json(run_launch):
    proc = run_launch("check", "--local", "--json", "--min-free-gb", "0", timeout=120)
    doc = json.loads(proc.stdout)
    [host] = doc["hosts"]
    assert host["name"] == "local"
    assert host["checks"]["iface"]["evidence"].startswith("lo holds 127.0.0.1")
    if not HAS_GPU:
        assert host["checks"]["gpus"] == {
            "name": "gpus", "status": "skipped",
            "evidence": "no GPU: nvidia-smi is not installed (no NVIDIA driver)"}
        assert doc["failed_hosts"] == [] and proc.returncode == 0


@pytest.mark.parametrize("args, message", [
    (("check", "--min-busbw", "1"), "--min-busbw is the floor of the collective gate"),
    (("check", "--collective", "--min-busbw", "0"), "--min-busbw must be a bandwidth above 0"),
    (("check", "-i", "nowhere.yml"), "nowhere.yml: cannot read the inventory"),
    (("run", "vit-tiny-local", "--exclude-bad"), "--exclude-bad leaves out the nodes the "
                                                 "collective gate names: give --gate too"),
])
def test_bad_input_is_exit_2_with_a_message(run_launch, args, message):
    proc = run_launch(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_run_gate_dry_run_says_the_gate_would_run(run_launch):
    proc = run_launch("run", "vit-tiny-local", "--local", "--gate", "--dry-run", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "a real run first runs the collective gate on node0, node1" in proc.stderr


@pytest.mark.slow
def test_local_collective_gate_adds_its_columns(run_launch):
    proc = run_launch("check", "--local", "--collective", "--min-free-gb", "0", timeout=300)
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("host "))
    header, row = lines[at:at + 2]
    cells = dict(zip(header.split(), row.split()))
    # Two node agents on one machine: no floor and two nodes, nothing to judge them by.
    assert cells["busbw"] == "skip" and cells["transport"] == "ok", proc.stdout + proc.stderr
    assert "launch: gate: all-reduce of 1048576 B over 2 node(s)" in proc.stdout
