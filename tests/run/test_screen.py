"""The terminal of a run with many nodes (issue 37): the head's lines, every error line and
launch's own messages reach it; every other line goes to its node's log only, and launch says so
at the start and, with counts per node, at the end. `--all-lines` shows them all again."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from launcher.report.display import PlainDisplay
from launcher.runs.console import CONSOLE, ConsoleWriter, EventReader, StreamDisplay, replay
from launcher.runs.logs import LineRouter, failure_excerpt
from launcher.runs.screen import (SCREEN_ALL_NODES_ENV, ScreenFilter, is_error_line,
                                  screen_filter_on)

DATA = Path(__file__).parent / "data" / "torchrun"


def raw(node_log_line: str) -> str:
    """A node.log line ("node1/0: text", "node1/agent: text") as the node printed it."""
    label, _, text = node_log_line.partition(": ")
    rank = label.split("/", 1)[1]
    return text if rank == "agent" else f"[default{rank}]:{text}"


def test_the_head_s_lines_and_every_error_reach_the_terminal_and_every_line_its_log(tmp_path):
    """Four nodes: the head prints steps, node1 is the recorded crash of a rank (40 lines,
    a traceback prefixed [rank1]:, torchrun's failure line and report), node2 and node3
    chatter. The terminal gets the head's lines, node1's traceback and torchrun's failure
    line, not the chatter; each node.log gets every line of its node."""
    names = ["node0", "node1", "node2", "node3"]
    logs = {n: tmp_path / "run" / n / "node.log" for n in names}
    streams = {
        "node0": [f"[default0]:head step {i}" for i in range(5)],
        "node1": [raw(line) for line in (DATA / "rank-prefixed-node.log").read_text()
                  .splitlines()],
        "node2": [f"[default{r}]:chatter {i} of node2 rank {r}" for i in range(30)
                  for r in (0, 1)],
        "node3": [f"[default0]:chatter {i} of node3" for i in range(7)]
                 + ["[default0]:NCCL INFO Channel 00/02 : 0 1"],
    }
    terminal = io.StringIO()
    router = LineRouter(logs, PlainDisplay(terminal), head="node0", screen=ScreenFilter("node0"))
    # Interleaved, as the nodes' lines arrive.
    longest = max(len(s) for s in streams.values())
    for i in range(longest):
        for node, lines in streams.items():
            if i < len(lines):
                router.line(node, lines[i])
    router.message("node node1 exited with code 1; stopping the other nodes")
    excerpt = failure_excerpt(router.tail("node1", 200), errors=router.errors("node1"))
    router.close()
    shown = terminal.getvalue().splitlines()

    assert [s for s in shown if s.startswith("node0/")] == \
        [f"node0/0: head step {i}" for i in range(5)]
    node1 = [s for s in shown if s.startswith("node1/")]
    assert node1 == [
        "node1/0: [rank1]: Traceback (most recent call last):",
        'node1/0: [rank1]:   File "/tmp/t36home/workdirs/t36proj-956f7a1e9f80/main.py", line '
        '77, in <module>',
        'node1/0: [rank1]:     assert attempt != 0, "rank 1 crashes once, at step 3"',
        "node1/0: [rank1]:            ^^^^^^^^^^^^",
        "node1/0: [rank1]: AssertionError: rank 1 crashes once, at step 3",
        "node1/agent: E1202 19:06:55.959000 19691 torch/distributed/elastic/multiprocessing/"
        "api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 19833) of binary: "
        "/work/wt/t36/.venv/bin/python",
    ]
    assert not [s for s in shown if s.startswith(("node2/", "node3/"))]
    assert "launch: node node1 exited with code 1; stopping the other nodes" in shown
    # At the end, once: whose lines are only in their logs, how many.
    assert shown[-1] == ("launch: lines kept off the terminal are in their logs only: "
                         "node1 40 line(s), node2 60 line(s), node3 8 line(s) "
                         f"(each in {tmp_path / 'run'}/NODE/node.log)")
    for node, lines in streams.items():
        assert len(logs[node].read_text().splitlines()) == len(lines)
    assert "node2/1: chatter 29 of node2 rank 1" in logs["node2"].read_text()
    # The failure message shows the failing node's own lines, kept off the screen or not.
    assert excerpt[0] == "node1/0: [rank1]: Traceback (most recent call last):"


def test_error_lines_in_the_forms_torch_torchrun_nccl_and_python_print_them():
    for text in [
        "E1202 19:06:55.959000 19691 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 0 (pid: 19833)",
        "[rank3]:[E1202 10:00:00.000000 42 ProcessGroupNCCL.cpp:616] Watchdog caught "
        "collective operation timeout",
        "[E ProcessGroupNCCL.cpp:475] Some NCCL operations have failed or timed out",
        "ip-10-0-0-7:4242:4300 [0] transport/net_socket.cc:540 NCCL WARN Net : Connection "
        "closed by remote peer",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)",
        "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970",
        "error: could not open train.bin",
        "Segmentation fault (core dumped)",
    ]:
        assert is_error_line(text), text
    for text in ["step 20/330 epoch 0 loss 1.2345", "NCCL INFO Bootstrap : Using eth0",
                 "W1202 19:06:55.959000 1 torch/distributed/run.py:793] Setting OMP_NUM_THREADS",
                 "Errors so far: 0", "loading 3 shards"]:
        assert not is_error_line(text), text


def test_the_filter_is_on_above_the_threshold_unless_all_lines():
    assert not screen_filter_on(8, False, {})
    assert screen_filter_on(9, False, {})
    assert not screen_filter_on(256, True, {})
    assert screen_filter_on(3, False, {SCREEN_ALL_NODES_ENV: "2"})
    assert not screen_filter_on(3, False, {SCREEN_ALL_NODES_ENV: "3"})


def test_the_end_names_a_few_nodes_and_counts_the_rest(tmp_path):
    names = [f"node{i}" for i in range(20)]
    logs = {n: tmp_path / "run" / n / "node.log" for n in names}
    terminal = io.StringIO()
    router = LineRouter(logs, PlainDisplay(terminal), screen=ScreenFilter("node0"))
    for node in names:
        for i in range(3):
            router.line(node, f"[default0]:loading shard {i}")
    router.close()
    shown = terminal.getvalue().splitlines()
    assert sum(s.startswith("node0/") for s in shown) == 3
    assert shown[-1] == ("launch: lines kept off the terminal are in their logs only: "
                         + ", ".join(f"node{i} 3 line(s)" for i in range(1, 9))
                         + ", and 33 line(s) of 11 more node(s) "
                         f"(each in {tmp_path / 'run'}/NODE/node.log)")


CHAT = ('echo "chatter from node $LAUNCH_NODE_RANK"; '
        'if [ "$LAUNCH_NODE_RANK" = 1 ]; then echo "ERROR: disk almost full on node 1" >&2; fi; '
        'if [ "$LAUNCH_NODE_RANK" = 2 ] && [ -n "$FAIL" ]; then '
        'echo "ValueError: bad shard 2" >&2; exit 3; fi')


def _recipe(folder: Path) -> Path:
    path = folder / "chat.yml"
    path.write_text(yaml.safe_dump({"name": "chat", "nodes": 3,
                                    "job": {"command": ["bash", "-c", CHAT]}}))
    return path


def test_a_local_run_above_the_threshold_shows_the_head_and_the_errors(run_launch, tmp_path):
    """`launch run --local --nodes 3` with the threshold at 2 nodes: node0's lines and node1's
    error line on the terminal, node1's and node2's chatter in their logs only, said at the
    start and the end; --all-lines shows every line again."""
    recipe = _recipe(tmp_path)
    env = {SCREEN_ALL_NODES_ENV: "2"}
    proc = run_launch("run", "--local", str(recipe), "--run-id", "few", env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert ("launch: 3 nodes: the terminal shows node0's lines, every error line and launch's "
            "own; every node's lines are in its log (--all-lines shows them all here)") in out
    assert "node0/agent: chatter from node 0" in out
    assert "node1/agent: ERROR: disk almost full on node 1" in out
    assert "chatter from node 1" not in out and "chatter from node 2" not in out
    run = tmp_path / "runs" / "few"
    assert (f"launch: lines kept off the terminal are in their logs only: node1 1 line(s), "
            f"node2 1 line(s) (each in {run}/NODE/node.log)") in out
    assert (run / "node1" / "node.log").read_text().splitlines() == [
        "node1/agent: chatter from node 1", "node1/agent: ERROR: disk almost full on node 1"]
    assert (run / "node2" / "node.log").read_text() == "node2/agent: chatter from node 2\n"

    proc = run_launch("run", "--local", str(recipe), "--run-id", "all", "--all-lines",
                      env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all(f"node{i}/agent: chatter from node {i}" in proc.stdout for i in range(3))
    assert "kept off the terminal" not in proc.stdout and "--all-lines" not in proc.stdout


def test_the_failure_message_shows_the_failing_node_s_lines_kept_off_the_screen(run_launch,
                                                                               tmp_path):
    proc = run_launch("run", "--local", str(_recipe(tmp_path)), "--run-id", "bad",
                      "--env", "FAIL=1", env={SCREEN_ALL_NODES_ENV: "2"}, timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "node2/agent: chatter from node 2" not in proc.stdout
    assert "node2/agent: ValueError: bad shard 2" in proc.stdout
    assert "node2 1 line(s)" in proc.stdout
    assert ("last lines of node node2, its workers' own error first (full log: "
            f"{tmp_path / 'runs' / 'bad' / 'node2' / 'node.log'}):\n"
            "  node2/agent: chatter from node 2\n"
            "  node2/agent: ValueError: bad shard 2\n") in proc.stderr


def test_a_detached_run_s_console_keeps_the_lines_off_the_screen_for_attach_all_lines(tmp_path):
    """A detached run's controller writes its terminal to console.jsonl: the lines its screen
    keeps off are there too, marked; replayed, the plain view is the run's own terminal and
    the --all-lines view has every line and none of launch's words about the screen."""
    names = ["node0", "node1", "node2"]
    logs = {n: tmp_path / "run" / n / "node.log" for n in names}
    (tmp_path / "run").mkdir()
    writer = ConsoleWriter(tmp_path / "run" / CONSOLE)
    router = LineRouter(logs, StreamDisplay(writer), head="node0", screen=ScreenFilter("node0"))
    router.screen_message(ScreenFilter("node0").opening(3))
    for i in range(3):
        for node in names:
            router.line(node, f"[default0]:chatter {i} of {node}")
    router.line("node2", "[default0]:ValueError: bad shard 2")
    router.message("node node2 exited with code 1; stopping the other nodes")
    router.close()
    writer.close()

    def view(all_lines: bool) -> list[str]:
        terminal = io.StringIO()
        display = PlainDisplay(terminal)
        for event in EventReader().feed((tmp_path / "run" / CONSOLE).read_bytes()):
            replay(event, display, terminal, terminal, all_lines)
        return terminal.getvalue().splitlines()

    plain, every = view(False), view(True)
    assert [s for s in plain if not s.startswith("launch:")] == \
        [f"node0/0: chatter {i} of node0" for i in range(3)] + \
        ["node2/0: ValueError: bad shard 2"]
    assert plain[0].startswith("launch: 3 nodes: the terminal shows node0's lines")
    assert plain[-1].startswith("launch: lines kept off the terminal are in their logs only: "
                                "node1 3 line(s), node2 3 line(s)")
    assert [s for s in every if not s.startswith("launch:")] == \
        [f"{n}/0: chatter {i} of {n}" for i in range(3) for n in names] + \
        ["node2/0: ValueError: bad shard 2"]
    assert not [s for s in every if "kept off" in s or "the terminal shows" in s]
    assert "launch: node node2 exited with code 1; stopping the other nodes" in every


def test_launch_attach_all_lines_shows_every_line_of_a_detached_many_node_run(run_launch,
                                                                              tmp_path):
    """`launch run --local --detach` of 3 nodes with the threshold at 2: `launch attach` shows
    what the run's terminal would have (the head, the errors, the counts at the end); `launch
    attach --all-lines` every node's lines."""
    env = {SCREEN_ALL_NODES_ENV: "2"}
    proc = run_launch("run", "--local", str(_recipe(tmp_path)), "--run-id", "det", "--detach",
                      env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plain = run_launch("attach", "det", env=env, timeout=120)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    assert "node0/agent: chatter from node 0" in plain.stdout
    assert "node1/agent: ERROR: disk almost full on node 1" in plain.stdout
    assert "chatter from node 1" not in plain.stdout and "chatter from node 2" not in plain.stdout
    assert "lines kept off the terminal are in their logs only: node1 1 line(s)" in plain.stdout
    every = run_launch("attach", "det", "--all-lines", env=env, timeout=120)
    assert every.returncode == 0, every.stdout[-3000:] + every.stderr[-3000:]
    assert all(f"node{i}/agent: chatter from node {i}" in every.stdout for i in range(3))
    assert "node1/agent: ERROR: disk almost full on node 1" in every.stdout
    assert "kept off the terminal" not in every.stdout and "--all-lines" not in every.stdout
