"""Pure provisioning plan: what `launch provision` will create, computed without the network.

`plan_provision(spec, site, facts, now)` turns the user's request (ProvisionSpec), what AWS said
about the account (SiteFacts, looked up by resolve.py) and the catalog row into a ProvisionPlan.
`--dry-run` prints that plan; a real run hands it to provision.py. The EC2 request bodies are built
here too, so tests can compare them to exact values and botocore's Stubber can check them against
the EC2 API model.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from launcher.catalog import PRICE_REGION, InstanceFacts
from launcher.errors import LauncherError

CLUSTER_TAG = "launch:cluster"
CREATED_BY_TAG = "created-by"
CREATED_AT_TAG = "launch:created-at"
EXPIRES_AT_TAG = "launch:expires-at"

# The interpreter the setup playbooks' python_env role creates on every node.
NODE_PYTHON = "/opt/launch/venv/bin/python"

# Canonical's public SSM parameters. 24.04 images are published as gp3 only, 22.04 as gp2.
UBUNTU_RELEASES = {"22.04": "ebs-gp2", "24.04": "ebs-gp3"}
SSM_ARCH = {"x86_64": "amd64", "arm64": "arm64"}

_CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$")


class ProvisionSpecError(LauncherError):
    pass


@dataclass(frozen=True)
class ProvisionSpec:
    """What the user asked for on the command line."""

    cluster: str
    instance_type: str
    count: int = 1
    region: str | None = None
    key_name: str | None = None
    key_file: str | None = None
    ssh_user: str = "ubuntu"
    ssh_cidr: str | None = None
    ami: str | None = None
    ubuntu: str = "22.04"
    az: str | None = None
    subnet: str | None = None
    placement_group: bool | None = None   # None: on when count > 1
    capacity_reservation: str | None = None
    spot: bool = False
    ttl_hours: float = 24.0               # 0: no expiry
    disk_gb: int = 200
    inventory: str | None = None         # the command fills in the cluster's own folder
    skip_setup: bool = False
    wait_ssh: bool = True
    keep_on_failure: bool = False


@dataclass(frozen=True)
class SiteFacts:
    """What the account and the network said; placeholders where nothing could be asked."""

    region: str
    az: str
    subnet_id: str
    vpc_id: str
    ami_id: str
    ami_description: str
    root_device: str
    ssh_cidr: str
    unresolved: tuple[str, ...] = ()    # why a value above is a placeholder


@dataclass(frozen=True)
class NetworkInterface:
    card: int
    device: int
    efa: bool


@dataclass(frozen=True)
class Rule:
    direction: str           # ingress | egress
    protocol: str            # "-1" (all) or "tcp"
    port: int | None
    peer: str                # "self" or a CIDR
    why: str

    def describe(self) -> str:
        what = "all traffic" if self.protocol == "-1" else f"{self.protocol} {self.port}"
        peer = "this security group" if self.peer == "self" else self.peer
        return f"{self.direction:<8}{what} {'from' if self.direction == 'ingress' else 'to'} " \
               f"{peer} ({self.why})"


@dataclass(frozen=True)
class ProvisionPlan:
    cluster: str
    site: SiteFacts                   # region, zone, subnet, image, SSH CIDR
    instance: InstanceFacts
    count: int
    disk_gb: int
    key_name: str | None
    key_file: str | None
    ssh_user: str
    market: str                       # on-demand | spot
    capacity_reservation: str | None
    placement_group: str | None
    interfaces: tuple[NetworkInterface, ...]
    elastic_ips: bool
    security_group: str
    rules: tuple[Rule, ...]
    tags: dict[str, str]
    created_at: str
    expires_at: str | None
    cost_per_hour: float
    inventory: str
    steps: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["instance"] = self.instance.to_json()
        return data


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def validate_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.match(name or ""):
        raise ProvisionSpecError(
            f"cluster name {name!r} is not usable: use 1-40 lowercase letters, digits and '-', "
            "starting with a letter (it becomes part of security group, placement group and host "
            "names)"
        )
    return name


def normalize_cidr(text: str) -> str:
    """A CIDR with host bits cleared; a bare address becomes a single-host network."""
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ProvisionSpecError(
            f"--ssh-cidr {text!r} is not an address or CIDR block (example: 203.0.113.7/32)"
        ) from None
    return str(net)


def validate_spec(spec: ProvisionSpec) -> None:
    validate_cluster_name(spec.cluster)
    if spec.count < 1:
        raise ProvisionSpecError(f"--count must be at least 1, got {spec.count}")
    if spec.ttl_hours < 0:
        raise ProvisionSpecError(f"--ttl must be 0 (no expiry) or more hours, got {spec.ttl_hours}")
    if spec.disk_gb < 30:
        raise ProvisionSpecError(
            f"--disk-gb {spec.disk_gb} is too small for the NVIDIA driver, CUDA and torch; "
            "use at least 30"
        )
    if spec.spot and spec.capacity_reservation:
        raise ProvisionSpecError(
            "--spot and --capacity-reservation exclude each other: a capacity reservation is "
            "on-demand capacity; drop one of them"
        )
    if spec.ubuntu not in UBUNTU_RELEASES:
        raise ProvisionSpecError(
            f"--ubuntu {spec.ubuntu} is not supported; choose one of {', '.join(UBUNTU_RELEASES)}"
        )
    if spec.placement_group and spec.count == 1:
        raise ProvisionSpecError(
            "--placement-group needs --count of 2 or more: a cluster placement group only "
            "matters between instances"
        )


def ubuntu_ssm_parameter(release: str, architecture: str) -> str:
    return (f"/aws/service/canonical/ubuntu/server/{release}/stable/current/"
            f"{SSM_ARCH[architecture]}/hvm/{UBUNTU_RELEASES[release]}/ami-id")


def network_interfaces(facts: InstanceFacts) -> tuple[NetworkInterface, ...]:
    """One EFA interface per network card up to the type's EFA limit; card 0 is the primary.

    AWS requires device index 0 on card 0 and device index 1 for the interface on every other
    card. Types without EFA get the ordinary single interface.
    """
    if not facts.efa_supported:
        return (NetworkInterface(card=0, device=0, efa=False),)
    cards = min(facts.network_cards, facts.efa_max_interfaces)
    return tuple(NetworkInterface(card=c, device=0 if c == 0 else 1, efa=True)
                 for c in range(cards))


def security_rules(ssh_cidr: str) -> tuple[Rule, ...]:
    return (
        Rule("ingress", "-1", None, "self", "NCCL and EFA between the nodes"),
        Rule("ingress", "tcp", 22, ssh_cidr, "SSH"),
        # AWS's EFA guide asks for the outbound self rule too, in case the default one is removed.
        Rule("egress", "-1", None, "self", "EFA between the nodes"),
    )


def resource_tags(cluster: str, created_at: str, expires_at: str | None) -> dict[str, str]:
    return {
        CLUSTER_TAG: cluster,
        CREATED_BY_TAG: "launch",
        CREATED_AT_TAG: created_at,
        EXPIRES_AT_TAG: expires_at or "never",
    }


def plan_provision(spec: ProvisionSpec, site: SiteFacts, facts: InstanceFacts,
                   now: datetime) -> ProvisionPlan:
    """The whole plan. `now` is the cluster's creation time (kept from the ledger on re-runs)."""
    validate_spec(spec)
    interfaces = network_interfaces(facts)
    use_pg = spec.count > 1 if spec.placement_group is None else spec.placement_group
    created = iso(now)
    expires = iso(now + timedelta(hours=spec.ttl_hours)) if spec.ttl_hours else None
    warnings: list[str] = []
    if site.ssh_cidr in ("0.0.0.0/0", "::/0"):
        warnings.append(f"SSH is open to the whole internet ({site.ssh_cidr}), as --ssh-cidr asked")
    if spec.count > 1 and not use_pg:
        warnings.append("no cluster placement group: nodes may land far apart and NCCL between "
                        "them will be slower")
    if len(interfaces) > 1:
        warnings.append(
            f"each instance gets {len(interfaces)} network interfaces, and EC2 gives no automatic "
            "public IPv4 address to such instances: launch allocates one Elastic IP per instance "
            "(the default quota is 5 per region)"
        )
    if spec.spot:
        warnings.append("spot instances can be reclaimed with two minutes' notice; the cost shown "
                        "is the on-demand ceiling")
    if not spec.key_name:
        warnings.append("no --key-name: the instances get no SSH key pair, so nothing can log in "
                        "unless the AMI provides another way")
    inventory = spec.inventory or "inventory.yml"
    steps = ["wait until every instance is running and passes its status checks"]
    if len(interfaces) > 1:
        steps.append("allocate and associate one Elastic IP per instance")
    if spec.wait_ssh:
        steps.append("wait for SSH and record the host keys")
    steps.append(f"write the inventory {inventory}")
    steps.append("skip `launch setup` (--skip-setup)" if spec.skip_setup
                 else "run `launch setup` on every node")
    return ProvisionPlan(
        cluster=spec.cluster,
        site=site,
        instance=facts,
        count=spec.count,
        disk_gb=spec.disk_gb,
        key_name=spec.key_name,
        key_file=spec.key_file,
        ssh_user=spec.ssh_user,
        market="spot" if spec.spot else "on-demand",
        capacity_reservation=spec.capacity_reservation,
        placement_group=f"launch-{spec.cluster}" if use_pg else None,
        interfaces=interfaces,
        elastic_ips=len(interfaces) > 1,
        security_group=f"launch-{spec.cluster}",
        rules=security_rules(site.ssh_cidr),
        tags=resource_tags(spec.cluster, created, expires),
        created_at=created,
        expires_at=expires,
        cost_per_hour=round(facts.price_per_hour * spec.count, 4),
        inventory=inventory,
        steps=tuple(steps),
        warnings=tuple(warnings),
    )


