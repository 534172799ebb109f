"""Fail-fast supervision of node agents, shared by the local and SSH executors.

Every node's output is routed as it arrives. When one node exits non-zero (or its connection
drops), or launch gets SIGINT/SIGTERM, every node still running is sent SIGTERM to its process
group, then SIGKILL after a grace period: by the ids launch recorded, never by name.
"""

from __future__ import annotations

import re
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


# torchrun's report of a worker that died by a signal it did not send: the node where a
# failure starts (a killed or crashed rank). The other nodes' workers then fail with a
# connection error, often reported first.
_SIGNAL_DEATH = re.compile(r"exitcode\s*:\s*-\d+|Signal \d+ \(SIG[A-Z0-9]+\) received by PID")


def killed_by_signal(lines: list[str]) -> bool:
    return any(_SIGNAL_DEATH.search(line) for line in lines)


def supervise(procs: list[NodeProcess], router: LineRouter, *, grace_s: float = 5.0,
              poll_s: float = 0.1, notify=None, services: list[NodeProcess] = (),
              settle_s: float = 1.0) -> Outcome:
    """Start every node, stream its lines, stop all when one fails. Returns when all are gone.

    `services` (the rendezvous store) start first and are stopped once every node has
    exited; one that ends while nodes still run fails the run. After the first failure the
    others get `settle_s` to report theirs before being stopped, so that the node where it
    started (a rank killed by a signal) is named, not the first to notice."""
    notify = notify or (lambda text: None)
    exits = {p.name: NodeExit(p.name) for p in procs}
    readers: list[threading.Thread] = []
    started_at = time.monotonic()
    stop_at: float | None = None
    settle_until: float | None = None
    failed_at: dict[str, float] = {}
    killed = False
    first_failure: str | None = None
    reason = ""
    status = "succeeded"

    def read(proc: NodeProcess) -> None:
        label = getattr(proc, "label", None)
        try:
            for line in proc.lines():
                router.line(proc.name, line, label=label)
        except Exception as err:  # a dropped connection ends the stream; poll() reports it
            router.line(proc.name, f"[launch] output stream ended: {err}", label=label)

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

    def blame() -> str:
        """The failed node where the failure began: a worker killed by a signal launch did
        not send, else the first to report."""
        order = sorted(failed_at, key=failed_at.get)
        for name in order:
            if killed_by_signal(router.tail(name, 200)):
                return name
        return order[0]

    def start_reader(p: NodeProcess) -> None:
        t = threading.Thread(target=read, args=(p,), name=f"read-{p.name}", daemon=True)
        t.start()
        readers.append(t)

    with _StopRequest() as request:
        for service in services:
            try:
                service.start()
            except Exception as err:  # noqa: BLE001 (named and reported, nothing else started)
                return Outcome(status="failed", nodes=[NodeExit(p.name, -1, started=False)
                                                       for p in procs],
                               first_failure=service.name,
                               reason=f"the {getattr(service, 'label', 'service')} on "
                                      f"{service.name} could not be started: {err}")
            start_reader(service)
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
            start_reader(p)
        while any(e.exit_code is None for e in exits.values()):
            time.sleep(poll_s)
            now = time.monotonic()
            for p in procs:
                node = exits[p.name]
                if node.exit_code is not None:
                    continue
                code = p.poll()
                if code is None:
                    continue
                node.exit_code = code
                if code != 0 and stop_at is None:
                    failed_at.setdefault(p.name, now)
                    if settle_until is None:
                        settle_until = now + settle_s
            for service in services:
                code = service.poll()
                if code is not None and stop_at is None and first_failure is None:
                    label = getattr(service, "label", "service")
                    first_failure, status = service.name, "failed"
                    reason = f"the {label} on node {service.name} {describe_exit(code)}"
                    begin_stop(f"{reason}; stopping all nodes")
            if settle_until is not None and stop_at is None and (
                    now >= settle_until or request.signum is not None
                    or all(e.exit_code is not None for e in exits.values())):
                first_failure = blame()
                status = "failed"
                reason = f"node {first_failure} {describe_exit(exits[first_failure].exit_code)}"
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
        stop_services(services, grace_s)
    for t in readers:
        t.join(timeout=2.0)
    return Outcome(
        status=status, nodes=list(exits.values()), first_failure=first_failure, reason=reason,
        duration_s=time.monotonic() - started_at,
        stop_latency_s=None if stop_at is None else time.monotonic() - stop_at,
    )


def stop_services(services: list[NodeProcess], grace_s: float, poll_s: float = 0.05) -> None:
    """SIGTERM, then SIGKILL after the grace period, to whatever service still runs."""
    running = [s for s in services if s.poll() is None]
    for service in running:
        service.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while running and time.monotonic() < deadline:
        time.sleep(poll_s)
        running = [s for s in running if s.poll() is None]
    for service in running:
        service.signal(signal.SIGKILL)
