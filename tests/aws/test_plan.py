"""The pure plan: exact values for the whole plan text, the EC2 request bodies, the EFA layout,
the public addressing, reservations, quotas and the TTL."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from launcher.cluster import catalog
from launcher.provision.interfaces import NetworkInterface
from launcher.provision.plan import (
    ProvisionSpec, ProvisionSpecError, QuotaExceeded, SiteFacts, Zone, check_quotas,
    normalize_cidr, parse_duration, parse_jump, plan_provision, ubuntu_ssm_parameter,
    validate_spec, dlami_ssm_parameter,
)
from launcher.provision import ttl
from launcher.provision.quotas import AccountFacts, QuotaReading, quota_group
from launcher.provision.render import render_plan
from launcher.provision.requests import rule_requests, run_instances_request
from launcher.provision.reservations import Reservation, ReservationMismatch
from launcher.provision.resources import number_nodes

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SITE = SiteFacts(
    region="us-east-1",
    zones=(Zone("us-east-1b", "subnet-0abc", "vpc-0def"), Zone("us-east-1c", "subnet-0c",
                                                               "vpc-0def")),
    ami_id="ami-0123456789abcdef0",
    ami_description="ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20250516",
    root_device="/dev/sda1", ssh_cidr="203.0.113.7/32",
    zone_order="every zone offering the type, in name order",
)
TAGS = [{"Key": "launch:cluster", "Value": "demo"}, {"Key": "created-by", "Value": "launch"},
        {"Key": "launch:created-at", "Value": "2025-06-01T12:00:00Z"},
        {"Key": "launch:expires-at", "Value": "2025-06-02T12:00:00Z"}]
ACCOUNT = AccountFacts(QuotaReading("Running On-Demand P instances", "L-417A185B", 384.0, 0.0),
                       QuotaReading("EC2-VPC Elastic IPs", "L-0263D0A3", 5.0, 1.0))


def plan_for(instance_type: str, count: int, site=SITE, account=None, **spec_changes):
    spec = ProvisionSpec(cluster="demo", instance_type=instance_type, count=count,
                         key_name="ops", inventory="/tmp/inv.yml", **spec_changes)
    return plan_provision(spec, site, catalog.lookup(instance_type), NOW, account)


def test_p4d_plan_text_is_exact():
    assert render_plan(plan_for("p4d.24xlarge", 2, account=ACCOUNT)) == """\
