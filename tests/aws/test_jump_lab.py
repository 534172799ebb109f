"""One public address per cluster, on the SSH lab: only the head (host0) is on a network this
machine reaches; host1 sits on a private network behind it, as `launch provision --public-ip
head` leaves an EC2 cluster. `launch run -i` (fabric's gateway), OpenSSH and Ansible with the
inventory's ProxyCommand (the connection `launch setup` uses), the host-key scan of `provision`
and `launch extend` all go through the head, and every host key is still checked."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest
import yaml

from launcher.cluster.inventory import load_inventory
from launcher.core.bundled import playbooks_dir
from launcher.lab.hosts import Lab
from launcher.provision import hostkeys
from launcher.provision.ledger import Ledger
from tests.run.conftest import write_recipe
from tests.ssh.conftest import only_sshd_left, run_env_pids

pytestmark = [pytest.mark.lab]


def _host_key(lab: Lab, host: str) -> str:
    return " ".join((lab.dir / host / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def test_only_the_head_answers_ssh_from_here(private_lab):
    head, worker = private_lab.hosts
    assert hostkeys.scan(head.address, timeout=5) == _host_key(private_lab, "host0")
    # No SSH server answers at the worker's address from this machine (the sandbox's network
    # may accept the TCP connection, but nothing behind it speaks SSH).
    with pytest.raises((OSError, paramiko.SSHException, EOFError)):
        hostkeys.scan(worker.address, timeout=3)
    nodes = load_inventory(private_lab.inventory)
    assert nodes[1].address == worker.address != nodes[0].address
    assert "ProxyCommand=ssh" in nodes[1].extra["ansible_ssh_common_args"]


def test_host_key_scan_through_the_head(private_lab):
    """What `provision` does before writing known_hosts: the worker's key, read through the
    head, is the worker's own; a head with an unexpected key is refused."""
    head, worker = private_lab.hosts
    tunnel = hostkeys.Tunnel(head.address, 22, "root", str(private_lab.key),
                             [_host_key(private_lab, "host0")])
    try:
        assert hostkeys.wait_for_ssh([worker.address], timeout=20, tunnel=tunnel) == \
            {worker.address: _host_key(private_lab, "host1")}
    finally:
        tunnel.close()
    wrong = hostkeys.Tunnel(head.address, 22, "root", str(private_lab.key),
                            [_host_key(private_lab, "host1")])
    with pytest.raises(hostkeys.HostKeyMismatch, match="jump host"):
        hostkeys.wait_for_ssh([worker.address], timeout=20, tunnel=wrong)


