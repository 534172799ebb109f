"""Fail-fast supervision of node agents, shared by the local and SSH executors.

Every node's output is routed as it arrives. When one node exits non-zero (or its connection
drops), or launch gets SIGINT/SIGTERM, every node still running is sent SIGTERM to its process
group, then SIGKILL after a grace period: by the ids launch recorded, never by name.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from launcher.logs import LineRouter


class NodeProcess(Protocol):
    """One node's torchrun agent as the supervisor sees it."""

    name: str

    def start(self) -> None: ...
    def lines(self) -> Iterator[str]: ...
    def poll(self) -> int | None: ...
    def signal(self, sig: int) -> None: ...


@dataclass
class NodeExit:
    name: str
    exit_code: int | None = None
    stopped_by_launch: bool = False
    started: bool = True

    @property
    def status(self) -> str:
        if not self.started:
            return "not started"
        if self.exit_code == 0:
            return "succeeded"
        if self.stopped_by_launch:
            return "stopped"
        return "failed"


@dataclass
class Outcome:
    status: str                      # succeeded | failed | interrupted
    nodes: list[NodeExit]
    first_failure: str | None = None
    reason: str = ""
    duration_s: float = 0.0
    stop_latency_s: float | None = None   # from the first failure to the last node gone


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not report an exit status"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _StopRequest:
    """SIGINT/SIGTERM only set a flag; the loop acts on it at a safe point."""

    def __init__(self):
        self.signum: int | None = None
        self.count = 0
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signum = self.signum or signum
        self.count += 1

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def supervise(procs: list[NodeProcess], router: LineRouter, *, grace_s: float = 5.0,
              poll_s: float = 0.1, notify=None) -> Outcome:
    """Start every node, stream its lines, stop all when one fails. Returns when all are gone."""
    notify = notify or (lambda text: None)
    exits = {p.name: NodeExit(p.name) for p in procs}
    readers: list[threading.Thread] = []
    started_at = time.monotonic()
    stop_at: float | None = None
    killed = False
    first_failure: str | None = None
    reason = ""
    status = "succeeded"

    def read(proc: NodeProcess) -> None:
        try:
            for line in proc.lines():
                router.line(proc.name, line)
        except Exception as err:  # a dropped connection ends the stream; poll() reports it
            router.line(proc.name, f"[launch] output stream ended: {err}")

    def begin_stop(why: str) -> None:
        nonlocal stop_at
        if stop_at is not None:
            return
        stop_at = time.monotonic()
        notify(why)
        for p in procs:
            if exits[p.name].exit_code is None:
                exits[p.name].stopped_by_launch = True
                p.signal(signal.SIGTERM)

    with _StopRequest() as request:
        for p in procs:
            try:
                p.start()
            except Exception as err:  # e.g. the SSH channel could not be opened
                first_failure, status = p.name, "failed"
                reason = f"node {p.name} could not be started: {err}"
                for never in procs[procs.index(p):]:
                    exits[never.name] = NodeExit(never.name, exit_code=-1, started=False)
                begin_stop(f"{reason}; stopping the nodes already started")
                break
            t = threading.Thread(target=read, args=(p,), name=f"read-{p.name}", daemon=True)
            t.start()
            readers.append(t)
        while any(e.exit_code is None for e in exits.values()):
            time.sleep(poll_s)
            for p in procs:
                node = exits[p.name]
                if node.exit_code is not None:
                    continue
                code = p.poll()
                if code is None:
                    continue
                node.exit_code = code
                if code != 0 and first_failure is None and stop_at is None:
                    first_failure = p.name
                    status = "failed"
                    reason = f"node {p.name} {describe_exit(code)}"
                    begin_stop(f"{reason}; stopping the other nodes")
            if request.signum is not None and stop_at is None:
                status = "interrupted"
                reason = f"launch received {signal.Signals(request.signum).name}"
                begin_stop(f"{reason}; stopping all nodes")
            escalate = stop_at is not None and time.monotonic() - stop_at > grace_s
            if (escalate or request.count > 1) and not killed and stop_at is not None:
                killed = True
                for p in procs:
                    if exits[p.name].exit_code is None:
                        p.signal(signal.SIGKILL)
    for t in readers:
        t.join(timeout=2.0)
    return Outcome(
        status=status, nodes=list(exits.values()), first_failure=first_failure, reason=reason,
        duration_s=time.monotonic() - started_at,
        stop_latency_s=None if stop_at is None else time.monotonic() - stop_at,
    )
