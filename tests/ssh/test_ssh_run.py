"""`launch run -i` over real SSH to lab hosts (network namespaces, each with its own sshd)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from launcher.core.node_code import code_files, code_root, content_hash
from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.ssh.conftest import lab_worker_pid, only_sshd_left, run_env_pids

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def test_demo_over_ssh_matches_local_run_and_collects_logs(lab, run_launch, repo_root, tmp_path,
                                                           short_demo):
    recipe, local_proc, local_run = short_demo
    assert local_proc.returncode == 0, local_proc.stdout[-3000:] + local_proc.stderr[-3000:]
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                      "--run-id", "ssh-demo", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs/ssh-demo"
    summary = json.loads((run / "summary.json").read_text())
    local = json.loads((local_run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == local["steps"] > 0
    # Same recipe, seed, world size and threads per rank: the same model, whichever transport.
    assert summary["final_loss"] == pytest.approx(local["final_loss"], rel=1e-5)
    assert summary["eval_accuracy"] == pytest.approx(local["eval_accuracy"], abs=0.01)
    assert [n["name"] for n in summary["nodes"]] == ["host0", "host1"]
    for host in ("host0", "host1"):
        folder = run / host
        log = (folder / "node.log").read_text()
        assert f"{host}/0: rank " in log
        assert f"{host}/0: rank " in proc.stdout  # streamed to the terminal with its prefix
        # Everything the node wrote was fetched: torchrun's per-rank logs, the pgid record,
        # the recipe it ran.
        assert list(folder.glob("torchrun/*/attempt_0/0/stdout.log"))
        assert (folder / "launch.pgid").exists() and (folder / "recipe.yml").exists()
    rank0 = run / summary["rank0_node"]
    assert (rank0 / "result.json").exists() and (run / "metrics.jsonl").exists()
    code = json.loads((run / "code.json").read_text())
    # What every node got is what launch lists, hashed as every backend hashes it.
    files = code_files(code_root())
    assert code == {"sha256": content_hash(code_root(), files), "files": files}
    assert {"launch_node/worker.py", "train/main.py", "launch_bench/bench.py"} <= set(files)
    assert only_sshd_left(lab) == {}


def _start(tmp_path, lab, run_id, port, steps=5000):
    recipe = write_recipe(tmp_path, name=f"{run_id}.yml", train={"steps": steps})
    return LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                          "--run-id", run_id, "--rdzv-port", str(port)], tmp_path)


def _training(tmp_path, run_id):
    return any((tmp_path / "runs" / run_id).glob("*/node.log")) and any(
        "step " in p.read_text() for p in (tmp_path / "runs" / run_id).glob("*/node.log"))


def test_killed_worker_stops_all_hosts(lab, tmp_path):
    run = _start(tmp_path, lab, "ssh-kill", 29611)
    try:
        wait_for(lambda: _training(tmp_path, "ssh-kill") and lab_worker_pid(lab, "host1", "ssh-kill"),
                 180, "training on both lab hosts")
        os.kill(lab_worker_pid(lab, "host1", "ssh-kill"), signal.SIGKILL)
        killed = time.monotonic()
        code = run.wait(timeout=60)
        assert time.monotonic() - killed < 15
    finally:
        run.kill()
    assert code != 0
    assert "node host1" in run.output()
    summary = json.loads((tmp_path / "runs/ssh-kill/summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failure"]["first_failed_node"] == "host1"
    # ps inside every lab host: nothing of the run, nothing at all but sshd.
    assert run_env_pids(lab, "host0", "ssh-kill") == [] == run_env_pids(lab, "host1", "ssh-kill")
    assert only_sshd_left(lab) == {}


def test_sigint_stops_all_hosts_with_exit_130(lab, tmp_path):
    run = _start(tmp_path, lab, "ssh-int", 29612)
    try:
        wait_for(lambda: _training(tmp_path, "ssh-int"), 180, "training on the lab")
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(timeout=60)
    finally:
        run.kill()
    assert code == 130
    assert "SIGINT" in run.output()
    assert "Traceback" not in run.output() and "SignalException" not in run.output()
    assert only_sshd_left(lab) == {}
    summary = json.loads((tmp_path / "runs/ssh-int/summary.json").read_text())
    assert summary["failure"]["interrupted"] is True and summary["status"] == "interrupted"


def test_two_runs_at_once_one_interrupted_other_finishes(lab, tmp_path):
    long_run = _start(tmp_path, lab, "iso-long", 29613)
    short_run = _start(tmp_path, lab, "iso-short", 29614, steps=60)
    try:
        wait_for(lambda: _training(tmp_path, "iso-long") and _training(tmp_path, "iso-short"),
                 240, "both runs training")
        long_run.proc.send_signal(signal.SIGINT)
        assert long_run.wait(timeout=60) == 130
        # Stopping one run touched nothing of the other.
        assert run_env_pids(lab, "host0", "iso-long") == []
        assert short_run.wait(timeout=300) == 0, short_run.output()[-3000:]
    finally:
        long_run.kill()
        short_run.kill()
    summary = json.loads((tmp_path / "runs/iso-short/summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 60
    assert only_sshd_left(lab) == {}
