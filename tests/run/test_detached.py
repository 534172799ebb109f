"""Runs apart from the terminal, on this machine (`launch run --local --detach`): the launching
process returns at once, the run's pipeline (restarts, the checkpoint mirror to S3, the summary
and report) goes on in its controller whoever attaches or not, `launch attach` replays it and
ends with the run's exit code, a killed client changes nothing, `launch stop` ends it."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import yaml

from launcher.runs.folder import STAMP_ENV
from launcher.runs.leftovers import pids_with_env
from tests.conftest import launch_cmd
from tests.job.project import write_project
from tests.run.conftest import LaunchProcess, wait_for
from tests.s3mirror import BUCKET, mirrored, s3_for_nodes

pytestmark = pytest.mark.slow


def stamp_of(run) -> str:
    return json.loads((run / "launch.json").read_text())["stamp"]


def test_a_detached_run_restarts_mirrors_and_ends_whoever_attaches(run_launch, tmp_path):
    project = write_project(tmp_path / "project")
    with s3_for_nodes(tmp_path / "moto", "127.0.0.1") as (aws, s3):
        (project / "det.yml").write_text(yaml.safe_dump({
            "name": "det", "nodes": 2, "workdir": ".", "restarts": 1, "env": aws,
            "checkpoint": {"mirror": f"s3://{BUCKET}/runs"},
            "job": {"script": "main.py",
                    "args": ["--mode", "crash-once", "--steps", "10", "--pause", "0.3"]}}))
        proc = run_launch("run", "--local", "det.yml", "--run-id", "det", "--detach",
                          cwd=project, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # The launching process is gone (run_launch waited for it); the run is not.
        assert "run det detached: its pipeline runs on this machine" in proc.stderr
        run = project / "runs" / "det"
        first = LaunchProcess(["attach", "det"], project)
        try:
            wait_for(lambda: "resumed from step 3" in first.output(), 240,
                     "the restarted rank resuming, seen through attach")
            # A client killed while attached: the run goes on without it.
            first.proc.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            first.kill()
        again = subprocess.run(launch_cmd("attach", "det"), cwd=project, text=True,
                               capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        # From the run's start: the crash, the restart, the resume, the end.
        out = again.stdout
        assert "rank 1 crashes once" in out and "resumed from step 3 in attempt 1" in out
        assert out.index("rank 1 crashes once") < out.index("resumed from step 3")
        assert "run det succeeded" in out
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "succeeded" and len(summary["restarts"]) == 1
        assert summary["progress"]["step"] == 10
        assert (run / "report.html").is_file()
        keys = mirrored(s3, "runs/")
        assert any(k.endswith("state.pt") for k in keys), keys
    # c10d places ranks on nodes anew at each restart: the crash is on whichever node held
    # rank 1 in the first round, and --node shows that node's log alone.
    logs = run_launch("logs", "det", cwd=project, check=True).stdout
    crashed = next(line.split("/")[0] for line in logs.splitlines()
                   if "AssertionError: rank 1 crashes once" in line)
    one = run_launch("logs", "det", "--node", crashed, cwd=project, check=True).stdout
    assert "AssertionError: rank 1 crashes once" in one
    assert all(line.startswith(f"{crashed}/") for line in one.splitlines() if line)
    assert pids_with_env(STAMP_ENV, stamp_of(run)) == []


def test_launch_stop_ends_a_detached_run_and_leaves_nothing(run_launch, tmp_path):
    project = write_project(tmp_path / "project")
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "long",
                      "--detach", "--", "--steps", "100000", "--pause", "0.1",
                      cwd=project, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = project / "runs" / "long"
    wait_for(lambda: "LAUNCH_STEP step=3" in (run / "node0" / "node.log").read_text()
             if (run / "node0" / "node.log").exists() else False, 240, "training")
    listed = run_launch("runs", cwd=project, check=True).stdout
    assert "detached, running (this machine" in listed
    stopped = run_launch("stop", "long", cwd=project, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "run long stopped: stopped by `launch stop`" in stopped.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["failure"]["interrupted"] is True
    assert {n["status"] for n in summary["nodes"]} == {"stopped"}
    # Attaching now replays it to its end, with the run's exit code.
    attached = run_launch("attach", "long", cwd=project, timeout=60)
    assert attached.returncode == 143
    assert "stopped by `launch stop`" in attached.stderr
    assert pids_with_env(STAMP_ENV, stamp_of(run)) == []
