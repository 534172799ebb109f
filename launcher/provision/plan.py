"""Pure provisioning plan: what `launch provision` will create, computed without the network.

`plan_provision(spec, site, facts, now, account)` turns the user's request (ProvisionSpec), what
AWS said about the region (SiteFacts, looked up by resolve.py), the instance facts and the
account's quotas (AccountFacts) into a ProvisionPlan. `--dry-run` prints that plan
(render.py); a real run hands it to provisioner.py, which builds its EC2 request bodies with
requests.py. Nothing here touches the network, the disk or the clock.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from launcher.cluster.catalog import InstanceFacts, Price
from launcher.cluster.inventory import MARKETS
from launcher.core.errors import LauncherError
from launcher.core.names import name_problem, shown
from launcher.provision import interfaces as nics
from launcher.provision import quotas, reservations, ttl
from launcher.provision.interfaces import NetworkInterface
from launcher.provision.quotas import AccountFacts, QuotaCheck
from launcher.provision.reservations import Reservation

CLUSTER_TAG = "launch:cluster"
CREATED_BY_TAG = "created-by"
CREATED_AT_TAG = "launch:created-at"
EXPIRES_AT_TAG = "launch:expires-at"

# The interpreter the setup playbooks' python_env role creates on every node.
NODE_PYTHON = "/opt/launch/venv/bin/python"

# Canonical's public SSM parameters. 24.04 images are published as gp3 only, 22.04 as gp2.
UBUNTU_RELEASES = {"22.04": "ebs-gp2", "24.04": "ebs-gp3"}
SSM_ARCH = {"x86_64": "amd64", "arm64": "arm64"}

PUBLIC_IP_MODES = ("head", "all", "none")
IMAGES = ("ubuntu", "dlami")

_JUMP = re.compile(r"(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9.:-]+?)"
                   r"(?::(?P<port>[0-9]{1,5}))?")


class ProvisionSpecError(LauncherError):
    pass


class QuotaExceeded(LauncherError):
    pass


@dataclass(frozen=True)
class ProvisionSpec:
    """What the user asked for on the command line."""

    cluster: str
    instance_type: str
    count: int = 1
    region: str | None = None
    fallback_regions: tuple[str, ...] = ()   # --region a,b,c: tried in order after `region`
    key_name: str | None = None
    key_file: str | None = None
    ssh_user: str = "ubuntu"
    ssh_cidr: str | None = None
    ami: str | None = None
    image: str = "ubuntu"                    # ubuntu | dlami (when --ami is not given)
    ubuntu: str = "22.04"
    az: str | None = None
    subnet: str | None = None
    placement_group: bool | None = None      # None: on when count > 1
    capacity_reservation: str | None = None
    # on-demand | spot | capacity-block; None: on-demand, or capacity-block when the
    # reservation is a Capacity Block.
    market: str | None = None
    public_ip: str = "head"                  # head | all | none
    jump: str | None = None                  # [user@]host[:port] every node is reached through
    ttl_hours: float = 24.0                  # 0: no expiry
    disk_gb: int = 200
    encrypt_root: bool = True
    instance_profile: str | None = None
    inventory: str | None = None             # the command fills in the cluster's own folder
    skip_setup: bool = False
    wait_ssh: bool = True
    keep_on_failure: bool = False

    @property
    def spot(self) -> bool:
        return self.market == "spot"


@dataclass(frozen=True)
class Zone:
    az: str
    subnet_id: str
    vpc_id: str


@dataclass(frozen=True)
class SiteFacts:
    """What the region and the network said; placeholders where nothing could be asked."""

    region: str
    zones: tuple[Zone, ...]          # tried in this order; the first is the plan's zone
    ami_id: str
    ami_description: str
    root_device: str
    ssh_cidr: str
    zone_order: str = ""             # why the zones come in this order
    reservation: Reservation | None = None
    unresolved: tuple[str, ...] = ()  # why a value above is a placeholder

    @property
    def az(self) -> str:
        return self.zones[0].az

    @property
    def subnet_id(self) -> str:
        return self.zones[0].subnet_id

    @property
    def vpc_id(self) -> str:
        return self.zones[0].vpc_id


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
class JumpHost:
    host: str
    port: int = 22
    user: str | None = None

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}" \
               f"{':' + str(self.port) if self.port != 22 else ''}"


@dataclass(frozen=True)
class ProvisionPlan:
    cluster: str
    site: SiteFacts
    instance: InstanceFacts
    count: int
    existing: int                     # instances of the cluster alive when planned
    disk_gb: int
    encrypt_root: bool
    key_name: str | None
    key_file: str | None
    ssh_user: str
    market: str                       # on-demand | spot | capacity-block
    reservation: Reservation | None
    placement_group: str | None       # for the plan's zone (zones[0])
    owns_placement_group: bool        # False: the reservation's group, never created or deleted
    interfaces: tuple[NetworkInterface, ...]
    public_ip: str                    # head | all | none
    elastic_ip_nodes: tuple[int, ...]  # node indices that get an Elastic IP
    auto_public_ip: bool | None       # single interface: EC2's own public address or not
    jump: JumpHost | None
    image: str                        # "ubuntu", "dlami" or "ami" (--ami)
    instance_profile: str | None
    security_group: str
    rules: tuple[Rule, ...]
    tags: dict[str, str]
    created_at: str
    expires_at: str | None
    user_data: str | None             # the node-side TTL timer
    price: Price | None
    cost_per_hour: float | None
    quotas: tuple[QuotaCheck, ...]
    inventory: str
    steps: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def missing(self) -> int:
        return max(self.count - self.existing, 0)

    @property
    def interruptible(self) -> bool:
        """Spot: EC2 may reclaim a node with two minutes' notice."""
        return self.market == "spot"

    @property
    def public_nodes(self) -> tuple[int, ...]:
        """Node indices reachable at a public address."""
        if self.public_ip == "all":
            return tuple(range(self.count))
        return (0,) if self.public_ip == "head" else ()

    @property
    def refusals(self) -> tuple[QuotaCheck, ...]:
        return tuple(q for q in self.quotas if q.status == "short")

    def in_zone(self, zone: Zone) -> "ProvisionPlan":
        """The same plan placed in another of its zones (a placement group binds to a zone)."""
        group = self.placement_group
        if self.owns_placement_group and group:
            group = placement_group_name(self.cluster, zone.az)
        return replace(self, site=replace(self.site, zones=(zone,)), placement_group=group)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["instance"] = self.instance.to_json()
        data["site"]["az"] = self.site.az
        data["jump"] = str(self.jump) if self.jump else None
        return data


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


