"""The checkpoint mirror's processes in a run (launcher/job/mirror.py plans them): the restores run
before the job, as a step of the run's preparation (a mirror that cannot be read or written
fails the run before anything trains, naming the node and the destination), and the watcher
runs beside the job as a sidecar of the run (launcher/execute/sidecar.py), given time to
finish its uploads when the run ends (`drain_s`, read by the supervisor's stop_services)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

from launcher.execute.prepare import PrepareFailed, in_parallel_or_raise
from launcher.execute.sidecar import Sidecar
from launcher.job.mirror import DRAIN_S, LABEL
from launcher.job.runplan import NodeCommand, RunPlan
from launcher.runs.logs import LineSink


def watcher(plan: RunPlan, make: Callable[[NodeCommand], Any]) -> list[Sidecar]:
    """The watcher as a sidecar (`make` builds the backend's own node process, labelled
    "mirror"), in a list for execute_plan's services; none without a mirror."""
    if plan.mirror is None:
        return []
    return [Sidecar(make(plan.mirror.watch), "checkpoint mirror", drain_s=DRAIN_S)]


class _Output:
    """A restore's lines: to the node's log (labelled) and kept for the failure message."""

    def __init__(self, router, node: str):
        self.router, self.node, self.lines = router, node, []

    def line(self, text: str) -> None:
        self.lines = [*self.lines[-19:], text]
        self.router.line(self.node, text, label=LABEL)

    def failure(self, dest: str, code: int | None) -> PrepareFailed:
        how = "could not be run" if code is None else f"exited with code {code}"
        last = "\n".join(f"  {line}" for line in self.lines[-10:]) or "  (no output)"
        return PrepareFailed(self.node, f"the checkpoint mirror {dest} could not be used from "
                                        f"node {self.node} (its restore {how}):\n{last}")


def run_local(command: NodeCommand, out: _Output) -> int | None:
    try:
        proc = subprocess.Popen(list(command.argv), env={**os.environ, **command.env},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
    except OSError as err:
        out.line(f"launch: {err}")
        return None
    assert proc.stdout is not None
    with proc:
        for text in proc.stdout:
            out.line(text.rstrip("\n"))
    return proc.returncode


def ssh_runner(procs: dict[str, Any]) -> Callable[[NodeCommand, _Output], int | None]:
    """A restore over the node process's own connection (opened again if it dropped)."""
    from launcher.cluster.ssh import remote

    def run(command: NodeCommand, out: _Output) -> int | None:
        line = remote("env", *(f"{k}={v}" for k, v in command.env.items()), *command.argv)
        sink = LineSink(out.line)   # file-like, for fabric's output threads
        result = procs[command.name].connection().run(
            line, hide=True, warn=True, pty=False, in_stream=False, out_stream=sink,
            err_stream=sink)
        sink.close()
        return result.exited

    return run


def with_restore(prepare: Callable | None, plan: RunPlan,
                 run: Callable[[NodeCommand, _Output], int | None] = run_local
                 ) -> Callable | None:
    """`prepare` (the workdir and setup), then the mirror's restores on their nodes at once."""
    if plan.mirror is None:
        return prepare
    restores = {r.name: r for r in plan.mirror.restore}

    def both(router, notify: Callable[[str], None], folder) -> None:
        if prepare is not None:
            prepare(router, notify, folder)
        notify(f"checkpoint mirror {plan.mirror.dest}: checking it, and bringing back what "
               f"{', '.join(restores)} lack(s)")

        def one(name: str) -> None:
            out = _Output(router, name)
            code = run(restores[name], out)
            if code != 0:
                raise out.failure(plan.mirror.dest, code)

        in_parallel_or_raise(one, restores)

    return both
