"""Runs whose launch process died before writing a summary, and what they left running.

Every run folder records launch's pid and the run's process stamp (launch.json, written when
the folder is made); summary.json is written when the run ends. A folder with the first and
not the second, whose launch process is gone, is an abandoned run: launch was killed (SIGKILL,
OOM, a closed laptop). Its node agents die with launch (parent-death signal here, the SSH
session's watchdog on nodes), but this is where a survivor would be found and named: by the
run's stamp in the processes' environment, never by name.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from launcher.runfolder import LAUNCH_FILE, STAMP_ENV


@dataclass
class RunState:
    run_id: str
    folder: Path
    status: str                  # running | abandoned | succeeded | failed | unknown
    launch_pid: int | None = None
    started_at: str | None = None
    leftover_pids: list[int] = field(default_factory=list)   # processes of it, this machine


def pids_with_env(key: str, value: str) -> list[int]:
    """Processes of this user whose environment has key=value."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _is_launch(pid: int) -> bool:
    """Whether `pid` is still a launch process (pids are reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith((b"launch", b"launcher")) or part == b"launcher.cli"
               for part in cmdline)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_state(folder: Path, *, with_leftovers: bool = True) -> RunState | None:
    """The state of one run folder, or None when launch did not make it."""
    launch = _read(folder / LAUNCH_FILE)
    if launch is None:
        return None
    pid = launch.get("pid") if isinstance(launch.get("pid"), int) else None
    state = RunState(str(launch.get("run_id") or folder.name), folder, "unknown", pid,
                     launch.get("started_at"))
    summary = _read(folder / "summary.json")
    if summary is not None:
        state.status = str(summary.get("status") or "unknown")
    elif pid is not None and _is_launch(pid):
        state.status = "running"
    else:
        state.status = "abandoned"
    stamp = launch.get("stamp")
    if with_leftovers and stamp and state.status in ("abandoned", "unknown"):
        state.leftover_pids = pids_with_env(STAMP_ENV, str(stamp))
    return state


def runs_in(runs_dir: str | Path) -> list[RunState]:
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    states = [run_state(folder) for folder in sorted(root.iterdir()) if folder.is_dir()]
    return [s for s in states if s is not None]


def abandoned_warnings(runs_dir: str | Path) -> list[str]:
    """One line per abandoned run with processes still alive here (for `launch run`)."""
    out = []
    for state in runs_in(runs_dir):
        if state.status == "abandoned" and state.leftover_pids:
            pids = ", ".join(map(str, state.leftover_pids[:8]))
            out.append(f"run {state.run_id}: launch (pid {state.launch_pid}) died without a "
                       f"summary and {len(state.leftover_pids)} of its processes still run "
                       f"here (pids {pids}); `launch runs --stop {state.run_id}` ends them")
    return out


def stop(state: RunState) -> list[int]:
    """SIGKILL the run's leftover processes (found by its stamp); returns the pids sent."""
    sent = []
    for pid in state.leftover_pids:
        try:
            os.kill(pid, signal.SIGKILL)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent
