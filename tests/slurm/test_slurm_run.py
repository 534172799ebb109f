"""`launch run --slurm` on a real Slurm cluster: the lab (slurmctld, a slurmd per network
namespace, munge), from Debian's packages. One lab for the module; every test ends its jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.core.node_code import code_files, code_root, content_hash, controller_files
from tests.conftest import launch_cmd
from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.run.timeline_check import check_report_timeline, check_timeline
from tests.slurm.conftest import job_processes, slurm_args, slurm_env, worker_pids

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def test_demo_on_two_slurm_nodes(slurm_lab, run_launch, tmp_path, short_demo):
    recipe, local_proc, local_run = short_demo
    assert local_proc.returncode == 0, local_proc.stdout[-3000:] + local_proc.stderr[-3000:]
    env = slurm_env(slurm_lab)
    dry = run_launch("run", str(recipe), *slurm_args("--nodes", "2"), "--dry-run",
                     "--json", "--run-id", "slurm-demo", env=env, check=True)
    planned = json.loads(dry.stdout)["script"]
    began = time.time()
    proc = run_launch("run", str(recipe), *slurm_args("--nodes", "2"), "--run-id",
                      "slurm-demo", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs/slurm-demo"
    summary = json.loads((run / "summary.json").read_text())
    local = json.loads((local_run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == local["steps"] > 0
    # Same recipe, seed, world size and one thread per rank: the same model as on this machine.
    assert summary["final_loss"] == pytest.approx(local["final_loss"], rel=1e-5)
    assert summary["eval_accuracy"] == pytest.approx(local["eval_accuracy"], abs=0.01)
    names = [h.name for h in slurm_lab.hosts]
    assert [n["name"] for n in summary["nodes"]] == names
    slurm = summary["slurm"]
    assert slurm["state"] == "COMPLETED" and slurm["exit_code"] == "0:0"
    assert slurm["job_id"].isdigit()
    # The job id and its state were shown while it ran.
    assert f"submitted batch job {slurm['job_id']}" in proc.stdout
    assert f"job {slurm['job_id']} RUNNING on" in proc.stdout
    # What ran is what the dry run printed.
    assert (run / "job.sbatch").read_text() == planned
    plan = json.loads((run / "plan.json").read_text())
    for node, host in zip(plan["nodes"], slurm_lab.hosts):
        # Each node found its own address and interface inside its namespace.
        assert node["argv"][node["argv"].index("--local-addr") + 1] == host.address
        assert node["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        log = (run / host.name / "node.log").read_text()
        assert f"{host.name}/0: rank " in log and f"{host.name}/0: rank " in proc.stdout
        assert list((run / host.name).glob("torchrun/*/attempt_0/0/stdout.log"))
    assert plan["rendezvous"]["endpoint"] == f"{slurm_lab.hosts[0].address}:29500"
    assert f"{names[0]}/store: rendezvous store listening on" in proc.stdout
    rank0 = run / summary["rank0_node"]
    assert (rank0 / "result.json").exists() and (run / "metrics.jsonl").exists()
    assert (run / "report.md").exists()
    code = json.loads((run / "code.json").read_text())
    # What every node got is what launch lists, hashed as every backend hashes it; the job's
    # pipeline ran launch itself from that copy.
    files = [*code_files(code_root()), *controller_files(code_root())]
    assert code == {"sha256": content_hash(code_root(), files), "files": files}
    assert {"launch_node/worker.py", "train/main.py", "launch_bench/bench.py",
            "launcher/commands/controller.py"} <= set(files)
    # Every second accounted for (issue 39), as this machine saw them: the job's queue and
    # hand-over, then the controller's parts inside the job.
    timeline = check_timeline(run / "summary.json", began)
    assert timeline["controller_wall_s"] < timeline["wall_s"]
    # The report a user opens says the same (written again here from the amended summary),
    # not the controller's view that starts inside the job.
    check_report_timeline(run, began, names=("start-up", "hand-over", "queue and follow",
                                             "controller start-up", "controller report"))
    assert set(timeline["nodes"]) == set(names)
    assert job_processes(slurm_lab) == {}


def _start(tmp_path, lab, run_id, steps=5000) -> LaunchProcess:
    recipe = write_recipe(tmp_path, name=f"{run_id}.yml", train={"steps": steps})
    return LaunchProcess(["run", str(recipe), *slurm_args("--nodes", "2"), "--run-id", run_id],
                       tmp_path, slurm_env(lab))


def _training(tmp_path, run_id) -> bool:
    return any("step " in p.read_text()
               for p in (tmp_path / "runs" / run_id).glob("*/node.log"))


def test_killed_worker_ends_the_job(slurm_lab, tmp_path):
    second = slurm_lab.hosts[1].name
    run = _start(tmp_path, slurm_lab, "slurm-kill")
    try:
        wait_for(lambda: _training(tmp_path, "slurm-kill") and worker_pids(slurm_lab, second),
                 240, "training on both Slurm nodes")
        os.kill(worker_pids(slurm_lab, second)[0], signal.SIGKILL)
        # The long run ends within the wait only if launch stopped every node (no wall-clock
        # bound beyond that: machines are shared and noisy).
        code = run.wait(timeout=120)
    finally:
        run.kill()
    out = run.output()
    assert code == 1, out[-3000:]
    assert f"node {second}: its worker local_rank 0 (pid " in out
    assert "was killed by SIGKILL (torchrun exited with code 1)" in out
    assert "SIGKILL" in out.split("last lines of node")[1]   # the worker's own end, shown
    summary = json.loads((tmp_path / "runs/slurm-kill/summary.json").read_text())
    assert summary["failure"]["first_failed_node"] == second
    assert summary["slurm"]["state"] in ("FAILED", "CANCELLED")
    # `ip netns pids` on every host: its slurmd, nothing of the job.
    wait_for(lambda: job_processes(slurm_lab) == {}, 5, "no job process on any node")


def test_sigint_cancels_the_job(slurm_lab, tmp_path):
    """Ctrl-C on `launch run --slurm` goes to the run's pipeline in the job, which stops every
    node as an attached run does; the job then ends with the run's own exit code."""
    run = _start(tmp_path, slurm_lab, "slurm-int")
    try:
        wait_for(lambda: _training(tmp_path, "slurm-int"), 240, "training on the Slurm lab")
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(timeout=60)
    finally:
        run.kill()
    assert code == 130, run.output()[-3000:]
    assert run.output().count("Ctrl-C (SIGINT)") == 2   # when it came, and the run's end
    assert "Traceback" not in run.output()
    summary = json.loads((tmp_path / "runs/slurm-int/summary.json").read_text())
    assert summary["failure"]["interrupted"] is True and summary["status"] == "interrupted"
    assert summary["slurm"]["state"] == "FAILED" and summary["slurm"]["exit_code"] == "130:0"
    assert {n["status"] for n in summary["nodes"]} == {"stopped"}
    wait_for(lambda: job_processes(slurm_lab) == {}, 5, "no job process on any node")


