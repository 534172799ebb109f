"""The pure plan: exact values for the whole plan text and the EC2 request bodies."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from launcher import catalog
from launcher.provision.plan import (
    NetworkInterface, ProvisionSpec, ProvisionSpecError, SiteFacts, normalize_cidr,
    plan_provision, render_plan, rule_requests, run_instances_request, ubuntu_ssm_parameter,
    validate_spec,
)
from launcher.provision.resources import number_nodes

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SITE = SiteFacts(
    region="us-east-1", az="us-east-1b", subnet_id="subnet-0abc", vpc_id="vpc-0def",
    ami_id="ami-0123456789abcdef0",
    ami_description="ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20250516",
    root_device="/dev/sda1", ssh_cidr="203.0.113.7/32",
)
TAGS = [{"Key": "launch:cluster", "Value": "demo"}, {"Key": "created-by", "Value": "launch"},
        {"Key": "launch:created-at", "Value": "2025-06-01T12:00:00Z"},
        {"Key": "launch:expires-at", "Value": "2025-06-02T12:00:00Z"}]


def plan_for(instance_type: str, count: int, **spec_changes):
    spec = ProvisionSpec(cluster="demo", instance_type=instance_type, count=count,
                         key_name="ops", inventory="/tmp/inv.yml", **spec_changes)
    return plan_provision(spec, SITE, catalog.lookup(instance_type), NOW)


def test_p4d_plan_text_is_exact():
    assert render_plan(plan_for("p4d.24xlarge", 2)) == """\
Provision plan for cluster demo
  region             us-east-1
  instance type      p4d.24xlarge x 2  (8x A100 40 GiB, NVSwitch, NVLink3 300 GB/s per GPU)
  availability zone  us-east-1b  (subnet subnet-0abc, vpc-0def)
  AMI                ami-0123456789abcdef0  (ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20250516)
  root volume        200 GB gp3 on /dev/sda1
  key pair           ops
  market             on-demand
  placement group    launch-demo (cluster strategy)
  EFA interfaces     4 per instance (type limit 4, 4 cards)
    card 0 device 0 efa  (primary)
    card 1 device 1 efa
    card 2 device 1 efa
    card 3 device 1 efa
  public address     one Elastic IP per instance
  security group     launch-demo in vpc-0def
    ingress all traffic from this security group (NCCL and EFA between the nodes)
    ingress tcp 22 from 203.0.113.7/32 (SSH)
    egress  all traffic to this security group (EFA between the nodes)
    egress  all traffic to 0.0.0.0/0 (AWS's default outbound rule: setup downloads packages)
  tags               launch:cluster=demo created-by=launch launch:created-at=2025-06-01T12:00:00Z launch:expires-at=2025-06-02T12:00:00Z
  cost               $65.55 per hour (2 x $32.77 on-demand, us-east-1 list price of 2025-05)
  then
    - wait until every instance is running and passes its status checks
    - allocate and associate one Elastic IP per instance
    - wait for SSH and record the host keys
    - write the inventory /tmp/inv.yml
    - run `launch setup` on every node
  warning: each instance gets 4 network interfaces, and EC2 gives no automatic public IPv4 address to such instances: launch allocates one Elastic IP per instance (the default quota is 5 per region)
"""  # noqa: E501


def test_p4d_run_instances_request_has_one_efa_interface_per_card():
    request = run_instances_request(plan_for("p4d.24xlarge", 2), "sg-0aaa", 2, "tok")
    assert request["NetworkInterfaces"] == [
        {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1,
         "SubnetId": "subnet-0abc", "Groups": ["sg-0aaa"], "DeleteOnTermination": True,
         "InterfaceType": "efa"}
        for card in range(4)
    ]
    assert request["Placement"] == {"AvailabilityZone": "us-east-1b", "GroupName": "launch-demo"}
    assert (request["MinCount"], request["MaxCount"]) == (2, 2)
    assert request["TagSpecifications"] == [
        {"ResourceType": rt, "Tags": TAGS + [{"Key": "Name", "Value": "demo"}]}
        for rt in ("instance", "volume", "network-interface")
    ]
    assert request["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled"}
    assert request["BlockDeviceMappings"] == [{"DeviceName": "/dev/sda1", "Ebs": {
        "VolumeSize": 200, "VolumeType": "gp3", "DeleteOnTermination": True}}]


def test_p5_gets_32_efa_interfaces_and_g6e_24xlarge_two():
    assert len(plan_for("p5.48xlarge", 2).interfaces) == 32
    assert plan_for("g6e.24xlarge", 2).interfaces == (
        NetworkInterface(0, 0, True), NetworkInterface(1, 1, True))


def test_g6e_xlarge_single_node_has_no_efa_no_group_no_elastic_ip():
    plan = plan_for("g6e.xlarge", 1, spot=True, ttl_hours=0)
    request = run_instances_request(plan, "sg-0aaa", 1, "tok")
    assert request["NetworkInterfaces"] == [{
        "NetworkCardIndex": 0, "DeviceIndex": 0, "SubnetId": "subnet-0abc",
        "Groups": ["sg-0aaa"], "DeleteOnTermination": True, "AssociatePublicIpAddress": True,
    }]
    assert request["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert request["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    assert plan.placement_group is None and not plan.elastic_ips
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


def test_capacity_reservation_and_placement_group_switch():
    plan = plan_for("p5.48xlarge", 2, capacity_reservation="cr-0123", placement_group=False)
    request = run_instances_request(plan, "sg-0aaa", 2, "tok")
    assert request["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123"}}
    assert "GroupName" not in request["Placement"]
    assert any("no cluster placement group" in w for w in plan.warnings)


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
    ({"spot": True, "capacity_reservation": "cr-1"}, "--spot and --capacity-reservation"),
    ({"placement_group": True}, "--placement-group needs --count of 2 or more"),
    ({"disk_gb": 8}, "--disk-gb 8 is too small"),
    ({"ttl_hours": -1}, "--ttl must be 0"),
])
def test_invalid_requests_are_named(changes, message):
    spec = replace(ProvisionSpec(cluster="demo", instance_type="g6e.xlarge"), **changes)
    with pytest.raises(ProvisionSpecError, match=message):
        validate_spec(spec)


def test_ubuntu_ssm_parameters():
    assert ubuntu_ssm_parameter("22.04", "x86_64") == (
        "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id")
    assert ubuntu_ssm_parameter("24.04", "arm64") == (
        "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id")


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
