"""ship_local and the node side it shares with ship_ssh: exact trees, content-addressed
re-ships, runs that cannot reach each other's files, concurrent and interrupted ships."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher import workdir_node as node
from launcher.workdir import WorkdirError, scan_workdir
from launcher.workdir_sync import ship_local
from tests.workdir.conftest import PROJECT, expected_tree, make_tree, tree_of

@pytest.fixture
def project(tmp_path):
    root = make_tree(tmp_path / "project", PROJECT)
    (root / "run.sh").chmod(0o755)
    (root / "pkg/data.csv").chmod(0o600)
    return root


def test_first_ship_builds_exactly_the_manifest(project, tmp_path):
    manifest = scan_workdir(project)
    stats = ship_local(manifest, tmp_path / "runs/r1/workdir", tmp_path / "cache")
    assert tree_of(tmp_path / "runs/r1/workdir") == expected_tree(manifest)
    assert "model.ckpt" not in tree_of(tmp_path / "runs/r1/workdir")
    # The two files with one content travel once.
    assert (stats.files_sent, stats.files_total) == (manifest.files - 1, manifest.files)
    assert stats.bytes_sent == manifest.total_bytes - len("duplicate content")


def test_reships_send_only_what_changed(project, tmp_path):
    cache = tmp_path / "cache"
    ship_local(scan_workdir(project), tmp_path / "r1", cache)
    unchanged = ship_local(scan_workdir(project), tmp_path / "r2", cache)
    assert (unchanged.files_sent, unchanged.bytes_sent) == (0, 0)
    assert tree_of(tmp_path / "r2") == tree_of(tmp_path / "r1")

    (project / "pkg/__init__.py").write_text("VALUE = 43\n")
    (project / "same_b.txt").unlink()
    manifest = scan_workdir(project)
    one = ship_local(manifest, tmp_path / "r3", cache)
    assert (one.files_sent, one.bytes_sent) == (1, len("VALUE = 43\n"))
    assert tree_of(tmp_path / "r3") == expected_tree(manifest)
    assert not (tmp_path / "r3/same_b.txt").exists()
    assert (tmp_path / "r1/pkg/__init__.py").read_text() == "VALUE = 42\n"


def test_a_job_changing_its_files_in_place_changes_no_other_run(project, tmp_path):
    cache = tmp_path / "cache"
    manifest = scan_workdir(project)
    ship_local(manifest, tmp_path / "r1", cache)
    ship_local(manifest, tmp_path / "r2", cache)
    # The job of r1 rewrites, truncates and chmods its files without replacing them.
    with open(tmp_path / "r1/train.py", "r+b") as f:
        f.write(b"CORRUPTED")
    os.truncate(tmp_path / "r1/pkg/data.csv", 0)
    (tmp_path / "r1/run.sh").chmod(0o600)
    ship_local(manifest, tmp_path / "r3", cache)
    assert tree_of(tmp_path / "r2") == tree_of(tmp_path / "r3") == expected_tree(manifest)
    # Its own copies: no inode is shared with the cache or another run.
    for run in ("r1", "r2", "r3"):
        assert (tmp_path / run / "train.py").stat().st_nlink == 1


def test_the_destination_must_be_new_or_empty(project, tmp_path):
    manifest = scan_workdir(project)
    (tmp_path / "empty").mkdir()
    ship_local(manifest, tmp_path / "empty", tmp_path / "cache")
    with pytest.raises(WorkdirError, match=f"{tmp_path / 'empty'} is not empty"):
        ship_local(manifest, tmp_path / "empty", tmp_path / "cache")
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkdirError, match="exists and is not a folder"):
        ship_local(manifest, tmp_path / "file", tmp_path / "cache")
    with pytest.raises(WorkdirError, match="overlap"):
        ship_local(manifest, tmp_path / "cache" / "run", tmp_path / "cache")


def test_a_file_changed_after_the_scan_fails_the_ship_and_leaves_nothing(project, tmp_path):
    manifest = scan_workdir(project)
    (project / "pkg/__init__.py").write_text("VALUE = 0\n")
    with pytest.raises(WorkdirError) as err:
        ship_local(manifest, tmp_path / "r1", tmp_path / "cache")
    assert f"{project / 'pkg/__init__.py'} changed after launch scanned" in str(err.value)
    assert os.listdir(tmp_path / "r1") == []
    (project / "pkg/__init__.py").unlink()
    with pytest.raises(WorkdirError, match="pkg/__init__.py changed after launch scanned"):
        ship_local(manifest, tmp_path / "r2", tmp_path / "cache")


def test_concurrent_ships_to_one_cache(project, tmp_path):
    """Eight ships at once, four folder states, one cache: each run gets its own state."""
    cache = tmp_path / "cache"
    manifests, expected = [], []
    for i in range(4):
        state = tmp_path / f"state{i}"
        shutil.copytree(project, state, symlinks=True)
        (state / "pkg/__init__.py").write_text(f"VALUE = {i}\n" * (i + 1))
        for k in range(i + 1):
            (state / f"extra{k}.bin").write_bytes(bytes([k]) * 200_000)
        manifests.append(scan_workdir(state))
        expected.append(expected_tree(manifests[-1]))
    errors = []

    def one(i):
        try:
            ship_local(manifests[i % 4], tmp_path / f"r{i}", cache)
        except Exception as err:   # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(8):
        assert tree_of(tmp_path / f"r{i}") == expected[i % 4]


def _serve(dest: Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, node.__file__, "serve", str(dest), str(cache)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _frame(payload: dict) -> bytes:
    data = json.dumps(payload).encode()
    return struct.pack(">I", len(data)) + data


def test_a_ship_killed_midway_leaves_the_cache_usable(project, tmp_path):
    cache = tmp_path / "cache"
    (project / "big.bin").write_bytes(os.urandom(3_000_000))
    manifest = scan_workdir(project)
    proc = _serve(tmp_path / "r1", cache)
    assert proc.stdout.read(len(node.MAGIC)) == node.MAGIC
    proc.stdin.write(_frame({"entries": manifest.wire_entries(), "digest": manifest.digest}))
    proc.stdin.flush()
    (length,) = struct.unpack(">I", proc.stdout.read(4))
    missing = json.loads(proc.stdout.read(length))["missing"]
    big = next(e for e in manifest.entries if e.path == "big.bin")
    sources = {e.sha256: e for e in reversed(manifest.entries) if e.kind == "file"}
    for sha in missing:   # every object up to the big one, then half of it
        data = (project / sources[sha].path).read_bytes()
        if sha == big.sha256:
            proc.stdin.write(data[:len(data) // 2])
            proc.stdin.flush()
            break
        proc.stdin.write(data)
    for _ in range(1000):   # until the half object is being written
        if list((cache / "tmp").iterdir()):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (Path(node.Cache(str(cache)).object(big.sha256))).exists()
    stats = ship_local(manifest, tmp_path / "r2", cache)
    assert tree_of(tmp_path / "r2") == expected_tree(manifest)
    assert 0 < stats.files_sent < manifest.files   # what arrived before the kill stayed


def test_pruning_keeps_recent_states_and_waits_for_running_ships(project, tmp_path):
    cache = tmp_path / "cache"
    shas = []
    for i in range(node.KEEP_STATES + node.PRUNE_SLACK + 1):
        (project / "pkg/__init__.py").write_text(f"VALUE = {i}\n")
        manifest = scan_workdir(project)
        shas.append(next(e.sha256 for e in manifest.entries if e.path == "pkg/__init__.py"))
        if i == node.KEEP_STATES + node.PRUNE_SLACK:
            # Another ship holds the cache: this one must not prune under it.
            held = os.open(cache / "lock", os.O_RDWR)
            fcntl.flock(held, fcntl.LOCK_SH)
            ship_local(manifest, tmp_path / f"r{i}", cache)
            assert all(Path(node.Cache(str(cache)).object(s)).exists() for s in shas)
            os.close(held)
            ship_local(manifest, tmp_path / f"again{i}", cache)
        else:
            ship_local(manifest, tmp_path / f"r{i}", cache)
    store = node.Cache(str(cache))
    kept = [Path(store.object(s)).exists() for s in shas]
    assert kept == [False] * (len(shas) - node.KEEP_STATES) + [True] * node.KEEP_STATES
    assert len(os.listdir(cache / "states")) == node.KEEP_STATES
    assert os.listdir(cache / "tmp") == []
    (project / "pkg/__init__.py").write_text("VALUE = 0\n")
    again = ship_local(scan_workdir(project), tmp_path / "after", cache)
    assert again.files_sent == 1   # a pruned content is simply sent again


SHA = "0" * 64


@pytest.mark.parametrize("entries, why", [
    ([["../x", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([["/etc/passwd", "file", 0o644, 0, SHA, "", 0]], "is not a relative path"),
    ([["a/../b", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([["a//b", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([["x", "file", 0o644, 0, SHA, "", 0], ["x", "file", 0o644, 0, SHA, "", 0]],
     "listed twice"),
    ([["d/x", "file", 0o644, 0, SHA, "", 0]], "its folder 'd' is not listed"),
    # A file "under" a link would be written through it.
    ([["l", "link", 0o777, 0, "", "/etc", 0], ["l/passwd", "file", 0o644, 0, SHA, "", 0]],
     "its folder 'l' is not listed as a folder"),
    ([["l", "link", 0o777, 0, "", "../../etc", 0]], "escapes"),
    ([["l", "link", 0o777, 0, "", "/etc", 0]], "escapes"),
    ([["x", "file", 0o4755, 0, SHA, "", 0]], "bad mode"),
    ([["x", "file", 0o644, 0, "nothex", "", 0]], "bad sha256"),
    ([["x", "fifo", 0o644, 0, SHA, "", 0]], "unknown kind"),
])
def test_the_node_refuses_bad_manifests(entries, why):
    with pytest.raises(node.ShipError, match=why.replace("(", r"\(").replace(")", r"\)")):
        node.checked_entries(entries)


def test_the_node_program_runs_on_its_own(project, tmp_path):
    """As on a node: the file alone, standard library only, launch not importable."""
    manifest = scan_workdir(project)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "", "HOME": str(tmp_path)}
    code = Path(node.__file__).read_text()
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, "serve", "~/r1", "~/cache"], env=env, cwd="/",
        input=(_frame({"entries": manifest.wire_entries(), "digest": manifest.digest})
               + b"".join((project / e.path).read_bytes() for e in _first_of_each(manifest))),
        capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert tree_of(tmp_path / "r1") == expected_tree(manifest)


def _first_of_each(manifest):
    seen = set()
    for e in manifest.entries:
        if e.kind == "file" and e.sha256 not in seen:
            seen.add(e.sha256)
            yield e
