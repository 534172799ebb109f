"""Before the job starts: what preflight did said in the run's log, the setup commands run on
the nodes, and the checkpoint mirror's restores (launcher/job/mirror.py) run on theirs. The same
for every backend: each command is run to its end on its node by the session
(launcher/execute/backend.py Session.run).

Both happen inside the run (its folder exists, its log takes their lines), so that a failing
setup or an unreachable mirror is a failed run like any other: the node is named, its last
lines shown, its whole output kept (`<run>/<node>/setup.log`, the node's log), and no job
starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError
from launcher.core.safefile import open_append
from launcher.job.mirror import LABEL as MIRROR_LABEL
from launcher.job.runplan import NodeCommand, RunPlan
from launcher.job.setup import SETUP_LOG, setup_argv, setup_key

SETUP_LABEL = "setup"


class PrepareFailed(LauncherError):
    """A node could not be prepared (workdir, setup, mirror): the run fails before its job."""

    exit_code = 1

    def __init__(self, node: str, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


class CommandLog:
    """One node's output of a preparing command: kept (setup.log), to the run's router line by
    line (labelled), and its last lines for the failure message."""

    def __init__(self, router, node: str, label: str, keep: Path | None = None):
        self.router, self.node, self.label = router, node, label
        # <runs>/<run id>/<node>/setup.log: no link in the run folder is followed.
        self._file = open_append(keep, within=keep.parent.parent.parent) if keep else None
        self.path = keep
        self.tail: list[str] = []
        self._lock = threading.Lock()   # stdout and stderr may arrive from two threads

    def line(self, text: str) -> None:
        text = text.rstrip("\r\n")
        with self._lock:
            if self._file is not None:
                self._file.write(text + "\n")
            self.tail = [*self.tail[-39:], text]
        self.router.line(self.node, text, label=self.label)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def last(self, count: int) -> str:
        return "\n".join(f"  {line}" for line in self.tail[-count:]) or "  (no output)"


def setup_commands(plan: RunPlan, one_machine: bool) -> list[NodeCommand]:
    """Setup as one command per node (in the workdir, with the job's environment): once where
    the nodes are processes of one machine, else on every node, where a copy the nodes share
    (Slurm's shared filesystem, an NFS home) lets the first run it under its lock and the
    others find it done (launcher/job/setup.py)."""
    job = plan.job
    if not job.setup:
        return []
    key = setup_key(plan.workdir.digest if plan.workdir is not None else None, job.setup)
    nodes = plan.nodes[:1] if one_machine else plan.nodes
    return [replace(node, argv=tuple(setup_argv(key, job.setup))) for node in nodes]


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


def preparation(session: Any, plan: RunPlan, one_machine: bool, timeline=None
                ) -> Callable[[Any, Callable[[str], None], Any], None]:
    """What every run does before its job, for execute_plan's `prepare`: say what preflight
    shipped, run setup, then the mirror's restores (each on its nodes at once). `timeline`
    (launcher/runs/timeline.py) keeps each node's time in each."""
    setups = setup_commands(plan, one_machine)
    restores = list(plan.mirror.restore) if plan.mirror is not None else []

    def prepare(router, notify: Callable[[str], None], folder) -> None:
        def run_each(commands: list[NodeCommand], label: str, failure, keep=None) -> None:
            by_name = {c.name: c for c in commands}

            def one(name: str) -> None:
                cmd = by_name[name]
                log = CommandLog(router, name, label, keep(name) if keep else None)
                began = time.monotonic()
                try:
                    code = session.run(cmd, folder.stamp, label, log.line)
                finally:
                    log.close()
                    if timeline is not None:
                        timeline.node(name, f"{label}_s", time.monotonic() - began)
                if code != 0:
                    raise failure(cmd, code, log)

            in_parallel_or_raise(one, by_name)

        for text in session.announce():
            notify(text)
        if setups:
            notify(f"setup on {len(setups)} node(s): {len(plan.job.setup)} command(s)")
            run_each(setups, SETUP_LABEL, lambda cmd, code, log: PrepareFailed(
                cmd.name, f"setup on node {cmd.name} "
                          + ("could not be run" if code is None
                             else f"failed with exit code {code}")
                          + f"; its last lines (all of them in {log.path}):\n{log.last(15)}"),
                     keep=lambda name: folder.node_dir(name) / SETUP_LOG)
        if restores:
            notify(f"checkpoint mirror {plan.mirror.dest}: checking it, and bringing back what "
                   f"{', '.join(r.name for r in restores)} lack(s)")
            run_each(restores, MIRROR_LABEL, lambda cmd, code, log: PrepareFailed(
                cmd.name, f"the checkpoint mirror {plan.mirror.dest} could not be used from "
                          f"node {cmd.name} (its restore "
                          + ("could not be run" if code is None else f"exited with code {code}")
                          + f"):\n{log.last(10)}"))

    return prepare
