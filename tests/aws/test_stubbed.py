"""Calls moto cannot answer, against botocore's Stubber: every request below is validated against
the real EC2 / SSM / Service Quotas / Price List API models (parameter names, types, required
members) before the canned answer comes back. moto 5 lacks CreatePlacementGroup,
DescribeCapacityReservations, EC2's Service Quotas, the Price List API and capacity errors; it
does not keep the EFA interface types. Covered here: zone failover, Capacity Blocks and
reservations, quota refusals before anything is created, prices, DryRun checks, eventual
consistency and the launch whose answer was lost."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import ANY, Stubber

from launcher.cluster import catalog
from launcher.provision import dryrun, resources
from launcher.provision.aws import AwsError, Clients
from launcher.provision.create import provision
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    ProvisionSpec, ProvisionSpecError, QuotaExceeded, SiteFacts, Zone, plan_provision,
)
from launcher.provision.provisioner import CapacityError, Provisioner
from launcher.provision.reservations import ReservationMismatch
from launcher.provision.resolve import Resolver

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
ZONES = (Zone("us-east-1a", "subnet-a", "vpc-0def"), Zone("us-east-1b", "subnet-b", "vpc-0def"),
         Zone("us-east-1c", "subnet-c", "vpc-0def"))
SITE = SiteFacts(region="us-east-1", zones=ZONES, ami_id="ami-0123456789abcdef0",
                 ami_description="ubuntu", root_device="/dev/sda1", ssh_cidr="203.0.113.7/32")
TAGS = [{"Key": "launch:cluster", "Value": "demo"}, {"Key": "created-by", "Value": "launch"},
        {"Key": "launch:created-at", "Value": "2025-06-01T12:00:00Z"},
        {"Key": "launch:expires-at", "Value": "2025-06-02T12:00:00Z"}]
CAPACITY_MESSAGE = ("We currently do not have sufficient p4d.24xlarge capacity in the "
                    "Availability Zone you requested (us-east-1a). Our system will be working on "
                    "provisioning additional capacity.")


def client(service: str):
    return boto3.client(service, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", endpoint_url="https://stubbed.invalid")


def plan_for(instance_type: str, count: int, site=SITE, **changes):
    spec = ProvisionSpec(cluster="demo", instance_type=instance_type, count=count,
                         key_name="ops", inventory="/tmp/inv.yml", **changes)
    return plan_provision(spec, site, catalog.lookup(instance_type), NOW)


def provisioner(ec2, plan, tmp_path, said=None, sleeps=None, **kw):
    ledger = Ledger.open("demo", "us-east-1", home=tmp_path)
    return Provisioner(ec2, plan, ledger, wait_ssh=False, keep_on_failure=False,
                       say=(said.append if said is not None else lambda text: None),
                       sleep=(sleeps.append if sleeps is not None else lambda s: None), **kw)


def capacity_error(stub, zone, code="InsufficientInstanceCapacity"):
    stub.add_client_error("run_instances", service_error_code=code,
                          service_message=CAPACITY_MESSAGE.replace("us-east-1a", zone),
                          expected_params={**RUN_ANY, "Placement": {
                              "AvailabilityZone": zone, "GroupName": f"launch-demo-{zone}"}})


RUN_ANY = {"ImageId": ANY, "InstanceType": ANY, "MinCount": ANY, "MaxCount": ANY,
           "ClientToken": ANY, "KeyName": ANY, "NetworkInterfaces": ANY, "Placement": ANY,
           "BlockDeviceMappings": ANY, "MetadataOptions": ANY, "TagSpecifications": ANY,
           "InstanceInitiatedShutdownBehavior": "terminate", "UserData": ANY}


def pg_created(stub, zone):
    name = f"launch-demo-{zone}"
    stub.add_response("create_placement_group", {"PlacementGroup": {
        "GroupName": name, "Strategy": "cluster", "State": "available"}}, expected_params={
        "GroupName": name, "Strategy": "cluster",
        "TagSpecifications": [{"ResourceType": "placement-group",
                               "Tags": TAGS + [{"Key": "Name", "Value": name}]}]})


# ---- zones -------------------------------------------------------------------------------------

def test_capacity_error_in_zone_1_launches_in_zone_2_and_says_why(tmp_path):
    ec2 = client("ec2")
    said: list[str] = []
    with Stubber(ec2) as stub:
        pg_created(stub, "us-east-1a")
        capacity_error(stub, "us-east-1a")
        stub.add_response("delete_placement_group", {},
                          expected_params={"GroupName": "launch-demo-us-east-1a"})
        pg_created(stub, "us-east-1b")
        stub.add_response("run_instances", {"Instances": [
            {"InstanceId": f"i-{n}", "AmiLaunchIndex": n} for n in range(2)]},
            expected_params={**RUN_ANY, "Placement": {"AvailabilityZone": "us-east-1b",
                                                      "GroupName": "launch-demo-us-east-1b"},
                             "NetworkInterfaces": [
                                 {"NetworkCardIndex": c, "DeviceIndex": 0,
                                  "SubnetId": "subnet-b", "Groups": ["sg-0aaa"],
                                  "DeleteOnTermination": True,
                                  "InterfaceType": "efa" if c == 0 else "efa-only"}
                                 for c in range(4)]})
        worker = provisioner(ec2, plan_for("p4d.24xlarge", 2), tmp_path, said)
        launched = worker.launch_somewhere("sg-0aaa", 2, resources.ClusterResources(), ZONES)
        stub.assert_no_pending_responses()
    assert [i["InstanceId"] for i in launched] == ["i-0", "i-1"]
    assert ("us-east-1a: no room for 2 x p4d.24xlarge (InsufficientInstanceCapacity: "
            + CAPACITY_MESSAGE + "); trying us-east-1b") in said
    assert worker.plan.site.az == "us-east-1b"
    assert worker.ledger.data["az"] == "us-east-1b" and \
        worker.ledger.data["subnet_id"] == "subnet-b"
    assert worker.made.placement_groups == ["launch-demo-us-east-1b"]
    assert worker.ledger.live_ids("placement-group") == ["launch-demo-us-east-1b"]


def _make_security_group(stub):
    """The cluster's security group made (sg-0aaa) and its ingress and egress rules set."""
    stub.add_response("create_security_group", {"GroupId": "sg-0aaa"},
                      expected_params={"GroupName": "launch-demo", "Description": ANY,
                                       "VpcId": "vpc-0def", "TagSpecifications": ANY})
    for op in ("ingress", "ingress", "egress"):
        stub.add_response(f"authorize_security_group_{op}", {},
                          expected_params={"GroupId": "sg-0aaa", "IpPermissions": ANY})


