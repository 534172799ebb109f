"""A detached run on this machine: its pipeline a process of its own session here (the
controller, launcher/commands/controller.py), its folder where an attached run's would be.
`FolderHome` is also the Slurm backend's view of a run folder on the shared filesystem."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher.core import safefile
from launcher.runs.console import follow_file, pid_alive

CONTROLLER_MODULE = "launcher.commands.controller"


def controller_argv(python: str, run_dir: str) -> list[str]:
    return [python, "-m", CONTROLLER_MODULE, run_dir]


def stop_doc(sig: int) -> dict[str, Any]:
    return {"signal": signal.Signals(sig).name,
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "by": f"{os.environ.get('USER') or os.getuid()}@{os.uname().nodename}"}


class FolderHome:
    """A run folder this machine reads directly; the controller reached by `alive` and
    `signal` (a pid here; a Slurm job)."""

    def __init__(self, run_id: str, root: Path, where: str,
                 alive: Callable[[], bool | None], signal_controller: Callable[[int], str]):
        self.run_id, self.root, self.where = run_id, root, where
        self._alive, self._signal = alive, signal_controller

    def read(self, name: str, limit: int) -> bytes | None:
        try:
            return safefile.read_bytes(self.root / name, name, max_bytes=limit)
        except Exception:  # noqa: BLE001 (absent, a link, too large: nothing to read)
            return None

    def follow(self, name: str, offset: int, done) -> Iterator[bytes]:
        return follow_file(self.root / name, offset, done)

    def alive(self) -> bool | None:
        return self._alive()

    def stop(self, sig: int, by_user: bool = False) -> str:
        """Asks the controller to stop the run (it stops every node, as an attached run does
        after Ctrl-C); `by_user`: `launch stop` asked, and the run is then `stopped`."""
        from launcher.runs.folder import STOP_FILE

        if by_user:
            safefile.write_json(self.root / STOP_FILE, stop_doc(sig), within=self.root.parent)
        return self._signal(sig)

    def fetch(self, dest: Path) -> int:
        return 0   # the run folder is here already

    def local_folder(self) -> Path:
        return self.root   # read and written here directly

    def settle(self, status: str | None = None, reason: str | None = None,
               amend=None) -> None:
        """Once the run ended: `amend(summary)`'s changes to its summary.json, if any."""
        if amend is None:
            return
        from launcher.core import safefile

        path = self.root / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        amend(summary)
        safefile.write_json(path, summary, within=self.root.parent)

    def ending(self) -> str | None:
        """Why the run's home ended it, when neither the run nor launch did: nothing here."""
        return None

    def log_hint(self) -> str:
        from launcher.pipeline.handover import CONTROLLER_LOG

        return str(self.root / CONTROLLER_LOG)


def controller_alive(pid: int, run_dir: str) -> bool:
    """Whether `pid` is still the controller of this run (pids are reused)."""
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid_alive(pid)
    return CONTROLLER_MODULE.encode() in argv and run_dir.encode() in argv


def local_home(handle: dict[str, Any]) -> FolderHome:
    pid, run_dir = int(handle["pid"]), handle["run_dir"]

    def send(sig: int) -> str:
        if not controller_alive(pid, run_dir):
            return f"the controller of run {handle['run_id']} (pid {pid}) has ended already"
        os.kill(pid, sig)
        return f"sent {signal.Signals(sig).name} to the run's controller (pid {pid})"

    return FolderHome(handle["run_id"], Path(run_dir), f"this machine (pid {pid})",
                      lambda: controller_alive(pid, run_dir), send)


def start_controller(run_dir: Path, cwd: str) -> int:
    """The controller as a process of its own session (no terminal's Ctrl-C or hangup
    reaches it), its output kept in the run folder; its pid."""
    from launcher.pipeline.handover import CONTROLLER_LOG

    with open(run_dir / CONTROLLER_LOG, "ab") as log:
        proc = subprocess.Popen(controller_argv(sys.executable, str(run_dir)), cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    return proc.pid


def read_json(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
