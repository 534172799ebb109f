"""Calls moto cannot check, against botocore's Stubber: every request below is validated against
the real EC2 / SSM API model (parameter names, types, required members) before the canned answer
comes back. Covers CreatePlacementGroup, the EFA network interfaces of RunInstances, the Ubuntu
SSM parameter, capacity reservations, capacity errors, DryRun checks and eventual consistency."""

from __future__ import annotations

from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import ANY, Stubber

from launcher import catalog
from launcher.provision import dryrun, resources
from launcher.provision.aws import AwsError
from launcher.provision.ledger import Ledger
from launcher.provision.plan import ProvisionSpec, SiteFacts, plan_provision
from launcher.provision.provisioner import CapacityError, Provisioner
from launcher.provision.resolve import Resolver

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SITE = SiteFacts(region="us-east-1", az="us-east-1b", subnet_id="subnet-0abc",
                 vpc_id="vpc-0def", ami_id="ami-0123456789abcdef0", ami_description="ubuntu",
                 root_device="/dev/sda1", ssh_cidr="203.0.113.7/32")
TAGS = [{"Key": "launch:cluster", "Value": "demo"}, {"Key": "created-by", "Value": "launch"},
        {"Key": "launch:created-at", "Value": "2025-06-01T12:00:00Z"},
        {"Key": "launch:expires-at", "Value": "2025-06-02T12:00:00Z"}]


