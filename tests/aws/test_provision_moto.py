"""`launch provision / teardown / status` as a user runs them, against moto's HTTP server.

Results are checked through the EC2 API (boto3 against the same server), not through launch.
moto's instances have made-up addresses nothing answers on, so these runs pass --no-wait-ssh
(except the Ctrl-C test, which interrupts that very wait) and --skip-setup. moto lacks
CreatePlacementGroup, so multi-node runs pass --no-placement-group (test_stubbed.py covers it).
moto's Service Quotas knows no EC2 quotas: the vCPU check is "unknown" here (a warning), the
Elastic IP check is real (DescribeAccountAttributes: vpc-max-elastic-ips 5).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from launcher.cluster import catalog
from launcher.cluster.inventory import load_inventory
from launcher.provision import ttl
from launcher.provision.ledger import Ledger
from launcher.provision.plan import ProvisionSpec, SiteFacts, Zone, plan_provision
from launcher.provision.provisioner import Provisioner

CIDR = "203.0.113.7/32"


def base(cluster: str, key_pair: str, ami: str, *extra: str) -> list[str]:
    return ["provision", "--cluster", cluster, "--key-name", key_pair, "--ami", ami,
            "--ssh-cidr", CIDR, "--skip-setup", *extra]


def instances(ec2, cluster: str, states=("pending", "running")) -> list[dict]:
    reservations = ec2.describe_instances(Filters=[
        {"Name": "tag:launch:cluster", "Values": [cluster]},
        {"Name": "instance-state-name", "Values": list(states)},
    ])["Reservations"]
    return sorted((i for r in reservations for i in r["Instances"]),
                  key=lambda i: i["InstanceId"])


def groups(ec2, cluster: str) -> list[dict]:
    return ec2.describe_security_groups(
        Filters=[{"Name": "tag:launch:cluster", "Values": [cluster]}])["SecurityGroups"]


def tags(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def ledger(tmp_path: Path, cluster: str) -> dict:
    return json.loads((tmp_path / "launch-home" / "clusters" / cluster / "ledger.json")
                      .read_text())


@pytest.fixture
def two_nodes(run_launch, ec2, key_pair, ubuntu_ami, tmp_path):
    """A provisioned 2 x g6e.xlarge cluster "demo", and the CLI result."""
    proc = run_launch(*base("demo", key_pair, ubuntu_ami, "--instance", "g6e.xlarge",
                            "--count", "2", "--no-placement-group", "--no-wait-ssh"), check=True)
    return proc


def test_provision_two_instances_writes_inventory_tags_and_rules(two_nodes, ec2, tmp_path):
    made = instances(ec2, "demo")
    assert len(made) == 2
    assert {i["InstanceType"] for i in made} == {"g6e.xlarge"}
    for inst in made:
        t = tags(inst)
        assert t["launch:cluster"] == "demo" and t["created-by"] == "launch"
        assert t["launch:created-at"] < t["launch:expires-at"]
        assert inst["KeyName"] == "launch-test"
        assert inst["Placement"]["AvailabilityZone"] == "us-east-1a"
    volume_ids = [m["Ebs"]["VolumeId"] for i in made for m in i["BlockDeviceMappings"]]
    volumes = ec2.describe_volumes(VolumeIds=volume_ids)["Volumes"]
    assert {tags(v)["launch:cluster"] for v in volumes} == {"demo"}
    assert {v["Encrypted"] for v in volumes} == {True}

    [group] = groups(ec2, "demo")
    assert group["GroupName"] == "launch-demo"
    assert tags(group)["created-by"] == "launch"
    ingress = group["IpPermissions"]
    self_rule = [p for p in ingress if p["IpProtocol"] == "-1"]
    assert [pair["GroupId"] for p in self_rule for pair in p["UserIdGroupPairs"]] == \
        [group["GroupId"]]
    ssh = [p for p in ingress if p["IpProtocol"] == "tcp"]
    assert [(p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]]) for p in ssh] == \
        [(22, 22, [CIDR])]
    assert not any(r["CidrIp"] == "0.0.0.0/0" for p in ingress for r in p.get("IpRanges", []))
    egress_self = [pair["GroupId"] for p in group["IpPermissionsEgress"]
                   for pair in p.get("UserIdGroupPairs", [])]
    assert egress_self == [group["GroupId"]]
    assert {g["GroupId"] for i in made for n in i["NetworkInterfaces"] for g in n["Groups"]} == \
        {group["GroupId"]}

    # One public address per cluster: the head's Elastic IP; demo-1 has none and is reached
    # through the head.
    [address] = ec2.describe_addresses(
        Filters=[{"Name": "tag:launch:cluster", "Values": ["demo"]}])["Addresses"]
    inventory = tmp_path / "launch-home" / "clusters" / "demo" / "inventory.yml"
    nodes = load_inventory(inventory)
    by_id = {i["InstanceId"]: i for i in instances(ec2, "demo")}
    assert [n.name for n in nodes] == ["demo-0", "demo-1"]
    head, worker = nodes
    head_interfaces = {n["NetworkInterfaceId"] for n in
                       by_id[head.extra["instance_id"]]["NetworkInterfaces"]}
    assert address["NetworkInterfaceId"] in head_interfaces
    assert (head.address, head.private_address) == \
        (address["PublicIp"], by_id[head.extra["instance_id"]]["PrivateIpAddress"])
    assert "PublicIpAddress" not in by_id[worker.extra["instance_id"]]
    assert worker.address == worker.private_address == \
        by_id[worker.extra["instance_id"]]["PrivateIpAddress"]
    assert f"-W %h:%p ubuntu@{head.address}" in worker.extra["ansible_ssh_common_args"]
    assert "ProxyCommand" not in head.extra["ansible_ssh_common_args"]
    for node in nodes:
        inst = by_id[node.extra["instance_id"]]
        assert (node.user, node.gpus, node.python, node.instance_type) == \
            ("ubuntu", 1, "/opt/launch/venv/bin/python", "g6e.xlarge")
        assert tags(inst)["Name"] == node.name
    assert f"inventory   {inventory}" in two_nodes.stdout
    assert "tear down   launch teardown --cluster demo" in two_nodes.stdout
    assert "$3.72 per hour (us-east-1 on-demand list price, EC2 on-demand price page, " \
           "2025-05)" in two_nodes.stdout
    assert f"via {head.address}" in two_nodes.stdout

    record = ledger(tmp_path, "demo")
    assert record["status"] == "ready"
    live = sorted((r["kind"], r["id"]) for r in record["resources"] if r["state"] == "created")
    assert live == sorted([("security-group", group["GroupId"]),
                           ("elastic-ip", address["AllocationId"])] +
                          [("instance", i["InstanceId"]) for i in made])


def test_ttl_is_the_shutdown_behaviour_and_the_user_data(run_launch, ec2, key_pair, ubuntu_ami):
    run_launch(*base("ttl", key_pair, ubuntu_ami, "--instance", "g6e.xlarge", "--ttl", "8h",
                     "--no-wait-ssh"), check=True)
    [inst] = instances(ec2, "ttl")
    expires = tags(inst)["launch:expires-at"]
    created = tags(inst)["launch:created-at"]
    assert (datetime.fromisoformat(expires[:-1]) - datetime.fromisoformat(created[:-1])) \
        .total_seconds() == 8 * 3600
    behaviour = ec2.describe_instance_attribute(
        InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    user_data = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"],
                                                Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(user_data).decode()
    assert script == ttl.user_data(expires)
    assert script.endswith(f"/usr/local/sbin/launch-ttl {expires}\n")


def test_expired_nodes_ended_themselves_and_teardown_removes_the_rest(two_nodes, run_launch,
                                                                     ec2, tmp_path):
    """What the node-side timer leads to: the instances terminate themselves; the security
    group and the Elastic IP stay until `launch teardown`, which still finds and deletes them."""
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in instances(ec2, "demo")])
    done = run_launch("teardown", "--cluster", "demo", check=True)
    assert "Cluster demo torn down in us-east-1: deleted 2 resource(s)." in done.stdout
    assert groups(ec2, "demo") == [] and ec2.describe_addresses()["Addresses"] == []
    assert ledger(tmp_path, "demo")["status"] == "deleted"


def test_provisioning_twice_creates_nothing_new(two_nodes, run_launch, ec2, key_pair, ubuntu_ami,
                                                tmp_path):
    before = [i["InstanceId"] for i in instances(ec2, "demo")]
    inventory = (tmp_path / "launch-home" / "clusters" / "demo" / "inventory.yml").read_text()
    again = run_launch(*base("demo", key_pair, ubuntu_ami, "--instance", "g6e.xlarge",
                             "--count", "2", "--no-placement-group", "--no-wait-ssh"), check=True)
    assert "all 2 instance(s) of cluster demo exist; creating none" in again.stderr
    assert "creating security group" not in again.stderr
    assert [i["InstanceId"] for i in instances(ec2, "demo")] == before
    assert len(groups(ec2, "demo")) == 1
    assert len(ec2.describe_instances()["Reservations"]) == 1
    assert (tmp_path / "launch-home" / "clusters" / "demo" / "inventory.yml").read_text() == \
        inventory


def test_more_instances_than_asked_is_reported_as_a_leak(two_nodes, run_launch, ec2, key_pair,
                                                         ubuntu_ami, tmp_path):
    proc = run_launch(*base("demo", key_pair, ubuntu_ami, "--instance", "g6e.xlarge",
                            "--count", "1", "--no-wait-ssh"))
    assert proc.returncode == 2
    ids = [i["InstanceId"] for i in instances(ec2, "demo")]
    assert "cluster demo already has 2 instances tagged launch:cluster=demo" in proc.stderr
    assert "may be a leak" in proc.stderr and "launch teardown --cluster demo" in proc.stderr
    assert all(i in proc.stderr for i in ids)
    assert len(ids) == 2   # neither used nor terminated behind the user's back
    assert ledger(tmp_path, "demo")["status"] == "ready"

    other = run_launch(*base("demo", key_pair, ubuntu_ami, "--instance", "g6e.2xlarge",
                             "--count", "2", "--no-placement-group", "--no-wait-ssh"))
    assert other.returncode == 2
    assert "cluster demo already exists with instance type g6e.xlarge; you asked for " \
           "g6e.2xlarge. Run `launch teardown --cluster demo` first" in other.stderr
    assert [i["InstanceId"] for i in instances(ec2, "demo")] == ids


def test_teardown_leaves_nothing_and_is_safe_to_repeat(two_nodes, run_launch, ec2, tmp_path):
    ids = [i["InstanceId"] for i in instances(ec2, "demo")]
    plan = run_launch("teardown", "--cluster", "demo", "--dry-run", check=True)
    assert all(f"instance {i} (running)" in plan.stdout for i in ids)
    assert "DryRun ok" in plan.stdout and len(instances(ec2, "demo")) == 2

    done = run_launch("teardown", "--cluster", "demo", check=True)
    # Two instances, the security group and the head's Elastic IP.
    assert "Cluster demo torn down in us-east-1: deleted 4 resource(s)." in done.stdout
    assert instances(ec2, "demo", states=("pending", "running", "stopping", "stopped")) == []
    assert [i["State"]["Name"] for i in instances(ec2, "demo", states=("terminated",))] == \
        ["terminated", "terminated"]
    assert groups(ec2, "demo") == []
    record = ledger(tmp_path, "demo")
    assert record["status"] == "deleted"
    assert {r["state"] for r in record["resources"] if r["kind"] != "instance-launch"} == \
        {"deleted"}
    assert not (tmp_path / "launch-home" / "clusters" / "demo" / "inventory.yml").exists()

    again = run_launch("teardown", "--cluster", "demo", check=True)
    assert "Cluster demo: nothing to tear down in us-east-1." in again.stdout


def test_failure_at_the_second_creating_call_leaves_nothing(run_launch, ec2, ubuntu_ami,
                                                            tmp_path):
    """The security group is created, then RunInstances fails (moto validates key pairs here,
    as EC2 does): the group must be deleted again and no instance may run."""
    proc = run_launch(*base("broken", "no-such-key", ubuntu_ami, "--instance", "g6e.xlarge",
                            "--count", "2", "--no-placement-group", "--no-wait-ssh"))
    assert proc.returncode == 2
    assert "RunInstances for 2 x g6e.xlarge in us-east-1a failed: InvalidKeyPair.NotFound" \
        in proc.stderr
    assert "Cluster broken: cleaned up: nothing this run created remains" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert instances(ec2, "broken", states=("pending", "running", "stopped")) == []
    assert groups(ec2, "broken") == []
    record = ledger(tmp_path, "broken")
    assert [(r["kind"], r["state"]) for r in record["resources"]] == [
        ("security-group", "deleted"), ("instance-launch", "failed")]
    assert record["status"] == "deleted"


def test_keep_on_failure_keeps_and_names_what_remains(run_launch, ec2, ubuntu_ami):
    proc = run_launch(*base("kept", "no-such-key", ubuntu_ami, "--instance", "g6e.xlarge",
                            "--keep-on-failure", "--no-wait-ssh"))
    [group] = groups(ec2, "kept")
    assert proc.returncode == 2
    assert f"kept, as --keep-on-failure asks: security group {group['GroupId']}" in proc.stderr
    assert "run `launch teardown --cluster kept` to remove what remains" in proc.stderr
    run_launch("teardown", "--cluster", "kept", check=True)
    assert groups(ec2, "kept") == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_while_waiting_for_ssh_terminates_what_was_created(aws_env, ec2, key_pair,
                                                                     ubuntu_ami, tmp_path,
                                                                     signum):
    home = tmp_path / "launch-home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher",
         *base("intr", key_pair, ubuntu_ami, "--instance", "g6e.xlarge", "--count", "2",
               "--no-placement-group")],
        cwd=tmp_path, env={**os.environ, "LAUNCH_HOME": str(home)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    ledger_file = home / "clusters" / "intr" / "ledger.json"
    try:
        deadline = time.monotonic() + 60
        # moto's addresses never answer SSH: the run sits in the SSH wait until interrupted.
        while not (ledger_file.exists() and
                   json.loads(ledger_file.read_text()).get("phase") == "waiting for SSH"):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "provisioning never reached the SSH wait"
            time.sleep(0.1)
        assert len(instances(ec2, "intr")) == 2
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "provisioning of cluster intr interrupted; cleaned up: nothing this run created " \
           "remains" in err
    assert instances(ec2, "intr", states=("pending", "running", "stopping", "stopped")) == []
    assert groups(ec2, "intr") == []
    assert ledger(tmp_path, "intr")["status"] == "deleted"


def test_dry_run_creates_nothing_and_checks_permissions(run_launch, ec2, key_pair, ubuntu_ami,
                                                        tmp_path):
    proc = run_launch(*base("dry", key_pair, ubuntu_ami, "--instance", "g6e.xlarge",
                            "--count", "2", "--no-placement-group", "--dry-run"), check=True)
    assert "Provision plan for cluster dry" in proc.stdout
    assert "    ok   CreateSecurityGroup: would succeed (security group launch-dry)" in proc.stdout
    assert "    ok   RunInstances: would succeed (2 x g6e.xlarge in us-east-1a)" in proc.stdout
    assert "    ok   AllocateAddress: would succeed (an Elastic IP for the head)" in proc.stdout
    assert "zones to try       us-east-1a, us-east-1b, us-east-1c, us-east-1d" in proc.stdout
    assert "Dry run: nothing was created." in proc.stdout
    assert ec2.describe_instances()["Reservations"] == []
    assert groups(ec2, "dry") == []
    assert not (tmp_path / "launch-home" / "clusters" / "dry").exists()

    as_json = json.loads(run_launch(*base("dry", key_pair, ubuntu_ami, "--instance",
                                          "p4d.24xlarge", "--count", "1", "--dry-run", "--json"),
                                    check=True).stdout)
    assert len(as_json["plan"]["interfaces"]) == 4
    assert [c["operation"] for c in as_json["checks"]] == [
        "CreateSecurityGroup", "RunInstances", "AllocateAddress"]
    assert ec2.describe_instances()["Reservations"] == []


def test_offline_dry_run_needs_no_credentials(run_launch, offline_env):
    proc = run_launch("provision", "--instance", "p4d.24xlarge", "--count", "2", "--cluster",
                      "lab", "--dry-run", check=True)
    assert "placement group    launch-lab-<zone> (cluster strategy, one per zone tried)" \
        in proc.stdout
    assert "not looked up: no AWS credentials" in proc.stdout
    assert "not looked up: SSH CIDR: could not find this machine's public address" in proc.stdout
    keyless = run_launch("provision", "--instance", "p4d.24xlarge", "--cluster", "lab")
    assert keyless.returncode == 2 and "pass --key-name with an EC2 key pair" in keyless.stderr
    real = run_launch("provision", "--instance", "p4d.24xlarge", "--cluster", "lab",
                      "--key-name", "ops")
    assert real.returncode == 2 and "no AWS credentials found" in real.stderr


def test_p4d_nodes_get_elastic_ips_that_teardown_releases(run_launch, ec2, key_pair,
                                                          ubuntu_ami, tmp_path):
    run_launch(*base("big", key_pair, ubuntu_ami, "--instance", "p4d.24xlarge", "--count", "2",
                     "--public-ip", "all", "--no-placement-group", "--no-wait-ssh"), check=True)
    made = instances(ec2, "big")
    addresses = ec2.describe_addresses(
        Filters=[{"Name": "tag:launch:cluster", "Values": ["big"]}])["Addresses"]
    assert len(made) == 2 and len(addresses) == 2
    primaries = {n["NetworkInterfaceId"] for i in made for n in i["NetworkInterfaces"]
                 if n["Attachment"]["DeviceIndex"] == 0
                 and n["Attachment"].get("NetworkCardIndex", 0) == 0}
    assert {a["NetworkInterfaceId"] for a in addresses} == primaries
    nodes = load_inventory(tmp_path / "launch-home" / "clusters" / "big" / "inventory.yml")
    assert sorted(n.address for n in nodes) == sorted(a["PublicIp"] for a in addresses)
    assert {n.gpus for n in nodes} == {8}
    run_launch(*base("big", key_pair, ubuntu_ami, "--instance", "p4d.24xlarge", "--count", "2",
                     "--public-ip", "all", "--no-placement-group", "--no-wait-ssh"), check=True)
    assert len(ec2.describe_addresses()["Addresses"]) == 2   # the re-run allocated none

    run_launch("teardown", "--cluster", "big", check=True)
    assert ec2.describe_addresses()["Addresses"] == []
    assert instances(ec2, "big") == [] and groups(ec2, "big") == []


def test_six_p4d_with_five_free_elastic_ips(run_launch, ec2, key_pair, ubuntu_ami, tmp_path):
    """--public-ip all would need 6 Elastic IPs where the region allows 5: refused before any
    creating call. The default (head) allocates exactly one."""
    args = base("six", key_pair, ubuntu_ami, "--instance", "p4d.24xlarge", "--count", "6",
                "--no-placement-group", "--no-wait-ssh")
    refused = run_launch(*args, "--public-ip", "all")
    assert refused.returncode == 2, refused.stderr
    assert ("cluster six does not fit the account's quotas in us-east-1, so nothing was "
            "created: EC2-VPC Elastic IPs (L-0263D0A3) needs 6 Elastic IPs but only 5 of 5 are "
            "free (0 in use); release unused addresses") in refused.stderr
    assert "Traceback" not in refused.stderr
    assert groups(ec2, "six") == [] and ec2.describe_instances()["Reservations"] == []
    assert ec2.describe_addresses()["Addresses"] == []
    assert not (tmp_path / "launch-home" / "clusters" / "six" / "ledger.json").exists()

    run_launch(*args, check=True)
    assert len(instances(ec2, "six")) == 6
    [address] = ec2.describe_addresses()["Addresses"]
    head = load_inventory(tmp_path / "launch-home" / "clusters" / "six" / "inventory.yml")[0]
    assert (head.name, head.address) == ("six-0", address["PublicIp"])


def test_p5en_dry_run_plans_the_efa_layout_ec2_describes(run_launch, ec2, key_pair, ubuntu_ami):
    proc = run_launch(*base("p5en", key_pair, ubuntu_ami, "--instance", "p5en.48xlarge",
                            "--count", "2", "--dry-run", "--json"))
    data = json.loads(proc.stdout)
    plan = data["plan"]
    assert plan["count"] == 2 and plan["instance"]["instance_type"] == "p5en.48xlarge"
    assert plan["instance"]["source"] == "built-in + DescribeInstanceTypes us-east-1"
    # DescribeInstanceTypes: 16 network cards, each taking interface, efa and efa-only, at most
    # 16 EFA interfaces: one EFA with the instance's address, 15 EFA-only without.
    assert [(n["card"], n["device"], n["kind"]) for n in plan["interfaces"]] == \
        [(0, 0, "efa")] + [(c, 0, "efa-only") for c in range(1, 16)]
    # moto offers p5en in two zones of us-east-1.
    assert [z["az"] for z in plan["site"]["zones"]] == ["us-east-1a", "us-east-1c"]
    assert plan["placement_group"] == "launch-p5en-us-east-1a"
    # Every DryRun check passes but CreatePlacementGroup, which moto does not implement (the
    # Stubber tests cover it); a failed check makes the dry run exit 1.
    assert {c["operation"]: c["ok"] for c in data["checks"]} == {
        "CreateSecurityGroup": True, "CreatePlacementGroup": False, "RunInstances": True,
        "AllocateAddress": True}
    assert proc.returncode == 1
    # moto answers an API it lacks with an HTML error page, which is said as such.
    assert ("us-east-1: 1 problem(s): placement group launch-p5en-us-east-1a: no usable answer "
            "(a web page (HTTP 500) came back instead of AWS's answer)") in proc.stderr
    assert ec2.describe_instances()["Reservations"] == []


class _AddressEcho(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"198.51.100.23\n")

    def log_message(self, *args):
        pass


def test_ssh_cidr_defaults_to_the_callers_address_or_refuses(run_launch, ec2, key_pair,
                                                            ubuntu_ami):
    args = ["provision", "--cluster", "mine", "--key-name", key_pair, "--ami", ubuntu_ami,
            "--instance", "g6e.xlarge", "--skip-setup", "--no-wait-ssh"]
    refused = run_launch(*args)   # aws_env points the address look-up at a closed port
    assert refused.returncode == 2
    assert "could not find this machine's public address" in refused.stderr
    assert "pass --ssh-cidr" in refused.stderr
    assert ec2.describe_security_groups(GroupNames=["default"])  # the account is reachable
    assert groups(ec2, "mine") == [] and instances(ec2, "mine") == []

    server = http.server.HTTPServer(("127.0.0.1", 0), _AddressEcho)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        run_launch(*args, env={"LAUNCH_PUBLIC_IP_URL": url}, check=True)
    finally:
        server.shutdown()
    [group] = groups(ec2, "mine")
    cidrs = [r["CidrIp"] for p in group["IpPermissions"] for r in p["IpRanges"]]
    assert cidrs == ["198.51.100.23/32"]


def test_no_ubuntu_parameter_asks_for_ami(run_launch, ec2, key_pair):
    """moto serves no Canonical SSM parameters, like a region where they are missing."""
    proc = run_launch("provision", "--cluster", "noami", "--instance", "g6e.xlarge",
                      "--key-name", key_pair, "--ssh-cidr", CIDR, "--dry-run")
    assert proc.returncode == 2
    assert ("AWS's public parameter /aws/service/canonical/ubuntu/server/22.04/stable/current/"
            "amd64/hvm/ebs-gp2/ami-id does not exist in us-east-1") in proc.stderr
    assert "pass --ami" in proc.stderr


def test_status_lists_ledger_and_tagged_clusters_and_flags_expired(two_nodes, run_launch, ec2,
                                                                   ubuntu_ami):
    # A cluster launched from another machine (no ledger here) whose expiry has passed.
    ec2.run_instances(ImageId=ubuntu_ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                      TagSpecifications=[{"ResourceType": "instance", "Tags": [
                          {"Key": "launch:cluster", "Value": "old"},
                          {"Key": "created-by", "Value": "launch"},
                          {"Key": "launch:created-at", "Value": "2020-01-01T00:00:00Z"},
                          {"Key": "launch:expires-at", "Value": "2020-01-02T00:00:00Z"}]}])
    proc = run_launch("status", check=True)
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:]}
    assert rows["demo"][:5] == ["demo", "us-east-1", "g6e.xlarge", "2", "ready"]
    assert "EXPIRED" not in " ".join(rows["demo"])
    assert rows["old"][:5] == ["old", "us-east-1", "g6e.xlarge", "1", "untracked"]
    assert "EXPIRED: launch teardown --cluster old" in proc.stdout
    data = json.loads(run_launch("status", "--json", check=True).stdout)
    by_name = {c["cluster"]: c for c in data["clusters"]}
    assert by_name["old"]["expired"] is True and by_name["demo"]["expired"] is False
    assert by_name["old"]["uptime_hours"] > 24 * 365
    assert by_name["demo"]["cost_so_far"] >= 0


def test_instances_of_a_launch_whose_answer_was_lost_are_cleaned_up(ec2, ubuntu_ami, tmp_path):
    """Ctrl-C during RunInstances: EC2 may have launched, launch never heard. The cleanup finds
    the instances by the call's idempotency token (in moto, through the real API)."""
    cluster_tags = [{"Key": "launch:cluster", "Value": "lost"},
                    {"Key": "created-by", "Value": "launch"}]
    ec2.run_instances(ImageId=ubuntu_ami, InstanceType="g6e.xlarge", MinCount=2, MaxCount=2,
                      ClientToken="launch-lost-0001", TagSpecifications=[
                          {"ResourceType": "instance", "Tags": cluster_tags}])
    ec2.run_instances(ImageId=ubuntu_ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                      ClientToken="launch-lost-0000", TagSpecifications=[
                          {"ResourceType": "instance", "Tags": cluster_tags}])
    site = SiteFacts(region="us-east-1", zones=(Zone("us-east-1a", "subnet-x", "vpc-x"),),
                     ami_id=ubuntu_ami, ami_description="ubuntu", root_device="/dev/sda1",
                     ssh_cidr=CIDR)
    plan = plan_provision(ProvisionSpec(cluster="lost", instance_type="g6e.xlarge", count=3,
                                        inventory=str(tmp_path / "inv.yml")),
                          site, catalog.lookup("g6e.xlarge"), datetime.now(timezone.utc))
    said: list[str] = []
    worker = Provisioner(ec2, plan, Ledger.open("lost", "us-east-1", home=tmp_path),
                         wait_ssh=False, keep_on_failure=False, say=said.append)
    worker.unanswered["launch-lost-0001"] = 2
    interrupt = KeyboardInterrupt()
    assert worker.clean_up_after(interrupt) is interrupt
    left = instances(ec2, "lost", states=("pending", "running"))
    # The earlier run's instance (another token) is not this run's to delete.
    assert [i["ClientToken"] for i in left] == ["launch-lost-0000"]
    assert sorted(r["kind"] + ":" + r["state"] for r in worker.ledger.resources) == \
        ["instance:deleted", "instance:deleted"]
    assert any(s.startswith("terminated ") for s in said)
