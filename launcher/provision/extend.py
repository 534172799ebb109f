"""`launch extend`: move a cluster's expiry: the timer on every node (over SSH), then the tags
and the ledger. The tags move only when every node's timer did, so `launch status` never shows
an expiry the nodes do not keep."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

from launcher.cluster.inventory import Node, load_inventory
from launcher.core.errors import LauncherError
from launcher.core.home import cluster_inventory
from launcher.provision import aws, ttl
from launcher.provision.aws import AwsError, NoCredentials
from launcher.provision.ledger import Ledger
from launcher.provision.plan import EXPIRES_AT_TAG, iso, validate_cluster_name


class ExtendFailed(LauncherError):
    exit_code = 1


def _move(node: Node, expires_at: str, options) -> str | None:
    """None when the node's timer now says `expires_at`, else what went wrong."""
    from launcher.cluster.ssh import HostProblem, connect

    setter = str(node.extra.get("launch_ttl_setter") or ttl.SETTER)
    try:
        conn = connect(node, options)
    except HostProblem as problem:
        return problem.why
    try:
        result = conn.run(ttl.set_command(expires_at, setter, sudo=node.user != "root"),
                          hide=True, warn=True, in_stream=False, timeout=60)
    except Exception as err:  # noqa: BLE001 (any SSH failure is this node's problem, reported)
        return f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    if result.exited != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        return f"{setter} exited {result.exited}: {said[-1] if said else 'no output'}"
    return None


def extend(cluster: str, hours: float, *, region: str | None, options,
           inventory: str | None = None, dry_run: bool = False) -> int:
    validate_cluster_name(cluster)
    if hours <= 0:
        raise LauncherError("--ttl must be more than 0: it is the new lifetime from now")
    ledger = Ledger.load(cluster)
    if ledger is None or ledger.status in ("new", "deleted"):
        raise LauncherError(f"no cluster {cluster} in the ledger ({Ledger.path_for(cluster)}); "
                            "`launch status` lists the clusters")
    path = Path(inventory or ledger.data.get("inventory") or cluster_inventory(cluster))
    nodes = load_inventory(path)
    expires_at = iso(datetime.now(timezone.utc) + timedelta(hours=hours))
    if dry_run:
        print(f"Cluster {cluster} (region {region or ledger.region}): would move the expiry to "
              f"{expires_at} ({hours:g} h from now), now {ledger.data.get('expires_at')}:")
        for node in nodes:
            setter = str(node.extra.get("launch_ttl_setter") or ttl.SETTER)
            print(f"  {node.name} ({node.address}): "
                  f"{ttl.set_command(expires_at, setter, sudo=node.user != 'root')}")
        print(f"  then the {EXPIRES_AT_TAG} tag of its instances, security groups and "
              "addresses, and the ledger; nothing contacted (--dry-run)")
        return 0
    sess = aws.session(region or ledger.region)
    if not aws.has_credentials(sess):
        raise NoCredentials("no AWS credentials found: extend moves the expiry tags too; "
                            "configure them (aws configure, AWS_PROFILE, aws sso login)")
    ec2 = aws.client(sess, "ec2")
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        problems = dict(zip([n.name for n in nodes],
                            pool.map(lambda n: _move(n, expires_at, options), nodes)))
    failed = {name: why for name, why in problems.items() if why}
    if failed:
        moved = [name for name in problems if name not in failed]
        raise ExtendFailed(
            f"cluster {cluster}: the expiry could not be moved on "
            + "; ".join(f"{name} ({why})" for name, why in failed.items())
            + (f". {', '.join(moved)} now expire(s) at {expires_at}" if moved else "")
            + f"; the tags still say {ledger.data.get('expires_at')}. Fix the nodes' SSH and "
              "run `launch extend` again")
    found = aws.instances_of(ec2, cluster, aws.NOT_TERMINATED)
    groups = aws.paginate(ec2, "describe_security_groups", "SecurityGroups",
                          Filters=aws.tag_filters(cluster))
    addresses = ec2.describe_addresses(Filters=aws.tag_filters(cluster))["Addresses"]
    resources = ([i["InstanceId"] for i in found] + [g["GroupId"] for g in groups]
                 + [a["AllocationId"] for a in addresses])
    if resources:
        try:
            ec2.create_tags(Resources=resources,
                            Tags=[{"Key": EXPIRES_AT_TAG, "Value": expires_at}])
        except Exception as err:  # noqa: BLE001 (named below; the nodes already moved)
            raise AwsError(f"the nodes of cluster {cluster} now expire at {expires_at}, but the "
                           f"tags could not be moved ({aws.error_message(err)}); run "
                           "`launch extend` again") from None
    with ledger.locked():
        ledger.update(expires_at=expires_at)
        ledger.event(f"expiry moved to {expires_at}")
    print(f"Cluster {cluster}: {len(nodes)} node(s) now power off and terminate at "
          f"{expires_at} ({hours:g} h from now); tags and ledger updated.")
    print(f"launch: moved the timer on {', '.join(problems)}", file=sys.stderr)
    return 0
