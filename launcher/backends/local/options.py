"""`--local` (or no other backend's flag): this machine."""

from __future__ import annotations

from typing import Any

from launcher.backends.flags import Flag

NAME = "local"
BACKEND = "launcher.backends.local.backend:LocalBackend"
SELECT = (Flag(("--local",), "local", "this machine (also the default when no inventory is "
                                      "given)", {"action": "store_true"}),)
FLAGS: tuple[Flag, ...] = ()


def selected(values: dict[str, Any]) -> bool:
    return bool(values.get("local"))


def settings(values: dict[str, Any]) -> dict[str, Any]:
    return {}
