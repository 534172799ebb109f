"""Node-to-node SSH for mpirun (role cluster_ssh) between two fresh Debian 12 roots.

Open MPI's daemons start each other over SSH, from any node to any other. After `launch setup`
each node reaches the other with the cluster key, and knows the other's host key: the check is
an ssh in BatchMode, which refuses an unknown host key instead of asking, under the
`StrictHostKeyChecking yes` setup wrote. (That a second run changes nothing, cluster_ssh
included, test_apply.py shows on one node.)
"""

from __future__ import annotations

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.lab]


@pytest.fixture(scope="module")
def cluster(make_node, tmp_path_factory):
    nodes = [make_node("node0"), make_node("node1", second=True)]
    hosts = {}
    for node in nodes:
        hostvars = yaml.safe_load(node.write_inventory(node.workdir / "one.yml").read_text())
        hosts[node.name] = hostvars["all"]["hosts"][node.name]
    inventory = tmp_path_factory.mktemp("cluster") / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}, sort_keys=False))
    return nodes, inventory


@pytest.fixture(scope="module")
def first(cluster, launch_setup):
    _, inventory = cluster
    return launch_setup("-i", str(inventory), "--tags", "cluster_ssh")


def test_every_node_reaches_every_other_with_checked_host_keys(cluster, first):
    nodes, inventory = cluster
    assert first.proc.returncode == 0, first.output
    for node in nodes:
        for peer in nodes:
            said = node.ssh("ssh", peer.address, "hostname")
            assert said.stdout.strip() == peer.name, (node.name, peer.name, said.stderr)
        known = node.ssh("cat", "/root/.ssh/known_hosts").stdout.splitlines()
        assert sorted(line.split()[0] for line in known) == sorted(p.address for p in nodes)
        for peer in nodes:
            key = peer.ssh("cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[:2]
            assert f"{peer.address} {' '.join(key)}" in known
    # One key pair for the cluster, kept next to the inventory (no cluster name given).
    assert (inventory.parent / "ssh" / "launch_cluster_ed25519").exists()


def test_a_host_whose_key_is_not_known_is_refused(cluster, first):
    nodes, _ = cluster
    node0 = nodes[0]
    node0.ssh("cp", "/root/.ssh/known_hosts", "/root/.ssh/known_hosts.kept")
    try:
        node0.ssh("sh", "-c", f"grep -v '^{nodes[1].address} ' /root/.ssh/known_hosts.kept "
                              "> /root/.ssh/known_hosts")
        refused = node0.ssh("ssh", nodes[1].address, "hostname", check=False)
        assert refused.returncode == 255
        assert "Host key verification failed" in refused.stderr
    finally:
        node0.ssh("mv", "/root/.ssh/known_hosts.kept", "/root/.ssh/known_hosts")

