"""Before the job starts: the workdir shipped to every node and its setup commands run there.

Both happen inside the run (its folder exists, its log takes their lines), so that a failing
setup is a failed run like any other: the node is named, its last lines shown, its whole
output kept in `<run>/<node>/setup.log` and in the node's log, and no job starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from launcher.core.errors import LauncherError
from launcher.core.safefile import open_append
from launcher.job.environment import path_with
from launcher.job.runplan import NodeCommand, RunPlan
from launcher.job.setup import SETUP_LOG, setup_argv, setup_key

SETUP_LABEL = "setup"


class PrepareFailed(LauncherError):
    """A node could not be prepared (workdir, setup): the run fails before its job starts."""

    exit_code = 1

    def __init__(self, node: str, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


class SetupLog:
    """One node's setup output: to its setup.log and, line by line, to the run's router."""

    def __init__(self, folder_node_dir: Path, node: str, line: Callable[..., None]):
        self.path = folder_node_dir / SETUP_LOG
        self.node, self._line = node, line
        # <runs>/<run id>/<node>/setup.log: no link in the run folder is followed.
        self._file = open_append(self.path, within=folder_node_dir.parent.parent)
        self.tail: list[str] = []
        self._lock = threading.Lock()   # stdout and stderr arrive from two threads

    def line(self, text: str) -> None:
        text = text.rstrip("\r\n")
        with self._lock:
            self._file.write(text + "\n")
            self.tail = [*self.tail[-39:], text]
        self._line(self.node, text, label=SETUP_LABEL)

    def close(self) -> None:
        self._file.close()

    def failure(self, code: int | None) -> PrepareFailed:
        last = "\n".join(f"  {line}" for line in self.tail[-15:]) or "  (no output)"
        how = "could not be run" if code is None else f"failed with exit code {code}"
        return PrepareFailed(self.node, f"setup on node {self.node} {how}; its last lines "
                                        f"(all of them in {self.path}):\n{last}")


def setup_env(command: NodeCommand) -> dict[str, str]:
    """The job's environment for its setup commands (PATH with the node's Python first)."""
    env = dict(command.env)
    python = env.get("LAUNCH_PYTHON", "")
    env["PATH"] = path_with(python, env.get("PATH"))
    return env


def run_local_setup(plan: RunPlan, digest: str | None, log: SetupLog) -> None:
    """The setup commands on this machine (the local nodes share one workdir: once)."""
    head = plan.nodes[0]
    argv = setup_argv(setup_key(digest, plan.job.setup), plan.job.setup)
    try:
        proc = subprocess.Popen(argv, cwd=head.cwd, env=setup_env(head),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as err:
        log.line(f"launch: {err}")
        raise log.failure(None) from None
    assert proc.stdout is not None
    try:
        for text in proc.stdout:
            log.line(text)
        code = proc.wait()
    except BaseException:
        # Ctrl-C while setup runs: setup stops with launch (its own session, so by group).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        raise
    if code != 0:
        raise log.failure(code)


def in_parallel_or_raise(fn: Callable[[str], None], names: Iterable[str]) -> None:
    """fn(name) for every node at once; the first node's PrepareFailed (in node order) is
    raised once all have ended, any other error as a PrepareFailed naming its node."""
    names = list(names)
    errors: dict[str, BaseException] = {}

    def one(name: str) -> None:
        try:
            fn(name)
        except BaseException as err:  # noqa: BLE001 (reported per node below)
            errors[name] = err

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in names:
        err = errors.get(name)
        if isinstance(err, PrepareFailed):
            raise err
        if err is not None:
            raise PrepareFailed(name, f"node {name} could not be prepared: "
                                      f"{type(err).__name__}: {err}")


def prepare_local(plan: RunPlan, manifest, shipped) -> Callable | None:
    """What a local run does before its job, the workdir shipped into this machine's copy
    already (`shipped`: launcher/workdir_sync.ShipStats): say so, run setup there once. None
    when there is nothing to do."""
    job = plan.job
    if manifest is None and not job.setup:
        return None

    def prepare(router, notify: Callable[[str], None], folder) -> None:
        head = plan.nodes[0]
        if shipped is not None:
            notify(f"workdir {manifest.root}: {shipped.files_sent} of {shipped.files_total} "
                   f"file(s) shipped to {shipped.dest}")
        if job.setup:
            log = SetupLog(folder.node_dir(head.name), head.name, router.line)
            try:
                run_local_setup(plan, manifest.digest if manifest is not None else None, log)
            finally:
                log.close()

    return prepare
