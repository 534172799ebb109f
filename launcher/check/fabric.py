"""`nvidia-smi nvlink -s` (every GPU's NVLink links and their speed) and `fi_info -p efa` (the EFA
devices libfabric sees), read into plain facts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: .*\))?\s*$")
_LINK = re.compile(r"^Link (?P<link>\d+): (?P<state>.+?)\s*$")


@dataclass
class NvlinkGpu:
    index: int
    name: str
    links: dict[int, float | None] = field(default_factory=dict)   # GB/s; None: <inactive>

    @property
    def inactive(self) -> list[int]:
        return [k for k, v in self.links.items() if v is None]


def parse_nvlink_status(text: str) -> list[NvlinkGpu]:
    """GPUs that list links; a GPU without NVLink prints no links (or nothing at all)."""
    gpus: list[NvlinkGpu] = []
    for raw in text.splitlines():
        line = raw.strip()
        gpu = _GPU.match(line)
        if gpu:
            gpus.append(NvlinkGpu(int(gpu["index"]), gpu["name"].strip()))
            continue
        link = _LINK.match(line)
        if link and gpus:
            state = link["state"]
            speed = re.match(r"^([\d.]+)\s*GB/s", state)
            gpus[-1].links[int(link["link"])] = float(speed.group(1)) if speed else None
    return gpus


# mpirun puts "[1,0]<stdout>:" in front of each rank's lines.
_RANK_PREFIX = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:")
_FIELD = re.compile(r"^\s*(?P<key>provider|fabric|domain|version|type|protocol):\s*(?P<value>\S+)")


@dataclass
class FiInfo:
    devices: list[str] = field(default_factory=list)     # rdmap16s27, efa_0: one per NIC
    entries: int = 0                                     # provider blocks listed
    fabrics: list[str] = field(default_factory=list)
    error: str | None = None                             # "fi_getinfo: -61" (no EFA)


def parse_fi_info(text: str) -> FiInfo:
    """EFA devices are the domains without their endpoint suffix (`-rdm`, `-dgrm`): each device
    is listed once per endpoint type and fabric (efa, efa-direct)."""
    info = FiInfo()
    devices: dict[str, None] = {}
    fabrics: dict[str, None] = {}
    provider = None
    for raw in text.splitlines():
        line = _RANK_PREFIX.sub("", raw)
        if "fi_getinfo" in line and re.search(r"-\d+", line):
            info.error = line.strip()
            continue
        match = _FIELD.match(line)
        if not match:
            continue
        key, value = match["key"], match["value"]
        if key == "provider":
            provider = value
            info.entries += 1
        elif key == "domain" and provider and provider.split(";")[0] == "efa":
            devices[re.sub(r"-(rdm|dgrm)$", "", value)] = None
        elif key == "fabric" and provider and provider.split(";")[0] == "efa":
            fabrics[value] = None
    info.devices = sorted(devices)
    info.fabrics = list(fabrics)
    return info
