"""Instance facts: GPUs, interconnect, per-GPU link peak, EFA interfaces, network cards, price.

The built-in table makes every command (dry runs included) work offline. Its EC2 columns were
copied from EC2 DescribeInstanceTypes; `enrich()` overwrites them with a live answer when one is
available. The columns AWS does not report (interconnect, link peak, price) exist only here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from launcher.errors import LauncherError

# On-demand Linux prices in us-east-1, from the public EC2 price list, as of this month. Other
# regions cost more or less; AWS lowered P4d/P4de/P5 on-demand prices in June 2025 (up to 33% and
# 45%), so the P rows overstate today's cost: estimates err on the expensive side.
PRICE_AS_OF = "2025-05"
PRICE_REGION = "us-east-1"

NVSWITCH = "NVSwitch"
PARTIAL_NVLINK = "partial NVLink"
PCIE_ONLY = "PCIe only"


class CatalogError(LauncherError):
    pass


@dataclass(frozen=True)
class InstanceFacts:
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int          # per GPU, as EC2 reports it
    vcpus: int
    memory_mib: int
    architecture: str            # EC2 spelling: x86_64 | arm64
    efa_max_interfaces: int      # 0: no EFA
    network_cards: int
    network_performance: str     # EC2's own wording, e.g. "4x 100 Gigabit"
    interconnect: str            # NVSWITCH | PARTIAL_NVLINK | PCIE_ONLY
    gpu_link: str                # what carries GPU-to-GPU traffic inside the instance
    gpu_link_gbps: float         # per GPU, one direction, GB/s (bytes)
    price_per_hour: float        # USD, on-demand, PRICE_REGION
    price_as_of: str = PRICE_AS_OF
    source: str = "built-in"     # "built-in" or "built-in + DescribeInstanceTypes <region>"

    @property
    def efa_supported(self) -> bool:
        return self.efa_max_interfaces > 0

    @property
    def gpu_summary(self) -> str:
        return f"{self.gpu_count}x {self.gpu_model} {round(self.gpu_memory_mib / 1024, 1):g} GiB"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "efa_supported": self.efa_supported,
                "price_region": PRICE_REGION}


def _a100(instance_type: str, gpu_mib: int, price: float) -> InstanceFacts:
    # NVLink3 is 600 GB/s per A100 counting both directions; NCCL bus bandwidth compares to one.
    return InstanceFacts(instance_type, "A100", 8, gpu_mib, 96, 1179648, "x86_64", 4, 4,
                         "4x 100 Gigabit", NVSWITCH, "NVLink3", 300.0, price)


def _l40s(size: str, gpus: int, vcpus: int, mem_gib: int, efa: int, cards: int, net: str,
          price: float) -> InstanceFacts:
    # L40S has no NVLink: GPUs talk through PCIe Gen4 x16, about 32 GB/s each way.
    return InstanceFacts(f"g6e.{size}", "L40S", gpus, 45776, vcpus, mem_gib * 1024, "x86_64", efa,
                         cards, net, PCIE_ONLY, "PCIe Gen4 x16", 32.0, price)


_BUILTIN: tuple[InstanceFacts, ...] = (
    _a100("p4d.24xlarge", 40960, 32.7726),
    _a100("p4de.24xlarge", 81920, 40.9657),
    # NVLink4: 900 GB/s per H100 both directions. One EFA interface per each of 32 cards.
    InstanceFacts("p5.48xlarge", "H100", 8, 81920, 192, 2097152, "x86_64", 32, 32,
                  "3200 Gigabit", NVSWITCH, "NVLink4", 450.0, 98.32),
    _l40s("xlarge", 1, 4, 32, 0, 1, "Up to 20 Gigabit", 1.861),
    _l40s("2xlarge", 1, 8, 64, 0, 1, "Up to 20 Gigabit", 2.24208),
    _l40s("4xlarge", 1, 16, 128, 0, 1, "20 Gigabit", 3.00424),
    _l40s("8xlarge", 1, 32, 256, 1, 1, "25 Gigabit", 4.52856),
    _l40s("12xlarge", 4, 48, 384, 1, 1, "100 Gigabit", 10.49264),
    _l40s("16xlarge", 1, 64, 512, 1, 1, "35 Gigabit", 7.57719),
    _l40s("24xlarge", 4, 96, 768, 2, 2, "200 Gigabit", 15.06559),
    _l40s("48xlarge", 8, 192, 1536, 4, 4, "400 Gigabit", 30.13118),
)
BUILTIN: dict[str, InstanceFacts] = {f.instance_type: f for f in _BUILTIN}


def known_types() -> list[str]:
    return list(BUILTIN)


def lookup(instance_type: str) -> InstanceFacts:
    """Facts for one type from the built-in table; unknown types are a CatalogError."""
    try:
        return BUILTIN[instance_type]
    except KeyError:
        raise CatalogError(
            f"instance type {instance_type!r} is not in launch's catalog; known types: "
            f"{', '.join(known_types())}. The catalog must know a type's interconnect and price "
            "to plan for it (add a row to launcher/catalog.py)"
        ) from None


def enrich(facts: InstanceFacts, described: dict[str, Any], region: str) -> InstanceFacts:
    """`facts` with the EC2 columns taken from one DescribeInstanceTypes entry.

    EC2 is the authority for what it reports (GPU count and memory, EFA limit, cards); the
    built-in row keeps the rest.
    """
    gpu_info = described.get("GpuInfo") or {}
    gpus = (gpu_info.get("Gpus") or [{}])[0]
    net = described.get("NetworkInfo") or {}
    changes: dict[str, Any] = {
        "gpu_model": gpus.get("Name", facts.gpu_model),
        "gpu_count": gpus.get("Count", facts.gpu_count),
        "gpu_memory_mib": (gpus.get("MemoryInfo") or {}).get("SizeInMiB", facts.gpu_memory_mib),
        "vcpus": (described.get("VCpuInfo") or {}).get("DefaultVCpus", facts.vcpus),
        "memory_mib": (described.get("MemoryInfo") or {}).get("SizeInMiB", facts.memory_mib),
        "efa_max_interfaces": ((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)
                               if net.get("EfaSupported") else 0),
        "network_cards": net.get("MaximumNetworkCards", facts.network_cards),
        "network_performance": net.get("NetworkPerformance", facts.network_performance),
        "source": f"built-in + DescribeInstanceTypes {region}",
    }
    archs = (described.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    if archs:
        changes["architecture"] = archs[0]
    return replace(facts, **changes)


def differences(a: InstanceFacts, b: InstanceFacts) -> list[str]:
    """Field-by-field differences in the EC2 columns (shown when live facts disagree)."""
    skip = {"source"}
    return [
        f"{name}: built-in {getattr(a, name)!r}, EC2 {getattr(b, name)!r}"
        for name in a.__dataclass_fields__
        if name not in skip and getattr(a, name) != getattr(b, name)
    ]
