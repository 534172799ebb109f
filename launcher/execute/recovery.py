"""Restarts: counting them against the recipe's budget, and what each one cost.

One failure often shows up several times: a killed worker's agent reports it, and the ranks
on the other nodes then lose their peer and fail too. Everything reported until the
rendezvous has re-formed (a new worker prints its `rank R/W on HOST` line) belongs to one
*incident*, blamed on the node where it began (a worker killed by a signal, else the first to
report), and counts once. What it cost comes from the trainer's own lines:

    resumed from checkpoint step 40 (...); the previous attempt had reached step 47: 7 step(s) lost
    step 41: first step since the restart

torchrun restarts a node's workers by itself (`--max-restarts`, the same budget); launch
restarts a node agent that died or whose connection dropped, and after a hang the agents of
the stuck ranks.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.execute.forensics import NO_SIGN, NO_STEP, HangReport, investigate
from launcher.execute.supervisor import PEER_LOST, describe_exit, exit_evidence
from launcher.execute.watch import HangWatch
from launcher.runs.logs import split_rank
from launcher.runs.progress import parse_step

# torchrun's agent, when a worker fails: "failed (exitcode: -9) local_rank: 0 (pid: 123) of
# binary: ..." (torch/distributed/elastic/multiprocessing/api.py).
WORKER_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)")
# launch_node/worker.py (every rank of a script, module or the trainer), and train/main.py
REFORMED = re.compile(r"^(launch: worker )?rank \d+/\d+ ")
RESUMED = re.compile(r"^resumed from checkpoint step (?P<step>\d+)")
NO_CHECKPOINT = re.compile(r"^no checkpoint to resume from")
LOST = re.compile(r"had reached step (?P<reached>\d+): (?P<lost>\d+) step\(s\) lost")
LOADED = re.compile(r"read and shared in (?P<s>[0-9.]+)s")
FIRST_STEP = re.compile(r"^step (?P<step>\d+): first step since the restart")
# A machine lost without a word (a spot reclaim, a host pulled): its node stops answering the
# hang watch's looks (every 2 s at most) at once, where its SSH connection fails only when TCP
# gives up (keepalives every 5 s, TCP_USER_TIMEOUT 20 s). A look unanswered this long, the
# node's fleet is asked whether its machine is gone (at most this often per node): a node's
# look takes well under a second, and this leaves seconds of room for a loaded machine's late
# answer, which the fleet then clears. A paused watch (a restart, forensics) asks nothing and
# so makes no node quiet (launcher/execute/watcher_answers.py KeptWatcher.quiet_s). 3 s, not
# 5: on the lab's lost head the notice came 6.3 s after the loss with 5 (the look's 2 s period
# comes first); below 3 a loaded fleet of hundreds would ask EC2 about many nodes that are
# merely slow (DescribeInstances per node, at most every FLEET_ASK_S).
QUIET_S = 3.0
FLEET_ASK_S = 5.0


@dataclass
class Incident:
    kind: str                  # worker | node | hang
    node: str
    reason: str
    at_time_s: float
    signal_death: bool = False
    reformed: bool = False
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    recovered_in_s: float | None = None
    checkpoint_load_s: float | None = None
    # A user's job's LAUNCH_STEP lines around it: the highest step reported before, the first
    # after (it resumed from a checkpoint of its own when that is above 1).
    reached_step: int | None = None
    next_step: int | None = None
    # Every (node, reason) reported within the incident, in order (blame may move on).
    reports: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "kind": self.kind, "reason": self.reason,
                "at_time_s": round(self.at_time_s, 3),
                "resumed_from_step": self.resumed_from_step, "steps_lost": self.steps_lost,
                "recovered_in_s": None if self.recovered_in_s is None
                else round(self.recovered_in_s, 3),
                "checkpoint_load_s": self.checkpoint_load_s,
                "reached_step": self.reached_step, "next_step": self.next_step}


class RestartBook:
    """Thread-safe: reader threads feed lines, the supervisor asks."""

    def __init__(self, budget: int):
        self.budget = budget
        self.incidents: list[Incident] = []
        # Told of each new incident within the budget, outside the lock (Recovery announces it).
        self.on_new = None
        # What this attempt started from (`launch run --resume`, or a trainer that found a
        # checkpoint at start-up): before any incident.
        self.started_from_step: int | None = None
        self.started_steps_lost: int | None = None
        self._exhausted: tuple[str, str] | None = None
        self._lock = threading.Lock()
        # Nodes whose workers reported losing a peer since the rendezvous last formed: victims
        # of a failure that began elsewhere (launcher/execute/supervisor.py PEER_LOST).
        self._peer_lost: set[str] = set()
        self._step: int | None = None      # the highest LAUNCH_STEP step since the last incident
        # A new incident first reported by a node that only lost its peer, not yet announced:
        # said once a node that did not (where it began) reports, or when the rendezvous
        # re-forms (seen on a loaded machine: "restart 1 of 1: node node0" said of the victim,
        # node1's own report arriving a moment later). (incident, its number)
        self._held: tuple[Incident, int] | None = None

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def used(self) -> int:
        return len(self.incidents)

    def _open(self) -> Incident | None:
        current = self.incidents[-1] if self.incidents else None
        return current if current is not None and not current.reformed else None

    def failure(self, kind: str, node: str, reason: str, now_s: float,
                signal_death: bool = False) -> bool:
        """A failure: part of the open incident, or a new one. True while within budget."""
        with self._lock:
            current = self._open()
            if current is not None:
                current.reports.append((node, reason))
                if signal_death and not current.signal_death and current.kind != "hang":
                    # Where it began: a worker killed by a signal launch did not send (after a
                    # hang, launch's own kill of the stuck rank is not the cause).
                    current.node, current.reason = node, reason
                    current.signal_death = True
                self._reblame(current)
                told = self._release(only_if_blamed=True)
            else:
                incident = Incident(kind, node, reason, now_s, signal_death,
                                    reports=[(node, reason)], reached_step=self._step)
                self._step = None
                self.incidents.append(incident)
                if len(self.incidents) > self.budget:
                    where = "" if kind == "hang" else f"node {node}: "
                    self._exhausted = (node, f"{where}{reason}; the run had used its "
                                             f"{self.budget} restart(s)")
                    return False
                told = (incident, len(self.incidents))
                if kind == "worker" and node in self._peer_lost and not signal_death:
                    self._held, told = told, None
        self._tell(told)
        return True

    def _release(self, only_if_blamed: bool = False) -> tuple[Incident, int] | None:
        """The held announcement, to be said now (under the lock): at once, or `only_if_blamed`
        once its incident names a node that did not only lose its peer."""
        held = self._held
        if held is None or (only_if_blamed and held[0].node in self._peer_lost and
                            not held[0].signal_death):
            return None
        self._held = None
        return held

    def _tell(self, told: tuple[Incident, int] | None) -> None:
        if told is not None and self.on_new is not None:
            self.on_new(*told)

    def _reblame(self, incident: Incident) -> None:
        """A node blamed for only losing its peer gives the blame to the first node of the
        incident that did not (the lines saying so may come after its failure report)."""
        if incident.signal_death or incident.kind == "hang" or \
                incident.node not in self._peer_lost:
            return
        for node, reason in incident.reports:
            if node not in self._peer_lost:
                incident.node, incident.reason = node, reason
                return

    def exhausted(self) -> tuple[str, str] | None:
        """(node, reason) once a failure came with no restart left."""
        with self._lock:
            return self._exhausted

    def waiting(self, now_s: float, deadline_s: float) -> Incident | None:
        """The open incident, once the rendezvous has taken longer than deadline_s to
        re-form."""
        with self._lock:
            current = self._open()
            if current is not None and now_s - current.at_time_s > deadline_s:
                return current
            return None

    def line(self, node: str, rank: str, text: str, now_s: float) -> None:
        """Every line any node prints, as it arrives."""
        text = text.strip()
        m = WORKER_FAILED.search(text)
        if m and self.enabled and rank == "agent":
            code = int(m["code"])
            self.failure("worker", node, f"worker local_rank {m['local_rank']} (pid "
                         f"{m['pid']}) {describe_exit(code)}", now_s,
                         signal_death=exit_evidence(code) == 2)
            return
        if rank != "agent" and PEER_LOST.search(text):
            with self._lock:
                self._peer_lost.add(node)
                current = self._open()
                if current is not None:
                    self._reblame(current)
                told = self._release(only_if_blamed=True)
            self._tell(told)
        if REFORMED.match(text):
            with self._lock:
                current = self._open()
                if current is not None:
                    current.reformed = True
                self._peer_lost.clear()
                told = self._release()   # nobody else reported: said as it stands
            self._tell(told)
            return
        resumed, none = RESUMED.match(text), NO_CHECKPOINT.match(text)
        if resumed or none:
            step = int(resumed["step"]) if resumed else 0
            lost = LOST.search(text)
            with self._lock:
                target = self.incidents[-1] if self.incidents else None
                if target is None or target.resumed_from_step is not None:
                    self.started_from_step = step
                    self.started_steps_lost = int(lost["lost"]) if lost else None
                    return
                target.resumed_from_step = step
                target.steps_lost = int(lost["lost"]) if lost else None
                loaded = LOADED.search(text)
                target.checkpoint_load_s = float(loaded["s"]) if loaded else None
            return
        step = parse_step(text) if text.startswith("LAUNCH_STEP") else None
        if step is not None:
            with self._lock:
                self._step = max(self._step or 0, step.step)
                last = self.incidents[-1] if self.incidents else None
                if last is not None and last.reformed and last.next_step is None:
                    last.next_step = step.step
            return
        if FIRST_STEP.match(text):
            with self._lock:
                if self.incidents and self.incidents[-1].recovered_in_s is None:
                    self.incidents[-1].recovered_in_s = now_s - self.incidents[-1].at_time_s

    def close(self) -> None:
        with self._lock:
            current = self._open()
            if current is not None:
                current.reformed = True
            told = self._release()
        self._tell(told)

    def to_json(self) -> list[dict[str, Any]]:
        """Each incident; `restarted` false for the one beyond the budget, which ended the
        run."""
        with self._lock:
            return [{**i.to_json(), "restarted": n < self.budget}
                    for n, i in enumerate(self.incidents)]


class Recovery:
    """The supervisor's recovery policy for one run (launcher/execute/supervisor.py
    Recovering): the restart budget, the hang watch, and what they recorded."""

    def __init__(self, restarts: int, hang_timeout_s: float | None, restart_deadline_s: float,
                 folder: Path, clock=time.monotonic, user_job: bool = False,
                 restart_together: bool = False, node_lost=None, machine_lost=None):
        self.book = RestartBook(restarts)
        self.hang_timeout_s = hang_timeout_s
        self.restart_deadline_s = restart_deadline_s
        self.folder = folder
        self.clock = clock
        self.started_at = clock()
        self.watch: HangWatch | None = None
        self.hangs: list[dict[str, Any]] = []
        # A user's job: the hang watch reads its processes and output (launcher/runs/progress.py
        # StepLines, set by the runner), not heartbeats.
        self.user_job = user_job
        self.steps = None
        # A command (its own launcher): a failure restarts every node, not one agent.
        self.restart_together = restart_together
        # node -> why its machine is gone, or None (launcher/backends/ssh/replace.py): an agent is
        # not restarted on a machine that is no more.
        self.node_lost = node_lost
        # (node, why), once, when this attempt has lost a node's machine and so fails for it:
        # its replacement can begin while the attempt winds down (launcher/pipeline/recover.py).
        self.machine_lost = machine_lost
        self.lost: dict[str, str] = {}
        self.procs: list = []
        self._asked_fleet: dict[str, float] = {}
        self._forsaken: set[str] = set()
        # Where a restart is announced as it happens (the runner gives the terminal's line).
        self.notify = None
        self.book.on_new = self._announce

    def restart_of(self) -> str:
        """"restart N of M": the restart under way, against the budget."""
        return f"restart {self.book.used} of {self.book.budget}"

    def _announce(self, incident: Incident, number: int) -> None:
        """One line per restart, as it begins. torchrun restarts a node's workers by itself
        (a `worker` incident): nothing else says so; the supervisor says it for the restarts
        it makes (an agent, every node, after a hang). A command's own torchrun restarts
        nothing (launch restarts the command on every node, and says so)."""
        if incident.kind == "worker" and self.notify is not None and not self.restart_together:
            self.notify(f"restart {number} of {self.book.budget}: node {incident.node}, "
                        f"{incident.reason}; torchrun starts the node's workers again, the "
                        "rendezvous re-forms")

    def _now_s(self) -> float:
        return self.clock() - self.started_at

    def start(self, procs: list, started_at: float) -> None:
        self.started_at = started_at
        self.procs = list(procs)
        need = "activity" if self.user_job else "heartbeats"
        watched = [p for p in procs if hasattr(p, need) and hasattr(p, "dump_ranks")]
        if watched:
            self.watch = HangWatch(watched, self.hang_timeout_s, self._investigate, self.clock,
                                   steps=self.steps, user_job=self.user_job)
            self.watch.start()

    def _investigate(self, procs: list, idle_s: float, timeout_s: float) -> HangReport:
        return investigate(procs, idle_s, timeout_s, self.folder, number=len(self.hangs) + 1,
                           idle_means=NO_SIGN if self.user_job else NO_STEP)

    def line(self, node: str, raw: str, label: str | None) -> None:
        rank, text = split_rank(raw.rstrip("\r\n"))
        self.book.line(node, rank, text, self._now_s())

    def node_failed(self, node: str, code: int) -> bool:
        """A node agent ended with `code`: restart it (True) while restarts are left, and
        while its machine is there."""
        why = self.node_lost(node) if self.node_lost is not None else None
        if why:
            self._lose(node, why)
            return False
        if not self.book.enabled or (self.watch is not None and self.watch.finished()):
            return False
        return self.book.failure("node", node, f"node agent {describe_exit(code)}",
                                 self._now_s(), signal_death=code < 0)

    def hang(self) -> tuple[HangReport, bool, list[str]] | None:
        """A hang the watch found: (report, restart?, lines to print)."""
        report = self.watch.take() if self.watch is not None else None
        if report is None:
            return None
        now_s = self._now_s()
        stuck = report.stuck_nodes()
        restart = self.book.enabled and self.book.failure(
            "hang", stuck[0] if stuck else "all", report.reason(), now_s)
        self.hangs.append(report.to_json(now_s, "restart" if restart else "stop"))
        lines = report.lines(self.folder)
        if restart:
            lines.append(f"{self.restart_of()}: " + ("restarting the nodes of the stuck ranks"
                                                     if stuck else "restarting every node"))
        return report, restart, lines

    def gone_quietly(self) -> None:
        """A node that has left a look of the hang watch unanswered for QUIET_S: its fleet asked
        (at most every FLEET_ASK_S) whether its machine is gone; if so, its connection is
        closed (`forsake`), and the node ends now, as when its connection drops, instead of
        when TCP gives up on it (~20 s). Silence alone decides nothing: a loaded machine that
        answers late is asked about, and goes on when its fleet says it is there."""
        if self.node_lost is None:
            return
        now = self.clock()
        for proc in self.procs:
            quiet = proc.quiet_s() if hasattr(proc, "quiet_s") else None
            if quiet is None or quiet < QUIET_S or proc.name in self._forsaken or \
                    now - self._asked_fleet.get(proc.name, -FLEET_ASK_S) < FLEET_ASK_S:
                continue
            self._asked_fleet[proc.name] = now
            why = self.node_lost(proc.name)
            if why:
                if self.notify is not None:
                    self.notify(f"node {proc.name}: no answer for {quiet:.0f} s and its "
                                f"machine is gone ({why})")
                self._forsaken.add(proc.name)
                self._lose(proc.name, why)
                proc.forsake()

    def _lose(self, node: str, why: str) -> None:
        if node not in self.lost:
            self.lost[node] = why
            if self.machine_lost is not None:
                self.machine_lost(node, why)

    def trouble(self) -> tuple[str, str] | None:
        """(node, reason) when the run must stop: out of restarts, or a restart that did not
        bring the rendezvous back within the deadline."""
        self.gone_quietly()
        exhausted = self.book.exhausted()
        if exhausted is not None:
            return exhausted
        late = self.book.waiting(self._now_s(), self.restart_deadline_s)
        if late is not None:
            return late.node, (f"{late.reason}; the rendezvous did not re-form within "
                               f"{self.restart_deadline_s:g}s of it")
        return None

    def attempts(self) -> int:
        """Restarts of this attempt of the run so far (each incident counts once)."""
        return self.book.used

    def closed(self) -> None:
        """The open incident is over (every node was started again: a command's restart,
        which prints no rank line of launch's worker entry)."""
        self.book.close()

    def restarted(self) -> None:
        if self.watch is not None:
            self.watch.resume()

    def stop(self) -> dict[str, Any]:
        if self.watch is not None:
            self.watch.stop()
        return {
            "restarts": self.book.to_json(),
            "restarts_allowed": self.book.budget,
            "hang": self.hangs[-1] if self.hangs else None,
            "hangs": self.hangs,
            "resumed_from_step": self.book.started_from_step,
            "steps_lost_before_resume": self.book.started_steps_lost,
            "lost": self.lost,
        }