def _find_nothing(stub):
    stub.add_response("describe_instances", {"Reservations": []}, expected_params={"Filters": ANY})
    stub.add_response("describe_addresses", {"Addresses": []}, expected_params={"Filters": ANY})
    stub.add_response("describe_security_groups", {"SecurityGroups": []},
                      expected_params={"Filters": ANY})


def test_capacity_errors_in_every_zone_leave_nothing_and_list_the_zones(tmp_path):
    """The whole run: security group made, every zone refuses, the group is deleted again."""
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        _find_nothing(stub)
        _make_security_group(stub)
        for zone, code in (("us-east-1a", "InsufficientInstanceCapacity"),
                           ("us-east-1b", "Unsupported"),
                           ("us-east-1c", "InsufficientInstanceCapacity")):
            stub.add_client_error("run_instances", service_error_code=code,
                                  service_message=f"no {zone}", expected_params={
                                      **RUN_ANY, "Placement": {"AvailabilityZone": zone}})
        stub.add_response("delete_security_group", {}, expected_params={"GroupId": "sg-0aaa"})
        worker = provisioner(ec2, plan_for("g6e.xlarge", 1), tmp_path)
        with pytest.raises(CapacityError) as caught:
            worker.run()
        stub.assert_no_pending_responses()
    assert str(caught.value) == (
        "EC2 had no room for 1 x g6e.xlarge in every zone tried in us-east-1: us-east-1a "
        "(InsufficientInstanceCapacity: no us-east-1a); us-east-1b (Unsupported: no "
        "us-east-1b); us-east-1c (InsufficientInstanceCapacity: no us-east-1c). Options: a "
        "Capacity Block or capacity reservation (--capacity-reservation), another --region "
        "(several may be listed: --region us-east-1,us-west-2), fewer nodes (--count), --spot, "
        "or try again later. Cluster demo: cleaned up: nothing this run created remains")
    ledger = Ledger.load("demo", home=tmp_path)
    assert ledger.live() == [] and ledger.status == "deleted"
    assert [r["az"] for r in ledger.resources if r["kind"] == "instance-launch"] == \
        ["us-east-1a", "us-east-1b", "us-east-1c"]