# ---- EC2 request bodies -------------------------------------------------------------------

def tag_specifications(plan: ProvisionPlan, *resource_types: str,
                       name: str | None = None) -> list[dict[str, Any]]:
    tags = [{"Key": k, "Value": v} for k, v in plan.tags.items()]
    if name:
        tags.append({"Key": "Name", "Value": name})
    return [{"ResourceType": rt, "Tags": tags} for rt in resource_types]


def security_group_request(plan: ProvisionPlan) -> dict[str, Any]:
    return {
        "GroupName": plan.security_group,
        "Description": f"launch cluster {plan.cluster}: nodes talk freely, SSH from "
                       f"{plan.site.ssh_cidr}",
        "VpcId": plan.site.vpc_id,
        "TagSpecifications": tag_specifications(plan, "security-group", name=plan.security_group),
    }


def _permission(rule: Rule, group_id: str) -> dict[str, Any]:
    perm: dict[str, Any] = {"IpProtocol": rule.protocol}
    if rule.port is not None:
        perm["FromPort"] = perm["ToPort"] = rule.port
    if rule.peer == "self":
        perm["UserIdGroupPairs"] = [{"GroupId": group_id, "Description": rule.why}]
    elif ":" in rule.peer:
        perm["Ipv6Ranges"] = [{"CidrIpv6": rule.peer, "Description": rule.why}]
    else:
        perm["IpRanges"] = [{"CidrIp": rule.peer, "Description": rule.why}]
    return perm


