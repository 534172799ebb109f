"""Waiting for SSH and recording host keys, against a real SSH server (paramiko's server side on a
loopback port) and cloud-init's console format; the inventory that names the key file."""

from __future__ import annotations

import socket
import threading
from datetime import datetime, timezone

import paramiko
import pytest

from launcher.cluster import catalog
from launcher.cluster.inventory import Node, load_inventory
from launcher.cluster.ssh import known_hosts_for
from launcher.provision import hostkeys
from launcher.provision.hostkeys import HostKey, HostKeyMismatch, SshWaitError
from launcher.provision.ledger import Ledger
from launcher.provision.plan import ProvisionSpec, SiteFacts, Zone, plan_provision
from launcher.provision.provisioner import Provisioner


@pytest.fixture(scope="module")
def ssh_server():
    """An SSH server on 127.0.0.1 offering a fresh RSA host key; yields (port, "type base64")."""
    key = paramiko.RSAKey.generate(2048)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transports.append(transport)
            transport.add_server_key(key)
            try:
                transport.start_server(server=paramiko.ServerInterface())
            except (paramiko.SSHException, EOFError, OSError):
                pass  # the client hung up once it had the key: what a key scan does

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], f"{key.get_name()} {key.get_base64()}"
    listener.close()
    for transport in transports:
        transport.close()


def test_scan_reads_the_offered_host_key(ssh_server):
    port, key = ssh_server
    assert hostkeys.scan("127.0.0.1", port) == key


def test_wait_names_the_hosts_that_never_answer(ssh_server):
    port, _ = ssh_server
    sleeps: list[float] = []
    with pytest.raises(SshWaitError) as caught:
        # Nothing listens on 127.0.0.2 (the server is bound to 127.0.0.1 only).
        hostkeys.wait_for_ssh(["127.0.0.1", "127.0.0.2"], port=port, timeout=0.3, delay=0.1,
                              sleep=sleeps.append)
    text = str(caught.value)
    assert "SSH did not answer within 0 s on 127.0.0.2 (" in text
    assert "127.0.0.1" not in text and "--ssh-cidr" in text


def test_wait_returns_every_key(ssh_server):
    port, key = ssh_server
    assert hostkeys.wait_for_ssh(["127.0.0.1"], port=port, timeout=5) == {"127.0.0.1": key}


CONSOLE = """\
[   18.201] cloud-init[1012]: Cloud-init v. 24.1 finished
<14>Jun  1 12:00:01 ec2: #############################################################
<14>Jun  1 12:00:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
<14>Jun  1 12:00:01 ec2: 256 SHA256:abc root@ip-172-31-0-4 (ED25519)
<14>Jun  1 12:00:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----
-----BEGIN SSH HOST KEY KEYS-----
ecdsa-sha2-nistp256 AAAAE2VjZHNh root@ip-172-31-0-4
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 root@ip-172-31-0-4
-----END SSH HOST KEY KEYS-----
"""


def test_console_keys_and_trust():
    assert hostkeys.console_keys(CONSOLE) == [
        "ecdsa-sha2-nistp256 AAAAE2VjZHNh", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5"]
    assert hostkeys.trusted_keys("198.51.100.4", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5",
                                 CONSOLE) == [
        HostKey("198.51.100.4", "ecdsa-sha2-nistp256 AAAAE2VjZHNh", True),
        HostKey("198.51.100.4", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5", True)]
    assert hostkeys.trusted_keys("198.51.100.4", "ssh-rsa AAAB", "booting...") == [
        HostKey("198.51.100.4", "ssh-rsa AAAB", False)]
    with pytest.raises(HostKeyMismatch, match="198.51.100.4 offered SSH host key ssh-rsa"):
        hostkeys.trusted_keys("198.51.100.4", "ssh-rsa AAAB", CONSOLE)


def test_known_hosts_replaces_reused_addresses(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("198.51.100.4 ssh-rsa OLD\n198.51.100.9 ssh-rsa KEEP\n")
    hostkeys.write_known_hosts(path, [HostKey("198.51.100.4", "ssh-ed25519 NEW", True)])
    assert path.read_text() == "198.51.100.9 ssh-rsa KEEP\n198.51.100.4 ssh-ed25519 NEW\n"


def test_inventory_names_the_known_hosts_file_for_ansible_and_launch_run(tmp_path):
    """`launch run`'s SSH executor (launcher/cluster/ssh.py) must find the file provisioning wrote."""
    site = SiteFacts(region="us-east-1", zones=(Zone("us-east-1a", "subnet-1", "vpc-1"),),
                     ami_id="ami-1", ami_description="ubuntu", root_device="/dev/sda1",
                     ssh_cidr="203.0.113.7/32")
    inventory = tmp_path / "inventory.yml"
    plan = plan_provision(ProvisionSpec(cluster="demo", instance_type="g6e.xlarge",
                                        inventory=str(inventory)),
                          site, catalog.lookup("g6e.xlarge"), datetime.now(timezone.utc))
    worker = Provisioner(None, plan, Ledger.open("demo", "us-east-1", home=tmp_path),
                         wait_ssh=True, keep_on_failure=False)
    known = tmp_path / "clusters" / "demo" / "known_hosts"
    worker.write_inventory([Node(name="demo-0", address="198.51.100.4",
                                 private_address="172.31.0.4", gpus=1)], known)
    [node] = load_inventory(inventory)
    assert known_hosts_for(node, None) == known
    assert "-o StrictHostKeyChecking=yes" in node.extra["ansible_ssh_common_args"]
