"""`launch provision`: resolve, plan, then print it (--dry-run) or carry it out, then set up.

Each region of `--region a,b,...` is tried in turn: a region where every zone lacks capacity,
or whose quotas cannot fit the cluster, hands over to the next one (the quota case before
anything is created there; the capacity case after its cleanup).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError

from launcher.cluster import catalog
from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from launcher.core.home import cluster_dir
from launcher.provision import aws, dryrun, resources
from launcher.provision.aws import AwsError, Clients, NoCredentials
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    ProvisionPlan, ProvisionSpec, ProvisionSpecError, QuotaExceeded, check_quotas, parse_iso,
    plan_provision, render_refusals, validate_spec,
)
from launcher.provision.provisioner import CapacityError, Provisioner
from launcher.provision.render import render_plan
from launcher.provision.resolve import Resolver, offline_site

# `launch setup` on images that bring the driver, EFA and NCCL: only the Python env, and the
# node facts that record (and so verify) what the image has.
DLAMI_SETUP_TAGS = ["python_env", "node_facts"]


class DryRunFailed(LauncherError):
    exit_code = 1


class UnexpectedAnswer(AwsError):
    """Something other than an AWS error broke a call's handling (a garbled answer)."""


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def with_defaults(spec: ProvisionSpec) -> ProvisionSpec:
    """The inventory in the cluster's folder; the private key next to the usual SSH keys."""
    changes: dict[str, Any] = {}
    if spec.key_file:
        changes["key_file"] = str(Path(spec.key_file).expanduser().resolve())
    if not spec.inventory:
        changes["inventory"] = str(cluster_dir(spec.cluster) / "inventory.yml")
    if spec.key_name and not spec.key_file:
        for candidate in (Path.home() / ".ssh" / f"{spec.key_name}.pem",
                          Path.home() / ".ssh" / spec.key_name):
            if candidate.is_file():
                changes["key_file"] = str(candidate)
                break
    return replace(spec, **changes)


def no_credentials() -> NoCredentials:
    return NoCredentials(
        "no AWS credentials found: configure them the usual way (aws configure, AWS_PROFILE, "
        "aws sso login, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or add --dry-run to see "
        "the plan offline"
    )


def default_clients(region: str | None) -> Clients:
    return aws.clients(aws.session(region))


def provision(spec: ProvisionSpec, *, dry_run: bool, as_json: bool,
              clients_for: Callable[[str | None], Clients] = default_clients) -> int:
    validate_spec(spec)
    if not dry_run and not spec.key_name and not spec.skip_setup:
        raise ProvisionSpecError(
            "pass --key-name with an EC2 key pair of the region: `launch setup` must log in to "
            "the instances (create one with `aws ec2 create-key-pair`), or add --skip-setup"
        )
    spec = with_defaults(spec)
    sess = aws.session(spec.region)
    now = datetime.now(timezone.utc)
    if not aws.has_credentials(sess):
        if not dry_run:
            raise no_credentials()
        facts = catalog.lookup(spec.instance_type)
        plan = plan_provision(spec, offline_site(spec, facts, sess.region_name), facts, now)
        emit_dry_run([(plan, None, [])], as_json)
        return 0
    regions = _regions(spec, aws.require_region(sess))
    if dry_run:
        return guarded(lambda: dry_run_regions(spec, regions, now, as_json, clients_for))
    return provision_regions(spec, regions, now, as_json, clients_for)


def guarded(step: Callable[[], Any]) -> Any:
    """A read-only step (planning, a dry run): an answer that breaks our handling of it (a
    garbled response, a missing field) becomes one clear message instead of a traceback.
    Creating steps have their own guard: the provisioner's cleanup."""
    try:
        return step()
    except (LauncherError, KeyboardInterrupt, ClientError, BotoCoreError):
        raise
    except Exception as err:   # noqa: BLE001
        raise UnexpectedAnswer(
            f"an AWS answer could not be used ({type(err).__name__}: {err}); nothing was "
            "created. Run again with `launch --debug` for the traceback, and report it if it "
            "repeats") from err


