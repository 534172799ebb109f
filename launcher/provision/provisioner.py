"""Carry out a ProvisionPlan on EC2: reconcile by tag, create what is missing, clean up on failure.

Every creating call is preceded by a ledger record (and followed by its update). If anything
fails, or Ctrl-C / SIGTERM arrives, the resources this run created are deleted (unless
--keep-on-failure) and the message lists whatever remains. Resources of earlier runs are never
deleted by a failed re-run; `launch teardown` is for those.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

from launcher.errors import LauncherError
from launcher.inventory import Node, write_inventory
from launcher.provision import aws, hostkeys, resources
from launcher.provision.aws import AwsError
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    CLUSTER_TAG, NODE_PYTHON, ProvisionPlan, allocate_address_request, node_name,
    placement_group_request, rule_requests, run_instances_request, security_group_request,
)
from launcher.provision.resources import ClusterResources


class ProvisionFailed(LauncherError):
    exit_code = 1


class CapacityError(ProvisionFailed):
    pass


class LeakError(LauncherError):
    """More instances carry the cluster's tag than were asked for."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a closed terminal, a CI timeout) cleans up exactly like Ctrl-C."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def shielded(say: Callable[[str], None]) -> Iterator[None]:
    """Cleanup is not interrupted by a second Ctrl-C: a half cleanup is the leak we prevent."""
    def handler(signum: int, frame: Any) -> None:
        say("cleanup in progress; it stops on its own (the ledger lists every resource)")

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def stderr(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


class Provisioner:
    def __init__(self, ec2: Any, plan: ProvisionPlan, ledger: Ledger, *, wait_ssh: bool,
                 keep_on_failure: bool, say: Callable[[str], None] = stderr,
                 sleep: Callable[[float], None] = time.sleep, status_timeout: float = 900,
                 ssh_timeout: float = 600):
        self.ec2, self.plan, self.ledger = ec2, plan, ledger
        self.wait_ssh, self.keep_on_failure = wait_ssh, keep_on_failure
        self.say, self.sleep = say, sleep
        self.status_timeout, self.ssh_timeout = status_timeout, ssh_timeout
        self.run_id = uuid.uuid4().hex[:8]
        self.previous_status = "new"            # the ledger's status before this run
        self.made = ClusterResources()          # what this run created, for cleanup
        self.unanswered: list[str] = []         # tokens of RunInstances calls not answered yet

    # ---- the whole run --------------------------------------------------------------------------
    def run(self) -> list[Node]:
        plan = self.plan
        with self.ledger.locked(), sigterm_as_interrupt():
            self.previous_status = self.ledger.status
            site = plan.site
            self.ledger.update(
                status="provisioning", phase="starting", instance_type=plan.instance.instance_type,
                count=plan.count, region=site.region, az=site.az, subnet_id=site.subnet_id,
                vpc_id=site.vpc_id, ami_id=site.ami_id, ami_description=site.ami_description,
                placement_group=plan.placement_group, created_at=plan.created_at,
                expires_at=plan.expires_at, price_per_hour=plan.instance.price_per_hour,
                inventory=plan.inventory,
            )
            try:
                nodes = self._provision()
            except BaseException as err:
                raise self.clean_up_after(err)  # noqa: B904 (it returns err, or err explained)
            self.ledger.update(status="ready", phase="ready")
            self.ledger.event(f"run {self.run_id}: ready with {len(nodes)} instance(s)")
            return nodes

    def _provision(self) -> list[Node]:
        plan = self.plan
        self.phase("finding existing resources by tag")
        existing = resources.find(self.ec2, plan.cluster, states=aws.MEMBER_STATES,
                                  placement_groups=bool(plan.placement_group),
                                  vpc_id=plan.site.vpc_id)
        self.check_existing(existing)
        group_id = self.ensure_security_group(existing)
        if plan.placement_group and plan.placement_group not in existing.placement_groups:
            self.create_placement_group()
        instances = existing.instances
        missing = plan.count - len(instances)
        if missing > 0:
            instances = instances + self.launch(group_id, missing)
        else:
            self.say(f"all {plan.count} instance(s) of cluster {plan.cluster} exist; creating "
                     "none")
        numbered = resources.number_nodes(plan.cluster, instances)
        ids = [inst["InstanceId"] for _, inst in numbered]
        self.phase("waiting for the instances to run and pass status checks")
        self.wait_running(ids)
        self.wait_status_ok(ids)
        self.tag_nodes(numbered, existing)
        if plan.elastic_ips:
            self.ensure_elastic_ips(numbered, existing.addresses)
        described = self.describe(ids)
        addresses = [i.get("PublicIpAddress") or i["PrivateIpAddress"] for i in described]
        if not all(i.get("PublicIpAddress") for i in described):
            self.say("some instances have no public address: the inventory uses private "
                     "addresses, reachable only from inside the VPC (VPN, bastion)")
        known_hosts = None
        if self.wait_ssh:
            self.phase("waiting for SSH")
            known_hosts = self.record_host_keys(described, addresses)
        nodes = [self.node(index, inst, addr) for (index, _), inst, addr in
                 zip(numbered, described, addresses)]
        self.write_inventory(nodes, known_hosts)
        return nodes

    def phase(self, text: str) -> None:
        self.ledger.update(phase=text)
        self.say(text)

    # ---- reconcile ------------------------------------------------------------------------------
    def check_existing(self, existing: ClusterResources) -> None:
        plan = self.plan
        ids = existing.instance_ids()
        if len(ids) > plan.count:
            raise LeakError(
                f"cluster {plan.cluster} already has {len(ids)} instances tagged "
                f"{CLUSTER_TAG}={plan.cluster} ({', '.join(ids)}) but --count is "
                f"{plan.count}: the extra ones may be a leak and are not used. Run `launch "
                f"teardown --cluster {plan.cluster}`, or terminate the extra instances, or pass "
                f"--count {len(ids)}"
            )
        stopped = [i["InstanceId"] for i in existing.instances
                   if i["State"]["Name"] in ("stopping", "stopped")]
        if stopped:
            raise ProvisionFailed(
                f"cluster {plan.cluster} has stopped instances ({', '.join(stopped)}); start them "
                f"(aws ec2 start-instances --instance-ids {' '.join(stopped)}) or run `launch "
                f"teardown --cluster {plan.cluster}`"
            )
        wrong = [f"{i['InstanceId']} is {i['InstanceType']}" for i in existing.instances
                 if i["InstanceType"] != plan.instance.instance_type]
        if wrong:
            raise ProvisionFailed(
                f"cluster {plan.cluster} has instances of another type ({'; '.join(wrong)}), not "
                f"{plan.instance.instance_type}; tear it down first or use another --cluster"
            )
        if len(existing.security_groups) > 1:
            raise ProvisionFailed(
                f"cluster {plan.cluster} has {len(existing.security_groups)} security groups "
                f"({', '.join(existing.security_groups)}) where one is expected; delete the extra "
                "ones or run `launch teardown`"
            )

    # ---- create ---------------------------------------------------------------------------------
    def create(self, kind: str, operation: str, what: str, call: Callable[[], Any],
               id_of: Callable[[Any], str], **record: Any) -> str:
        """One creating call with its ledger records before and after."""
        entry = self.ledger.intend(kind, self.run_id, **record)
        try:
            answer = call()
        except ClientError as err:
            self.ledger.failed(entry, aws.error_code(err) or str(err))
            raise AwsError(aws.explain(err, operation, what)) from None
        rid = id_of(answer)
        self.ledger.created(entry, rid)
        return rid

    def ensure_security_group(self, existing: ClusterResources) -> str:
        plan = self.plan
        if existing.security_groups:
            group_id = existing.security_groups[0]
        else:
            self.say(f"creating security group {plan.security_group}")
            group_id = self.create(
                "security-group", "CreateSecurityGroup", f"security group {plan.security_group}",
                lambda: self.ec2.create_security_group(**security_group_request(plan)),
                lambda answer: answer["GroupId"], name=plan.security_group,
            )
            self.made.security_groups.append(group_id)
        self.authorize_rules(group_id)
        return group_id

    def authorize_rules(self, group_id: str) -> None:
        # One permission per call: a re-run meets its own earlier rules as duplicates, and a
        # duplicate must not stop the missing ones from being added.
        for direction, body in rule_requests(self.plan, group_id):
            call = getattr(self.ec2, f"authorize_security_group_{direction}")
            try:
                aws.retry(lambda: call(**body), codes=aws.NOT_YET_VISIBLE, sleep=self.sleep)
            except ClientError as err:
                if aws.error_code(err) != "InvalidPermission.Duplicate":
                    raise AwsError(aws.explain(
                        err, f"AuthorizeSecurityGroup{direction.capitalize()}",
                        f"security group {group_id}")) from None

    def create_placement_group(self) -> None:
        plan = self.plan
        assert plan.placement_group
        self.say(f"creating cluster placement group {plan.placement_group}")
        name = self.create(
            "placement-group", "CreatePlacementGroup", f"placement group {plan.placement_group}",
            lambda: self.ec2.create_placement_group(**placement_group_request(plan)),
            lambda answer: plan.placement_group,
        )
        self.made.placement_groups.append(name)

    def launch(self, group_id: str, count: int) -> list[dict[str, Any]]:
        plan = self.plan
        token = f"launch-{plan.cluster}-{self.run_id}"
        request = run_instances_request(plan, group_id, count, token)
        self.say(f"launching {count} x {plan.instance.instance_type} in {plan.site.az}")
        entry = self.ledger.intend("instance-launch", self.run_id, client_token=token,
                                   count=count)
        self.unanswered.append(token)
        try:
            answer = self.ec2.run_instances(**request)
        except ClientError as err:
            self.unanswered.remove(token)   # an error answer: EC2 launched nothing
            self.ledger.failed(entry, aws.error_code(err))
            raise launch_error(err, plan, count) from None
        self.unanswered.remove(token)
        launched = answer["Instances"]
        for inst in launched:
            self.ledger.add_created("instance", inst["InstanceId"], self.run_id,
                                    client_token=token)
            self.made.instances.append(inst)
        self.ledger.settle(entry, "done")
        self.say(f"launched {', '.join(i['InstanceId'] for i in launched)}")
        return sorted(launched, key=lambda i: i.get("AmiLaunchIndex", 0))

    def ensure_elastic_ips(self, numbered: list[tuple[int, dict[str, Any]]],
                           addresses: list[dict[str, Any]]) -> None:
        """One Elastic IP on each instance's primary interface (card 0, device 0)."""
        plan = self.plan
        taken = {a.get("NetworkInterfaceId") for a in addresses if a.get("AssociationId")}
        free = [a for a in addresses if not a.get("AssociationId")]
        by_id = {i["InstanceId"]: i for i in self.describe([i["InstanceId"] for _, i in numbered])}
        for index, iid in ((index, inst["InstanceId"]) for index, inst in numbered):
            primary = next(n["NetworkInterfaceId"] for n in by_id[iid]["NetworkInterfaces"]
                           if n["Attachment"]["DeviceIndex"] == 0
                           and n["Attachment"].get("NetworkCardIndex", 0) == 0)
            if primary in taken:
                continue
            if free:
                alloc = free.pop(0)["AllocationId"]   # left by an earlier, interrupted run
            else:
                name = node_name(plan.cluster, index)
                alloc = self.create(
                    "elastic-ip", "AllocateAddress", f"the Elastic IP of {iid}",
                    lambda n=name: self.ec2.allocate_address(**allocate_address_request(plan, n)),
                    lambda answer: answer["AllocationId"], instance=iid,
                )
                self.made.addresses.append({"AllocationId": alloc})
            aws.retry(lambda a=alloc, p=primary: self.ec2.associate_address(
                AllocationId=a, NetworkInterfaceId=p), codes=aws.NOT_YET_VISIBLE, sleep=self.sleep)

    def tag_nodes(self, numbered: list[tuple[int, dict[str, Any]]],
                  existing: ClusterResources) -> None:
        """Name each node by its index; refresh the cluster tags (the expiry may have moved)."""
        plan = self.plan
        for index, inst in numbered:
            name = [{"Key": "Name", "Value": node_name(plan.cluster, index)}]
            aws.retry(lambda i=inst["InstanceId"], t=name: self.ec2.create_tags(
                Resources=[i], Tags=t), codes=aws.NOT_YET_VISIBLE, sleep=self.sleep)
        others = existing.security_groups + existing.instance_ids()
        if others:
            self.ec2.create_tags(Resources=others,
                                 Tags=[{"Key": k, "Value": v} for k, v in plan.tags.items()])

    # ---- wait -----------------------------------------------------------------------------------
    def describe(self, ids: list[str]) -> list[dict[str, Any]]:
        reservations = aws.retry(lambda: aws.paginate(
            self.ec2, "describe_instances", "Reservations", InstanceIds=ids),
            codes=aws.NOT_YET_VISIBLE, sleep=self.sleep)
        found = {i["InstanceId"]: i for r in reservations for i in r["Instances"]}
        return [found[i] for i in ids]

    def poll(self, what: str, timeout: float, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() + 5 > deadline:
                raise ProvisionFailed(f"{what} did not happen within {timeout:.0f} s")
            self.sleep(5)

    def wait_running(self, ids: list[str]) -> None:
        def check() -> bool:
            described = self.describe(ids)
            dead = [i for i in described
                    if i["State"]["Name"] in ("shutting-down", "terminated", "stopping", "stopped")]
            if dead:
                reasons = "; ".join(
                    f"{i['InstanceId']} is {i['State']['Name']}: "
                    f"{(i.get('StateReason') or {}).get('Message', 'no reason given')}"
                    for i in dead)
                raise ProvisionFailed(f"instances stopped before running ({reasons})")
            return all(i["State"]["Name"] == "running" for i in described)

        self.poll(f"running state of {', '.join(ids)}", self.status_timeout, check)

    def wait_status_ok(self, ids: list[str]) -> None:
        def check() -> bool:
            statuses = aws.retry(lambda: self.ec2.describe_instance_status(
                InstanceIds=ids, IncludeAllInstances=True)["InstanceStatuses"],
                codes=aws.NOT_YET_VISIBLE, sleep=self.sleep)
            impaired = [s["InstanceId"] for s in statuses
                        if "impaired" in (s["InstanceStatus"]["Status"],
                                          s["SystemStatus"]["Status"])]
            if impaired:
                raise ProvisionFailed(f"status checks report {', '.join(impaired)} impaired; "
                                      "the hardware or the image is at fault")
            return len(statuses) == len(ids) and all(
                s["InstanceStatus"]["Status"] == "ok" and s["SystemStatus"]["Status"] == "ok"
                for s in statuses)

        self.poll(f"passing status checks on {', '.join(ids)}", self.status_timeout, check)

    def record_host_keys(self, described: list[dict[str, Any]], addresses: list[str]) -> Path:
        scanned = hostkeys.wait_for_ssh(addresses, timeout=self.ssh_timeout, sleep=self.sleep)
        keys: list[hostkeys.HostKey] = []
        for inst, address in zip(described, addresses):
            console = self.ec2.get_console_output(InstanceId=inst["InstanceId"], Latest=True)
            keys += hostkeys.trusted_keys(address, scanned[address], console.get("Output", ""))
        unverified = sorted({k.host for k in keys if not k.verified})
        if unverified:
            self.say(f"host keys of {', '.join(unverified)} taken on first use (their console "
                     "output does not list keys yet)")
        path = self.ledger.path.parent / "known_hosts"
        hostkeys.write_known_hosts(path, keys)
        return path

    # ---- output ---------------------------------------------------------------------------------
    def node(self, index: int, inst: dict[str, Any], address: str) -> Node:
        plan = self.plan
        return Node(
            name=node_name(plan.cluster, index), address=address,
            private_address=inst["PrivateIpAddress"], user=plan.ssh_user, key_file=plan.key_file,
            gpus=plan.instance.gpu_count, python=NODE_PYTHON,
            instance_type=plan.instance.instance_type,
            extra={"instance_id": inst["InstanceId"]},
        )

    def write_inventory(self, nodes: list[Node], known_hosts: Path | None) -> None:
        plan = self.plan
        common: dict[str, Any] = {"launch_cluster": plan.cluster}
        if known_hosts:
            # Ansible and launch's SSH executor both take the host key file from here.
            common["ansible_ssh_common_args"] = (
                f"-o UserKnownHostsFile={shlex.quote(str(known_hosts))} "
                "-o StrictHostKeyChecking=yes")
        path = Path(plan.inventory)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_inventory(path, nodes, common, header=(
            f"cluster {plan.cluster}: {plan.count} x {plan.instance.instance_type} in "
            f"{plan.site.az}, written by launch provision\n"
            f"tear down: launch teardown --cluster {plan.cluster}"))
        self.ledger.update(inventory=str(path))

    # ---- failure --------------------------------------------------------------------------------
    def clean_up_after(self, err: BaseException) -> BaseException:
        """Delete what this run created; return the exception to raise, its message completed."""
        interrupted = isinstance(err, KeyboardInterrupt)
        why = "interrupted" if interrupted else str(err) or type(err).__name__
        self.ledger.update(status="failed", phase=f"failed: {why}")
        for token in self.unanswered:
            # A launch whose answer was lost (Ctrl-C mid-call) may still have made instances.
            try:
                lost = resources.instances_by_token(self.ec2, self.plan.cluster, token)
            except (ClientError, BotoCoreError) as lookup:
                self.say(f"could not look for instances of launch {token}: {lookup}")
                continue
            known = set(self.made.instance_ids())
            for inst in lost:
                if inst["InstanceId"] not in known:
                    self.ledger.add_created("instance", inst["InstanceId"], self.run_id,
                                            client_token=token)
                    self.made.instances.append(inst)
        if self.made.empty():
            done, remains = "this run created nothing", []
        elif self.keep_on_failure:
            remains = self.made.describe()
            done = "kept, as --keep-on-failure asks: " + ", ".join(remains)
        else:
            with shielded(self.say):
                self.say(f"provisioning failed ({why}); deleting what this run created")
                remains = resources.delete(self.ec2, self.made, self.ledger, self.say)
            done = ("cleaned up: nothing this run created remains" if not remains else
                    "could not delete: " + ", ".join(remains))
        if not self.ledger.live():
            # Nothing of the cluster exists: the next run starts afresh (zone, image, times).
            self.ledger.update(status="deleted")
        elif not remains and self.previous_status not in ("new", "deleted"):
            self.ledger.update(status=self.previous_status)  # the earlier cluster is as it was
        self.ledger.event(f"run {self.run_id} failed ({why}); {done}")
        advice = (f"; run `launch teardown --cluster {self.plan.cluster}` to remove what "
                  "remains" if remains else "")
        if interrupted:
            stderr(f"provisioning of cluster {self.plan.cluster} interrupted; {done}{advice}")
            return err
        if isinstance(err, LauncherError):
            if not self.made.empty():
                err.args = (f"{err}. Cluster {self.plan.cluster}: {done}{advice}",)
            return err
        return ProvisionFailed(f"provisioning cluster {self.plan.cluster} failed: {why}. "
                               f"{done}{advice}")


def launch_error(err: ClientError, plan: ProvisionPlan, count: int) -> LauncherError:
    code = aws.error_code(err)
    what = f"{count} x {plan.instance.instance_type} in {plan.site.az}"
    if code in aws.CAPACITY_CODES:
        return CapacityError(
            f"EC2 has no capacity for {what} right now ({code}: {aws.error_message(err)}). "
            f"Options: another zone (--az), a capacity reservation (--capacity-reservation), "
            f"fewer nodes (--count), "
            f"{'on-demand (drop --spot)' if plan.market == 'spot' else '--spot'}"
            ", or try again later"
        )
    if code in aws.QUOTA_CODES:
        return CapacityError(
            f"the account's quota does not allow {what} ({code}: {aws.error_message(err)}). "
            "Request an increase in Service Quotas (EC2 'Running On-Demand P instances' / "
            "'G and VT instances' count vCPUs) or pass a smaller --count"
        )
    return AwsError(aws.explain(err, "RunInstances", what))
