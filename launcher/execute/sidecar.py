"""Processes launch runs beside the job on a node (the checkpoint mirror on the head, the spot
watcher on every spot node), and what their lines tell about the run.

A sidecar is a service of the run (started before the job, stopped after it) that never
fails it: it goes away with its node when the node is lost, and the job's own exit decides.
Its end while the job runs is said in the node's log, not acted on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from launcher.execute.supervisor import Outcome, describe_exit

# launch_node/spot.py's line: "spot: interruption notice: terminate at 2026-...; SIGUSR1 to ..."
NOTICE = re.compile(r"^spot: interruption notice: (?P<action>\S+) at (?P<time>\S+?);")
EXIT_PREEMPTED = 75   # EX_TEMPFAIL: the run may go on elsewhere (--resume, --recover)


class Sidecar:
    """A node process (the backend's own) as a non-essential service: `on_line` sees each of
    its lines; `drain_s`: how long its stop may take (stop_services waits that long)."""

    essential = False

    def __init__(self, proc: Any, what: str, on_line: Callable[[str, str], None] | None = None,
                 drain_s: float = 0.0):
        self.proc, self.what, self.on_line, self.drain_s = proc, what, on_line, drain_s
        self.name = proc.name
        self.label = getattr(proc, "label", None)
        self.stopping = False

    def start(self) -> None:
        self.proc.start()

    def lines(self) -> Iterator[str]:
        for line in self.proc.lines():
            if self.on_line is not None:
                self.on_line(self.name, line)
            yield line
        code = self.proc.poll()
        if code not in (0, None) and not self.stopping:
            yield f"[launch] the {self.what} on {self.name} {describe_exit(code)}"

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        self.stopping = True
        self.proc.signal(sig)


class Preemptions:
    """Interruption notices the spot watchers reported. A run that fails after one is
    "preempted", not "failed": it stopped because EC2 took a node back, and goes on from its
    last checkpoint (`--resume` once the node is back, `--recover` on a replacement)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.started = clock, clock()
        self.notices: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def line(self, node: str, text: str) -> None:
        match = NOTICE.match(text.strip())
        if match is None:
            return
        with self._lock:
            if node not in self.notices:   # the first notice is the one that counts
                self.notices[node] = {
                    "node": node, "action": match.group("action"), "time": match.group("time"),
                    "seen_at_s": round(self.clock() - self.started, 3)}

    def judge(self, outcome: Outcome) -> Outcome:
        """The outcome with its cause where launch knows more than an exit code: a node whose
        machine is gone, an interruption notice ("preempted")."""
        lost = outcome.recovery.get("lost") or {}
        if outcome.status == "failed" and outcome.first_failure in lost:
            outcome.reason = f"node {outcome.first_failure} was lost: " \
                             f"{lost[outcome.first_failure]}"
        with self._lock:
            notices = list(self.notices.values())
        if not notices:
            return outcome
        outcome.recovery["preemption"] = notices
        if outcome.status == "failed":
            first = next((n for n in notices if n["node"] == outcome.first_failure), notices[0])
            outcome.status = "preempted"
            outcome.reason = (f"node {first['node']} was taken back by EC2 (spot interruption "
                              f"notice: {first['action']} at {first['time']}; "
                              f"{outcome.reason})")
        return outcome