def test_zone_order_puts_open_reservations_first():
    ec2, quick = client("ec2"), client("ec2")
    spec = ProvisionSpec(cluster="demo", instance_type="p5.48xlarge", count=2)
    clients = Clients(ec2=ec2, ssm=client("ssm"), ec2_quick=quick, quotas=None, pricing=None)
    with Stubber(ec2) as stub, Stubber(quick) as quick_stub:
        stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone",
             "Location": z} for z in ("us-east-1d", "us-east-1a", "us-east-1c")]},
            expected_params={"LocationType": "availability-zone", "Filters": [
                {"Name": "instance-type", "Values": ["p5.48xlarge"]}]})
        stub.add_response("describe_subnets", {"Subnets": [
            {"SubnetId": f"subnet-{z[-1]}", "VpcId": "vpc-1", "AvailabilityZone": z}
            for z in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")]},
            expected_params={"Filters": [{"Name": "default-for-az", "Values": ["true"]}]})
        quick_stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            {"CapacityReservationId": "cr-1", "AvailabilityZone": "us-east-1d",
             "InstanceMatchCriteria": "open", "AvailableInstanceCount": 2},
            {"CapacityReservationId": "cr-2", "AvailabilityZone": "us-east-1c",
             "InstanceMatchCriteria": "targeted", "AvailableInstanceCount": 8}]},
            expected_params={"Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]},
                                         {"Name": "state", "Values": ["active"]}]})
        zones, why = Resolver(clients, spec, "us-east-1").zones("p5.48xlarge", None, 2)
    assert [z.az for z in zones] == ["us-east-1d", "us-east-1a", "us-east-1c"]
    assert [z.subnet_id for z in zones] == ["subnet-d", "subnet-a", "subnet-c"]
    assert why == "zones with an open capacity reservation of the type first: us-east-1d"


# ---- reservations -----------------------------------------------------------------------------

def block(**changes):
    cr = {"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "p5.48xlarge",
          "AvailabilityZone": "us-east-1d", "State": "active", "AvailableInstanceCount": 2,
          "TotalInstanceCount": 2, "ReservationType": "capacity-block",
          "InstanceMatchCriteria": "targeted",
          "PlacementGroupArn": "arn:aws:ec2:us-east-1:123456789012:placement-group/cb-group",
          "StartDate": datetime(2025, 6, 1, 11, 30, tzinfo=timezone.utc),
          "EndDate": datetime(2025, 6, 3, 11, 30, tzinfo=timezone.utc)}
    return {**cr, **changes}


def test_capacity_block_request_has_its_market_type_and_group(tmp_path):
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [block()]},
                          expected_params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        spec = ProvisionSpec(cluster="demo", instance_type="p5.48xlarge", count=2,
                             capacity_reservation="cr-0123456789abcdef0")
        clients = Clients(ec2=ec2, ssm=None, ec2_quick=None, quotas=None, pricing=None)
        res = Resolver(clients, spec, "us-east-1").reservation()
    zone = (Zone("us-east-1d", "subnet-d", "vpc-0def"),)
    plan = plan_for("p5.48xlarge", 2, site=SiteFacts(
        "us-east-1", zone, "ami-0123456789abcdef0", "u", "/dev/sda1", "203.0.113.7/32",
        reservation=res), capacity_reservation="cr-0123456789abcdef0")
    with Stubber(ec2) as stub:
        stub.add_response("run_instances", {"Instances": [{"InstanceId": "i-0"},
                                                          {"InstanceId": "i-1"}]},
                          expected_params={
                              **RUN_ANY, "Placement": {"AvailabilityZone": "us-east-1d",
                                                       "GroupName": "cb-group"},
                              "InstanceMarketOptions": {"MarketType": "capacity-block"},
                              "CapacityReservationSpecification": {"CapacityReservationTarget": {
                                  "CapacityReservationId": "cr-0123456789abcdef0"}}})
        worker = provisioner(ec2, plan, tmp_path)
        # No placement group of its own is made: the block's group is used as it is.
        worker.launch_somewhere("sg-0aaa", 2, resources.ClusterResources(), plan.site.zones)
        stub.assert_no_pending_responses()


