"""Faults of launch itself on this machine: killed outright, or two runs sharing a run id."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import launch_cmd
from tests.run.conftest import LaunchProcess, cmdline, run_pids, wait_for, write_recipe

pytestmark = pytest.mark.slow


def test_sigkill_of_launch_leaves_nothing_running_and_the_run_is_reported(tmp_path):
    recipe = write_recipe(tmp_path, train={"steps": 5000})
    run = LaunchProcess(["run", "--local", "--nodes", "2", str(recipe), "--run-id", "orphan"],
                        tmp_path)
    try:
        wait_for(lambda: (tmp_path / "runs/orphan/node0/metrics.jsonl").exists(), 120,
                 "training to start")
        assert len(run_pids("orphan")) >= 4  # 2 agents and 2 workers
        run.proc.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        # The agents get SIGTERM from the kernel when launch dies (parent-death signal) and
        # stop their workers: nothing trains on unsupervised.
        wait_for(lambda: run_pids("orphan") == [], 5, "the run's processes to end")
    finally:
        run.kill()
    assert not (tmp_path / "runs/orphan/summary.json").exists()
    listing = subprocess.run(launch_cmd("runs", "--json"), cwd=tmp_path, text=True,
                             capture_output=True, timeout=60, check=True)
    [state] = json.loads(listing.stdout)
    assert (state["run_id"], state["status"], state["leftover_pids"]) == ("orphan", "abandoned",
                                                                         [])


def _stamped(stamp: str) -> list[int]:
    from launcher.runs.leftovers import pids_with_env

    return pids_with_env("LAUNCH_RUN_STAMP", stamp)


def test_same_run_id_in_two_runs_dirs_both_finish(tmp_path):
    """The first run's cleanup once swept by run id and SIGKILLed the other run. Run a is held
    (its workers stopped) while run b, same id, runs to its end and sweeps; then a goes on."""
    recipe = write_recipe(tmp_path, train={"steps": 40, "log_every": 5})
    a = LaunchProcess(["run", "--local", "--nodes", "2", str(recipe), "--run-id", "same",
                       "--runs-dir", "a"], tmp_path)
    b = None
    try:
        wait_for(lambda: (tmp_path / "a/same/node0/metrics.jsonl").exists(), 120,
                 "run a training")
        stamp = json.loads((tmp_path / "a/same/launch.json").read_text())["stamp"]
        workers = [p for p in _stamped(stamp) if "torch.distributed.run" not in cmdline(p)
                   and any(arg.endswith("train/main.py") for arg in cmdline(p))]
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        before = sorted(_stamped(stamp))
        b = LaunchProcess(["run", "--local", "--nodes", "2", str(recipe), "--run-id", "same",
                           "--runs-dir", "b"], tmp_path)
        assert b.wait(timeout=300) == 0, b.output()[-3000:]
        assert sorted(_stamped(stamp)) == before  # b's sweep left every process of a alive
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        assert a.wait(timeout=300) == 0, a.output()[-3000:]
    finally:
        a.kill()
        if b:
            b.kill()
    for runs in ("a", "b"):
        summary = json.loads((tmp_path / runs / "same/summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("succeeded", 40)
