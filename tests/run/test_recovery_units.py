"""The pure parts of recovery, by exact expected values: when a run counts as hung, how
failures become restarts, which rank a stack dump names as stuck (on real py-spy and
faulthandler output, tests/run/data/hang/SOURCES.md), checkpoint files, recipe keys, the plan,
and what `--resume` refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.core.errors import LauncherError, RecipeError
from launcher.execute.forensics import (Frame, classify, main_frames, parse_faulthandler,
                                        parse_py_spy)
from launcher.cluster.inventory import Node
from launcher.execute.recovery import RestartBook
from launcher.execute.watch import ProgressClock, poll_interval
from launcher.job.recipe import recipe_from_mapping, recipe_warnings
from launcher.job.runplan import Placement, plan_run
from launcher.runs.folder import RunFolder
from launcher.runs.resume import ResumeError, check_resume, find_resume_point
from launch_node import checkpoint_files as files
from launch_node.node_probe import kill, run_processes

DATA = Path(__file__).parent / "data" / "hang"
BASE = {"name": "r", "nodes": 2, "train": {"steps": 100, "depth": 2, "image_size": 8,
                                           "patch_size": 4}}


# ---- when is a run hung -------------------------------------------------------------------

def beat(local_rank, pid, step, phase="train", median=None):
    return {"local_rank": local_rank, "pid": pid, "step": step, "phase": phase,
            "median_step_s": median}


def test_the_clock_arms_on_the_second_sight_of_a_ready_rank_and_fires_after_the_timeout():
    clock = ProgressClock(timeout_s=30.0, now=0.0)
    # Files seen once (an earlier attempt's, or the first look) do not arm it.
    clock.observe({"n0": [beat(0, 10, 5)]}, now=1.0)
    assert not clock.armed and not clock.stalled(100.0)
    # A rank still joining the rendezvous does not either.
    clock.observe({"n0": [beat(0, 11, 0, "setup")]}, now=2.0)
    assert not clock.armed
    clock.observe({"n0": [beat(0, 11, 0, "ready")]}, now=3.0)
    assert clock.armed and clock.last_change == 3.0
    clock.observe({"n0": [beat(0, 11, 0, "ready")]}, now=20.0)  # nothing new
    assert not clock.stalled(32.9) and clock.stalled(33.0)
    assert clock.idle_for(40.0) == 37.0


def test_a_restart_disarms_the_clock_until_the_new_ranks_are_ready():
    clock = ProgressClock(timeout_s=10.0, now=0.0)
    clock.observe({"n0": [beat(0, 1, 1)]}, now=0.0)
    clock.observe({"n0": [beat(0, 1, 2)]}, now=1.0)
    clock.restart(now=50.0)
    assert not clock.stalled(100.0)
    # The replaced process finishing one more step does not arm it either.
    clock.observe({"n0": [beat(0, 1, 3)]}, now=60.0)
    assert not clock.armed
    clock.observe({"n0": [beat(0, 2, 0, "setup")]}, now=101.0)
    assert not clock.stalled(200.0)
    clock.observe({"n0": [beat(0, 2, 40, "train")]}, now=201.0)
    assert clock.stalled(211.0)


def test_a_run_whose_ranks_are_all_done_is_not_hung_but_one_left_behind_is():
    clock = ProgressClock(timeout_s=10.0, now=0.0)
    clock.observe({"a": [beat(0, 1, 9)], "b": [beat(0, 2, 9)]}, now=0.0)
    clock.observe({"a": [beat(0, 1, 10, "done")], "b": [beat(0, 2, 10, "evaluate")]}, now=1.0)
    assert clock.stalled(11.0)
    clock.observe({"a": [beat(0, 1, 10, "done")], "b": [beat(0, 2, 10, "done")]}, now=12.0)
    assert not clock.stalled(100.0) and clock.finished


@pytest.mark.parametrize("median,expected", [(None, 300.0), (0.5, 300.0), (15.0, 300.0),
                                             (16.0, 320.0), (60.0, 1200.0)])
def test_the_default_timeout_is_300s_or_20_median_steps(median, expected):
    clock = ProgressClock(timeout_s=None, now=0.0)
    clock.observe({"n0": [beat(0, 1, 1, median=median)]}, now=0.0)
    clock.observe({"n1": [beat(0, 2, 1, median=0.1)]}, now=0.0)
    assert clock.threshold() == expected


def test_the_watch_polls_at_most_every_2s_and_at_least_every_half_second():
    assert poll_interval(ProgressClock(10.0, 0.0)) == 1.0
    assert poll_interval(ProgressClock(2.0, 0.0)) == 0.5
    assert poll_interval(ProgressClock(None, 0.0)) == 2.0


# ---- failures and restarts ----------------------------------------------------------------

# Lines torchrun's agents printed here when node1's worker was killed with SIGKILL and node0's
# worker then lost its peer (torch 2.13.0).
KILLED = ("E1201 03:03:31.188000 15562 torch/distributed/elastic/multiprocessing/api.py:1002] "
          "failed (exitcode: -9) local_rank: 0 (pid: 15721) of binary: /work/main/.venv/bin/python")
PEER = ("E1201 03:20:56.808000 4290 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 0 (pid: 6033) of binary: /work/main/.venv/bin/python")


def test_one_failure_seen_on_two_nodes_is_one_restart_blamed_where_it_began():
    book = RestartBook(budget=2)
    book.line("node0", "agent", PEER, 10.0)       # the survivor reports first
    book.line("node1", "agent", KILLED, 10.2)     # the killed worker's agent
    book.line("node0", "0", "rank 0/2 on vm: backend gloo, device cpu", 12.0)
    book.line("node0", "0", "resumed from checkpoint step 100 (step-00000100.pt, epoch 5, 12 "
              "step(s) into it, read and shared in 0.41s); the previous attempt had reached "
              "step 103: 3 step(s) lost", 13.0)
    book.line("node0", "0", "step 101: first step since the restart", 18.5)
    assert book.to_json() == [{
        "node": "node1", "kind": "worker",
        "reason": "worker local_rank 0 (pid 15721) was killed by SIGKILL", "at_time_s": 10.0,
        "resumed_from_step": 100, "steps_lost": 3, "recovered_in_s": 8.5,
        "checkpoint_load_s": 0.41, "reached_step": None, "next_step": None,
        "restarted": True}]
    assert book.exhausted() is None


def test_a_user_job_s_step_lines_say_where_it_went_on_after_a_restart():
    """A job of the user's own prints no "resumed from checkpoint" of the trainer's: its
    LAUNCH_STEP lines before and after the restart say where it went on (the report said "not
    resumed" of a script that had resumed from its own checkpoint)."""
    book = RestartBook(budget=1)
    book.line("node0", "0", "LAUNCH_STEP step=3 loss=0.5", 1.0)
    book.line("node1", "agent", PEER, 2.0)
    book.line("node1", "0", "LAUNCH_STEP step=3 loss=0.5", 2.1)        # before re-forming
    book.line("node0", "0", "launch: worker rank 0/2 (local rank 0, pid 5) attempt 1 on vm", 3.0)
    book.line("node0", "0", "LAUNCH_STEP step=4 loss=0.4", 4.0)
    book.line("node0", "0", "LAUNCH_STEP step=5 loss=0.3", 5.0)
    [incident] = book.to_json()
    assert (incident["reached_step"], incident["next_step"]) == (3, 4)
    assert incident["restarted"] is True
    # One more failure is beyond the budget: recorded, not a restart.
    book.line("node1", "agent", PEER, 6.0)
    assert [i["restarted"] for i in book.to_json()] == [True, False]


def test_a_failure_after_the_rendezvous_re_formed_is_a_new_restart_and_beyond_the_budget_stops():
    book = RestartBook(budget=1)
    assert book.failure("node", "node1", "node agent was killed by SIGKILL", 5.0, True)
    book.line("node1", "0", "rank 1/2 on vm: backend gloo, device cpu", 9.0)
    book.line("node1", "agent", KILLED, 30.0)
    assert book.used == 2
    node, reason = book.exhausted()
    assert node == "node1"
    assert reason == ("node node1: worker local_rank 0 (pid 15721) was killed by SIGKILL; the run "
                      "had used its 1 restart(s)")


def test_without_restarts_worker_lines_change_nothing():
    book = RestartBook(budget=0)
    book.line("node1", "agent", KILLED, 1.0)
    assert book.to_json() == [] and book.exhausted() is None


def test_an_attempt_that_starts_from_a_checkpoint_records_it_outside_any_restart():
    book = RestartBook(budget=0)
    book.line("node0", "0", "resumed from checkpoint step 50 (step-00000050.pt, epoch 3, 6 "
              "step(s) into it); the previous attempt had reached step 64: 14 step(s) lost", 3.0)
    assert (book.started_from_step, book.started_steps_lost) == (50, 14)


def test_a_restart_that_does_not_re_form_in_time_is_reported():
    book = RestartBook(budget=3)
    book.failure("node", "host1", "node agent exited with code 255", 100.0)
    assert book.waiting(150.0, 60.0) is None
    assert book.waiting(160.5, 60.0).node == "host1"


# ---- which rank is stuck ----------------------------------------------------------------

def rank(stack_file, state, **extra):
    text = (DATA / stack_file).read_text()
    return {"rank": extra.pop("rank", 0), "local_rank": 0, "pid": extra.pop("pid", None),
            "step": 51, "state": state, "state_name": {"T": "stopped", "S": "sleeping"}[state],
            "stack": text,
            "stack_source": "faulthandler" if stack_file.startswith("faulthandler") else "py-spy",
            **extra}


def test_py_spy_output_is_read_thread_by_thread_innermost_first():
    threads = parse_py_spy((DATA / "spy-waiting-in-backward.txt").read_text(), pid=19713)
    assert [(t.tid, t.name, t.main) for t in threads] == [("19713", "MainThread", True)]
    assert threads[0].frames[:4] == [
        Frame("_engine_run_backward", "torch/autograd/graph.py", 979),
        Frame("backward", "torch/autograd/__init__.py", 395),
        Frame("backward", "torch/_tensor.py", 623),
        Frame("train_step", "train/main.py", 265)]


def test_faulthandler_output_is_read_with_the_signalled_thread_as_main():
    threads = parse_faulthandler((DATA / "faulthandler-barrier.txt").read_text())
    assert len(threads) == 1 and threads[0].main and threads[0].tid == "0x00007f585d830b80"
    assert str(threads[0].frames[0]) == "barrier (torch/distributed/distributed_c10d.py:5356)"
    assert threads[0].frames[2] == Frame("wait_for_the_others", "/tmp/cap/cap.py", 10)


def test_a_stopped_rank_is_stuck_wherever_it_stopped():
    for stack in ("spy-stopped-rank.txt", "spy-stopped-rank-ssh.txt"):
        verdict = classify("node1", rank(stack, "T", rank=1))
        assert verdict.where == "stuck" and verdict.state == "stopped (T)"
    assert classify("node1", rank("spy-stopped-rank.txt", "T")).frame == \
        "step_done (train/heartbeat.py:85)"


def test_a_rank_sleeping_in_backward_waits_on_ddp_all_reduce():
    verdict = classify("node0", rank("spy-waiting-in-backward.txt", "S"))
    assert verdict.where == "in_collective"
    assert verdict.waiting_in == ("_engine_run_backward (torch/autograd/graph.py:979) (DDP's "
                                  "gradient all-reduce)")


def test_a_running_rank_in_backward_is_computing_not_waiting():
    verdict = classify("node0", rank("spy-waiting-in-backward.txt", "S") | {"state": "R",
                                                                             "state_name": "running"})
    assert verdict.where == "stuck"


@pytest.mark.parametrize("stack,where,frame", [
    ("spy-barrier.txt", "in_collective", "barrier (torch/distributed/distributed_c10d.py:5356)"),
    ("faulthandler-barrier.txt", "in_collective",
     "barrier (torch/distributed/distributed_c10d.py:5356)"),
    ("spy-sleeping.txt", "stuck", "busy_elsewhere (cap.py:13)"),
    ("faulthandler-sleeping.txt", "stuck", "busy_elsewhere (/tmp/cap/cap.py:13)"),
])
def test_a_rank_in_a_collective_waits_and_one_outside_is_stuck(stack, where, frame):
    verdict = classify("n", rank(stack, "S"))
    assert (verdict.where, verdict.frame) == (where, frame)


def test_a_rank_without_a_stack_is_undetermined_and_a_vanished_one_stuck():
    assert classify("n", {"rank": 0, "state": "S", "stack": None}).where == "unknown"
    assert classify("n", {"rank": 0, "state": "gone", "stack": None}).state == "gone"
    assert classify("n", {"rank": 0, "state": "gone", "stack": None}).where == "stuck"
    assert main_frames({"stack": None}) == []


# ---- comm_hook auto across a resume --------------------------------------------------------

def test_autos_decision_stands_after_a_resume_and_a_measurement_starts_again():
    from train.autocomm import AutoCompression, AutoDecision
    from train.ddp import NEVER, ResumablePowerSGDState

    state = ResumablePowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=NEVER)
    schedule = {"total_steps": 400, "lr_warmup_steps": 20, "start_iter": 10}
    decided = AutoCompression(state, **schedule)
    decided.decision = AutoDecision("powersgd", "pays", 15, 0.4)
    resumed = AutoCompression(state, **schedule)
    resumed.load_state_dict(decided.state_dict(), resumed_at_step=40)
    assert resumed.decision == decided.decision and resumed.phase == "done"
    measuring = AutoCompression(state, **schedule)
    measuring.phase = "trial"
    state.start_powerSGD_iter = 0              # its trial had switched PowerSGD on
    fresh = AutoCompression(state, **schedule)
    fresh.load_state_dict(measuring.state_dict(), resumed_at_step=40)
    assert fresh.decision is None and state.start_powerSGD_iter == NEVER
    assert fresh.outcome(41)["reason"] == ("run ended at step 41 during the measurement of "
                                           "plain all-reduce")


