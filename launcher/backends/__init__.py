"""Where to run, decided once for every command that runs on nodes (run, bench, topo, check):
a Where (launcher/commands/where.py reads it from the command line) names a backend.

    an inventory or a cluster   its hosts over SSH           (backends/ssh/)
    slurm                       a Slurm allocation            (backends/slurm/)
    none of these               this machine                  (backends/local/)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.backends.slurm.flags import SLURM_FLAGS
from launcher.cluster.ssh_options import SshOptions
from launcher.core.errors import LauncherError
from launcher.execute.backend import (Backend, GroupResult, LaunchOptions, NodeResult, Recover,
                                      print_plan)

__all__ = ["Backend", "GroupResult", "LaunchOptions", "NodeResult", "Recover", "SshOptions",
           "Where", "backend_for", "print_plan"]


@dataclass(frozen=True)
class Where:
    """Where nodes run, as the command line said it."""

    local: bool = False            # this machine, asked for explicitly
    inventory: str | None = None
    cluster: str | None = None     # the inventory `launch provision --cluster NAME` wrote
    slurm: bool = False
    limit: str | None = None       # an Ansible host pattern over the inventory's hosts
    ssh: SshOptions = field(default_factory=SshOptions)
    # Slurm settings given on the command line, by the recipe key (slurm.*) they override.
    slurm_flags: dict[str, Any] = field(default_factory=dict)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def backend_for(where: Where, local_count: int, say: Callable[[str], None] = _stderr) -> Backend:
    """The backend `where` names. Without an inventory, a cluster or Slurm the run stays on
    this machine, and `say` tells so in one line (on stderr, so that --json output stays
    clean) unless `local` asked for it; `local_count` is the number of nodes it announces."""
    if where.slurm:
        from launcher.backends.slurm.backend import SlurmBackend

        if where.limit:
            raise LauncherError("--limit selects hosts of an inventory; with --slurm, Slurm "
                                "picks the nodes (narrow them with --partition or "
                                "--sbatch-arg=--nodelist=...)")
        return SlurmBackend(where.slurm_flags)
    given = [SLURM_FLAGS[key] for key, value in where.slurm_flags.items()
             if value not in (None, [])]
    if given:
        raise LauncherError(f"{', '.join(given)}: Slurm options go with --slurm")
    inventory = where.inventory
    if where.cluster:
        from launcher.core.home import inventory_for

        inventory = str(inventory_for(where.cluster))
    if inventory:
        from launcher.backends.ssh.backend import SshBackend

        return SshBackend(inventory, where.ssh, limit=where.limit)
    if where.limit:
        raise LauncherError("--limit selects hosts of an inventory: give it with -i or --cluster")
    from launcher.backends.local.backend import LocalBackend

    backend = LocalBackend()
    if not where.local:
        say(f"launch: no inventory given: {local_count} node{'s' if local_count != 1 else ''} "
            "on this machine (-i INVENTORY or --cluster NAME runs on hosts over SSH, --slurm "
            "on a Slurm cluster)")
    return backend
