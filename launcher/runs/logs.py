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
from launcher.runs.screen import ScreenFilter

# torchrun --tee prefixes worker lines with "[<role><local_rank>]:" (role is "default").
_TEE_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+?)(?P<rank>\d+)\]:(?P<text>.*)$")
# train/main.py rank 0: "step 20/330 epoch 0 loss 1.2345 lr ... step_time 0.120s 534.6 img/s"
_PROGRESS = re.compile(
    r"^step (?P<step>\d+)/(?P<total>\d+) .*?loss (?P<loss>[-+0-9.eEinfna]+) .*?"
    r"(?P<ips>[0-9.]+) img/s"
)
AGENT = "agent"  # lines torchrun itself prints, not one of its workers
STEP_PREFIX = "LAUNCH_STEP"   # a job's step line (launcher/runs/progress.py)


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


TRACEBACK_START = "Traceback (most recent call last):"
# Lines kept after a traceback's exception line: a message of several lines, the chained
# exception's notes; the rank's later lines are in its log.
_AFTER_EXCEPTION = 8
# torchrun's own words for the first worker that failed (its agent, the ChildFailedError
# report): "failed (exitcode: 1) local_rank: 1 (pid: 123) of binary: ..." and
# "rank      : 1 (local_rank: 0)" / "exitcode  : -9 (pid: 123)".
_FAILED_WORKER = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+) "
                            r"\(pid: (?P<pid>\d+)\)")
_ROOT_CAUSE = re.compile(r"^\s*(rank|exitcode)\s*:\s")
# A rank that failed because a peer went away: a victim (launcher/execute/supervisor.py keeps
# the same words for blame).
_PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker "
                        r"crash|DistNetworkError|Broken pipe|failed to recv, got 0 bytes",
                        re.IGNORECASE)


_AGENT_OWN = re.compile(r"ChildFailedError|SignalException")
# torch.distributed prefixes what a rank prints of an uncaught exception once its process group
# is up: "[rank1]: Traceback (most recent call last):".
_RANK_TAG = re.compile(r"^\[rank\d+\]: ?")


class Tracebacks:
    """The last exception each rank printed, kept as its lines arrive, so that a flood of
    later output (the rank's own, its node's other ranks', torchrun's report) cannot push it
    out of what the failure message shows. A block is "Traceback (most recent call last):",
    its indented frames, the exception line and up to _AFTER_EXCEPTION lines after it; a rank
    that raises again replaces it. Relies on each rank's lines arriving in the order printed
    (launch_node/worker.py gives a rank one output stream)."""

    def __init__(self):
        self._open: dict[str, list[str]] = {}     # rank -> block being read
        self._after: dict[str, int] = {}          # rank -> lines taken after the exception
        self._last: dict[str, list[str]] = {}     # rank -> its last complete block
        self.order: list[str] = []                # ranks by the arrival of their last block

    def line(self, rank: str, shown: str, text: str) -> None:
        text = _RANK_TAG.sub("", text, count=1)
        if text.startswith(TRACEBACK_START):
            self._open[rank] = [shown]
            self._after.pop(rank, None)
            return
        block = self._open.get(rank)
        if block is None:
            return
        if rank not in self._after:
            block.append(shown)
            if text and not text[0].isspace():       # the exception line
                self._after[rank] = 0
                self._last[rank] = block
                if rank in self.order:
                    self.order.remove(rank)
                self.order.append(rank)
            elif len(block) > 2000:                  # no exception line ever came
                del self._open[rank]
            return
        if self._after[rank] < _AFTER_EXCEPTION:
            block.append(shown)
            self._after[rank] += 1
        else:
            del self._open[rank]
            del self._after[rank]

    def in_block(self, rank: str) -> bool:
        """Whether the rank's last line was part of a traceback (a frame, the exception, the
        lines kept after it)."""
        return rank in self._open

    def last(self) -> dict[str, list[str]]:
        """rank -> its last exception's lines, in the order they arrived."""
        return {rank: list(self._last[rank]) for rank in self.order}


def _exception_line(block: list[str]) -> str:
    for line in block[1:]:
        text = _RANK_TAG.sub("", line.split(": ", 1)[1] if ": " in line else line, count=1)
        if text and not text[0].isspace():
            return text
    return ""


def _trimmed(block: list[str], limit: int) -> list[str]:
    """A traceback of at most `limit` lines: its first line, then its last frames and the
    exception (the frames between are in the log)."""
    if len(block) <= limit:
        return block
    prefix = block[0].split(": ", 1)[0]
    keep = limit - 2
    return [block[0], f"{prefix}:   ... {len(block) - 1 - keep} line(s) of frames, all in "
                      "the node's log ...", *block[-keep:]]


