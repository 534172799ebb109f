"""Look up what the plan needs from AWS and the network: region, AZ and subnet, AMI, SSH CIDR.

This is the only part of planning that talks to the network. Without credentials (an offline dry
run) every AWS value becomes a readable placeholder and the plan says what was not looked up.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import urllib.request
from typing import Any

from botocore.exceptions import ClientError

from launcher import catalog
from launcher.catalog import InstanceFacts
from launcher.errors import LauncherError
from launcher.provision import aws
from launcher.provision.aws import AwsError
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    ProvisionSpec, ProvisionSpecError, SiteFacts, normalize_cidr, ubuntu_ssm_parameter,
)

# AWS's own what-is-my-address service. LAUNCH_PUBLIC_IP_URL points elsewhere (a proxy-friendly
# echo service; the tests use a local one) without changing the rule: no answer, no default CIDR.
PUBLIC_IP_URL = "https://checkip.amazonaws.com"
PUBLIC_IP_TIMEOUT_S = 3.0


class SshCidrError(LauncherError):
    pass


def caller_cidr(url: str | None = None, timeout: float = PUBLIC_IP_TIMEOUT_S) -> str:
    """This machine's public address as a /32 (or /128), or SshCidrError asking for --ssh-cidr."""
    url = url or os.environ.get("LAUNCH_PUBLIC_IP_URL") or PUBLIC_IP_URL
    answer: list[Any] = []

    def fetch() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
                answer.append(response.read(100).decode("ascii", "replace").strip())
        except OSError as err:
            answer.append(err)

    # urlopen's timeout does not cover the DNS look-up, which can hang on a broken resolver.
    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(timeout + 1)
    try:
        if not answer:
            raise OSError(f"no answer within {timeout:g} s")
        if isinstance(answer[0], OSError):
            raise answer[0]
        address = ipaddress.ip_address(answer[0])
    except (OSError, ValueError) as err:
        raise SshCidrError(
            f"could not find this machine's public address ({url}: {err}); pass --ssh-cidr "
            "with the address or block SSH may come from, e.g. --ssh-cidr 203.0.113.7/32"
        ) from None
    return str(ipaddress.ip_network(address))


def ssh_source(spec: ProvisionSpec, *, dry_run: bool) -> tuple[str, tuple[str, ...]]:
    """The CIDR SSH may come from. A dry run shows a failed look-up instead of stopping on it."""
    if spec.ssh_cidr:
        return normalize_cidr(spec.ssh_cidr), ()
    try:
        return caller_cidr(), ()
    except SshCidrError as err:
        if not dry_run:
            raise
        return "<your public address>", (f"SSH CIDR: {err}",)


def offline_site(spec: ProvisionSpec, facts: InstanceFacts, region: str | None) -> SiteFacts:
    """Placeholders for everything only AWS can answer (no credentials: a dry run offline)."""
    ssh_cidr, unresolved = ssh_source(spec, dry_run=True)
    unresolved = ("no AWS credentials: the AZ, subnet and AMI were not looked up and no "
                  "DryRun checks were sent", *unresolved)
    return SiteFacts(
        region=region or "<region from your AWS configuration>",
        az=spec.az or f"<first availability zone offering {facts.instance_type}>",
        subnet_id=spec.subnet or "<default subnet of that zone>",
        vpc_id="<its VPC>",
        ami_id=spec.ami or f"<latest Ubuntu {spec.ubuntu}: SSM "
                           f"{ubuntu_ssm_parameter(spec.ubuntu, facts.architecture)}>",
        ami_description="not looked up",
        root_device="<root device of the AMI>",
        ssh_cidr=ssh_cidr,
        unresolved=unresolved,
    )


