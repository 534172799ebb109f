"""Watching a run's progress: every rank's heartbeat (launch_node/heartbeat.py), read on every node,
and the time since any of them last changed.

A step completes on every rank or on none (each step ends in a gradient all-reduce), so when
one rank stops (a stopped process, a wedged GPU, a rank stuck outside the collective), no
heartbeat changes anywhere. After the hang timeout the watch hands the nodes to forensics
(launcher/execute/forensics.py) and reports what it found to the supervisor.

The clock is launch's own (monotonic, when launch saw a change), never the nodes' clocks,
which need not agree with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

HANG_FLOOR_S = 300.0     # the default timeout is never shorter (a slow first step, an eval)
HANG_STEP_FACTOR = 20.0  # ... and otherwise 20x the median step after warm-up
# A user's job that reports no steps: its silences are of unknown length (a long evaluation,
# a download), so the default waits longer before calling it hung.
USER_HANG_FLOOR_S = 900.0
# A process using at least this share of one core between two looks is computing: a job that
# computes silently is not hung. A rank asleep in a loop, or blocked in a collective waiting
# for one, uses almost none (NCCL busy-polls on GPUs: there its own watchdog is the backstop).
CPU_BUSY = 0.10


class Watched(Protocol):
    """What a backend's node process offers for the hang watch (both run
    launch_node/node_probe.py on the node, with the node's interpreter)."""

    name: str

    def heartbeats(self) -> list[dict[str, Any]]: ...
    def activity(self) -> dict[str, Any]: ...
    def dump_ranks(self, timeout: float) -> dict[str, Any]: ...
    def kill_ranks(self, pids: list[int]) -> dict[str, Any]: ...


