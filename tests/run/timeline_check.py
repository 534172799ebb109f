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

import html
import json
import re
from pathlib import Path

SHARE = 0.02        # the "within 2%"
SLACK_S = 0.5       # fork and exec's start, /proc's clock tick, the summary's own write

# The phases a run goes through, in their order; a run has a subsequence of them (a handed-over
# run, a Slurm job: start-up, hand-over, queue and follow, then its controller's, then the
# report written again where `launch run` follows it).
ORDER = ("start-up", "hand-over", "queue and follow", "controller start-up", "gate",
         "bandwidth sweep", "preflight", "preparation", "to first step", "training", "stop",
         "collection", "summary", "controller report", "report")
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


def report_phases(run_dir: Path) -> dict[str, list[tuple[str, float]]]:
    """The timeline's parts as a reader sees them: report.md's "## Time" table (its phase
    rows) and report.html's bar (each part's title; training split into kept and lost)."""
    run_dir = Path(run_dir)
    markdown = (run_dir / "report.md").read_text()
    section = markdown.split("## Time\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (?!- of which lost)(?!phase \|)([^|]+?) \| ([0-9.]+) \|", section,
                      flags=re.M)
    page = (run_dir / "report.html").read_text()
    bar = page.split('<div class="bar">', 1)[1].split("</div>", 1)[0]
    cells = re.findall(r'title="([^"]*): ([0-9.]+) s"', bar)
    return {"report.md": [(name, float(s)) for name, s in rows],
            "report.html": [(html.unescape(name), float(s)) for name, s in cells]}


def check_report_timeline(run_dir: Path, began: float, names: tuple[str, ...] = ()) -> None:
    """Asserts report.md's and report.html's timelines hold `names` and are summary.json's,
    short of its last phase: the report's own write, which a file cannot hold while it is
    being written. With that phase, their parts add up to the run's wall time (from `began`
    to summary.json's last write) within the issue's 2%."""
    run_dir = Path(run_dir)
    timeline = json.loads((run_dir / "summary.json").read_text())["timeline"]
    *before, last = [(p["name"], p["s"]) for p in timeline["phases"]]
    assert last[0] == "report", timeline["phases"]
    measured = (run_dir / "summary.json").stat().st_mtime - began
    for name, parts in report_phases(run_dir).items():
        assert set(names) <= {part for part, _ in parts}, (name, parts)
        total = sum(s for _, s in parts)
        assert abs(total - sum(s for _, s in before)) < 0.01 * len(before), (name, parts,
                                                                             before)
        assert abs(total + last[1] - measured) <= SHARE * measured + SLACK_S, \
            (name, total, last, measured, parts)
    md = report_phases(run_dir)["report.md"]
    assert [part for part, _ in md] == [part for part, _ in before], (md, before)
