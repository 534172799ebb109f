"""The live view of `launch run` on a terminal: one line per node (step rate, loss,
communication share, straggler) under the progress bar, redrawn in place; plain lines when
the output is a pipe."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time

import pytest

from launcher.report.live import MAX_ROWS, NodeBoard
from tests.report.conftest import DATA
from tests.run.conftest import write_recipe
from train.stragglers import StragglerJudge


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_trainers_per_node_line_is_what_the_board_shows():
    """train/stragglers.py writes the line, launcher/report/live.py reads it: the two ends of one
    format, both real."""
    judge = StragglerJudge([("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)])
    # Per rank (compute, data wait, communication wait) means over an interval of 5 steps;
    # rank 3 computes three times longer.
    rows = [(0.010, 0.001, 0.009, 5)] * 3 + [(0.030, 0.001, 0.001, 5)]
    said = judge.observe(5, rows) + judge.observe(10, rows) + judge.observe(15, rows)
    line = judge.node_line(15, [2.0, 2.2, 2.4, 2.6])
    # node-a: 20 ms steps, 9 of them waiting (45%), loss (2.0 + 2.2) / 2; node-b: ranks of
    # 20 and 32 ms -> 26 ms, waits of 9 and 1 ms -> 5 / 26 = 19%, and a straggler.
    assert line == ("per node at step 15: node-a 20.0 ms/step, comm 45%, loss 2.1000; "
                    "node-b 26.0 ms/step, comm 19%, loss 2.5000, straggler")
    clock = Clock()
    board = NodeBoard(clock)
    assert board.line("node-a", line) is True          # shown in place, not printed
    assert board.rows() == ["node-a  step 15  50.0 steps/s  loss 2.1000  comm 45%",
                            "node-b  step 15  38.5 steps/s  loss 2.5000  comm 19%  "
                            "STRAGGLER yes"]
    [straggler] = said
    assert board.line("node-a", straggler) is False    # printed, and it names the rank
    assert board.rows()[1].endswith("STRAGGLER rank 3 (2.8x)")
    # The next interval without the flag: the node caught up.
    healthy = [(0.010, 0.001, 0.009, 5)] * 4
    judge.observe(20, healthy)
    board.line("node-a", judge.node_line(20, [2.0] * 4))
    assert "STRAGGLER" not in board.rows()[1]


def test_a_real_straggler_runs_lines_end_on_the_board_as_they_ended():
    """Every line the straggler run printed (tests/report/data: node0/node.log and
    node1/node.log, verbatim), fed in order. Its last per-node line: node0 345.1 ms/step,
    comm 71%, loss 0.5837; node1 344.9 ms/step, comm 1%, loss 0.5862, straggler (1 / 0.3451 s
    and 1 / 0.3449 s are both 2.9 steps/s); its straggler line: node1 rank 1 at 1.5x."""
    board = NodeBoard(Clock())
    for node in ("node0", "node1"):
        for line in (DATA / "straggler" / node / "node.log").read_text().splitlines():
            prefix, _, text = line.partition(": ")
            assert prefix.startswith(f"{node}/")
            board.line(node, text)
    assert board.rows() == [
        "node0  step 60  2.9 steps/s  loss 0.5837  comm 71%",
        "node1  step 60  2.9 steps/s  loss 0.5862  comm 1%  STRAGGLER rank 1 (1.5x)"]


def test_one_node_runs_show_the_progress_lines_figures():
    judge = StragglerJudge([("box", 0), ("box", 1)])
    judge.observe(5, [(0.01, 0.0, 0.01, 2)] * 2)
    assert judge.node_line(5, [1.0, 1.0]) is None       # the progress line says it all
    board = NodeBoard(Clock())
    text = ("step 20/330 epoch 1/15 loss 1.2345 lr 1.00e-04 step_time 0.120s 534.6 img/s, "
            "waiting on communication 35%")
    assert board.line("box", text) is False
    assert board.rows() == ["box  step 20  8.3 steps/s  loss 1.2345  comm 35%"]


def test_a_jobs_step_lines_give_each_node_its_step_rate_and_loss():
    """A user's job's LAUNCH_STEP lines (docs/jobs.md's format): the step each node reached,
    steps per second over at least a second, the last loss; after a resume from a checkpoint
    the step goes back and the rate starts again."""
    clock = Clock()
    board = NodeBoard(clock)
    board.line("gpu-a", "LAUNCH_STEP step=1 loss=2.5000 busy_s=0.0100")
    assert board.rows() == ["gpu-a  step 1  loss 2.5000"]      # no rate from one line
    clock.now += 0.5
    board.line("gpu-a", "LAUNCH_STEP step=6 loss=2.0000")
    clock.now += 1.5
    board.line("gpu-a", "LAUNCH_STEP step=21 loss=1.2500 busy_s=0.0100 samples=64")
    assert board.rows() == ["gpu-a  step 21  10.0 steps/s  loss 1.2500"]   # 20 steps in 2 s
    board.line("gpu-a", "LAUNCH_STEP step=3 loss=2.2000")          # resumed at step 3
    assert board.rows() == ["gpu-a  step 3  10.0 steps/s  loss 2.2000"]
    board.line("gpu-a", "LAUNCH_STEP step=oops")                    # not a step line
    assert board.rows()[0].startswith("gpu-a  step 3 ")


def test_nodes_that_print_no_figures_show_what_launch_sees():
    clock = Clock()
    board = NodeBoard(clock)
    for text in ("starting my own job", "epoch 1 of 3"):
        board.line("gpu-0", text)
    clock.now += 2.5
    board.line("gpu-10", "hello")
    assert board.rows() == ["gpu-0   2 line(s), last 2.5 s ago",
                            "gpu-10  1 line(s), last 0.0 s ago"]


def test_many_nodes_keep_the_stragglers_in_view():
    board = NodeBoard(Clock())
    entries = [f"n{i:02d} 20.0 ms/step, comm 40%, loss 1.0000" for i in range(40)]
    entries[33] += ", straggler"
    board.line("n00", "per node at step 10: " + "; ".join(entries))
    rows = board.rows()
    assert len(rows) == MAX_ROWS
    assert rows[0].startswith("n33") and "STRAGGLER" in rows[0]
    assert rows[-1] == f"... and {40 - (MAX_ROWS - 1)} more node(s)"


# ----------------------------------------------------------------------------- real runs

def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.slow
def test_a_run_on_a_terminal_redraws_the_node_lines_in_place(tmp_path):
    """A real 2-node run inside tmux (a real terminal): while it trains, the bottom of the
    screen holds one line per node with its figures, and the scrollback never gets a copy
    of them: they were redrawn in place, not printed."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (scripts/test installs it as root)")
    recipe = write_recipe(tmp_path, train={"steps": 100, "log_every": 5})
    session = f"launch-live-{tmp_path.name}"[:60]
    launch = shlex.join([sys.executable, "-m", "launcher", "run", str(recipe), "--local",
                         "--nodes", "2", "--run-id", "live"])
    command = f"cd {shlex.quote(str(tmp_path))} && {launch}; echo launch-exit=$?; sleep 600"
    _tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "40",
          "-e", f"LAUNCH_HOME={tmp_path / 'launch-home'}", command)
    screens = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            screen = _tmux("capture-pane", "-p", "-t", session)
            screens.append(screen)
            if "launch-exit=" in screen:
                break
            time.sleep(0.3)
        history = _tmux("capture-pane", "-p", "-S", "-", "-t", session)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "launch-exit=0" in history, history[-3000:]

    def board(screen: str) -> dict[str, str]:
        return {line.split()[0]: line for line in screen.splitlines()
                if line.startswith(("node0 ", "node1 ")) and " steps/s " in line}

    live = [board(s) for s in screens if len(board(s)) == 2]
    assert live, "no screen showed both nodes' lines:\n" + screens[len(screens) // 2]
    for rows in live:
        for row in rows.values():
            assert " loss " in row and " comm " in row and row.split()[1] == "step"
    steps = {int(rows["node0"].split()[2]) for rows in live}
    assert len(steps) > 1, "the node lines never changed"    # updated as the run went on
    # Redrawn in place: the scrollback holds the trainer's lines, never a board line, and
    # the per-node lines it replaced are not printed either.
    assert "node0/0: step 100/100" in history
    assert not board(history) and "per node at step" not in history



@pytest.mark.slow
def test_into_a_pipe_the_run_prints_plain_lines(demo_local_run):
    """The README's demo with its output captured (a pipe): no cursor movement and no colour,
    and the per-node figures as an ordinary line of the head node."""
    proc, _ = demo_local_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "\x1b" not in proc.stdout + proc.stderr
    per_node = [line for line in proc.stdout.splitlines() if ": per node at step " in line]
    # log_every 30 over 330 steps: 11 intervals, the first measured one after the warm-up.
    assert len(per_node) >= 10
    head, _, nodes = per_node[-1].partition(": per node at step 330: ")
    assert head in ("node0/0", "node1/0")                   # rank 0's node prints it
    assert sorted(part.split()[0] for part in nodes.split("; ")) == ["node0", "node1"]
    assert nodes.count(" ms/step, comm ") == 2
