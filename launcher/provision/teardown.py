"""`launch teardown`: delete everything of a cluster, found by tag and by the ledger; repeatable."""

from __future__ import annotations

import sys
from typing import Any

from botocore.exceptions import ClientError

from launcher.core.errors import LauncherError
from launcher.core.home import cluster_dir
from launcher.provision import aws, resources
from launcher.provision.aws import NoCredentials
from launcher.provision.dryrun import Check, send_dry_run
from launcher.provision.ledger import Ledger
from launcher.provision.plan import validate_cluster_name
from launcher.provision.resources import ClusterResources


class TeardownIncomplete(LauncherError):
    exit_code = 1


def incomplete(cluster: str, remains: list[str]) -> TeardownIncomplete:
    return TeardownIncomplete(
        f"cluster {cluster}: could not delete {', '.join(remains)}; run `launch teardown "
        f"--cluster {cluster}` again, or delete them in the EC2 console"
    )


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def add_ledger_only(ec2: Any, found: ClusterResources, ledger: Ledger) -> None:
    """Resources the ledger knows but the tag search missed (their tags removed by hand).

    Instances of a launch whose answer never arrived need no extra search: RunInstances tagged
    them atomically, so the tag search has them.
    """
    known = set(found.instance_ids())
    ids = [i for i in ledger.live_ids("instance") if i not in known]
    if ids:
        try:
            reservations = aws.paginate(ec2, "describe_instances", "Reservations",
                                        InstanceIds=ids)
        except ClientError as err:
            if aws.error_code(err) != "InvalidInstanceID.NotFound":
                raise
            reservations = []
        found.instances += [i for r in reservations for i in r["Instances"]
                            if i["State"]["Name"] != "terminated"]
    for gid in ledger.live_ids("security-group"):
        if gid not in found.security_groups:
            found.security_groups.append(gid)
    for name in ledger.live_ids("placement-group"):
        if name not in found.placement_groups:
            found.placement_groups.append(name)
    tagged = {a["AllocationId"] for a in found.addresses}
    for alloc in ledger.live_ids("elastic-ip"):
        if alloc not in tagged:
            found.addresses.append({"AllocationId": alloc})


def teardown(cluster: str, region: str | None, *, dry_run: bool) -> int:
    validate_cluster_name(cluster)
    ledger = Ledger.load(cluster)
    sess = aws.session(region or (ledger.region if ledger else None))
    if not aws.has_credentials(sess):
        raise NoCredentials("no AWS credentials found: teardown must ask AWS what exists; "
                            "configure them (aws configure, AWS_PROFILE, aws sso login)")
    region = aws.require_region(sess)
    other_region = ledger is not None and ledger.region != region
    if other_region:
        # That ledger belongs to the cluster in its own region: leave it as it is.
        say(f"the ledger has cluster {cluster} in {ledger.region}; looking in {region} as asked")
        ledger = None
    ec2 = aws.client(sess, "ec2")
    # moto (the tests' EC2) lacks DescribePlacementGroups: only ask when one may exist.
    may_have_pg = ledger is None or bool(ledger.data.get("placement_group")) or any(
        r["kind"] == "placement-group" for r in ledger.resources)
    found = resources.find(ec2, cluster, placement_groups=may_have_pg)
    if ledger is not None:
        add_ledger_only(ec2, found, ledger)
    if found.empty():
        print(f"Cluster {cluster}: nothing to tear down in {region}.")
        if ledger is not None and not dry_run:
            with ledger.locked():
                for record in ledger.live():
                    ledger.settle(record, "gone")
                ledger.update(status="deleted", phase="deleted")
        return 0
    if dry_run:
        print(f"Cluster {cluster} in {region}: would delete")
        for item in found.describe():
            print(f"  {item}")
        if found.instances:
            check: Check = send_dry_run(ec2.terminate_instances, "TerminateInstances",
                                        f"{len(found.instances)} instance(s)",
                                        InstanceIds=found.instance_ids())
            print(f"  DryRun {'ok' if check.ok else 'FAIL'}: {check.detail}")
        print("Dry run: nothing was deleted.")
        return 0
    if other_region:
        remains = resources.delete(ec2, found, None, say)
        if remains:
            raise incomplete(cluster, remains)
    else:
        forget(cluster, ledger or Ledger.open(cluster, region), ec2, found)
    print(f"Cluster {cluster} torn down in {region}: deleted {len(found.describe())} "
          "resource(s).")
    return 0


def forget(cluster: str, ledger: Ledger, ec2: Any, found: ClusterResources) -> None:
    """Delete `found` with the ledger kept up to date, then the files that list its hosts."""
    with ledger.locked():
        ledger.update(status="tearing-down", phase="tearing down")
        remains = resources.delete(ec2, found, ledger, say)
        if remains:
            ledger.update(status="teardown-incomplete", phase="teardown incomplete")
            raise incomplete(cluster, remains)
        for record in ledger.live():
            ledger.settle(record, "gone")
        ledger.update(status="deleted", phase="deleted")
        ledger.event("torn down")
    folder = cluster_dir(cluster)
    for own in (folder / "inventory.yml", folder / "known_hosts"):
        own.unlink(missing_ok=True)   # they list terminated hosts; EC2 reuses the addresses
    inventory = ledger.data.get("inventory")
    if inventory and not inventory.startswith(str(folder)):
        say(f"{inventory} still lists the terminated hosts; delete it")
