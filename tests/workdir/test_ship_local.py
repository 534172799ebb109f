"""ship_local and the node side it shares with ship_ssh: a copy per node kept across runs,
updated by content, owning only what launch wrote, safe beside running jobs and other ships."""

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

from launcher.workdir import node
from launcher.workdir.scan import WorkdirError, scan_workdir
from launcher.workdir.sync import ship_local
from tests.workdir.conftest import PROJECT, expected_tree, make_tree, tree_of


@pytest.fixture
def project(tmp_path):
    root = make_tree(tmp_path / "project", PROJECT)
    (root / "run.sh").chmod(0o755)
    (root / "pkg/data.csv").chmod(0o600)
    return root


def test_first_ship_builds_exactly_the_manifest(project, tmp_path):
    manifest = scan_workdir(project)
    stats = ship_local(manifest, tmp_path / "node/workdir")
    assert stats.dest == str(tmp_path / "node/workdir")
    assert tree_of(tmp_path / "node/workdir") == expected_tree(manifest)
    # The two files with one content travel once.
    assert (stats.files_sent, stats.files_total) == (manifest.files - 1, manifest.files)
    assert stats.bytes_sent == manifest.total_bytes - len("duplicate content")


def test_reships_send_and_write_only_what_changed(project, tmp_path):
    dest = tmp_path / "copy"
    ship_local(scan_workdir(project), dest)
    inodes = {p: (dest / p).stat().st_ino for p in ("train.py", "run.sh")}
    unchanged = ship_local(scan_workdir(project), dest)
    assert (unchanged.files_sent, unchanged.bytes_sent) == (0, 0)

    (project / "pkg/__init__.py").write_text("VALUE = 43\n")
    (project / "same_b.txt").unlink()
    (project / "config").unlink()
    (project / "new/deeper").mkdir(parents=True)
    os.utime(project / "train.py", (1, 1))   # the same content: not rewritten
    manifest = scan_workdir(project)
    one = ship_local(manifest, dest)
    assert (one.files_sent, one.bytes_sent) == (1, len("VALUE = 43\n"))
    got = tree_of(dest)
    want = expected_tree(manifest)
    assert got.pop("train.py")[:3] == want.pop("train.py")[:3]
    assert got == want
    assert {p: (dest / p).stat().st_ino for p in inodes} == inodes


def test_what_setup_and_jobs_wrote_stays(project, tmp_path):
    dest = tmp_path / "copy"
    ship_local(scan_workdir(project), dest)
    (dest / "build").mkdir()
    (dest / "build/ext.so").write_bytes(b"\x7fELF")
    (dest / "outputs/log.txt").write_text("from the job")
    (dest / "pkg/generated.py").write_text("X = 1\n")
    shutil.rmtree(project / "outputs")
    (project / "pkg/__init__.py").unlink()
    manifest = scan_workdir(project)
    ship_local(manifest, dest)
    got = tree_of(dest)
    assert got["build/ext.so"][2] == b"\x7fELF"
    assert got["outputs/log.txt"][2] == b"from the job"   # its folder left the manifest
    assert got["pkg/generated.py"][2] == b"X = 1\n"
    assert "pkg/__init__.py" not in got
    launched = {p: v for p, v in got.items()
                if not p.startswith(("build", "outputs")) and p != "pkg/generated.py"}
    assert launched == expected_tree(manifest)


def test_the_manifest_wins_a_name_a_job_took(project, tmp_path):
    dest = tmp_path / "copy"
    ship_local(scan_workdir(project), dest)
    (dest / "results/run1").mkdir(parents=True)   # the job's folders, where the user now
    (dest / "results/run1/x.txt").write_text("")  # puts a file and a link
    (dest / "latest/").mkdir()
    (dest / "cache.bin").write_text("the job's")  # and a folder
    (project / "results").write_text("now a file")
    (project / "latest").symlink_to("train.py")
    (project / "cache.bin").mkdir()
    (project / "cache.bin/inside.txt").write_text("in")
    manifest = scan_workdir(project)
    ship_local(manifest, dest)
    assert tree_of(dest) == expected_tree(manifest)


