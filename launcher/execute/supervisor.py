"""Fail-fast supervision of node agents, shared by the local and SSH executors.

Every node's output is routed as it arrives. When one node exits non-zero (or its connection
drops), or launch gets SIGINT/SIGTERM, every node still running is sent SIGTERM to its process
group, then SIGKILL after a grace period: by the ids launch recorded, never by name.

With a `recovery` (launcher/execute/recovery.py: the recipe's restarts and hang timeout), a
node agent that dies is started again on its host while the others wait in the rendezvous,
and a hang is described (every rank's stack) before the run restarts or stops; beyond the
restart budget, or when a node cannot be restarted in time, everything stops as above.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    restarts: int = 0          # times launch started this node's agent again

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
    recovery: dict[str, Any] = field(default_factory=dict)  # restarts, hang, resumed step


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
# connection error, often reported first, and gloo's may abort themselves on the way out
# ("Connection reset by peer", then "terminate called without an active exception":
# SIGABRT). So SIGABRT is weaker evidence than any other signal.
_SIGNAL_DEATH = re.compile(r"exitcode\s*:\s*-(\d+)|Signal (\d+) \(SIG[A-Z0-9]+\) received by PID")


def exit_evidence(code: int) -> int:
    """How surely a worker's exit code says the failure began with it. 2: died by a signal
    other than SIGABRT (killed, or crashed: SIGSEGV, SIGBUS); 1: SIGABRT (a process aborting
    itself, often after a peer went away); 0: not by a signal."""
    if code >= 0:
        return 0
    return 1 if -code == signal.SIGABRT else 2


def signal_death_evidence(lines: list[str]) -> int:
    """The strongest exit_evidence among torchrun's reports of dead workers in these lines."""
    found = 0
    for line in lines:
        for match in _SIGNAL_DEATH.finditer(line):
            found = max(found, exit_evidence(-int(match.group(1) or match.group(2))))
    return found


# A rank that failed because a peer went away (gloo's "Connection closed by peer ... typically
# caused by a remote worker crashing", a reset, a store that vanished): a victim, not where a
# failure began. A user's script that raises exits with code 1, and so does its peer a moment
# later with one of these: without them the first to report was blamed, whichever it was.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker "
                       r"crash|DistNetworkError|Broken pipe|failed to recv, got 0 bytes",
                       re.IGNORECASE)


def failure_evidence(lines: list[str]) -> int:
    """How surely a failed node's last lines say the failure began there: exit_evidence of
    its dead workers (2, 1), else 0, or -1 when its workers only lost a peer."""
    found = signal_death_evidence(lines)
    if found == 0 and any(PEER_LOST.search(line) for line in lines):
        return -1
    return found


class Recovering(Protocol):
    """What supervise asks a recovery policy (launcher/execute/recovery.py Recovery)."""

    restart_deadline_s: float

    def start(self, procs: list[NodeProcess], started_at: float) -> None: ...
    def line(self, node: str, raw: str, label: str | None) -> None: ...
    def node_failed(self, node: str, code: int) -> bool: ...
    def hang(self) -> tuple[Any, bool, list[str]] | None: ...
    def trouble(self) -> tuple[str, str] | None: ...
    def restarted(self) -> None: ...
    def closed(self) -> None: ...
    def attempts(self) -> int: ...
    restart_together: bool
    def stop(self) -> dict[str, Any]: ...


