"""`launch status`: clusters from the ledger and from AWS tags, uptime, cost so far, expiry."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from launcher.cluster import catalog
from launcher.core.table import format_table
from launcher.provision import aws
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    CLUSTER_TAG, CREATED_AT_TAG, CREATED_BY_TAG, EXPIRES_AT_TAG, parse_iso,
)


@dataclass(frozen=True)
class ClusterStatus:
    cluster: str
    region: str
    instance_type: str
    nodes: int                 # instances alive now (AWS), or per the ledger when not checked
    state: str                 # the ledger's status, or "untracked" (found by tag only)
    created_at: str | None
    expires_at: str | None
    uptime_hours: float | None
    cost_so_far: float | None  # USD at the on-demand price the cluster was planned with
    expired: bool
    checked: bool              # AWS was asked (else: the ledger's view only)
    hours_left: float | None = None  # until the nodes terminate themselves; None: no expiry
    market: str | None = None        # on-demand | spot | capacity-block
    # Lost nodes replaced by `launch run --recover`, and what they cost: the cluster's price
    # for the time from each loss to the run going on (launcher/backends/ssh/replace.py).
    recoveries: int = 0
    recovery_cost: float | None = None


def _hours(since: str | None, now: datetime) -> float | None:
    if not since:
        return None
    return max((now - parse_iso(since)).total_seconds() / 3600, 0.0)


def _price(instance_type: str, ledger: dict[str, Any]) -> float | None:
    if ledger.get("price_per_hour") is not None:
        return float(ledger["price_per_hour"])   # what the plan used (Price List or table)
    facts = catalog.builtin(instance_type)
    return facts.price_per_hour if facts else None


def _launch_iso(instance: dict[str, Any]) -> str:
    launched = instance["LaunchTime"]
    if isinstance(launched, str):
        launched = datetime.fromisoformat(launched.replace("Z", "+00:00"))
    return launched.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def summarize(cluster: str, ledger: dict[str, Any] | None,
              instances: list[dict[str, Any]] | None, region: str,
              now: datetime) -> ClusterStatus:
    """One cluster's row. `instances`: what AWS shows alive now; None when AWS was not asked."""
    ledger = ledger or {}
    first = instances[0] if instances else None
    instance_type = ledger.get("instance_type") or (first or {}).get("InstanceType", "?")
    created = ledger.get("created_at") or (aws.tag_value(first, CREATED_AT_TAG) if first else None)
    expires = ledger.get("expires_at") or (aws.tag_value(first, EXPIRES_AT_TAG) if first else None)
    if expires == "never":
        expires = None
    price = _price(instance_type, ledger)
    if instances is not None:
        nodes = len(instances)
        billed = [_hours(_launch_iso(i), now) or 0.0 for i in instances
                  if i["State"]["Name"] in ("pending", "running", "stopping")]
    else:
        records = [r for r in ledger.get("resources", [])
                   if r["kind"] == "instance" and r["state"] == "created"]
        nodes = len(records)
        billed = [_hours(r.get("created_at"), now) or 0.0 for r in records]
    cost = round(sum(billed) * price, 2) if price is not None else None
    recovered = [r for r in ledger.get("recoveries", []) if "failed" not in r]
    costs = [r.get("cost_usd") for r in recovered]
    return ClusterStatus(
        cluster=cluster, region=ledger.get("region", region), instance_type=instance_type,
        nodes=nodes, state=ledger.get("status", "untracked") if ledger else "untracked",
        created_at=created, expires_at=expires,
        uptime_hours=_hours(created, now) if nodes else None,
        cost_so_far=cost, expired=bool(expires and nodes and parse_iso(expires) < now),
        checked=instances is not None,
        hours_left=(round((parse_iso(expires) - now).total_seconds() / 3600, 2)
                    if expires and nodes else None),
        market=ledger.get("market") or (first or {}).get("InstanceLifecycle"),
        recoveries=len(recovered),
        recovery_cost=round(sum(costs), 2) if costs and None not in costs else None,
    )


def tagged_instances(ec2: Any) -> dict[str, list[dict[str, Any]]]:
    """Alive instances made by launch in the client's region, by cluster."""
    reservations = aws.paginate(ec2, "describe_instances", "Reservations", Filters=[
        {"Name": "tag-key", "Values": [CLUSTER_TAG]},
        {"Name": f"tag:{CREATED_BY_TAG}", "Values": ["launch"]},
        {"Name": "instance-state-name", "Values": list(aws.MEMBER_STATES)},
    ])
    by_cluster: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for res in reservations:
        for inst in res["Instances"]:
            by_cluster[aws.tag_value(inst, CLUSTER_TAG) or "?"].append(inst)
    return by_cluster


def collect(region: str | None, *, show_all: bool) -> tuple[list[ClusterStatus], list[str]]:
    now = datetime.now(timezone.utc)
    notes: list[str] = []
    ledgers = {l.cluster: l.data for l in Ledger.all()}
    sess = aws.session(region)
    live: dict[str, list[dict[str, Any]]] | None = None
    region = sess.region_name
    if not aws.has_credentials(sess):
        notes.append("no AWS credentials: showing the ledger only")
    elif not region:
        notes.append("no AWS region configured: showing the ledger only (pass --region)")
    else:
        live = tagged_instances(aws.client(sess, "ec2"))
    rows: list[ClusterStatus] = []
    for name in sorted(set(ledgers) | set(live or {})):
        data = ledgers.get(name)
        asked_here = live is not None and (data is None or data.get("region") == region)
        row = summarize(name, data, live.get(name, []) if asked_here else None,
                        region or "?", now)
        if data is not None and data.get("status") == "deleted" and not row.nodes \
                and not show_all:
            continue
        rows.append(row)
    return rows, notes


def _fmt_hours(hours: float | None) -> str:
    if hours is None:
        return "-"
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def _recoveries(row: ClusterStatus) -> str:
    if not row.recoveries:
        return "-"
    cost = "?" if row.recovery_cost is None else f"${row.recovery_cost:,.2f}"
    return f"{row.recoveries} ({cost})"


def render(rows: list[ClusterStatus], notes: list[str]) -> str:
    if not rows:
        return "No clusters.\n" + "".join(f"({n})\n" for n in notes)
    header = ("CLUSTER", "REGION", "TYPE", "NODES", "STATE", "UPTIME", "COST SO FAR", "EXPIRES",
              "LEFT", "RECOVERIES", "")
    table = []
    for r in rows:
        flags = []
        if r.expired:
            # The nodes power themselves off at the expiry; what still runs missed its timer.
            flags.append("EXPIRED: launch teardown --cluster " + r.cluster)
        if not r.checked:
            flags.append("(ledger only)")
        table.append((
            r.cluster, r.region, r.instance_type, str(r.nodes), r.state,
            _fmt_hours(r.uptime_hours),
            "?" if r.cost_so_far is None else f"${r.cost_so_far:,.2f}",
            r.expires_at or "never",
            "-" if r.hours_left is None else
            ("0" if r.hours_left <= 0 else _fmt_hours(r.hours_left)),
            _recoveries(r), " ".join(flags),
        ))
    return format_table(header, table) + "".join(f"({n})\n" for n in notes)


def status(region: str | None, *, as_json: bool, show_all: bool) -> int:
    rows, notes = collect(region, show_all=show_all)
    if as_json:
        print(json.dumps({"clusters": [asdict(r) for r in rows], "notes": notes}, indent=2))
    else:
        print(render(rows, notes), end="")
    return 0
