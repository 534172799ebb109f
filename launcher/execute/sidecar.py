"""Processes launch runs beside the job on a node (the checkpoint mirror on the head).

A sidecar is a service of the run (started before the job, stopped after it) that never
fails it: it goes away with its node when the node is lost, and the job's own exit decides.
Its end while the job runs is said in the node's log, not acted on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from launcher.execute.supervisor import describe_exit


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