def test_job_cancelled_outside_launch(slurm_lab, tmp_path):
    """An admin's (or your own) scancel: the run fails and says who ended it."""
    run = _start(tmp_path, slurm_lab, "slurm-ext")
    try:
        wait_for(lambda: _training(tmp_path, "slurm-ext"), 240, "training on the Slurm lab")
        job_id = json.loads((tmp_path / "runs/slurm-ext/slurm.json").read_text())["job_id"]
        slurm_lab.client(["scancel", job_id])
        code = run.wait(timeout=60)
    finally:
        run.kill()
    out = run.output()
    assert code == 1, out[-3000:]
    assert f"job {job_id} was cancelled outside launch" in out
    summary = json.loads((tmp_path / "runs/slurm-ext/summary.json").read_text())
    assert summary["slurm"]["state"] == "CANCELLED" and summary["status"] == "failed"
    wait_for(lambda: job_processes(slurm_lab) == {}, 5, "no job process on any node")


def test_sigterm_while_pending_cancels_with_143(slurm_lab, tmp_path):
    """A job waiting for nodes: its state and Slurm's reason are shown; SIGTERM cancels it."""
    env = slurm_env(slurm_lab)
    blocker = slurm_lab.client(["sbatch", "--parsable", "--nodes=2", "--exclusive",
                                "--output=/dev/null", "--wrap=sleep 120"])
    assert blocker.returncode == 0, blocker.stderr
    try:
        run = LaunchProcess(["run", str(write_recipe(tmp_path)), *slurm_args("--nodes", "2"),
                           "--run-id", "slurm-wait"], tmp_path, env)
        try:
            wait_for(lambda: "PENDING (Resources)" in run.output(), 60, "the job pending")
            run.proc.send_signal(signal.SIGTERM)
            code = run.wait(timeout=60)
        finally:
            run.kill()
    finally:
        slurm_lab.client(["scancel", blocker.stdout.strip()])
    assert code == 143, run.output()
    summary = json.loads((tmp_path / "runs/slurm-wait/summary.json").read_text())
    assert summary["slurm"]["state"] == "CANCELLED" and summary["failure"]["interrupted"]
    wait_for(lambda: job_processes(slurm_lab) == {}, 15, "the blocker gone too")


