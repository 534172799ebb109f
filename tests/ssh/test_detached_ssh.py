"""Runs that outlive the terminal, over SSH (`launch run -i ... --detach`): the pipeline on the
head, started by a client that returns in seconds and leaves; `launch attach` from here shows
it and ends with its exit code; a killed client changes nothing; a crashed rank restarts and a
hung one is named with its stacks with nobody attached; `launch stop` leaves nothing on the
hosts; the finished run's folder and report come home with `launch fetch`; the checkpoint
mirror reaches S3 from the head."""

from __future__ import annotations

import ipaddress
import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from launcher.lab import netns
from tests.job.project import write_project
from tests.run.conftest import LaunchProcess, wait_for
from tests.s3mirror import BUCKET, mirrored, s3_for_nodes
from tests.ssh.conftest import only_sshd_left

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def gateway(lab) -> str:
    return str(netns.gateway(ipaddress.ip_network(lab.subnet)))


def detach(run_launch, lab, project, *args: str, timeout: float = 180):
    started = time.monotonic()
    proc = run_launch("run", "-i", str(lab.inventory), "--detach", *args, cwd=project,
                      timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "detached: its pipeline runs on host0" in proc.stderr
    return proc, time.monotonic() - started


def test_a_detached_run_on_the_head_restarts_mirrors_and_comes_home(run_launch, lab, tmp_path):
    project = write_project(tmp_path / "project")
    with s3_for_nodes(tmp_path / "moto", gateway(lab)) as (aws, s3):
        (project / "det.yml").write_text(yaml.safe_dump({
            "name": "det", "nodes": 2, "workdir": ".", "restarts": 1, "env": aws,
            "checkpoint": {"mirror": f"s3://{BUCKET}/runs"},
            "job": {"script": "main.py",
                    "args": ["--mode", "crash-once", "--steps", "12", "--pause", "0.3"]}}))
        detach(run_launch, lab, project, "det.yml", "--run-id", "sdet")
        record = json.loads((project / "runs" / "sdet" / "detached.json").read_text())
        assert record["controller"] == "host0" and record["backend"] == "ssh"
        # What the controller writes on the head is the user's alone.
        controller_folder = wait_for(lambda: Path(record["run_dir"]).is_dir() and
                                     Path(record["run_dir"]), 60, "the controller's folder")
        assert controller_folder.stat().st_mode & 0o077 == 0
        # The pipeline runs on the head, in the host's own namespace: not a process here.
        assert record["pid"] in lab.pids("host0")
        first = LaunchProcess(["attach", "sdet"], project)
        try:
            wait_for(lambda: "resumed from step 3" in first.output(), 300,
                     "the restarted rank resuming, seen through attach")
            first.proc.send_signal(signal.SIGKILL)   # the laptop closes
            first.wait(10)
        finally:
            first.kill()
        again = run_launch("attach", "sdet", cwd=project, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "rank 1 crashes once" in again.stdout
        assert "resumed from step 3 in attempt 1" in again.stdout
        assert "run sdet succeeded" in again.stdout
        keys = mirrored(s3, "runs/")
        assert any(k.endswith("state.pt") for k in keys), keys
    fetched = run_launch("fetch", "sdet", cwd=project, check=True)
    assert "file(s) fetched from host0" in fetched.stdout
    run = project / "runs" / "sdet"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and len(summary["restarts"]) == 1
    assert (run / "report.html").is_file() and (run / "host1" / "node.log").is_file()
    listed = run_launch("runs", cwd=project, check=True).stdout
    assert "sdet" in listed and "succeeded" in listed
    wait_for(lambda: only_sshd_left(lab) == {}, 10, "nothing of the run on the hosts")


def test_a_hung_rank_of_a_detached_run_is_named_with_its_stacks(run_launch, lab, tmp_path):
    project = write_project(tmp_path / "project")
    detach(run_launch, lab, project, "--nodes", "2", "main.py", "--run-id", "shung",
           "--hang-timeout", "8", "--", "--mode", "hang")
    attached = run_launch("attach", "shung", cwd=project, timeout=300)
    assert attached.returncode == 1, attached.stdout[-3000:] + attached.stderr[-3000:]
    assert "stuck: rank 1 on node" in attached.stdout + attached.stderr
    run_launch("fetch", "shung", cwd=project, check=True)
    dumps = sorted((project / "runs" / "shung" / "hang").glob("*.rank1.txt"))
    assert dumps and "stuck_in_user_code" in dumps[0].read_text()
    wait_for(lambda: only_sshd_left(lab) == {}, 10, "nothing of the run on the hosts")


def test_launch_stop_leaves_nothing_on_the_hosts(run_launch, lab, tmp_path):
    project = write_project(tmp_path / "project")
    detach(run_launch, lab, project, "--nodes", "2", "main.py", "--run-id", "slong",
                     "--", "--steps", "100000", "--pause", "0.1")
    follower = LaunchProcess(["logs", "slong", "-f"], project)
    try:
        wait_for(lambda: "LAUNCH_STEP step=3" in follower.output(), 240, "training")
        stopped = run_launch("stop", "slong", cwd=project, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert "run slong stopped" in stopped.stdout
        assert follower.wait(60) == 0   # `logs -f` ends with the run
    finally:
        follower.kill()
    wait_for(lambda: only_sshd_left(lab) == {}, 10, "nothing of the run on the hosts")
    attached = run_launch("attach", "slong", cwd=project, timeout=60)
    assert attached.returncode == 143 and "stopped by `launch stop`" in attached.stderr