def failure_excerpt(lines: list[str], limit: int = 25,
                    errors: dict[str, list[str]] | None = None) -> list[str]:
    """What a person needs from a failed node's last lines ("node/rank: text"): first the
    exception the failing rank raised (`errors`: each rank's last traceback, as Tracebacks
    kept it; else the last one in `lines`), else that rank's last lines; then the lines of
    torchrun's report that name the rank and its exit. torchrun's ~30-line failure footer,
    and a rank that printed much after failing, used to push the exception out of the lines
    shown."""
    worker = [line for line in lines if not line.split(": ", 1)[0].endswith("/" + AGENT)]
    agent = [line for line in lines if line.split(": ", 1)[0].endswith("/" + AGENT)]
    if errors is None:
        keeper = Tracebacks()
        for line in worker:
            label, _, text = line.partition(": ")
            keeper.line(label, line, text)
        errors = keeper.last()
    failed = [m["rank"] for line in agent for m in [_FAILED_WORKER.search(line)] if m]
    # The rank torchrun names first, else the first rank whose exception is its own (not a
    # lost peer), else the first with any.
    # torchrun's own exceptions (its failure report, the SIGTERM launch sent it) retell the
    # ranks' story: not the cause.
    ranks = [r for r in errors if not _AGENT_OWN.search(_exception_line(errors[r]))]
    own = [r for r in ranks if not _PEER_LOST.search(_exception_line(errors[r]))]
    named = [r for r in ranks if r.rsplit("/", 1)[-1] in failed[:1]]
    pick = (named or own or ranks or [None])[0]
    cause = [line for line in agent if _ROOT_CAUSE.search(line.split(": ", 1)[-1])][-2:]
    if pick is not None:
        mine = _trimmed(errors[pick], limit)
    else:
        # No traceback: a SystemExit's message, a crash, a sys.exit(1) after an error message
        # of its own: the rank's last lines, the failing rank's when torchrun named it.
        prefixes = {line.split(": ", 1)[0] for line in worker}
        who = [p for p in prefixes if failed and p.endswith("/" + failed[0])]
        mine = [line for line in worker if not who or line.split(": ", 1)[0] == who[0]]
        mine = mine[-limit:]
    picked = mine + [line for line in cause if line not in mine]
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


class AgentReport:
    """torchrun's report of a failed worker group, as its agent prints it: its own traceback
    ending in ChildFailedError, then a block between two lines of "=" (~30 lines per failing
    node). It says again what the rank's own traceback said, so it goes to the node's log
    only; the failure message keeps its root-cause lines. An agent traceback that turns out
    to be another error is shown whole, late by its own length."""

    MAX_HELD = 400

    def __init__(self):
        self._held: list[tuple[str, str]] | None = None   # (rank, text) of an open traceback
        self._rules = 0                                    # "=" lines seen in the report

    def line(self, rank: str, text: str) -> list[tuple[str, str]]:
        """What to show now of this line (and of the lines held before it)."""
        if rank != AGENT:
            return [(rank, text)]
        if self._rules:
            if text.startswith("====="):
                self._rules += 1
                if self._rules > 2:
                    self._rules = 0
            return []
        if self._held is None:
            if text.startswith(TRACEBACK_START):
                self._held = [(rank, text)]
                return []
            return [(rank, text)]
        if "ChildFailedError" in text:
            self._held, self._rules = None, 1
            return []
        self._held.append((rank, text))
        if (text and not text[0].isspace()) or len(self._held) > self.MAX_HELD:
            shown, self._held = self._held, None    # another error: shown after all
            return shown
        return []

    def flush(self) -> list[tuple[str, str]]:
        shown, self._held = self._held or [], None
        return shown


