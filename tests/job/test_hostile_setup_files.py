"""Issue 38, class 2: setup's own files in the workdir copy (its lock, its marker) are in a
folder the job writes to; a link, a FIFO or an endless file a job left there must not make the
next setup write outside the copy, read without end, or wait forever. The real setup command
(launcher/job/setup.py setup_argv) run by the real `sh` in a folder with each plant."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launcher.job.setup import SETUP_LOCK, SETUP_MARKER, setup_argv, setup_key

pytestmark = pytest.mark.timeout(60)

KEY = setup_key("digest", ["echo ran"])


def plant_link_out(name):
    def plant(copy: Path, outside: Path) -> None:
        (copy / name).symlink_to(outside / "target")
    return plant


def plant_fifo(name):
    def plant(copy: Path, outside: Path) -> None:
        os.mkfifo(copy / name)
    return plant


def plant_link_to(name, target):
    def plant(copy: Path, outside: Path) -> None:
        (copy / name).symlink_to(target)
    return plant


def plant_marker_link_holding_the_key(copy: Path, outside: Path) -> None:
    (outside / "target").write_text(KEY + "\n")
    (copy / SETUP_MARKER).symlink_to(outside / "target")


PLANTS = {
    "lock-link-out-of-the-copy": plant_link_out(SETUP_LOCK),
    "lock-fifo": plant_fifo(SETUP_LOCK),
    "lock-link-to-dev-zero": plant_link_to(SETUP_LOCK, "/dev/zero"),
    "marker-link-out-of-the-copy": plant_link_out(SETUP_MARKER),
    "marker-fifo": plant_fifo(SETUP_MARKER),
    "marker-link-to-dev-zero": plant_link_to(SETUP_MARKER, "/dev/zero"),
    # A link to a file that holds the right key: not launch's marker, so setup runs.
    "marker-link-holding-the-key": plant_marker_link_holding_the_key,
}


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_setup_runs_in_the_copy_whatever_the_job_left_in_its_files_places(tmp_path, name):
    copy, outside = tmp_path / "copy", tmp_path / "outside"
    copy.mkdir()
    outside.mkdir()
    PLANTS[name](copy, outside)
    before = sorted((p.name, p.read_bytes()) for p in outside.iterdir())
    proc = subprocess.run(setup_argv(KEY, ["echo ran"]), cwd=copy, capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "launch: setup $ echo ran" in proc.stdout and "launch: setup done" in proc.stdout
    # Nothing written or made outside the copy; launch's marker is its own regular file now.
    assert sorted((p.name, p.read_bytes()) for p in outside.iterdir()) == before
    marker = copy / SETUP_MARKER
    assert marker.is_file() and not marker.is_symlink() and marker.read_text() == KEY + "\n"
    # And the next setup finds it and skips.
    again = subprocess.run(setup_argv(KEY, ["echo ran"]), cwd=copy, capture_output=True,
                           text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert again.returncode == 0 and "setup skipped" in again.stdout


def test_a_folder_in_the_locks_place_is_refused_naming_it(tmp_path):
    (tmp_path / SETUP_LOCK).mkdir()
    proc = subprocess.run(setup_argv(KEY, ["echo ran"]), cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 97
    assert f"{tmp_path}/{SETUP_LOCK} is a folder, not launch's setup lock: remove it" in \
        proc.stderr
    assert "ran" not in proc.stdout
