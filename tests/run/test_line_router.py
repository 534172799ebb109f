"""What launch says when a node's lines reach its log but not the terminal: the terminal fell
behind (a flood), or the node was muted while launch stopped it. The messages name the log
file by its path (they once named it by its file descriptor: "all of them in 5")."""

from __future__ import annotations

import io
import tempfile
import threading
from pathlib import Path

from launcher.report.display import PlainDisplay
from launcher.runs.logs import LineRouter, failure_excerpt


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


DATA = Path(__file__).parent / "data" / "torchrun"


def route(lines: list[str], head: str | None = None) -> tuple[LineRouter, io.StringIO, Path]:
    log = Path(tempfile.mkdtemp()) / "run" / "node1" / "node.log"
    terminal = io.StringIO()
    router = LineRouter({"node1": log}, PlainDisplay(terminal), head=head)
    for line in lines:
        router.line("node1", line)
    return router, terminal, log


def test_the_exception_leads_the_excerpt_when_torchrun_printed_it_before_the_lines_before_it():
    """torchrun tails a rank's stdout and stderr apart: here its traceback came out before the
    30 lines printed earlier (tests/run/data/torchrun/SOURCES.md). The excerpt once took the
    last 25 lines from the traceback on: the 30 lines, without the AssertionError."""
    router, terminal, log = route((DATA / "misordered-assert.txt").read_text().splitlines())
    excerpt = failure_excerpt(router.tail("node1", 200), errors=router.errors("node1"))
    router.close()
    assert excerpt[0] == "node1/0: Traceback (most recent call last):"
    assert "node1/0: AssertionError: train.bin has 0 tokens" in excerpt
    assert not any("step 29" in line for line in excerpt)
    # torchrun's root cause names the rank and its exit, its noise stays out.
    assert excerpt[-2:] == ["node1/agent:   rank      : 0 (local_rank: 0)",
                            "node1/agent:   exitcode  : 1 (pid: 1988) "]
    # The same from the lines alone (a caller without the router's record).
    assert failure_excerpt(router.tail("node1", 200))[:5] == excerpt[:5]


def test_torchrun_s_failure_report_goes_to_the_log_only():
    router, terminal, log = route((DATA / "misordered-assert.txt").read_text().splitlines())
    router.close()
    shown = terminal.getvalue()
    assert "ChildFailedError" not in shown and "Root Cause" not in shown
    assert "run.py" not in shown and "=====" not in shown
    # The rank's own traceback and torchrun's one-line failure stay on screen ...
    assert "node1/0: AssertionError: train.bin has 0 tokens" in shown
    assert "failed (exitcode: 1) local_rank: 0 (pid: 1988)" in shown
    # ... and the log has every line.
    assert len(log.read_text().splitlines()) == len(
        (DATA / "misordered-assert.txt").read_text().splitlines())
    assert "ChildFailedError" in log.read_text()


def test_an_agent_traceback_of_another_error_is_shown():
    lines = ["Traceback (most recent call last):", '  File "run.py", line 3, in <module>',
             "torch.distributed.DistStoreError: Timed out after 61 seconds waiting for clients",
             "after"]
    router, terminal, _ = route(lines)
    router.close()
    assert terminal.getvalue().splitlines() == [f"node1/agent: {line}" for line in lines]


def test_an_exception_stays_known_after_a_flood_of_later_lines():
    """A rank raised, then its node's other rank printed on (300 lines): the tail of 200 lines
    lost the exception, the record of each rank's last exception did not."""
    lines = ["[default1]:step 1", "[default1]:Traceback (most recent call last):",
             '[default1]:  File "train.py", line 9, in <module>',
             "[default1]:    assert ok",
             "[default1]:AssertionError: rank 1 saw a NaN",
             *(f"[default0]:still talking {i}" for i in range(300))]
    router, _, _ = route(lines)
    excerpt = failure_excerpt(router.tail("node1", 200), errors=router.errors("node1"))
    router.close()
    assert excerpt == ["node1/1: Traceback (most recent call last):",
                       'node1/1:   File "train.py", line 9, in <module>',
                       "node1/1:     assert ok",
                       "node1/1: AssertionError: rank 1 saw a NaN"]


def test_the_rank_torchrun_names_wins_over_a_peer_that_only_lost_it():
    lines = ["[default0]:Traceback (most recent call last):",
             '[default0]:  File "train.py", line 20, in step',
             "[default0]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
             "Connection closed by peer [127.0.0.1]:1234",
             "[default1]:Traceback (most recent call last):",
             '[default1]:  File "train.py", line 9, in <module>',
             "[default1]:ValueError: bad batch",
             "E1202 18:37:43.050000 22982 torch/distributed/elastic/multiprocessing/api.py:1002]"
             " failed (exitcode: 1) local_rank: 1 (pid: 23453) of binary: /usr/bin/python"]
    router, _, _ = route(lines)
    excerpt = failure_excerpt(router.tail("node1", 200), errors=router.errors("node1"))
    router.close()
    assert excerpt[-1] == "node1/1: ValueError: bad batch"
    assert not any("Connection closed" in line for line in excerpt)


def test_a_long_traceback_keeps_its_start_and_its_end():
    frames = [f'[default0]:  File "lib.py", line {i}, in f{i}' for i in range(60)]
    lines = ["[default0]:Traceback (most recent call last):", *frames,
             "[default0]:KeyError: 'lr'"]
    router, _, _ = route(lines)
    excerpt = failure_excerpt(router.tail("node1", 200), errors=router.errors("node1"))
    router.close()
    assert len(excerpt) == 25
    assert excerpt[0].endswith("Traceback (most recent call last):")
    assert "line(s) of frames, all in the node's log" in excerpt[1]
    assert excerpt[-1] == "node1/0: KeyError: 'lr'"


def test_step_lines_of_ranks_other_than_the_head_s_rank_0_stay_in_the_log(tmp_path):
    logs = {n: tmp_path / "run" / n / "node.log" for n in ("node0", "node1")}
    terminal = io.StringIO()
    router = LineRouter(logs, PlainDisplay(terminal), head="node0")
    for node in ("node0", "node1"):
        for rank in (0, 1):
            router.line(node, f"[default{rank}]:LAUNCH_STEP step=1 loss=0.5")
            router.line(node, f"[default{rank}]:epoch done")
    router.close()
    shown = terminal.getvalue().splitlines()
    assert [s for s in shown if "LAUNCH_STEP" in s] == ["node0/0: LAUNCH_STEP step=1 loss=0.5"]
    assert sum("epoch done" in s for s in shown) == 4
    assert logs["node1"].read_text().count("LAUNCH_STEP") == 2


def test_a_traceback_torch_distributed_prefixed_with_the_rank_is_found():
    """Once a rank's process group is up, torch.distributed prints its uncaught exception as
    `[rank1]: Traceback ...` (tests/run/data/torchrun/SOURCES.md): the excerpt showed the 20
    lines printed before it instead."""
    lines = (DATA / "rank-prefixed-node.log").read_text().splitlines()
    excerpt = failure_excerpt(lines)
    assert excerpt[0] == "node1/0: [rank1]: Traceback (most recent call last):"
    assert excerpt[4] == "node1/0: [rank1]: AssertionError: rank 1 crashes once, at step 3"
    assert excerpt[5:] == ["node1/agent:   rank      : 1 (local_rank: 0)",
                           "node1/agent:   exitcode  : 1 (pid: 19833) "]
