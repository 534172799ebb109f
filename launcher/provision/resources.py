"""A cluster's AWS resources, found by its tag (and the ledger), and deleted in dependency order.

Provisioning, its cleanup after a failure, teardown and status all see a cluster through
`find()`; cleanup and teardown both delete through `delete()`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from launcher.provision import aws
from launcher.provision.ledger import Ledger


@dataclass
class ClusterResources:
    instances: list[dict[str, Any]] = field(default_factory=list)
    addresses: list[dict[str, Any]] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.instances or self.addresses or self.placement_groups
                    or self.security_groups)

    def instance_ids(self) -> list[str]:
        return [i["InstanceId"] for i in self.instances]

    def describe(self) -> list[str]:
        """One entry per resource, for messages: what remains, what will be deleted."""
        out = [f"instance {i['InstanceId']} ({i['State']['Name']})" for i in self.instances]
        out += [f"Elastic IP {a['AllocationId']} ({a.get('PublicIp', '?')})"
                for a in self.addresses]
        out += [f"placement group {name}" for name in self.placement_groups]
        out += [f"security group {gid}" for gid in self.security_groups]
        return out


def find(ec2: Any, cluster: str, *, states: tuple[str, ...] = aws.NOT_TERMINATED,
         placement_groups: bool = True, vpc_id: str | None = None) -> ClusterResources:
    """Everything tagged for `cluster` in the client's region.

    `placement_groups=False` skips DescribePlacementGroups when the caller knows none was made
    (the ledger says so); moto, which the tests run against, does not implement that call.
    """
    found = ClusterResources()
    found.instances = sorted(aws.instances_of(ec2, cluster, states), key=_launch_order)
    found.addresses = ec2.describe_addresses(Filters=aws.tag_filters(cluster))["Addresses"]
    if placement_groups:
        groups = ec2.describe_placement_groups(Filters=aws.tag_filters(cluster))
        found.placement_groups = [g["GroupName"] for g in groups.get("PlacementGroups", [])
                                  if g.get("State") != "deleted"]
    filters = aws.tag_filters(cluster)
    if vpc_id:
        filters.append({"Name": "vpc-id", "Values": [vpc_id]})
    groups = aws.paginate(ec2, "describe_security_groups", "SecurityGroups", Filters=filters)
    found.security_groups = [g["GroupId"] for g in groups]
    return found


def _launch_order(instance: dict[str, Any]) -> tuple:
    return (str(instance.get("LaunchTime", "")), instance.get("AmiLaunchIndex", 0),
            instance["InstanceId"])


def number_nodes(cluster: str, instances: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(index, instance) in index order. A node keeps the index of its Name tag across re-runs
    (so the head node, index 0, stays the head); new instances take the free indices."""
    pattern = re.compile(rf"^{re.escape(cluster)}-(\d+)$")
    numbered: dict[int, dict[str, Any]] = {}
    unnamed = []
    for inst in sorted(instances, key=_launch_order):
        match = pattern.match(aws.tag_value(inst, "Name") or "")
        if match and int(match.group(1)) not in numbered:
            numbered[int(match.group(1))] = inst
        else:
            unnamed.append(inst)
    free = (i for i in range(len(instances) * 2 + 1) if i not in numbered)
    for inst in unnamed:
        numbered[next(free)] = inst
    return sorted(numbered.items(), key=lambda pair: pair[0])


def instances_by_token(ec2: Any, cluster: str, token: str) -> list[dict[str, Any]]:
    """Instances of a RunInstances call whose answer never arrived (interrupted mid-call).

    The launch tagged them atomically, so the tag finds them; the idempotency token tells them
    from the cluster's other instances.
    """
    return [i for i in aws.instances_of(ec2, cluster, aws.NOT_TERMINATED)
            if i.get("ClientToken") == token]


def wait_terminated(ec2: Any, ids: list[str], *, timeout: float = 900, delay: float = 5,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    deadline = time.monotonic() + timeout
    while True:
        reservations = aws.paginate(ec2, "describe_instances", "Reservations", InstanceIds=ids)
        alive = [i["InstanceId"] for r in reservations for i in r["Instances"]
                 if i["State"]["Name"] != "terminated"]
        if not alive:
            return
        if time.monotonic() + delay > deadline:
            raise aws.AwsError(f"instances {', '.join(alive)} did not terminate within "
                               f"{timeout:.0f} s; check them in the EC2 console")
        sleep(delay)


def delete(ec2: Any, doomed: ClusterResources, ledger: Ledger | None,
           say: Callable[[str], None], *, in_use_timeout: float = 300) -> list[str]:
    """Delete `doomed` (instances first: the groups stay in use until they are gone).

    Returns what could not be deleted, one entry per resource; never raises for AWS errors, so a
    cleanup after a failure goes as far as it can.
    """
    remains: list[str] = []

    def attempt(kind: str, rid: str, label: str, call: Callable[[], Any]) -> None:
        try:
            aws.retry(call, codes=aws.STILL_IN_USE | aws.NOT_YET_VISIBLE, timeout=in_use_timeout)
        except aws.LOOKUP_ERRORS as err:
            if not aws.error_code(err).endswith(("NotFound", ".Unknown")):
                remains.append(f"{label} ({aws.error_code(err) or 'error'}: "
                               f"{aws.error_message(err)})")
                return
        if ledger is not None:
            ledger.deleted(kind, rid)
        say(f"deleted {label}")

    ids = doomed.instance_ids()
    if ids:
        try:
            ec2.terminate_instances(InstanceIds=ids)
            say(f"terminating {len(ids)} instance(s): {', '.join(ids)}")
            wait_terminated(ec2, ids)
            for iid in ids:
                if ledger is not None:
                    ledger.deleted("instance", iid)
            say(f"terminated {', '.join(ids)}")
        except (*aws.LOOKUP_ERRORS, aws.AwsError) as err:
            remains += [f"instance {iid}" for iid in ids]
            remains.append(f"(TerminateInstances: {aws.error_message(err)})")
            # With instances alive the groups cannot go either: say so instead of trying.
            remains += [f"security group {g}" for g in doomed.security_groups]
            remains += [f"placement group {g}" for g in doomed.placement_groups]
            return remains
    for address in doomed.addresses:
        alloc = address["AllocationId"]
        if address.get("AssociationId"):
            try:
                ec2.disassociate_address(AssociationId=address["AssociationId"])
            except aws.LOOKUP_ERRORS:
                pass  # the association died with the instance: releasing is what matters
        attempt("elastic-ip", alloc, f"Elastic IP {alloc}",
                lambda a=alloc: ec2.release_address(AllocationId=a))
    for name in doomed.placement_groups:
        attempt("placement-group", name, f"placement group {name}",
                lambda n=name: ec2.delete_placement_group(GroupName=n))
    for gid in doomed.security_groups:
        attempt("security-group", gid, f"security group {gid}",
                lambda g=gid: ec2.delete_security_group(GroupId=g))
    return remains
