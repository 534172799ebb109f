"""Where to run, decided once for every command that runs on nodes (run, bench, topo, check,
attach, logs, stop), from one table: each backend's options module (cheap to import: its flags
as data, which of them select it, its settings) names the backend and makes it.

    -i INVENTORY / --cluster NAME   its hosts over SSH           (backends/ssh/)
    --slurm                         a Slurm allocation            (backends/slurm/)
    --local, or none of these       this machine                  (backends/local/)

A controller (a detached run's pipeline, launcher/pipeline/controller.py) makes its backend
again from the name and settings the client wrote into request.json: `backend_named`.
docs/backends.md says how to add one.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.backends.local import options as local_options
from launcher.backends.slurm import options as slurm_options
from launcher.backends.ssh import options as ssh_options
from launcher.core.errors import LauncherError
from launcher.execute.backend import Backend, GroupResult, NodeResult, print_plan

__all__ = ["Backend", "GroupResult", "NodeResult", "TABLE", "Where", "backend_for",
           "backend_named", "print_plan"]

# In the order they are asked whether the command line selects them; the last is the default.
TABLE = (slurm_options, ssh_options, local_options)


@dataclass(frozen=True)
class Where:
    """Where nodes run, as the command line said it: a backend's name and its settings (a
    plain dict: what its options module made of its own flags)."""

    name: str = local_options.NAME
    settings: dict[str, Any] = field(default_factory=dict)
    given: bool = False   # a flag named it (else: the default, this machine)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "settings": self.settings}


def options_of(name: str):
    for entry in TABLE:
        if entry.NAME == name:
            return entry
    raise LauncherError(f"no backend called {name!r} (backends: "
                        f"{', '.join(e.NAME for e in TABLE)})")


def where_from_values(values: dict[str, Any]) -> Where:
    """The backend the flags select, its settings from its own flags; a backend's flag given
    without that backend is refused, naming both."""
    given = next((entry for entry in TABLE if entry.selected(values)), None)
    chosen = given or TABLE[-1]
    for entry in TABLE:
        if entry is chosen:
            continue
        stray = [flag.shown for flag in entry.FLAGS
                 if values.get(flag.dest) not in (None, False, [])
                 and flag not in chosen.FLAGS]
        if stray:
            selector = " or ".join(f.shown for f in entry.SELECT)
            raise LauncherError(f"{', '.join(stray)}: {'these go' if len(stray) > 1 else 'it goes'}"
                                f" with {selector} ({entry.NAME}), not with "
                                f"{chosen.NAME}")
    return Where(chosen.NAME, chosen.settings(values), given is not None)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def backend_for(where: Where, local_count: int, say: Callable[[str], None] = _stderr) -> Backend:
    """The backend `where` names. Without an inventory, a cluster or Slurm the run stays on
    this machine, and `say` tells so in one line (on stderr, so that --json output stays
    clean) unless it was asked for; `local_count` is the number of nodes it announces."""
    if not where.given:
        say(f"launch: no inventory given: {local_count} node{'s' if local_count != 1 else ''} "
            "on this machine (-i INVENTORY or --cluster NAME runs on hosts over SSH, --slurm "
            "on a Slurm cluster)")
    return backend_named(where.name, where.settings)


def backend_named(name: str, settings: dict[str, Any]) -> Backend:
    """The backend called `name`, made from its settings (its class's from_settings); its
    module is imported only now (paramiko, fabric: not for a command that never connects)."""
    module, _, cls = options_of(name).BACKEND.partition(":")
    return getattr(importlib.import_module(module), cls).from_settings(settings)


def capabilities_table() -> str:
    """docs/backends.md's table of what every backend does, attached and detached, made from
    their declarations (tests/run/test_architecture.py holds the docs equal to it). A "no"
    points at its reason below the table."""
    from launcher.execute.backend import FEATURES

    backends = [backend_named(entry.NAME, {}) for entry in reversed(TABLE)
                if entry.NAME != "ssh"] + [_ssh_for_docs()]
    backends.sort(key=lambda b: [e.NAME for e in reversed(TABLE)].index(b.name))
    head = ["feature"] + [f"{b.name} {mode}" for b in backends for mode in ("attached",
                                                                              "detached")]
    rows, reasons = [], {}
    for feature in FEATURES:
        row = [feature]
        for backend in backends:
            for detached in (False, True):
                support = backend.capabilities.support(feature, detached)
                if support.ok:
                    row.append("yes")
                    continue
                key = (backend.name, support.why)
                number = reasons.setdefault(key, len(reasons) + 1)
                row.append(f"no ({number})")
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    lines += [f"{n}. {name}: {why}" for (name, why), n in reasons.items()]
    lines += ["", "Where a detached run's pipeline lives: "
              + "; ".join(f"{b.name}: {b.capabilities.controller}" for b in backends) + "."]
    return "\n".join(lines) + "\n"


def _ssh_for_docs():
    """The SSH backend without an inventory (its capabilities are the class's)."""
    module, _, cls = options_of("ssh").BACKEND.partition(":")
    return getattr(importlib.import_module(module), cls)(None, nodes=[])
