"""launch_node/node_probe.py `watch`, the hang watch's one process per node kept for the run
(launcher/execute/watch.py asks it for every rank's heartbeat or the run's processes): a line
asked, a line of JSON answered. Each backend brings its transport (an SSH exec channel, an srun
step's pipes); the framing and its bounds, and keeping one watcher per node (started at the
first look, replaced after a failed one), are here, once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from launcher.core.errors import LauncherError

# An answer is a few heartbeats or the run's processes on a node: kilobytes. A node cannot
# grow launch's memory without bound.
MAX_ANSWER = 4 << 20


class WatcherAnswers:
    """Splits what one node's watcher prints into answers, keeping what came after one."""

    def __init__(self, where: str):
        self.where = where     # "host1", "node2 (job 17)": named in every error
        self.buffer = b""

    def next(self, recv: Callable[[], bytes], why_ended: Callable[[], str]) -> Any:
        """The next answer; `recv` returns the next bytes (b"" at the end, or raises on a
        timeout), `why_ended` what the watcher said when it ended."""
        while b"\n" not in self.buffer:
            chunk = recv()
            if not chunk:
                raise LauncherError(f"the node watcher on {self.where} ended: {why_ended()}")
            self.buffer += chunk
            if len(self.buffer) > MAX_ANSWER:
                raise LauncherError(f"the node watcher on {self.where} answered more than "
                                    f"{MAX_ANSWER >> 20} MB")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise LauncherError(f"the node watcher on {self.where} answered something that "
                                f"is not JSON: {line[:200]!r}") from None


def last_line(err: bytes, status: int | None) -> str:
    """What a watcher that ended said last on stderr, and its exit status when known."""
    lines = err[-MAX_ANSWER:].decode(errors="replace").strip().splitlines()
    return (lines[-1] if lines else "no output") + (f" (exit {status})" if status is not None
                                                    else "")


class Watcher(Protocol):
    """A backend's watcher: its transport and the answers it frames with WatcherAnswers."""

    def alive(self) -> bool: ...

    def ask(self, what: str, timeout: float) -> Any: ...

    def close(self) -> None: ...


class KeptWatcher:
    """One node's watcher, started at the first look and kept for the run; one that died, or
    failed a look (it is closed then), is started again at the next. Looks may come from the
    hang watch's threads at once: one at a time."""

    def __init__(self, start: Callable[[], Watcher], clock: Callable[[], float] = time.monotonic):
        self._start = start
        self._watcher: Watcher | None = None
        self._lock = threading.Lock()
        self.clock = clock
        # When the look now waiting for the node's answer was asked (None: none waits), and
        # whether the node ever answered. A node is quiet while a look waits unanswered, not
        # merely since its last answer: the hang watch pauses (a restart, forensics) and, at
        # hundreds of nodes, goes round them slower than every 2 s, and neither is silence
        # (launcher/execute/recovery.py asks the node's fleet about a quiet node).
        self._asked_at: float | None = None
        self._answered = False

    def ask(self, what: str, timeout: float = 15) -> Any:
        with self._lock:
            self._asked_at = self.clock()
            try:
                if self._watcher is not None and not self._watcher.alive():
                    self._close()
                if self._watcher is None:
                    self._watcher = self._start()
                try:
                    answer = self._watcher.ask(what, timeout)
                except Exception:
                    self._close()
                    raise
                self._answered = True
                return answer
            finally:
                self._asked_at = None

    def quiet_s(self) -> float | None:
        """Seconds the look now waiting has gone unanswered; None while no look waits, or
        before the node's first answer (its watcher may still be starting)."""
        asked = self._asked_at
        return None if asked is None or not self._answered else self.clock() - asked

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