def test_spot_request_carries_its_market_options_checked_by_the_ec2_model(tmp_path):
    """`--market spot` (or --spot): one-time spot instances that EC2 terminates when it
    reclaims them (the node's own notice then comes from instance metadata)."""
    ec2 = client("ec2")
    plan = plan_for("p4d.24xlarge", 2, market="spot")
    assert plan.market == "spot" and plan.interruptible
    with Stubber(ec2) as stub:
        pg_created(stub, "us-east-1a")
        stub.add_response("run_instances", {"Instances": [{"InstanceId": "i-0"},
                                                          {"InstanceId": "i-1"}]},
                          expected_params={
                              **RUN_ANY, "Placement": {"AvailabilityZone": "us-east-1a",
                                                       "GroupName": "launch-demo-us-east-1a"},
                              "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
                                  "SpotInstanceType": "one-time",
                                  "InstanceInterruptionBehavior": "terminate"}}})
        worker = provisioner(ec2, plan, tmp_path)
        worker.launch_somewhere("sg-0aaa", 2, resources.ClusterResources(), plan.site.zones)
        stub.assert_no_pending_responses()
    assert worker.made.placement_groups == ["launch-demo-us-east-1a"]


@pytest.mark.parametrize("changes, says", [
    ({"market": "capacity-block"}, "pass its id with --capacity-reservation"),
    ({"market": "reserved"}, "--market reserved is not one of on-demand, spot, capacity-block"),
])
def test_a_market_that_cannot_be_bought_is_refused(changes, says):
    with pytest.raises(ProvisionSpecError) as err:
        plan_for("p4d.24xlarge", 2, **changes)
    assert says in str(err.value)


def test_a_capacity_block_is_bought_only_as_one(tmp_path):
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        stub.add_response("describe_capacity_reservations",
                          {"CapacityReservations": [block(ReservationType="default")]},
                          expected_params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [block()]},
                          expected_params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        clients = Clients(ec2=ec2, ssm=None, ec2_quick=None, quotas=None, pricing=None)
        spec = ProvisionSpec(cluster="demo", instance_type="p5.48xlarge", count=2,
                             capacity_reservation="cr-0123456789abcdef0")
        ondemand_res = Resolver(clients, spec, "us-east-1").reservation()
        block_res = Resolver(clients, spec, "us-east-1").reservation()
    zone = (Zone("us-east-1d", "subnet-d", "vpc-0def"),)

    def site(res):
        return SiteFacts("us-east-1", zone, "ami-0123456789abcdef0", "u", "/dev/sda1",
                         "203.0.113.7/32", reservation=res)

    with pytest.raises(ProvisionSpecError, match="not a Capacity Block"):
        plan_for("p5.48xlarge", 2, site=site(ondemand_res), market="capacity-block",
                 capacity_reservation="cr-0123456789abcdef0")
    with pytest.raises(ProvisionSpecError, match="is a Capacity Block"):
        plan_for("p5.48xlarge", 2, site=site(block_res), market="on-demand",
                 capacity_reservation="cr-0123456789abcdef0")
    assert plan_for("p5.48xlarge", 2, site=site(block_res), market="capacity-block",
                    capacity_reservation="cr-0123456789abcdef0").market == "capacity-block"


