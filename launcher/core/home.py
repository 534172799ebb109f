"""$LAUNCH_HOME (default ~/.launch): what launch keeps on this machine between commands.

    $LAUNCH_HOME/clusters/<cluster>/   ledger.json, inventory.yml, facts/<host>.json
    $LAUNCH_HOME/setup/<stamp>-*/      one ansible-runner folder per `launch setup`
    $LAUNCH_HOME/workdir-hashes/       per scanned folder, its files' sha256 by stat data
                                       (launcher/workdir/scan.py)
    $LAUNCH_HOME/inventory-cache/      Ansible's answer per inventory and --limit, while its
                                       files are unchanged (launcher/cluster/inventory_cache.py)
"""

from __future__ import annotations

import os
from pathlib import Path


# A dry run changes nothing, launch's own caches here included: set by the command line for
# `--dry-run` (launcher/cli.py), read by each cache before it writes (workdir-hashes,
# inventory-cache), which then serve what they hold and keep nothing new.
_read_only = False


def launch_home() -> Path:
    return Path(os.environ.get("LAUNCH_HOME") or Path.home() / ".launch")


def keep_nothing(value: bool = True) -> None:
    """From now on this process writes no cache into the launch home (a dry run)."""
    global _read_only
    _read_only = value


def keeps_nothing() -> bool:
    return _read_only


def cluster_dir(cluster: str, home: Path | None = None) -> Path:
    return (home or launch_home()) / "clusters" / cluster


def cluster_inventory(cluster: str) -> Path:
    """The inventory `launch provision` wrote for the cluster (what --cluster NAME reads)."""
    return cluster_dir(cluster) / "inventory.yml"


def inventory_for(cluster: str) -> Path:
    """`--cluster NAME` of any command: the cluster's inventory, which must be there."""
    from launcher.core.errors import LauncherError
    from launcher.core.names import path_component

    path = cluster_inventory(path_component(cluster, "--cluster"))
    if not path.is_file():
        raise LauncherError(f"--cluster {cluster}: no inventory at {path}; `launch provision "
                            f"--cluster {cluster}` writes it (or pass -i)")
    return path