# The longest TTL launch writes: ten years. Digits alone can say more than a date can hold (a
# 400-digit number of hours is infinity as a float, and no expiry date at all).
MAX_TTL_HOURS = 10 * 366 * 24


def parse_duration(text: str) -> float:
    """'8h', '90m', '2d' or a bare number of hours -> hours."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mhd]?)\s*", str(text))
    if not match:
        raise ProvisionSpecError(
            f"--ttl {text!r} is not a duration: use hours (8), or 90m, 8h, 2d; 0 for no expiry")
    value = float(match.group(1)[:40])   # enough digits to tell it is too long
    hours = value * {"m": 1 / 60, "h": 1.0, "d": 24.0, "": 1.0}[match.group(2)]
    if len(match.group(1).split(".")[0]) > 30 or hours > MAX_TTL_HOURS:
        raise ProvisionSpecError(
            f"--ttl {shown(text)} is longer than launch sets an expiry (at most "
            f"{MAX_TTL_HOURS // 24}d); 0 for no expiry")
    return hours


def validate_cluster_name(name: str) -> str:
    why = name_problem("cluster name", name)
    if why:
        raise ProvisionSpecError(
            f"cluster name {shown(name)} is not usable: {why} (it becomes part of security "
            "group, placement group and host names)")
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


def parse_jump(text: str) -> JumpHost:
    match = _JUMP.fullmatch(text.strip())
    if not match or not match.group("host") or match.group("host").startswith("-"):
        raise ProvisionSpecError(f"--jump {text!r} is not [user@]host[:port] "
                                 "(example: ec2-user@bastion.example.com)")
    port = int(match.group("port") or 22)
    if not 0 < port < 65536:
        raise ProvisionSpecError(f"--jump {text!r}: port {port} is not a TCP port")
    return JumpHost(match.group("host"), port, match.group("user"))


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
    if spec.market is not None and spec.market not in MARKETS:
        raise ProvisionSpecError(f"--market {spec.market} is not one of {', '.join(MARKETS)}")
    if spec.spot and spec.capacity_reservation:
        raise ProvisionSpecError(
            "--spot and --capacity-reservation exclude each other: a capacity reservation is "
            "on-demand capacity; drop one of them"
        )
    if spec.market == "capacity-block" and not spec.capacity_reservation:
        raise ProvisionSpecError(
            "--market capacity-block launches into a Capacity Block you bought: pass its id "
            "with --capacity-reservation cr-...")
    if spec.ubuntu not in UBUNTU_RELEASES:
        raise ProvisionSpecError(
            f"--ubuntu {spec.ubuntu} is not supported; choose one of {', '.join(UBUNTU_RELEASES)}"
        )
    if spec.image not in IMAGES:
        raise ProvisionSpecError(f"--image {spec.image} is not known; choose one of "
                                 f"{', '.join(IMAGES)} (or pass --ami ID)")
    if spec.ami and spec.image != "ubuntu":
        raise ProvisionSpecError(f"--ami and --image {spec.image} exclude each other: --ami "
                                 "names the image itself; drop one of them")
    if spec.placement_group and spec.count == 1:
        raise ProvisionSpecError(
            "--placement-group needs --count of 2 or more: a cluster placement group only "
            "matters between instances"
        )
    if spec.public_ip not in PUBLIC_IP_MODES:
        raise ProvisionSpecError(f"--public-ip {spec.public_ip} is not one of "
                                 f"{', '.join(PUBLIC_IP_MODES)}")
    if spec.jump:
        parse_jump(spec.jump)
    if spec.fallback_regions:
        pinned = [flag for flag, value in (("--az", spec.az), ("--subnet", spec.subnet),
                                           ("--capacity-reservation", spec.capacity_reservation),
                                           ("--ami", spec.ami)) if value]
        if pinned:
            raise ProvisionSpecError(
                f"{', '.join(pinned)} belong(s) to one region, but --region lists several; pass "
                "a single --region")


def ubuntu_ssm_parameter(release: str, architecture: str) -> str:
    return (f"/aws/service/canonical/ubuntu/server/{release}/stable/current/"
            f"{SSM_ARCH[architecture]}/hvm/{UBUNTU_RELEASES[release]}/ami-id")


def dlami_ssm_parameter(release: str, architecture: str) -> str:
    """AWS Deep Learning Base OSS Nvidia Driver GPU AMI: driver, CUDA, EFA and NCCL installed."""
    return (f"/aws/service/deeplearning/ami/{architecture}/base-oss-nvidia-driver-gpu-ubuntu-"
            f"{release}/latest/ami-id")


def image_parameter(spec: ProvisionSpec, architecture: str) -> str:
    if spec.image == "dlami":
        return dlami_ssm_parameter(spec.ubuntu, architecture)
    return ubuntu_ssm_parameter(spec.ubuntu, architecture)


def market_of(spec: ProvisionSpec, res: Reservation | None) -> str:
    """The cluster's market: what was asked, checked against the reservation's kind (a
    Capacity Block launches only as capacity-block, another reservation only on-demand)."""
    block = res is not None and res.capacity_block
    if spec.market == "capacity-block" and res is not None and not block:
        raise ProvisionSpecError(f"--market capacity-block: {res.label} is an on-demand "
                                 "capacity reservation, not a Capacity Block; drop --market")
    if block and spec.market == "on-demand":
        raise ProvisionSpecError(f"--market on-demand: {res.label} is a Capacity Block, whose "
                                 "instances launch as capacity-block; drop --market")
    return "capacity-block" if block else spec.market or "on-demand"


def placement_group_name(cluster: str, az: str) -> str:
    # One group per zone: a cluster placement group binds to the zone of its first instance,
    # so failing over to another zone needs a group of its own.
    return f"launch-{cluster}-{'<zone>' if az.startswith('<') else az}"


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


def public_addressing(mode: str, count: int,
                      interfaces: tuple[NetworkInterface, ...]) -> tuple[tuple[int, ...],
                                                                          bool | None]:
    """(nodes that get an Elastic IP, AssociatePublicIpAddress for single-interface types).

    EC2 gives no automatic public address to an instance with several interfaces, and one
    RunInstances call cannot give it to only one of its instances: `head` therefore launches
    every node without one and gives the head an Elastic IP.
    """
    single = len(interfaces) == 1
    if mode == "all":
        return (() if single else tuple(range(count))), (True if single else None)
    if mode == "head":
        return (0,), (False if single else None)
    return (), (False if single else None)


def plan_provision(spec: ProvisionSpec, site: SiteFacts, facts: InstanceFacts, now: datetime,
                   account: AccountFacts | None = None) -> ProvisionPlan:
    """The whole plan. `now` is the cluster's creation time (kept from the ledger on re-runs)."""
    validate_spec(spec)
    existing = account.existing_instances if account else 0
    missing = max(spec.count - existing, 0)
    res = site.reservation
    if res is not None:
        reservations.check(res, instance_type=facts.instance_type, missing=missing, now=now,
                           az=spec.az, subnet=spec.subnet,
                           subnet_az=site.az if spec.subnet else None,
                           placement_group=spec.placement_group)
    layout = nics.layout(facts)
    if res is not None:
        group, owned = res.placement_group, False
    else:
        use_pg = spec.count > 1 if spec.placement_group is None else spec.placement_group
        group, owned = (placement_group_name(spec.cluster, site.az) if use_pg else None), use_pg
    eip_nodes, auto_public = public_addressing(spec.public_ip, spec.count, layout)
    market = market_of(spec, res)
    created = iso(now)
    expires = iso(now + timedelta(hours=spec.ttl_hours)) if spec.ttl_hours else None
    jump = parse_jump(spec.jump) if spec.jump else None
    checks = quotas.checks(
        instance_type=facts.instance_type, vcpus_per_instance=facts.vcpus, missing=missing,
        market=market, eips_needed=len(eip_nodes), account=account, region=site.region,
        reserved=res is not None)
    price = facts.price
    warnings = _warnings(spec, site, facts, layout, group, market, expires, res, checks, jump)
    inventory = spec.inventory or "inventory.yml"
    return ProvisionPlan(
        cluster=spec.cluster,
        site=site,
        instance=facts,
        count=spec.count,
        existing=existing,
        disk_gb=spec.disk_gb,
        encrypt_root=spec.encrypt_root,
        key_name=spec.key_name,
        key_file=spec.key_file,
        ssh_user=spec.ssh_user,
        market=market,
        reservation=res,
        placement_group=group,
        owns_placement_group=owned,
        interfaces=layout,
        public_ip=spec.public_ip,
        elastic_ip_nodes=eip_nodes,
        auto_public_ip=auto_public,
        jump=jump,
        image="ami" if spec.ami else spec.image,
        instance_profile=spec.instance_profile,
        security_group=f"launch-{spec.cluster}",
        rules=security_rules(site.ssh_cidr),
        tags=resource_tags(spec.cluster, created, expires),
        created_at=created,
        expires_at=expires,
        user_data=ttl.user_data(expires) if expires else None,
        price=price,
        cost_per_hour=round(price.usd_per_hour * spec.count, 4) if price else None,
        quotas=checks,
        inventory=inventory,
        steps=_steps(spec, eip_nodes, inventory),
        warnings=tuple(warnings),
    )