# ---- checkpoint files ---------------------------------------------------------------------

def write_checkpoint(folder: Path, step: int, signature=None, complete=True):
    """A checkpoint as train/checkpoint.py writes one: torch.save's archive, then its .json."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    name = files.stem(step)
    size = files.write_atomic(folder / f"{name}.pt", lambda f: torch.save({"step": step}, f))
    if complete:
        files.write_json_atomic(folder / f"{name}.json", {
            "format": files.FORMAT, "step": step, "epoch": 0, "offset": step,
            "signature": signature or {}, "bytes": size, "file": f"{name}.pt"})


def test_only_checkpoints_with_their_json_count_and_the_newest_wins(tmp_path):
    write_checkpoint(tmp_path, 10)
    write_checkpoint(tmp_path, 20)
    write_checkpoint(tmp_path, 30, complete=False)          # killed before its .json
    (tmp_path / "step-00000040.pt.tmp").write_bytes(b"half")  # killed mid-write
    assert [c.step for c in files.complete(tmp_path)] == [10, 20]
    assert files.latest(tmp_path).state == tmp_path / "step-00000020.pt"
    assert files.latest(tmp_path / "missing") is None


def test_pruning_keeps_the_newest_and_removes_what_never_completed(tmp_path):
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, step)
    write_checkpoint(tmp_path, 25, complete=False)
    (tmp_path / "step-00000040.pt.tmp").write_bytes(b"half")
    files.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000020.json", "step-00000020.pt", "step-00000030.json", "step-00000030.pt"]


def test_an_atomic_write_that_fails_leaves_the_old_file(tmp_path):
    target = tmp_path / "x.json"
    files.write_json_atomic(target, {"v": 1})

    def broken(f):
        f.write(b"{partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        files.write_atomic(target, broken)
    assert json.loads(target.read_text()) == {"v": 1}


# ---- recipe keys --------------------------------------------------------------------------

def load(**changes):
    return recipe_from_mapping({**BASE, **changes}, "r.yml")


def test_recovery_keys_load_with_defaults():
    recipe = load()
    assert (recipe.checkpoint, recipe.restarts, recipe.hang_timeout_s) == (None, 0, None)
    recipe = load(checkpoint={"every_minutes": 5}, restarts=3, hang_timeout_s=120)
    assert (recipe.checkpoint.every_minutes, recipe.checkpoint.keep,
            recipe.checkpoint.asynchronous) == (5.0, 2, True)


@pytest.mark.parametrize("changes,key,words", [
    ({"checkpoint": {"every_steps": 10, "every_minutes": 5}}, "checkpoint",
     "exactly one of every_steps or every_minutes"),
    ({"checkpoint": {"keep": 3}}, "checkpoint", "exactly one of every_steps or every_minutes"),
    ({"checkpoint": {"every_steps": 0}}, "checkpoint.every_steps", "greater than or equal to 1"),
    ({"checkpoint": {"every_step": 10}}, "checkpoint.every_step", "did you mean `every_steps`"),
    ({"restarts": -1}, "restarts", "greater than or equal to 0"),
    ({"restarts": True}, "restarts", "valid integer"),
    ({"hang_timeout_s": 0}, "hang_timeout_s", "greater than or equal to 1"),
    ({"env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}}, "env", "set by launch"),
])
def test_bad_recovery_keys_name_the_key(changes, key, words):
    with pytest.raises(RecipeError) as err:
        load(**changes)
    assert err.value.key == key and words in err.value.why


def test_restarts_without_checkpoints_warn_that_they_start_over():
    (warning,) = recipe_warnings(load(restarts=2))
    assert "restarts is 2" in warning and "starts over from step 0" in warning
    assert recipe_warnings(load(restarts=2, checkpoint={"every_steps": 10})) == []


# ---- the plan -----------------------------------------------------------------------------

def plan_for(**changes):
    nodes = [Node(name=f"n{i}", address=f"10.0.0.{i}", private_address=f"10.0.0.{i}", gpus=0)
             for i in range(2)]
    places = {n.name: Placement(python="/py", code_dir="/code", run_dir=f"/runs/{n.name}")
              for n in nodes}
    return plan_run(load(**changes), nodes, "rid", places)


def test_restarts_reach_torchrun_and_the_agents_can_rejoin():
    plan = plan_for(restarts=3, checkpoint={"every_steps": 25}, hang_timeout_s=90)
    for node in plan.nodes:
        argv = list(node.argv)
        assert argv[argv.index("--max-restarts") + 1] == "3"
        assert node.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert node.env["LAUNCH_CHECKPOINT_NODE"] == "n0"   # the head keeps the checkpoints
        assert argv[argv.index("--checkpoint-every-steps") + 1] == "25"
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in node.env  # CPU nodes: no NCCL
    assert plan.to_json()["recovery"] == {"restarts": 3, "hang_timeout_s": 90.0,
                                          "restart_deadline_s": 600.0,
                                          "checkpoint_every": "25 steps"}
    assert "recovery: up to 3 restart(s); checkpoints every 25 steps; hang timeout 90 s " \
           "(stacks dumped, then restart)" in plan.render()


def test_without_restarts_the_plan_stays_fail_fast():
    plan = plan_for()
    argv = list(plan.nodes[0].argv)
    assert argv[argv.index("--max-restarts") + 1] == "0"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.nodes[0].env
    assert "LAUNCH_CHECKPOINT_NODE" not in plan.nodes[0].env
    assert "recovery: no restarts (fail-fast); no checkpoints; hang timeout max(300 s, 20x " \
           "the median step) (stacks dumped, then stop)" in plan.render()


# ---- what --resume refuses ----------------------------------------------------------------

def stopped_run(tmp_path, signature_changes=None, with_checkpoint=True):
    """A run folder as launch leaves it, with a checkpoint written under BASE's settings."""
    from train.options import resume_signature

    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe_file = tmp_path / "r.yml"
    recipe_file.write_text(json.dumps({**BASE, "checkpoint": {"every_steps": 10}}))
    folder = RunFolder.create(tmp_path / "runs", "old")
    folder.keep_recipe(str(recipe_file))
    folder.write_json("plan.json", {"nodes": [{"name": "node0"}, {"name": "node1"}]})
    signature = resume_signature(load(checkpoint={"every_steps": 10}).model_dump(), 2)
    signature.update(signature_changes or {})
    if with_checkpoint:
        write_checkpoint(folder.node_dir("node0") / "checkpoints", 30, signature)
    return folder


