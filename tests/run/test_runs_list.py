"""`launch runs`: where it looked, the runs in the order they started, and what a job of the
user's own reported in LAUNCH_STEP lines (it showed `-` for steps and loss although
summary.json had them, and listed runs by name)."""

from __future__ import annotations

import json

from launcher.cli import main
from tests.run.test_hostile_runfolders import make_run


def test_runs_are_listed_as_they_started_with_a_job_s_steps_and_loss(tmp_path, capsys):
    runs = tmp_path / "other-runs"
    for run_id, started in (("a-late", "2026-01-02T05:00:00+00:00"),
                            ("b-early", "2026-01-02T03:00:00+00:00")):
        root = make_run(runs, run_id, checkpoint=False)
        for name in ("launch.json", "summary.json"):
            data = json.loads((root / name).read_text())
            data["started_at"] = started
            (root / name).write_text(json.dumps(data))
    # b-early: a job of the user's own, its steps in `progress` only.
    summary = json.loads((runs / "b-early" / "summary.json").read_text())
    for key in ("steps", "final_loss", "eval_accuracy", "images_per_sec"):
        summary.pop(key)
    summary["progress"] = {"source": "LAUNCH_STEP lines", "step": 300, "loss": 0.125,
                           "lines": 600}
    (runs / "b-early" / "summary.json").write_text(json.dumps(summary))
    # a-late: its timeline's goodput (launcher/runs/timeline.py) in the last column.
    summary = json.loads((runs / "a-late" / "summary.json").read_text())
    summary["timeline"] = {"wall_s": 10.0, "phases": [{"name": "training", "s": 10.0}],
                           "kept_steps_s": 7.0, "goodput": 0.7}
    (runs / "a-late" / "summary.json").write_text(json.dumps(summary))
    assert main(["runs", "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"2 run(s) in {runs}/, in the order they started (another folder: "
                        "--runs-dir DIR)")
    rows = [line.split() for line in lines[2:] if line.strip()]
    assert [r[0] for r in rows if r[0] in ("a-late", "b-early")] == ["b-early", "a-late"]
    early = next(r for r in rows if r[0] == "b-early")
    assert early[-4:] == ["300", "0.1250", "-", "-"]
    assert next(r for r in rows if r[0] == "a-late")[-1] == "70%"
    assert main(["runs", "--runs-dir", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.startswith(f"no runs in {tmp_path / 'none'}/ (a run made "
                                              "with --runs-dir DIR is listed by")
