"""Routing node output: torchrun's per-rank prefixes to `node/local_rank`, node.log files,
the last lines of each node (for failure messages) and progress for the display."""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from launcher.safefile import open_append

# torchrun --tee prefixes worker lines with "[<role><local_rank>]:" (role is "default").
_TEE_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+?)(?P<rank>\d+)\]:(?P<text>.*)$")
# train/main.py rank 0: "step 20/330 epoch 0 loss 1.2345 lr ... step_time 0.120s 534.6 img/s"
_PROGRESS = re.compile(
    r"^step (?P<step>\d+)/(?P<total>\d+) .*?loss (?P<loss>[-+0-9.eEinfna]+) .*?"
    r"(?P<ips>[0-9.]+) img/s"
)
AGENT = "agent"  # lines torchrun itself prints, not one of its workers


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    loss: float
    images_per_sec: float


def split_rank(line: str) -> tuple[str, str]:
    """('0', 'text') for a worker line, ('agent', line) for torchrun's own lines."""
    m = _TEE_PREFIX.match(line)
    if m:
        return m.group("rank"), m.group("text")
    return AGENT, line


def failure_excerpt(lines: list[str], limit: int = 25) -> list[str]:
    """What a person needs from a failed node's last lines ("node/rank: text"): the worker's
    own error first (its last traceback, else its last lines), then torchrun's root-cause
    lines. torchrun's ~20-line failure footer used to push the worker's FileNotFoundError out
    of the lines shown."""
    worker = [line for line in lines if not line.split(": ", 1)[0].endswith("/" + AGENT)]
    agent = [line for line in lines if line.split(": ", 1)[0].endswith("/" + AGENT)]
    start = max((i for i, line in enumerate(worker)
                 if "Traceback (most recent call last)" in line), default=None)
    mine = worker[start:] if start is not None else worker
    mine = mine[-limit:]
    cause = [line for line in agent if re.search(r"\b(exitcode|traceback|error_file)\s*:", line)]
    picked = mine + [line for line in cause[-3:] if line not in mine]
    return picked or lines[-limit:]


def parse_progress(text: str) -> Progress | None:
    m = _PROGRESS.match(text.strip())
    if not m:
        return None
    try:
        return Progress(int(m["step"]), int(m["total"]), float(m["loss"]), float(m["ips"]))
    except ValueError:
        return None


class Display(Protocol):
    def line(self, node: str, rank: str, text: str) -> None: ...
    def progress(self, progress: Progress) -> None: ...
    def message(self, text: str) -> None: ...
    def close(self) -> None: ...


class LineRouter:
    """Every line goes, as it arrives, to the node's log file and to the display."""

    def __init__(self, logs: dict[str, Path], display: Display, keep: int = 200):
        self.display = display
        self._files: dict[str, TextIO] = {}
        for node, path in logs.items():
            # <run folder>/<node>/node.log (RunFolder.node_log): the node's folder and its log
            # may have been planted as links or FIFOs (a resumed run's folder): refused, never
            # followed or waited on.
            self._files[node] = open_append(path, within=path.parent.parent.parent)
        self._tail = {node: deque(maxlen=keep) for node in logs}
        self._lock = threading.Lock()

    def line(self, node: str, raw: str, label: str | None = None) -> None:
        """One line of a node's output; `label` replaces the rank (e.g. "store")."""
        raw = raw.rstrip("\r\n")
        rank, text = (label, raw) if label else split_rank(raw)
        shown = f"{node}/{rank}: {text}"
        with self._lock:
            self._files[node].write(shown + "\n")
            self._tail[node].append(shown)
            self.display.line(node, rank, text)
            progress = parse_progress(text)
            if progress:
                self.display.progress(progress)

    def tail(self, node: str, count: int = 20) -> list[str]:
        return list(self._tail[node])[-count:]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
