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

from launcher.execute.backend import in_parallel
from launcher.runs.logs import LineRouter

# Starting the nodes' agents and signalling them go to every node at once, at most this many
# at a time: each is a round trip to its node (over SSH a channel opened and a login shell
# run, or the node's watcher's answer). One after another, the 64th host of the 64-host lab
# started its job 22.6 s after the first (benchmarks/scale.py).
AT_ONCE = 32


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
    ended_at: float | None = None   # monotonic: when launch saw its exit

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
    # The signal that asked launch to stop (Ctrl-C, `launch stop`), also one that came while a
    # failure was already stopping the nodes (the status then stays the failure's): whoever
    # would go on after this attempt (a recovery) must not.
    stop_asked: int | None = None


def interrupt_words(signum: int) -> str:
    """What stopped launch, as a person would say it (ends with the signal's name)."""
    if signum == signal.SIGINT:
        return "Ctrl-C (SIGINT)"
    return f"launch was sent {signal.Signals(signum).name}"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not report an exit status"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class StopRequest:
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


# torchrun's words for a worker that died: its log line ("failed (exitcode: -9) local_rank: 0
# (pid: 123) of binary: ...") or its report's ("exitcode  : -9 (pid: 123)").
_WORKER_DIED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+) "
                          r"\(pid: (?P<pid>\d+)\)|exitcode\s*:\s*(?P<code2>-?\d+) "
                          r"\(pid: (?P<pid2>\d+)\)")


def worker_death(lines: list[str]) -> str | None:
    """What killed the node's worker when a signal did ("its worker local_rank 0 (pid 123)
    was killed by SIGKILL"): torchrun then exits with code 1, which said nothing of it. The
    last such line decides: an earlier one may be a failure the run restarted after."""
    found = [m for m in map(_WORKER_DIED.search, lines) if m is not None]
    if not found:
        return None
    code, pid = int(found[-1]["code"] or found[-1]["code2"]), found[-1]["pid"] or found[-1]["pid2"]
    if code >= 0:
        return None
    ranks = [m["rank"] for m in found if m["rank"] and m["pid"] == pid]
    rank = f" local_rank {ranks[-1]}" if ranks else ""
    return f"its worker{rank} (pid {pid}) {describe_exit(code)}"


# A rank that failed because a peer went away (gloo's "Connection closed by peer ... typically
# caused by a remote worker crashing", a reset, a store that vanished): a victim, not where a
# failure began. A user's script that raises exits with code 1, and so does its peer a moment
# later with one of these: without them the first to report was blamed, whichever it was.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker "
                       r"crash|DistNetworkError|Broken pipe|failed to recv, got 0 bytes",
                       re.IGNORECASE)


def failure_evidence(lines: list[str]) -> int:
    """How surely a failed node's last lines say the failure began there: 2 a worker killed
    by a signal; -1 its workers lost a peer (gloo's abort after a reset, SIGABRT, included);
    1 a worker that aborted itself otherwise; else 0."""
    found = signal_death_evidence(lines)
    if found < 2 and any(PEER_LOST.search(line) for line in lines):
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
              settle_s: float = 1.0, recovery: Recovering | None = None,
              store: NodeProcess | None = None) -> Outcome:
    """Start every node, stream its lines, stop all when one fails. Returns when all are gone
    (Supervisor says how). `store`: which of the services is the rendezvous store."""
    return Supervisor(procs, router, grace_s=grace_s, poll_s=poll_s, notify=notify,
                      services=services, settle_s=settle_s, recovery=recovery,
                      store=store).run()


