"""Recovery over real SSH on the lab: a node agent killed on host 2 is restarted there, and a
worker stopped with SIGSTOP is found (its stack read with py-spy from the node's own Python),
named, and restarted; the run then finishes and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.run.timeline_check import check_timeline
from tests.ssh.conftest import lab_worker_pid, only_sshd_left, run_env_pids
from launch_node import checkpoint_files as files

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def lab_agent_pid(lab, host: str, run_id: str) -> int | None:
    """The torchrun agent itself (not the setsid/sh wrapper that started it)."""
    for pid in run_env_pids(lab, host, run_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"torch.distributed.run"]:
            return pid
    return None


def test_a_killed_node_agent_and_a_stopped_rank_are_recovered_on_the_lab(lab, tmp_path):
    # A checkpoint every 10 steps: the agent is killed after the first (step ~10), the rank
    # stopped after the first one since that resume (step ~20-30), which leaves ~130 steps
    # (~6 s) for the test's looks over the lab's SSH between that checkpoint and the stop,
    # on a busy machine; 90 (~4 s) was thin. 240 steps with one every 30 trained 180 steps
    # after the stop that nothing here reads.
    recipe = write_recipe(tmp_path, train={"steps": 160, "log_every": 20},
                          checkpoint={"every_steps": 10, "keep": 2})
    began = time.time()
    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                         "--run-id", "ssh-rec", "--rdzv-port", "29631", "--max-restarts", "2",
                         "--hang-timeout", "10"], tmp_path)
    stopped = None
    try:
        # The head's folder is the run's own: <run id>.<the run's uid>/host0.
        head = wait_for(lambda: next((lab.dir / "node-runs").glob("ssh-rec.*/host0"), None), 120,
                        "the head's run folder")
        head_checkpoints = head / files.CHECKPOINT_DIR
        wait_for(lambda: files.latest(head_checkpoints) and lab_agent_pid(lab, "host1", "ssh-rec"),
                 240, "the first checkpoint on the head")
        os.kill(lab_agent_pid(lab, "host1", "ssh-rec"), signal.SIGKILL)
        wait_for(lambda: "first step since the restart" in run.output(), 180,
                 "the run to resume after the node restart")
        resumed = files.latest(head_checkpoints).step
        wait_for(lambda: files.latest(head_checkpoints).step > resumed
                 and lab_worker_pid(lab, "host1", "ssh-rec"), 180, "a checkpoint after the resume")
        stopped = lab_worker_pid(lab, "host1", "ssh-rec")
        os.kill(stopped, signal.SIGSTOP)
        stopped_at = time.time()
        code = run.wait(timeout=400)
    finally:
        run.kill()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = run.output()
    assert code == 0, out[-4000:]
    run_dir = tmp_path / "runs" / "ssh-rec"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 160
    node, hang = summary["restarts"]
    assert (node["node"], node["kind"]) == ("host1", "node")
    assert node["resumed_from_step"] > 0
    # A node's count is the restarts that began there (summary.json's one account of them):
    # its agent's, then its stuck rank's.
    assert {n["name"]: n["restarts"] for n in summary["nodes"]} == {"host0": 0, "host1": 2}
    assert (hang["node"], hang["kind"]) == ("host1", "hang")
    assert hang["resumed_from_step"] > node["resumed_from_step"]
    found = summary["hang"]
    assert [(s["node"], s["state"]) for s in found["stuck"]] == [("host1", "stopped (T)")]
    assert found["action"] == "restart" and len(found["dumps"]) == 2
    for dump in found["dumps"]:
        text = (run_dir / dump).read_text()
        assert "stack source: py-spy" in text and "MainThread" in text
        assert (run_dir / dump).stat().st_mtime - stopped_at <= 10 + 15
    assert "stopped (T)" in out and "node host1" in out
    # The checkpoints were on the head's disk and came back with its folder.
    assert files.latest(run_dir / "host0" / files.CHECKPOINT_DIR).step == 160
    assert run_env_pids(lab, "host0", "ssh-rec") == [] == run_env_pids(lab, "host1", "ssh-rec")
    # Every second accounted for (issue 39): both restarts are named losses.
    check_timeline(run_dir / "summary.json", began, restarts=2)
    assert only_sshd_left(lab) == {}