def test_openssh_uses_the_inventory_proxy_command(private_lab):
    """Ansible's ssh connection plugin runs OpenSSH with ansible_ssh_common_args split by
    shlex: the same argv reaches host1 through the head."""
    ssh = shutil.which("ssh")
    if ssh is None:
        pytest.skip("OpenSSH client (ssh) is not installed")
    node = load_inventory(private_lab.inventory)[1]
    argv = [ssh, "-i", str(private_lab.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            *shlex.split(node.extra["ansible_ssh_common_args"]), f"root@{node.address}",
            "ip -o -4 addr show priv0"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert f"inet {node.address}/" in proc.stdout


def test_ansible_reaches_every_host_through_the_head(private_lab):
    """`launch setup` runs ansible-playbook with the bundled ansible.cfg on this inventory: the
    same connection, here with an ad-hoc ping, reaches host1 only through the head."""
    ansible = Path(sys.executable).with_name("ansible")
    if not ansible.exists():
        pytest.skip(f"{ansible} is missing: install ansible-core")
    env = {**os.environ, "ANSIBLE_CONFIG": str(playbooks_dir() / "ansible.cfg")}
    proc = subprocess.run(
        [str(ansible), "all", "-i", str(private_lab.inventory), "-m", "ping",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count('"ping": "pong"') == 2, proc.stdout


@pytest.mark.slow
def test_launch_run_through_the_head(private_lab, run_launch, tmp_path):
    recipe = write_recipe(tmp_path, train={"steps": 10, "log_every": 5})
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(private_lab.inventory),
                      "--run-id", "jump", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs/jump/summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 10
    assert [n["name"] for n in summary["nodes"]] == ["host0", "host1"]
    # host1 ran and its logs were fetched through the head.
    assert "host1/0: rank " in (tmp_path / "runs/jump/host1/node.log").read_text()
    assert list((tmp_path / "runs/jump/host1").glob("torchrun/*/attempt_0/0/stdout.log"))
    # Nothing of the run is left on either host (sshd's own per-connection processes of the
    # earlier host-key scans may still be closing).
    assert run_env_pids(private_lab, "host0", "jump") == [] == \
        run_env_pids(private_lab, "host1", "jump")
    left = {host: [p for p in procs if not p.startswith("sshd")]
            for host, procs in only_sshd_left(private_lab).items()}
    assert all(not procs for procs in left.values()), left


def test_a_changed_worker_key_is_refused_through_the_head(private_lab, run_launch, tmp_path):
    """Host keys are checked for every node: the worker's recorded key replaced by another
    host's key stops the run before anything starts, naming host1."""
    known = (private_lab.known_hosts.read_text().replace(
        _host_key(private_lab, "host1"), _host_key(private_lab, "host0")))
    forged = tmp_path / "known_hosts"
    forged.write_text(known)
    data = yaml.safe_load(private_lab.inventory.read_text())
    text = yaml.safe_dump(data, sort_keys=False).replace(str(private_lab.known_hosts),
                                                         str(forged))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(text)
    recipe = write_recipe(tmp_path)
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(inventory),
                      "--run-id", "forged", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "host host1: HOST KEY CHANGED for " + \
        f"{private_lab.hosts[1].address}:22 (through {private_lab.hosts[0].address})" \
        in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not Path(tmp_path / "runs").exists()


def _connections_to_sshd(address: str) -> int:
    """This process's established TCP connections to address:22."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "dst", f"{address}:22"],
                         capture_output=True, text=True, check=True).stdout
    return sum(f"pid={os.getpid()}," in line for line in out.splitlines())


def test_a_node_that_fails_behind_the_head_leaves_no_connection_to_the_head(private_lab,
                                                                            tmp_path):
    """connect() opens the head's connection for a node behind it; when the node cannot be
    reached, or its own key file is missing, no connection to the head stays open (one was
    left open per failed node)."""
    from launcher.cluster.ssh import HostProblem, connect
    from launcher.cluster.ssh_options import SshOptions

    head = private_lab.hosts[0]
    nodes = load_inventory(private_lab.inventory)
    before = _connections_to_sshd(head.address)
    for broken in (replace(nodes[1], address="172.31.255.254"),
                   replace(nodes[1], key_file=str(tmp_path / "no-such-key"))):
        with pytest.raises(HostProblem):
            connect(broken, SshOptions(connect_timeout=3.0))
    assert _connections_to_sshd(head.address) == before


def _fake_cluster(ec2, lab: Lab, tmp_path: Path, ubuntu_ami: str) -> tuple[Path, Path]:
    """Cluster "lab": two moto instances carrying its tags, a ledger, and an inventory of the
    lab hosts whose TTL helper is a stand-in (the lab hosts share this machine's systemd)."""
    cluster_tags = [{"Key": "launch:cluster", "Value": "lab"},
                    {"Key": "created-by", "Value": "launch"},
                    {"Key": "launch:created-at", "Value": "2025-06-01T12:00:00Z"},
                    {"Key": "launch:expires-at", "Value": "2025-06-02T12:00:00Z"}]
    ec2.run_instances(ImageId=ubuntu_ami, InstanceType="g6e.xlarge", MinCount=2, MaxCount=2,
                      TagSpecifications=[{"ResourceType": "instance", "Tags": cluster_tags}])
    calls = tmp_path / "ttl-calls"
    setter = tmp_path / "fake-launch-ttl"
    setter.write_text(
        "#!/bin/sh\n"
        f"if [ -e {tmp_path}/fail-on ] && hostname -I | grep -qw \"$(cat {tmp_path}/fail-on)\";"
        " then echo 'launch-ttl: no systemd here' >&2; exit 3; fi\n"
        f"echo \"$(hostname -I) $1\" >> {calls}\n")
    setter.chmod(0o755)
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["vars"]["launch_ttl_setter"] = str(setter)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    ledger = Ledger.open("lab", "us-east-1")
    ledger.update(status="ready", inventory=str(inventory), created_at="2025-06-01T12:00:00Z",
                  expires_at="2025-06-02T12:00:00Z", instance_type="g6e.xlarge")
    return calls, inventory


def test_extend_moves_every_timer_through_the_head_then_the_tags(
        private_lab, run_launch, ec2, ubuntu_ami, tmp_path):
    calls, _ = _fake_cluster(ec2, private_lab, tmp_path, ubuntu_ami)
    (tmp_path / "fail-on").write_text(private_lab.hosts[1].address)
    failed = run_launch("extend", "--cluster", "lab", "--ttl", "4h")
    assert failed.returncode == 1, failed.stderr
    assert "cluster lab: the expiry could not be moved on host1 (" in failed.stderr
    assert "launch-ttl: no systemd here" in failed.stderr
    assert "the tags still say 2025-06-02T12:00:00Z" in failed.stderr
    tagged = {t["Value"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"] for t in i["Tags"] if t["Key"] == "launch:expires-at"}
    assert tagged == {"2025-06-02T12:00:00Z"}

    (tmp_path / "fail-on").unlink()
    calls.write_text("")
    done = run_launch("extend", "--cluster", "lab", "--ttl", "4h", check=True)
    lines = calls.read_text().splitlines()
    expiry = lines[0].split()[-1]
    assert sorted(line.split()[0] for line in lines) == sorted(
        [private_lab.hosts[0].address, private_lab.hosts[1].address])
    assert {line.split()[-1] for line in lines} == {expiry}
    assert f"Cluster lab: 2 node(s) now power off and terminate at {expiry}" in done.stdout
    tagged = {t["Value"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"] for t in i["Tags"] if t["Key"] == "launch:expires-at"}
    assert tagged == {expiry}
    assert Ledger.load("lab").data["expires_at"] == expiry
    status = json.loads(run_launch("status", "--json", check=True).stdout)
    [row] = [c for c in status["clusters"] if c["cluster"] == "lab"]
    assert row["expires_at"] == expiry and 3.9 < row["hours_left"] <= 4.0
