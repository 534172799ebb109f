"""`launch provision`: resolve, plan, then print it (--dry-run) or carry it out, then set up."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher import catalog
from launcher.errors import LauncherError
from launcher.inventory import Node
from launcher.provision import aws, dryrun, resources
from launcher.provision.aws import AwsError, NoCredentials
from launcher.home import cluster_dir
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    ProvisionPlan, ProvisionSpec, ProvisionSpecError, parse_iso, plan_provision, render_plan,
    validate_spec,
)
from launcher.provision.provisioner import Provisioner
from launcher.provision.resolve import Resolver, offline_site


class DryRunFailed(LauncherError):
    exit_code = 1


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


def provision(spec: ProvisionSpec, *, dry_run: bool, as_json: bool) -> int:
    validate_spec(spec)
    if not dry_run and not spec.key_name and not spec.skip_setup:
        raise ProvisionSpecError(
            "pass --key-name with an EC2 key pair of the region: `launch setup` must log in to "
            "the instances (create one with `aws ec2 create-key-pair`), or add --skip-setup"
        )
    spec = with_defaults(spec)
    facts = catalog.lookup(spec.instance_type)
    sess = aws.session(spec.region)
    now = datetime.now(timezone.utc)
    if not aws.has_credentials(sess):
        if not dry_run:
            raise no_credentials()
        plan = plan_provision(spec, offline_site(spec, facts, sess.region_name), facts, now)
        emit_dry_run(plan, None, [], as_json)
        return 0
    region = aws.require_region(sess)
    ledger = Ledger.load(spec.cluster)
    active = ledger is not None and ledger.status not in ("new", "deleted")
    if active and ledger.region != region:
        raise AwsError(f"cluster {spec.cluster} exists in {ledger.region}, not {region}: pass "
                       f"--region {ledger.region}, or choose another --cluster")
    ec2 = aws.client(sess, "ec2")
    resolver = Resolver(ec2, aws.client(sess, "ssm"), spec, region)
    facts = resolver.instance_facts(facts)
    site = resolver.site(facts, ledger if active else None, dry_run=dry_run)
    if active and ledger.data.get("created_at"):
        now = parse_iso(ledger.data["created_at"])   # tags keep the cluster's first creation time
    plan = plan_provision(spec, site, facts, now)
    if dry_run:
        existing = resources.find(ec2, spec.cluster, states=aws.MEMBER_STATES,
                                  placement_groups=bool(plan.placement_group),
                                  vpc_id=plan.site.vpc_id)
        missing = max(plan.count - len(existing.instances), 0)
        checks = dryrun.check_calls(ec2, plan, existing, missing)
        emit_dry_run(plan, existing, checks, as_json)
        failed = [c for c in checks if not c.ok]
        if failed:
            raise DryRunFailed(f"{len(failed)} of {len(checks)} DryRun checks failed: " +
                               "; ".join(c.detail for c in failed))
        return 0
    nodes = Provisioner(ec2, plan, Ledger.open(spec.cluster, region), wait_ssh=spec.wait_ssh,
                        keep_on_failure=spec.keep_on_failure).run()
    emit_summary(plan, nodes, as_json)
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
    return run_setup(Path(plan.inventory), cluster=plan.cluster)


def emit_dry_run(plan: ProvisionPlan, existing: resources.ClusterResources | None,
                 checks: list[dryrun.Check], as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "plan": plan.to_json(),
            "existing": existing.describe() if existing else None,
            "checks": [c.__dict__ for c in checks],
        }, indent=2))
        return
    text = render_plan(plan)
    if existing is not None:
        text += ("  already there      " + (", ".join(existing.describe()) or "nothing") + "\n")
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
            "expires_at": plan.expires_at, "inventory": plan.inventory,
            "nodes": [{"name": n.name, "instance_id": n.extra["instance_id"],
                       "address": n.address, "private_address": n.private_address}
                      for n in nodes],
        }, indent=2))
        return
    lines = [
        f"Cluster {plan.cluster} is ready: {plan.count} x {plan.instance.instance_type} in "
        f"{plan.site.az}, ${plan.cost_per_hour:,.2f} per hour at the on-demand list price"
        f"{' (spot costs less)' if plan.market == 'spot' else ''}, "
        f"expires {plan.expires_at or 'never'}",
    ]
    for n in nodes:
        lines.append(f"  {n.name:<16}{n.extra['instance_id']:<22}{n.address:<17}"
                     f"private {n.private_address}")
    lines += [
        f"  inventory   {plan.inventory}",
        f"  run         launch run --nodes {plan.count} -i {plan.inventory} RECIPE.yml",
        f"  ssh         ssh {'-i ' + plan.key_file + ' ' if plan.key_file else ''}"
        f"{plan.ssh_user}@{nodes[0].address}",
        f"  tear down   launch teardown --cluster {plan.cluster}",
    ]
    print("\n".join(lines))
