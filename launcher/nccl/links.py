"""What the catalog says a node's links should do: the interconnect class, the bus bandwidth
peak a measurement is held against, and how many EFA interfaces NCCL should find.

Which peak: inside one node every rank's ring hop is a GPU link (NVLink, or PCIe), so the
catalog's per-GPU one-way rate is the ceiling. Across nodes the traffic crosses the network,
whose rate per node (4x 100 Gb/s on p4d: 50 GB/s) is the ceiling; which measured figure is
held against it is `launcher.nccl.compare`'s business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.cluster import catalog
from launcher.cluster.catalog import CatalogError, InstanceFacts

# The catalog's interconnect wording -> the class `parse_topology` gives the same wiring.
TOPOLOGY_CLASS = {
    catalog.NVSWITCH: "nvswitch",
    catalog.PARTIAL_NVLINK: "partial-nvlink",
    catalog.PCIE_ONLY: "pcie",
}

# EC2's NetworkPerformance wording: "4x 100 Gigabit", "3200 Gigabit", "Up to 20 Gigabit".
_NETWORK = re.compile(r"(?:(?P<cards>\d+)x\s*)?(?P<gbit>\d+(?:\.\d+)?)\s*Gigabit")


@dataclass(frozen=True)
class LinkPeak:
    gbps: float  # GB/s (bytes), one direction, what busbw is compared with
    label: str  # where the number comes from, for reports and the plot legend

    def to_json(self) -> dict:
        return {"gbps": self.gbps, "label": self.label}


def facts(instance_type: str | None) -> InstanceFacts | None:
    """The catalog row, or None for no type or a type the catalog does not know."""
    if not instance_type:
        return None
    try:
        return catalog.lookup(instance_type)
    except CatalogError:
        return None


def network_gbps(row: InstanceFacts) -> float | None:
    """The node's network rate in GB/s from EC2's wording; None when it does not say."""
    match = _NETWORK.search(row.network_performance)
    if match is None:
        return None
    return int(match["cards"] or 1) * float(match["gbit"]) / 8


def gpu_peak(instance_type: str | None) -> LinkPeak | None:
    """The catalog's per-GPU one-way link rate: what one node's busbw is held against."""
    row = facts(instance_type)
    if row is None:
        return None
    return LinkPeak(row.gpu_link_gbps,
                    f"{row.instance_type} {row.gpu_link} {row.gpu_link_gbps:g} GB/s per GPU")


def network_peak(instance_type: str | None) -> LinkPeak | None:
    """The node's network rate from the catalog, or None when it does not say."""
    row = facts(instance_type)
    net = network_gbps(row) if row else None
    if net is None:
        return None
    return LinkPeak(net, f"{row.instance_type} network {row.network_performance} = "
                         f"{net:g} GB/s per node")


def link_peak(instance_type: str | None, nnodes: int) -> LinkPeak | None:
    """The slower of the links a run crosses: the GPU link on one node, else the smaller of it
    and the node's network."""
    gpu = gpu_peak(instance_type)
    if gpu is None or nnodes <= 1:
        return gpu
    net = network_peak(instance_type)
    return net if net is not None and net.gbps < gpu.gbps else gpu


def interconnect_class(instance_type: str | None) -> str | None:
    row = facts(instance_type)
    return TOPOLOGY_CLASS.get(row.interconnect) if row else None


def efa_interfaces(instance_type: str | None) -> int | None:
    row = facts(instance_type)
    return row.efa_max_interfaces if row else None