def rule_requests(plan: ProvisionPlan, group_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(direction, AuthorizeSecurityGroupIngress/Egress body) with one permission each."""
    return [(rule.direction, {"GroupId": group_id, "IpPermissions": [_permission(rule, group_id)]})
            for rule in plan.rules]


def placement_group_request(plan: ProvisionPlan) -> dict[str, Any]:
    assert plan.placement_group
    return {
        "GroupName": plan.placement_group,
        "Strategy": "cluster",
        "TagSpecifications": tag_specifications(plan, "placement-group",
                                                name=plan.placement_group),
    }


def run_instances_request(plan: ProvisionPlan, group_id: str, count: int,
                          client_token: str) -> dict[str, Any]:
    """RunInstances for `count` instances, all or nothing (MinCount = MaxCount)."""
    interfaces = []
    for nic in plan.interfaces:
        spec: dict[str, Any] = {
            "NetworkCardIndex": nic.card,
            "DeviceIndex": nic.device,
            "SubnetId": plan.site.subnet_id,
            "Groups": [group_id],
            "DeleteOnTermination": True,
        }
        if nic.efa:
            spec["InterfaceType"] = "efa"
        if not plan.elastic_ips:
            # Allowed only with a single interface; several interfaces get Elastic IPs instead.
            spec["AssociatePublicIpAddress"] = True
        interfaces.append(spec)
    placement: dict[str, Any] = {"AvailabilityZone": plan.site.az}
    if plan.placement_group:
        placement["GroupName"] = plan.placement_group
    request: dict[str, Any] = {
        "ImageId": plan.site.ami_id,
        "InstanceType": plan.instance.instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": client_token,
        "NetworkInterfaces": interfaces,
        "Placement": placement,
        "BlockDeviceMappings": [{
            "DeviceName": plan.site.root_device,
            "Ebs": {"VolumeSize": plan.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True},
        }],
        # IMDSv2 only: credentials of an instance role cannot leak through a forwarded request.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": tag_specifications(
            plan, "instance", "volume", "network-interface", name=plan.cluster),
    }
    if plan.key_name:
        request["KeyName"] = plan.key_name
    if plan.market == "spot":
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time",
                            "InstanceInterruptionBehavior": "terminate"},
        }
    if plan.capacity_reservation:
        request["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": plan.capacity_reservation}
        }
    return request


def allocate_address_request(plan: ProvisionPlan, node_name: str) -> dict[str, Any]:
    return {"Domain": "vpc",
            "TagSpecifications": tag_specifications(plan, "elastic-ip", name=node_name)}


def node_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"


# ---- text -----------------------------------------------------------------------------------

def render_plan(plan: ProvisionPlan) -> str:
    f = plan.instance
    lines = [f"Provision plan for cluster {plan.cluster}"]

    def row(key: str, value: str) -> None:
        lines.append(f"  {key:<19}{value}")

    row("region", plan.site.region)
    row("instance type", f"{f.instance_type} x {plan.count}  ({f.gpu_summary}, {f.interconnect}, "
                         f"{f.gpu_link} {f.gpu_link_gbps:g} GB/s per GPU)")
    row("availability zone", f"{plan.site.az}  (subnet {plan.site.subnet_id}, {plan.site.vpc_id})")
    row("AMI", f"{plan.site.ami_id}  ({plan.site.ami_description})")
    row("root volume", f"{plan.disk_gb} GB gp3 on {plan.site.root_device}")
    row("key pair", plan.key_name or "(none)")
    market = plan.market
    if plan.capacity_reservation:
        market += f", capacity reservation {plan.capacity_reservation}"
    row("market", market)
    row("placement group", f"{plan.placement_group} (cluster strategy)" if plan.placement_group
        else "(none)")
    if plan.interfaces[0].efa:
        row("EFA interfaces", f"{len(plan.interfaces)} per instance "
                              f"(type limit {f.efa_max_interfaces}, {f.network_cards} cards)")
        for nic in plan.interfaces:
            lines.append(f"    card {nic.card} device {nic.device} efa"
                         f"{'  (primary)' if nic.card == 0 else ''}")
    else:
        row("EFA interfaces", "none (the type has no EFA); one ordinary interface")
    row("public address", "one Elastic IP per instance" if plan.elastic_ips
        else "automatic public IPv4")
    row("security group", f"{plan.security_group} in {plan.site.vpc_id}")
    for rule in plan.rules:
        lines.append(f"    {rule.describe()}")
    lines.append("    egress  all traffic to 0.0.0.0/0 (AWS's default outbound rule: setup "
                 "downloads packages)")
    row("tags", " ".join(f"{k}={v}" for k, v in plan.tags.items()))
    row("cost", f"${plan.cost_per_hour:,.2f} per hour ({plan.count} x ${f.price_per_hour:,.4g} "
                f"on-demand, {PRICE_REGION} list price of {f.price_as_of})")
    lines.append("  then")
    for step in plan.steps:
        lines.append(f"    - {step}")
    for warning in plan.warnings:
        lines.append(f"  warning: {warning}")
    for reason in plan.site.unresolved:
        lines.append(f"  not looked up: {reason}")
    return "\n".join(lines) + "\n"

