"""What launch says when a node's lines reach its log but not the terminal: the terminal fell
behind (a flood), or the node was muted while launch stopped it. The messages name the log
file by its path (they once named it by its file descriptor: "all of them in 5")."""

from __future__ import annotations

import io
import threading

from launcher.report.display import PlainDisplay
from launcher.runs.logs import LineRouter


class HeldTerminal(io.StringIO):
    """A terminal that takes its first write only once released: the router's display thread
    is held there while lines keep coming."""

    def __init__(self):
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        if not self.writing.is_set():
            self.writing.set()
            self.release.wait(30)
        return super().write(text)


def test_lines_the_terminal_skipped_are_counted_and_their_log_named(tmp_path):
    log = tmp_path / "run" / "node0" / "node.log"
    terminal = HeldTerminal()
    router = LineRouter({"node0": log}, PlainDisplay(terminal), backlog=2)
    router.line("node0", "[default0]:line 0")
    assert terminal.writing.wait(30)   # the display thread is held in line 0's write
    for i in range(1, 10):             # lines 1 and 2 wait in the backlog, 3 to 9 are skipped
        router.line("node0", f"[default0]:line {i}")
    terminal.release.set()
    router.close()
    shown = terminal.getvalue()
    assert "node0/0: line 2\n" in shown and "line 3" not in shown
    assert (f"launch: the terminal could not keep up: 7 line(s) of node0 not shown here (all "
            f"of them in {log})") in shown
    assert log.read_text().splitlines() == [f"node0/0: line {i}" for i in range(10)]


def test_lines_of_a_muted_node_are_counted_and_their_log_named(tmp_path):
    log = tmp_path / "run" / "node1" / "node.log"
    terminal = io.StringIO()
    router = LineRouter({"node1": log}, PlainDisplay(terminal))
    router.mute("node1")
    router.line("node1", "[default0]:Traceback of the SIGTERM")
    router.close()
    assert ("launch: lines printed while launch stopped the nodes are in their logs only: "
            f"node1 1 line(s) ({log})") in terminal.getvalue()
    assert log.read_text() == "node1/0: Traceback of the SIGTERM\n"
