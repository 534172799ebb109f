"""Preflight over real SSH: each problem gets its own message; nothing starts anywhere."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import launch_cmd
from tests.run.conftest import write_recipe
from tests.ssh.conftest import (edit_inventory, make_venv_without_torch, new_key,
                                only_sshd_left, remote_run_dirs)

pytestmark = pytest.mark.lab


def _run(run_launch, tmp_path, inventory, *extra):
    recipe = write_recipe(tmp_path)
    return run_launch("run", "--nodes", "2", str(recipe), "-i", str(inventory),
                      "--run-id", "pre", *extra, timeout=120)


def _nothing_started(lab, tmp_path, proc):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nothing was started" in proc.stderr
    assert only_sshd_left(lab) == {}
    assert remote_run_dirs(lab, "pre") == []
    assert not (tmp_path / "runs").exists()


def test_unreachable_host(lab, run_launch, tmp_path):
    # An address in the lab's subnet where no host answers.
    dead = lab.subnet.rsplit(".", 1)[0] + ".99"
    inv = edit_inventory(lab, tmp_path, host1={"ansible_host": dead, "private_ip": dead})
    proc = _run(run_launch, tmp_path, inv)
    _nothing_started(lab, tmp_path, proc)
    assert f"host host1: cannot reach {dead}:22" in proc.stderr or \
        f"host host1: SSH to {dead}:22 timed out" in proc.stderr


def test_wrong_key(lab, run_launch, tmp_path):
    inv = edit_inventory(lab, tmp_path, host0={"ansible_ssh_private_key_file": new_key(tmp_path)})
    proc = _run(run_launch, tmp_path, inv)
    _nothing_started(lab, tmp_path, proc)
    assert "host host0: SSH authentication as 'root'" in proc.stderr
    assert "host1" not in proc.stderr  # only the broken host is named


def test_changed_host_key_is_refused_even_with_accept_new(lab, run_launch, tmp_path):
    known = tmp_path / "known_hosts"
    lines = lab.known_hosts.read_text().splitlines()
    other = (tmp_path / "k")
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    fake = other.with_suffix(".pub").read_text().split()
    lines[1] = f"{lab.hosts[1].address} {fake[0]} {fake[1]}"
    known.write_text("\n".join(lines) + "\n")
    inv = edit_inventory(lab, tmp_path)
    proc = _run(run_launch, tmp_path, inv, "--known-hosts", str(known), "--accept-new-host-keys")
    _nothing_started(lab, tmp_path, proc)
    assert "host host1: HOST KEY CHANGED" in proc.stderr
    assert known.read_text().count(lab.hosts[1].address) == 1  # nothing was added


@pytest.fixture(scope="module")
def accepted_run(module_lab, tmp_path_factory):
    """One known_hosts file that knows host0 only: a run refused for host1's unknown key, a dry
    run, then a real 2-step run with --accept-new-host-keys that records it. The real run also
    carries a node env file on host1 and a recipe env that overrides it, which the env-file
    test reads from its plan: one run for both tests (a run over the lab costs ~18 s of CPU).
    {"refused", "refused_left", "dry", "accepted": CompletedProcess, "known", "runs"}."""
    lab, base = module_lab, tmp_path_factory.mktemp("accept")
    env = {**os.environ, "LAUNCH_HOME": str(base / "launch-home")}

    def launch(*args, cwd, timeout=120):
        cwd.mkdir(exist_ok=True)
        return subprocess.run(launch_cmd(*args), cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)

    known = base / "known_hosts"
    known.write_text(lab.known_hosts.read_text().splitlines()[0] + "\n")  # host1 unknown
    found = {"known": known}
    refused_dir = base / "refused"
    refused_dir.mkdir()
    found["refused"] = launch("run", "--nodes", "2", str(write_recipe(refused_dir)), "-i",
                              str(lab.inventory), "--run-id", "pre", "--known-hosts", str(known),
                              cwd=refused_dir)
    found["refused_left"] = only_sshd_left(lab)
    found["refused_runs"] = (refused_dir / "runs").exists()
    found["dry"] = launch("run", "--nodes", "2", str(write_recipe(refused_dir)), "-i",
                          str(lab.inventory), "--known-hosts", str(known), "--dry-run",
                          cwd=refused_dir)
    # What `launch setup` writes for EFA (FI_PROVIDER=efa ...), on host1 only.
    env_file = base / "nccl.env"
    env_file.write_text("# written by launch setup\nFI_PROVIDER=efa\nNCCL_PROTO=Simple\n")
    inv = edit_inventory(lab, base, host1={"launch_env_file": str(env_file)})
    accept_dir = base / "accepted"
    accept_dir.mkdir()
    recipe = write_recipe(accept_dir, train={"steps": 2}, env={"NCCL_PROTO": "LL128"})
    found["accepted"] = launch("run", "--nodes", "2", str(recipe), "-i", str(inv),
                               "--known-hosts", str(known), "--accept-new-host-keys",
                               "--run-id", "accept", cwd=accept_dir, timeout=180)
    found["runs"] = accept_dir / "runs"
    return found


def test_unknown_host_key_refused_then_recorded_with_accept_new(lab, accepted_run):
    refused = accepted_run["refused"]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert "nothing was started" in refused.stderr
    assert accepted_run["refused_left"] == {}
    assert remote_run_dirs(lab, "pre") == []
    assert not accepted_run["refused_runs"]
    assert "host host1: the host key of" in refused.stderr
    assert "--accept-new-host-keys" in refused.stderr
    assert accepted_run["dry"].returncode == 0  # (a dry run connects to nothing)
    accepted = accepted_run["accepted"]
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    assert lab.hosts[1].address in accepted_run["known"].read_text()


def test_missing_torch(lab, run_launch, tmp_path):
    python = make_venv_without_torch(tmp_path / "venv")
    inv = edit_inventory(lab, tmp_path, host1={"launch_python": python})
    proc = _run(run_launch, tmp_path, inv)
    _nothing_started(lab, tmp_path, proc)
    assert f"host host1: {python} cannot import torch" in proc.stderr


def test_too_few_gpus(lab, run_launch, tmp_path):
    inv = edit_inventory(lab, tmp_path, host0={"gpus": 8})
    proc = _run(run_launch, tmp_path, inv)
    _nothing_started(lab, tmp_path, proc)
    assert "host host0: the inventory says gpus: 8 but torch sees 0" in proc.stderr


def test_all_problems_reported_together(lab, run_launch, tmp_path):
    python = make_venv_without_torch(tmp_path / "venv")
    inv = edit_inventory(lab, tmp_path, host0={"gpus": 2}, host1={"launch_python": python})
    proc = _run(run_launch, tmp_path, inv)
    _nothing_started(lab, tmp_path, proc)
    assert "preflight found 2 problem(s)" in proc.stderr
    assert "host host0:" in proc.stderr and "host host1:" in proc.stderr


def test_more_nodes_than_inventory_and_no_target(lab, run_launch, tmp_path):
    recipe = write_recipe(tmp_path)
    proc = run_launch("run", "--nodes", "3", str(recipe), "-i", str(lab.inventory))
    assert proc.returncode == 2
    assert "--nodes 3 asks for more hosts than the inventory holds (2: host0, host1)" in proc.stderr


def test_dry_run_connects_to_nothing(lab, run_launch, tmp_path):
    recipe = write_recipe(tmp_path, env={"X": "$(touch /tmp/nope)"})
    # The module's tests share the lab: what this test's run would log comes after this.
    logged = {h.name: (lab.dir / h.name / "sshd.log").stat().st_size for h in lab.hosts}
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(lab.inventory), "--dry-run",
                      "--json", "--run-id", "dry", check=True)
    import json

    plan = json.loads(proc.stdout)
    assert [n["address"] for n in plan["nodes"]] == [h.address for h in lab.hosts]
    assert plan["rendezvous"]["endpoint"] == f"{lab.hosts[0].address}:29500"
    assert plan["nodes"][1]["env"]["X"] == "$(touch /tmp/nope)"
    sshd_logs = [(lab.dir / h.name / "sshd.log").read_bytes()[logged[h.name]:] for h in lab.hosts]
    assert not any(b"Accepted publickey" in log for log in sshd_logs)
    assert remote_run_dirs(lab, "dry") == []


def test_node_env_file_reaches_every_rank_and_recipe_env_wins(lab, accepted_run):
    """What `launch setup` writes for EFA (FI_PROVIDER=efa ...) is picked up per node."""
    proc = accepted_run["accepted"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    plan = json.loads((accepted_run["runs"] / "accept/plan.json").read_text())
    host0, host1 = plan["nodes"]
    assert host1["env"]["FI_PROVIDER"] == "efa" and "FI_PROVIDER" not in host0["env"]
    assert host1["env"]["NCCL_PROTO"] == "LL128"  # the recipe overrides the node file
