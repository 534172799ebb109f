"""Runs that survive, on real `launch run --local` runs: a killed worker restarted and resumed
from a checkpoint, Ctrl-C then --resume, a stopped rank found and named, bad resumes refused,
and checkpoint writes killed half-way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, launch_cmd
from tests.run.conftest import run_pids, wait_for, worker_pid, write_recipe
from launch_node import checkpoint_files as files

pytestmark = pytest.mark.slow

# The FAST recipe, long enough to be interrupted after its first checkpoint.
TRAIN = {"steps": 200, "log_every": 20}
CHECKPOINT = {"every_steps": 40, "keep": 2}


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def checkpoint_steps(run: Path, node: str = "node0") -> list[int]:
    return [c.step for c in files.complete(run / node / files.CHECKPOINT_DIR)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same recipe, uninterrupted: what a restarted or resumed run must match."""
    cwd = tmp_path_factory.mktemp("reference")
    recipe = write_recipe(cwd, train=TRAIN, checkpoint=CHECKPOINT)
    proc = subprocess.run(launch_cmd("run", "--local", "--nodes", "2", str(recipe), "--run-id",
                                     "ref"), cwd=cwd, text=True, capture_output=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return cwd / "runs" / "ref"


def test_an_uninterrupted_run_keeps_its_newest_checkpoints_on_the_head(reference):
    summary = summary_of(reference)
    assert summary["status"] == "succeeded" and summary["restarts"] == []
    assert summary["eval_accuracy"] >= 0.9
    # keep: 2 of the checkpoints at 40, 80, ..., 200, in the head's folder only.
    assert checkpoint_steps(reference) == [160, 200]
    assert not (reference / "node1" / files.CHECKPOINT_DIR).exists()
    meta = files.latest(reference / "node0" / files.CHECKPOINT_DIR).meta
    assert meta["signature"]["world_size"] == 2 and meta["signature"]["train.depth"] == 2
    assert (meta["step"], meta["total"]) == (200, 200)
    stats = summary["checkpoint"]
    assert stats["saves"] == 5 and stats["failures"] == [] and stats["bytes"] > 0
    assert (reference / "recipe.yml").exists()


def test_a_killed_worker_is_restarted_and_the_run_resumes_from_its_checkpoint(
        background_launch, tmp_path, reference):
    recipe = write_recipe(tmp_path, train=TRAIN, checkpoint=CHECKPOINT)
    run_dir = tmp_path / "runs" / "wk"
    run = background_launch("run", "--local", "--nodes", "2", str(recipe), "--run-id", "wk",
                            "--max-restarts", "2")
    wait_for(lambda: checkpoint_steps(run_dir) and worker_pid("wk", "node1"), 240,
             "the first checkpoint")
    os.kill(worker_pid("wk", "node1"), signal.SIGKILL)
    assert run.wait(timeout=300) == 0, run.output()[-4000:]
    summary = summary_of(run_dir)
    assert summary["status"] == "succeeded" and summary["steps"] == 200
    (restart,) = summary["restarts"]
    assert restart["node"] == "node1" and restart["kind"] == "worker"
    assert "killed by SIGKILL" in restart["reason"]
    assert restart["resumed_from_step"] > 0 and restart["resumed_from_step"] % 40 == 0
    assert restart["steps_lost"] >= 0 and restart["recovered_in_s"] > 0
    # Same seed, same data order, same state: the same model as without the failure.
    assert summary["eval_accuracy"] == pytest.approx(summary_of(reference)["eval_accuracy"],
                                                     abs=0.01)
    assert "succeeded after 1 restart(s)" in run.output()
    assert run_pids("wk") == []


def test_ctrl_c_then_resume_continues_from_the_last_checkpoint(background_launch, run_launch,
                                                               tmp_path, reference):
    recipe = write_recipe(tmp_path, train=TRAIN, checkpoint=CHECKPOINT)
    run_dir = tmp_path / "runs" / "cr"
    run = background_launch("run", "--local", "--nodes", "2", str(recipe), "--run-id", "cr")
    wait_for(lambda: checkpoint_steps(run_dir), 240, "the first checkpoint")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130
    assert run_pids("cr") == []
    saved = checkpoint_steps(run_dir)[-1]
    # No recipe given: the run's own copy; the same folder, a new attempt.
    proc = run_launch("run", "--resume", "cr", "--local", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = summary_of(run_dir)
    assert summary["status"] == "succeeded" and summary["steps"] == 200
    # The LAUNCH_ATTEMPT the ranks saw: the first attempt stopped without restarts.
    assert summary["attempt"] == 1 and summary["resumed_from_step"] == saved
    assert f"resumed from checkpoint step {saved}" in proc.stdout
    earlier = json.loads((run_dir / "attempts/1/summary.json").read_text())
    assert earlier["status"] == "interrupted" and earlier["failure"]["interrupted"]
    # Earlier logs kept: both attempts' lines are in the node's log.
    assert (run_dir / "node0/node.log").read_text().count("node0/0: rank ") == 2
    assert summary["eval_accuracy"] == pytest.approx(summary_of(reference)["eval_accuracy"],
                                                     abs=0.01)


def test_a_stopped_rank_is_named_with_every_ranks_stack_and_the_run_stops(background_launch,
                                                                          tmp_path):
    recipe = write_recipe(tmp_path, train={"steps": 100000, "log_every": 10})
    run_dir = tmp_path / "runs" / "hang"
    run = background_launch("run", "--local", "--nodes", "2", str(recipe), "--run-id", "hang",
                            "--hang-timeout", "10")
    metrics = run_dir / "node0" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2
             and worker_pid("hang", "node1"), 240, "training on both nodes")
    time.sleep(3)  # two looks of the hang watch at a moving step: it is armed
    victim = worker_pid("hang", "node1")
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        code = run.wait(timeout=90)
    finally:
        if run.proc.poll() is None:
            os.kill(victim, signal.SIGKILL)
    finished = time.time()
    out = run.output()
    assert code == 1, out[-3000:]
    summary = summary_of(run_dir)
    hang = summary["hang"]
    assert [(s["node"], s["state"]) for s in hang["stuck"]] == [("node1", "stopped (T)")]
    assert [c["node"] for c in hang["in_collective"]] == ["node0"]
    assert hang["timeout_s"] == 10 and hang["action"] == "stop"
    # Every rank's stack, written within the hang timeout + 15 s of the stop.
    assert sorted(hang["dumps"]) == sorted(f"hang/{p.name}" for p in (run_dir / "hang").iterdir())
    assert len(hang["dumps"]) == 2
    for dump in hang["dumps"]:
        assert (run_dir / dump).stat().st_mtime - stopped_at <= 10 + 15
        assert "MainThread" in (run_dir / dump).read_text()
    assert finished - stopped_at <= 10 + 15 + 10  # then stopping: SIGTERM, --grace, SIGKILL
    assert "rank 1 on node node1: stopped (T)" in out or "rank 0 on node node1: stopped (T)" in out
    assert summary["failure"]["first_failed_node"] == "node1"
    assert run_pids("hang") == []


def test_bad_resumes_and_restart_counts_are_refused_and_change_nothing(run_launch, tmp_path,
                                                                       reference):
    runs = tmp_path / "runs"
    shutil.copytree(reference, runs / "ref")
    before = {p: p.stat().st_mtime_ns for p in runs.rglob("*")}
    other = write_recipe(tmp_path, name="deeper.yml", train={**TRAIN, "depth": 3},
                         checkpoint=CHECKPOINT)
    proc = run_launch("run", str(other), "--resume", "ref", "--local")
    assert proc.returncode == 2, proc.stderr
    assert "train.depth: the checkpoint has 2, this run 3" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_launch("run", "--resume", "no-such-run", "--local")
    assert proc.returncode == 2 and "no run folder" in proc.stderr and "runs there: ref" in \
        proc.stderr
    proc = run_launch("run", str(other), "--local", "--max-restarts", "-1")
    assert proc.returncode == 2
    assert "--max-restarts: invalid restart count (a whole number from 0 to 1000)" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("*")} == before
    assert not (runs / "ref" / "attempts").exists()


WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from pathlib import Path
    from train.checkpoint import Stats, Writer
    folder, size = Path(sys.argv[1]), int(sys.argv[3])
    writer = Writer(folder, keep=2, asynchronous=True, stats=Stats())
    writer.submit({"w": torch.ones(4)}, {"step": 10})
    writer.wait()
    print("first written", flush=True)
    writer.submit({"w": torch.ones(size)}, {"step": 20})
    writer.wait()
""")


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    """The trainer's own writer (train/checkpoint.py), killed while it writes."""
    import torch

    folder = tmp_path / "checkpoints"
    for size in (50_000_000, 200_000_000):  # 200 MB, then 800 MB if the first was too quick
        shutil.rmtree(folder, ignore_errors=True)
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(REPO), str(size)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "first written"
        tmp = folder / "step-00000020.pt.tmp"
        wait_for(lambda: tmp.exists() or proc.poll() is not None, 60, "the second write",
                 interval=0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (folder / "step-00000020.json").exists():
            break
    assert not (folder / "step-00000020.json").exists(), "the write finished before the kill"
    latest = files.latest(folder)
    assert latest.step == 10
    assert torch.equal(torch.load(latest.state, weights_only=True)["w"], torch.ones(4))
    files.prune(folder, keep=2)  # the next writer's clean-up
    assert not list(folder.glob("*.tmp"))
    assert {"step-00000010.json", "step-00000010.pt"} <= {p.name for p in folder.iterdir()}


def test_powersgd_error_feedback_and_warm_start_survive_a_resume_exactly(tmp_path):
    """The trainer itself (2 ranks, one torchrun), PowerSGD with error feedback and warm start
    over several buckets with static_graph: resumed from its step-30 checkpoint it ends with
    the final loss of the run that was never stopped. (Each rank's residual and P/Q are saved
    per parameter and put back into whatever buckets DDP has; DDP rebuilds its buckets before
    the first resumed step.) Step 30 is the third save, copied by the plan the first save
    made (train/staging.py CopyPlan) into its memory: it holds step 30's state, not step 10's
    nor a mix."""
    args = ["--model", "vit_tiny", "--depth", "2", "--dataset", "digits", "--image-size", "8",
            "--patch-size", "4", "--batch-size", "32", "--steps", "40", "--log-every", "10",
            "--static-graph", "--gradient-as-bucket-view", "--bucket-cap-mb", "0.05",
            "--comm-hook", "powersgd", "--powersgd-rank", "2", "--powersgd-start-iter", "2",
            "--checkpoint-every-steps", "10", "--checkpoint-keep", "2"]

    def train(out: Path) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", str(REPO / "train/main.py"), *args, "--out-dir", str(out)],
            capture_output=True, text=True, timeout=300, env={**os.environ,
                                                              "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads((out / "result.json").read_text())

    whole = train(tmp_path / "whole")
    resumed_dir = tmp_path / "resumed" / files.CHECKPOINT_DIR
    resumed_dir.mkdir(parents=True)
    for path in (tmp_path / "whole" / files.CHECKPOINT_DIR).glob("step-00000030.*"):
        shutil.copy(path, resumed_dir / path.name)
    resumed = train(tmp_path / "resumed")
    assert resumed["resumed_from_step"] == 30 and whole["resumed_from_step"] is None
    assert resumed["final_loss"] == whole["final_loss"]
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]


def test_stacks_come_from_faulthandler_where_py_spy_is_missing(tmp_path):
    """A node whose Python has no py-spy (and none on PATH): the rank prints its own stacks."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out_dir = tmp_path / "node"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from launch_node.heartbeat import Heartbeat
        Heartbeat({str(out_dir)!r})
        def waiting_somewhere():
            while True:   # one long sleep: asleep (S) whenever the probe looks, even on a
                time.sleep(3600)   # busy machine (a 0.05 s loop was once caught running, R)
        print("ready", flush=True)
        waiting_somewhere()
    """)
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "LAUNCH_RUN_STAMP": "s1", "RANK": "3",
                                 "LOCAL_RANK": "0"})
    try:
        assert rank.stdout.readline().strip() == "ready"
        probe = subprocess.run(
            [str(venv / "bin/python"), str(REPO / "launch_node/node_probe.py"), "dump", str(out_dir),
             "--stamp", "s1", "--timeout", "5"],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    finally:
        rank.kill()
    assert probe.returncode == 0, probe.stderr
    (answer,) = json.loads(probe.stdout)["ranks"]
    assert answer["rank"] == 3 and answer["state"] == "S"
    assert answer["stack_source"] == "faulthandler"
    assert "py-spy is not installed" in answer["error"]
    assert 'line 8 in waiting_somewhere' in answer["stack"]
