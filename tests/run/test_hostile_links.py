"""report.html links only to what launch wrote (issue 38, class 3), as a table with round 2's
checks (tests/run/hostile.py): tampered run folders whose file names and summary.json fields
hold URLs, schemes, absolute paths, `..` and links; `launch report` writes the page, every
href on it is a relative "./" URL of a regular file inside the run folder (page.href makes
every link), no scheme from input reaches one, nothing is written outside the case's folder,
nothing is left running."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from launcher.report.page import href
from tests.run.hostile import Guard, check, run_cli
from tests.run.test_hostile_runfolders import RUN, make_run

pytestmark = pytest.mark.timeout(120)

HREF = re.compile(r'href="([^"]*)"')   # <a href> and the SVG's xlink:href


def hang(*dumps: str, files: tuple[str, ...] = (), links: dict[str, str] | None = None):
    """A summary whose hang names `dumps` as its stack files; `files` made in the run folder,
    `links` (name -> target) planted as symlinks."""
    def plant(root: Path) -> None:
        data = json.loads((root / "summary.json").read_text())
        data["hang"] = {"detected_at_s": 9.0, "idle_s": 300.0, "timeout_s": 300.0,
                        "action": "stop", "stuck": [], "in_collective": [],
                        "dumps": list(dumps)}
        (root / "summary.json").write_text(json.dumps(data))
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("stacks\n")
        for name, target in (links or {}).items():
            os.symlink(target.replace("ROOT", str(root)), root / name)
    return plant


def failed(log_node: str, hints: list[str], files: tuple[str, ...] = ()):
    """A failed run whose failure names `log_node` and carries `hints` (report.md quotes both
    in `code` spans)."""
    def plant(root: Path) -> None:
        data = json.loads((root / "summary.json").read_text())
        data.update(status="failed", failure={"first_failed_node": log_node,
                                              "reason": "rank 0 exited 1",
                                              "last_lines": ["boom"], "hints": hints})
        (root / "summary.json").write_text(json.dumps(data))
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("x\n")
    return plant


@dataclass
class Case:
    id: str
    plant: object
    linked: tuple[str, ...] = ()     # hrefs the page must carry (the rest: none at all)


CASES = [
    Case("javascript-file-name", hang("javascript:alert(1)", files=("javascript:alert(1)",))),
    Case("javascript-mixed-case", hang("JaVaScRiPt:alert(1)", files=("JaVaScRiPt:alert(1)",))),
    Case("url-in-summary", hang("https://evil.example/x",
                                files=("https:/evil.example/x",))),
    Case("data-url-in-hint", failed(None, ["see `data:text/html,<script>alert(1)</script>`"])),
    Case("protocol-relative", hang("//evil.example/x")),
    Case("absolute-path", hang("/etc/passwd")),
    Case("dot-dot", hang("../r2/node0/node.log", "node0/../../x", files=("x",))),
    Case("backslash", hang("node0\\..\\..\\x", files=("node0\\..\\..\\x",))),
    Case("link-to-outside", hang("node0/stacks.txt",
                                 links={"node0/stacks.txt": "ROOT/../../../outside.txt"})),
    Case("link-to-inside", hang("node0/stacks.txt", files=("node0/real.txt",),
                                links={"node0/stacks.txt": "real.txt"})),
    Case("folder-link", hang("sub/node.log", links={"sub": "ROOT/node0"})),
    Case("folder-not-file", hang("node0")),
    Case("fifo", hang("node0/fifo.txt")),
    Case("node-name-scheme", failed("javascript:alert(1)//", [],
                                    files=("javascript:alert(1)/node.log",))),
    Case("a-real-stack-file", hang("node0/stacks-1.txt", "nothing-here.txt",
                                   files=("node0/stacks-1.txt",)),
         linked=("./node0/stacks-1.txt",)),
    Case("quotes-and-spaces", hang('node0/a b"<x>.txt', files=('node0/a b"<x>.txt',)),
         linked=("./node0/a%20b%22%3Cx%3E.txt",)),
    Case("the-failing-node-log", failed("node0", ["look at `node0/node.log`"]),
         linked=("./node0/node.log",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_report_links_only_to_what_launch_wrote(tmp_path, monkeypatch, capsys, case):
    case_dir = tmp_path / "case"
    root = make_run(case_dir / "runs", checkpoint=False)
    (tmp_path / "outside.txt").write_text("secret\n")
    case.plant(root)
    if case.id == "fifo":
        os.mkfifo(root / "node0" / "fifo.txt")
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(["report", RUN], case_dir, monkeypatch, capsys)
    check(outcome, 0, "# Run report: r1")
    guard.verify()
    page = (root / "report.html").read_text()
    every = HREF.findall(page)
    # The plots' SVG refers to its own markers (xlink:href="#m..."): never input.
    assert all(re.fullmatch(r"#[A-Za-z0-9_-]+", h) for h in every if h.startswith("#"))
    hrefs = [h for h in every if not h.startswith("#")]
    assert sorted(set(hrefs)) == sorted(case.linked), hrefs
    for url in hrefs:
        assert re.fullmatch(r"\./[A-Za-z0-9%._~/-]+", url), url
        target = root / unquote(url[2:])
        assert stat.S_ISREG(os.lstat(target).st_mode) and root in target.parents


# The one function every link goes through, on paths no run folder can hold.
@pytest.mark.parametrize("path,url", [
    ("node0/node.log", "./node0/node.log"),
    ("a b/c#d?e", "./a%20b/c%23d%3Fe"),
    ("javascript:alert(1)", None), ("JAVASCRIPT:x", None), ("vbscript:x", None),
    ("https://e.example", None), ("//e.example/x", None), ("/etc/passwd", None),
    ("../x", None), ("a/../../x", None), ("a\\b", None), ("a\nb", None), ("\x00", None),
    ("", None), (".", None), ("x" * 2000, None),
])
def test_href_refuses_anything_but_a_relative_path(path, url):
    assert href(path) == url
