"""Carry out a ProvisionPlan on EC2: reconcile by tag, create what is missing, clean up on failure.

Every creating call is preceded by a ledger record (and followed by its update). If anything
fails, or Ctrl-C / SIGTERM arrives, the resources this run created are deleted (unless
--keep-on-failure) and the message lists whatever remains. Resources of earlier runs are never
deleted by a failed re-run; `launch teardown` is for those.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

from launcher.cluster.inventory import Node, write_inventory
from launcher.core.errors import LauncherError
from launcher.provision import aws, hostkeys, resources
from launcher.provision.aws import AwsError
from launcher.provision.ledger import Ledger
from launcher.provision.plan import (
    CLUSTER_TAG, NODE_PYTHON, JumpHost, ProvisionPlan, Zone, node_name,
)
from launcher.provision.requests import (
    allocate_address_request, placement_group_request, rule_requests, run_instances_request,
    security_group_request,
)
from launcher.cluster.ssh import proxy_command, ssh_common_args
from launcher.provision.resources import ClusterResources


class ProvisionFailed(LauncherError):
    exit_code = 1


class CapacityError(ProvisionFailed):
    """EC2 had no room (or no offer) in a zone, or in every zone tried."""

    def __init__(self, message: str, code: str = "", aws_message: str = "",
                 attempts: tuple[str, ...] = ()):
        super().__init__(message)
        self.code, self.aws_message, self.attempts = code, aws_message, attempts


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
                 ssh_timeout: float = 600, lost_launch_wait: float = 90,
                 spec: dict[str, Any] | None = None):
        self.ec2, self.plan, self.ledger = ec2, plan, ledger
        # What was asked (ProvisionSpec as a dict), kept in the ledger: a replacement for a
        # lost node is asked for the same way (launcher/provision/replacement.py).
        self.spec = spec
        self.wait_ssh, self.keep_on_failure = wait_ssh, keep_on_failure
        self.say, self.sleep = say, sleep
        self.status_timeout, self.ssh_timeout = status_timeout, ssh_timeout
        self.lost_launch_wait = lost_launch_wait
        self.run_id = uuid.uuid4().hex[:8]
        self.previous_status = "new"            # the ledger's status before this run
        self.made = ClusterResources()          # what this run created, for cleanup
        # RunInstances calls not answered yet: idempotency token -> instances asked for.
        self.unanswered: dict[str, int] = {}

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
                price_source=plan.price.label() if plan.price else None,
                public_ip=plan.public_ip, market=plan.market, inventory=plan.inventory,
                **({"spec": self.spec} if self.spec is not None else {}),
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
                                  placement_groups=bool(plan.placement_group
                                                        and plan.owns_placement_group),
                                  vpc_id=plan.site.vpc_id)
        self.check_existing(existing)
        group_id = self.ensure_security_group(existing)
        instances = existing.instances
        missing = plan.count - len(instances)
        if missing > 0:
            if instances:
                # New nodes join the old ones: same zone, same subnet, same placement group.
                first = instances[0]
                zones: tuple[Zone, ...] = (Zone(first["Placement"]["AvailabilityZone"],
                                                first["SubnetId"], first["VpcId"]),)
            else:
                zones = plan.site.zones
            instances = instances + self.launch_somewhere(group_id, missing, existing, zones)
        else:
            self.say(f"all {plan.count} instance(s) of cluster {plan.cluster} exist; creating "
                     "none")
        plan = self.plan
        numbered = resources.number_nodes(plan.cluster, instances)
        ids = [inst["InstanceId"] for _, inst in numbered]
        self.phase("waiting for the instances to run and pass status checks")
        self.wait_running(ids)
        self.wait_status_ok(ids)
        self.tag_nodes(numbered, existing)
        if plan.elastic_ip_nodes:
            self.ensure_elastic_ips(numbered, existing.addresses)
        described = self.describe(ids)
        indices = [index for index, _ in numbered]
        addresses = self.addresses(indices, described)
        known_hosts = None
        if self.wait_ssh:
            self.phase("waiting for SSH")
            known_hosts = self.record_host_keys(indices, described, addresses)
        nodes = [self.node(index, inst, addr, known_hosts, head_address=addresses[0])
                 for index, inst, addr in zip(indices, described, addresses)]
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

    def create_placement_group(self, plan: ProvisionPlan) -> None:
        assert plan.placement_group
        self.say(f"creating cluster placement group {plan.placement_group}")
        name = self.create(
            "placement-group", "CreatePlacementGroup", f"placement group {plan.placement_group}",
            lambda: self.ec2.create_placement_group(**placement_group_request(plan)),
            lambda answer: plan.placement_group,
        )
        self.made.placement_groups.append(name)

    def launch_somewhere(self, group_id: str, count: int, existing: ClusterResources,
                         zones: tuple[Zone, ...]) -> list[dict[str, Any]]:
        """Launch in the first zone with room, all or nothing per zone; the zone tried and why
        it was left are said and kept in the ledger."""
        attempts: list[str] = []
        for i, zone in enumerate(zones):
            zplan = self.plan.in_zone(zone)
            group = zplan.placement_group
            made_group = False
            if group and zplan.owns_placement_group and group not in existing.placement_groups:
                self.create_placement_group(zplan)
                made_group = True
            try:
                launched = self.launch(zplan, group_id, count, attempt=i)
            except CapacityError as err:
                attempts.append(f"{zone.az} ({err.code}: {err.aws_message})")
                following = zones[i + 1].az if i + 1 < len(zones) else None
                self.say(f"{zone.az}: no room for {count} x {zplan.instance.instance_type} "
                         f"({err.code}: {err.aws_message})"
                         + (f"; trying {following}" if following else ""))
                self.ledger.event(f"run {self.run_id}: {zone.az} refused: {err.code}")
                if made_group and group:
                    self.drop_placement_group(group)
                continue
            self.plan = zplan   # the cluster lives here now: inventory, ledger, re-runs
            self.ledger.update(az=zone.az, subnet_id=zone.subnet_id, vpc_id=zone.vpc_id,
                               placement_group=zplan.placement_group)
            return launched
        raise all_zones_failed(self.plan, count, zones, tuple(attempts))

    def drop_placement_group(self, name: str) -> None:
        """The empty group of a zone that had no room: a cluster placement group is bound to
        one zone, and the next zone gets a group of its own."""
        try:
            aws.retry(lambda: self.ec2.delete_placement_group(GroupName=name),
                      codes=aws.STILL_IN_USE | aws.NOT_YET_VISIBLE, timeout=60,
                      sleep=self.sleep)
        except ClientError as err:
            self.say(f"could not delete placement group {name} yet ({aws.error_code(err)}); "
                     "cleanup and `launch teardown` will")
            return
        self.ledger.deleted("placement-group", name)
        if name in self.made.placement_groups:
            self.made.placement_groups.remove(name)

    def launch(self, plan: ProvisionPlan, group_id: str, count: int,
               attempt: int = 0) -> list[dict[str, Any]]:
        token = f"launch-{plan.cluster}-{self.run_id}" + (f"-{attempt}" if attempt else "")
        request = run_instances_request(plan, group_id, count, token)
        self.say(f"launching {count} x {plan.instance.instance_type} in {plan.site.az}")
        entry = self.ledger.intend("instance-launch", self.run_id, client_token=token,
                                   count=count, az=plan.site.az)
        self.unanswered[token] = count
        try:
            answer = self.ec2.run_instances(**request)
        except ClientError as err:
            del self.unanswered[token]   # an error answer: EC2 launched nothing
            self.ledger.failed(entry, aws.error_code(err))
            raise launch_error(err, plan, count) from None
        launched = answer["Instances"]
        del self.unanswered[token]   # answered, and the answer was read
        for inst in launched:
            self.ledger.add_created("instance", inst["InstanceId"], self.run_id,
                                    client_token=token)
            self.made.instances.append(inst)
        self.ledger.settle(entry, "done")
        self.say(f"launched {', '.join(i['InstanceId'] for i in launched)}")
        return sorted(launched, key=lambda i: i.get("AmiLaunchIndex", 0))

    def ensure_elastic_ips(self, numbered: list[tuple[int, dict[str, Any]]],
                           addresses: list[dict[str, Any]]) -> None:
        """An Elastic IP on the primary interface (card 0, device 0) of each node the plan
        makes public: the head only by default."""
        plan = self.plan
        taken = {a.get("NetworkInterfaceId") for a in addresses if a.get("AssociationId")}
        free = [a for a in addresses if not a.get("AssociationId")]
        wanted = [(index, inst) for index, inst in numbered if index in plan.elastic_ip_nodes]
        by_id = {i["InstanceId"]: i for i in self.describe([i["InstanceId"] for _, i in wanted])}
        for index, iid in ((index, inst["InstanceId"]) for index, inst in wanted):
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

    # ---- reaching the nodes ---------------------------------------------------------------------
    def addresses(self, indices: list[int], described: list[dict[str, Any]]) -> list[str]:
        """Where SSH reaches each node: its public address when the plan gives it one, else its
        private address (through the head or --jump, or over the user's VPN)."""
        public = set(self.plan.public_nodes)
        out = []
        for index, inst in zip(indices, described):
            address = inst.get("PublicIpAddress") if index in public else None
            if index in public and not address:
                self.say(f"{node_name(self.plan.cluster, index)} has no public address; the "
                         "inventory uses its private one")
            out.append(address or inst["PrivateIpAddress"])
        return out

    def jump_for(self, index: int, head_address: str) -> JumpHost | None:
        """The host node `index` is reached through: --jump, or the head (node 0)."""
        plan = self.plan
        if plan.jump:
            return plan.jump
        if plan.public_ip == "head" and index != 0:
            return JumpHost(head_address, 22, plan.ssh_user)
        return None

    def record_host_keys(self, indices: list[int], described: list[dict[str, Any]],
                         addresses: list[str]) -> Path:
        """Scan every node's key (through the head or --jump for nodes behind it), trust it
        when the instance's console output lists it, and write the cluster's known_hosts."""
        path = self.ledger.path.parent / "known_hosts"
        jumps = [self.jump_for(i, addresses[0]) for i in indices]
        scanned: dict[str, str] = {}
        direct = [a for a, j in zip(addresses, jumps) if j is None]
        if direct:
            scanned.update(hostkeys.wait_for_ssh(direct, timeout=self.ssh_timeout,
                                                 sleep=self.sleep))
        keys: list[hostkeys.HostKey] = []
        for inst, address in zip(described, addresses):
            if address not in scanned:
                continue
            console = self.ec2.get_console_output(InstanceId=inst["InstanceId"], Latest=True)
            keys += hostkeys.trusted_keys(address, scanned[address], console.get("Output", ""))
        behind = [(inst, a, j) for inst, a, j in zip(described, addresses, jumps) if j]
        if behind:
            jump = behind[0][2]
            assert jump is not None
            known = [k.key for k in keys if k.host == jump.host] or \
                self.user_known_keys(jump)
            tunnel = hostkeys.Tunnel(jump.host, jump.port, jump.user or self.plan.ssh_user,
                                     self.plan.key_file, known)
            try:
                through = hostkeys.wait_for_ssh([a for _, a, _ in behind],
                                                timeout=self.ssh_timeout, sleep=self.sleep,
                                                tunnel=tunnel)
            finally:
                tunnel.close()
            for inst, address, _ in behind:
                console = self.ec2.get_console_output(InstanceId=inst["InstanceId"], Latest=True)
                keys += hostkeys.trusted_keys(address, through[address],
                                              console.get("Output", ""))
        unverified = sorted({k.host for k in keys if not k.verified})
        if unverified:
            self.say(f"host keys of {', '.join(unverified)} taken on first use (their console "
                     "output does not list keys yet)")
        hostkeys.write_known_hosts(path, keys)
        return path

    def user_known_keys(self, jump: JumpHost) -> list[str]:
        """A --jump host is the user's own: its key must be in ~/.ssh/known_hosts already."""
        import paramiko

        name = jump.host if jump.port == 22 else f"[{jump.host}]:{jump.port}"
        known = paramiko.HostKeys()
        user_file = Path("~/.ssh/known_hosts").expanduser()
        if user_file.exists():
            known.load(str(user_file))
        entry = known.lookup(name) or {}
        if not entry:
            raise ProvisionFailed(
                f"the host key of --jump {jump} is not in {user_file}: connect to it once with "
                f"`ssh {jump}` (and check the key), then run again")
        return [f"{kind} {key.get_base64()}" for kind, key in entry.items()]

    # ---- output ---------------------------------------------------------------------------------
    def node(self, index: int, inst: dict[str, Any], address: str,
             known_hosts: Path | None, head_address: str | None = None) -> Node:
        plan = self.plan
        extra: dict[str, Any] = {"instance_id": inst["InstanceId"]}
        jump = self.jump_for(index, head_address or address)
        if jump is not None:
            known = str(known_hosts or self.ledger.path.parent / "known_hosts")
            extra["ansible_ssh_common_args"] = ssh_common_args(
                known, proxy_command(jump.host, port=jump.port,
                                     user=jump.user or plan.ssh_user, key_file=plan.key_file,
                                     known_hosts=known if not plan.jump else None,
                                     accept_new=known_hosts is None),
                strict=known_hosts is not None)
        return Node(
            name=node_name(plan.cluster, index), address=address,
            private_address=inst["PrivateIpAddress"], user=plan.ssh_user, key_file=plan.key_file,
            gpus=plan.instance.gpu_count, python=NODE_PYTHON,
            instance_type=plan.instance.instance_type, extra=extra,
        )

    def write_inventory(self, nodes: list[Node], known_hosts: Path | None) -> None:
        plan = self.plan
        # launch_market: `launch run` watches spot nodes for EC2's interruption notice.
        common: dict[str, Any] = {"launch_cluster": plan.cluster, "launch_market": plan.market}
        if plan.image == "dlami":
            common["launch_node_image"] = "dlami"
        # Ansible and launch's SSH executor both take the host key file from here. Without a
        # recorded file (--no-wait-ssh) it is still named, not enforced: Ansible accepts new
        # keys into it, `launch run` with --accept-new-host-keys.
        common["ansible_ssh_common_args"] = ssh_common_args(
            str(known_hosts or self.ledger.path.parent / "known_hosts"),
            strict=known_hosts is not None)
        path = Path(plan.inventory)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_inventory(path, nodes, common, header=(
            f"cluster {plan.cluster}: {plan.count} x {plan.instance.instance_type} in "
            f"{plan.site.az}, written by launch provision\n"
            f"tear down: launch teardown --cluster {plan.cluster}"))
        self.ledger.update(inventory=str(path))

    # ---- failure --------------------------------------------------------------------------------
    def find_lost_launch(self, token: str, count: int) -> list[dict[str, Any]]:
        """The instances of a launch whose answer never came. EC2 is eventually consistent:
        instances launched a moment ago may not be listed yet, so keep looking for a while."""
        waited = 0.0
        found: list[dict[str, Any]] = []
        told = False
        while True:
            try:
                found = resources.instances_by_token(self.ec2, self.plan.cluster, token)
            except aws.LOOKUP_ERRORS as lookup:
                self.say(f"could not look for instances of launch {token}: {lookup}")
            if len(found) >= count or waited + 5 > self.lost_launch_wait:
                return found
            waited += 5
            if not told:
                self.say(f"looking for instances of the interrupted launch {token} (EC2 may "
                         f"take a minute to list them; up to {self.lost_launch_wait:.0f} s)")
                told = True
            self.sleep(5)

    def clean_up_after(self, err: BaseException) -> BaseException:
        """Delete what this run created; return the exception to raise, its message completed."""
        interrupted = isinstance(err, KeyboardInterrupt)
        if interrupted:
            why = "interrupted"
        elif isinstance(err, (LauncherError, ClientError, BotoCoreError)):
            why = str(err) or type(err).__name__
        else:
            # Not AWS's answer but something unexpected in it (a garbled or partial response):
            # name the kind of failure, since str() of a KeyError is just the key.
            why = f"unexpected {type(err).__name__}: {err}"
        self.ledger.update(status="failed", phase=f"failed: {why}")
        for token, count in list(self.unanswered.items()):
            # A launch whose answer was lost (Ctrl-C mid-call) may still have made instances.
            lost = self.find_lost_launch(token, count)
            for record in self.ledger.live("instance-launch"):
                if record.get("client_token") == token:
                    # Found or not, the tag search of `launch status`/`teardown` still sees
                    # any instance that shows up later: RunInstances tagged it atomically.
                    self.ledger.settle(record, "done" if lost else "none-found")
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
    if code in aws.ZONE_CODES:
        return CapacityError(f"EC2 has no room for {what} right now ({code}: "
                             f"{aws.error_message(err)})", code, aws.error_message(err))
    if code in aws.QUOTA_CODES:
        return ProvisionFailed(
            f"the account's quota does not allow {what} ({code}: {aws.error_message(err)}). "
            "Request an increase in Service Quotas (EC2 'Running On-Demand P instances' / "
            "'G and VT instances' count vCPUs) or pass a smaller --count"
        )
    return AwsError(aws.explain(err, "RunInstances", what))


def all_zones_failed(plan: ProvisionPlan, count: int, zones: tuple[Zone, ...],
                     attempts: tuple[str, ...]) -> CapacityError:
    where = ("every zone tried in " if len(zones) > 1 else "") + plan.site.region
    other = ("another --region (several may be listed: --region us-east-1,us-west-2)"
             if len(zones) > 1 else "another zone (drop --az/--subnet to try them all)")
    market = ("on-demand (drop --spot)" if plan.market == "spot"
              else "" if plan.market == "capacity-block" else "--spot")
    options = [o for o in ("a Capacity Block or capacity reservation (--capacity-reservation)"
                           if plan.reservation is None else "",
                           other, "fewer nodes (--count)", market, "or try again later") if o]
    return CapacityError(
        f"EC2 had no room for {count} x {plan.instance.instance_type} in {where}: "
        f"{'; '.join(attempts)}. Options: {', '.join(options)}",
        attempts[-1].split(" (", 1)[1].split(":", 1)[0] if attempts else "", "",
        attempts)
