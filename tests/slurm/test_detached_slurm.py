"""A Slurm run that outlives its client: `launch run --slurm --detach` returns once the job is
submitted; the job carries the whole pipeline (restarts, the checkpoint mirror to S3, the
summary and report); `launch attach` follows it (Ctrl-C there only detaches) and ends with its
exit code; `launch stop` signals the pipeline, which stops every step."""

from __future__ import annotations

import ipaddress
import json
import signal

import pytest
import yaml

from launcher.lab import netns
from tests.job.project import write_project
from tests.run.conftest import LaunchProcess, wait_for
from tests.s3mirror import BUCKET, mirrored, s3_for_nodes
from tests.slurm.conftest import job_processes, slurm_args, slurm_env

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def test_a_detached_job_restarts_mirrors_and_is_followed_then_stopped(slurm_lab, run_launch,
                                                                      tmp_path):
    env = slurm_env(slurm_lab)
    project = write_project(tmp_path / "project")
    gateway = str(netns.gateway(ipaddress.ip_network(slurm_lab.subnet)))
    with s3_for_nodes(tmp_path / "moto", gateway) as (aws, s3):
        (project / "det.yml").write_text(yaml.safe_dump({
            "name": "det", "nodes": 2, "workdir": ".", "restarts": 1, "env": aws,
            "checkpoint": {"mirror": f"s3://{BUCKET}/runs"},
            "job": {"script": "main.py",
                    "args": ["--mode", "crash-once", "--steps", "12", "--pause", "0.3"]}}))
        proc = run_launch("run", *slurm_args(), "det.yml", "--run-id", "jdet", "--detach",
                          cwd=project, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "run jdet detached: its pipeline runs on Slurm job" in proc.stderr
        first = LaunchProcess(["attach", "jdet"], project, env)
        try:
            wait_for(lambda: "rank 1 crashes once" in first.output(), 300,
                     "the crash, seen through attach")
            first.proc.send_signal(signal.SIGINT)   # detaches; the job goes on
            assert first.wait(30) == 130
            assert "detached from run jdet" in first.output()
        finally:
            first.kill()
        again = run_launch("attach", "jdet", cwd=project, env=env, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "resumed from step 3 in attempt 1" in again.stdout
        run = project / "runs" / "jdet"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "succeeded" and len(summary["restarts"]) == 1
        assert summary["slurm"]["state"] == "COMPLETED"
        assert (run / "report.html").is_file()
        keys = mirrored(s3, "runs/")
        assert any(k.endswith("state.pt") for k in keys), keys
    wait_for(lambda: job_processes(slurm_lab) == {}, 10, "no job process on any node")

    proc = run_launch("run", *slurm_args("--nodes", "2"), "main.py", "--run-id", "jlong",
                      "--detach", "--", "--steps", "100000", "--pause", "0.1", cwd=project,
                      env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = project / "runs" / "jlong"
    wait_for(lambda: any("LAUNCH_STEP step=3" in p.read_text() for p in log.glob("*/node.log")),
             300, "training in the job")
    stopped = run_launch("stop", "jlong", cwd=project, env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "run jlong stopped" in stopped.stdout
    summary = json.loads((log / "summary.json").read_text())
    assert summary["status"] == "stopped"
    wait_for(lambda: job_processes(slurm_lab) == {}, 10, "no job process on any node")
