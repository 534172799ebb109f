"""Checkpoint files on disk: names, the atomic write, which ones are complete.

    OUT_DIR/checkpoints/step-00000040.pt     the state (torch.save)
    OUT_DIR/checkpoints/step-00000040.json   what it was written under (step, settings, size)

A checkpoint is complete when its .json exists: the .json is written (temp file, fsync,
rename) only after the .pt has been renamed into place, so a process killed at any point of a
write leaves either the whole new checkpoint or none of it, and the previous ones untouched.
Temp files of an interrupted write are removed by the next write.

Imports only the standard library: launch reads the .json files to check a resume before
anything starts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CHECKPOINT_DIR = "checkpoints"
FORMAT = 1
_NAME = re.compile(r"step-([0-9]{8,})\.json")
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class CheckpointFile:
    step: int
    state: Path        # the .pt
    meta: dict[str, Any]

    @property
    def name(self) -> str:
        return self.state.name


def stem(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> int:
    """write(f) into PATH.tmp, fsync, rename over PATH, fsync the folder; returns the size.
    The rename is the commit: PATH is either the old content or the whole new one."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return size


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, lambda f: f.write((json.dumps(data, indent=2) + "\n").encode()))


def complete(folder: str | Path) -> list[CheckpointFile]:
    """The complete checkpoints in a folder, oldest first."""
    folder = Path(folder)
    out = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = _NAME.fullmatch(entry.name)
        if not m:
            continue
        state = entry.with_suffix(".pt")
        try:
            meta = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if state.is_file() and isinstance(meta, dict):
            out.append(CheckpointFile(int(m.group(1)), state, meta))
    return sorted(out, key=lambda c: c.step)


def latest(folder: str | Path) -> CheckpointFile | None:
    found = complete(folder)
    return found[-1] if found else None


def prune(folder: Path, keep: int) -> list[str]:
    """Keep the newest `keep` complete checkpoints; remove older ones, and files of writes
    that never completed (temp files; a .pt whose .json never came). Returns what went."""
    kept = complete(folder)
    newest = kept[-1].step if kept else -1
    removed = []
    for old in kept[:-keep] if keep > 0 else kept:
        for path in (old.state.with_suffix(".json"), old.state):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    for entry in folder.iterdir():
        orphan = entry.suffix == ".pt" and not entry.with_suffix(".json").exists()
        # A .pt newer than every complete checkpoint may be the one being committed right now
        # by another writer; only the writer itself calls prune, after its commit.
        if entry.name.endswith(TMP_SUFFIX) or (orphan and _step_of(entry) <= newest):
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def _step_of(path: Path) -> int:
    m = re.match(r"^step-(\d+)", path.name)
    return int(m.group(1)) if m else -1
