"""Line handling shared by the parsers: launcher labels off, and the numbers nccl-tests prints."""

from __future__ import annotations

import math
from collections.abc import Iterator

from launcher.nccl.labels import strip_labels


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without launcher labels and trailing whitespace) per line."""
    for number, line in enumerate(text.splitlines(), start=1):
        yield number, strip_labels(line).rstrip()


def number(token: str) -> float | None:
    """A printed float; None for `N/A` and for inf/nan, which JSON cannot carry.

    Old nccl-tests builds mark an error above tolerance with a trailing `*` (`2e-01*`).
    Raises ValueError for anything else, so a row of the wrong shape is not read as numbers.
    """
    if token == "N/A":
        return None
    value = float(token.rstrip("*"))
    return value if math.isfinite(value) else None


def integer(token: str) -> int | None:
    """A printed count (`0`, `12`, `1e+06` from %g) or None for `N/A`."""
    value = number(token)
    if value is None:
        return None
    if value != int(value):
        raise ValueError(f"{token!r} is not a whole number")
    return int(value)
