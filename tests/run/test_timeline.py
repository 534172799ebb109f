"""Every second of a real `launch run --local --nodes 2` accounted for: summary.json's
timeline (launcher/runs/timeline.py) adds up to the wall time measured around the launch
process, for the bundled trainer and a user's job, with a restart and a resume; goodput is
shown on the run's page and by `launch runs`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.run.conftest import write_recipe
from tests.job.project import write_project

pytestmark = pytest.mark.slow


def timed(run_launch, *args, **kw):
    began = time.monotonic()
    proc = run_launch(*args, **kw)
    return proc, time.monotonic() - began


def timeline_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["timeline"]


def assert_accounted(timeline: dict, wall_s: float) -> dict[str, float]:
    """The phases add up to the timeline's wall time, and that to the wall time measured
    around the process (within 2%: the interpreter's exit comes after the last mark)."""
    phases = {p["name"]: p["s"] for p in timeline["phases"]}
    assert abs(sum(phases.values()) - timeline["wall_s"]) < 0.01 + 0.001 * len(phases)
    assert abs(timeline["wall_s"] - wall_s) <= 0.02 * wall_s, (timeline, wall_s)
    return phases


def test_the_trainer_s_run_is_accounted_for_and_its_goodput_shown(run_launch, tmp_path):
    # Long enough that the interpreter's own exit, after the last mark, is well under 2%.
    recipe = write_recipe(tmp_path, name="tl.yml", train={"steps": 600, "log_every": 10})
    proc, wall = timed(run_launch, "run", "--local", "--nodes", "2", str(recipe),
                       "--run-id", "tl", timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = tmp_path / "runs" / "tl"
    timeline = timeline_of(run)
    phases = assert_accounted(timeline, wall)
    for name in ("start-up", "preflight", "preparation", "to first step", "training", "stop",
                 "collection", "summary", "report"):
        assert name in phases, phases
    assert phases["training"] > 0 and 0 < timeline["goodput"] < 1
    assert set(timeline["nodes"]) == {"node0", "node1"}
    assert all("exited_s" in node for node in timeline["nodes"].values())
    page = (run / "report.html").read_text()
    assert "goodput" in page and 'class="timeline"' in page
    assert "goodput" in (run / "report.md").read_text()
    runs = run_launch("runs", "--runs-dir", str(tmp_path / "runs"), check=True).stdout
    assert "GOODPUT" in runs.upper() and f"{timeline['goodput']:.0%}" in runs


def test_a_user_job_with_a_restart_then_a_resume(run_launch, tmp_path):
    """A restart is a named loss (goodput < 1 for it); a resumed run has its own timeline,
    from its own process's start."""
    project = write_project(tmp_path / "project")
    proc, wall = timed(run_launch, "run", "--local", "--nodes", "2", "main.py", "--run-id",
                       "rs", "--max-restarts", "1", "--", "--mode", "crash-once", "--steps",
                       "8", "--pause", "3", cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    timeline = timeline_of(project / "runs" / "rs")
    assert_accounted(timeline, wall)
    restarts = [loss for loss in timeline["training_losses"] if loss["kind"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["node"] == "node1" and restarts[0]["s"] > 0
    assert timeline["goodput"] < 1
    assert any(loss["kind"] == "restart" for loss in timeline["largest_losses"])

    # A run that fails (no restart allowed), then resumed: both accounted for.
    proc, wall = timed(run_launch, "run", "--local", "--nodes", "2", "main.py", "--run-id",
                       "again", "--", "--mode", "crash-once", "--steps", "8", "--pause", "3",
                       cwd=project, timeout=300)
    assert proc.returncode == 1
    assert_accounted(timeline_of(project / "runs" / "again"), wall)
    proc, wall = timed(run_launch, "run", "--local", "--resume", "again", cwd=project,
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = timeline_of(project / "runs" / "again")
    phases = assert_accounted(resumed, wall)
    assert phases["training"] > 0 and 0 < resumed["goodput"] < 1
