"""Node agents as child processes of launch on this machine (`launch run --local`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from launcher.plan import NodeCommand


class LocalNodeProcess:
    def __init__(self, command: NodeCommand):
        self.name = command.name
        self.command = command
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        Path(self.command.run_dir).mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            list(self.command.argv),
            env={**os.environ, **self.command.env},
            cwd=self.command.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own session and process group: the terminal's Ctrl-C reaches only launch,
            # which then stops every node in order, and killpg reaches exactly this agent.
            start_new_session=True,
            text=True,
            errors="replace",
            bufsize=1,
        )

    @property
    def pgid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def lines(self) -> Iterator[str]:
        assert self.proc is not None and self.proc.stdout is not None
        yield from self.proc.stdout

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_run(run_id: str) -> None:
    """After every agent is gone, make sure nothing of the run outlives it: every process that
    carries its LAUNCH_RUN_ID (stamped by launch into each agent's environment and inherited
    by the workers, whatever session they moved to). Never by name."""
    for pid in pids_with_env("LAUNCH_RUN_ID", run_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; nothing connects)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_gpu_count() -> int:
    import torch  # imported here: only --local needs it, and it costs a second

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
