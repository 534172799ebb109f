"""Nodes, and the Ansible inventory they are read from and written to.

The same file drives `launch run -i`, `launch setup` (ansible-runner) and is what
`launch provision` writes. It is read with Ansible's own loader (InventoryManager and
VariableManager), so launch and `launch setup` see exactly the same hosts and variables: YAML
and INI, groups and children, host ranges (gpu-[01:16]), group_vars/ and host_vars/ next to
the file, inventory plugins where installed. Its answer for a static inventory is kept between
commands while no file it read changed (inventory_cache.py). Hosts keep the inventory's order;
the first one selected is the head node, where the rendezvous store runs.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher.cluster.ansible_inventory import MAGIC as _MAGIC
from launcher.cluster.inventory_cache import InventoryCache
from launcher.cluster.inventory_files import check_inventory_files
from launcher.core.errors import InventoryError
from launcher.core.names import component_problem, name_problem
from launcher.core.yamlfile import shorten

# Keys launch reads from a host (or from all.vars). Ansible's own keys keep their names.
KNOWN_KEYS = {
    "ansible_host": "address launch connects to over SSH",
    "ansible_port": "SSH port (default 22)",
    "ansible_user": "SSH user (default: the current user)",
    "ansible_ssh_private_key_file": "private key for SSH",
    "private_ip": "address ranks and the rendezvous use (default: ansible_host)",
    "gpus": "number of GPUs the node must have (0 for CPU nodes)",
    "cpus": "cores launch may use on the node (default: all it reports; sets OMP_NUM_THREADS)",
    "launch_python": "interpreter with torch on the node (default: python3)",
    "launch_interface": "network interface that owns private_ip (found by preflight if unset)",
    "instance_type": "EC2 instance type, used for catalog facts in reports",
    "launch_run_root": "folder for run folders on the node (default .launch/runs in the login dir)",
    "launch_env_file": "KEY=VALUE file every rank gets (default /etc/launch/nccl.env, written "
                       "by `launch setup` on EFA nodes)",
}

# How a host's machine was bought (`launch provision --market` writes it; `launch run` watches
# spot nodes for EC2's interruption notice). Kept among the host's extra variables, read here
# so that a value launch does not know is an error rather than a node silently not watched.
MARKET_VAR = "launch_market"
MARKETS = ("on-demand", "spot", "capacity-block")


@dataclass(frozen=True)
class Node:
    """One machine that runs one torchrun agent."""

    name: str
    address: str
    private_address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    python: str = "python3"
    interface: str | None = None
    instance_type: str | None = None
    run_root: str = ".launch/runs"
    env_file: str = "/etc/launch/nccl.env"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _whole(path: str, host: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InventoryError(path, host, f"{key} must be a whole number, got {shorten(value)}")
    try:
        number = int(value)
    except ValueError:
        raise InventoryError(path, host, f"{key} must be a whole number, got "
                                         f"{shorten(value)}") from None
    if not low <= number <= high:
        raise InventoryError(path, host, f"{key} must be from {low} to {high}, got {number}")
    return number


def _text(path: str, host: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InventoryError(path, host, f"{key} must be text, got {shorten(value)}")
    text = str(value)
    if not text or "\0" in text or len(text) > 4096:
        raise InventoryError(path, host, f"{key} {shorten(text)} is not usable")
    return text


def _address(path: str, host: str, key: str, value: Any) -> str:
    text = _text(path, host, key, value) or ""
    if text.startswith("-") or any(c.isspace() for c in text) or len(text) > 255:
        raise InventoryError(path, host, f"{key} {shorten(text)} is not a host name or address")
    return text


def node_from_vars(path: str, name: str, hostvars: dict[str, Any]) -> Node:
    why = component_problem(name)
    if why:
        raise InventoryError(path, shorten(name), f"the host name cannot be used: {why} (it "
                                                  "names the node's folder in every run)")
    address = _address(path, name, "ansible_host", hostvars.get("ansible_host") or name)
    private = _address(path, name, "private_ip", hostvars.get("private_ip") or address)
    gpus, cpus = hostvars.get("gpus"), hostvars.get("cpus")
    interface = _text(path, name, "launch_interface", hostvars.get("launch_interface"))
    why = None if interface is None else name_problem("network interface name", interface)
    if why:
        raise InventoryError(path, name, f"launch_interface {shorten(interface)} is not a "
                                         f"network interface name: {why}")
    extra = {k: v for k, v in hostvars.items() if k not in KNOWN_KEYS and k not in _MAGIC}
    market = extra.get(MARKET_VAR)
    if market is not None and market not in MARKETS:
        raise InventoryError(path, name, f"{MARKET_VAR} {shorten(market)} is not one of "
                                         f"{', '.join(MARKETS)} (leave it out for on-demand)")
    return Node(
        name=name,
        address=address,
        private_address=private,
        port=_whole(path, name, "ansible_port", hostvars.get("ansible_port", 22), 1, 65535),
        user=_text(path, name, "ansible_user", hostvars.get("ansible_user")),
        key_file=_text(path, name, "ansible_ssh_private_key_file",
                       hostvars.get("ansible_ssh_private_key_file")),
        gpus=None if gpus is None else _whole(path, name, "gpus", gpus, 0, 64),
        cpus=None if cpus is None else _whole(path, name, "cpus", cpus, 0, 4096) or None,
        python=_text(path, name, "launch_python", hostvars.get("launch_python")) or "python3",
        interface=interface,
        instance_type=_text(path, name, "instance_type", hostvars.get("instance_type")),
        run_root=_text(path, name, "launch_run_root", hostvars.get("launch_run_root"))
        or ".launch/runs",
        env_file=_text(path, name, "launch_env_file", hostvars.get("launch_env_file"))
        or "/etc/launch/nccl.env",
        extra=extra,
    )


def _ansible_hosts(path: str, limit: str | None) -> list[tuple[str, dict[str, Any]]]:
    """(host, variables) for the selected hosts, in the inventory's order, from Ansible's own
    loader, or its answer kept from an earlier command while nothing it read changed
    (launcher/cluster/inventory_cache.py). The files' bounds are checked before Ansible reads
    them; a kept answer's files are byte for byte those that passed the check."""
    cache = InventoryCache(path, limit or "all")
    answer = cache.answer()
    if answer is None:
        check_inventory_files(path)
        answer = _ask_ansible(path, limit)
        cache.keep(answer)
    if answer.get("error"):
        raise InventoryError(path, None, f"Ansible cannot read it: {answer['error']}")
    found = [(name, hostvars) for name, hostvars in answer["hosts"]]
    if limit and not found:
        warnings = answer.get("warnings") or []
        raise InventoryError(path, None, f"--limit {limit} matches no host"
                             + (f" ({warnings[0]})" if warnings else ""))
    return found