class Supervisor:
    """One run's node agents, from their start to the last one's end.

    `services` (the rendezvous store) start first and are stopped once every node has
    exited; one that ends while nodes still run fails the run. After the first failure the
    others get `settle_s` to report theirs before being stopped, so that the node where it
    started (a rank killed by a signal) is named, not the first to notice. `recovery` decides
    about restarts and watches for hangs.

    run() is the loop: every `poll_s` it looks at the nodes (poll_nodes), the services
    (poll_services), what recovery found (act_on_recovery), the settle window (settle), a
    signal to launch (on_signal) and the grace period (escalate). Everything that starts or
    stops a node goes through start_node, restart, restart_all and begin_stop; signals only
    set flags (StopRequest), acted on here."""

    def __init__(self, procs: list[NodeProcess], router: LineRouter, *, grace_s: float,
                 poll_s: float, notify, services: list[NodeProcess], settle_s: float,
                 recovery: Recovering | None, store: NodeProcess | None = None):
        self.procs, self.router, self.services = procs, router, list(services)
        self.store = store
        self.grace_s, self.poll_s, self.settle_s = grace_s, poll_s, settle_s
        self.notify = notify or (lambda text: None)
        self.recovery = recovery
        self.exits = {p.name: NodeExit(p.name) for p in procs}
        self.readers: list[threading.Thread] = []
        self.node_readers: dict[str, threading.Thread] = {}   # each node's latest reader
        self.started_at = time.monotonic()
        self.stop_at: float | None = None       # when launch began stopping every node
        self.settle_until: float | None = None  # the end of the first failure's settle window
        self.failed_at: dict[str, float] = {}   # nodes that failed, and when launch saw it
        self.killed = False
        self.first_failure: str | None = None
        self.reason = ""
        self.status = "succeeded"
        self.request = StopRequest()
        self.signal_heard = False

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> Outcome:
        with self.request:
            not_started = self.start_services()
            if not_started is not None:
                return not_started
            self.start_nodes()
            if self.recovery is not None and self.stop_at is None:
                self.recovery.start(self.procs, self.started_at)
            while any(e.exit_code is None for e in self.exits.values()):
                time.sleep(self.poll_s)
                now = time.monotonic()
                self.poll_nodes(now)
                self.poll_services()
                if self.recovery is not None and self.stop_at is None and \
                        self.request.signum is None:
                    self.act_on_recovery()
                self.settle(now)
                self.on_signal()
                self.escalate()
            stop_services(self.services, self.grace_s)
        recovered = self.recovery.stop() if self.recovery is not None else {}
        for t in self.readers:
            t.join(timeout=2.0)
        return Outcome(
            status=self.status, nodes=list(self.exits.values()),
            first_failure=self.first_failure, reason=self.reason,
            duration_s=time.monotonic() - self.started_at,
            stop_latency_s=None if self.stop_at is None else time.monotonic() - self.stop_at,
            recovery=recovered, stop_asked=self.request.signum,
        )

    def fail(self, node: str | None, why: str, stopping: str = "stopping all nodes") -> None:
        self.first_failure, self.status, self.reason = node, "failed", why
        self.begin_stop(f"{why}; {stopping}")

    # ---- starting -----------------------------------------------------------------------
    def start_services(self) -> Outcome | None:
        """The services first; one that cannot start is the run's end, nothing else started."""
        for service in self.services:
            try:
                service.start()
            except Exception as err:  # noqa: BLE001 (named and reported, nothing else started)
                return Outcome(status="failed",
                               nodes=[NodeExit(p.name, -1, started=False) for p in self.procs],
                               first_failure=service.name,
                               reason=f"the {getattr(service, 'label', 'service')} on "
                                      f"{service.name} could not be started: {err}")
            self.start_reader(service)
        return None

    def start_nodes(self) -> None:
        """Every node's agent started: one whose start is a round trip to its node
        (`starts_remotely`: SSH) at once with the others, AT_ONCE at a time; one that forks a
        process here, in this thread, in node order: a child's parent-death signal
        (PR_SET_PDEATHSIG, launcher/backends/local/agent.py) fires when the *thread* that
        forked it ends, and a window's threads end with it (seen: every --local node killed
        as it started). A start that fails ends the starting: the nodes not yet begun are
        never started, the started ones are stopped, and the first failed node in node order
        is named."""
        failed = threading.Event()

        def one(p: NodeProcess) -> bool:
            if failed.is_set():
                return False
            try:
                p.start()
            except Exception:  # e.g. the SSH channel could not be opened
                failed.set()
                raise
            self.node_readers[p.name] = self.start_reader(p)
            return True

        remote = [p for p in self.procs if getattr(p, "starts_remotely", False)]
        started: dict = {}
        for p in self.procs:
            if p not in remote:
                try:
                    started[p] = one(p)
                except Exception as err:  # noqa: BLE001 (named below, as a remote one's)
                    started[p] = err
        started.update(in_parallel(one, remote, max_workers=AT_ONCE))
        first = next((p for p in self.procs if isinstance(started[p], Exception)), None)
        if first is None:
            return
        for p in self.procs:
            if started[p] is not True:
                self.exits[p.name] = NodeExit(p.name, exit_code=-1, started=False)
        self.fail(first.name, f"node {first.name} could not be started: {started[first]}",
                  "stopping the nodes already started")

    def start_reader(self, p: NodeProcess) -> threading.Thread:
        t = threading.Thread(target=self.read, args=(p,), name=f"read-{p.name}", daemon=True)
        t.start()
        self.readers.append(t)
        return t

    def read(self, proc: NodeProcess) -> None:
        label = getattr(proc, "label", None)
        try:
            for line in proc.lines():
                self.router.line(proc.name, line, label=label)
                if self.recovery is not None and label is None:
                    self.recovery.line(proc.name, line, label)
        except Exception as err:  # a dropped connection ends the stream; poll() reports it
            self.router.line(proc.name, f"[launch] output stream ended: {err}", label=label)

    # ---- looking ------------------------------------------------------------------------
    def poll_nodes(self, now: float) -> None:
        """Each running node's exit: a restart when recovery allows one, else a failure (and
        the settle window opens) or its success."""
        for p in self.procs:
            node = self.exits[p.name]
            if node.exit_code is not None:
                continue
            code = p.poll()
            if code is None:
                continue
            if code != 0 and self.may_restart(p) and self.recovery.node_failed(p.name, code):
                if self.recovery.restart_together:
                    problem, where = self.restart_all(f"node {p.name} {describe_exit(code)}")
                else:
                    problem = self.restart(p, f"its agent {describe_exit(code)}")
                    where = p.name
                if problem is None:
                    continue
                self.fail(where, problem)
            node.exit_code = code
            node.ended_at = now
            if code != 0 and self.stop_at is None:
                self.failed_at.setdefault(p.name, now)
                if self.settle_until is None:
                    self.settle_until = now + self.settle_s

    def may_restart(self, p: NodeProcess) -> bool:
        """Whether a node that failed now is a case for recovery at all: the run is not being
        stopped or settled, nobody finished, and the backend can start this node again."""
        return (self.recovery is not None and self.stop_at is None
                and getattr(p, "restartable", True)
                and self.settle_until is None and self.request.signum is None
                and not any(e.exit_code == 0 for e in self.exits.values()))

    def poll_services(self) -> None:
        for service in self.services:
            code = service.poll()
            # A sidecar (launcher/execute/sidecar.py) goes with its node; the job decides.
            if code is not None and self.stop_at is None and self.first_failure is None \
                    and getattr(service, "essential", True):
                label = getattr(service, "label", "service")
                self.fail(service.name, f"the {label} on node {service.name} "
                                        f"{describe_exit(code)}")

    def act_on_recovery(self) -> None:
        """A hang the watch found (restart or stop), or a reason to stop (out of restarts,
        a restart that did not bring the rendezvous back)."""
        found = self.recovery.hang()
        if found is not None:
            report, restart_allowed, lines = found
            for text in lines:
                self.notify(text)
            problem, where = self.restart_after_hang(report) if restart_allowed else \
                (report.reason(), (report.stuck_nodes() or [None])[0])
            if problem is not None:
                self.fail(where, problem)
                return
        trouble = self.recovery.trouble()
        if trouble is not None:
            self.fail(*trouble)

    def settle(self, now: float) -> None:
        """Once the settle window after the first failure is over (or nothing is left to
        wait for), blame the node where it began and stop the others."""
        if self.settle_until is None or self.stop_at is not None:
            return
        if now >= self.settle_until or self.request.signum is not None or \
                all(e.exit_code is not None for e in self.exits.values()):
            node = self.blame()
            code = self.exits[node].exit_code
            death = worker_death(self.router.tail(node, 200))
            self.fail(node, f"node {node}: {death} (torchrun {describe_exit(code)})" if death
                      else f"node {node} {describe_exit(code)}", "stopping the other nodes")

    def on_signal(self) -> None:
        if self.request.signum is None or self.signal_heard:
            return
        self.signal_heard = True
        again = "; Ctrl-C again kills them now" if self.request.signum == signal.SIGINT else ""
        if self.stop_at is not None:
            # A failure is stopping the nodes already: it stays the run's end, and nothing
            # goes on after it (Outcome.stop_asked).
            self.notify(f"{interrupt_words(self.request.signum)}: the nodes are already "
                        f"stopping{again}")
            return
        self.status = "interrupted"
        self.reason = interrupt_words(self.request.signum)
        self.begin_stop(f"{self.reason}: stopping every node (SIGTERM, SIGKILL after "
                        f"{self.grace_s:g} s{again})")

    def escalate(self) -> None:
        """SIGKILL once the grace period is over, at once at a second Ctrl-C, and at once when
        the rendezvous store has ended: a torchrun agent's calls to the store then wait on a
        socket (a lost head's: until TCP gives up), and its SIGTERM handler, Python's, runs
        only when the call returns; measured on the lab's lost head, every other node took
        the whole grace period. Its workers, in sessions of their own, could not have heard
        SIGTERM from it either; what is left of them goes with the node's start (the SSH
        node's guard, the local agent's reap)."""
        if self.stop_at is None or self.killed:
            return
        store_gone = self.store is not None and self.store.poll() is not None
        if time.monotonic() - self.stop_at > self.grace_s or self.request.count > 1 or \
                store_gone:
            if store_gone and time.monotonic() - self.stop_at <= self.grace_s:
                self.notify(f"the rendezvous store on {self.store.name} has ended: the nodes' "
                            "torchrun cannot act on SIGTERM while their calls to it wait; "
                            "SIGKILL now")
            self.killed = True
            signal_all([p for p in self.procs if self.exits[p.name].exit_code is None],
                       signal.SIGKILL)

    # ---- stopping and blaming ----------------------------------------------------------
    def begin_stop(self, why: str) -> None:
        if self.stop_at is not None:
            return
        self.stop_at = time.monotonic()
        self.notify(why)
        running = [p for p in self.procs if self.exits[p.name].exit_code is None]
        for p in running:
            self.exits[p.name].stopped_by_launch = True
            # Its agent's report of the SIGTERM (a traceback) is no news: log only.
            self.router.mute(p.name)
        signal_all(running, signal.SIGTERM)

    def blame(self) -> str:
        """The failed node where the failure began: a worker killed by a signal launch did
        not send (one that aborted itself, or only lost its peer, only when no other was),
        else the first to report."""
        # A node's exit status can arrive before its last lines (over SSH they travel apart,
        # and the killed worker's `exitcode: -9` is among the last): let the exited nodes'
        # output end first, within the settle window (at least a moment once it has passed).
        until = max(self.settle_until or 0.0, time.monotonic() + 0.2)
        for name in self.failed_at:
            reader = self.node_readers.get(name)
            if reader is not None:
                reader.join(timeout=max(0.0, until - time.monotonic()))
        order = sorted(self.failed_at, key=self.failed_at.get)
        evidence = {name: failure_evidence(self.router.tail(name, 200)) for name in order}
        return max(order, key=lambda name: evidence[name])  # max keeps the first of equals

    # ---- restarting ---------------------------------------------------------------------
    def restart(self, p: NodeProcess, why: str) -> str | None:
        """The node's agent again on the same host: what is left of the old one is killed
        (by its process group), then it is started, retried until the restart deadline (its
        peers wait that long in the rendezvous). Returns why it could not be."""
        recovery = self.recovery
        if not recovery.restart_together:
            self.notify(f"{_restart_of(recovery)}: node {p.name}, {why}; starting its agent "
                        "again, the other nodes wait in the rendezvous")
        p.signal(signal.SIGKILL)
        gone_by = time.monotonic() + self.grace_s + 5.0
        while p.poll() is None and time.monotonic() < gone_by:
            time.sleep(self.poll_s)
        give_up_at = time.monotonic() + recovery.restart_deadline_s
        # LAUNCH_ATTEMPT of the restarted node: the run's restarts so far (its peers count
        # the rounds their agents started, launch_node/worker.py rounds_before).
        p.attempt_offset = recovery.attempts()
        while True:
            try:
                p.start()
                break
            except Exception as err:  # noqa: BLE001 (unreachable host: retried, then named)
                if self.request.signum is not None:
                    return "launch was interrupted while restarting it"
                if time.monotonic() >= give_up_at:
                    return (f"node {p.name} could not be restarted within "
                            f"{recovery.restart_deadline_s:g}s: {err}")
                time.sleep(2.0)
        self.exits[p.name].restarts += 1
        self.node_readers[p.name] = self.start_reader(p)
        recovery.restarted()
        return None

    def restart_all(self, why: str) -> tuple[str | None, str | None]:
        """A job that brought its own launcher (a command) is restarted whole: every node
        stopped (SIGTERM, SIGKILL after the grace period), then every node started again with
        the next LAUNCH_ATTEMPT. Returns (why it could not be, the node)."""
        self.notify(f"{_restart_of(self.recovery)}: {why}; restarting every node")
        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            self.router.mute(p.name)
        signal_all(running, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        for p in self.procs:
            self.router.unmute(p.name)
            problem = self.restart(p, "with the others")
            if problem is not None:
                return problem, p.name
        self.recovery.closed()
        return None, None

    def restart_after_hang(self, report) -> tuple[str | None, str | None]:
        """Kill the stuck ranks (their node's torchrun starts its workers again, and the
        other nodes follow into a new rendezvous round); a node whose ranks cannot be killed
        that way gets its agent restarted."""
        if self.recovery.restart_together:
            return self.restart_all("after the hang")
        by_name = {p.name: p for p in self.procs}
        targets = report.pids_to_restart() or {name: [] for name in by_name}
        for name, pids in targets.items():
            p = by_name[name]
            gone = []
            if pids and hasattr(p, "kill_ranks"):
                try:
                    gone = p.kill_ranks(pids).get("killed", [])
                except Exception as err:  # noqa: BLE001 (then the agent goes instead)
                    self.notify(f"could not kill the stuck ranks on node {name}: {err}")
            if gone:
                self.notify(f"killed rank process(es) {', '.join(map(str, gone))} on node "
                            f"{name}; torchrun restarts its workers")
                continue
            problem = self.restart(p, "after the hang")
            if problem is not None:
                return problem, name
        self.recovery.restarted()
        return None, None


def signal_all(procs: list[NodeProcess], sig: int) -> None:
    """`sig` to every node's agent at once, AT_ONCE at a time."""
    in_parallel(lambda p: p.signal(sig), procs, max_workers=AT_ONCE)


def _restart_of(recovery) -> str:
    restart_of = getattr(recovery, "restart_of", None)
    return restart_of() if restart_of is not None else "restart"


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
