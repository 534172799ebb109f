"""A detached run's terminal, as a file: console.jsonl in the run folder, one JSON object a
line, written by the run's controller and replayed by `launch attach` onto the terminal it
runs in (the live view included), from any offset, as often as anyone attaches.

    {"k": "line", "node": N, "rank": R, "text": T}   a node's line, as the terminal shows it
        "off": true                                 ... one the many-node screen keeps off the
                                                    terminal (launcher/runs/screen.py): shown
                                                    by `launch attach --all-lines` only
    {"k": "msg", "text": T}                         launch's own line ("launch: ...")
        "screen": true                              ... about that screen: left out by
                                                    `launch attach --all-lines`
    {"k": "progress", "step", "total", "loss", "ips"}   the trainer's progress bar
    {"k": "out", "fd": 1|2, "text": T}              anything else the controller printed
    {"k": "end", "code": C, "status": S, "message": M}   the run is over: its exit code, and the
                                                    error message an attached run would end with

A reader keeps what it cannot parse out of the display (a line cut by a crash, a file from a
later launch): one bad line never ends the stream.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from launcher.runs.logs import Progress

CONSOLE = "console.jsonl"
MAX_EVENT = 1 << 20     # one line of a rank is never longer (LineRouter keeps node.log whole)


class ConsoleWriter:
    """Appends events; safe from the router's display thread and the pipeline's own."""

    def __init__(self, path: Path):
        from launcher.core.safefile import open_append

        self._file = open_append(path, within=path.parent.parent)
        self._lock = threading.Lock()

    def event(self, kind: str, **fields: Any) -> None:
        text = json.dumps({"k": kind, **fields}, ensure_ascii=False)
        with self._lock:
            self._file.write(text[:MAX_EVENT] + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class StreamDisplay:
    """The Display (launcher/runs/logs.py) of a controller: every call an event."""

    def __init__(self, writer: ConsoleWriter):
        self.writer = writer

    def line(self, node: str, rank: str, text: str) -> None:
        self.writer.event("line", node=node, rank=rank, text=text)

    def progress(self, progress: Progress) -> None:
        self.writer.event("progress", step=progress.step, total=progress.total,
                          loss=progress.loss, ips=progress.images_per_sec)

    def line_off(self, node: str, rank: str, text: str) -> None:
        self.writer.event("line", node=node, rank=rank, text=text, off=True)

    def message(self, text: str) -> None:
        self.writer.event("msg", text=text)

    def screen_message(self, text: str) -> None:
        self.writer.event("msg", text=text, screen=True)

    def close(self) -> None:
        pass


class StreamText:
    """sys.stdout / sys.stderr of a controller: what it prints, as `out` events by line."""

    def __init__(self, writer: ConsoleWriter, fd: int):
        self.writer, self.fd, self._partial = writer, fd, ""
        self._lock = threading.Lock()

    def write(self, data: str) -> int:
        with self._lock:
            self._partial += data
            *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self.writer.event("out", fd=self.fd, text=line)
        return len(data)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self.writer.event("out", fd=self.fd, text=rest)


class EventReader:
    """The events in a stream of bytes fed as it grows; a line that is not one is skipped."""

    def __init__(self):
        self._partial = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        out = []
        for raw in lines:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("k"), str):
                out.append(event)
        return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def replay(event: dict[str, Any], display, out: TextIO, err: TextIO,
           all_lines: bool = False) -> None:
    """One event onto this terminal's display: as the run's own terminal showed it, or with
    every line of a many-node run (`all_lines`) and without launch's words about what its
    screen kept off."""
    kind = event["k"]
    if (event.get("off") and not all_lines) or (event.get("screen") and all_lines):
        return
    if kind == "line":
        display.line(_text(event.get("node", "?")), _text(event.get("rank", "?")),
                     _text(event.get("text", "")))
    elif kind == "msg":
        display.message(_text(event.get("text", "")))
    elif kind == "progress":
        try:
            display.progress(Progress(int(event["step"]), int(event["total"]),
                                      float(event["loss"]), float(event["ips"])))
        except (KeyError, TypeError, ValueError):
            pass
    elif kind == "out":
        stream = err if event.get("fd") == 2 else out
        stream.write(_text(event.get("text", "")) + "\n")
        stream.flush()


def follow_file(path: Path, offset: int, done, poll: float = 0.2) -> Iterator[bytes]:
    """What is appended to a file from `offset` on, as it arrives, and b"" at every look that
    found nothing (so that a reader can act between them); ends once `done()` and all that was
    written is read (`done` is asked before the last read, so nothing is lost)."""
    while True:
        finished = done()
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read(1 << 20)
        except FileNotFoundError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        if finished:
            return
        yield b""
        time.sleep(poll)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