class Stubs:
    """Stubbed clients for a whole `provision()` call; only read-only calls are queued, so any
    creating call fails the test (Stubber refuses calls it was not told about)."""

    def __init__(self):
        self.ec2, self.quick, self.ssm = client("ec2"), client("ec2"), client("ssm")
        self.quotas, self.pricing = client("service-quotas"), client("pricing")
        self.stubs = [Stubber(c) for c in (self.ec2, self.quick, self.ssm, self.quotas,
                                           self.pricing)]
        self.ec2_stub, self.quick_stub, _, self.quotas_stub, self.pricing_stub = self.stubs

    def clients(self, region):
        return Clients(ec2=self.ec2, ssm=self.ssm, ec2_quick=self.quick, quotas=self.quotas,
                       pricing=self.pricing)

    def __enter__(self):
        for s in self.stubs:
            s.activate()
        return self

    def __exit__(self, *exc):
        for s in self.stubs:
            s.deactivate()

    def done(self):
        for s in self.stubs:
            s.assert_no_pending_responses()

    def type_and_price(self, described, price_error=True):
        self.ec2_stub.add_response("describe_instance_types", {"InstanceTypes": [described]},
                                   expected_params={"InstanceTypes": [described["InstanceType"]]})
        if price_error:
            self.pricing_stub.add_client_error("get_products",
                                               service_error_code="AccessDeniedException")

    def account(self, *, vcpu_limit, running=()):
        self.ec2_stub.add_response("describe_instances", {"Reservations": []},
                                   expected_params={"Filters": ANY})
        self.ec2_stub.add_response("describe_addresses", {"Addresses": []},
                                   expected_params={"Filters": ANY})
        self.quotas_stub.add_response("get_service_quota", {"Quota": {
            "QuotaCode": "L-417A185B", "QuotaName": "Running On-Demand P instances",
            "Value": vcpu_limit}}, expected_params={"ServiceCode": "ec2",
                                                   "QuotaCode": "L-417A185B"})
        self.quick_stub.add_response("describe_instances", {"Reservations": [{"Instances": [
            {"InstanceId": f"i-r{n}", "InstanceType": t,
             "CpuOptions": {"CoreCount": cores, "ThreadsPerCore": 2}}
            for n, (t, cores) in enumerate(running)]}]},
            expected_params={"Filters": [{"Name": "instance-state-name",
                                          "Values": ["pending", "running"]}]})
        self.quick_stub.add_response("describe_account_attributes", {"AccountAttributes": [
            {"AttributeName": "vpc-max-elastic-ips", "AttributeValues": [
                {"AttributeValue": "5"}]}]},
            expected_params={"AttributeNames": ["vpc-max-elastic-ips"]})
        self.quick_stub.add_response("describe_addresses", {"Addresses": []},
                                     expected_params={"Filters": [{"Name": "domain",
                                                                   "Values": ["vpc"]}]})

    def zones_and_image(self, instance_type, zones=("us-east-1a",), reservation_lookup=True,
                        ssm=False):
        self.ec2_stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": instance_type, "LocationType": "availability-zone", "Location": z}
            for z in zones]}, expected_params={"LocationType": "availability-zone",
                                               "Filters": ANY})
        self.ec2_stub.add_response("describe_subnets", {"Subnets": [
            {"SubnetId": f"subnet-{z[-1]}", "VpcId": "vpc-1", "AvailabilityZone": z}
            for z in zones]}, expected_params={"Filters": ANY})
        if reservation_lookup:
            self.quick_stub.add_response("describe_capacity_reservations",
                                         {"CapacityReservations": []},
                                         expected_params={"Filters": ANY})
        if ssm:
            self.stubs[2].add_response("get_parameter", {"Parameter": {
                "Name": "x", "Type": "String", "Value": "ami-0123456789abcdef0"}},
                expected_params={"Name": "/aws/service/canonical/ubuntu/server/22.04/stable/"
                                         "current/amd64/hvm/ebs-gp2/ami-id"})
        self.ec2_stub.add_response("describe_images", {"Images": [{
            "ImageId": "ami-0123456789abcdef0", "Architecture": "x86_64", "Name": "ubuntu",
            "RootDeviceName": "/dev/sda1"}]}, expected_params={
            "ImageIds": ["ami-0123456789abcdef0"]})


P4D = {"InstanceType": "p4d.24xlarge",
       "GpuInfo": {"Gpus": [{"Name": "A100", "Count": 8, "MemoryInfo": {"SizeInMiB": 40960}}]},
       "VCpuInfo": {"DefaultVCpus": 96}, "MemoryInfo": {"SizeInMiB": 1179648},
       "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
       "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 4},
                       "MaximumNetworkCards": 4, "NetworkPerformance": "4x 100 Gigabit",
                       "NetworkCards": [{"NetworkCardIndex": i, "MaximumNetworkInterfaces": 15,
                                         "InterfaceTypes": ["interface", "efa", "efa-only"]}
                                        for i in range(4)]}}
P5 = {**P4D, "InstanceType": "p5.48xlarge", "VCpuInfo": {"DefaultVCpus": 192}}


def spec_for(**changes):
    base = dict(cluster="demo", instance_type="p4d.24xlarge", count=2, region="us-east-1",
                key_name="ops", ami="ami-0123456789abcdef0", ssh_cidr="203.0.113.7/32",
                skip_setup=True, wait_ssh=False)
    return ProvisionSpec(**{**base, **changes})