class LineRouter:
    """Every line goes, as it arrives, to the node's log file, and the job's lines to `steps`
    (launcher/runs/progress.py); the terminal gets them from a thread of its own, through a queue
    of DISPLAY_BACKLOG lines. When a rank prints faster than the terminal shows (100 MB as
    fast as it can), the log still gets every line and the terminal skips what would put it
    more than the backlog behind, and says how many it skipped. Messages are never skipped.
    A node launch is stopping is muted: its lines (torchrun's tracebacks about the SIGTERM
    launch sent) go to its log only.

    Also log only: torchrun's ChildFailedError report (AgentReport), and, given the `head`
    node, the LAUNCH_STEP lines of every rank but the head's local rank 0 (the live view and
    progress.jsonl follow that rank; 8 ranks' step lines once buried everything else). Each
    rank's last exception is kept apart (Tracebacks) for the failure message.

    Given a `screen` (launcher/runs/screen.py: a run of many nodes), the terminal gets only the
    lines it lets through (the head's, the errors); the others are counted and said at the
    end."""

    def __init__(self, logs: dict[str, Path], display: Display, keep: int = 200,
                 steps=None, backlog: int = DISPLAY_BACKLOG, head: str | None = None,
                 screen: ScreenFilter | None = None, timeline=None):
        self.display = display
        self.steps = steps
        self.timeline = timeline   # the run's Timeline (launcher/runs/timeline.py): steps seen
        self._head = head
        self._screen = screen
        self._reports = {node: AgentReport() for node in logs}
        self._tracebacks = {node: Tracebacks() for node in logs}
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
        self._backlog = backlog
        # A display that keeps the lines the screen leaves out apart (a detached run's
        # console, launcher/runs/console.py) gets them too, marked as such.
        self._keeps_off = screen is not None and hasattr(display, "line_off")
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
            self._tracebacks[node].line(f"{node}/{rank}", shown, text)
            if node in self._muted:
                self._muted[node] += 1
            elif not self._log_only(node, rank, text):
                shown_now = self._reports[node].line(rank, text)
                # More than one: torchrun's held traceback, released as another error.
                if len(shown_now) > 1 or not shown_now or self._on_screen(node, rank, text):
                    for rank_shown, text_shown in shown_now:
                        self._show_line(node, rank_shown, text_shown)
                elif self._keeps_off:
                    self._keep_off(node, rank, text)
        if self.steps is not None and label is None:
            # torchrun's own lines too: a job's command may start workers without --tee, whose
            # lines then carry no rank prefix.
            self.steps.line(node, rank, text)
        if self.timeline is not None and label is None:
            self.timeline.line(node, rank, text)

    def _show_line(self, node: str, rank: str, text: str) -> None:
        try:
            self._shown.put_nowait(("line", node, rank, text))
        except queue.Full:
            self._skipped[node] = self._skipped.get(node, 0) + 1

    def _keep_off(self, node: str, rank: str, text: str) -> None:
        """A line the screen keeps off, to a display that keeps it apart (a detached run's
        console: `launch attach --all-lines` shows it). Only while the queue is less than half
        full: the lines the screen shows keep their room, and one a flood left out is still in
        the node's log."""
        if self._shown.qsize() < self._backlog // 2:
            try:
                self._shown.put_nowait(("off", node, rank, text))
            except queue.Full:
                pass

    def _on_screen(self, node: str, rank: str, text: str) -> bool:
        return self._screen is None or self._screen.shows(
            node, text, in_traceback=self._tracebacks[node].in_block(f"{node}/{rank}"),
            live_view=parse_progress(text) is not None)

    def _log_only(self, node: str, rank: str, text: str) -> bool:
        # A command's own launcher may print its ranks' lines unprefixed ("agent"): the
        # head's are shown.
        return (self._head is not None and text.startswith(STEP_PREFIX)
                and (node, rank) not in ((self._head, "0"), (self._head, AGENT)))

    def errors(self, node: str) -> dict[str, list[str]]:
        """Each rank's last exception on the node ("node/rank" -> its lines)."""
        with self._lock:
            return self._tracebacks[node].last()

    def message(self, text: str) -> None:
        """launch's own line, in order with the nodes' lines on the terminal."""
        self._shown.put(("message", text))

    def screen_message(self, text: str) -> None:
        """launch's line about the many-node screen itself (what it keeps off): a view of
        every line (`launch attach --all-lines`) leaves it out."""
        self._shown.put(("screen", text))

    def _show(self) -> None:
        while True:
            item = self._shown.get()
            if item is None:
                return
            if item[0] == "message":
                self.display.message(item[1])
                continue
            if item[0] == "screen":
                getattr(self.display, "screen_message", self.display.message)(item[1])
                continue
            if item[0] == "off":
                self.display.line_off(*item[1:])
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
            self._reports[node] = AgentReport()
            if hidden:
                self._hidden_before[node] = self._hidden_before.get(node, 0) + hidden

    def tail(self, node: str, count: int = 20) -> list[str]:
        return list(self._tail[node])[-count:]

    def close(self) -> None:
        """Every queued line shown, the skipped ones counted, the logs closed."""
        with self._lock:
            for node, report in self._reports.items():
                for rank, text in report.flush():
                    self._show_line(node, rank, text)
            hidden = dict(self._hidden_before)
            for n, c in self._muted.items():
                hidden[n] = hidden.get(n, 0) + c
            hidden = {n: c for n, c in hidden.items() if c}
            kept_off = self._screen.closing(self._paths) if self._screen is not None else None
        if hidden:
            self.message("lines printed while launch stopped the nodes are in their logs only: "
                         + ", ".join(f"{n} {c} line(s) ({self._paths[n]})"
                                     for n, c in hidden.items()))
        if kept_off:
            self.screen_message(kept_off)
        self._shown.put(None)
        self._shower.join()
        for f in self._files.values():
            f.close()