def test_resume_reads_the_runs_own_recipe_and_its_latest_checkpoint(tmp_path):
    stopped_run(tmp_path)
    point = find_resume_point(str(tmp_path / "runs"), "old", None)
    assert point.recipe.name == "r" and point.checkpoint.step == 30
    notes = check_resume(point, point.recipe, ["node0", "node1"], 2, True)
    assert notes == [f"resuming run old from checkpoint step 30 ({point.checkpoint.state})"]


def test_resume_refuses_a_recipe_that_breaks_the_checkpoint_key_by_key(tmp_path):
    stopped_run(tmp_path)
    other = tmp_path / "other.yml"
    other.write_text(json.dumps({**BASE, "train": {**BASE["train"], "depth": 3},
                                 "checkpoint": {"every_steps": 10}}))
    point = find_resume_point(str(tmp_path / "runs"), "old", str(other))
    with pytest.raises(ResumeError) as err:
        check_resume(point, point.recipe, ["node0", "node1"], 4, True)
    text = str(err.value)
    assert "train.depth: the checkpoint has 2, this run 3" in text
    assert "world_size: the checkpoint has 2, this run 4" in text
    assert "train.steps" not in text  # more steps is what resuming is for


def test_resume_refuses_other_nodes_and_a_run_with_no_checkpoint(tmp_path):
    stopped_run(tmp_path)
    point = find_resume_point(str(tmp_path / "runs"), "old", None)
    with pytest.raises(ResumeError, match="resume on the same nodes"):
        check_resume(point, point.recipe, ["node0", "node1", "node2"], 3, True)
    empty = stopped_run(tmp_path / "b", with_checkpoint=False)
    point = find_resume_point(str(tmp_path / "b" / "runs"), "old", None)
    with pytest.raises(ResumeError, match="stopped before its first one"):
        check_resume(point, point.recipe, ["node0", "node1"], 2, True)
    # Over SSH the head's own disk may have checkpoints that were never fetched.
    assert "checked when the trainer starts" in check_resume(
        point, point.recipe, ["node0", "node1"], 2, False)[0]
    assert empty.root.exists()


