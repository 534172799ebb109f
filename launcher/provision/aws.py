"""boto3 set up the standard way, EC2 error codes, and retries for eventual consistency.

Credentials, region, profile and endpoint come from boto3's own chain (AWS_PROFILE, AWS_REGION /
AWS_DEFAULT_REGION, AWS_ENDPOINT_URL, ~/.aws/config): launch adds no handling of its own, so
nothing secret passes through our code or our messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from launcher.core.errors import LauncherError
from launcher.provision.plan import CLUSTER_TAG, CREATED_BY_TAG

# Codes EC2 returns when it has no room for the request right now. AWS's advice for all of them is
# the same: another AZ, a capacity reservation, fewer instances, or later.
CAPACITY_CODES = {
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "ReservationCapacityExceeded",
    "InsufficientCapacityOnOutpost", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
}
# What moves a launch on to the next zone: no capacity there, or the type not offered there
# ("Unsupported: Your requested instance type (...) is not supported in your requested
# Availability Zone (...)").
ZONE_CODES = CAPACITY_CODES | {"Unsupported"}
# Account quotas, not momentary capacity: only a quota increase (or fewer vCPUs) helps.
QUOTA_CODES = {"VcpuLimitExceeded", "InstanceLimitExceeded", "AddressLimitExceeded"}

# EC2 is eventually consistent: a resource just created may be "not found" by the next call for a
# few seconds, and a security group stays "in use" until the interfaces of terminated instances
# are gone. AWS's documented remedy is to retry with exponential backoff.
NOT_YET_VISIBLE = {
    "InvalidInstanceID.NotFound", "InvalidGroup.NotFound", "InvalidAllocationID.NotFound",
    "InvalidPlacementGroup.Unknown", "InvalidNetworkInterfaceID.NotFound",
}
STILL_IN_USE = {"DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidIPAddress.InUse"}


# What an optional look-up may meet: AWS's refusal, a network or configuration failure, or an
# answer botocore cannot parse (an endpoint that does not serve the API answers with an HTML
# error page; ResponseParserError is not a BotoCoreError).
LOOKUP_ERRORS = (ClientError, BotoCoreError, ResponseParserError)
# An optional look-up also survives an answer that lacks what it should hold.
OPTIONAL_ERRORS = (*LOOKUP_ERRORS, KeyError, IndexError, TypeError, ValueError, AttributeError)


class AwsError(LauncherError):
    """An AWS call failed; the message names the call, the resource and what to do."""


class NoCredentials(LauncherError):
    pass


def session(region: str | None = None) -> boto3.Session:
    sess = boto3.Session(region_name=region) if region else boto3.Session()
    sess.events.register("before-parse", _refuse_web_pages)
    return sess


class WebPageAnswer(ResponseParserError):
    """A web page came back where AWS's XML or JSON should have."""


def _refuse_web_pages(response_dict: dict[str, Any], **_: Any) -> None:
    """A captive portal, a proxy's login page or an AWS_ENDPOINT_URL that names a web server
    answers 200 with HTML; botocore's XML parser reads that as an answer with nothing in it,
    so "no instances" would be a lie (status) and a missing key a traceback (teardown). No AWS
    protocol answers in HTML: refuse it before parsing, as a parse error."""
    body = response_dict.get("body") or b""
    if isinstance(body, bytes) and body.lstrip()[:15].lower().startswith((b"<!doctype html",
                                                                         b"<html")):
        status = response_dict.get("status_code")
        raise WebPageAnswer(f"a web page (HTTP {status}) came back instead of AWS's answer")


def has_credentials(sess: boto3.Session) -> bool:
    try:
        return sess.get_credentials() is not None
    except BotoCoreError:
        return False


def require_region(sess: boto3.Session) -> str:
    if not sess.region_name:
        raise AwsError(
            "no AWS region configured: pass --region, or set AWS_REGION / AWS_DEFAULT_REGION, "
            "or a region in your AWS profile"
        )
    return sess.region_name