@pytest.fixture
def fake_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_vcpu_quota_short_is_refused_before_any_creating_call(fake_credentials, tmp_path):
    with Stubs() as s:
        s.type_and_price(P4D)
        # 2 x p4d need 192 vCPUs; the quota is 256 and a p4d (96) and a p3.8xlarge (32) run.
        s.account(vcpu_limit=256.0, running=[("p4d.24xlarge", 48), ("p3.8xlarge", 16)])
        s.zones_and_image("p4d.24xlarge")
        with pytest.raises(QuotaExceeded) as caught:
            provision(spec_for(), dry_run=False, as_json=False, clients_for=s.clients)
        s.done()
    assert str(caught.value) == (
        "cluster demo does not fit the account's quotas in us-east-1, so nothing was created: "
        "Running On-Demand P instances (L-417A185B) needs 192 vCPUs but only 128 of 256 are "
        "free (128 in use); ask for more: aws service-quotas request-service-quota-increase "
        "--service-code ec2 --quota-code L-417A185B --desired-value 320 --region us-east-1 (or "
        "the Service Quotas console), or pass a smaller --count")
    assert Ledger.load("demo") is None   # nothing was even recorded as intended


@pytest.mark.parametrize("changes, message", [
    ({"InstanceType": "p4d.24xlarge"},
     "Capacity Block cr-0123456789abcdef0 is for p4d.24xlarge, not p5.48xlarge"),
    ({"AvailableInstanceCount": 1}, "has room for 1 more p5.48xlarge"),
    ({"State": "expired"}, "is expired (it ended 2025-06-03T11:30:00Z), not active"),
    ({"State": "scheduled", "StartDate": "FUTURE"}, "is not active yet: it starts at "),
])
def test_mismatched_reservations_are_refused_before_any_creating_call(
        fake_credentials, changes, message):
    if changes.get("StartDate") == "FUTURE":
        changes = {**changes, "StartDate": datetime.now(timezone.utc) + timedelta(hours=5)}
    with Stubs() as s:
        s.type_and_price(P5)
        s.ec2_stub.add_response("describe_instances", {"Reservations": []},
                                expected_params={"Filters": ANY})
        s.ec2_stub.add_response("describe_addresses", {"Addresses": []},
                                expected_params={"Filters": ANY})
        s.quotas_stub.add_client_error("get_service_quota",
                                       service_error_code="AccessDeniedException")
        s.quick_stub.add_response("describe_account_attributes", {"AccountAttributes": []},
                                  expected_params={"AttributeNames": ANY})
        s.quick_stub.add_response("describe_addresses", {"Addresses": []},
                                  expected_params={"Filters": ANY})
        s.ec2_stub.add_response("describe_capacity_reservations",
                                {"CapacityReservations": [block(**changes)]},
                                expected_params={"CapacityReservationIds": [
                                    "cr-0123456789abcdef0"]})
        s.zones_and_image("p5.48xlarge", zones=("us-east-1d",), reservation_lookup=False)
        with pytest.raises(ReservationMismatch) as caught:
            provision(spec_for(instance_type="p5.48xlarge",
                               capacity_reservation="cr-0123456789abcdef0"),
                      dry_run=False, as_json=False, clients_for=s.clients)
        s.done()
    assert message in str(caught.value)


# ---- prices -----------------------------------------------------------------------------------

PRODUCT = {
    "product": {"productFamily": "Compute Instance", "attributes": {
        "instanceType": "p4d.24xlarge", "regionCode": "us-east-1", "operatingSystem": "Linux"}},
    "serviceCode": "AmazonEC2",
    "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"priceDimensions": {
        "ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "21.9576420000"},
                                      "description": "$21.957642 per On Demand Linux "
                                                     "p4d.24xlarge Instance Hour"}}}}},
    "publicationDate": "2026-09-25T18:11:04Z",
}


