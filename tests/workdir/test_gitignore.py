"""launch's reading of .gitignore against git itself: for every tree below, the files launch
ships are exactly those `git ls-files --others --exclude-standard` would add, and every rule
launch names for a left-out path is the one `git check-ignore -v` names."""

from __future__ import annotations

import os
import random

import pytest

from launcher.workdir import gitignore
from launcher.workdir.scan import GIT_REASON, scan_workdir
from tests.workdir.conftest import Link, git, git_shipped, make_tree, shipped

# name -> tree; every tree holds the files both sides of each rule's edge.
CASES = {
    "nested names": {
        ".gitignore": "*.ckpt\n__pycache__/\n",
        "model.ckpt": "", "a/b/c/deep.ckpt": "", "a/b/keep.py": "",
        "a/__pycache__/m.pyc": "", "__pycache__/n.pyc": "", "ckpt.py": "",
    },
    "negation": {
        ".gitignore": "*.log\n!keep.log\n!/sub/also.log\n",
        "a.log": "", "keep.log": "", "sub/keep.log": "", "sub/also.log": "", "sub/b.log": "",
        "deep/sub/also.log": "",
    },
    "directory only": {
        ".gitignore": "build/\nout/\n",
        "build/x.o": "", "src/build": "a file named build", "src/out/y": "", "out": "",
        "lib/build/z.o": "",
    },
    "anchored and middle slash": {
        ".gitignore": "/top.txt\ndoc/*.txt\n/logs\n",
        "top.txt": "", "sub/top.txt": "", "doc/a.txt": "", "doc/sub/b.txt": "",
        "other/doc/c.txt": "", "logs/l1": "", "sub/logs/l2": "", "doc/a.md": "",
    },
    "double star": {
        ".gitignore": "**/cache\nlogs/**\na/**/z\n**/tmp/**\nx**y\n",
        "cache": "", "p/q/cache/f": "", "logs/1/2": "", "logsx": "", "k/logs/3": "",
        "a/z": "", "a/b/z": "", "a/b/c/z": "", "b/a/z": "", "tmp/x": "", "m/tmp/n/o": "",
        "xany": "", "xy": "", "xay": "", "x/y": "", "keep": "",
    },
    "wildcards and classes": {
        ".gitignore": "file?.txt\n[abc].dat\n[!x]y.bin\n[a-c]z\n[[:digit:]]*.out\n[]]br\n"
                      "r[^a]\n[[:upper:][:space:]]u\n",
        "file1.txt": "", "file12.txt": "", "file.txt": "", "a.dat": "", "d.dat": "",
        "ay.bin": "", "xy.bin": "", "bz": "", "dz": "", "7run.out": "", "run.out": "",
        "]br": "", "rb": "", "ra": "", "Xu": "", " u": "", "xu": "",
    },
    "escapes, comments and spaces": {
        ".gitignore": "# a comment\n\\#hash\n\\!bang\ntrail   \nspace\\ \n   \n",
        "#hash": "", "!bang": "", "# a comment": "", "trail": "", "trail   ": "",
        "space ": "", "space": "", "bang": "",
    },
    "deeper files decide": {
        ".gitignore": "*.dat\n*.tmp\n",
        "x.dat": "", "x.tmp": "",
        "sub/.gitignore": "!*.dat\n/local.txt\n",
        "sub/y.dat": "", "sub/local.txt": "", "sub/deep/local.txt": "", "sub/deep/z.dat": "",
        "sub/y.tmp": "",
    },
    "no re-include inside an excluded folder": {
        ".gitignore": "data/\n!data/keep.txt\nmore/*\n!more/keep.txt\nfoo/**\n!foo/bar/\n",
        "data/keep.txt": "", "data/drop.txt": "", "more/keep.txt": "", "more/drop.txt": "",
        "more/sub/keep.txt": "", "foo/bar/x": "", "foo/y": "",
    },
    "rules in an ignored folder are not read": {
        ".gitignore": "vendor/\n",
        "vendor/.gitignore": "!*\n", "vendor/lib.py": "",
    },
    "CRLF, BOM and odd lines": {
        ".gitignore": b"\xef\xbb\xbf*.a\r\n!\r\n/\r\n[abc\r\ntrailing\\\n*.b",
        "x.a": "", "x.b": "", "[abc": "", "a": "", "trailing\\": "",
    },
    "a link is a file to dir-only rules": {
        ".gitignore": "linked/\nlinkfile\n",
        "real/f": "", "linked": Link("real"), "linkfile": Link("real/f"),
    },
    "bytes, not characters": {
        ".gitignore": "caf?.txt\nna??.md\n",
        "café.txt": "", "cafe.txt": "", "naïve.md": "", "nabc.md": "",
    },
    "the ignore file ignoring itself": {
        ".gitignore": ".gitignore\n*.x\n", "a.x": "", "b.y": "",
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_files_as_git(tmp_path, name):
    root = make_tree(tmp_path / "repo", CASES[name])
    git(root, "init", "-q")
    manifest = scan_workdir(root)
    assert shipped(manifest) == git_shipped(root)
    _same_rules_as_git(root, manifest)


def _same_rules_as_git(root, manifest):
    """Each left-out path: git check-ignore names the same file, line and pattern."""
    paths = [x for x in manifest.excluded if x.reason != GIT_REASON]
    if not paths:
        return
    out = git(root, "check-ignore", "-v", "-z", "--stdin",
              stdin=b"\0".join(os.fsencode(x.path.rstrip("/")) for x in paths) + b"\0")
    fields = out.split(b"\0")
    answers = {}
    for i in range(0, len(fields) - 3, 4):
        source, line, pattern, path = (f.decode() for f in fields[i:i + 4])
        answers[path] = f"{source}:{line} `{pattern}`"
    assert {x.path.rstrip("/"): x.reason for x in paths} == answers


def test_folder_inside_a_repository_reads_the_rules_above_it(tmp_path):
    repo = make_tree(tmp_path / "repo", {
        ".gitignore": "*.ckpt\n/proj/only_here.txt\n/only_top.txt\n",
        "proj/.gitignore": "!special.ckpt\n",
        "proj/a.ckpt": "", "proj/special.ckpt": "", "proj/only_here.txt": "",
        "proj/only_top.txt": "", "proj/sub/only_here.txt": "", "proj/excl.local": "",
        "proj/code.py": "",
    })
    git(repo, "init", "-q")
    (repo / ".git" / "info" / "exclude").write_text("*.local\n")
    manifest = scan_workdir(repo / "proj")
    assert shipped(manifest) == git_shipped(repo / "proj") == {
        ".gitignore", "special.ckpt", "only_top.txt", "sub/only_here.txt", "code.py"}
    reasons = {x.path: x.reason for x in manifest.excluded}
    assert reasons["a.ckpt"] == "../.gitignore:1 `*.ckpt`"
    assert reasons["excl.local"] == "../.git/info/exclude:1 `*.local`"


def test_launchignore_adds_to_gitignore(tmp_path):
    """A .launchignore counts as if appended to the .gitignore of its folder: git, given the
    two files joined, must agree."""
    gitignore_text = "*.ckpt\nwandb/\n"
    launch_text = "data/\n!best.ckpt\n*.npz\n"
    sub_text = "!keep.npz\n"
    tree = {"a.ckpt": "", "best.ckpt": "", "wandb/run": "", "data/x": "", "x.npz": "",
            "sub/keep.npz": "", "sub/drop.npz": "", "code.py": ""}
    ours = make_tree(tmp_path / "ours", {**tree, ".gitignore": gitignore_text,
                                         ".launchignore": launch_text,
                                         "sub/.launchignore": sub_text})
    joined = make_tree(tmp_path / "joined", {**tree, ".gitignore": gitignore_text + launch_text,
                                             "sub/.gitignore": sub_text})
    git(joined, "init", "-q")
    expected = {p.replace("sub/.gitignore", "sub/.launchignore") for p in git_shipped(joined)}
    expected = expected - {".gitignore"} | {".gitignore", ".launchignore"}
    manifest = scan_workdir(ours)
    assert shipped(manifest) == expected
    assert "best.ckpt" in expected and "sub/keep.npz" in expected
    reasons = {x.path: x.reason for x in manifest.excluded}
    assert reasons["data/"] == ".launchignore:1 `data/`"
    assert reasons["a.ckpt"] == ".gitignore:1 `*.ckpt`"


def test_dot_git_is_never_shipped(tmp_path):
    root = make_tree(tmp_path / "r", {".gitignore": "!.git\n", "sub/.git": "gitdir: x\n",
                                      "a.py": ""})
    git(root, "init", "-q")
    manifest = scan_workdir(root)
    assert shipped(manifest) == {".gitignore", "a.py"}
    assert {(x.path, x.reason) for x in manifest.excluded} == {
        (".git/", GIT_REASON), ("sub/.git", GIT_REASON)}


# ---- random trees and rules, against git ------------------------------------------------------

NAMES = ["a", "b", "ab", "a.txt", "b.log", "c.py", "x y", "[a]", "a-b", ".hid", "Ab"]
PIECES = ["a", "b", "*", "?", "**", "[ab]", "[!a]", "[a-c]", ".txt", ".log", "\\*", "x"]


def _random_tree(rng: random.Random) -> dict:
    tree: dict = {}
    for _ in range(rng.randint(4, 14)):
        depth = rng.randint(1, 4)
        path = "/".join(rng.choice(NAMES) for _ in range(depth))
        if not any(p.startswith(path + "/") or path.startswith(p.rstrip("/") + "/")
                   and not p.endswith("/") for p in tree) and path not in tree:
            tree[path] = ""
    return tree


def _random_rules(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 6)):
        parts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 2)))
                 for _ in range(rng.randint(1, 3))]
        line = "/".join(parts)
        if rng.random() < 0.25:
            line = "/" + line
        if rng.random() < 0.25:
            line += "/"
        if rng.random() < 0.3:
            line = "!" + line
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(40))
def test_random_rules_agree_with_git(tmp_path, seed):
    rng = random.Random(seed)
    tree = _random_tree(rng)
    tree[".gitignore"] = _random_rules(rng)
    folders = sorted({p.rsplit("/", 1)[0] for p in tree if "/" in p})
    for folder in rng.sample(folders, min(2, len(folders))):
        tree[f"{folder}/.gitignore"] = _random_rules(rng)
    root = make_tree(tmp_path / "repo", tree)
    git(root, "init", "-q")
    manifest = scan_workdir(root)
    assert shipped(manifest) == git_shipped(root), tree
    _same_rules_as_git(root, manifest)


def test_malformed_patterns_match_nothing():
    for pattern in (b"[abc", b"[[:nope:]]x", b"x\\", b"[a-"):
        (rule,) = gitignore.parse(pattern + b"\n", "t")
        assert not rule.matches(b"[abc", False) and not rule.matches(b"a", False)
