"""The answers of launch_node/node_probe.py `watch`, the hang watch's one process per node kept
for the run (launcher/execute/watch.py asks it for every rank's heartbeat or the run's
processes): a line asked, a line of JSON answered. Each backend brings its transport (an SSH
exec channel, an srun step's pipes); the framing and its bounds are here, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

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
