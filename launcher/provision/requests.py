"""EC2 request bodies built from a plan: pure, reused by the provisioner and the DryRun checks,
compared with exact values in the tests and checked against the EC2 API model by Stubber."""

from __future__ import annotations

from typing import Any

from launcher.provision.plan import ProvisionPlan, Rule


def tag_specifications(plan: ProvisionPlan, *resource_types: str,
                       name: str | None = None) -> list[dict[str, Any]]:
    tags = [{"Key": k, "Value": v} for k, v in plan.tags.items()]
    if name:
        tags.append({"Key": "Name", "Value": name})
    return [{"ResourceType": rt, "Tags": tags} for rt in resource_types]


def security_group_request(plan: ProvisionPlan) -> dict[str, Any]:
    return {
        "GroupName": plan.security_group,
        "Description": f"launch cluster {plan.cluster}: nodes talk freely, SSH from "
                       f"{plan.site.ssh_cidr}",
        "VpcId": plan.site.vpc_id,
        "TagSpecifications": tag_specifications(plan, "security-group", name=plan.security_group),
    }


def _permission(rule: Rule, group_id: str) -> dict[str, Any]:
    perm: dict[str, Any] = {"IpProtocol": rule.protocol}
    if rule.port is not None:
        perm["FromPort"] = perm["ToPort"] = rule.port
    if rule.peer == "self":
        perm["UserIdGroupPairs"] = [{"GroupId": group_id, "Description": rule.why}]
    elif ":" in rule.peer:
        perm["Ipv6Ranges"] = [{"CidrIpv6": rule.peer, "Description": rule.why}]
    else:
        perm["IpRanges"] = [{"CidrIp": rule.peer, "Description": rule.why}]
    return perm


def rule_requests(plan: ProvisionPlan, group_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(direction, AuthorizeSecurityGroupIngress/Egress body) with one permission each."""
    return [(rule.direction, {"GroupId": group_id, "IpPermissions": [_permission(rule, group_id)]})
            for rule in plan.rules]


def placement_group_request(plan: ProvisionPlan) -> dict[str, Any]:
    assert plan.placement_group and plan.owns_placement_group
    return {
        "GroupName": plan.placement_group,
        "Strategy": "cluster",
        "TagSpecifications": tag_specifications(plan, "placement-group",
                                                name=plan.placement_group),
    }


def network_interfaces(plan: ProvisionPlan, group_id: str) -> list[dict[str, Any]]:
    out = []
    for nic in plan.interfaces:
        spec: dict[str, Any] = {
            "NetworkCardIndex": nic.card,
            "DeviceIndex": nic.device,
            "SubnetId": plan.site.subnet_id,
            "Groups": [group_id],
            "DeleteOnTermination": True,
        }
        if nic.efa:
            spec["InterfaceType"] = nic.kind
        if plan.auto_public_ip is not None:
            # Allowed only with a single interface; several interfaces never get one.
            spec["AssociatePublicIpAddress"] = plan.auto_public_ip
        out.append(spec)
    return out


def run_instances_request(plan: ProvisionPlan, group_id: str, count: int,
                          client_token: str) -> dict[str, Any]:
    """RunInstances for `count` instances in the plan's zone, all or nothing (Min = Max)."""
    placement: dict[str, Any] = {"AvailabilityZone": plan.site.az}
    if plan.placement_group:
        placement["GroupName"] = plan.placement_group
    ebs: dict[str, Any] = {"VolumeSize": plan.disk_gb, "VolumeType": "gp3",
                           "DeleteOnTermination": True}
    if plan.encrypt_root:
        ebs["Encrypted"] = True   # with the account's default EBS key
    request: dict[str, Any] = {
        "ImageId": plan.site.ami_id,
        "InstanceType": plan.instance.instance_type,
        "MinCount": count,
        "MaxCount": count,
        "ClientToken": client_token,
        "NetworkInterfaces": network_interfaces(plan, group_id),
        "Placement": placement,
        "BlockDeviceMappings": [{"DeviceName": plan.site.root_device, "Ebs": ebs}],
        # IMDSv2 only: credentials of an instance role cannot leak through a forwarded request.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": tag_specifications(
            plan, "instance", "volume", "network-interface", name=plan.cluster),
    }
    if plan.key_name:
        request["KeyName"] = plan.key_name
    if plan.user_data:
        # The node powers itself off at its expiry; terminate makes that the end of billing.
        request["InstanceInitiatedShutdownBehavior"] = "terminate"
        request["UserData"] = plan.user_data
    if plan.instance_profile:
        request["IamInstanceProfile"] = {"Name": plan.instance_profile}
    if plan.market == "spot":
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time",
                            "InstanceInterruptionBehavior": "terminate"},
        }
    elif plan.market == "capacity-block":
        request["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    if plan.reservation is not None:
        request["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": plan.reservation.id}
        }
    return request


def allocate_address_request(plan: ProvisionPlan, node_name: str) -> dict[str, Any]:
    return {"Domain": "vpc",
            "TagSpecifications": tag_specifications(plan, "elastic-ip", name=node_name)}
