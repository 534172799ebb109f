"""The harness the hostile-input tables share (issue 25): a case runs the real CLI in this
process (`launcher.cli.main`), and is held to what a user must be able to count on: the exit
code, a message naming what is wrong, no traceback, nothing written or moved outside the
case's own folder, no process left behind. A case that would hang (a FIFO opened for reading)
is stopped by the test's timeout instead of answering: the tables mark theirs."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from launcher.cli import main


@dataclass
class CliCase:
    """One row of a table of `launch` command lines: what it must exit with and say; files
    written into the case's folder first, `plant(run folder)` tampering with a run first."""

    id: str
    argv: list[str]
    code: int
    says: str | list[str]
    plant: object = None
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def children() -> set[int]:
    """Processes whose parent is this test process."""
    found = set()
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.add(int(entry.name))
    return found


def processes_naming(text: str) -> list[int]:
    """Processes (but this one) whose command line holds `text`: for a case run in a
    subprocess, whose leftovers are not this process's children."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every entry under `root` (but `skip`): its kind, link target, size and content hash,
    without following links or opening anything that is not a regular file."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                out[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest() \
                    if info.st_size < 1 << 20 else info.st_size
                out[str(path)] = ("file", digest)
            else:
                out[str(path)] = (stat.S_IFMT(info.st_mode),)
    return out


def run_cli(argv: list[str], cwd: Path, monkeypatch, capsys) -> Outcome:
    """`launch ARGV` in this process, from `cwd`, with LAUNCH_HOME in the case's folder."""
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("LAUNCH_HOME", str(cwd / "home"))
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:   # argparse's own refusals
        code = exit_.code if isinstance(exit_.code, int) else 2
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def check(outcome: Outcome, code: int, says: str | list[str], *, stream: str = "any") -> None:
    text = {"out": outcome.out, "err": outcome.err}.get(stream, outcome.text)
    assert "Traceback" not in outcome.text, outcome.text[-3000:]
    assert outcome.code == code, (outcome.code, outcome.text[-3000:])
    for fragment in [says] if isinstance(says, str) else says:
        assert fragment in text, (fragment, text[-3000:])
    assert len(outcome.text) < 50_000   # values quoted shortened, never a whole file


class Guard:
    """Around one case: the tree outside the case's folder, and this process's children, are
    the same afterwards."""

    def __init__(self, tmp_path: Path, case_dir: Path):
        self.tmp_path, self.case_dir = tmp_path, case_dir
        self.before = snapshot(tmp_path, skip=case_dir)
        self.procs = children()

    def verify(self) -> None:
        after = snapshot(self.tmp_path, skip=self.case_dir)
        changed = {k for k in set(after) | set(self.before) if after.get(k) != self.before.get(k)}
        assert not changed, sorted(changed)
        left = children() - self.procs
        assert not left, f"processes left behind: {sorted(left)}"
