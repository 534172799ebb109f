"""A lost node of a cluster `launch provision` made, and its replacement on EC2: what
`launch run --recover` asks of the cluster (launcher/backends/ssh/replace.py is the rest).

- gone(node): EC2's word on the node's instance: stopped, stopping, shutting down, terminated
  (a spot reclaim says so in its state reason), or no longer known.
- replace(node): the lost instance terminated (a stopped one still bills its volumes, and its
  Name keeps its index taken), then the cluster topped up exactly as `launch provision`
  re-run would: the spec the cluster was made with (kept in the ledger), the same market,
  zone, subnet and placement group as the nodes still there (every zone of the spec when none
  is), the next free index (the lost node's: a lost head comes back as the head), the
  inventory and known_hosts written again. Every step is in the ledger; teardown finds the
  replacement by its tag like any node.
- set_up(node): `launch setup` on the new node only (the image's tags for a DLAMI), unless
  the cluster was made with --skip-setup.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from launcher.provision import aws, resources
from launcher.provision.ledger import Ledger, now_iso
from launcher.provision.plan import ProvisionSpec, check_quotas

GONE_STATES = ("stopping", "stopped", "shutting-down", "terminated")


class ReplacementError(LauncherError):
    exit_code = 1


def instance_gone(instance: dict[str, Any] | None, instance_id: str) -> str | None:
    """Why EC2 says the instance is no longer a node, or None while it runs."""
    if instance is None:
        return f"instance {instance_id} no longer exists"
    state = instance["State"]["Name"]
    if state not in GONE_STATES:
        return None
    reason = (instance.get("StateReason") or {}).get("Message") or \
        instance.get("StateTransitionReason") or ""
    reclaimed = "Spot" in reason or instance.get("InstanceLifecycle") == "spot" and \
        state in ("shutting-down", "terminated")
    return (f"instance {instance_id} is {state}" + (f" ({reason})" if reason else "")
            + ("; EC2 reclaimed the spot instance" if reclaimed else ""))


class Ec2Fleet:
    """The cluster behind an inventory written by `launch provision` (launch_cluster)."""

    def __init__(self, cluster: str, ec2: Any = None, say: Callable[[str], None] = print):
        ledger = Ledger.load(cluster)
        if ledger is None or ledger.status in ("new", "deleted"):
            raise ReplacementError(f"cluster {cluster} has no record here (no ledger in "
                                   f"{Ledger.path_for(cluster)}): launch can replace a node "
                                   "only of a cluster `launch provision` made from here")
        self.cluster, self.region, self.say = cluster, ledger.region, say
        self.ec2 = ec2 or aws.client(aws.session(self.region), "ec2")
        self.what = f"EC2 cluster {cluster} ({self.region})"

    def ledger(self) -> Ledger:
        ledger = Ledger.load(self.cluster)
        assert ledger is not None
        return ledger

    @property
    def inventory(self) -> str:
        return self.ledger().data["inventory"]

    def cost_per_hour(self, count: int) -> float | None:
        price = self.ledger().data.get("price_per_hour")
        return None if price is None else float(price) * count

    def _described(self, instance_id: str) -> dict[str, Any] | None:
        try:
            found = aws.paginate(self.ec2, "describe_instances", "Reservations",
                                 InstanceIds=[instance_id])
        except aws.LOOKUP_ERRORS as err:
            if aws.error_code(err) == "InvalidInstanceID.NotFound":
                return None
            raise
        return next((i for r in found for i in r["Instances"]), None)

    def gone(self, node: Node) -> str | None:
        instance_id = node.extra.get("instance_id")
        if not instance_id:
            return None
        try:
            return instance_gone(self._described(instance_id), instance_id)
        except aws.LOOKUP_ERRORS as err:   # EC2 cannot tell now: not known to be gone
            self.say(f"could not ask EC2 about {instance_id}: {aws.short_reason(err)}")
            return None

    def spec(self) -> ProvisionSpec:
        kept = self.ledger().data.get("spec")
        if not isinstance(kept, dict):
            raise ReplacementError(
                f"cluster {self.cluster}: its ledger keeps no record of how it was made (made "
                "by an older launch); re-run `launch provision` with its flags to replace the "
                "node, then `launch run --resume`")
        known = {f.name for f in fields(ProvisionSpec)}
        return ProvisionSpec(**{k: v for k, v in kept.items() if k in known})

    def _terminate(self, instance_id: str) -> None:
        instance = self._described(instance_id)
        if instance is None or instance["State"]["Name"] == "terminated":
            return
        self.say(f"terminating the lost instance {instance_id} ({instance['State']['Name']})")
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        resources.wait_terminated(self.ec2, [instance_id])
        ledger = self.ledger()
        with ledger.locked():
            ledger.deleted("instance", instance_id)

    def replace(self, node: Node) -> Node:
        from dataclasses import replace as changed

        from launcher.provision.aws import clients, session
        from launcher.provision.create import plan_in, spec_record
        from launcher.provision.provisioner import Provisioner

        spec = self.spec()
        lost_id = node.extra.get("instance_id")
        if lost_id:
            self._terminate(lost_id)
        # Setup runs on the new node alone (set_up), not on the whole cluster again.
        spec = changed(spec, region=self.region, skip_setup=True)
        made = clients(session(self.region))
        plan = plan_in(spec, self.region, made, datetime.now(timezone.utc), dry_run=False)
        if plan.missing != 1:
            raise ReplacementError(f"cluster {self.cluster}: {plan.existing} of {plan.count} "
                                   f"instances are alive; one replacement for {node.name} "
                                   "cannot make it whole (run `launch provision` or `launch "
                                   "teardown`)")
        check_quotas(plan)
        worker = Provisioner(made.ec2, plan, Ledger.open(self.cluster, self.region),
                             wait_ssh=spec.wait_ssh, keep_on_failure=False,
                             spec=spec_record(changed(spec, skip_setup=self.spec().skip_setup),
                                              self.region))
        nodes = worker.run()
        # A node keeps its index by its Name tag and the new instance takes the free one: the
        # lost node's (launcher/provision/resources.py number_nodes).
        new = next((n for n in nodes if n.name == node.name), None)
        if new is None:
            raise ReplacementError(f"cluster {self.cluster}: the new instance did not take "
                                   f"{node.name}'s place (nodes now: "
                                   f"{', '.join(n.name for n in nodes)})")
        self.say(f"{new.name}: instance {new.extra['instance_id']} replaces {lost_id} "
                 f"({new.address}, private {new.private_address})")
        return new

    def set_up(self, node: Node) -> None:
        from launcher.provision.create import DLAMI_SETUP_TAGS

        spec = self.spec()
        if spec.skip_setup:
            self.say(f"{node.name}: setup skipped (the cluster was made with --skip-setup)")
            return
        from launcher.setup.apply import run_setup

        code = run_setup(Path(self.inventory), cluster=self.cluster, limit=node.name,
                         tags=DLAMI_SETUP_TAGS if spec.image == "dlami" else None)
        if code != 0:
            raise ReplacementError(f"`launch setup` failed on the replacement {node.name} "
                                   f"(exit {code}); its log is under $LAUNCH_HOME/setup")

    def record(self, entry: dict[str, Any]) -> None:
        ledger = self.ledger()
        with ledger.locked():
            ledger.data.setdefault("recoveries", []).append({**entry, "at": now_iso()})
            ledger.event(f"recovery: {entry.get('node')} ({entry.get('why')}) replaced by "
                         f"{entry.get('replacement_id') or entry.get('replacement')} for run "
                         f"{entry.get('run_id')}")
