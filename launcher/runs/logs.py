"""Routing node output: torchrun's per-rank prefixes to `node/local_rank`, node.log files,
the last lines of each node (for failure messages) and progress for the display."""

from __future__ import annotations

import queue
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from launcher.core.safefile import open_append

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


class LineSink:
    """A file-like sink for an output thread (fabric's) that hands `line` whole lines."""

    def __init__(self, line):
        self._line, self._partial = line, ""

    def write(self, data: str) -> None:
        self._partial += data
        *lines, self._partial = self._partial.split("\n")
        for text in lines:
            self._line(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""


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


DISPLAY_BACKLOG = 20_000   # lines the terminal may lag behind (a second or two of output)


class LineRouter:
    """Every line goes, as it arrives, to the node's log file, and the job's lines to `steps`
    (launcher/runs/progress.py); the terminal gets them from a thread of its own, through a queue
    of DISPLAY_BACKLOG lines. When a rank prints faster than the terminal shows (100 MB as
    fast as it can), the log still gets every line and the terminal skips what would put it
    more than the backlog behind, and says how many it skipped. Messages are never skipped.
    A node launch is stopping is muted: its lines (torchrun's tracebacks about the SIGTERM
    launch sent) go to its log only."""

    def __init__(self, logs: dict[str, Path], display: Display, keep: int = 200,
                 steps=None, backlog: int = DISPLAY_BACKLOG):
        self.display = display
        self.steps = steps
        self._files: dict[str, TextIO] = {}
        # Named by path in launch's messages: a file from os.fdopen is named by its descriptor.
        self._paths = {node: str(path) for node, path in logs.items()}
        for node, path in logs.items():
            # <run folder>/<node>/node.log (RunFolder.node_log): the node's folder and its log
            # may have been planted as links or FIFOs (a resumed run's folder): refused, never
            # followed or waited on.
            self._files[node] = open_append(path, within=path.parent.parent.parent)
        self._tail = {node: deque(maxlen=keep) for node in logs}
        self._muted: dict[str, int] = {}
        self._hidden_before: dict[str, int] = {}   # muted lines of earlier starts (restarts)
        self._skipped: dict[str, int] = {}         # lines the terminal could not keep up with
        self._lock = threading.Lock()
        self._shown: queue.Queue = queue.Queue(maxsize=backlog)
        self._shower = threading.Thread(target=self._show, name="display", daemon=True)
        self._shower.start()

    def line(self, node: str, raw: str, label: str | None = None) -> None:
        """One line of a node's output; `label` replaces the rank (e.g. "store")."""
        raw = raw.rstrip("\r\n")
        rank, text = (label, raw) if label else split_rank(raw)
        shown = f"{node}/{rank}: {text}"
        with self._lock:
            self._files[node].write(shown + "\n")
            self._tail[node].append(shown)
            if node in self._muted:
                self._muted[node] += 1
            else:
                try:
                    self._shown.put_nowait(("line", node, rank, text))
                except queue.Full:
                    self._skipped[node] = self._skipped.get(node, 0) + 1
        if self.steps is not None and label is None:
            # torchrun's own lines too: a job's command may start workers without --tee, whose
            # lines then carry no rank prefix.
            self.steps.line(node, rank, text)

    def message(self, text: str) -> None:
        """launch's own line, in order with the nodes' lines on the terminal."""
        self._shown.put(("message", text))

    def _show(self) -> None:
        while True:
            item = self._shown.get()
            if item is None:
                return
            if item[0] == "message":
                self.display.message(item[1])
                continue
            _, node, rank, text = item
            self.display.line(node, rank, text)
            progress = parse_progress(text)
            if progress:
                self.display.progress(progress)
            if self._shown.empty():
                with self._lock:
                    skipped, self._skipped = self._skipped, {}
                if skipped:
                    self.display.message(
                        "the terminal could not keep up: " + ", ".join(
                            f"{c} line(s) of {n} not shown here (all of them in "
                            f"{self._paths[n]})" for n, c in skipped.items()))

    def mute(self, node: str) -> None:
        """From now on the node's lines go to its log only."""
        with self._lock:
            self._muted.setdefault(node, 0)

    def unmute(self, node: str) -> None:
        """The node starts again (a restart): its lines are news again."""
        with self._lock:
            hidden = self._muted.pop(node, 0)
            if hidden:
                self._hidden_before[node] = self._hidden_before.get(node, 0) + hidden

    def tail(self, node: str, count: int = 20) -> list[str]:
        return list(self._tail[node])[-count:]

    def close(self) -> None:
        """Every queued line shown, the skipped ones counted, the logs closed."""
        with self._lock:
            hidden = dict(self._hidden_before)
            for n, c in self._muted.items():
                hidden[n] = hidden.get(n, 0) + c
            hidden = {n: c for n, c in hidden.items() if c}
        if hidden:
            self.message("lines printed while launch stopped the nodes are in their logs only: "
                         + ", ".join(f"{n} {c} line(s) ({self._paths[n]})"
                                     for n, c in hidden.items()))
        self._shown.put(None)
        self._shower.join()
        for f in self._files.values():
            f.close()
