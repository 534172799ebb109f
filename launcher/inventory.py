"""Nodes, and the Ansible YAML inventory they are read from and written to.

The same file drives `launch run -i`, `launch setup` (ansible-runner) and is what
`launch provision` writes. Hosts keep their file order; the first host is the head node, the
one that hosts the c10d rendezvous store.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import InventoryError

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


def _host_entries(path: str, group: dict[str, Any], inherited: dict[str, Any], out: dict):
    if group is None:
        return
    if not isinstance(group, dict):
        raise InventoryError(path, None, "every group must be a mapping with hosts/vars/children")
    merged = {**inherited, **(group.get("vars") or {})}
    hosts = group.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise InventoryError(path, None, "'hosts' must be a mapping of host name to variables")
    for name, hostvars in hosts.items():
        hostvars = hostvars or {}
        if not isinstance(hostvars, dict):
            raise InventoryError(path, str(name), "host variables must be a mapping")
        previous = out.get(str(name), {})
        out[str(name)] = {**merged, **previous, **hostvars}
    for child in (group.get("children") or {}).values():
        _host_entries(path, child, merged, out)


def _int(path: str, host: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InventoryError(path, host, f"{key} must be a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise InventoryError(path, host, f"{key} must be a whole number, got {value!r}") from None
    if number < 0:
        raise InventoryError(path, host, f"{key} must not be negative, got {number}")
    return number


def node_from_vars(path: str, name: str, hostvars: dict[str, Any]) -> Node:
    address = str(hostvars.get("ansible_host") or name)
    private = str(hostvars.get("private_ip") or address)
    for key, value in (("ansible_host", address), ("private_ip", private)):
        if value.startswith("-") or any(c.isspace() for c in value):
            raise InventoryError(path, name, f"{key} {value!r} is not a host name or address")
    gpus, cpus = hostvars.get("gpus"), hostvars.get("cpus")
    extra = {k: v for k, v in hostvars.items() if k not in KNOWN_KEYS}
    return Node(
        name=name,
        address=address,
        private_address=private,
        port=_int(path, name, "ansible_port", hostvars.get("ansible_port", 22)),
        user=hostvars.get("ansible_user"),
        key_file=hostvars.get("ansible_ssh_private_key_file"),
        gpus=None if gpus is None else _int(path, name, "gpus", gpus),
        cpus=None if cpus is None else _int(path, name, "cpus", cpus) or None,
        python=str(hostvars.get("launch_python") or "python3"),
        interface=hostvars.get("launch_interface"),
        instance_type=hostvars.get("instance_type"),
        run_root=str(hostvars.get("launch_run_root") or ".launch/runs"),
        env_file=str(hostvars.get("launch_env_file") or "/etc/launch/nccl.env"),
        extra=extra,
    )


def load_inventory(path: str | Path, limit: str | None = None) -> list[Node]:
    """All hosts of an Ansible YAML inventory, in file order, with group vars applied."""
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise InventoryError(path, None, f"cannot read the inventory: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InventoryError(path, None, f"not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("all"), dict):
        raise InventoryError(
            path, None, "expected an Ansible YAML inventory with a top-level 'all:' group "
            "(see inventory.example.yml)"
        )
    entries: dict[str, dict[str, Any]] = {}
    _host_entries(path, data["all"], {}, entries)
    if not entries:
        raise InventoryError(path, None, "the inventory lists no hosts under all.hosts")
    nodes = [node_from_vars(path, name, hv) for name, hv in entries.items()]
    if limit:
        patterns = [p for p in limit.split(",") if p]
        nodes = [n for n in nodes if any(fnmatch.fnmatchcase(n.name, p) for p in patterns)]
        if not nodes:
            raise InventoryError(path, None, f"--limit {limit} matches no host")
    return nodes


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