def test_prices_come_from_the_price_list_api_when_it_answers():
    pricing = client("pricing")
    clients = Clients(ec2=None, ssm=None, ec2_quick=None, quotas=None, pricing=pricing)
    resolver = Resolver(clients, ProvisionSpec(cluster="d", instance_type="p4d.24xlarge"),
                        "us-east-1")
    with Stubber(pricing) as stub:
        stub.add_response("get_products", {"PriceList": [json.dumps(PRODUCT)]},
                          expected_params={"ServiceCode": "AmazonEC2", "MaxResults": 10,
                                           "Filters": [
            {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
                ("instanceType", "p4d.24xlarge"), ("regionCode", "us-east-1"),
                ("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
                ("licenseModel", "No License required"), ("capacitystatus", "Used"),
                ("marketoption", "OnDemand"))]})
        facts = resolver.priced(catalog.lookup("p4d.24xlarge"))
        stub.add_client_error("get_products", service_error_code="AccessDeniedException")
        kept = resolver.priced(catalog.lookup("p4d.24xlarge"))
    assert facts.price.label() == "us-east-1 on-demand list price, AWS Price List API, 2026-09-25"
    assert facts.price_per_hour == 21.957642
    assert kept.price == catalog.lookup("p4d.24xlarge").price
    assert resolver.notes[-1].startswith("price: AWS Price List API did not answer "
                                         "(AccessDeniedException: ")
    assert resolver.notes[-1].endswith("; the cost uses us-east-1 on-demand list price, "
                                       "instances.vantage.sh copy of the AWS price list, "
                                       "2026-08-26")


# ---- the rest ---------------------------------------------------------------------------------

def test_site_resolution_requests():
    """Zones, default subnets and the current Ubuntu image from Canonical's SSM parameter."""
    ec2, ssm, quick = client("ec2"), client("ssm"), client("ec2")
    name = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
    clients = Clients(ec2=ec2, ssm=ssm, ec2_quick=quick, quotas=None, pricing=None)
    with Stubber(ec2) as ec2_stub, Stubber(ssm) as ssm_stub, Stubber(quick) as quick_stub:
        ec2_stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
            {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone",
             "Location": zone} for zone in ("us-east-1c", "us-east-1a")]}, expected_params={
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}]})
        ec2_stub.add_response("describe_subnets", {"Subnets": [
            {"SubnetId": "subnet-c", "VpcId": "vpc-1", "AvailabilityZone": "us-east-1c"},
            {"SubnetId": "subnet-a", "VpcId": "vpc-1", "AvailabilityZone": "us-east-1a"},
            {"SubnetId": "subnet-b", "VpcId": "vpc-1", "AvailabilityZone": "us-east-1b"}]},
            expected_params={"Filters": [{"Name": "default-for-az", "Values": ["true"]}]})
        quick_stub.add_client_error("describe_capacity_reservations",
                                    service_error_code="UnauthorizedOperation")
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
        site = Resolver(clients, spec, "us-east-1").site(
            catalog.lookup("p5.48xlarge"), None, dry_run=False, missing=2)
        ec2_stub.assert_no_pending_responses()
        ssm_stub.assert_no_pending_responses()
    assert site == SiteFacts(
        region="us-east-1",
        zones=(Zone("us-east-1a", "subnet-a", "vpc-1"), Zone("us-east-1c", "subnet-c", "vpc-1")),
        ami_id="ami-0fedcba987654321",
        ami_description="ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610",
        root_device="/dev/sda1", ssh_cidr="198.51.100.0/24",
        zone_order="every zone offering the type, in name order",
        unresolved=("zone order: open capacity reservations not looked up (ClientError); "
                    "zones are tried in name order",))


def test_missing_ssm_parameter_asks_for_ami():
    ssm = client("ssm")
    with Stubber(ssm) as stub:
        stub.add_client_error("get_parameter", service_error_code="ParameterNotFound")
        spec = ProvisionSpec(cluster="d", instance_type="g6e.xlarge", image="dlami")
        clients = Clients(ec2=client("ec2"), ssm=ssm, ec2_quick=None, quotas=None, pricing=None)
        resolver = Resolver(clients, spec, "ap-east-2")
        with pytest.raises(AwsError, match=r"/aws/service/deeplearning/ami/x86_64/base-oss-"
                                           r"nvidia-driver-gpu-ubuntu-22.04/latest/ami-id does "
                                           r"not exist in ap-east-2.*Deep Learning Base OSS "
                                           r"Nvidia Driver GPU image; pass --ami"):
            resolver.image_id("x86_64")


