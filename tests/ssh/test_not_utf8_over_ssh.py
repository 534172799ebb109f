"""Issue 38, class 5: bytes that are not UTF-8 in a job's argument or a variable's value (a file
name from another system; Python holds them as \\udcXX surrogates) pass as they are on --local,
and over SSH, whose command line is UTF-8 text, are refused before anything starts, naming the
argument (never a codec error in the middle of a start). A dry run refuses as the real run does.
Round 2's checks (tests/run/hostile.py): exit code, message, no traceback, nothing written
outside the case's folder, no process left."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from tests.run.hostile import Guard, check, run_cli

pytestmark = pytest.mark.timeout(120)

NOT_UTF8 = "caf\udce9.txt"   # b"caf\xe9.txt" (Latin-1) as Python reads it from argv
NOT_SCRIPT = "caf\udce9.py"


@dataclass
class Case:
    id: str
    argv: list[str]
    code: int
    says: list[str]


def inventory_args() -> list[str]:
    return ["-i", "hosts.yml", "--nodes", "2"]


CASES = [
    Case("script-name-over-ssh", ["run", *inventory_args(), NOT_SCRIPT, "--dry-run"], 2,
         ["node h0: argument 'caf\\udce9.py' holds bytes that are not UTF-8",
          "over SSH cannot carry"]),
    Case("env-value-over-ssh", ["run", *inventory_args(), "main.py", "--dry-run", "--env",
                                f"DATA={NOT_UTF8}"], 2,
         ["node h0: the value of 'DATA' holds bytes that are not UTF-8"]),
    # The same bytes on this machine reach the job as they are: nothing to refuse.
    Case("script-name-local", ["run", "--local", "--nodes", "2", NOT_SCRIPT, "--dry-run"], 0,
         ["script caf\\udce9.py"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bytes_that_are_not_utf8(tmp_path, monkeypatch, capsys, case):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        f"h{i}": {"ansible_host": f"10.0.0.{i + 1}"} for i in range(2)}}}))
    (case_dir / "main.py").write_text("print('hello')\n")
    (case_dir / NOT_SCRIPT).write_text("print('hello')\n")
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    check(outcome, case.code, case.says)
    if case.code:
        # The secret a --env value may be is not printed back.
        assert NOT_UTF8 not in outcome.text
    assert not (case_dir / "runs").exists()
    guard.verify()
