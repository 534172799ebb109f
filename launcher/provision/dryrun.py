"""Send every creating call of a plan with DryRun=True: AWS checks permissions and parameters
(and for RunInstances the image, key pair and type) without creating anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from launcher.provision import aws
from launcher.provision.plan import ProvisionPlan, node_name
from launcher.provision.requests import (
    allocate_address_request, placement_group_request, rule_requests, run_instances_request,
    security_group_request,
)
from launcher.provision.resources import ClusterResources


@dataclass(frozen=True)
class Check:
    operation: str
    ok: bool
    detail: str


def send_dry_run(call: Any, operation: str, what: str, **params: Any) -> Check:
    try:
        call(DryRun=True, **params)
    except ClientError as err:
        if aws.is_dry_run_success(err):
            return Check(operation, True, f"would succeed ({what})")
        return Check(operation, False, aws.explain(err, operation, what))
    except aws.LOOKUP_ERRORS as err:
        reason = str(err) if isinstance(err, aws.WebPageAnswer) else type(err).__name__
        return Check(operation, False, f"{what}: no usable answer ({reason})")
    # A DryRun call that returns normally did not honour DryRun: say so rather than hide it.
    return Check(operation, False, f"{what}: the endpoint answered without DryRunOperation")


def check_calls(ec2: Any, plan: ProvisionPlan, existing: ClusterResources,
                count: int) -> list[Check]:
    """DryRun checks for the calls a real run would make, given what already exists."""
    checks: list[Check] = []

    def check(call: Any, operation: str, what: str, **params: Any) -> None:
        checks.append(send_dry_run(call, operation, what, **params))

    group_id = existing.security_groups[0] if existing.security_groups else None
    if group_id is None:
        check(ec2.create_security_group, "CreateSecurityGroup",
              f"security group {plan.security_group}", **security_group_request(plan))
    else:
        for direction, body in rule_requests(plan, group_id):
            check(getattr(ec2, f"authorize_security_group_{direction}"),
                  f"AuthorizeSecurityGroup{direction.capitalize()}", f"rule on {group_id}", **body)
    # The reservation's own group exists already; launch's are made per zone, when needed.
    pg_exists = plan.placement_group in existing.placement_groups or \
        not plan.owns_placement_group
    if plan.placement_group and not pg_exists:
        check(ec2.create_placement_group, "CreatePlacementGroup",
              f"placement group {plan.placement_group}", **placement_group_request(plan))
    if count > 0:
        request = run_instances_request(plan, group_id or "", count, "dry-run")
        # Groups that do not exist yet cannot be named: check the rest of the request without
        # them (the VPC's default group and no placement group stand in).
        if group_id is None:
            for nic in request["NetworkInterfaces"]:
                del nic["Groups"]
        if plan.placement_group and not pg_exists:
            del request["Placement"]["GroupName"]
        del request["ClientToken"]
        check(ec2.run_instances, "RunInstances",
              f"{count} x {plan.instance.instance_type} in {plan.site.az}", **request)
    if plan.elastic_ip_nodes:
        check(ec2.allocate_address, "AllocateAddress",
              "an Elastic IP for the head" if plan.elastic_ip_nodes == (0,)
              else "an Elastic IP per instance",
              **allocate_address_request(plan, node_name(plan.cluster, 0)))
    return checks