def test_store_that_cannot_listen_fails_the_run(slurm_lab, tmp_path):
    """The port taken on the first node: the store says why, the script stops the nodes."""
    head = slurm_lab.hosts[0]
    squatter = subprocess.Popen(
        ["ip", "netns", "exec", head.netns, sys.executable, "-c",
         "import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', 29555))\ns.listen()\n"
         "print('up', flush=True)\ntime.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "up"
        recipe = write_recipe(tmp_path)
        proc = subprocess.run(launch_cmd("run", str(recipe), *slurm_args("--nodes", "2"),
                                         "--run-id", "slurm-port", "--rdzv-port", "29555"),
                              cwd=tmp_path, env={**os.environ, **slurm_env(slurm_lab)},
                              capture_output=True, text=True, timeout=300)
    finally:
        squatter.kill()
        squatter.wait()
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"the store on node {head.name} exited with code 1" in proc.stderr
    # The store's own words (the OS's, said before torch is imported), in the message.
    assert "address already in use" in proc.stderr.lower()
    try:
        wait_for(lambda: job_processes(slurm_lab) == {}, 5, "no job process on any node")
    except AssertionError as err:
        # Seen once in four whole-suite runs (2026-12-02): what was left says which part.
        raise AssertionError(f"{err}; left: {job_processes(slurm_lab)}\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None


def test_hostile_dataset_reaches_the_trainer_as_one_argument(slurm_lab, tmp_path):
    canary = tmp_path / "canary"
    value = f"$(touch {canary}); touch {canary}"
    recipe = write_recipe(tmp_path, nodes=1, train={"dataset": value})
    proc = subprocess.run(launch_cmd("run", str(recipe), *slurm_args(), "--run-id", "hostile"),
                          cwd=tmp_path, env={**os.environ, **slurm_env(slurm_lab)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert f"dataset folder not found: {value}" in proc.stdout + proc.stderr
    assert not canary.exists()


def test_bench_on_two_slurm_nodes(slurm_lab, run_launch, tmp_path):
    proc = run_launch("bench", *slurm_args("--nodes", "2"), "--max-bytes", "64K", "--iters",
                      "3", "--warmup-iters", "1", "--run-id", "slurm-bench",
                      env=slurm_env(slurm_lab), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "runs/slurm-bench"
    doc = json.loads((run / "bandwidth.json").read_text())
    assert doc["nnodes"] == 2 and doc["backend"] == "gloo"
    assert "all_reduce_perf" in proc.stdout or "Collective test concluded" in proc.stdout
    assert (run / "bandwidth.png").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert [n["name"] for n in summary["nodes"]] == [h.name for h in slurm_lab.hosts]


def test_topo_asks_every_allocated_node(slurm_lab, run_launch):
    proc = run_launch("topo", "--slurm", "--nodes", "2", env=slurm_env(slurm_lab))
    assert proc.returncode == 1    # no GPUs in the lab: no topology, said per node
    for host in slurm_lab.hosts:
        assert f"{host.name}: nvidia-smi is not installed" in proc.stdout


def test_missing_partition_too_many_nodes_missing_sbatch(slurm_lab, run_launch, tmp_path):
    env = slurm_env(slurm_lab)
    recipe = str(write_recipe(tmp_path))
    proc = run_launch("run", recipe, *slurm_args("--partition", "gpu"), env=env)
    assert proc.returncode == 2
    assert "--partition gpu: no partition gpu" in proc.stderr
    assert "partitions: lab (default): 2 node(s): 2 idle" in proc.stderr
    proc = run_launch("run", recipe, *slurm_args("--nodes", "3"), env=env)
    assert proc.returncode == 2
    assert "--nodes 3: partition lab has 2 node(s) that take jobs" in proc.stderr
    empty = tmp_path / "empty-path"
    empty.mkdir()
    proc = run_launch("run", recipe, *slurm_args(), env={**env, "PATH": str(empty)})
    assert proc.returncode == 2
    assert "the Slurm client commands sbatch, squeue, scancel, scontrol, sinfo, srun are not " \
           "on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()   # nothing submitted, no folder


def test_run_folder_the_nodes_cannot_see(slurm_lab, tmp_path):
    """Runs on a tmpfs only launch's mount namespace has: the job fails at once and launch says
    the run folder must be on a shared filesystem."""
    private = tmp_path / "private"
    private.mkdir()
    script = ('mount -t tmpfs launch-test "$1" && shift && exec "$@"')
    proc = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(private),
         *launch_cmd("run", str(write_recipe(tmp_path)), *slurm_args(), "--run-id", "hidden",
                     "--runs-dir", str(private / "runs"))],
        cwd=tmp_path, env={**os.environ, **slurm_env(slurm_lab)}, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "note: the run folder is on tmpfs" in proc.stdout
    assert "without writing anything into the run folder" in proc.stderr
    assert "must be on a filesystem the nodes share" in proc.stderr
