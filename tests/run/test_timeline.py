"""Every second of a real `launch run --local --nodes 2` of the bundled trainer accounted for:
summary.json's timeline (launcher/runs/timeline.py) adds up to the wall time from the launch
process's start to the summary's write (tests/run/timeline_check.py), and its goodput is shown
on the run's page, in report.md and by `launch runs`. It reads the README demo's run, which
the suite makes once (tests/conftest.py demo_local_run). A user's job, with a restart and a
resume: tests/job/test_local_job.py; over SSH and Slurm: the lab tests of tests/job, tests/ssh
and tests/slurm."""

from __future__ import annotations

import pytest

from tests.run.timeline_check import check_timeline

pytestmark = pytest.mark.slow


def test_the_trainer_s_run_is_accounted_for_and_its_goodput_shown(demo_local_run, run_launch):
    proc, run = demo_local_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    began = float((run.parent.parent / "began").read_text())
    timeline = check_timeline(run / "summary.json", began)
    phases = {p["name"]: p["s"] for p in timeline["phases"]}
    assert phases["training"] > 0 and "stop" in phases
    assert set(timeline["nodes"]) == {"node0", "node1"}
    assert all("exited_s" in node for node in timeline["nodes"].values())
    page = (run / "report.html").read_text()
    assert "goodput" in page and 'class="timeline"' in page
    assert "goodput" in (run / "report.md").read_text()
    runs = run_launch("runs", "--runs-dir", str(run.parent), check=True).stdout
    assert "GOODPUT" in runs.upper() and f"{timeline['goodput']:.0%}" in runs