def client(sess: boto3.Session, service: str, *, quick: bool = False,
           optional: bool = False) -> Any:
    """A client; `quick` ones give up fast (look-ups that must never stall a command);
    `optional` ones try once (a failure only turns a quota or price into "unknown")."""
    if quick or optional:
        config = Config(connect_timeout=3, read_timeout=10,
                        retries={"max_attempts": 1 if optional else 2})
    elif sess._session.get_config_variable("max_attempts") is None:
        # Throttling (RequestLimitExceeded) on busy accounts: more attempts than boto3's default 3;
        # standard mode backs off exponentially with jitter, as AWS documents for EC2.
        config = Config(retries={"mode": "standard", "max_attempts": 10})
    else:
        config = None  # the user configured retries (AWS_MAX_ATTEMPTS or profile): theirs win
    return sess.client(service, config=config)


# The Price List query API is served from a few regions only (us-east-1 among them); it
# answers for every region.
PRICING_REGION = "us-east-1"


@dataclass(frozen=True)
class Clients:
    """The clients one region's provisioning uses. `quick` ones serve optional look-ups
    (reservations, quotas, prices) that must never stall or stop a command."""

    ec2: Any
    ssm: Any
    ec2_quick: Any
    quotas: Any
    pricing: Any


def clients(sess: boto3.Session) -> Clients:
    return Clients(
        ec2=client(sess, "ec2"), ssm=client(sess, "ssm"),
        ec2_quick=client(sess, "ec2", optional=True),
        quotas=client(sess, "service-quotas", optional=True),
        pricing=sess.client("pricing", region_name=PRICING_REGION,
                            config=Config(connect_timeout=3, read_timeout=10,
                                          retries={"max_attempts": 1})),
    )


def error_code(err: BaseException) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code", ""))
    return ""


def error_message(err: BaseException) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Message", "")) or str(err)
    return str(err)


def short_reason(err: BaseException) -> str:
    """One short line for a failed optional look-up (some endpoints answer with a whole HTML
    page)."""
    code = error_code(err)
    text = error_message(err).strip().splitlines()
    detail = text[0][:120] if text else ""
    return f"{type(err).__name__}: {code + ' ' if code else ''}{detail}".strip()


def is_dry_run_success(err: BaseException) -> bool:
    return error_code(err) == "DryRunOperation"


def explain(err: BaseException, operation: str, what: str) -> str:
    """One line for a failed call: which call, on what, AWS's words, and what to do."""
    code = error_code(err)
    text = f"{operation} for {what} failed: {code + ': ' if code else ''}{error_message(err)}"
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        text += (f" -- the credentials lack permission for {operation}; docs/provision.md lists "
                 "the IAM actions launch needs")
    elif code in ("AuthFailure", "InvalidClientTokenId", "ExpiredToken", "RequestExpired"):
        text += " -- the AWS credentials were rejected; refresh them (aws sso login, aws configure)"
    elif code.endswith(".Duplicate"):
        text += (" -- a resource of that name exists without launch's tags (made by hand, or its "
                 "tags were removed); delete it or choose another --cluster")
    return text


def retry(call: Callable[[], Any], *, codes: Iterable[str], timeout: float = 180.0,
          first_delay: float = 1.0, max_delay: float = 15.0,
          sleep: Callable[[float], None] = time.sleep) -> Any:
    """`call()`, retried with exponential backoff while it fails with one of `codes`."""
    codes = set(codes)
    deadline = time.monotonic() + timeout
    delay = first_delay
    while True:
        try:
            return call()
        except ClientError as err:
            if error_code(err) not in codes or time.monotonic() + delay > deadline:
                raise
        sleep(delay)
        delay = min(delay * 2, max_delay)


def tag_filters(cluster: str) -> list[dict[str, Any]]:
    return [
        {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]},
        {"Name": f"tag:{CREATED_BY_TAG}", "Values": ["launch"]},
    ]


def paginate(ec2: Any, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in ec2.get_paginator(operation).paginate(**params):
        out.extend(page.get(key, []))
    return out


def instances_of(ec2: Any, cluster: str, states: Iterable[str]) -> list[dict[str, Any]]:
    reservations = paginate(
        ec2, "describe_instances", "Reservations",
        Filters=[*tag_filters(cluster), {"Name": "instance-state-name", "Values": list(states)}],
    )
    return [inst for res in reservations for inst in res.get("Instances", [])]


# Instances that still belong to the cluster; "shutting-down" ones are already on their way out.
MEMBER_STATES = ("pending", "running", "stopping", "stopped")
NOT_TERMINATED = (*MEMBER_STATES, "shutting-down")


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    for tag in resource.get("Tags") or []:
        if tag.get("Key") == key:
            return tag.get("Value")
    return None
