"""The issue-39 proof on every backend: a run's summary.json timeline (launcher/runs/timeline.py)
accounts for the wall time from the launch process's start to the report's write.

The test takes the wall clock just before it starts `launch run` (`began`, time.time()); the
run's last write is summary.json's (its timeline's end: the report's write, then the summary
written at once), so the wall time the test measures is the summary's mtime minus `began`.
The process's exit after that write (the interpreter's teardown, ~0.7 s here) is no part of
the run's time and of neither figure, so the check holds however long the teardown takes on
a loaded machine. Between `began` and the process's start (the fork: /proc's start time, in
clock ticks) and between the timeline's end and the file's write only milliseconds pass:
SLACK_S bounds them with room for a loaded machine's scheduling."""

from __future__ import annotations

import json
from pathlib import Path

SHARE = 0.02        # the "within 2%"
SLACK_S = 0.5       # fork and exec's start, /proc's clock tick, the summary's own write

# The phases a run goes through, in their order; a run has a subsequence of them (a handed-over
# run, a Slurm job: start-up, hand-over, queue and follow, then its controller's).
ORDER = ("start-up", "hand-over", "queue and follow", "controller start-up", "gate",
         "bandwidth sweep", "preflight", "preparation", "to first step", "training", "stop",
         "collection", "summary", "report")
ALWAYS = ("start-up", "preflight", "preparation", "collection", "summary", "report")


def check_timeline(summary_path: Path, began: float, *, restarts: int = 0,
                   steps: bool = True) -> dict:
    """Asserts summary_path's timeline accounts for the run's wall time (from `began`, the
    test's time.time() before it started launch, to the summary's write), its phases in their
    order, and `restarts` restarts named as losses; returns the timeline."""
    timeline = json.loads(Path(summary_path).read_text())["timeline"]
    phases = [(p["name"], p["s"]) for p in timeline["phases"]]
    names = [name for name, _ in phases]
    total = sum(s for _, s in phases)
    assert abs(total - timeline["wall_s"]) < 0.01 + 0.001 * len(phases), timeline
    measured = Path(summary_path).stat().st_mtime - began
    assert abs(timeline["wall_s"] - measured) <= SHARE * measured + SLACK_S, \
        (timeline["wall_s"], measured, timeline)
    assert all(s >= 0 for _, s in phases), phases
    known = [name for name in names if name in ORDER]
    assert known == sorted(known, key=ORDER.index), names
    assert names[0] == "start-up" and names[-1] == "report", names
    assert set(ALWAYS) <= set(names), names
    if steps:
        assert {"to first step", "training"} <= set(names), names
        assert timeline["first_step_s"] is not None and timeline["goodput"] is not None
        # 0 when every step was reported at once (a job of instant steps): defined, not invented.
        assert 0 <= timeline["goodput"] < 1, timeline
    found = [loss for loss in timeline["training_losses"] if loss["kind"] == "restart"]
    assert len(found) == restarts, timeline["training_losses"]
    assert all(loss["s"] > 0 for loss in found), found
    return timeline
