"""Hostile input, round 3 (issue 38, class 5: tracebacks), as a table with round 2's checks
(tests/run/hostile.py): exit code, a message naming what is wrong, no traceback, nothing
written or moved outside the case's folder, no process left.

- `launch report` on records launch reads with their optional keys missing (a restart record,
  a failure record, an auto decision): every nested record is read whole, its optional keys at
  their defaults (launcher/report/build.py _record);
- `launch init --script`/`-m` with a name a recipe cannot hold (a newline, bytes that are not
  UTF-8): refused naming the flag, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.run.hostile import CliCase, Guard, check, run_cli
from tests.run.test_hostile_runfolders import RUN, make_run

pytestmark = pytest.mark.timeout(120)


def edit(name: str, change) -> callable:
    def plant(root: Path) -> None:
        path = root / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
    return plant


def restarts(*records):
    return edit("summary.json", lambda d: d.update(restarts=list(records)))


MINIMAL = {"node": "node0", "kind": "crash", "reason": "rank 1 exited 1", "at_time_s": 3.5}


Case = CliCase


CASES = [
    Case("restart-without-optional-keys", ["report", RUN], 0,
         "restart after 3.5 s, node node0 (crash): rank 1 exited 1", restarts(MINIMAL)),
    Case("failure-record-minimal", ["report", RUN], 0, "no restart left: the run stopped",
         restarts({**MINIMAL, "restarted": False})),
    Case("two-restarts-one-minimal", ["report", RUN], 0, "4 step(s) redone",
         restarts(MINIMAL, {**MINIMAL, "steps_lost": 4, "recovered_in_s": 2.0})),
    Case("auto-choice-only", ["report", RUN], 0, "comm_hook auto",
         edit("node0/result.json", lambda d: d.update(auto={"choice": "powersgd"}))),
    Case("auto-decided-without-reason", ["report", RUN], 0, "comm_hook auto chose PowerSGD",
         edit("node0/result.json",
              lambda d: d.update(auto={"choice": "powersgd", "decided_at_step": 5}))),
    Case("hang-without-lists", ["report", RUN], 0, "stuck: none stood out",
         edit("summary.json", lambda d: d.update(hang={
             "detected_at_s": 9.0, "idle_s": 300.0, "timeout_s": 300.0, "action": "stop"}))),
    Case("init-script-newline", ["init", "--script", "a\nb.py"], 2,
         ["--script 'a\\nb.py'", "control characters (\\n)"], files={"a\nb.py": ""}),
    Case("init-module-newline", ["init", "-m", "pkg\nmod"], 2,
         ["-m 'pkg\\nmod'", "control characters"]),
    Case("init-script-not-utf8", ["init", "--script", "caf\udce9.py"], 2,
         "bytes that are not UTF-8", files={"caf\udce9.py": ""}),
    Case("init-script-escape", ["init", "--script", "x\x1b[31m.py"], 2,
         "control characters (\\x1b)", files={"x\x1b[31m.py": ""}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_round3_tracebacks(tmp_path, monkeypatch, capsys, case):
    case_dir = tmp_path / "case"
    root = make_run(case_dir / "runs", checkpoint=False)
    if case.plant:
        case.plant(root)
    for name, text in case.files.items():
        (case_dir / name).write_text(text)
    before = sorted(p.name for p in case_dir.iterdir())
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    check(outcome, case.code, case.says)
    guard.verify()
    if case.argv[0] == "init":   # refused before anything is written
        assert sorted(p.name for p in case_dir.iterdir()) == before
