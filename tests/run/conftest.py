from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch_cmd

# A small, fast variant of the demo recipe: same data and trainer, 2 blocks instead of 12.
FAST = {
    "name": "fast",
    "nodes": 2,
    "rendezvous": {"timeout": 60},
    "train": {"model": "vit_tiny", "depth": 2, "dataset": "digits", "image_size": 8,
              "patch_size": 4, "batch_size": 32, "steps": 20, "log_every": 5},
    "ddp": {"static_graph": True, "gradient_as_bucket_view": True},
}


def write_recipe(directory: Path, name: str = "recipe.yml", **sections) -> Path:
    data = copy.deepcopy(FAST)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = directory / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_pids(run_id: str, *, this_worker: bool = True) -> list[int]:
    """Every process of a run: each one inherits LAUNCH_RUN_ID from its node agent. (Written
    apart from launcher/execute/local.py's sweep on purpose: a bug in the cleanup must not be
    able to hide itself from the test that checks it.) Only this test process's runs: a test
    in another pytest-xdist worker may use the same run id at the same time. A rank gets
    nothing of launch's environment but a login's variables (docs/jobs.md), so a worker's
    runs are told apart by where they run: a process whose folder lies in another worker's
    temporary folder (.../popen-gwN/) is that worker's (`this_worker=False`: every process,
    for processes started through a lab's sshd, whose folders are the lab's)."""
    needle = f"LAUNCH_RUN_ID={run_id}".encode()
    mine = os.environ.get("PYTEST_XDIST_WORKER")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            where = os.readlink(entry / "cwd")
        except OSError:
            continue
        worker = re.search(r"/popen-(gw\d+)/", where + "/")
        if this_worker and mine and worker and worker.group(1) != mine:
            continue
        found.append(int(entry.name))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def worker_pid(run_id: str, node: str) -> int | None:
    """A trainer rank (not its torchrun agent) of the given node."""
    for pid in run_pids(run_id):
        args = cmdline(pid)
        if "torch.distributed.run" in args:
            continue
        if any(a.endswith("train/main.py") for a in args) and any(a.endswith(f"/{node}") for a in args):
            return pid
    return None


@contextmanager
def stopped_most_of_the_time(pid: int):
    """A straggler made from outside: the process stopped 70% of the time (SIGSTOP 0.25 s,
    SIGCONT 0.1 s) until the block ends, then left running."""
    stop = threading.Event()

    def duty_cycle():
        while not stop.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.25)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.1)
            except ProcessLookupError:
                return

    thread = threading.Thread(target=duty_cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class LaunchProcess:
    """`launch run` started in the background, for tests that interrupt it."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None):
        self.log = cwd / "launch.out"
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(launch_cmd(*args), cwd=cwd, stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def background_launch(tmp_path):
    started: list[LaunchProcess] = []

    def start(*args: str) -> LaunchProcess:
        lp = LaunchProcess(list(args), tmp_path)
        started.append(lp)
        return lp

    yield start
    for lp in started:
        lp.kill()
