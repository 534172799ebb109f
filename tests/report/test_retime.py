"""A handed-over run's report drawn again with the following launch's timeline
(launcher/report/retime.py): report.json's timeline, report.md's Time section and the page's
timeline parts become the amended summary's, as a whole report written from it would have
them, and every other byte the controller wrote stays. Real kept run folders (tests/report/
data), real timelines (launcher/runs/timeline.py on a clock the test moves)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.report.build import build_report, render_markdown, write_run_report
from launcher.report.retime import rewrite_timeline
from launcher.runs.timeline import FOLLOWING, JOB, Timeline, handed_over
from tests.run.timeline_check import report_phases

_MARKED = re.compile(r"<!--launch:timeline (\w+)-->(.*?)<!--/launch:timeline \1-->", re.S)


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def controller_timeline() -> dict:
    """The controller's own timeline: its start-up, the job (20 steps), its report."""
    clock = Clock(5000.0)
    inner = Timeline(start=4999.0, clock=clock)
    inner.begin(JOB)
    clock.advance(3.0)
    for step in range(1, 21):
        clock.advance(0.5)
        inner.line("node0", "0", f"LAUNCH_STEP step={step} loss=0.5")
    inner.begin("report")
    clock.advance(3.1)
    return inner.to_json()


def followed(inner: dict) -> dict:
    """The timeline as the launch that followed the run amends it: its start-up and
    hand-over, the queue, the controller's parts, its own report."""
    clock = Clock(100.0)
    own = Timeline(start=99.0, clock=clock)
    own.begin("hand-over")
    clock.advance(0.7)
    own.begin(FOLLOWING)
    clock.advance(inner["wall_s"] + 6.0)
    own.begin("report")
    return handed_over(own, inner)


def set_timeline(run: Path, timeline: dict) -> None:
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps({**summary, "timeline": timeline}, indent=2))


def written(run: Path) -> dict[str, str]:
    return {name: (run / name).read_text() for name in ("report.json", "report.md",
                                                          "report.html")}


def outside_marks(page: str) -> str:
    return _MARKED.sub(lambda m: f"[{m[1]}]", page)


def marked(page: str) -> dict[str, str]:
    return {m[1]: m[2] for m in _MARKED.finditer(page)}


def time_section(markdown: str) -> str:
    return markdown.split("## Time\n", 1)[1].split("\n## ", 1)[0]


def controller_report(run: Path) -> tuple[dict, dict[str, str]]:
    """The report as the controller wrote it, then summary.json amended by the follower."""
    inner = controller_timeline()
    set_timeline(run, inner)
    write_run_report(run)
    before = written(run)
    amended = followed(inner)
    set_timeline(run, amended)
    return amended, before


@pytest.mark.parametrize("name", ["demo", "hang-restart", "straggler", "job-steps",
                                  "job-silent"])
def test_only_the_timeline_is_drawn_again(runs, name):
    run = runs / name
    amended, before = controller_report(run)
    rewrite_timeline(run)
    after = written(run)
    phases = [(p["name"], p["s"]) for p in amended["phases"]]
    # What a reader sees: report.md's Time table and the page's bar are the amended
    # timeline's phases (the follower's hand-over and queue among them), as report.json's.
    shown = report_phases(run)
    assert [n for n, _ in shown["report.md"]] == [n for n, _ in phases]
    assert shown["report.md"] == pytest.approx(phases, abs=0.005)
    assert {"hand-over", "queue and follow", "controller start-up", "controller report"} <= \
        {n for n, _ in shown["report.html"]}
    report = json.loads(after["report.json"])
    assert [(p["name"], p["s"]) for p in report["timeline"]["phases"]] == phases
    # The same report a whole write from the amended summary makes: report.json's facts and
    # report.md's every line (the Time section's renderer is the one report.md's is).
    assert report == json.loads(json.dumps(build_report(run)))
    assert after["report.md"] == render_markdown(report)
    # ... and the rest as the controller wrote it, byte for byte: report.json but its
    # timeline, report.md but its Time section, the page outside its timeline parts (its
    # other plots among them: matplotlib's SVG differs each time it is drawn).
    old = json.loads(before["report.json"])
    assert {k: v for k, v in report.items() if k != "timeline"} == \
        {k: v for k, v in old.items() if k != "timeline"}
    assert before["report.md"].replace(time_section(before["report.md"]), "") == \
        after["report.md"].replace(time_section(after["report.md"]), "")
    assert time_section(before["report.md"]) != time_section(after["report.md"])
    assert outside_marks(before["report.html"]) == outside_marks(after["report.html"])
    assert "<svg" in outside_marks(after["report.html"]) or name.startswith("job")
    parts_before, parts_after = marked(before["report.html"]), marked(after["report.html"])
    assert set(parts_before) == set(parts_after)
    assert parts_before["bar"] != parts_after["bar"]
    assert parts_before["time"] != parts_after["time"]
    assert "queue and follow" in parts_after["time"]
    # A user's job's step curves count from the run's start: the follower's, now, with its
    # phases before the first step drawn as bands.
    assert ("steps" in parts_after) == name.startswith("job")
    if name == "job-steps":
        assert "queue and follow" in parts_after["steps"]
        assert "queue and follow" not in parts_before["steps"]


def test_drawing_the_same_timeline_again_changes_nothing_outside_the_plots(runs):
    run = runs / "demo"
    controller_report(run)
    rewrite_timeline(run)
    once = written(run)
    rewrite_timeline(run)
    assert written(run) == once


def test_a_page_an_older_launch_wrote_is_written_whole(runs):
    """No timeline markers on the page: the whole report is written from the summary."""
    run = runs / "demo"
    amended, before = controller_report(run)
    page = run / "report.html"
    page.write_text(re.sub(r"<!--/?launch:timeline \w+-->", "", before["report.html"]))
    rewrite_timeline(run)
    after = written(run)
    assert set(marked(after["report.html"])) == {"bar", "time"}
    assert [n for n, _ in report_phases(run)["report.md"]] == \
        [p["name"] for p in amended["phases"]]
    assert "queue and follow" in marked(after["report.html"])["bar"]


def test_a_summary_settled_after_the_report_is_reported_whole(runs):
    """The run's home settled it after its controller's report (Slurm's time limit): the
    report states the summary's status and failure, not only its timeline."""
    run = runs / "demo"
    controller_report(run)
    summary = json.loads((run / "summary.json").read_text())
    summary["status"] = "failed"
    summary["failure"] = {"reason": "Slurm ended the job at its time limit",
                          "interrupted": False}
    (run / "summary.json").write_text(json.dumps(summary))
    rewrite_timeline(run)
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "failed"
    assert "Slurm ended the job at its time limit" in (run / "report.md").read_text()
    assert "Slurm ended the job at its time limit" in (run / "report.html").read_text()
    assert "queue and follow" in time_section((run / "report.md").read_text())
