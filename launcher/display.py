"""What the terminal shows during a run: every node's lines, and a progress line on a TTY."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.logs import Progress

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


class RichDisplay:
    """For a terminal: coloured node prefixes and a live bar with step, loss and images/s."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(highlight=False)
        self._styles: dict[str, str] = {}
        self._bar = Progress(
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"), BarColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[ips]} img/s"),
            TimeRemainingColumn(), console=self.console, transient=True,
        )
        self._task = None

    def _style(self, node: str) -> str:
        return self._styles.setdefault(node, _NODE_STYLES[len(self._styles) % len(_NODE_STYLES)])

    def line(self, node: str, rank: str, text: str) -> None:
        from rich.text import Text

        out = Text(f"{node}/{rank}: ", style=self._style(node))
        out.append(text)
        self.console.print(out, soft_wrap=True)

    def progress(self, progress: Progress) -> None:
        fields = {"loss": f"{progress.loss:.4f}", "ips": f"{progress.images_per_sec:.1f}"}
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("train", total=progress.total, **fields)
        self._bar.update(self._task, completed=progress.step, total=progress.total, **fields)

    def message(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(f"launch: {text}", style="bold"), soft_wrap=True)

    def close(self) -> None:
        if self._task is not None:
            self._bar.stop()


def make_display(stream: TextIO | None = None):
    stream = stream or sys.stdout
    return RichDisplay() if stream.isatty() else PlainDisplay(stream)
