"""Spot nodes, the parts that need no lab: who gets the last-chance signal, what a notice
makes of a failed run, and what the plan of a run on spot nodes holds."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from launcher.cluster.inventory import Node
from launcher.execute.sidecar import Preemptions
from launcher.execute.supervisor import NodeExit, Outcome
from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import Placement, plan_run
from launcher.job.spot import with_spot_watch
from launch_node.spot import handles

HANDLER = "import signal, time; signal.signal(signal.SIGUSR1, lambda *a: None); print('ok', " \
          "flush=True); time.sleep(60)"


def start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if "print" in code:
        proc.stdout.readline()
    else:
        time.sleep(0.5)
    return proc


def test_only_a_process_with_a_handler_is_sent_the_last_chance_signal():
    """SIGUSR1's default action ends a process: the watcher signals only those that caught
    it (SigCgt), so a job that never asked for it is left alone."""
    caught, plain = start(HANDLER), start("import time; time.sleep(60)")
    try:
        assert handles(caught.pid, signal.SIGUSR1)
        assert not handles(plain.pid, signal.SIGUSR1)
        assert not handles(caught.pid, signal.SIGUSR2)
    finally:
        caught.kill()
        plain.kill()


def outcome(status: str, first: str | None) -> Outcome:
    return Outcome(status=status, nodes=[NodeExit("n0", 0), NodeExit("n1", 255)],
                   first_failure=first, reason=f"node {first} exited with code 255")


def test_a_run_that_fails_after_a_notice_is_preempted():
    book = Preemptions(clock=iter([0.0, 12.5]).__next__)
    book.line("n1", "spot: interruption notice: terminate at 2026-12-01T12:02:00Z; SIGUSR1 to "
                    "rank(s) 1")
    book.line("n1", "spot: interruption notice: stop at 2026-12-01T12:05:00Z; no rank")
    judged = book.judge(outcome("failed", "n1"))
    assert judged.status == "preempted"
    assert judged.reason == ("node n1 was taken back by EC2 (spot interruption notice: terminate "
                             "at 2026-12-01T12:02:00Z; node n1 exited with code 255)")
    assert judged.recovery["preemption"] == [{"node": "n1", "action": "terminate",
                                              "time": "2026-12-01T12:02:00Z",
                                              "seen_at_s": 12.5}]


def test_a_notice_on_a_run_that_still_succeeded_is_only_recorded():
    book = Preemptions()
    assert book.judge(outcome("failed", "n1")).status == "failed"   # no notice: a failure
    book.line("n0", "spot: interruption notice: stop at 2026-12-01T12:02:00Z; no rank here "
                    "handles SIGUSR1")
    done = book.judge(outcome("succeeded", None))
    assert done.status == "succeeded" and done.recovery["preemption"][0]["node"] == "n0"


def test_spot_nodes_get_a_watcher_and_every_rank_agrees_each_step():
    recipe = recipe_from_mapping({"name": "x", "train": {"steps": 10},
                                  "checkpoint": {"every_steps": 5}}, "r.yml")
    nodes = [Node("a", "10.0.0.1", "10.0.0.1", gpus=0, extra={"launch_market": "spot"}),
             Node("b", "10.0.0.2", "10.0.0.2", gpus=0, extra={"launch_market": "on-demand"})]
    places = {n.name: Placement(python="/py", code_dir="/code", run_dir=f"/runs/{n.name}")
              for n in nodes}
    plan = with_spot_watch(plan_run(recipe, nodes, "r", places), nodes, places)
    assert [w.name for w in plan.spot] == ["a"]
    assert plan.spot[0].argv == ("/py", "/code/launch_node/spot.py", "watch", "/runs/a")
    # A notice reaches one node's ranks; the checkpoint is a collective of all.
    assert {c.env["LAUNCH_INTERRUPTIBLE"] for c in plan.nodes} == {"1"}
    assert "spot nodes a: a watcher reads EC2's interruption notice" in plan.render()
    on_demand = [Node("b", "10.0.0.2", "10.0.0.2", gpus=0)]
    plain = plan_run(recipe, on_demand, "r", places)
    assert with_spot_watch(plain, on_demand, places) is plain