def _ask_ansible(path: str, limit: str | None) -> dict[str, Any]:
    """Ansible's loader's answer (launcher/cluster/ansible_inventory.py), run in a child
    process: Ansible patches parts of the interpreter when imported (sys.intern, which later
    broke torch's DDP in the same process), and launch's own process stays free of that."""
    argv = [sys.executable, "-m", "launcher.cluster.ansible_inventory", path, limit or "all"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InventoryError(path, None, f"Ansible's inventory loader did not answer: {err}") \
            from None
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InventoryError(path, None, "Ansible's inventory loader failed: "
                                         f"{shorten(detail[0], 300)}") from None
    if not isinstance(answer, dict):
        raise InventoryError(path, None, "Ansible's inventory loader failed: it answered "
                                         f"{shorten(answer)}")
    return answer


def _warn_stderr(text: str) -> None:
    print(f"launch: warning: {text}", file=sys.stderr)


def _lint(path: str, entries: list[tuple[str, dict[str, Any]]],
          warn: Callable[[str], None]) -> None:
    """Accepted, but probably not meant: close misspellings of launch's keys, and two host
    names for one address."""
    known = list(KNOWN_KEYS)
    for name, hostvars in entries:
        for key in hostvars:
            if key in KNOWN_KEYS or key in _MAGIC or key.startswith("ansible_"):
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
            if close:
                warn(f"{path}: host {name}: unknown key {key} (did you mean {close[0]}?): it "
                     "is kept for Ansible but launch does not read it")
    seen: dict[tuple[Any, Any], str] = {}
    for name, hostvars in entries:
        where = (hostvars.get("ansible_host") or name, hostvars.get("ansible_port", 22))
        if where in seen:
            warn(f"{path}: hosts {seen[where]} and {name} are the same machine "
                 f"({where[0]}:{where[1]}): each runs a node agent there")
        seen.setdefault(where, name)


def load_inventory(path: str | Path, limit: str | None = None,
                   warn: Callable[[str], None] = _warn_stderr) -> list[Node]:
    """The hosts of an Ansible inventory (all, or those `limit` selects, an Ansible host
    pattern), in inventory order, with every variable Ansible would give them."""
    path = str(path)
    if not Path(path).exists():
        raise InventoryError(path, None, "cannot read the inventory: no such file or folder")
    entries = _ansible_hosts(path, limit)
    if not entries:
        raise InventoryError(path, None, "the inventory lists no hosts (see `launch init` "
                                         "for an example inventory)")
    _lint(path, entries, warn)
    return [node_from_vars(path, name, hostvars) for name, hostvars in entries]


def select_nodes(nodes: list[Node], count: int, path: str | Path) -> list[Node]:
    if count < 1:
        raise InventoryError(str(path), None, f"--nodes must be at least 1, got {count}")
    if count > len(nodes):
        names = ", ".join(n.name for n in nodes)
        raise InventoryError(
            str(path), None,
            f"--nodes {count} asks for more hosts than the inventory holds ({len(nodes)}: {names}); "
            "add hosts or pass a smaller --nodes",
        )
    return nodes[:count]


def inventory_document(nodes: list[Node], common: dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML structure for `nodes` (what `launch provision` writes)."""
    hosts: dict[str, Any] = {}
    for node in nodes:
        hv: dict[str, Any] = {"ansible_host": node.address}
        if node.port != 22:
            hv["ansible_port"] = node.port
        if node.user:
            hv["ansible_user"] = node.user
        if node.key_file:
            hv["ansible_ssh_private_key_file"] = node.key_file
        if node.private_address != node.address:
            hv["private_ip"] = node.private_address
        if node.gpus is not None:
            hv["gpus"] = node.gpus
        if node.cpus is not None:
            hv["cpus"] = node.cpus
        if node.python != "python3":
            hv["launch_python"] = node.python
        if node.interface:
            hv["launch_interface"] = node.interface
        if node.instance_type:
            hv["instance_type"] = node.instance_type
        if node.run_root != ".launch/runs":
            hv["launch_run_root"] = node.run_root
        if node.env_file != "/etc/launch/nccl.env":
            hv["launch_env_file"] = node.env_file
        hv.update(node.extra)
        hosts[node.name] = hv
    doc: dict[str, Any] = {"all": {"hosts": hosts}}
    if common:
        doc["all"]["vars"] = dict(common)
    return doc


def write_inventory(path: str | Path, nodes: list[Node], common: dict[str, Any] | None = None,
                    header: str = "") -> None:
    text = yaml.safe_dump(inventory_document(nodes, common), sort_keys=False)
    if header:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + text
    Path(path).write_text(text)