def client(service: str):
    return boto3.client(service, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", endpoint_url="https://stubbed.invalid")


def plan_for(instance_type: str, count: int, **changes):
    spec = ProvisionSpec(cluster="demo", instance_type=instance_type, count=count,
                         key_name="ops", inventory="/tmp/inv.yml", **changes)
    return plan_provision(spec, SITE, catalog.lookup(instance_type), NOW)


def provisioner(ec2, plan, tmp_path, sleeps=None):
    ledger = Ledger.open("demo", "us-east-1", home=tmp_path)
    return Provisioner(ec2, plan, ledger, wait_ssh=False, keep_on_failure=False,
                       say=lambda text: None, sleep=(sleeps.append if sleeps is not None
                                                     else lambda s: None))


def test_create_placement_group_request(tmp_path):
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        stub.add_response("create_placement_group", {"PlacementGroup": {
            "GroupName": "launch-demo", "Strategy": "cluster", "State": "available"}},
            expected_params={
                "GroupName": "launch-demo", "Strategy": "cluster",
                "TagSpecifications": [{"ResourceType": "placement-group",
                                       "Tags": TAGS + [{"Key": "Name", "Value": "launch-demo"}]}],
            })
        worker = provisioner(ec2, plan_for("p4d.24xlarge", 2), tmp_path)
        worker.create_placement_group()
        stub.assert_no_pending_responses()
    assert worker.made.placement_groups == ["launch-demo"]
    record = worker.ledger.live("placement-group")[0]
    assert (record["id"], record["state"]) == ("launch-demo", "created")


def efa(card: int) -> dict:
    return {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1,
            "SubnetId": "subnet-0abc", "Groups": ["sg-0aaa"], "DeleteOnTermination": True,
            "InterfaceType": "efa"}


@pytest.mark.parametrize("instance_type, count, interfaces, placement", [
    ("p4d.24xlarge", 2, [efa(0), efa(1), efa(2), efa(3)],
     {"AvailabilityZone": "us-east-1b", "GroupName": "launch-demo"}),
    ("g6e.xlarge", 1, [{"NetworkCardIndex": 0, "DeviceIndex": 0, "SubnetId": "subnet-0abc",
                        "Groups": ["sg-0aaa"], "DeleteOnTermination": True,
                        "AssociatePublicIpAddress": True}],
     {"AvailabilityZone": "us-east-1b"}),
])
def test_run_instances_interfaces(tmp_path, instance_type, count, interfaces, placement):
    ec2 = client("ec2")
    expected = {
        "ImageId": "ami-0123456789abcdef0", "InstanceType": instance_type,
        "MinCount": count, "MaxCount": count, "ClientToken": ANY, "KeyName": "ops",
        "NetworkInterfaces": interfaces, "Placement": placement,
        "BlockDeviceMappings": ANY, "MetadataOptions": ANY, "TagSpecifications": ANY,
    }
    answer = {"Instances": [{"InstanceId": f"i-{n}", "AmiLaunchIndex": n} for n in range(count)]}
    with Stubber(ec2) as stub:
        stub.add_response("run_instances", answer, expected_params=expected)
        worker = provisioner(ec2, plan_for(instance_type, count), tmp_path)
        launched = worker.launch("sg-0aaa", count)
        stub.assert_no_pending_responses()
    assert [i["InstanceId"] for i in launched] == [f"i-{n}" for n in range(count)]
    assert worker.ledger.live_ids("instance") == [f"i-{n}" for n in range(count)]
    assert worker.ledger.live("instance-launch") == []   # the launch record is settled


def test_capacity_error_names_the_options_and_records_the_failure(tmp_path):
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        stub.add_client_error("run_instances", service_error_code="InsufficientInstanceCapacity",
                              service_message="We currently do not have sufficient p4d.24xlarge "
                                              "capacity in the Availability Zone you requested")
        worker = provisioner(ec2, plan_for("p4d.24xlarge", 2), tmp_path)
        with pytest.raises(CapacityError) as caught:
            worker.launch("sg-0aaa", 2)
    text = str(caught.value)
    assert text.startswith("EC2 has no capacity for 2 x p4d.24xlarge in us-east-1b right now "
                           "(InsufficientInstanceCapacity: ")
    assert "another zone (--az), a capacity reservation (--capacity-reservation), fewer nodes " \
           "(--count), --spot" in text
    record = worker.ledger.resources[-1]
    assert (record["kind"], record["state"], record["why"]) == \
        ("instance-launch", "failed", "InsufficientInstanceCapacity")


def test_site_resolution_requests(tmp_path):
    """Zone, default subnet and the current Ubuntu image from Canonical's SSM parameter."""
    ec2, ssm = client("ec2"), client("ssm")
    name = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    with Stubber(ec2) as ec2_stub, Stubber(ssm) as ssm_stub:
        ec2_stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone",
             "Location": zone} for zone in ("us-east-1c", "us-east-1a")]}, expected_params={
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}]})
        ec2_stub.add_response("describe_subnets", {"Subnets": [
            {"SubnetId": "subnet-c", "VpcId": "vpc-1", "AvailabilityZone": "us-east-1c"},
            {"SubnetId": "subnet-b", "VpcId": "vpc-1", "AvailabilityZone": "us-east-1b"}]},
            expected_params={"Filters": [{"Name": "default-for-az", "Values": ["true"]}]})
        ssm_stub.add_response("get_parameter", {"Parameter": {"Name": name, "Type": "String",
                                                              "Value": "ami-0fedcba987654321"}},
                              expected_params={"Name": name})
        ec2_stub.add_response("describe_images", {"Images": [{
            "ImageId": "ami-0fedcba987654321", "Architecture": "x86_64",
            "Name": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610",
            "RootDeviceName": "/dev/sda1"}]},
            expected_params={"ImageIds": ["ami-0fedcba987654321"]})
        spec = ProvisionSpec(cluster="demo", instance_type="p5.48xlarge", count=2,
                             ubuntu="24.04", ssh_cidr="198.51.100.0/24")
        site = Resolver(ec2, ssm, spec, "us-east-1").site(
            catalog.lookup("p5.48xlarge"), None, dry_run=False)
        ec2_stub.assert_no_pending_responses()
        ssm_stub.assert_no_pending_responses()
    assert site == SiteFacts(
        region="us-east-1", az="us-east-1c", subnet_id="subnet-c", vpc_id="vpc-1",
        ami_id="ami-0fedcba987654321",
        ami_description="ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610",
        root_device="/dev/sda1", ssh_cidr="198.51.100.0/24")


def test_missing_ssm_parameter_asks_for_ami():
    ssm = client("ssm")
    with Stubber(ssm) as stub:
        stub.add_client_error("get_parameter", service_error_code="ParameterNotFound")
        spec = ProvisionSpec(cluster="d", instance_type="g6e.xlarge")
        resolver = Resolver(client("ec2"), ssm, spec, "ap-east-2")
        with pytest.raises(AwsError, match=r"does not exist in ap-east-2.*pass --ami with an "
                                           r"Ubuntu 22.04 image id"):
            resolver.ubuntu_ami("x86_64")


