"""`launch lab up --slurm` / `launch lab down`: a Slurm cluster made and removed, with what ran
in it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from launcher.lab.slurm import slurm_lab_unavailable_reason
from tests.run.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_lab_up_runs_jobs_and_down_removes_everything(run_launch, tmp_path):
    reason = slurm_lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    lab_dir = tmp_path / "lab"
    up = run_launch("lab", "up", "--slurm", "--hosts", "2", "--dir", str(lab_dir), timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((lab_dir / "slurm-lab.json").read_text())
    try:
        assert f"export SLURM_CONF={lab_dir / 'slurm.conf'}" in up.stdout
        env = {**os.environ, "SLURM_CONF": str(lab_dir / "slurm.conf")}
        sinfo = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t %c"], env=env,
                               capture_output=True, text=True, timeout=30)
        assert sinfo.stdout.split("\n")[:2] == [f"{h['name']} idle 1" for h in state["hosts"]]
        # A job on both hosts: each task sees its own hostname and address.
        srun = subprocess.run(["srun", "--nodes=2", "--label", "sh", "-c",
                               "echo $(hostname) $(hostname -I)"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert sorted(srun.stdout.split("\n")[:2]) == [
            f"{i}: {h['name']} {h['address']}" for i, h in enumerate(state["hosts"])]
        # One left running when the lab goes.
        host = state["hosts"][0]
        job = subprocess.run(["sbatch", "--parsable", f"--nodelist={host['name']}",
                              "--output=/dev/null", "--wrap=sleep 300"], env=env,
                             capture_output=True, text=True, timeout=30)
        assert job.returncode == 0, job.stderr
        try:
            wait_for(lambda: len(_netns_pids(host["netns"])) > 1, 30, "the job on the first host")
        except AssertionError:
            print(subprocess.run(["squeue"], env=env, capture_output=True, text=True).stdout)
            print(subprocess.run(["sinfo"], env=env, capture_output=True, text=True).stdout)
            print(host, _netns_pids(host["netns"]))
            print((lab_dir / "nodes" / host["name"] / "slurmd.log").read_text()[-3000:])
            raise
        running = _netns_pids(host["netns"])
    finally:
        down = run_launch("lab", "down", "--dir", str(lab_dir), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not lab_dir.exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(h["netns"] not in netns for h in state["hosts"])
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert state["bridge"] not in links
    daemons = [state["munged_pid"], state["slurmctld_pid"],
               *(h["slurmd_pid"] for h in state["hosts"])]
    assert not [pid for pid in daemons + running if _alive(pid)]


def _netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_lab_whose_slurmd_died_says_so_and_comes_back(slurm_lab):
    """What the tests' check after each test on the lab finds and mends (tests/labs.py)."""
    host = slurm_lab.hosts[0]
    dead = host.slurmd_pid
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: not _alive(dead), 10, "slurmd gone")
    problems = slurm_lab.problems(timeout=1)
    # (sinfo may still say idle: slurmctld notices a silent slurmd only at its next ping)
    assert any(line.startswith(f"{host.name}: ") and f"its slurmd (pid {dead}) is gone" in line
               for line in problems), problems
    assert any(line.endswith(f"nodes/{host.name}/slurmd.log") for line in problems)
    done = slurm_lab.heal()
    assert len(done) == 1 and f"{host.name} was " in done[0], done
    assert f"its slurmd started again (pid {host.slurmd_pid})" in done[0]
    assert slurm_lab.problems(timeout=1) == [] and host.slurmd_pid != dead
    # And it runs jobs on both hosts again.
    srun = slurm_lab.client(["srun", "--nodes=2", "--label", "hostname"], timeout=60)
    assert sorted(srun.stdout.split()) == sorted(
        [f"{i}:" for i in range(2)] + [h.name for h in slurm_lab.hosts]), srun.stderr


def test_a_lab_cut_off_from_a_host_says_so_and_is_made_again(slurm_lab):
    host = slurm_lab.hosts[1]
    # Its link down, and the node out of service (slurmctld notices a silent node only at
    # its next ping, up to 100 s later: drained here at once instead).
    subprocess.run(["ip", "link", "set", host.veth, "down"], check=True)
    slurm_lab.client(["scontrol", "update", f"NodeName={host.name}", "State=DRAIN",
                      "Reason=cut off by a test"])
    problems = slurm_lab.problems(timeout=1)
    assert any(line.startswith(f"{host.name}: drain") and
               "is running, its port does not answer from here" in line
               for line in problems), problems
    old = {h.name for h in slurm_lab.hosts}
    slurm_lab.rebuild()
    assert slurm_lab.problems(timeout=1) == []
    assert not old & {h.name for h in slurm_lab.hosts}
    srun = slurm_lab.client(["srun", "--nodes=2", "hostname"], timeout=60)
    assert sorted(srun.stdout.split()) == sorted(h.name for h in slurm_lab.hosts), srun.stderr