def _steps(spec: ProvisionSpec, eip_nodes: tuple[int, ...], inventory: str) -> tuple[str, ...]:
    steps = ["wait until every instance is running and passes its status checks"]
    if eip_nodes:
        steps.append("allocate and associate an Elastic IP for " +
                     ("the head node" if eip_nodes == (0,) else "every node"))
    if spec.wait_ssh:
        steps.append("wait for SSH and record the host keys" +
                     (" (the other nodes through the head)" if spec.public_ip == "head"
                      and spec.count > 1 else ""))
    steps.append(f"write the inventory {inventory}")
    if spec.skip_setup:
        steps.append("skip `launch setup` (--skip-setup)")
    elif spec.image == "dlami":
        steps.append("run `launch setup --tags python_env,node_facts` (the image brings the "
                     "driver, EFA and NCCL; node facts record what it has)")
    else:
        steps.append("run `launch setup` on every node")
    return tuple(steps)


def _warnings(spec: ProvisionSpec, site: SiteFacts, facts: InstanceFacts,
              layout: tuple[NetworkInterface, ...], group: str | None, market: str,
              expires: str | None, res: Reservation | None, checks: tuple[QuotaCheck, ...],
              jump: JumpHost | None) -> list[str]:
    warnings: list[str] = []
    if site.ssh_cidr in ("0.0.0.0/0", "::/0"):
        warnings.append(f"SSH is open to the whole internet ({site.ssh_cidr}), as --ssh-cidr asked")
    if spec.count > 1 and not group:
        warnings.append("no cluster placement group: nodes may land far apart and NCCL between "
                        "them will be slower")
    if spec.public_ip == "all" and len(layout) > 1:
        warnings.append(
            f"each instance gets {len(layout)} network interfaces, and EC2 gives no automatic "
            "public IPv4 address to such instances: --public-ip all allocates one Elastic IP per "
            "instance (the default quota is 5 per region)")
    if spec.public_ip == "none" and not jump:
        warnings.append("--public-ip none: no node gets a public address; this machine must "
                        "reach their private addresses (VPN, Direct Connect) or pass --jump")
    if market == "spot":
        warnings.append("spot instances can be reclaimed with two minutes' notice; the cost shown "
                        "is the on-demand ceiling")
    if not spec.key_name:
        warnings.append("no --key-name: the instances get no SSH key pair, so nothing can log in "
                        "unless the AMI provides another way")
    if facts.price is None:
        warnings.append(f"no on-demand list price is known for {facts.instance_type}: the cost "
                        "is not estimated")
    if facts.interconnect == "unknown":
        warnings.append(f"launch's table has no interconnect facts for {facts.instance_type}: "
                        "reports will not compare bandwidth with a peak")
    if res is not None and res.end and expires and res.end < expires:
        warnings.append(f"{res.label} ends at {res.end}, before the --ttl expiry {expires}: EC2 "
                        "terminates the instances when the reservation ends")
    for q in checks:
        if q.status == "unknown":
            warnings.append(f"quota {q.name}: {q.detail}")
    return warnings


def render_refusals(plan: ProvisionPlan) -> str:
    return "; ".join(f"{q.name} ({q.code}) {q.detail}" for q in plan.refusals)


def check_quotas(plan: ProvisionPlan) -> None:
    """Refuse before creating anything when a quota cannot fit the cluster."""
    if plan.refusals:
        raise QuotaExceeded(
            f"cluster {plan.cluster} does not fit the account's quotas in {plan.site.region}, "
            f"so nothing was created: {render_refusals(plan)}")


def node_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"
