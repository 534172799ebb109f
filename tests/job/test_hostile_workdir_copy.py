"""The node's copy of the workdir cannot be turned against launch (issue 38, class 2), as a
table: a job can write in its copy, so it can put a link out of the copy, a FIFO, or an
endless or huge file where launch keeps its own lock (.launch-lock) and record
(.launch-shipped.json). launch opens both no-follow, non-blocking, regular files only and
size-bounded (launcher/workdir/node.py own_file, and launch_node/worker.py the same way):

- the next ship replaces what the job put there and succeeds, writing nothing outside the
  copy (a real ship_local into a tmp folder, twice);
- the worker that holds the copy for a job refuses it with a message naming the file, and
  starts nothing (a real worker.py process);
- no case hangs (pytest-timeout) and nothing outside the case's folder changes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.workdir import node as workdir_node
from launcher.workdir.scan import scan_workdir
from launcher.workdir.sync import ship_local
from launch_node import worker
from tests.run.hostile import snapshot

pytestmark = pytest.mark.timeout(60)

WORKER = Path(worker.__file__)
LOCK, STATE = workdir_node.LOCK, workdir_node.STATE


def link_to_outside(path: Path, outside: Path) -> None:
    path.unlink(missing_ok=True)
    os.symlink(outside / "target.txt", path)


def dangling_outside(path: Path, outside: Path) -> None:
    path.unlink(missing_ok=True)
    os.symlink(outside / "created-by-launch.txt", path)


def fifo(path: Path, outside: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def dev_zero(path: Path, outside: Path) -> None:
    path.unlink(missing_ok=True)
    os.symlink("/dev/zero", path)


def huge(path: Path, outside: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(100 << 20)   # sparse: 100 MB read as zeros


def folder(path: Path, outside: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


# (id, launch's file the job replaces, how, what the worker's refusal says)
CASES = [
    ("lock-link-outside", LOCK, link_to_outside, f"{LOCK}: Too many levels of symbolic links"),
    ("lock-dangling-link", LOCK, dangling_outside, f"{LOCK}: Too many levels"),
    ("lock-fifo", LOCK, fifo, f"{LOCK} is not a regular file"),
    ("lock-dev-zero", LOCK, dev_zero, f"{LOCK}: Too many levels"),
    ("state-link-outside", STATE, link_to_outside, f"{STATE}: Too many levels"),
    ("state-fifo", STATE, fifo, f"{STATE} is not a regular file"),
    ("state-dev-zero", STATE, dev_zero, f"{STATE}: Too many levels"),
    ("state-huge", STATE, huge, f"{STATE} is larger than"),
]


def ship(tmp_path: Path, text: str):
    project = tmp_path / "case" / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "train.py").write_text(text)
    manifest = scan_workdir(project)
    return manifest, ship_local(manifest, tmp_path / "case" / "copy")


def run_worker(dest: str, digest: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAUNCH_WORKDIR": dest, "LAUNCH_WORKDIR_DIGEST": digest}
    return subprocess.run([sys.executable, str(WORKER), "exec", sys.executable, "-c",
                           "print('started')"], capture_output=True, text=True, env=env,
                          cwd=dest, timeout=30, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name,plant,says", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_worker_refuses_a_copy_whose_files_were_replaced(tmp_path, name, plant, says):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("keep me\n")
    manifest, stats = ship(tmp_path, "print('v1')\n")
    plant(Path(stats.dest) / name, outside)
    before = snapshot(tmp_path, skip=tmp_path / "case")
    proc = run_worker(stats.dest, manifest.digest)
    assert proc.returncode == 2 and "started" not in proc.stdout, (proc.stdout, proc.stderr)
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert f"the shipped workdir {stats.dest} cannot be read" in proc.stderr
    assert snapshot(tmp_path, skip=tmp_path / "case") == before


@pytest.mark.parametrize("name,plant", [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_the_next_ship_replaces_what_the_job_put_there(tmp_path, name, plant):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("keep me\n")
    ship(tmp_path, "print('v1')\n")
    plant(tmp_path / "case" / "copy" / name, outside)
    before = snapshot(tmp_path, skip=tmp_path / "case")
    manifest, stats = ship(tmp_path, "print('v2')\n")
    assert stats.dest == str(tmp_path / "case" / "copy")
    for own in (LOCK, STATE):
        assert stat.S_ISREG(os.lstat(Path(stats.dest) / own).st_mode), own
    assert (Path(stats.dest) / "train.py").read_text() == "print('v2')\n"
    assert snapshot(tmp_path, skip=tmp_path / "case") == before
    proc = run_worker(stats.dest, manifest.digest)
    assert (proc.returncode, proc.stdout) == (0, "started\n"), proc.stderr


def test_a_folder_in_the_locks_place_is_refused_naming_it(tmp_path):
    ship(tmp_path, "print('v1')\n")
    folder(tmp_path / "case" / "copy" / LOCK, tmp_path)
    from launcher.core.errors import LauncherError

    with pytest.raises(LauncherError, match=r"copy/\.launch-lock"):
        ship(tmp_path, "print('v2')\n")
