"""`launch topo`, the pure part: every node's `nvidia-smi topo -m` (or why there is none),
compared across nodes and with the catalog, and the DDP settings the wiring calls for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.nccl import advice
from launcher.nccl.errors import NcclParseError
from launcher.nccl.links import efa_interfaces
from launcher.nccl.topology import Topology, parse_topology

# Mellanox/NVIDIA NICs (mlx5_0 ...) in the NIC legend mean InfiniBand or RoCE between nodes.
_IB_NIC_PREFIX = "mlx"


@dataclass(frozen=True)
class NodeOutput:
    """What one node answered: the command's text, or why there is none."""

    name: str
    instance_type: str | None
    text: str | None
    problem: str | None = None


def _fast_network(instance_type: str | None, topo: Topology) -> bool | None:
    """EFA per the catalog, or an InfiniBand NIC in the node's own legend; None: unknown."""
    efa = efa_interfaces(instance_type)
    if efa:
        return True
    if any(nic.startswith(_IB_NIC_PREFIX) for nic in topo.nic_names):
        return True
    return False if efa == 0 else None


def check_topologies(outputs: list[NodeOutput]) -> dict[str, Any]:
    """The `--json` shape: nodes (topology or problem), differences, advice, complete."""
    nodes, topologies, fast = [], {}, []
    for out in outputs:
        topo, problem = None, out.problem
        if out.text is not None:
            try:
                topo = parse_topology(out.text, f"{out.name}: nvidia-smi topo -m")
            except NcclParseError as err:
                problem = str(err)
        if topo is not None:
            topologies[out.name] = topo
            fast.append(_fast_network(out.instance_type, topo))
        nodes.append({"name": out.name, "instance_type": out.instance_type,
                      "topology": topo.to_json() if topo else None, "problem": problem})
    types = {out.name: out.instance_type for out in outputs}
    classes = [t.link_class for t in topologies.values()]
    fast_network = None if None in fast or not fast else all(fast)
    wiring = (advice.wiring_advice(advice.slowest_class(classes), len(outputs), fast_network)
              if topologies else [])
    return {"nodes": nodes,
            "differences": advice.topology_differences(topologies, types),
            "advice": wiring,
            "complete": len(topologies) == len(outputs)}


def render(checked: dict[str, Any]) -> list[str]:
    lines = []
    for node in checked["nodes"]:
        itype = f" ({node['instance_type']})" if node["instance_type"] else ""
        topo = node["topology"]
        if topo is None:
            lines.append(f"{node['name']}{itype}: {node['problem']}")
            continue
        lines.append(f"{node['name']}{itype}: {topo['class']}, {topo['gpus']} GPU(s), "
                     f"{topo['nics']} NIC(s), worst GPU link {topo['worst_link'] or 'n/a'}")
    lines += [f"difference: {d}" for d in checked["differences"]]
    lines += [f"recommended: {a}" for a in checked["advice"]]
    return lines