def test_resume_of_an_unknown_run_lists_the_runs_there(tmp_path):
    stopped_run(tmp_path)
    with pytest.raises(LauncherError) as err:
        find_resume_point(str(tmp_path / "runs"), "nope", None)
    assert "no run folder" in str(err.value) and "runs there: old" in str(err.value)


# ---- the node probe never touches a process of another run ----------------------------------

def test_kill_spares_a_process_without_the_runs_stamp():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "LAUNCH_RUN_STAMP": "another-run"})
    try:
        assert kill([other.pid], "this-run") == {"killed": [], "skipped": [other.pid]}
        time.sleep(0.2)
        assert other.poll() is None
        assert kill([other.pid], "another-run") == {"killed": [other.pid], "skipped": []}
        assert other.wait(timeout=10) == -9
    finally:
        other.kill()


def test_the_runs_processes_are_found_by_their_exact_stamp_wherever_it_sits():
    """The hang watch's look finds a run's processes by LAUNCH_RUN_STAMP in their environment
    (the raw bytes searched first): first or last entry alike, and never a stamp that merely
    starts or ends like this run's, nor a value that only contains it."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = {
        "first": ({"LAUNCH_RUN_STAMP": "s1", "LAUNCH_NODE": "node0", "RANK": "3"}, True),
        "last": ({"PATH": os.environ["PATH"], "LAUNCH_RUN_STAMP": "s1"}, True),
        "longer": ({"LAUNCH_RUN_STAMP": "s1x"}, False),
        "shorter": ({"LAUNCH_RUN_STAMP": "s"}, False),
        "inside": ({"OTHER": "LAUNCH_RUN_STAMP=s1", "LAUNCH_RUN_STAMP": "s2"}, False),
        "prefixed": ({"XLAUNCH_RUN_STAMP": "s1"}, False),
    }
    # Popen returns once the child has exec'd: its environment is the one given.
    started = {name: subprocess.Popen(sleep, env=env) for name, (env, _) in procs.items()}
    try:
        found = {p["pid"]: p for p in run_processes("s1")}
        assert {name for name, proc in started.items() if proc.pid in found} == \
            {name for name, (_, ours) in procs.items() if ours}
        assert found[started["first"].pid]["rank"] == 3
        assert [p["pid"] for p in run_processes("s1", node="node0")] == [started["first"].pid]
    finally:
        for proc in started.values():
            proc.kill()
            proc.wait()


# Verbatim from a lab run (tests/ssh/test_ssh_run.py::test_killed_worker_stops_all_hosts, the
# worker on host1 killed with SIGKILL): host0's rank saw the connection reset and aborted
# itself, and its agent reported first.
ABORTED_PEER = [
    "host0/0: [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:537] Read error [10.226.246.11]:8914: Connection reset by peer. This is typically "
    "caused by a remote worker hanging or bugs in the application.",
    "host0/0: terminate called without an active exception",
    "host0/agent:   exitcode  : -6 (pid: 32639)  (SIGABRT)",
    "host0/agent:   traceback : Signal 6 (SIGABRT) received by PID 32639",
]
KILLED_WORKER = [
    "host1/agent:   exitcode  : -9 (pid: 32638)  (SIGKILL)",
    "host1/agent:   traceback : Signal 9 (SIGKILL) received by PID 32638",
]


def test_a_worker_killed_from_outside_outweighs_one_that_aborted_itself():
    from launcher.execute.supervisor import signal_death_evidence

    assert signal_death_evidence(KILLED_WORKER) == 2
    assert signal_death_evidence(ABORTED_PEER) == 1
    assert signal_death_evidence(["host0/agent:   exitcode  : 1 (pid: 6033)"]) == 0


ABORTED = ("E1201 06:45:53.990000 32418 torch/distributed/elastic/multiprocessing/api.py:1002] "
           "failed (exitcode: -6) local_rank: 0 (pid: 32639) of binary: /tmp/ci3/.venv/bin/python")


def test_a_peer_that_aborted_first_is_not_blamed_for_the_restart():
    book = RestartBook(budget=2)
    book.line("node0", "agent", ABORTED, 10.0)    # the survivor aborted itself, reported first
    book.line("node1", "agent", KILLED, 10.2)     # the killed worker's agent
    [incident] = book.to_json()
    assert incident["node"] == "node1"
    assert incident["reason"] == "worker local_rank 0 (pid 15721) was killed by SIGKILL"


def test_a_restart_is_announced_naming_where_it_began_not_the_peer_that_reported_first():
    """Seen in the full suite on a loaded machine: node1's worker crashed, node0's worker lost
    its peer ("Connection closed by peer") and its agent reported first; the restart was
    announced as "node node0" though the summary then blamed node1. A victim's report now
    waits for the report of where it began; with none, the re-formed rendezvous says it."""
    said: list[str] = []
    book = RestartBook(budget=2)
    book.on_new = lambda incident, number: said.append(f"{number}: {incident.node}")
    book.line("node0", "0", "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer "
              "[10.0.0.2]:41234", 10.0)
    book.line("node0", "agent", PEER, 10.1)       # the victim's agent reports first
    assert said == []
    book.line("node1", "agent", PEER.replace("pid: 6033", "pid: 7000"), 10.3)
    assert said == ["1: node1"]
    book.line("node1", "0", "launch: worker rank 1/2 (local rank 0, pid 7100) attempt 1 on vm",
              12.0)
    assert said == ["1: node1"]                  # said once
    # Only the victim reported before the rendezvous re-formed: said then, as it stands.
    book.line("node0", "0", "[rank0]: RuntimeError: Connection reset by peer", 20.0)
    book.line("node0", "agent", PEER, 20.1)
    assert said == ["1: node1"]
    book.line("node0", "0", "launch: worker rank 0/2 (local rank 0, pid 7200) attempt 2 on vm",
              22.0)
    assert said == ["1: node1", "2: node0"]
    assert [i["node"] for i in book.to_json()] == ["node1", "node0"]


# ---- a machine lost without a word ---------------------------------------------------------

class QuietNode:
    """A node as the recovery sees it: how long since it answered a look; forsaken when its
    machine is gone."""

    def __init__(self, name: str, quiet: float | None):
        self.name, self.quiet, self.forsaken = name, quiet, False

    def quiet_s(self):
        return self.quiet

    def forsake(self):
        self.forsaken = True


def test_a_quiet_node_is_ended_only_when_its_fleet_says_its_machine_is_gone(tmp_path):
    from launcher.execute.recovery import FLEET_ASK_S, QUIET_S, Recovery

    now = [0.0]
    asked: list[str] = []
    gone = {"host0": "lab host host0: its network namespace is gone"}

    def node_lost(name):
        asked.append(name)
        return gone.get(name)

    told: list[tuple[str, str]] = []     # machine_lost: where the replacement begins
    recovery = Recovery(1, None, 60, tmp_path, clock=lambda: now[0], node_lost=node_lost,
                        machine_lost=lambda name, why: told.append((name, why)))
    lost, loaded, answering = (QuietNode("host0", 0.0), QuietNode("host1", 0.0),
                               QuietNode("host2", None))
    recovery.start([lost, loaded, answering], 0.0)
    recovery.trouble()
    assert asked == []                          # every node answered lately: nobody asked
    lost.quiet = loaded.quiet = QUIET_S + 0.5   # both silent: a lost machine, a loaded one
    recovery.trouble()
    assert asked == ["host0", "host1"] and lost.forsaken and not loaded.forsaken
    now[0] += 1.0
    recovery.trouble()                          # asked again only after FLEET_ASK_S
    assert asked == ["host0", "host1"]
    now[0] += FLEET_ASK_S
    recovery.trouble()
    assert asked[2:] == ["host1"] and not loaded.forsaken   # host0 ends: not asked again
    # The lost machine is told once (its replacement may begin), the loaded one never; its
    # agent's end that follows the forsaking tells nothing more.
    assert told == [("host0", gone["host0"])]
    assert recovery.node_failed("host0", 255) is False and told == [("host0", gone["host0"])]
