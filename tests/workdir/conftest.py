from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def launch_home(tmp_path, monkeypatch):
    """The scan's hash cache goes to a folder of the test's own, whatever the caller's
    LAUNCH_HOME."""
    home = tmp_path / "launch-home"
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    return home


@dataclass(frozen=True)
class Link:
    target: str


def make_tree(root: Path, spec: dict) -> Path:
    """Files (path -> text or bytes), folders (path ending in /), links (path -> Link)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, value in spec.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, Link):
            os.symlink(value.target, path)
        elif isinstance(value, bytes):
            path.write_bytes(value)
        else:
            path.write_text(value)
    return root


def git_env(home: Path) -> dict:
    """git with no configuration but the repository's own (no global excludes file)."""
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    if not shutil.which("git"):
        pytest.skip("git is the oracle of these tests: apt-get install git")
    return subprocess.run(["git", *args], cwd=cwd, env=git_env(cwd), input=stdin,
                          capture_output=True, check=True).stdout


def git_shipped(cwd: Path) -> set[str]:
    """What git calls untracked and not ignored under `cwd` (nothing is committed, so that
    is every file it would add): the files and links launch must ship."""
    out = git(cwd, "ls-files", "--others", "--exclude-standard", "-z")
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def shipped(manifest) -> set[str]:
    return {e.path for e in manifest.entries if e.kind in ("file", "link")}


PROJECT = {
    "train.py": "import pkg\nprint(pkg.VALUE)\n",
    "pkg/__init__.py": "VALUE = 42\n",
    "pkg/data.csv": "a,b\n1,2\n",
    "run.sh": "#!/bin/sh\nexec python train.py\n",
    "same_a.txt": "duplicate content",
    "same_b.txt": "duplicate content",
    "outputs/": None,
    "config": Link("pkg/data.csv"),
    "pkglink": Link("pkg"),
    ".gitignore": "*.ckpt\n",
    "model.ckpt": "not shipped",
}


BOOKKEEPING = {".launch-lock", ".launch-shipped.json"}


def tree_of(root: Path) -> dict:
    """Everything under root as the job sees it (launch's two bookkeeping files aside): kind,
    mode, content or target."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            if folder == str(root) and name in BOOKKEEPING:
                continue
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", oct(st.st_mode & 0o777))
            else:
                out[rel] = ("file", oct(st.st_mode & 0o777), path.read_bytes(), st.st_mtime_ns)
    return out


def expected_tree(manifest) -> dict:
    out = {}
    for e in manifest.entries:
        if e.kind == "link":
            out[e.path] = ("link", e.target)
        elif e.kind == "dir":
            out[e.path] = ("dir", oct(e.mode | 0o700))
        else:
            out[e.path] = ("file", oct(e.mode), (manifest.root / e.path).read_bytes(),
                           e.mtime_ns)
    return out
