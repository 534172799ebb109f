"""Account quotas a cluster must fit in, read before anything is created.

A new account's most common first failure is a vCPU quota of 0 for P or G instances; the next is
the 5 Elastic IPs per region. Both are known before launching: Service Quotas gives the vCPU
limits (by quota code), DescribeInstances what runs now, DescribeAccountAttributes the Elastic IP
limit (`vpc-max-elastic-ips`) and DescribeAddresses what is allocated (account.py reads them).
`checks()` compares them with what the plan needs; a quota that could not be read is a warning,
never a refusal. This module stays free of boto3: the plan imports it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Service Quotas codes (service "ec2"), all counted in vCPUs.
VCPU_QUOTAS = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
EIP_QUOTA = ("L-0263D0A3", "EC2-VPC Elastic IPs")

_FAMILY = re.compile(r"^([a-z]+)")


@dataclass(frozen=True)
class QuotaReading:
    name: str
    code: str
    limit: float | None
    used: float | None
    unknown: str = ""      # why limit or use could not be read


@dataclass(frozen=True)
class AccountFacts:
    """What the account has, for one region and one instance family."""

    vcpus: QuotaReading | None        # None: launch knows no quota code for the family
    elastic_ips: QuotaReading
    existing_instances: int = 0       # this cluster's instances alive now
    existing_elastic_ips: int = 0     # this cluster's addresses


@dataclass(frozen=True)
class QuotaCheck:
    name: str
    code: str
    need: float
    limit: float | None
    used: float | None
    status: str             # ok | short | unknown | not-needed
    detail: str

    @property
    def free(self) -> float | None:
        if self.limit is None or self.used is None:
            return None
        return max(self.limit - self.used, 0)


def quota_group(instance_type: str) -> str | None:
    """'P' or 'G' (the vCPU quota buckets launch checks); None for other families."""
    match = _FAMILY.match(instance_type)
    family = match.group(1) if match else ""
    if family.startswith("p"):
        return "P"
    if family.startswith("g") or family.startswith("vt"):
        return "G"
    return None


def _n(value: float) -> str:
    return f"{value:g}"


def _count(value: float, unit: str) -> str:
    """'1 Elastic IP', '192 vCPUs'."""
    return f"{value:g} {unit[:-1] if value == 1 and unit.endswith('s') else unit}"


def checks(*, instance_type: str, vcpus_per_instance: int, missing: int, market: str,
           eips_needed: int, account: AccountFacts | None, region: str,
           reserved: bool) -> tuple[QuotaCheck, ...]:
    """What this launch needs of each quota vs what is free (pure)."""
    if account is None:
        return ()
    out: list[QuotaCheck] = []
    need = vcpus_per_instance * missing
    q = account.vcpus
    if reserved:
        out.append(QuotaCheck("vCPUs", "-", need, None, None, "not-needed",
                              "a capacity reservation already holds its instances' capacity"))
    elif q is None:
        out.append(QuotaCheck("vCPUs", "-", need, None, None, "unknown",
                              f"launch knows no vCPU quota code for {instance_type}'s family; "
                              "check it in the Service Quotas console"))
    else:
        out.append(_compare(q, need, region, "vCPUs"))
    e = account.elastic_ips
    out.append(_compare(e, max(eips_needed - account.existing_elastic_ips, 0), region,
                        "Elastic IPs"))
    return tuple(out)


def _compare(q: QuotaReading, need: float, region: str, unit: str) -> QuotaCheck:
    if need <= 0:
        return QuotaCheck(q.name, q.code, 0, q.limit, q.used, "not-needed", f"needs no {unit}")
    if q.limit is None or q.used is None:
        return QuotaCheck(q.name, q.code, need, q.limit, q.used, "unknown",
                          f"not known ({q.unknown}); provisioning goes ahead")
    free = max(q.limit - q.used, 0)
    if need <= free:
        return QuotaCheck(q.name, q.code, need, q.limit, q.used, "ok",
                          f"needs {_count(need, unit)}, {_n(free)} of {_n(q.limit)} free")
    wanted = math.ceil(q.used + need)
    if unit == "Elastic IPs":
        how = ("release unused addresses (aws ec2 describe-addresses), use --public-ip head, "
               f"or ask for more: aws service-quotas request-service-quota-increase "
               f"--service-code ec2 --quota-code {q.code} --desired-value {wanted} "
               f"--region {region}")
    else:
        how = (f"ask for more: aws service-quotas request-service-quota-increase --service-code "
               f"ec2 --quota-code {q.code} --desired-value {wanted} --region {region} (or the "
               "Service Quotas console), or pass a smaller --count")
    return QuotaCheck(q.name, q.code, need, q.limit, q.used, "short",
                      f"needs {_count(need, unit)} but only {_n(free)} of {_n(q.limit)} are free "
                      f"({_n(q.used)} in use); {how}")