def _regions(spec: ProvisionSpec, first: str) -> list[str]:
    regions = list(dict.fromkeys([first, *spec.fallback_regions]))
    ledger = Ledger.load(spec.cluster)
    if ledger is not None and ledger.status not in ("new", "deleted"):
        # An existing cluster is topped up where it is, never moved.
        if ledger.region not in regions:
            raise AwsError(f"cluster {spec.cluster} exists in {ledger.region}, not "
                           f"{', '.join(regions)}: pass --region {ledger.region}, or choose "
                           "another --cluster")
        return [ledger.region]
    return regions


def plan_in(spec: ProvisionSpec, region: str, clients: Clients, now: datetime, *,
            dry_run: bool) -> ProvisionPlan:
    """Resolve and plan for one region (read-only calls only)."""
    spec = replace(spec, region=region)
    ledger = Ledger.load(spec.cluster)
    active = ledger is not None and ledger.status not in ("new", "deleted")
    resolver = Resolver(clients, spec, region)
    facts = resolver.priced(resolver.instance_facts())
    account = resolver.account_facts(facts)
    missing = max(spec.count - account.existing_instances, 1)
    site = resolver.site(facts, ledger if active else None, dry_run=dry_run, missing=missing)
    if active and ledger is not None and ledger.data.get("created_at"):
        now = parse_iso(ledger.data["created_at"])  # tags keep the cluster's first creation time
    return plan_provision(spec, site, facts, now, account)


def dry_run_regions(spec: ProvisionSpec, regions: list[str], now: datetime, as_json: bool,
                    clients_for: Callable[[str | None], Clients]) -> int:
    results = []
    for region in regions:
        clients = clients_for(region)
        plan = plan_in(spec, region, clients, now, dry_run=True)
        wants_group = bool(plan.placement_group and plan.owns_placement_group)
        try:
            existing = resources.find(clients.ec2, spec.cluster, states=aws.MEMBER_STATES,
                                      placement_groups=wants_group, vpc_id=plan.site.vpc_id)
        except aws.LOOKUP_ERRORS as err:
            if not wants_group:
                raise
            # A dry run shows the rest even where placement groups cannot be listed.
            existing = resources.find(clients.ec2, spec.cluster, states=aws.MEMBER_STATES,
                                      placement_groups=False, vpc_id=plan.site.vpc_id)
            plan = replace(plan, site=replace(plan.site, unresolved=(
                *plan.site.unresolved, "placement groups: DescribePlacementGroups gave no "
                f"usable answer ({type(err).__name__}); assumed none exists")))
        checks = dryrun.check_calls(clients.ec2, plan, existing, plan.missing)
        results.append((plan, existing, checks))
    emit_dry_run(results, as_json)
    problems = []
    for plan, _, checks in results:
        failed = [c.detail for c in checks if not c.ok]
        if plan.refusals:
            failed.insert(0, render_refusals(plan))
        problems.append((plan.site.region, failed))
    if all(failed for _, failed in problems):
        raise DryRunFailed("; ".join(f"{region}: {len(failed)} problem(s): {'; '.join(failed)}"
                                     for region, failed in problems))
    return 0


def provision_regions(spec: ProvisionSpec, regions: list[str], now: datetime, as_json: bool,
                      clients_for: Callable[[str | None], Clients]) -> int:
    refused: list[str] = []
    for i, region in enumerate(regions):
        following = regions[i + 1] if i + 1 < len(regions) else None
        clients = clients_for(region)
        plan = guarded(lambda: plan_in(spec, region, clients, now, dry_run=False))
        try:
            check_quotas(plan)
            worker = Provisioner(clients.ec2, plan, Ledger.open(spec.cluster, region),
                                 wait_ssh=spec.wait_ssh, keep_on_failure=spec.keep_on_failure,
                                 spec=spec_record(spec, region))
            nodes = worker.run()
        except (CapacityError, QuotaExceeded) as err:
            if following is None:
                if refused:
                    raise type(err)(f"{err}. Earlier regions: {' '.join(refused)}") from None
                raise
            refused.append(f"{region}: {err}")
            say(f"{region}: {err}; trying {following}")
            continue
        emit_summary(worker.plan, nodes, as_json)
        return setup(worker.plan, spec)
    raise AssertionError("unreachable: the last region raises or returns")


