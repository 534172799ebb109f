"""Look up what the plan needs from AWS and the network: the type's facts and price, the zones
to try and their subnets, the reservation, the image, the SSH CIDR and the account's quotas.

This is the only part of planning that talks to the network, and every call here only reads.
Without credentials (an offline dry run) every AWS value becomes a readable placeholder and the
plan says what was not looked up.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import urllib.request
from typing import Any

from botocore.exceptions import ClientError

from launcher.cluster import catalog
from launcher.cluster.catalog import InstanceFacts
from launcher.core.errors import LauncherError
from launcher.provision import account, aws, prices, reservations
from launcher.provision.aws import AwsError, Clients
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    ProvisionSpec, ProvisionSpecError, SiteFacts, Zone, image_parameter, normalize_cidr,
)
from launcher.provision.quotas import AccountFacts
from launcher.provision.reservations import Reservation

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
    unresolved = ("no AWS credentials: the zones, subnets, image, reservation, quotas and "
                  "prices were not looked up and no DryRun checks were sent", *unresolved)
    zone = Zone(az=spec.az or f"<each availability zone offering {facts.instance_type}, in turn>",
                subnet_id=spec.subnet or "<default subnet of that zone>", vpc_id="<its VPC>")
    return SiteFacts(
        region=region or "<region from your AWS configuration>",
        zones=(zone,),
        ami_id=spec.ami or f"<latest {spec.image} {spec.ubuntu}: SSM "
                           f"{image_parameter(spec, facts.architecture)}>",
        ami_description="not looked up",
        root_device="<root device of the AMI>",
        ssh_cidr=ssh_cidr,
        unresolved=unresolved,
    )


def _camel(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))


class Resolver:
    """Answers for one provisioning request, asked of one region's endpoints."""

    def __init__(self, clients: Clients, spec: ProvisionSpec, region: str):
        self.clients, self.spec, self.region = clients, spec, region
        self.ec2, self.ssm = clients.ec2, clients.ssm
        self.notes: list[str] = []   # optional look-ups that did not answer

    def call(self, operation: str, what: str, **params: Any) -> dict[str, Any]:
        try:
            return getattr(self.ec2, operation)(**params)
        except ClientError as err:
            raise AwsError(aws.explain(err, _camel(operation), what)) from None

    # ---- the type ---------------------------------------------------------------------------
    def instance_facts(self) -> InstanceFacts:
        """The built-in row refreshed from EC2, or EC2's description alone for any other type."""
        name = self.spec.instance_type
        try:
            answer = self.ec2.describe_instance_types(InstanceTypes=[name])
        except ClientError as err:
            if aws.error_code(err) in ("InvalidInstanceType", "InvalidParameterValue"):
                raise AwsError(
                    f"EC2 does not know instance type {name} in {self.region}: check the name "
                    "(`aws ec2 describe-instance-types`) or choose another --region") from None
            raise AwsError(aws.explain(err, "DescribeInstanceTypes", name)) from None
        described = answer.get("InstanceTypes") or []
        if not described:
            raise AwsError(f"EC2 does not describe instance type {name} in {self.region}; check "
                           "the name or choose another --region")
        known = catalog.builtin(name)
        if known is not None:
            return catalog.enrich(known, described[0], self.region)
        return catalog.from_ec2(described[0], self.region)

    def priced(self, facts: InstanceFacts) -> InstanceFacts:
        price, why = prices.lookup(self.clients.pricing, facts.instance_type, self.region)
        if price is not None:
            return catalog.with_price(facts, price)
        kept = (f"; the cost uses {facts.price.label()}" if facts.price is not None
                else "; the cost is not estimated")
        self.notes.append(f"price: {why}{kept}")
        if facts.price is not None and facts.price.region != self.region:
            self.notes.append(f"price: the table's price is for {facts.price.region}; "
                              f"{self.region} may cost more or less")
        return facts

    # ---- where -----------------------------------------------------------------------------
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

    def reservation(self) -> Reservation | None:
        rid = self.spec.capacity_reservation
        if not rid:
            return None
        answer = self.call("describe_capacity_reservations", f"capacity reservation {rid}",
                           CapacityReservationIds=[rid])
        found = answer.get("CapacityReservations") or []
        if not found:
            raise AwsError(f"capacity reservation {rid} not found in {self.region}; check the id "
                           "and --region")
        return reservations.from_ec2(found[0])

    def open_reservation_zones(self, instance_type: str, count: int) -> list[str]:
        """Zones where an open reservation of the type has room: launches there use it."""
        try:
            answer = self.clients.ec2_quick.describe_capacity_reservations(Filters=[
                {"Name": "instance-type", "Values": [instance_type]},
                {"Name": "state", "Values": ["active"]}])
        except aws.OPTIONAL_ERRORS as err:
            self.notes.append(f"zone order: open capacity reservations not looked up "
                              f"({type(err).__name__}); zones are tried in name order")
            return []
        return sorted({cr["AvailabilityZone"] for cr in answer.get("CapacityReservations", [])
                       if cr.get("InstanceMatchCriteria") == "open"
                       and int(cr.get("AvailableInstanceCount", 0)) >= count})

    def zones(self, instance_type: str, res: Reservation | None,
              missing: int) -> tuple[tuple[Zone, ...], str]:
        """The zones to try, in order, each with its subnet; and why in that order."""
        spec = self.spec
        offered = self.offered_zones(instance_type)
        if not offered:
            raise AwsError(f"no availability zone in {self.region} offers {instance_type}; "
                           "choose another --region")
        if spec.subnet:
            subnets = self.call("describe_subnets", f"subnet {spec.subnet}",
                                SubnetIds=[spec.subnet])["Subnets"]
            subnet = subnets[0]
            self._check_zone(subnet["AvailabilityZone"], offered, instance_type,
                             f"subnet {spec.subnet}")
            return (Zone(subnet["AvailabilityZone"], subnet["SubnetId"], subnet["VpcId"]),), \
                "--subnet"
        defaults = self.default_subnets()
        if not defaults:
            raise AwsError(
                f"{self.region} has no default VPC: pass --subnet with a subnet whose instances "
                "you can reach (public IPs, or through your VPN or --jump)")
        pinned = res.az if res is not None else spec.az
        if pinned:
            where = (f"{res.label}'s zone" if res is not None else "--az")
            self._check_zone(pinned, offered, instance_type, f"availability zone {pinned}")
            if pinned not in defaults:
                raise AwsError(f"the default VPC has no subnet in {pinned}; pass --subnet")
            s = defaults[pinned]
            return (Zone(pinned, s["SubnetId"], s["VpcId"]),), where
        usable = [z for z in offered if z in defaults]
        if not usable:
            raise AwsError(f"{instance_type} is offered in {', '.join(offered)} but the default "
                           "VPC has no subnet there; pass --subnet")
        reserved = [z for z in self.open_reservation_zones(instance_type, missing)
                    if z in usable]
        ordered = reserved + [z for z in usable if z not in reserved]
        why = (f"zones with an open capacity reservation of the type first: {', '.join(reserved)}"
               if reserved else "every zone offering the type, in name order")
        return tuple(Zone(z, defaults[z]["SubnetId"], defaults[z]["VpcId"]) for z in ordered), why

    def _check_zone(self, az: str, zones: list[str], instance_type: str, where: str) -> None:
        if az not in zones:
            raise AwsError(f"{instance_type} is not offered in {az} ({where}); zones that offer "
                           f"it: {', '.join(zones)}")

    # ---- image --------------------------------------------------------------------------------
    def image_id(self, architecture: str) -> str:
        name = image_parameter(self.spec, architecture)
        try:
            return self.ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as err:
            if aws.error_code(err) == "ParameterNotFound":
                what = ("the AWS Deep Learning Base OSS Nvidia Driver GPU image"
                        if self.spec.image == "dlami" else "the current Ubuntu image")
                raise AwsError(
                    f"AWS's public parameter {name} does not exist in {self.region}, so launch "
                    f"cannot pick {what}; pass --ami with an Ubuntu {self.spec.ubuntu} image id"
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
        root = image.get("RootDeviceName") or "/dev/sda1"
        for mapping in image.get("BlockDeviceMappings") or []:
            size = (mapping.get("Ebs") or {}).get("VolumeSize")
            if mapping.get("DeviceName") == root and size and int(size) > self.spec.disk_gb:
                raise ProvisionSpecError(
                    f"--disk-gb {self.spec.disk_gb} is smaller than image {ami}'s root snapshot "
                    f"({size} GB); pass --disk-gb {size} or more")
        description = image.get("Name") or image.get("Description") or ami
        return description, root

    # ---- the account ---------------------------------------------------------------------------
    def existing(self, cluster: str) -> tuple[int, int]:
        """(alive instances, Elastic IPs) carrying the cluster's tag."""
        alive = len(aws.instances_of(self.ec2, cluster, aws.MEMBER_STATES))
        addresses = self.ec2.describe_addresses(Filters=aws.tag_filters(cluster))["Addresses"]
        return alive, len(addresses)

    def account_facts(self, facts: InstanceFacts) -> AccountFacts:
        alive, addresses = self.existing(self.spec.cluster)
        market = "spot" if self.spec.spot else "on-demand"
        return account.read(self.clients.ec2_quick, self.clients.quotas, facts.instance_type,
                           market, existing_instances=alive, existing_elastic_ips=addresses)

    # ---- all ----------------------------------------------------------------------------------
    def site(self, facts: InstanceFacts, ledger: Ledger | None, *, dry_run: bool,
             missing: int) -> SiteFacts:
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
        res = self.reservation()
        if kept.get("az") and kept.get("subnet_id") and kept.get("vpc_id"):
            zones, order = (Zone(kept["az"], kept["subnet_id"], kept["vpc_id"]),), \
                "the cluster's zone"
        else:
            zones, order = self.zones(facts.instance_type, res, missing)
        ami = spec.ami or kept.get("ami_id") or self.image_id(facts.architecture)
        description, root_device = self.image(ami, facts.architecture)
        ssh_cidr, unresolved = ssh_source(spec, dry_run=dry_run)
        return SiteFacts(region=self.region, zones=zones, ami_id=ami,
                         ami_description=description, root_device=root_device,
                         ssh_cidr=ssh_cidr, zone_order=order, reservation=res,
                         unresolved=(*unresolved, *self.notes))
