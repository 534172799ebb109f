"""Hosts as network namespaces on a bridge, built and removed: what the SSH lab (hosts.py) and
the Slurm lab (slurm.py) share. Each host is a namespace with its loopback up and a veth pair,
one end inside with the host's address, the other on a bridge in this machine's namespace.
The hosts share this machine's files and processes; `ip netns pids` tells what runs on one.

Needs root and iproute2. Every step is an argv list; a failed one raises LabError with the
command and what it said.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

from launcher.core.errors import LauncherError


class LabError(LauncherError):
    pass


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (tried, not guessed), or None."""
    name = "launch-probe-" + secrets.token_hex(3)
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces are not available here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def free_subnet(private: bool = False) -> ipaddress.IPv4Network:
    """A /24 no address or route of this machine uses (a bridge's and hosts' .1, .10-.41)."""
    used = run("ip", "-o", "-4", "addr", "show").stdout
    routes = run("ip", "-4", "route", "show").stdout
    for _ in range(200):
        # Private networks come from another range than every lab's bridge (10.200-249.x), so
        # a lab built beside this one never answers on a private address this machine must not
        # reach.
        net = ipaddress.ip_network(
            f"172.{16 + secrets.randbelow(16)}.{secrets.randbelow(256)}.0/24" if private else
            f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}.0/24")
        if f" {net.network_address + 1}/" not in used and str(net) not in routes and \
                not any(f" {net.network_address + 10 + i}/" in used for i in range(32)):
            return net
    raise LabError(f"no free {'172.16-31' if private else '10.200-249'}.x.0/24 subnet for the lab")


def gateway(net: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The bridge's address on `net`: the hosts' default route."""
    return net.network_address + 1


def host_address(net: ipaddress.IPv4Network, index: int) -> str:
    return str(net.network_address + 10 + index)


def add_bridge(name: str, net: ipaddress.IPv4Network | None) -> None:
    """A bridge, with the gateway address of `net` on it; with None, no address: this machine
    then cannot reach the hosts on it at all."""
    run("ip", "link", "add", name, "type", "bridge")
    if net is not None:
        run("ip", "addr", "add", f"{gateway(net)}/{net.prefixlen}", "dev", name)
    run("ip", "link", "set", name, "up")


def add_namespace(netns: str) -> None:
    run("ip", "netns", "add", netns)
    # The machine's DNS server is unreachable from the namespace, and every lookup (c10d
    # resolves each peer's name, sshd too) then waited for a resolver timeout: runs took 26 s
    # to pass rendezvous instead of a few. `ip netns exec` mounts this file over
    # /etc/resolv.conf for all it starts: lookups fail at once and fall back to addresses.
    etc = Path("/etc/netns") / netns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text("# launch lab: no DNS inside the lab\n"
                                     "nameserver 127.0.0.1\n")
    run("ip", "-n", netns, "link", "set", "lo", "up")


def add_link(netns: str, root_end: str, inside: str, bridge: str, address: str,
             prefixlen: int) -> None:
    """A veth pair: `root_end` on `bridge` here, `inside` in the namespace with `address`."""
    run("ip", "link", "add", root_end, "type", "veth", "peer", "name", inside, "netns", netns)
    run("ip", "link", "set", root_end, "master", bridge, "up")
    run("ip", "-n", netns, "addr", "add", f"{address}/{prefixlen}", "dev", inside)
    run("ip", "-n", netns, "link", "set", inside, "up")


def add_default_route(netns: str, via: ipaddress.IPv4Address) -> None:
    run("ip", "-n", netns, "route", "add", "default", "via", str(via))


def pids(netns: str) -> list[int]:
    """Processes whose network namespace is `netns`: what runs 'on' the host."""
    out = run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def remove_links(links: Iterable[str]) -> None:
    for link in dict.fromkeys(links):
        run("ip", "link", "del", link, check=False)


def remove_namespace(netns: str, links: Iterable[str] = ()) -> None:
    """Whatever runs in the namespace (it was started inside the lab), the namespace and its
    links; safe for a namespace or link already gone."""
    for pid in pids(netns):
        kill(pid)
    run("ip", "netns", "del", netns, check=False)
    shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
    remove_links(links)


def namespaces() -> set[str]:
    listed = run("ip", "netns", "list", check=False).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}
