"""Node agents as child processes of launch on this machine (`launch run --local`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from launcher.job.environment import path_with, service_env
from launcher.job.runplan import NodeCommand
from launcher.runs.folder import STAMP_ENV
from launcher.runs.leftovers import pids_with_env
# Runs first in each agent's process, then becomes the agent (exec): the kernel kills the
# agent when launch dies, even by SIGKILL, and its workers follow (their own parent-death
# signal is set by train/main.py). Without it a killed launch left both agents and their
# workers training for minutes, unsupervised. SIGKILL, not SIGTERM: nobody is left to collect
# a graceful exit, and torchrun given SIGTERM was seen hanging at exit on its --tee log
# threads. Done here rather than in Popen's preexec_fn, which is unsafe while the output
# reader threads run.
DIE_WITH_LAUNCH = r"""
import ctypes, os, signal, sys
ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # launch died before prctl took effect
os.execvp(sys.argv[2], sys.argv[2:])
"""


def die_with_launch(argv: list[str]) -> list[str]:
    """argv, started so that it ends when this launch process does (Linux)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", DIE_WITH_LAUNCH, str(os.getpid()), *argv]


def process_env(command: NodeCommand, stamp: str) -> dict[str, str]:
    """The environment of a process launch starts for `command` on this machine (its folders
    made first): the command's, the run's stamp, and the node's interpreter's folder first on
    PATH."""
    Path(command.run_dir).mkdir(parents=True, exist_ok=True)
    if command.env.get("LAUNCH_CHECKPOINT_DIR"):
        Path(command.env["LAUNCH_CHECKPOINT_DIR"]).mkdir(parents=True, exist_ok=True)
    # The plan's env is all of it: the login's variables of launch's environment are in it
    # (launcher/job/environment.py), nothing else of launch's shell.
    env = {**command.env, STAMP_ENV: stamp}
    if command.service:
        env = {**service_env(os.environ), **env}
    if command.env.get("LAUNCH_PYTHON"):
        env["PATH"] = path_with(command.env["LAUNCH_PYTHON"], env.get("PATH"))
    return env


def run_to_end(command: NodeCommand, stamp: str, line) -> int | None:
    """`command` on this machine to its end, its lines to `line`; None when it could not be
    started. Stopped with launch (its own session, so by group) on Ctrl-C."""
    try:
        proc = subprocess.Popen(list(command.argv), cwd=command.cwd,
                                env=process_env(command, stamp), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
    except OSError as err:
        line(f"launch: {err}")
        return None
    assert proc.stdout is not None
    try:
        for text in proc.stdout:
            line(text)
        return proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise


class LocalNodeProcess:
    def __init__(self, command: NodeCommand, stamp: str, label: str | None = None):
        self.name = command.name
        self.command = command
        self.stamp, self.label = stamp, label
        self.proc: subprocess.Popen | None = None
        # Restarts of the run before this start of the node (launch restarted it): added to
        # the plan's LAUNCH_ATTEMPT.
        self.attempt_offset = 0

    def start(self) -> None:
        env = process_env(self.command, self.stamp)
        env["LAUNCH_ATTEMPT"] = str(int(env.get("LAUNCH_ATTEMPT", "0")) + self.attempt_offset)
        self.proc = subprocess.Popen(
            die_with_launch(list(self.command.argv)),
            env=env,
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

    # ---- the hang watch (launcher/execute/watch.py) ---------------------------------------
    # The node is this machine and its Python is launch's: launch_node/node_probe.py runs in this
    # process (py-spy still runs as its own process, from this interpreter's environment).
    def heartbeats(self) -> list[dict]:
        from launch_node.node_probe import read_heartbeats

        return read_heartbeats(self.command.run_dir)

    def activity(self) -> dict:
        from launch_node.node_probe import activity

        return activity(self.command.run_dir, self.stamp, self.name)

    def dump_ranks(self, timeout: float) -> dict:
        from launch_node.node_probe import dump

        return dump(self.command.run_dir, self.stamp, timeout, self.name)

    def kill_ranks(self, pids: list[int]) -> dict:
        from launch_node.node_probe import kill

        return kill(pids, self.stamp)


def reap_run(stamp: str) -> None:
    """After every agent is gone, make sure nothing of the run outlives it: every process that
    carries its stamp (put by launch into each agent's environment and inherited by the
    workers, whatever session they moved to). The stamp is unique per run folder, never the
    user's run id: two runs of the same id in different runs dirs once killed each other's
    processes. Never by name."""
    for pid in pids_with_env(STAMP_ENV, stamp):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; nothing connects)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_gpu_count() -> int:
    """GPUs torch sees on this machine. Without an NVIDIA driver that is 0, known without
    importing torch (2-3 s of every local run's start on a CPU machine)."""
    if not Path("/proc/driver/nvidia/gpus").is_dir() and not Path("/dev/nvidiactl").exists():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
