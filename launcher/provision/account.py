"""Read the account's quotas and what uses them (read-only calls; the comparison is in
quotas.py). Every failure becomes "unknown" with its reason, never an error."""

from __future__ import annotations

from typing import Any

from launcher.provision import aws
from launcher.provision.quotas import (
    EIP_QUOTA, VCPU_QUOTAS, AccountFacts, QuotaReading, quota_group,
)


def _why(err: BaseException) -> str:
    code = aws.error_code(err)
    if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
        return f"no permission: {code}"
    return aws.short_reason(err)


def vcpu_limit(quotas_client: Any, code: str) -> tuple[float | None, str]:
    """The applied quota value, else AWS's default for it."""
    try:
        return float(quotas_client.get_service_quota(ServiceCode="ec2", QuotaCode=code)
                     ["Quota"]["Value"]), ""
    except aws.OPTIONAL_ERRORS as err:
        if aws.error_code(err) != "NoSuchResourceException":
            return None, _why(err)
    try:
        return float(quotas_client.get_aws_default_service_quota(
            ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]), ""
    except aws.OPTIONAL_ERRORS as err:
        return None, _why(err)


def vcpus_in_use(ec2: Any, group: str, market: str) -> tuple[float | None, str]:
    """vCPUs of the region's running instances that count against the same quota."""
    try:
        reservations = aws.paginate(ec2, "describe_instances", "Reservations", Filters=[
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        instances = [i for r in reservations for i in r.get("Instances", [])
                     if quota_group(i.get("InstanceType", "")) == group
                     and (i.get("InstanceLifecycle") == "spot") == (market == "spot")]
        unknown_types = sorted({i["InstanceType"] for i in instances
                                if not (i.get("CpuOptions") or {}).get("CoreCount")})
        per_type: dict[str, int] = {}
        if unknown_types:
            answer = ec2.describe_instance_types(InstanceTypes=unknown_types)
            per_type = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"])
                        for t in answer.get("InstanceTypes", [])}
        total = 0
        for inst in instances:
            cpu = inst.get("CpuOptions") or {}
            if cpu.get("CoreCount"):
                total += int(cpu["CoreCount"]) * int(cpu.get("ThreadsPerCore", 1))
            else:
                total += per_type[inst["InstanceType"]]
    except aws.OPTIONAL_ERRORS as err:
        return None, _why(err)
    return float(total), ""


def elastic_ips(ec2: Any) -> QuotaReading:
    name, code = EIP_QUOTA[1], EIP_QUOTA[0]
    try:
        attrs = ec2.describe_account_attributes(AttributeNames=["vpc-max-elastic-ips"])
        values = [v["AttributeValue"] for a in attrs.get("AccountAttributes", [])
                  if a.get("AttributeName") == "vpc-max-elastic-ips"
                  for v in a.get("AttributeValues", [])]
        limit = float(values[0]) if values else None
        used = float(len(ec2.describe_addresses(
            Filters=[{"Name": "domain", "Values": ["vpc"]}]).get("Addresses", [])))
    except aws.OPTIONAL_ERRORS as err:
        return QuotaReading(name, code, None, None, _why(err))
    return QuotaReading(name, code, limit, used,
                        "" if limit is not None else "vpc-max-elastic-ips not reported")


def read(ec2: Any, quotas_client: Any, instance_type: str, market: str, *,
         existing_instances: int, existing_elastic_ips: int) -> AccountFacts:
    group = quota_group(instance_type)
    reading = None
    if group is not None:
        code, name = VCPU_QUOTAS[(group, "spot" if market == "spot" else "on-demand")]
        limit, why_limit = vcpu_limit(quotas_client, code)
        used, why_used = vcpus_in_use(ec2, group, market) if limit is not None else (None, "")
        reading = QuotaReading(name, code, limit, used, why_limit or why_used)
    return AccountFacts(vcpus=reading, elastic_ips=elastic_ips(ec2),
                        existing_instances=existing_instances,
                        existing_elastic_ips=existing_elastic_ips)
