"""A spot node's interruption notice on the SSH lab: EC2's instance metadata played by a
stand-in inside the lab host (tests/ssh/imds.py: IMDSv2, the reclaim notice), the reclaim by
taking the host away as a machine goes."""

from __future__ import annotations

import json
import signal

import pytest

from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.ssh import imds
from tests.ssh.conftest import edit_inventory, newest_step, run_env_pids
from launch_node import checkpoint_files as files

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def test_a_spot_notice_saves_a_last_chance_checkpoint_and_the_run_is_preempted(lab, tmp_path):
    notice, log = tmp_path / "notice.json", tmp_path / "imds.log"
    server = imds.start_in(lab.host("host1").netns, notice, log)
    inventory = edit_inventory(lab, tmp_path, host0={"launch_market": "spot"},
                               host1={"launch_market": "spot"})
    dest = lab.dir / "mirror"
    # No scheduled checkpoint in reach: the one the run keeps is the last-chance one.
    recipe = write_recipe(tmp_path, train={"steps": 3000, "log_every": 10},
                          checkpoint={"every_steps": 5000, "mirror": str(dest)})
    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(inventory),
                         "--run-id", "spot", "--rdzv-port", "29651"], tmp_path)
    try:
        wait_for(lambda: "step 20/3000" in run.output(), 240, "step 20")
        notice.write_text(json.dumps({"action": "terminate", "time": "2026-12-01T12:02:00Z"}))
        wait_for(lambda: "last-chance checkpoint at step" in run.output(), 60,
                 "the last-chance checkpoint")
        wait_for(lambda: newest_step(dest, "spot") > 0, 60, "it in the mirror")
        saved = newest_step(dest, "spot")
        lab.lose("host1")   # EC2 takes the instance back
        code = run.wait(timeout=180)
    finally:
        run.kill()
        server.send_signal(signal.SIGKILL)
    out = run.output()
    assert code == 75, out[-3000:]
    assert "spot: interruption notice: terminate at 2026-12-01T12:02:00Z; SIGUSR1 to rank(s) 1" \
        in out
    summary = json.loads((tmp_path / "runs" / "spot" / "summary.json").read_text())
    assert summary["status"] == "preempted"
    assert [(n["node"], n["action"]) for n in summary["preemption"]] == [("host1", "terminate")]
    assert "node host1 was taken back by EC2" in summary["failure"]["reason"]
    assert f"run spot preempted: node host1 was taken back by EC2" in out
    # One checkpoint, at the step the ranks agreed on after the notice, mirrored off the node.
    assert summary["mirror"]["units"] == 1 and saved >= 20
    assert (files.latest(tmp_path / "runs" / "spot" / "host0" / "checkpoints").step == saved)
    # IMDSv2 only: every read carried the session token.
    requests = log.read_text().splitlines()
    assert "PUT /latest/api/token 200" in requests
    assert "GET /latest/meta-data/spot/instance-action 200" in requests
    assert not any(line.endswith(" 401") for line in requests)
    assert run_env_pids(lab, "host0", "spot") == []
