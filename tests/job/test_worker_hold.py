"""launch_node/worker.py holds the shipped workdir for the job it becomes, and refuses a copy that
another launch changed after this run shipped it: a real worker.py process, a real folder
shipped by launch's own ship_local, real flock(2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.workdir import node as workdir_node
from launcher.workdir.scan import scan_workdir
from launcher.workdir.sync import ship_local
from launch_node import worker

WORKER = Path(worker.__file__)
# Run by the job: can anyone change the copy now? (an exclusive lock is what a ship takes)
PROBE = ("import fcntl, os, sys\n"
         "fd = os.open(os.path.join(os.environ['LAUNCH_WORKDIR'], '.launch-lock'), os.O_RDWR)\n"
         "try:\n"
         "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
         "    print('free')\n"
         "except BlockingIOError:\n"
         "    print('held')\n")


def shipped(tmp_path: Path, text: str):
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "train.py").write_text(text)
    manifest = scan_workdir(project)
    stats = ship_local(manifest, tmp_path / "copy")
    return manifest, stats.dest


def run_worker(dest: str, digest: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAUNCH_WORKDIR": dest, "LAUNCH_WORKDIR_DIGEST": digest}
    return subprocess.run([sys.executable, str(WORKER), *argv], capture_output=True, text=True,
                          env=env, cwd=dest, timeout=60)


def test_the_names_agree_with_the_node_side_of_shipping():
    assert (worker.WORKDIR_LOCK, worker.WORKDIR_STATE) == (workdir_node.LOCK, workdir_node.STATE)
    from launcher.job.spec import JOB_ARGV_ENV
    assert worker.JOB_ARGV == JOB_ARGV_ENV


def test_a_command_runs_holding_its_copy(tmp_path):
    manifest, dest = shipped(tmp_path, "print('v1')\n")
    proc = run_worker(dest, manifest.digest, "exec", sys.executable, "-c", PROBE)
    assert (proc.returncode, proc.stdout) == (0, "held\n"), proc.stderr
    # Without launch's variables (no workdir shipped) nothing is held.
    bare = subprocess.run([sys.executable, str(WORKER), "exec", sys.executable, "-c",
                           "print('ran')"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("LAUNCH_WORKDIR")})
    assert (bare.returncode, bare.stdout) == (0, "ran\n")


def test_a_script_rank_runs_holding_its_copy(tmp_path):
    manifest, dest = shipped(tmp_path, PROBE)
    proc = run_worker(dest, manifest.digest, "script", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "held"


def test_a_copy_changed_by_another_launch_is_refused_before_the_job_runs(tmp_path):
    first, dest = shipped(tmp_path, "print('v1')\n")
    second, again = shipped(tmp_path, "print('v2')\n")   # nothing held it: same folder
    assert again == dest
    proc = run_worker(dest, first.digest, "script", "train.py")
    assert proc.returncode == 2
    assert "v1" not in proc.stdout and "v2" not in proc.stdout
    assert f"the shipped workdir {dest} no longer holds what this run shipped" in proc.stderr


def test_a_ship_with_other_content_goes_to_a_sibling_while_a_job_holds_the_copy(tmp_path):
    first, dest = shipped(tmp_path, "import time; time.sleep(30)\n")
    job = subprocess.Popen([sys.executable, str(WORKER), "script", "train.py"], cwd=dest,
                           env={**os.environ, "LAUNCH_WORKDIR": dest,
                                "LAUNCH_WORKDIR_DIGEST": first.digest},
                           stdout=subprocess.PIPE, text=True)
    try:
        assert "launch: worker rank" in job.stdout.readline()   # it holds the copy now
        second, other = shipped(tmp_path, "print('v2')\n")
        assert other != dest
        assert Path(dest, "train.py").read_text() == "import time; time.sleep(30)\n"
        assert Path(other, "train.py").read_text() == "print('v2')\n"
    finally:
        job.kill()
        job.wait()