@pytest.mark.parametrize("reservation, message", [
    ({"InstanceType": "p4d.24xlarge", "State": "active", "AvailableInstanceCount": 4,
      "AvailabilityZone": "us-east-1d"}, None),
    ({"InstanceType": "p5.48xlarge", "State": "active", "AvailableInstanceCount": 4,
      "AvailabilityZone": "us-east-1d"}, "is for p5.48xlarge, not p4d.24xlarge"),
    ({"InstanceType": "p4d.24xlarge", "State": "active", "AvailableInstanceCount": 1,
      "AvailabilityZone": "us-east-1d"}, "has room for 1 more p4d.24xlarge, fewer than --count 2"),
    ({"InstanceType": "p4d.24xlarge", "State": "pending", "AvailableInstanceCount": 4,
      "AvailabilityZone": "us-east-1d"}, "is pending, not active"),
])
def test_capacity_reservation_decides_the_zone(reservation, message):
    ec2 = client("ec2")
    spec = ProvisionSpec(cluster="demo", instance_type="p4d.24xlarge", count=2,
                         capacity_reservation="cr-0123456789abcdef0")
    with Stubber(ec2) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [{
            "CapacityReservationId": "cr-0123456789abcdef0", **reservation}]},
            expected_params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        resolver = Resolver(ec2, client("ssm"), spec, "us-east-1")
        if message is None:
            assert resolver.reservation_zone("cr-0123456789abcdef0", "p4d.24xlarge") == \
                "us-east-1d"
        else:
            with pytest.raises(AwsError, match=message):
                resolver.reservation_zone("cr-0123456789abcdef0", "p4d.24xlarge")


def test_dry_run_checks_every_creating_call():
    ec2 = client("ec2")
    plan = plan_for("p4d.24xlarge", 2)
    with Stubber(ec2) as stub:
        stub.add_client_error("create_security_group", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True, "GroupName": "launch-demo",
                                               "Description": ANY, "VpcId": "vpc-0def",
                                               "TagSpecifications": ANY})
        stub.add_client_error("create_placement_group", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True, "GroupName": "launch-demo",
                                               "Strategy": "cluster", "TagSpecifications": ANY})
        stub.add_client_error(
            "run_instances", service_error_code="UnauthorizedOperation",
            service_message="You are not authorized to perform this operation.",
            expected_params={
                "DryRun": True, "ImageId": "ami-0123456789abcdef0",
                "InstanceType": "p4d.24xlarge", "MinCount": 2, "MaxCount": 2, "KeyName": "ops",
                # The groups do not exist yet: the check leaves them out.
                "NetworkInterfaces": [{k: v for k, v in efa(c).items() if k != "Groups"}
                                      for c in range(4)],
                "Placement": {"AvailabilityZone": "us-east-1b"},
                "BlockDeviceMappings": ANY, "MetadataOptions": ANY, "TagSpecifications": ANY})
        stub.add_client_error("allocate_address", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True, "Domain": "vpc",
                                               "TagSpecifications": ANY})
        checks = dryrun.check_calls(ec2, plan, resources.ClusterResources(), 2)
        stub.assert_no_pending_responses()
    assert [(c.operation, c.ok) for c in checks] == [
        ("CreateSecurityGroup", True), ("CreatePlacementGroup", True), ("RunInstances", False),
        ("AllocateAddress", True)]
    assert "the credentials lack permission for RunInstances" in checks[2].detail


def test_not_yet_visible_instances_are_retried_with_backoff(tmp_path):
    """EC2 may not know an instance it just launched: DescribeInstances is retried."""
    ec2 = client("ec2")
    sleeps: list[float] = []
    with Stubber(ec2) as stub:
        for _ in range(2):
            stub.add_client_error("describe_instances",
                                  service_error_code="InvalidInstanceID.NotFound",
                                  expected_params={"InstanceIds": ["i-1"]})
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [
            {"InstanceId": "i-1", "State": {"Name": "running", "Code": 16}}]}]},
            expected_params={"InstanceIds": ["i-1"]})
        worker = provisioner(ec2, plan_for("g6e.xlarge", 1), tmp_path, sleeps)
        assert [i["InstanceId"] for i in worker.describe(["i-1"])] == ["i-1"]
        stub.assert_no_pending_responses()
    assert sleeps == [1.0, 2.0]