Provision plan for cluster demo
  region             us-east-1
  instance type      p4d.24xlarge x 2  (8x A100 40 GiB, NVSwitch, NVLink3 300 GB/s per GPU)
  facts from         built-in
  availability zone  us-east-1b  (subnet subnet-0abc, vpc-0def)
  zones to try       us-east-1b, us-east-1c  (every zone offering the type, in name order)
  AMI                ami-0123456789abcdef0  (ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20250516)
  root volume        200 GB gp3 on /dev/sda1, encrypted
  key pair           ops
  market             on-demand
  placement group    launch-demo-us-east-1b (cluster strategy, one per zone tried)
  interfaces         4 per instance, 4 EFA, 1 IP address (type limit 4 EFA, 4 cards)
    card 0 device 0 efa  (primary)
    cards 1-3 device 0 efa-only
  public address     head only: an Elastic IP on demo-0; the other nodes are reached through it (ProxyCommand)
  expiry             2025-06-02T12:00:00Z: each node powers itself off then and EC2 terminates it (a timer set from user data)
  security group     launch-demo in vpc-0def
    ingress all traffic from this security group (NCCL and EFA between the nodes)
    ingress tcp 22 from 203.0.113.7/32 (SSH)
    egress  all traffic to this security group (EFA between the nodes)
    egress  all traffic to 0.0.0.0/0 (AWS's default outbound rule: setup downloads packages)
  tags               launch:cluster=demo created-by=launch launch:created-at=2025-06-01T12:00:00Z launch:expires-at=2025-06-02T12:00:00Z
  quotas
    ok   Running On-Demand P instances (L-417A185B): needs 192 vCPUs, 384 of 384 free
    ok   EC2-VPC Elastic IPs (L-0263D0A3): needs 1 Elastic IP, 4 of 5 free
  cost               $43.92 per hour (2 x $21.96, us-east-1 on-demand list price, instances.vantage.sh copy of the AWS price list, 2026-08-26)
  then
    - wait until every instance is running and passes its status checks
    - allocate and associate an Elastic IP for the head node
    - wait for SSH and record the host keys (the other nodes through the head)
    - write the inventory /tmp/inv.yml
    - run `launch setup` on every node
"""  # noqa: E501


def nic(card, device, kind, **extra):
    spec = {"NetworkCardIndex": card, "DeviceIndex": device, "SubnetId": "subnet-0abc",
            "Groups": ["sg-0aaa"], "DeleteOnTermination": True}
    if kind != "interface":
        spec["InterfaceType"] = kind
    return {**spec, **extra}


def test_p4d_run_instances_request_has_one_ip_and_efa_only_cards():
    request = run_instances_request(plan_for("p4d.24xlarge", 2), "sg-0aaa", 2, "tok")
    assert request["NetworkInterfaces"] == [
        nic(0, 0, "efa"), nic(1, 0, "efa-only"), nic(2, 0, "efa-only"), nic(3, 0, "efa-only")]
    assert request["Placement"] == {"AvailabilityZone": "us-east-1b",
                                    "GroupName": "launch-demo-us-east-1b"}
    assert (request["MinCount"], request["MaxCount"]) == (2, 2)
    assert request["TagSpecifications"] == [
        {"ResourceType": rt, "Tags": TAGS + [{"Key": "Name", "Value": "demo"}]}
        for rt in ("instance", "volume", "network-interface")
    ]
    assert request["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled"}
    assert request["BlockDeviceMappings"] == [{"DeviceName": "/dev/sda1", "Ebs": {
        "VolumeSize": 200, "VolumeType": "gp3", "DeleteOnTermination": True,
        "Encrypted": True}}]
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert request["UserData"] == ttl.user_data("2025-06-02T12:00:00Z")
    assert "IamInstanceProfile" not in request and "InstanceMarketOptions" not in request


def test_efa_layouts_follow_the_cards_ec2_describes():
    def kinds(instance_type):
        return [(n.card, n.device, n.kind) for n in plan_for(instance_type, 2).interfaces]

    # p5: 32 cards, 32 EFA devices, one IP address instead of 32.
    p5 = kinds("p5.48xlarge")
    assert len(p5) == 32 and p5[0] == (0, 0, "efa")
    assert p5[1:] == [(c, 0, "efa-only") for c in range(1, 32)]
    assert len(kinds("p5en.48xlarge")) == 16 and len(kinds("p6-b200.48xlarge")) == 8
    # Single-card EFA types keep one interface (and so EC2's automatic public address).
    assert kinds("g6e.12xlarge") == [(0, 0, "efa")]
    assert kinds("p5.4xlarge") == [(0, 0, "efa")]
    assert plan_for("g6e.24xlarge", 2).interfaces == (
        NetworkInterface(0, 0, "efa"), NetworkInterface(1, 0, "efa-only"))
    assert kinds("g6e.xlarge") == [(0, 0, "interface")]


def test_efa_layout_without_efa_only_or_without_efa_on_card_0():
    base = catalog.lookup("p4d.24xlarge")
    no_efa_only = replace(base, cards=tuple(replace(c, interface_types=("interface", "efa"))
                                            for c in base.cards))
    spec = ProvisionSpec(cluster="demo", instance_type="p4d.24xlarge", count=2)
    plan = plan_provision(spec, SITE, no_efa_only, NOW)
    assert [(n.card, n.device, n.kind) for n in plan.interfaces] == [
        (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    # Like p6-b300 (DescribeInstanceTypes): card 0 is ENA only, the EFA budget goes elsewhere.
    ena_first = replace(base, efa_max_interfaces=3, cards=(replace(base.cards[0],
                        interface_types=("interface",)),) + base.cards[1:])
    plan = plan_provision(spec, SITE, ena_first, NOW)
    assert [(n.card, n.device, n.kind) for n in plan.interfaces] == [
        (0, 0, "interface"), (1, 0, "efa-only"), (2, 0, "efa-only"), (3, 0, "efa-only")]


@pytest.mark.parametrize("mode, instance_type, eips, auto, public", [
    ("head", "p4d.24xlarge", (0,), None, (0,)),
    ("all", "p4d.24xlarge", (0, 1, 2), None, (0, 1, 2)),
    ("none", "p4d.24xlarge", (), None, ()),
    ("head", "g6e.xlarge", (0,), False, (0,)),
    ("all", "g6e.xlarge", (), True, (0, 1, 2)),
    ("none", "g6e.xlarge", (), False, ()),
])
def test_public_addressing(mode, instance_type, eips, auto, public):
    plan = plan_for(instance_type, 3, public_ip=mode)
    assert (plan.elastic_ip_nodes, plan.auto_public_ip, plan.public_nodes) == \
        (eips, auto, public)
    interfaces = run_instances_request(plan, "sg-0aaa", 3, "t")["NetworkInterfaces"]
    if auto is None:
        assert all("AssociatePublicIpAddress" not in n for n in interfaces)
    else:
        assert [n["AssociatePublicIpAddress"] for n in interfaces] == [auto]


def test_g6e_xlarge_single_spot_node_without_ttl_or_encryption():
    plan = plan_for("g6e.xlarge", 1, market="spot", ttl_hours=0, encrypt_root=False,
                    instance_profile="s3-checkpoints")
    request = run_instances_request(plan, "sg-0aaa", 1, "tok")
    assert request["NetworkInterfaces"] == [nic(0, 0, "interface",
                                                AssociatePublicIpAddress=False)]
    assert request["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert request["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    assert request["IamInstanceProfile"] == {"Name": "s3-checkpoints"}
    assert "Encrypted" not in request["BlockDeviceMappings"][0]["Ebs"]
    assert "UserData" not in request and "InstanceInitiatedShutdownBehavior" not in request
    assert plan.placement_group is None and plan.elastic_ip_nodes == (0,)
    assert plan.tags["launch:expires-at"] == "never" and plan.expires_at is None
    assert plan.cost_per_hour == 1.861


def test_security_rules_reference_the_group_and_the_cidr_only():
    def body(permission):
        return {"GroupId": "sg-0aaa", "IpPermissions": [permission]}

    assert rule_requests(plan_for("g6e.12xlarge", 2), "sg-0aaa") == [
        ("ingress", body({"IpProtocol": "-1", "UserIdGroupPairs": [
            {"GroupId": "sg-0aaa", "Description": "NCCL and EFA between the nodes"}]})),
        ("ingress", body({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                          "IpRanges": [{"CidrIp": "203.0.113.7/32", "Description": "SSH"}]})),
        ("egress", body({"IpProtocol": "-1", "UserIdGroupPairs": [
            {"GroupId": "sg-0aaa", "Description": "EFA between the nodes"}]})),
    ]


def test_zone_failover_plan_gets_a_placement_group_per_zone():
    plan = plan_for("p4d.24xlarge", 2)
    moved = plan.in_zone(SITE.zones[1])
    assert (moved.site.az, moved.site.subnet_id, moved.placement_group) == \
        ("us-east-1c", "subnet-0c", "launch-demo-us-east-1c")
    request = run_instances_request(moved, "sg-1", 2, "t")
    assert request["Placement"] == {"AvailabilityZone": "us-east-1c",
                                    "GroupName": "launch-demo-us-east-1c"}
    assert {n["SubnetId"] for n in request["NetworkInterfaces"]} == {"subnet-0c"}


BLOCK = Reservation(id="cr-0aaa", kind="capacity-block", state="active", az="us-east-1b",
                    instance_type="p5.48xlarge", available=2, total=2,
                    placement_group="ultra-cluster-7", start="2025-06-01T11:30:00Z",
                    end="2025-06-03T11:30:00Z", match_criteria="targeted")


def test_capacity_block_launches_in_its_group_with_its_market_type():
    plan = plan_for("p5.48xlarge", 2, site=replace(SITE, reservation=BLOCK),
                    capacity_reservation="cr-0aaa")
    request = run_instances_request(plan, "sg-0aaa", 2, "tok")
    assert request["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert request["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0aaa"}}
    assert request["Placement"] == {"AvailabilityZone": "us-east-1b",
                                    "GroupName": "ultra-cluster-7"}
    assert not plan.owns_placement_group
    # A zone move never renames the reservation's group.
    assert plan.in_zone(SITE.zones[0]).placement_group == "ultra-cluster-7"
    assert "placement group    ultra-cluster-7 (the reservation's, used as it is)" in \
        render_plan(plan)
    assert plan.quotas == ()


@pytest.mark.parametrize("changes, spec, message", [
    ({"instance_type": "p4d.24xlarge"}, {},
     "Capacity Block cr-0aaa is for p4d.24xlarge, not p5.48xlarge"),
    ({"available": 1}, {},
     r"has room for 1 more p5.48xlarge \(of 2\), fewer than the 2 to launch"),
    ({"state": "expired"}, {}, r"Capacity Block cr-0aaa is expired \(it ended "
                               r"2025-06-03T11:30:00Z\), not active"),
    ({"state": "scheduled", "start": "2025-06-01T15:15:00Z"}, {},
     "Capacity Block cr-0aaa is not active yet: it starts at 2025-06-01T15:15:00Z "
     r"\(in 3 h 15 min\); run again then"),
    ({}, {"az": "us-east-1c"}, "is in us-east-1b, not --az us-east-1c"),
    ({}, {"subnet": "subnet-0c"}, "is in us-east-1b, but --subnet subnet-0c is in us-east-1c"),
    ({}, {"placement_group": False}, "was made in cluster placement group ultra-cluster-7 and "
                                     "must be launched into it"),
    ({"placement_group": None}, {"placement_group": True}, "was not made in a placement group"),
])
def test_mismatched_reservations_are_refused(changes, spec, message):
    site = replace(SITE, reservation=replace(BLOCK, **changes))
    if spec.get("subnet"):
        site = replace(site, zones=(SITE.zones[1],))
    with pytest.raises(ReservationMismatch, match=message):
        plan_for("p5.48xlarge", 2, site=site, capacity_reservation="cr-0aaa", **spec)


def test_quotas_refuse_what_cannot_fit():
    short = AccountFacts(QuotaReading("Running On-Demand P instances", "L-417A185B", 96.0, 0.0),
                         QuotaReading("EC2-VPC Elastic IPs", "L-0263D0A3", 5.0, 0.0))
    plan = plan_for("p4d.24xlarge", 2, account=short)
    assert [(q.name, q.status) for q in plan.quotas] == [
        ("Running On-Demand P instances", "short"), ("EC2-VPC Elastic IPs", "ok")]
    with pytest.raises(QuotaExceeded) as caught:
        check_quotas(plan)
    assert str(caught.value) == (
        "cluster demo does not fit the account's quotas in us-east-1, so nothing was created: "
        "Running On-Demand P instances (L-417A185B) needs 192 vCPUs but only 96 of 96 are free "
        "(0 in use); ask for more: aws service-quotas request-service-quota-increase "
        "--service-code ec2 --quota-code L-417A185B --desired-value 192 --region us-east-1 (or "
        "the Service Quotas console), or pass a smaller --count")
    six = plan_for("p4d.24xlarge", 6, account=replace(ACCOUNT, vcpus=QuotaReading(
        "Running On-Demand P instances", "L-417A185B", 1152.0, 0.0)), public_ip="all")
    assert [q.status for q in six.refusals] == ["short"]
    assert "needs 6 Elastic IPs but only 4 of 5 are free (1 in use); release unused " \
           "addresses" in six.refusals[0].detail
    head = plan_for("p4d.24xlarge", 6, account=replace(ACCOUNT, vcpus=QuotaReading(
        "Running On-Demand P instances", "L-417A185B", 1152.0, 0.0)))
    assert head.refusals == () and head.elastic_ip_nodes == (0,)
    assert head.quotas[1].detail == "needs 1 Elastic IP, 4 of 5 free"


def test_unknown_quotas_warn_and_reservations_skip_the_vcpu_check():
    unknown = AccountFacts(QuotaReading("Running On-Demand G and VT instances", "L-DB2E81BA",
                                        None, None, "no permission: AccessDeniedException"),
                           QuotaReading("EC2-VPC Elastic IPs", "L-0263D0A3", 5.0, 0.0))
    plan = plan_for("g6e.xlarge", 1, account=unknown)
    assert plan.refusals == ()
    assert ("quota Running On-Demand G and VT instances: not known (no permission: "
            "AccessDeniedException); provisioning goes ahead") in plan.warnings
    assert quota_group("p5en.48xlarge") == "P" and quota_group("g6e.xlarge") == "G" and \
        quota_group("vt1.3xlarge") == "G" and quota_group("c7i.large") is None


def test_existing_nodes_reduce_what_the_quotas_must_fit():
    account = replace(ACCOUNT, vcpus=QuotaReading("Running On-Demand P instances", "L-417A185B",
                                                  192.0, 192.0),
                      existing_instances=2, existing_elastic_ips=1)
    plan = plan_for("p4d.24xlarge", 3, account=account)
    assert (plan.existing, plan.missing) == (2, 1)
    assert [(q.need, q.status) for q in plan.quotas] == [(96, "short"), (0, "not-needed")]


def test_ipv6_and_open_cidr():
    assert normalize_cidr("203.0.113.77/24") == "203.0.113.0/24"
    assert normalize_cidr(" 2001:db8::1 ") == "2001:db8::1/128"
    plan = plan_provision(
        ProvisionSpec(cluster="demo", instance_type="g6e.xlarge", inventory="i.yml"),
        replace(SITE, ssh_cidr="0.0.0.0/0"), catalog.lookup("g6e.xlarge"), NOW)
    assert "SSH is open to the whole internet (0.0.0.0/0), as --ssh-cidr asked" in plan.warnings
    v6 = plan_provision(
        ProvisionSpec(cluster="demo", instance_type="g6e.xlarge", inventory="i.yml"),
        replace(SITE, ssh_cidr="2001:db8::1/128"), catalog.lookup("g6e.xlarge"), NOW)
    assert rule_requests(v6, "sg-1")[1][1]["IpPermissions"][0]["Ipv6Ranges"] == [
        {"CidrIpv6": "2001:db8::1/128", "Description": "SSH"}]
    with pytest.raises(ProvisionSpecError, match="not an address or CIDR"):
        normalize_cidr("my-laptop")


@pytest.mark.parametrize("changes, message", [
    ({"cluster": "Demo_1"}, "cluster name 'Demo_1' is not usable"),
    ({"count": 0}, "--count must be at least 1"),
    ({"market": "spot", "capacity_reservation": "cr-1"}, "--spot and --capacity-reservation"),
    ({"placement_group": True}, "--placement-group needs --count of 2 or more"),
    ({"disk_gb": 8}, "--disk-gb 8 is too small"),
    ({"ttl_hours": -1}, "--ttl must be 0"),
    ({"public_ip": "some"}, "--public-ip some is not one of head, all, none"),
    ({"jump": "-oProxyCommand=x"}, "--jump '-oProxyCommand=x' is not"),
    ({"ami": "ami-1", "image": "dlami"}, "--ami and --image dlami exclude each other"),
    ({"fallback_regions": ("us-west-2",), "az": "us-east-1a"},
     "--az belong.s. to one region, but --region lists several"),
])
def test_invalid_requests_are_named(changes, message):
    spec = replace(ProvisionSpec(cluster="demo", instance_type="g6e.xlarge"), **changes)
    with pytest.raises(ProvisionSpecError, match=message):
        validate_spec(spec)


def test_durations_and_jump_hosts():
    assert [parse_duration(t) for t in ("8h", "90m", "2d", "1.5", "0")] == \
        [8.0, 1.5, 48.0, 1.5, 0.0]
    with pytest.raises(ProvisionSpecError, match="not a duration"):
        parse_duration("8 hours")
    jump = parse_jump("ec2-user@bastion.example.com:2222")
    assert (jump.user, jump.host, jump.port, str(jump)) == \
        ("ec2-user", "bastion.example.com", 2222, "ec2-user@bastion.example.com:2222")
    assert str(parse_jump("10.0.0.5")) == "10.0.0.5"


def test_image_ssm_parameters():
    assert ubuntu_ssm_parameter("22.04", "x86_64") == (
        "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id")
    assert ubuntu_ssm_parameter("24.04", "arm64") == (
        "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id")
    assert dlami_ssm_parameter("22.04", "x86_64") == (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/"
        "ami-id")
    plan = plan_for("p4d.24xlarge", 2, image="dlami")
    assert "run `launch setup --tags python_env,node_facts`" in plan.steps[-1]


def test_ttl_user_data_sets_a_persistent_timer_at_the_expiry():
    script = ttl.user_data("2025-06-02T12:00:00Z")
    assert script.startswith("#!/bin/sh\n")
    assert script.endswith("/usr/local/sbin/launch-ttl 2025-06-02T12:00:00Z\n")
    assert "OnCalendar=$when" in script and "Persistent=true" in script
    assert "ExecStart=/bin/systemctl poweroff" in script
    sh = shutil.which("sh")
    if sh:
        assert subprocess.run([sh, "-n"], input=script, text=True).returncode == 0
    with pytest.raises(ValueError):
        ttl.user_data("tomorrow; rm -rf /")
    assert ttl.set_command("2025-06-02T20:00:00Z") == \
        "sudo -n /usr/local/sbin/launch-ttl 2025-06-02T20:00:00Z"
    analyze = shutil.which("systemd-analyze")
    if analyze:
        # The helper turns the ISO time into this OnCalendar value; systemd must accept it.
        proc = subprocess.run([analyze, "calendar", "2025-06-02 12:00:00 UTC"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_nodes_keep_their_index_across_re_runs():
    def inst(iid, launched, index, name=None):
        tags = [{"Key": "Name", "Value": name}] if name else []
        return {"InstanceId": iid, "LaunchTime": launched, "AmiLaunchIndex": index, "Tags": tags}

    # demo-0 was replaced: the newcomer (launched last) takes the free index 0; demo-1 stays.
    numbered = number_nodes("demo", [
        inst("i-c", "2025-06-01 13:00", 0),
        inst("i-b", "2025-06-01 12:00", 1, "demo-1"),
        inst("i-d", "2025-06-01 13:00", 1),
    ])
    assert [(n, i["InstanceId"]) for n, i in numbered] == [(0, "i-c"), (1, "i-b"), (2, "i-d")]
