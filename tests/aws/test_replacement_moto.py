"""A lost node's replacement on EC2 (launcher/provision/replacement.py), against moto's HTTP
server: what `launch run --recover` asks of the cluster, checked through the EC2 API. The
run's side (SSH, setup, check, gate, resume) is on the lab (tests/ssh/test_machine_loss.py):
moto's instances have addresses nothing answers on."""

from __future__ import annotations

import json

from launcher.cluster.inventory import load_inventory
from launcher.provision.replacement import Ec2Fleet, instance_gone
from tests.aws.test_provision_moto import base, instances, ledger


def test_a_stopped_spot_node_is_replaced_in_its_place_and_nothing_leaks(
        run_launch, ec2, key_pair, ubuntu_ami, tmp_path):
    run_launch(*base("demo", key_pair, ubuntu_ami, "--instance", "g6e.xlarge", "--count", "2",
                     "--no-placement-group", "--no-wait-ssh", "--market", "spot"), check=True)
    inventory = tmp_path / "launch-home" / "clusters" / "demo" / "inventory.yml"
    head, lost = load_inventory(inventory)
    assert (head.extra["launch_market"], ledger(tmp_path, "demo")["market"]) == ("spot", "spot")
    lost_id = lost.extra["instance_id"]
    ec2.stop_instances(InstanceIds=[lost_id])
    said: list[str] = []
    fleet = Ec2Fleet("demo", say=said.append)
    assert fleet.gone(head) is None
    assert fleet.gone(lost).startswith(f"instance {lost_id} is stopp")

    new = fleet.replace(lost)
    fleet.set_up(new)
    # The lost node's place: its name (the head stays the head), its zone and subnet, the
    # cluster's market; the lost instance is terminated, not left to bill its volumes.
    assert new.name == "demo-1" and new.extra["instance_id"] != lost_id
    alive = {i["InstanceId"]: i for i in instances(ec2, "demo")}
    assert set(alive) == {head.extra["instance_id"], new.extra["instance_id"]}
    replacement, first = alive[new.extra["instance_id"]], alive[head.extra["instance_id"]]
    assert (replacement["Placement"]["AvailabilityZone"], replacement["SubnetId"]) == \
        (first["Placement"]["AvailabilityZone"], first["SubnetId"])
    assert replacement.get("InstanceLifecycle") == "spot"
    assert [i["State"]["Name"] for i in instances(ec2, "demo", states=("terminated",))] == \
        ["terminated"]
    assert [n.name for n in load_inventory(inventory)] == ["demo-0", "demo-1"]
    assert load_inventory(inventory)[1].extra["instance_id"] == new.extra["instance_id"]
    assert "demo-1: setup skipped (the cluster was made with --skip-setup)" in said
    record = ledger(tmp_path, "demo")
    states = {r["id"]: r["state"] for r in record["resources"] if r["kind"] == "instance"}
    assert states[lost_id] == "deleted" and states[new.extra["instance_id"]] == "created"
    assert record["spec"]["skip_setup"] is True and record["spec"]["market"] == "spot"

    fleet.record({"run_id": "r1", "node": "demo-1", "why": "instance stopped",
                  "replacement": "demo-1", "replacement_id": new.extra["instance_id"],
                  "recovered_in_s": 300.0, "cost_usd": 0.1566})
    data = json.loads(run_launch("status", "--json", check=True).stdout)
    (row,) = [c for c in data["clusters"] if c["cluster"] == "demo"]
    assert (row["recoveries"], row["recovery_cost"], row["market"], row["nodes"]) == \
        (1, 0.16, "spot", 2)
    table = run_launch("status", check=True).stdout
    assert "RECOVERIES" in table and "1 ($0.16)" in table

    run_launch("teardown", "--cluster", "demo", check=True)
    assert instances(ec2, "demo") == []
    # Nothing the ledger knows is still alive: neither the lost node nor its replacement.
    assert [r for r in ledger(tmp_path, "demo")["resources"]
            if r["state"] in ("requested", "created")] == []


def test_what_ec2_says_of_a_node_that_is_gone():
    """DescribeInstances records as EC2 returns them (the StateReason of a reclaimed spot
    instance as AWS's Spot documentation shows it)."""
    spot = {"InstanceId": "i-0a1", "InstanceLifecycle": "spot",
            "State": {"Code": 48, "Name": "terminated"},
            "StateReason": {"Code": "Server.SpotInstanceTermination",
                            "Message": "Server.SpotInstanceTermination: Spot instance "
                                       "termination"}}
    assert instance_gone(spot, "i-0a1") == (
        "instance i-0a1 is terminated (Server.SpotInstanceTermination: Spot instance "
        "termination); EC2 reclaimed the spot instance")
    stopped = {"InstanceId": "i-0b2", "State": {"Code": 80, "Name": "stopped"},
               "StateReason": {"Code": "Client.UserInitiatedShutdown",
                               "Message": "Client.UserInitiatedShutdown: User initiated "
                                          "shutdown"}}
    assert instance_gone(stopped, "i-0b2") == ("instance i-0b2 is stopped "
                                               "(Client.UserInitiatedShutdown: User initiated "
                                               "shutdown)")
    assert instance_gone({"State": {"Name": "running"}}, "i-0c3") is None
    assert instance_gone(None, "i-0d4") == "instance i-0d4 no longer exists"
