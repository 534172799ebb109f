"""Input-driven blow-ups (issue 38, class 4), as tables: every parser of a job's output and of
ignore files runs in time linear in its input, and a line it cannot read is kept as text,
never the end of the stream.

- ignore patterns that backtrack exponentially in a regular expression (`*a*a*a...` against a
  long name): `launch run --dry-run` answers (bound: the subprocess timeout);
- LAUNCH_STEP lines that jump to a huge step, hold 400 digits, or an extreme finite loss: one
  real `launch run --local` of a script printing each, then a marker line: every marker
  reaches the terminal and the node's log, the run succeeds with a report, nothing is written
  outside the case's folder, nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from launcher.runs.progress import StepLines, parse_step
from launcher.workdir.gitignore import parse
from tests.conftest import launch_cmd
from tests.run.hostile import processes_naming, snapshot

pytestmark = pytest.mark.timeout(300)

# (id, .gitignore line, a file name in the project, whether the rule leaves it out)
IGNORE_CASES = [
    ("star-a-40", b"*a" * 40, "a" * 240 + "b", False),
    ("star-a-40-matching", b"*a" * 40, "a" * 240, True),
    ("question-stars", b"?*" * 60 + b"x", "y" * 240, False),
    ("double-stars", b"**/" * 30 + b"*a*a*a*a*a*a*a*a*a*a*a*c", "a" * 200, False),
    ("bracket-stars", b"*[ab]" * 40 + b"c", "ab" * 110, False),
    ("anchored", b"d/" + b"*a" * 40 + b"b", "a" * 240, False),
]


@pytest.mark.parametrize("line,name,ignored", [c[1:] for c in IGNORE_CASES],
                         ids=[c[0] for c in IGNORE_CASES])
def test_an_ignore_rule_is_matched_in_linear_time(tmp_path, line, name, ignored):
    rule = parse(line + b"\n", ".gitignore")[0]
    assert rule.matches(name.encode(), False) is ignored
    # The whole path: `launch run --dry-run` of a project with the rule and the file.
    project = tmp_path / "a" / "b" / "project"
    (project / "d").mkdir(parents=True)
    (project / "show.py").write_text("print('hi')\n")
    (project / ".gitignore").write_bytes(line + b"\n")
    (project / name).write_text("x")
    (project / "d" / name).write_text("x")
    before = snapshot(tmp_path, skip=project)
    proc = subprocess.run(launch_cmd("run", "show.py", "--local", "--nodes", "1", "--dry-run"),
                          cwd=project, env={**os.environ, "LAUNCH_HOME": str(project / "home")},
                          text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert snapshot(tmp_path, skip=project) == before


# (id, the line the job prints, the step launch keeps from it: None = not a step line)
STEP_CASES = [
    ("loss-1e308", "LAUNCH_STEP step=1 loss=1e308 busy_s=0.1", 1),
    ("loss-minus-1e308", "LAUNCH_STEP step=2 loss=-1e308 busy_s=0.1", 2),
    ("busy-1e308", "LAUNCH_STEP step=3 loss=1 busy_s=1e308", None),
    ("samples-23-digits", "LAUNCH_STEP step=3 samples=99999999999999999999999", None),
    ("step-400-digits", "LAUNCH_STEP step=" + "9" * 400 + " loss=1", None),
    ("step-5000-digits", "LAUNCH_STEP step=" + "9" * 5000, None),
    ("step-10-15", "LAUNCH_STEP step=1000000000000000 loss=1", None),
    ("step-jump-10-12", "LAUNCH_STEP step=1000000000000 loss=0.5 busy_s=0.2", 10**12),
    ("step-unicode-digits", "LAUNCH_STEP step=\u0663\u0663 loss=1", None),
    ("long-line", "LAUNCH_STEP step=4 " + "x=1 " * 5000, None),
]


@pytest.mark.parametrize("line,step", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_a_step_line_is_read_or_kept_as_text(line, step):
    parsed = parse_step(line)
    assert (parsed.step if parsed else None) == step
    # Two ranks, the second far behind and then jumping: the straggler blocks are judged
    # once each, not once per step number.
    lines = StepLines()
    for rank in ("0", "1"):
        lines.line("n0", rank, "LAUNCH_STEP step=5 loss=1 busy_s=0.1")
        lines.line("n0", rank, line)
        lines.line("n0", rank, "LAUNCH_STEP step=1000000000000 loss=1 busy_s=0.1")
    assert lines.summary()["step"] == 10**12


STEPS_SCRIPT = "import os\nrank = os.environ['LOCAL_RANK']\n" + "".join(
    f"print({line!r}, flush=True)\nprint('after ' + {case!r} + ' on ' + rank, flush=True)\n"
    for case, line, _ in STEP_CASES)


@pytest.mark.slow   # a real 2-rank run: the fast tier keeps the parser-level cases above
def test_a_real_run_keeps_every_line_after_a_hostile_step_line_and_reports(tmp_path):
    project = tmp_path / "a" / "b" / "project"
    project.mkdir(parents=True)
    (project / "steps.py").write_text(STEPS_SCRIPT)
    before = snapshot(tmp_path, skip=project)
    proc = subprocess.run(
        launch_cmd("run", "steps.py", "--local", "--nodes", "1", "--nproc-per-node", "2",
                   "--run-id", "blow"),
        cwd=project, env={**os.environ, "LAUNCH_HOME": str(project / "home")}, text=True,
        capture_output=True, timeout=240, stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "output stream ended" not in text, text[-3000:]
    assert proc.returncode == 0, text[-3000:]
    run = project / "runs" / "blow"
    log = (run / "node0" / "node.log").read_text()
    for case, _, _ in STEP_CASES:
        for rank in ("0", "1"):
            assert f"after {case} on {rank}" in proc.stdout, (case, proc.stdout[-3000:])
            assert f"after {case} on {rank}" in log, case
    assert (run / "report.html").is_file() and "no run report" not in text
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["progress"]["step"] == 10**12
    assert snapshot(tmp_path, skip=project) == before
    assert processes_naming(str(project)) == []
