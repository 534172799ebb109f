"""The user's own job as a Slurm batch job on the lab (slurmctld, a slurmd per network
namespace): the project staged once on the shared filesystem, setup, restarts inside the job,
`--resume` as a new job, a command with its own launcher, and the hang watch through
`srun --overlap`. One lab for the module (tests/slurm/conftest.py); every test ends its jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import launch_cmd
from tests.job.project import HOSTILE_ARGS, SETUP, command_recipe, results, write_project
from tests.run.conftest import wait_for
from tests.run.timeline_check import check_timeline
from tests.slurm.conftest import job_processes, slurm_args, slurm_env

pytestmark = [pytest.mark.slow, pytest.mark.lab]


@pytest.fixture
def project(tmp_path):
    return write_project(tmp_path / "project")


# crash-once: rank 1 crashes at step 3 in attempt 0 only; torchrun, inside the job, restarts
# the ranks (--max-restarts 1) and they resume from the checkpoint.
CRASH_ONCE = ["--mode", "crash-once"]


@pytest.fixture(scope="module")
def own_run(slurm_lab, tmp_path_factory):
    """One run read by two tests (each run costs ~16 s of CPU on the lab: the store's, two
    agents' and two ranks' torch imports): a script job with setup and arguments a shell would
    mangle, whose rank 1 crashes once and is restarted inside the job. (project, proc, the
    wall clock when it began)"""
    project = write_project(tmp_path_factory.mktemp("own") / "project")
    began = time.time()
    proc = subprocess.run(
        launch_cmd("run", *slurm_args("--nodes", "2"), "main.py", "--setup", SETUP,
                   "--run-id", "own", "--max-restarts", "1", "--env", "JOB_TOKEN=s3cr3t value",
                   "--env", "FROM_SHELL", "--", *HOSTILE_ARGS, *CRASH_ONCE),
        cwd=project, text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, **slurm_env(slurm_lab),
             "LAUNCH_HOME": str(project.parent / "launch-home"),
             "FROM_SHELL": "from the shell", "NOT_PASSED": "launch's own"})
    return project, proc, began


def test_script_with_setup_and_args(slurm_lab, own_run):
    project, proc, _ = own_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = results(proc.stdout)
    assert sorted(seen) == [0, 1]
    names = [h.name for h in slurm_lab.hosts]
    for got in seen.values():
        assert got["argv"] == [*HOSTILE_ARGS, *CRASH_ONCE]
        assert got["package"] == "the user's own train package"
        assert got["node_package"] == "the user's own launch_node package"
        assert got["sees"] == ["setup-ran.txt"]
        assert got["env"]["LAUNCH_NODE_ADDRS"].split(",") == [h.address
                                                             for h in slurm_lab.hosts]
        # Staged once, beside the runs, where every node reads it; each node's job runs in
        # a folder of its own for this run, made from that copy, and the run names it.
        assert got["cwd"].startswith(str(project / "runs" / ".workdirs"))
        folder, node = Path(got["cwd"]), got["env"]["LAUNCH_NODE"]
        assert got["cwd"] == got["env"]["LAUNCH_WORKDIR"] and folder.name == node
        assert folder.parent.name.startswith("own.")
        assert str(folder.parent.parent) == got["env"]["LAUNCH_WORKDIR_COPY"] + ".runs"
        assert f"launch: job folder of {node}: {folder}" in proc.stdout + proc.stderr
        # The environment rule (docs/jobs.md#the-environment): --env reaches every rank,
        # nothing else of launch's environment does (sbatch exports all of it to the job).
        assert got["env"]["JOB_TOKEN"] == "s3cr3t value"
        assert got["env"]["FROM_SHELL"] == "from the shell" and "NOT_PASSED" not in got["env"]
        assert got["env"]["HOME"] == os.environ["HOME"]
    assert {got["env"]["LAUNCH_NODE"] for got in seen.values()} == set(names)
    assert {got["env"]["LAUNCH_NODE_RANK"] for got in seen.values()} == {"0", "1"}
    run = project / "runs" / "own"
    logs = [(run / name / "setup.log").read_text() for name in names]
    assert sum("launch: setup done" in log for log in logs) == 1
    # Setup found the node's interpreter first.
    python = Path(sys.executable)
    assert any(f"python={python} pip={python.parent / 'pip'}" in log for log in logs)
    # The job's handover holds --env's value, for the user alone (the pipeline in the job
    # reads it there); plan.json and the batch script do not.
    handover = run / "handover.json"
    assert "s3cr3t value" in handover.read_text() and handover.stat().st_mode & 0o077 == 0
    assert "s3cr3t" not in (run / "plan.json").read_text()
    assert "s3cr3t" not in (run / "job.sbatch").read_text()
    assert json.loads((run / "summary.json").read_text())["progress"]["step"] == 4
    assert job_processes(slurm_lab) == {}
    # What each node's job wrote comes back with `launch fetch --workdir` (read on the shared
    # filesystem), and only that.
    fetched = subprocess.run(launch_cmd("fetch", "own", "--workdir"), cwd=project, text=True,
                             capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                             env={**os.environ, **slurm_env(slurm_lab),
                                  "LAUNCH_HOME": str(project.parent / "launch-home")})
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert sorted(str(p.relative_to(run / "workdir")) for p in (run / "workdir").rglob("*")) \
        == sorted(names + [f"{name}/snapshot.pt" for name in names])
    for name in names:
        assert (run / "workdir" / name / "snapshot.pt").read_text() == f"own {name}"


def test_restarts_inside_the_job_then_resume_as_a_new_job(slurm_lab, run_launch, project,
                                                         own_run):
    env = slurm_env(slurm_lab)
    # The run with --max-restarts 1: torchrun, inside the job, restarted the ranks.
    own, proc, began = own_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step 3 in attempt 1" in proc.stdout
    summary = json.loads((own / "runs" / "own" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and len(summary["restarts"]) == 1
    # Every second accounted for (issue 39), as this machine saw them; the restart a loss.
    check_timeline(own / "runs" / "own" / "summary.json", began, restarts=1)
    # Without restarts the run fails; --resume submits a new job into its folder.
    failed_began = time.time()
    proc = run_launch("run", *slurm_args("--nodes", "2"), "main.py", "--run-id", "again",
                      "--", "--mode", "crash-once", cwd=project, env=env, timeout=300)
    assert proc.returncode == 1 and "rank 1 crashes once" in proc.stderr
    resumed_began = time.time()
    proc = run_launch("run", *slurm_args(), "--resume", "again", cwd=project, env=env,
                      timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step 3 in attempt 1" in proc.stdout
    run = project / "runs" / "again"
    assert (run / "attempts" / "1" / "job.sbatch").is_file()
    # The LAUNCH_ATTEMPT the ranks saw ("in attempt 1" above).
    assert json.loads((run / "summary.json").read_text())["attempt"] == 1
    check_timeline(*(run / "attempts").glob("*/summary.json"), failed_began)
    check_timeline(run / "summary.json", resumed_began)
    assert job_processes(slurm_lab) == {}


def test_a_command_with_its_own_launcher_restarted_as_a_new_step(slurm_lab, run_launch,
                                                                   project):
    """A command that fails ends its node's step; the pipeline in the job (the same Python as
    every backend's) starts every node again (new srun steps) with the next LAUNCH_ATTEMPT."""
    recipe = command_recipe(project, "cmd", ["--mode", "crash-once"], restarts=1)
    proc = run_launch("run", *slurm_args(), str(recipe), "--run-id", "cmd", cwd=project,
                      env=slurm_env(slurm_lab), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "exited with code 1; restarting every node" in proc.stdout
    # The command's own torchrun, which restarts nothing, is not said to.
    assert "torchrun starts the node's workers again" not in proc.stdout
    assert "resumed from step 3 in attempt 1" in proc.stdout
    # No torchrun of launch's and no rendezvous store: the command brought its own.
    plan = json.loads((project / "runs" / "cmd" / "plan.json").read_text())
    assert plan["store"] is None
    argv = plan["nodes"][0]["argv"]
    assert argv[1] == "-S" and argv[2].endswith("launch_node/worker.py") and \
        argv[3:5] == ["exec", "bash"]
    assert job_processes(slurm_lab) == {}


def test_a_hung_rank_is_found_through_srun_overlap(slurm_lab, run_launch, project):
    proc = run_launch("run", *slurm_args("--nodes", "2"), "main.py", "--run-id", "hung",
                      "--hang-timeout", "8", "--", "--mode", "hang", cwd=project,
                      env=slurm_env(slurm_lab), timeout=300)
    assert proc.returncode == 1
    assert "stuck: rank 1 on node" in proc.stderr
    dumps = sorted((project / "runs" / "hung" / "hang").glob("*.rank1.txt"))
    assert dumps and "stuck_in_user_code" in dumps[0].read_text()
    # Slurm ends a stopped step's slurmstepd a moment after the job's end.
    wait_for(lambda: job_processes(slurm_lab) == {}, 10, "no job process on any node")