class ProgressClock:
    """When launch last saw a rank make progress, and whether that is too long ago.

    Armed when a rank, seen before, reports it is ready to train or has trained on: not by
    heartbeat files seen once (left by an earlier attempt, a resumed run), nor by processes
    still joining the rendezvous and loading data (phase `setup`; the rendezvous has its own
    timeout). A restart disarms it until the new processes are ready."""

    def __init__(self, timeout_s: float | None, now: float):
        self.timeout_s = timeout_s
        self.last_change = now
        self.armed = False
        self.median_step_s: float | None = None
        self.finished = False   # a rank has written its result: training is over
        self._seen: dict[tuple[str, Any], tuple] = {}
        self._before_restart: set[Any] = set()   # pids of processes a restart replaces
        self._phase: dict[tuple[str, Any], Any] = {}

    def observe(self, beats: dict[str, list[dict[str, Any]]], now: float) -> None:
        for node, records in beats.items():
            for record in records:
                key = (node, record.get("local_rank"))
                mark = (record.get("pid"), record.get("step"), record.get("phase"))
                if key in self._seen and self._seen[key] != mark:
                    self.last_change = now
                    # A process the restart replaces may still finish a step: not the new
                    # ones being ready.
                    if record.get("phase") != "setup" and mark[0] not in self._before_restart:
                        self.armed = True
                    if record.get("phase") == "done":
                        self.finished = True
                self._seen[key] = mark
                self._phase[key] = record.get("phase")
                median = record.get("median_step_s")
                if isinstance(median, (int, float)) and median > 0:
                    self.median_step_s = max(self.median_step_s or 0.0, float(median))

    def threshold(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return max(HANG_FLOOR_S, HANG_STEP_FACTOR * (self.median_step_s or 0.0))

    def idle_for(self, now: float) -> float:
        return now - self.last_change

    def stalled(self, now: float) -> bool:
        """No change for the timeout, and not because every rank is done (their agents are
        on their way out; a rank still evaluating while the others are done is a hang)."""
        every_rank_done = bool(self._phase) and all(p == "done" for p in self._phase.values())
        return self.armed and not every_rank_done and self.idle_for(now) >= self.threshold()

    def restart(self, now: float) -> None:
        """After a restart: watched again once the new processes are ready."""
        self.last_change, self.armed = now, False
        self._before_restart |= {mark[0] for mark in self._seen.values()}


class ActivityClock:
    """A user's job, which writes no heartbeat: progress is a new line of a worker's output,
    a LAUNCH_STEP line (launcher/runs/progress.py), or a job process that used CPU since the last
    look (launch_node/node_probe.py activity). Armed once the job's processes run (torchrun's
    workers: the rendezvous has its own timeout); a restart disarms it until new ones run."""

    def __init__(self, timeout_s: float | None, now: float, steps):
        self.timeout_s = timeout_s
        self.last_change = now
        self.armed = False
        self.finished = False
        self.steps = steps
        self._output = steps.last_output if steps is not None else None
        self._cpu: dict[tuple[str, int], tuple[int, float]] = {}
        self._before_restart: set[tuple[str, int]] = set()

    @property
    def median_step_s(self) -> float | None:
        return self.steps.median_step_s() if self.steps is not None else None

    def observe(self, activity: dict[str, dict[str, Any]], now: float) -> None:
        progressed = False
        output = self.steps.last_output if self.steps is not None else None
        if output is not None and output != self._output:
            self._output, progressed = output, True
        for node, answer in activity.items():
            per_s = float(answer.get("ticks_per_s") or 100)
            for proc in answer.get("procs", []):
                if proc.get("agent"):
                    continue
                key = (node, int(proc["pid"]))
                if key not in self._before_restart and (proc.get("rank") is not None
                                                        or not any(p.get("agent") for p in
                                                                   answer["procs"])):
                    self.armed = True
                ticks = int(proc.get("cpu_ticks") or 0)
                before = self._cpu.get(key)
                self._cpu[key] = (ticks, now)
                if before is not None and now > before[1] and \
                        (ticks - before[0]) / per_s / (now - before[1]) >= CPU_BUSY:
                    progressed = True
        if progressed:
            self.last_change = now

    def threshold(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        median = self.median_step_s
        if median:
            return max(HANG_FLOOR_S, HANG_STEP_FACTOR * median)
        return USER_HANG_FLOOR_S

    def idle_for(self, now: float) -> float:
        return now - self.last_change

    def stalled(self, now: float) -> bool:
        return self.armed and self.idle_for(now) >= self.threshold()

    def restart(self, now: float) -> None:
        self.last_change, self.armed = now, False
        self._before_restart |= set(self._cpu)


def poll_interval(clock: ProgressClock | ActivityClock) -> float:
    """Often enough to notice within a tenth of the timeout; at most every 2 s (an SSH node
    is asked over its connection each time), at least every 0.5 s."""
    return min(2.0, max(0.5, clock.threshold() / 10.0))


class HangWatch:
    """A thread that reads heartbeats, and on a hang runs `investigate` (forensics) once and
    hands its result to the supervisor through `take()`. Paused while the supervisor acts on
    it; `resume()` starts a new watch (after a restart)."""

    def __init__(self, procs: list[Watched], timeout_s: float | None,
                 investigate: Callable[[list[Watched], float, float], Any],
                 clock: Callable[[], float] = time.monotonic, steps=None,
                 user_job: bool = False):
        self.procs = procs
        self.now = clock
        self.user_job = user_job
        self.clock: ProgressClock | ActivityClock = (
            ActivityClock(timeout_s, clock(), steps) if user_job
            else ProgressClock(timeout_s, clock()))
        self.investigate = investigate
        self._found: Any = None
        self._paused = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hang-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def finished(self) -> bool:
        """Whether some rank has finished training (its agent's peers are leaving: a
        restarted agent would find the rendezvous closed)."""
        with self._lock:
            return self.clock.finished

    def take(self) -> Any:
        with self._lock:
            found, self._found = self._found, None
            return found

    def resume(self) -> None:
        with self._lock:
            self.clock.restart(self.now())
            self._paused = False

    def _read(self) -> dict[str, Any]:
        """Every node at once (over SSH each answer is a remote command)."""
        def ask(proc: Watched) -> Any:
            try:
                return proc.activity() if self.user_job else proc.heartbeats()
            except Exception:  # noqa: BLE001 (a node that cannot be asked shows no progress)
                return None

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(self.procs)))) as pool:
            answers = list(pool.map(ask, self.procs))
        return {p.name: a for p, a in zip(self.procs, answers) if a is not None}

    def _run(self) -> None:
        while not self._stop.wait(poll_interval(self.clock)):
            with self._lock:
                if self._paused:
                    continue
            beats = self._read()
            now = self.now()
            with self._lock:
                self.clock.observe(beats, now)
                if not self.clock.stalled(now):
                    continue
                self._paused = True
                idle, threshold = self.clock.idle_for(now), self.clock.threshold()
            found = self.investigate(self.procs, idle, threshold)
            with self._lock:
                self._found = found
