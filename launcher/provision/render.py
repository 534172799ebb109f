"""The plan as text: what `launch provision --dry-run` prints before anything is created."""

from __future__ import annotations

from launcher.provision.interfaces import NetworkInterface, addresses_per_instance
from launcher.provision.plan import ProvisionPlan, node_name

QUOTA_MARK = {"ok": "ok  ", "short": "FAIL", "unknown": "?   ", "not-needed": "-   "}


def _runs(interfaces: tuple[NetworkInterface, ...]) -> list[tuple[int, int, NetworkInterface]]:
    """Consecutive cards with the same interface, as (first card, last card, interface)."""
    runs: list[tuple[int, int, NetworkInterface]] = []
    for nic in interfaces:
        if runs and not nic.primary and not runs[-1][2].primary and \
                (runs[-1][2].device, runs[-1][2].kind) == (nic.device, nic.kind) and \
                runs[-1][1] + 1 == nic.card:
            runs[-1] = (runs[-1][0], nic.card, runs[-1][2])
        else:
            runs.append((nic.card, nic.card, nic))
    return runs


def _public(plan: ProvisionPlan) -> str:
    head = node_name(plan.cluster, 0)
    via = f"; every node through {plan.jump}" if plan.jump else ""
    if plan.public_ip == "head":
        return (f"head only: an Elastic IP on {head}" +
                ("; the other nodes are reached through it (ProxyCommand)" if plan.count > 1
                 else "") + via)
    if plan.public_ip == "all":
        return ("every node: one Elastic IP each" if plan.elastic_ip_nodes
                else "every node: EC2's automatic public IPv4") + via
    return "none: nodes keep private addresses only" + via


def _market(plan: ProvisionPlan) -> str:
    res = plan.reservation
    if res is None:
        return plan.market
    window = f", {res.start} to {res.end}" if res.start and res.end else ""
    return (f"{plan.market}, {res.label} ({res.az}, {res.available} of {res.total} free"
            f"{window})")


def _cost(plan: ProvisionPlan) -> str:
    if plan.market == "capacity-block":
        return "a Capacity Block is paid for when it is reserved"
    if plan.price is None or plan.cost_per_hour is None:
        return "unknown (no on-demand list price for this type)"
    return (f"${plan.cost_per_hour:,.2f} per hour ({plan.count} x "
            f"${plan.price.usd_per_hour:,.4g}, {plan.price.label()})")


def render_plan(plan: ProvisionPlan) -> str:
    f = plan.instance
    site = plan.site
    lines = [f"Provision plan for cluster {plan.cluster}"]

    def row(key: str, value: str) -> None:
        lines.append(f"  {key:<19}{value}")

    row("region", site.region)
    row("instance type", f"{f.instance_type} x {plan.count}  ({f.gpu_summary}, "
                         f"{f.interconnect}, {f.link_summary})")
    row("facts from", f.source)
    if plan.existing:
        row("already running", f"{plan.existing} of {plan.count}; {plan.missing} to launch")
    row("availability zone", f"{site.az}  (subnet {site.subnet_id}, {site.vpc_id})")
    if len(site.zones) > 1:
        row("zones to try", ", ".join(z.az for z in site.zones) +
            (f"  ({site.zone_order})" if site.zone_order else ""))
    row("AMI", f"{site.ami_id}  ({site.ami_description})")
    row("root volume", f"{plan.disk_gb} GB gp3 on {site.root_device}"
                       f"{', encrypted' if plan.encrypt_root else ', NOT encrypted'}")
    row("key pair", plan.key_name or "(none)")
    row("market", _market(plan))
    if plan.placement_group:
        row("placement group", f"{plan.placement_group} ("
            + ("cluster strategy, one per zone tried" if plan.owns_placement_group
               else "the reservation's, used as it is") + ")")
    else:
        row("placement group", "(none)")
    efa = sum(1 for nic in plan.interfaces if nic.efa)
    if efa:
        row("interfaces", f"{len(plan.interfaces)} per instance, {efa} EFA, "
                          f"{addresses_per_instance(plan.interfaces)} IP address (type limit "
                          f"{f.efa_max_interfaces} EFA, {f.network_cards} cards)")
        for first, last, nic in _runs(plan.interfaces):
            cards = f"card {first}" if first == last else f"cards {first}-{last}"
            lines.append(f"    {cards} device {nic.device} {nic.kind}"
                         f"{'  (primary)' if nic.primary else ''}")
    else:
        row("interfaces", "one ordinary interface (the type has no EFA)")
    row("public address", _public(plan))
    if plan.instance_profile:
        row("instance profile", plan.instance_profile)
    row("expiry", f"{plan.expires_at}: each node powers itself off then and EC2 terminates "
                  "it (a timer set from user data)" if plan.expires_at else "never (--ttl 0)")
    row("security group", f"{plan.security_group} in {site.vpc_id}")
    for rule in plan.rules:
        lines.append(f"    {rule.describe()}")
    lines.append("    egress  all traffic to 0.0.0.0/0 (AWS's default outbound rule: setup "
                 "downloads packages)")
    row("tags", " ".join(f"{k}={v}" for k, v in plan.tags.items()))
    if plan.quotas:
        row("quotas", "")
        lines[-1] = lines[-1].rstrip()
        for q in plan.quotas:
            lines.append(f"    {QUOTA_MARK[q.status]} {q.name}"
                         f"{' (' + q.code + ')' if q.code != '-' else ''}: {q.detail}")
    row("cost", _cost(plan))
    lines.append("  then")
    for step in plan.steps:
        lines.append(f"    - {step}")
    for warning in plan.warnings:
        lines.append(f"  warning: {warning}")
    for reason in site.unresolved:
        lines.append(f"  not looked up: {reason}")
    return "\n".join(lines) + "\n"
