"""A backend's command-line flags, as data: each backend declares its own (its options module:
launcher/backends/<name>/options.py), launcher/commands/where.py turns them into argparse
arguments and hands each backend back the values of its own flags as a plain dict, so that no
argparse Namespace goes below the commands and a new backend adds flags without touching
them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]            # ("-i", "--inventory")
    dest: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)   # argparse's: type, action, metavar

    @property
    def shown(self) -> str:
        """How messages name it: its long form."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])
