"""What the terminal shows during a run: every node's lines, and on a TTY a live view under
them: the progress bar and one line per node (launcher/report/live.py) redrawn in place."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.report.live import NodeBoard
from launcher.runs.logs import Progress

_NODE_STYLES = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan",
                "bright_magenta"]


class PlainDisplay:
    """For pipes and CI logs: lines only; the trainer's step lines already carry progress."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def line(self, node: str, rank: str, text: str) -> None:
        self.stream.write(f"{node}/{rank}: {text}\n")
        self.stream.flush()

    def progress(self, progress: Progress) -> None:
        pass

    def message(self, text: str) -> None:
        self.stream.write(f"launch: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


def _live_progress(board: NodeBoard, styles: dict[str, str], *columns, **kwargs):
    """rich's Progress with the board's node lines under the bar, in one live region."""
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class LiveProgress(RichProgress):
        def get_renderables(self):
            if self.tasks:
                yield self.make_tasks_table(self.tasks)
            for row in board.rows():
                name = row.split(" ", 1)[0]
                yield Text(row, style=styles.get(name, ""), no_wrap=True, overflow="ellipsis")

    return LiveProgress(*columns, **kwargs)


class RichDisplay:
    """For a terminal: coloured node prefixes, and under the lines a live bar with step, loss
    and images/s and one line per node (step rate, loss, communication share, straggler)."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

        self.console = Console(highlight=False)
        self._styles: dict[str, str] = {}
        self.board = NodeBoard()
        self._bar = _live_progress(
            self.board, self._styles,
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"), BarColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[ips]} img/s"),
            TimeRemainingColumn(), console=self.console, transient=True,
        )
        self._started = False
        self._task = None

    def _style(self, node: str) -> str:
        return self._styles.setdefault(node, _NODE_STYLES[len(self._styles) % len(_NODE_STYLES)])

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._bar.start()

    def line(self, node: str, rank: str, text: str) -> None:
        from rich.text import Text

        self._style(node)
        if self.board.line(node, text):
            self._start()
            return  # a per-node line: the board shows it in place
        out = Text(f"{node}/{rank}: ", style=self._style(node))
        out.append(text)
        self.console.print(out, soft_wrap=True)
        self._start()

    def progress(self, progress: Progress) -> None:
        fields = {"loss": f"{progress.loss:.4f}", "ips": f"{progress.images_per_sec:.1f}"}
        self._start()
        if self._task is None:
            self._task = self._bar.add_task("train", total=progress.total, **fields)
        self._bar.update(self._task, completed=progress.step, total=progress.total, **fields)

    def message(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"launch: {text}", style="bold"), soft_wrap=True)

    def close(self) -> None:
        if self._started:
            self._bar.stop()


def make_display(stream: TextIO | None = None):
    stream = stream or sys.stdout
    return RichDisplay() if stream.isatty() else PlainDisplay(stream)