class Resolver:
    """Answers for one provisioning request, asked of one region's EC2 and SSM endpoints."""

    def __init__(self, ec2: Any, ssm: Any, spec: ProvisionSpec, region: str):
        self.ec2, self.ssm, self.spec, self.region = ec2, ssm, spec, region

    def call(self, operation: str, what: str, **params: Any) -> dict[str, Any]:
        try:
            return getattr(self.ec2, operation)(**params)
        except ClientError as err:
            raise AwsError(aws.explain(err, _camel(operation), what)) from None

    # ---- catalog ------------------------------------------------------------------------------
    def instance_facts(self, facts: InstanceFacts) -> InstanceFacts:
        try:
            answer = self.ec2.describe_instance_types(InstanceTypes=[facts.instance_type])
        except ClientError as err:
            if aws.error_code(err) == "InvalidInstanceType":
                raise AwsError(
                    f"instance type {facts.instance_type} is not offered in {self.region}; "
                    "choose another --region"
                ) from None
            raise AwsError(aws.explain(err, "DescribeInstanceTypes", facts.instance_type)) from None
        described = answer.get("InstanceTypes") or []
        return catalog.enrich(facts, described[0], self.region) if described else facts

    # ---- where ----------------------------------------------------------------------------
    def offered_zones(self, instance_type: str) -> list[str]:
        offers = aws.paginate(
            self.ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        return sorted({o["Location"] for o in offers})

    def default_subnets(self) -> dict[str, dict[str, Any]]:
        subnets = aws.paginate(self.ec2, "describe_subnets", "Subnets",
                               Filters=[{"Name": "default-for-az", "Values": ["true"]}])
        return {s["AvailabilityZone"]: s for s in subnets}

    def reservation_zone(self, reservation_id: str, instance_type: str) -> str:
        answer = self.call("describe_capacity_reservations", f"capacity reservation "
                           f"{reservation_id}", CapacityReservationIds=[reservation_id])
        found = answer.get("CapacityReservations") or []
        if not found:
            raise AwsError(f"capacity reservation {reservation_id} not found in {self.region}")
        cr = found[0]
        if cr.get("InstanceType") != instance_type:
            raise AwsError(
                f"capacity reservation {reservation_id} is for {cr.get('InstanceType')}, not "
                f"{instance_type}; pass --instance {cr.get('InstanceType')} or another reservation"
            )
        if cr.get("State") != "active":
            raise AwsError(f"capacity reservation {reservation_id} is {cr.get('State')}, not "
                           "active; wait for its start time or use another one")
        available = int(cr.get("AvailableInstanceCount", 0))
        if available < self.spec.count:
            raise AwsError(
                f"capacity reservation {reservation_id} has room for {available} more "
                f"{instance_type}, fewer than --count {self.spec.count}; pass --count {available} "
                "or extend the reservation"
            )
        return cr["AvailabilityZone"]

    def placement(self, instance_type: str) -> tuple[str, str, str]:
        """(az, subnet id, vpc id): one subnet and zone for the whole cluster."""
        spec = self.spec
        zones = self.offered_zones(instance_type)
        if not zones:
            raise AwsError(f"no availability zone in {self.region} offers {instance_type}; "
                           "choose another --region")
        if spec.subnet:
            subnets = self.call("describe_subnets", f"subnet {spec.subnet}",
                                SubnetIds=[spec.subnet])["Subnets"]
            subnet = subnets[0]
            az = subnet["AvailabilityZone"]
            self._check_zone(az, zones, instance_type, f"subnet {spec.subnet}")
            return az, subnet["SubnetId"], subnet["VpcId"]
        wanted = spec.az
        if spec.capacity_reservation:
            wanted = self.reservation_zone(spec.capacity_reservation, instance_type)
            if spec.az and spec.az != wanted:
                raise AwsError(f"capacity reservation {spec.capacity_reservation} is in {wanted}, "
                               f"not --az {spec.az}; drop --az")
        defaults = self.default_subnets()
        if not defaults:
            raise AwsError(
                f"{self.region} has no default VPC: pass --subnet with a subnet whose instances "
                "you can reach (public IPs, or through your VPN)"
            )
        if wanted:
            self._check_zone(wanted, zones, instance_type, f"availability zone {wanted}")
            if wanted not in defaults:
                raise AwsError(f"the default VPC has no subnet in {wanted}; pass --subnet")
            subnet = defaults[wanted]
        else:
            usable = [z for z in zones if z in defaults]
            if not usable:
                raise AwsError(
                    f"{instance_type} is offered in {', '.join(zones)} but the default VPC has no "
                    "subnet there; pass --subnet"
                )
            subnet = defaults[usable[0]]
        return subnet["AvailabilityZone"], subnet["SubnetId"], subnet["VpcId"]

    def _check_zone(self, az: str, zones: list[str], instance_type: str, where: str) -> None:
        if az not in zones:
            raise AwsError(f"{instance_type} is not offered in {az} ({where}); zones that offer "
                           f"it: {', '.join(zones)}")

    # ---- image --------------------------------------------------------------------------------
    def ubuntu_ami(self, architecture: str) -> str:
        name = ubuntu_ssm_parameter(self.spec.ubuntu, architecture)
        try:
            return self.ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as err:
            if aws.error_code(err) == "ParameterNotFound":
                raise AwsError(
                    f"AWS's public parameter {name} does not exist in {self.region}, so launch "
                    "cannot pick the current Ubuntu image; pass --ami with an Ubuntu "
                    f"{self.spec.ubuntu} image id"
                ) from None
            raise AwsError(aws.explain(err, "ssm:GetParameter", name)) from None

    def image(self, ami: str, architecture: str) -> tuple[str, str]:
        """(description, root device name) of `ami`, after checking it fits the type."""
        images = self.call("describe_images", f"image {ami}", ImageIds=[ami]).get("Images") or []
        if not images:
            raise AwsError(f"image {ami} not found in {self.region}; check --ami")
        image = images[0]
        if image.get("Architecture") != architecture:
            raise AwsError(f"image {ami} is built for {image.get('Architecture')}, but the "
                           f"instance type needs {architecture}; pass a matching --ami")
        description = image.get("Name") or image.get("Description") or ami
        return description, image.get("RootDeviceName") or "/dev/sda1"

    # ---- all ----------------------------------------------------------------------------------
    def site(self, facts: InstanceFacts, ledger: Ledger | None, *, dry_run: bool) -> SiteFacts:
        spec = self.spec
        kept = ledger.data if ledger and ledger.status not in ("new", "deleted") else {}
        if kept:
            # A re-run tops up the same cluster: same zone, subnet and image for every node.
            for key, asked, had in (("instance type", spec.instance_type,
                                     kept.get("instance_type")),
                                    ("region", self.region, kept.get("region")),
                                    ("subnet", spec.subnet, kept.get("subnet_id")),
                                    ("availability zone", spec.az, kept.get("az")),
                                    ("AMI", spec.ami, kept.get("ami_id"))):
                if asked and had and asked != had:
                    raise ProvisionSpecError(
                        f"cluster {spec.cluster} already exists with {key} {had}; you asked for "
                        f"{asked}. Run `launch teardown --cluster {spec.cluster}` first, or "
                        "choose another --cluster"
                    )
        if kept.get("az") and kept.get("subnet_id") and kept.get("vpc_id"):
            az, subnet_id, vpc_id = kept["az"], kept["subnet_id"], kept["vpc_id"]
        else:
            az, subnet_id, vpc_id = self.placement(facts.instance_type)
        ami = spec.ami or kept.get("ami_id") or self.ubuntu_ami(facts.architecture)
        description, root_device = self.image(ami, facts.architecture)
        ssh_cidr, unresolved = ssh_source(spec, dry_run=dry_run)
        return SiteFacts(region=self.region, az=az, subnet_id=subnet_id, vpc_id=vpc_id,
                         ami_id=ami, ami_description=description, root_device=root_device,
                         ssh_cidr=ssh_cidr, unresolved=unresolved)


def _camel(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))
