"""`-i INVENTORY` / `--cluster NAME`: an inventory's hosts over SSH, and the flags that say how
to reach them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.backends.flags import Flag
from launcher.core.errors import LauncherError

NAME = "ssh"
BACKEND = "launcher.backends.ssh.backend:SshBackend"
SELECT = (
    Flag(("-i", "--inventory"), "inventory", "an Ansible inventory (YAML or INI): its hosts "
                                             "over SSH", {"metavar": "INVENTORY"}),
    Flag(("--cluster",), "cluster", "the cluster `launch provision --cluster NAME` made (its "
                                    "inventory)", {"metavar": "NAME"}),
)
LIMIT = Flag(("--limit",), "limit", "with -i/--cluster: only these hosts (an Ansible host "
                                    "pattern, e.g. gpu-0* or node1,node2)",
             {"metavar": "PATTERN"})
# How hosts are reached, for every command that reaches them (also `launch extend`).
HOST_KEYS = (
    Flag(("--accept-new-host-keys",), "accept_new_host_keys",
         "SSH: record unknown host keys in known_hosts, like OpenSSH's accept-new (a changed "
         "key is always refused)", {"action": "store_true"}),
    Flag(("--known-hosts",), "known_hosts", "SSH: known_hosts file (default: the inventory's "
                                            "UserKnownHostsFile, else ~/.ssh/known_hosts)"),
)
# How many hosts preflight connects to and checks at a time (and a group command, a fetch of
# the nodes' folders): a fleet of 256 once opened 256 connections and probes at once. 32 keeps
# 8-node runs fully parallel with room to spare, like pdsh's default window of 32, and one
# launcher's threads and sockets a fixed size whatever the fleet.
DEFAULT_FANOUT = 32


def fanout_count(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fanout takes a whole number of hosts, got "
                                         f"{text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--fanout must be at least 1 host at a time, got "
                                         f"{value}")
    return value


FANOUT = Flag(("--fanout",), "fanout", "SSH: connect to and check at most N hosts at a time "
                                       f"(default {DEFAULT_FANOUT})",
              {"metavar": "N", "type": fanout_count})
FLAGS = (LIMIT, FANOUT, *HOST_KEYS)


def selected(values: dict[str, Any]) -> bool:
    return bool(values.get("inventory") or values.get("cluster"))


def ssh_settings(values: dict[str, Any]) -> dict[str, Any]:
    known = values.get("known_hosts")
    if known and Path(known).expanduser().is_dir():
        raise LauncherError(f"--known-hosts {known} is a folder: give the known_hosts file "
                            "(e.g. ~/.ssh/known_hosts)")
    return {"known_hosts": known, "accept_new_host_keys": bool(values.get("accept_new_host_keys"))}


def settings(values: dict[str, Any]) -> dict[str, Any]:
    inventory = values.get("inventory")
    if values.get("cluster"):
        from launcher.core.home import inventory_for

        inventory = str(inventory_for(values["cluster"]))
    return {"inventory": inventory, "cluster": values.get("cluster"),
            "limit": values.get("limit"), "fanout": values.get("fanout") or DEFAULT_FANOUT,
            **ssh_settings(values)}