def supervise(procs: list[NodeProcess], router: LineRouter, *, grace_s: float = 5.0,
              poll_s: float = 0.1, notify=None, services: list[NodeProcess] = (),
              settle_s: float = 1.0, recovery: Recovering | None = None) -> Outcome:
    """Start every node, stream its lines, stop all when one fails. Returns when all are gone.

    `services` (the rendezvous store) start first and are stopped once every node has
    exited; one that ends while nodes still run fails the run. After the first failure the
    others get `settle_s` to report theirs before being stopped, so that the node where it
    started (a rank killed by a signal) is named, not the first to notice. `recovery` decides
    about restarts and watches for hangs."""
    notify = notify or (lambda text: None)
    exits = {p.name: NodeExit(p.name) for p in procs}
    readers: list[threading.Thread] = []
    node_readers: dict[str, threading.Thread] = {}   # the latest reader of each node's output
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
                if recovery is not None and label is None:
                    recovery.line(proc.name, line, label)
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
                # Its agent's report of the SIGTERM (a traceback) is no news: log only.
                router.mute(p.name)
                p.signal(signal.SIGTERM)

    def blame() -> str:
        """The failed node where the failure began: a worker killed by a signal launch did
        not send (one that aborted itself only when no other was), else the first to
        report."""
        # A node's exit status can arrive before its last lines (over SSH they travel apart,
        # and the killed worker's `exitcode: -9` is among the last): let the exited nodes'
        # output end first, within the settle window (at least a moment once it has passed).
        until = max(settle_until or 0.0, time.monotonic() + 0.2)
        for name in failed_at:
            reader = node_readers.get(name)
            if reader is not None:
                reader.join(timeout=max(0.0, until - time.monotonic()))
        order = sorted(failed_at, key=failed_at.get)
        evidence = {name: failure_evidence(router.tail(name, 200)) for name in order}
        return max(order, key=lambda name: evidence[name])  # max keeps the first of equals

    def start_reader(p: NodeProcess) -> threading.Thread:
        t = threading.Thread(target=read, args=(p,), name=f"read-{p.name}", daemon=True)
        t.start()
        readers.append(t)
        return t

    def restart_all(why: str) -> tuple[str | None, str | None]:
        """A job that brought its own launcher (a command) is restarted whole: every node
        stopped (SIGTERM, SIGKILL after the grace period), then every node started again with
        the next LAUNCH_ATTEMPT. Returns (why it could not be, the node)."""
        notify(f"restarting every node ({why})")
        running = [p for p in procs if p.poll() is None]
        for p in running:
            router.mute(p.name)
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(poll_s)
        for p in procs:
            router.unmute(p.name)
            problem = restart(p, "with the others")
            if problem is not None:
                return problem, p.name
        recovery.closed()
        return None, None

    def restart_after_hang(report) -> tuple[str | None, str | None]:
        """Kill the stuck ranks (their node's torchrun starts its workers again, and the
        other nodes follow into a new rendezvous round); a node whose ranks cannot be killed
        that way gets its agent restarted."""
        if recovery.restart_together:
            return restart_all("after the hang")
        by_name = {p.name: p for p in procs}
        targets = report.pids_to_restart() or {name: [] for name in by_name}
        for name, pids in targets.items():
            p = by_name[name]
            gone = []
            if pids and hasattr(p, "kill_ranks"):
                try:
                    gone = p.kill_ranks(pids).get("killed", [])
                except Exception as err:  # noqa: BLE001 (then the agent goes instead)
                    notify(f"could not kill the stuck ranks on node {name}: {err}")
            if gone:
                notify(f"killed rank process(es) {', '.join(map(str, gone))} on node "
                       f"{name}; torchrun restarts its workers")
                continue
            problem = restart(p, "after the hang")
            if problem is not None:
                return problem, name
        recovery.restarted()
        return None, None

    def restart(p: NodeProcess, why: str) -> str | None:
        """The node's agent again on the same host: what is left of the old one is killed
        (by its process group), then it is started, retried until the restart deadline (its
        peers wait that long in the rendezvous). Returns why it could not be."""
        if not recovery.restart_together:
            notify(f"restarting node {p.name} ({why}); the other nodes wait in the rendezvous")
        p.signal(signal.SIGKILL)
        gone_by = time.monotonic() + grace_s + 5.0
        while p.poll() is None and time.monotonic() < gone_by:
            time.sleep(poll_s)
        give_up_at = time.monotonic() + recovery.restart_deadline_s
        # LAUNCH_ATTEMPT of the restarted node: the run's restarts so far (its peers count
        # theirs through torchrun's restart count, train/worker.py).
        p.attempt_offset = recovery.attempts()
        while True:
            try:
                p.start()
                break
            except Exception as err:  # noqa: BLE001 (unreachable host: retried, then named)
                if request.signum is not None:
                    return "launch was interrupted while restarting it"
                if time.monotonic() >= give_up_at:
                    return (f"node {p.name} could not be restarted within "
                            f"{recovery.restart_deadline_s:g}s: {err}")
                time.sleep(2.0)
        exits[p.name].restarts += 1
        node_readers[p.name] = start_reader(p)
        recovery.restarted()
        return None

    def act_on_recovery() -> None:
        """A hang the watch found (restart or stop), or a reason to stop (out of restarts,
        a restart that did not bring the rendezvous back)."""
        nonlocal first_failure, status, reason
        found = recovery.hang()
        if found is not None:
            report, restart_allowed, lines = found
            for text in lines:
                notify(text)
            problem, where = restart_after_hang(report) if restart_allowed else \
                (report.reason(), (report.stuck_nodes() or [None])[0])
            if problem is not None:
                first_failure, status, reason = where, "failed", problem
                begin_stop(f"{reason}; stopping all nodes")
                return
        trouble = recovery.trouble()
        if trouble is not None:
            first_failure, reason = trouble
            status = "failed"
            begin_stop(f"{reason}; stopping all nodes")

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
            node_readers[p.name] = start_reader(p)
        if recovery is not None and stop_at is None:
            recovery.start(procs, started_at)
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
                if (code != 0 and recovery is not None and stop_at is None
                        and getattr(p, "restartable", True)
                        and settle_until is None and request.signum is None
                        and not any(e.exit_code == 0 for e in exits.values())
                        and recovery.node_failed(p.name, code)):
                    why = f"node {p.name} {describe_exit(code)}"
                    if recovery.restart_together:
                        problem, where = restart_all(why)
                    else:
                        problem, where = restart(p, f"its agent {describe_exit(code)}"), p.name
                    if problem is None:
                        continue
                    first_failure, status, reason = where, "failed", problem
                    begin_stop(f"{reason}; stopping all nodes")
                node.exit_code = code
                if code != 0 and stop_at is None:
                    failed_at.setdefault(p.name, now)
                    if settle_until is None:
                        settle_until = now + settle_s
            for service in services:
                code = service.poll()
                # A sidecar (launcher/execute/sidecar.py) goes with its node; the job decides.
                if code is not None and stop_at is None and first_failure is None \
                        and getattr(service, "essential", True):
                    label = getattr(service, "label", "service")
                    first_failure, status = service.name, "failed"
                    reason = f"the {label} on node {service.name} {describe_exit(code)}"
                    begin_stop(f"{reason}; stopping all nodes")
            if recovery is not None and stop_at is None and request.signum is None:
                act_on_recovery()
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
    recovered = recovery.stop() if recovery is not None else {}
    for t in readers:
        t.join(timeout=2.0)
    return Outcome(
        status=status, nodes=list(exits.values()), first_failure=first_failure, reason=reason,
        duration_s=time.monotonic() - started_at,
        stop_latency_s=None if stop_at is None else time.monotonic() - stop_at,
        recovery=recovered,
    )


def stop_services(services: list[NodeProcess], grace_s: float, poll_s: float = 0.05) -> None:
    """SIGTERM, then SIGKILL after the grace period (or a service's own `drain_s`: the
    checkpoint mirror finishing its uploads), to whatever service still runs."""
    running = [s for s in services if s.poll() is None]
    for service in running:
        service.signal(signal.SIGTERM)
    deadline = time.monotonic() + max([grace_s, *(getattr(s, "drain_s", 0.0) for s in running)])
    while running and time.monotonic() < deadline:
        time.sleep(poll_s)
        running = [s for s in running if s.poll() is None]
    for service in running:
        service.signal(signal.SIGKILL)