def test_files_a_job_changed_in_place_are_shipped_again(project, tmp_path):
    dest = tmp_path / "copy"
    manifest = scan_workdir(project)
    ship_local(manifest, dest)
    (tmp_path / "kept").mkdir()
    os.link(dest / "train.py", tmp_path / "kept/train.py")   # a job keeps a hard link
    before = (dest / "train.py").stat()
    with open(dest / "train.py", "r+b") as f:   # same size, time put back: only ctime tells
        f.write(b"CORRUPTED")
    os.utime(dest / "train.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.truncate(dest / "pkg/data.csv", 0)
    (dest / "run.sh").chmod(0o600)
    stats = ship_local(manifest, dest)
    # The two changed contents travel; run.sh's content is intact (checked, its ctime moved)
    # and is copied on the node with its mode put back.
    assert stats.files_sent == 2
    assert tree_of(dest) == expected_tree(manifest)
    # Replaced by rename, never rewritten in place: the job's hard link keeps its bytes.
    assert (tmp_path / "kept/train.py").read_bytes().startswith(b"CORRUPTED")


def test_a_busy_copy_is_never_changed(project, tmp_path):
    """A running job holds the lock shared: a ship with other content goes to a sibling
    (its unchanged files copied from the busy one, not sent); one with the same content
    shares the busy folder; with busy="wait" it waits for the job."""
    dest = tmp_path / "copy"
    first = scan_workdir(project)
    want_first = expected_tree(first)
    ship_local(first, dest)
    job = os.open(dest / ".launch-lock", os.O_RDWR)
    fcntl.flock(job, fcntl.LOCK_SH)
    (project / "pkg/__init__.py").write_text("VALUE = 43\n")
    second = scan_workdir(project)
    want_second = expected_tree(second)
    moved = ship_local(second, dest)
    assert moved.dest == f"{dest}.2" and moved.files_sent == 1
    assert tree_of(dest) == want_first
    assert tree_of(Path(moved.dest)) == want_second
    (project / "pkg/__init__.py").write_text(PROJECT["pkg/__init__.py"])
    shared = ship_local(scan_workdir(project), dest)
    assert (shared.dest, shared.files_sent) == (str(dest), 0)

    done = []
    waiter = threading.Thread(target=lambda: done.append(ship_local(second, dest, busy="wait")))
    waiter.start()
    time.sleep(0.5)
    assert not done and tree_of(dest) == want_first
    os.close(job)   # the job ends
    waiter.join()
    assert done[0].dest == str(dest) and tree_of(dest) == want_second


def test_the_destination_must_be_a_folder(project, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkdirError, match=f"{tmp_path / 'file'} exists and is not a folder"):
        ship_local(scan_workdir(project), tmp_path / "file")


def test_a_file_changed_after_the_scan_fails_and_changes_nothing(project, tmp_path):
    dest = tmp_path / "copy"
    ship_local(scan_workdir(project), dest)
    (project / "pkg/__init__.py").write_text("VALUE = 1\n")
    manifest = scan_workdir(project)
    before = tree_of(dest)
    (project / "pkg/__init__.py").write_text("VALUE = 2\n")
    with pytest.raises(WorkdirError) as err:
        ship_local(manifest, dest)
    assert f"shipping workdir {project} to {dest}: pkg/__init__.py changed after launch " \
           "scanned the folder" in str(err.value)
    assert tree_of(dest) == before
    assert [n for n in os.listdir(dest) if n.startswith(".launch-staging")] == []
    (project / "pkg/__init__.py").write_text("short")
    with pytest.raises(WorkdirError) as err:
        ship_local(manifest, dest)
    assert str(err.value) == (f"{project / 'pkg/__init__.py'} changed after launch scanned the "
                              "folder (or vanished): run again")
    (project / "pkg/__init__.py").unlink()
    with pytest.raises(WorkdirError, match="pkg/__init__.py changed after launch scanned"):
        ship_local(manifest, dest)
    assert tree_of(dest) == before


def test_a_proven_file_changed_after_the_scan_is_caught(project, tmp_path, monkeypatch):
    """Files last changed long before the scan are sent as proven by their stat data (the
    node does not hash them again); one changed after the scan no longer is, and fails."""
    later = time.time_ns() + 10 * 10**9   # as if scanned long after the files were written
    monkeypatch.setattr("launcher.workdir.scan.time.time_ns", lambda: later)
    manifest = scan_workdir(project)
    monkeypatch.undo()
    assert set(manifest.proven) == {e.path for e in manifest.entries if e.kind == "file"}
    ship_local(manifest, tmp_path / "ok")
    assert tree_of(tmp_path / "ok") == expected_tree(manifest)
    (project / "train.py").write_text(PROJECT["train.py"].upper())   # same size
    with pytest.raises(WorkdirError, match="train.py changed after launch scanned"):
        ship_local(manifest, tmp_path / "bad")
    assert "train.py" not in tree_of(tmp_path / "bad")


def test_concurrent_ships_leave_every_copy_whole(project, tmp_path):
    """Eight ships at once, four folder states, one DEST: each returns a folder that held its
    state when it returned, and every copy ends whole (exactly the state its record names)."""
    dest = tmp_path / "copy"
    manifests, expected = [], {}
    for i in range(4):
        state = tmp_path / f"state{i}"
        shutil.copytree(project, state, symlinks=True)
        (state / "pkg/__init__.py").write_text(f"VALUE = {i}\n" * (i + 1))
        for k in range(i + 1):
            (state / f"extra{k}.bin").write_bytes(bytes([k]) * 200_000)
        manifests.append(scan_workdir(state))
        expected[manifests[-1].digest] = expected_tree(manifests[-1])
    errors = []

    def one(i):
        try:
            ship_local(manifests[i % 4], dest)
        except Exception as err:   # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    copies = [p for p in [dest, *tmp_path.glob("copy.*")] if p.is_dir()]
    for copy in copies:
        digest = json.loads((copy / ".launch-shipped.json").read_text())["digest"]
        # Times aside: a content kept from an earlier state keeps its time.
        assert {p: v[:3] for p, v in tree_of(copy).items()} == \
            {p: v[:3] for p, v in expected[digest].items()}


def _frame(payload: dict) -> bytes:
    data = json.dumps(payload).encode()
    return struct.pack(">I", len(data)) + data


def _request(manifest, busy="sibling") -> bytes:
    return _frame({"entries": manifest.wire_entries(), "digest": manifest.digest,
                   "busy": busy})


def test_a_ship_killed_midway_leaves_the_copy_usable(project, tmp_path):
    dest = tmp_path / "copy"
    ship_local(scan_workdir(project), dest)
    (project / "big.bin").write_bytes(os.urandom(3_000_000))
    (project / "pkg/__init__.py").write_text("VALUE = 7\n")
    manifest = scan_workdir(project)
    proc = subprocess.Popen([sys.executable, node.__file__, "serve", str(dest)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.read(len(node.MAGIC)) == node.MAGIC
    proc.stdin.write(_request(manifest))
    proc.stdin.flush()
    (length,) = struct.unpack(">I", proc.stdout.read(4))
    missing = json.loads(proc.stdout.read(length))["missing"]
    big = next(e for e in manifest.entries if e.path == "big.bin")
    assert missing[0] == big.sha256
    proc.stdin.write(b"\0" + (project / "big.bin").read_bytes()[:1_500_000])
    proc.stdin.flush()
    for _ in range(1000):   # until the half content is being written
        staging = [p for p in dest.iterdir() if p.name.startswith(".launch-staging")]
        if staging and any(f.stat().st_size for f in staging[0].iterdir()):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (dest / "pkg/__init__.py").read_text() == PROJECT["pkg/__init__.py"]
    stats = ship_local(manifest, dest)   # the lock went with the process
    assert stats.files_sent == 2
    assert tree_of(dest) == expected_tree(manifest)
    assert [p for p in dest.iterdir() if p.name.startswith(".launch-staging")] == []


def test_nothing_is_written_through_a_link_a_job_planted(project, tmp_path):
    dest = tmp_path / "copy"
    manifest = scan_workdir(project)
    ship_local(manifest, dest)
    victim = make_tree(tmp_path / "victim", {"__init__.py": "victim's", "data.csv": "victim's",
                                             "train.py": "victim's"})
    shutil.rmtree(dest / "pkg")
    os.symlink(victim, dest / "pkg")
    (dest / "train.py").unlink()
    os.symlink(victim / "train.py", dest / "train.py")
    stats = ship_local(manifest, dest)
    assert {p.name: p.read_text() for p in victim.iterdir()} == {
        "__init__.py": "victim's", "data.csv": "victim's", "train.py": "victim's"}
    assert tree_of(dest) == expected_tree(manifest)
    assert stats.files_sent == 3


SHA = "0" * 64


@pytest.mark.parametrize("entries, why", [
    ([["../x", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([["/etc/passwd", "file", 0o644, 0, SHA, "", 0]], "is not a relative path"),
    ([["a/../b", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([["a//b", "file", 0o644, 0, SHA, "", 0]], "has an empty, `.` or `..` part"),
    ([[".launch-shipped.json", "file", 0o644, 0, SHA, "", 0]], "keeps for itself"),
    ([[".launch-staging-1", "dir", 0o755, 0, "", "", 0]], "keeps for itself"),
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


def _interpreters() -> list[str]:
    """This interpreter, and the other versions launch supports on nodes where installed
    (on PATH, or pyenv's)."""
    found = [sys.executable]
    for version in ("3.10", "3.12"):
        candidates = [shutil.which(f"python{version}") or ""] + sorted(
            str(p) for p in Path("~/.pyenv/versions").expanduser().glob(f"{version}.*/bin/"
                                                                          "python3"))
        for candidate in candidates:
            if candidate and subprocess.run([candidate, "-c", "pass"],
                                            capture_output=True).returncode == 0:
                found.append(candidate)
                break
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_the_node_program_runs_on_its_own(project, tmp_path, python):
    """As on a node: the file's text alone, standard library only, launch not importable,
    with each node interpreter version at hand."""
    manifest = scan_workdir(project)
    contents = {e.sha256: e for e in reversed(manifest.entries) if e.kind == "file"}
    ordered = sorted(contents.values(), key=lambda e: e.path)
    proc = subprocess.run(
        [python, "-I", "-c", Path(node.__file__).read_text(), "serve", "~/copy"],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd="/",
        input=_request(manifest) + b"".join(b"\0" + (project / e.path).read_bytes()
                                            for e in ordered),
        capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert tree_of(tmp_path / "copy") == expected_tree(manifest)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB file system (tmpfs), to fill."""
    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            str(where)], capture_output=True).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_disk_is_named_not_a_traceback(project, small_disk):
    (project / "big.bin").write_bytes(os.urandom(2_000_000))
    with pytest.raises(WorkdirError) as err:
        ship_local(scan_workdir(project), small_disk / "copy")
    assert str(err.value) == (f"shipping workdir {project} to {small_disk / 'copy'}: "
                              f"{small_disk / 'copy' / 'big.bin'}: No space left on device")
