"""Capacity Reservations and Capacity Blocks for ML: what one is, and whether this launch fits it.

DescribeCapacityReservations says everything needed: ReservationType (`default` or
`capacity-block`), State, zone, type, free count, start and end, and PlacementGroupArn when the
reservation was made in a cluster placement group (then it must be used with that group). The
checks are pure so that every mismatch is refused before anything is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from launcher.core.errors import LauncherError

CAPACITY_BLOCK = "capacity-block"


class ReservationMismatch(LauncherError):
    pass


@dataclass(frozen=True)
class Reservation:
    id: str
    kind: str                     # "default" | "capacity-block"
    state: str
    az: str
    instance_type: str
    available: int
    total: int
    placement_group: str | None   # the group it was made in (name), if any
    start: str | None             # ISO 8601 UTC
    end: str | None
    match_criteria: str           # open | targeted

    @property
    def capacity_block(self) -> bool:
        return self.kind == CAPACITY_BLOCK

    @property
    def label(self) -> str:
        return f"{'Capacity Block' if self.capacity_block else 'capacity reservation'} {self.id}"


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def group_name(arn: str | None) -> str | None:
    """arn:aws:ec2:REGION:ACCOUNT:placement-group/NAME -> NAME."""
    if not arn:
        return None
    return arn.rsplit("/", 1)[-1] or None


def from_ec2(cr: dict[str, Any]) -> Reservation:
    return Reservation(
        id=cr["CapacityReservationId"], kind=cr.get("ReservationType") or "default",
        state=cr.get("State", "unknown"), az=cr.get("AvailabilityZone", "?"),
        instance_type=cr.get("InstanceType", "?"),
        available=int(cr.get("AvailableInstanceCount", 0)),
        total=int(cr.get("TotalInstanceCount", 0)),
        placement_group=group_name(cr.get("PlacementGroupArn")),
        start=_iso(cr.get("StartDate")), end=_iso(cr.get("EndDate")),
        match_criteria=cr.get("InstanceMatchCriteria", "open"),
    )


def _parse(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def _wait(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def check(res: Reservation, *, instance_type: str, missing: int, now: datetime,
          az: str | None = None, subnet: str | None = None, subnet_az: str | None = None,
          placement_group: bool | None = None) -> None:
    """Refuse every mismatch between the reservation and this launch, naming what to change."""
    if res.instance_type != instance_type:
        raise ReservationMismatch(
            f"{res.label} is for {res.instance_type}, not {instance_type}; pass --instance "
            f"{res.instance_type} or another reservation")
    if res.state != "active":
        if res.capacity_block and res.state in ("scheduled", "payment-pending") and res.start \
                and _parse(res.start) > now:
            raise ReservationMismatch(
                f"{res.label} is not active yet: it starts at {res.start} (in "
                f"{_wait((_parse(res.start) - now).total_seconds())}); run again then")
        ended = f" (it ended {res.end})" if res.state == "expired" and res.end else ""
        raise ReservationMismatch(
            f"{res.label} is {res.state}{ended}, not active; nothing can launch into it. Use an "
            "active reservation, or drop --capacity-reservation")
    if missing > res.available:
        raise ReservationMismatch(
            f"{res.label} has room for {res.available} more {res.instance_type} (of "
            f"{res.total}), fewer than the {missing} to launch; pass --count "
            f"{res.available} or free the reservation's instances")
    if az and az != res.az:
        raise ReservationMismatch(f"{res.label} is in {res.az}, not --az {az}; drop --az")
    if subnet and subnet_az and subnet_az != res.az:
        raise ReservationMismatch(
            f"{res.label} is in {res.az}, but --subnet {subnet} is in {subnet_az}; pass a "
            f"subnet in {res.az} or drop --subnet")
    if placement_group is False and res.placement_group:
        raise ReservationMismatch(
            f"{res.label} was made in cluster placement group {res.placement_group} and must be "
            "launched into it; drop --no-placement-group")
    if placement_group is True and not res.placement_group:
        raise ReservationMismatch(
            f"{res.label} was not made in a placement group, and its instances cannot be put in "
            "one; drop --placement-group")