def spec_record(spec: ProvisionSpec, region: str) -> dict[str, Any]:
    """What the cluster was asked for, as the ledger keeps it (its region the one used)."""
    from dataclasses import asdict

    return {**asdict(spec), "region": region, "fallback_regions": []}


def setup(plan: ProvisionPlan, spec: ProvisionSpec) -> int:
    if spec.skip_setup:
        return 0
    try:
        # Imported here: setup pulls in ansible-runner, which provisioning itself does not need.
        from launcher.setup.apply import run_setup
    except ImportError as err:
        raise LauncherError(
            f"the cluster is up, but `launch setup` cannot be loaded ({err}); run it later with "
            f"`launch setup -i {plan.inventory}`, or pass --skip-setup next time"
        ) from None
    tags = DLAMI_SETUP_TAGS if plan.image == "dlami" else None
    return run_setup(Path(plan.inventory), cluster=plan.cluster, tags=tags)


def emit_dry_run(results: list[tuple[ProvisionPlan, resources.ClusterResources | None,
                                     list[dryrun.Check]]], as_json: bool) -> None:
    if as_json:
        docs = [{"plan": plan.to_json(),
                 "existing": existing.describe() if existing else None,
                 "checks": [c.__dict__ for c in checks]} for plan, existing, checks in results]
        print(json.dumps({**docs[0], "fallback_regions": docs[1:]}, indent=2))
        return
    text = ""
    for i, (plan, existing, checks) in enumerate(results):
        if i:
            text += f"\nIf {results[i - 1][0].site.region} has no room, then:\n"
        text += render_plan(plan)
        if existing is not None:
            text += ("  already there      " + (", ".join(existing.describe()) or "nothing")
                     + "\n")
        if checks:
            text += "  DryRun checks\n" + "".join(
                f"    {'ok  ' if c.ok else 'FAIL'} {c.operation}: {c.detail}\n" for c in checks)
    text += "Dry run: nothing was created.\n"
    sys.stdout.write(text)


def emit_summary(plan: ProvisionPlan, nodes: list[Node], as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "cluster": plan.cluster, "region": plan.site.region, "az": plan.site.az,
            "instance_type": plan.instance.instance_type, "cost_per_hour": plan.cost_per_hour,
            "price_source": plan.price.label() if plan.price else None,
            "expires_at": plan.expires_at, "inventory": plan.inventory,
            "public_ip": plan.public_ip,
            "nodes": [{"name": n.name, "instance_id": n.extra["instance_id"],
                       "address": n.address, "private_address": n.private_address,
                       "through": _through(n)}
                      for n in nodes],
        }, indent=2))
        return
    cost = (f"${plan.cost_per_hour:,.2f} per hour ({plan.price.label()})"
            if plan.cost_per_hour is not None and plan.price else "cost not estimated")
    if plan.market == "capacity-block":
        cost = "paid with the Capacity Block"
    lines = [
        f"Cluster {plan.cluster} is ready: {plan.count} x {plan.instance.instance_type} in "
        f"{plan.site.az}, {cost}{' (spot costs less)' if plan.market == 'spot' else ''}, "
        + (f"terminates itself at {plan.expires_at} (launch extend to move it)"
           if plan.expires_at else "no expiry"),
    ]
    for n in nodes:
        via = _through(n)
        lines.append(f"  {n.name:<16}{n.extra['instance_id']:<22}{n.address:<17}"
                     f"private {n.private_address}{'  via ' + via if via else ''}")
    lines += [
        f"  inventory   {plan.inventory}",
        f"  run         launch run --nodes {plan.count} -i {plan.inventory} RECIPE.yml",
        f"  ssh         ssh {'-i ' + plan.key_file + ' ' if plan.key_file else ''}"
        f"{plan.ssh_user}@{nodes[0].address}",
        f"  extend      launch extend --cluster {plan.cluster} --ttl 8h",
        f"  tear down   launch teardown --cluster {plan.cluster}",
    ]
    print("\n".join(lines))


def _through(node: Node) -> str | None:
    from launcher.cluster.ssh import gateway_for

    via = gateway_for(node)
    return via.address if isinstance(via, Node) else via