def test_dry_run_checks_every_creating_call():
    ec2 = client("ec2")
    plan = plan_for("p4d.24xlarge", 2)
    with Stubber(ec2) as stub:
        stub.add_client_error("create_security_group", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True, "GroupName": "launch-demo",
                                               "Description": ANY, "VpcId": "vpc-0def",
                                               "TagSpecifications": ANY})
        stub.add_client_error("create_placement_group", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True,
                                               "GroupName": "launch-demo-us-east-1a",
                                               "Strategy": "cluster", "TagSpecifications": ANY})
        stub.add_client_error(
            "run_instances", service_error_code="UnauthorizedOperation",
            service_message="You are not authorized to perform this operation.",
            expected_params={
                **{k: v for k, v in RUN_ANY.items() if k != "ClientToken"},
                "DryRun": True, "ImageId": "ami-0123456789abcdef0",
                "InstanceType": "p4d.24xlarge", "MinCount": 2, "MaxCount": 2, "KeyName": "ops",
                # The groups do not exist yet: the check leaves them out.
                "NetworkInterfaces": [
                    {"NetworkCardIndex": c, "DeviceIndex": 0, "SubnetId": "subnet-a",
                     "DeleteOnTermination": True,
                     "InterfaceType": "efa" if c == 0 else "efa-only"} for c in range(4)],
                "Placement": {"AvailabilityZone": "us-east-1a"}})
        stub.add_client_error("allocate_address", service_error_code="DryRunOperation",
                              expected_params={"DryRun": True, "Domain": "vpc",
                                               "TagSpecifications": ANY})
        checks = dryrun.check_calls(ec2, plan, resources.ClusterResources(), 2)
        stub.assert_no_pending_responses()
    assert [(c.operation, c.ok) for c in checks] == [
        ("CreateSecurityGroup", True), ("CreatePlacementGroup", True), ("RunInstances", False),
        ("AllocateAddress", True)]
    assert "the credentials lack permission for RunInstances" in checks[2].detail
    assert checks[3].detail == "would succeed (an Elastic IP for the head)"


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
        worker = provisioner(ec2, plan_for("g6e.xlarge", 1), tmp_path, sleeps=sleeps)
        assert [i["InstanceId"] for i in worker.describe(["i-1"])] == ["i-1"]
        stub.assert_no_pending_responses()
    assert sleeps == [1.0, 2.0]


def test_cleanup_after_ctrl_c_keeps_looking_for_the_lost_launch(tmp_path):
    """Ctrl-C during RunInstances: EC2 launched, launch never heard, and DescribeInstances
    lists the instances only on the third look. They are found and terminated."""
    ec2 = client("ec2")
    said: list[str] = []
    sleeps: list[float] = []
    token = "launch-demo-0001"
    mine = [{"InstanceId": f"i-{n}", "ClientToken": token, "State": {"Name": "pending",
                                                                       "Code": 0}}
            for n in range(2)]
    with Stubber(ec2) as stub:
        for answer in ([], mine[:1], mine):
            stub.add_response("describe_instances", {"Reservations": [{"Instances": answer}]},
                              expected_params={"Filters": ANY})
        stub.add_response("terminate_instances", {"TerminatingInstances": []},
                          expected_params={"InstanceIds": ["i-0", "i-1"]})
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [
            {**i, "State": {"Name": "terminated", "Code": 48}} for i in mine]}]},
            expected_params={"InstanceIds": ["i-0", "i-1"]})
        worker = provisioner(ec2, plan_for("g6e.xlarge", 2), tmp_path, said, sleeps)
        worker.unanswered[token] = 2
        interrupt = KeyboardInterrupt()
        assert worker.clean_up_after(interrupt) is interrupt
        stub.assert_no_pending_responses()
    assert sleeps[:2] == [5, 5]
    assert any(s.startswith(f"looking for instances of the interrupted launch {token}")
               for s in said)
    assert "terminated i-0, i-1" in said
    assert [r["state"] for r in worker.ledger.resources] == ["deleted", "deleted"]


def test_each_listed_region_is_tried_and_all_their_answers_named(fake_credentials, capsys):
    """--region us-east-1,us-west-2: the first region's quota cannot fit the cluster, so the
    second is planned; it cannot either, and the one message names both."""
    with Stubs() as s:
        for _ in range(2):
            s.type_and_price(P4D)
            s.account(vcpu_limit=96.0)
            s.zones_and_image("p4d.24xlarge", ssm=True)
        with pytest.raises(QuotaExceeded) as caught:
            provision(spec_for(ami=None, fallback_regions=("us-west-2",)), dry_run=False,
                      as_json=False, clients_for=s.clients)
        s.done()
    text = str(caught.value)
    assert text.startswith("cluster demo does not fit the account's quotas in us-west-2")
    assert "Earlier regions: us-east-1: cluster demo does not fit the account's quotas in " \
           "us-east-1" in text
    said = capsys.readouterr().err
    assert said.startswith("launch: us-east-1: cluster demo does not fit")
    assert said.rstrip().endswith("; trying us-west-2")
