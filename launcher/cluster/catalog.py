"""Instance facts: GPUs, interconnect, per-GPU link peak, EFA interfaces, network cards, price.

Any type EC2 DescribeInstanceTypes describes can be planned for (`from_ec2`); the built-in table
adds only what EC2 does not say (the GPU interconnect and its per-GPU peak, a list price) and
makes offline dry runs work. Its EC2 columns were copied from DescribeInstanceTypes (moto's
bundled copy of it; `tests/aws/test_catalog.py` compares them); `enrich()` overwrites them with
a live answer when one is available. An interconnect nobody published stays "unknown".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from launcher.core.errors import LauncherError

NVSWITCH = "NVSwitch"
PARTIAL_NVLINK = "partial NVLink"
PCIE_ONLY = "PCIe only"
UNKNOWN = "unknown"

# The built-in prices are us-east-1 Linux on-demand list prices (shared tenancy).
PRICE_REGION = "us-east-1"

# Where each built-in price comes from. AWS cut P4d/P4de/P5/P5en on-demand prices in June 2025
# (up to 33% on P4, up to 45% on P5); the P rows below are the prices after that cut:
# - VANTAGE: instances.vantage.sh's copy of the AWS price list as of 2026-08-26, kept verbatim
#   in the public repository tsaol/aws-gpu (data/all_gpu_instances.js, commit 18aebd1d):
#   p4d.24xlarge 21.957642, p4de.24xlarge 27.44705, p5.48xlarge 55.04, p5.4xlarge 6.88,
#   p5en.48xlarge 63.296, p6-b200.48xlarge 113.9328; p5e.48xlarge has no on-demand price there
#   (AWS sells it through Capacity Blocks). The same p4de/p5/p5en/p6-b200 numbers appear in
#   another public table quoting "AWS us-east-1 Price List bulk files published 2026-09-25", and
#   p5en's in dstack PR #4110 ("aws (us-east-1) ... p5en.48xlarge $63.296", 2026-08-06).
# - MAY_2025: the EC2 on-demand price page as of 2025-05 (g6e was not part of the June cut; a
#   public us-west-2 table priced 2026-09-08 shows the same g6e.xlarge/12xlarge/48xlarge prices).
VANTAGE = ("instances.vantage.sh copy of the AWS price list", "2026-08-26")
MAY_2025 = ("EC2 on-demand price page", "2025-05")


class CatalogError(LauncherError):
    pass


@dataclass(frozen=True)
class Price:
    """An hourly on-demand price and where it came from; never shown without its source."""

    usd_per_hour: float
    region: str
    source: str
    as_of: str

    def label(self) -> str:
        return f"{self.region} on-demand list price, {self.source}, {self.as_of}"


@dataclass(frozen=True)
class NetworkCard:
    index: int
    interface_types: tuple[str, ...]   # EC2's words: interface | efa | efa-only
    max_interfaces: int


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
    interconnect: str            # NVSWITCH | PARTIAL_NVLINK | PCIE_ONLY | UNKNOWN
    gpu_link: str                # what carries GPU-to-GPU traffic inside the instance
    gpu_link_gbps: float | None  # per GPU, one direction, GB/s (bytes); None: not published
    price: Price | None          # None: no on-demand list price known
    cards: tuple[NetworkCard, ...] = ()
    source: str = "built-in"     # "built-in", "DescribeInstanceTypes <region>", or both

    @property
    def efa_supported(self) -> bool:
        return self.efa_max_interfaces > 0

    @property
    def price_per_hour(self) -> float | None:
        return self.price.usd_per_hour if self.price else None

    @property
    def gpu_summary(self) -> str:
        if not self.gpu_count:
            return "no GPUs"
        return f"{self.gpu_count}x {self.gpu_model} {round(self.gpu_memory_mib / 1024, 1):g} GiB"

    @property
    def link_summary(self) -> str:
        if self.gpu_link_gbps is None:
            return f"GPU link {self.gpu_link}"
        return f"{self.gpu_link} {self.gpu_link_gbps:g} GB/s per GPU"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "efa_supported": self.efa_supported}


def _cards(count: int, types: tuple[str, ...], per_card: int) -> tuple[NetworkCard, ...]:
    return tuple(NetworkCard(i, types, per_card) for i in range(count))


EFA_CARD = ("interface", "efa", "efa-only")
ENA_CARD = ("interface",)


def _price(usd: float, where: tuple[str, str]) -> Price:
    return Price(usd, PRICE_REGION, where[0], where[1])


def _a100(instance_type: str, gpu_mib: int, price: float) -> InstanceFacts:
    # NVLink3 is 600 GB/s per A100 counting both directions; NCCL bus bandwidth compares to one.
    return InstanceFacts(instance_type, "A100", 8, gpu_mib, 96, 1179648, "x86_64", 4, 4,
                         "4x 100 Gigabit", NVSWITCH, "NVLink3", 300.0, _price(price, VANTAGE),
                         _cards(4, EFA_CARD, 15))


def _hopper(instance_type: str, gpu: str, gpu_mib: int, efa: int, per_card: int,
            price: float | None) -> InstanceFacts:
    # NVLink4: 900 GB/s per H100/H200 both directions, through NVSwitch.
    return InstanceFacts(instance_type, gpu, 8, gpu_mib, 192, 2097152, "x86_64", efa, efa,
                         "3200 Gigabit", NVSWITCH, "NVLink4", 450.0,
                         _price(price, VANTAGE) if price is not None else None,
                         _cards(efa, EFA_CARD, per_card))


def _l40s(size: str, gpus: int, vcpus: int, mem_gib: int, efa: int, cards: int, net: str,
          per_card: int, price: float) -> InstanceFacts:
    # L40S has no NVLink: GPUs talk through PCIe Gen4 x16, about 32 GB/s each way.
    return InstanceFacts(f"g6e.{size}", "L40S", gpus, 45776, vcpus, mem_gib * 1024, "x86_64", efa,
                         cards, net, PCIE_ONLY, "PCIe Gen4 x16", 32.0, _price(price, MAY_2025),
                         _cards(cards, EFA_CARD if efa else ENA_CARD, per_card))


_BUILTIN: tuple[InstanceFacts, ...] = (
    _a100("p4d.24xlarge", 40960, 21.957642),
    _a100("p4de.24xlarge", 81920, 27.44705),
    _hopper("p5.48xlarge", "H100", 81920, 32, 2, 55.04),
    _hopper("p5e.48xlarge", "H200", 144384, 32, 2, None),   # Capacity Blocks only
    _hopper("p5en.48xlarge", "H200", 144384, 16, 4, 63.296),
    # One H100: no GPU peer inside the node, so the link that matters is PCIe Gen5 x16 (about
    # 64 GB/s each way) to the host and its one 100 Gb/s EFA card.
    InstanceFacts("p5.4xlarge", "H100", 1, 81920, 16, 262144, "x86_64", 1, 1, "100 Gigabit",
                  PCIE_ONLY, "PCIe Gen5 x16", 64.0, _price(6.88, VANTAGE),
                  _cards(1, EFA_CARD, 4)),
    # NVLink5: 1.8 TB/s per B200 both directions, through NVSwitch; 8 cards x 400 Gb/s.
    InstanceFacts("p6-b200.48xlarge", "B200", 8, 183359, 192, 2097152, "x86_64", 8, 8,
                  "3200 Gigabit", NVSWITCH, "NVLink5", 900.0, _price(113.9328, VANTAGE),
                  _cards(8, EFA_CARD, 4)),
    _l40s("xlarge", 1, 4, 32, 0, 1, "Up to 20 Gigabit", 4, 1.861),
    _l40s("2xlarge", 1, 8, 64, 0, 1, "Up to 20 Gigabit", 4, 2.24208),
    _l40s("4xlarge", 1, 16, 128, 0, 1, "20 Gigabit", 8, 3.00424),
    _l40s("8xlarge", 1, 32, 256, 1, 1, "25 Gigabit", 8, 4.52856),
    _l40s("12xlarge", 4, 48, 384, 1, 1, "100 Gigabit", 10, 10.49264),
    _l40s("16xlarge", 1, 64, 512, 1, 1, "35 Gigabit", 15, 7.57719),
    _l40s("24xlarge", 4, 96, 768, 2, 2, "200 Gigabit", 10, 15.06559),
    _l40s("48xlarge", 8, 192, 1536, 4, 4, "400 Gigabit", 10, 30.13118),
)
BUILTIN: dict[str, InstanceFacts] = {f.instance_type: f for f in _BUILTIN}


def known_types() -> list[str]:
    return list(BUILTIN)


def builtin(instance_type: str) -> InstanceFacts | None:
    return BUILTIN.get(instance_type)


def lookup(instance_type: str) -> InstanceFacts:
    """Facts for one type from the built-in table; unknown types are a CatalogError."""
    try:
        return BUILTIN[instance_type]
    except KeyError:
        raise CatalogError(
            f"instance type {instance_type!r} is not in launch's built-in table (known: "
            f"{', '.join(known_types())}) and EC2 was not asked: with AWS credentials and a "
            "region, any type EC2 DescribeInstanceTypes describes can be used"
        ) from None


def _ec2_columns(described: dict[str, Any]) -> dict[str, Any]:
    """The columns one DescribeInstanceTypes entry states; what it leaves out is left out."""
    columns: dict[str, Any] = {}
    gpus = ((described.get("GpuInfo") or {}).get("Gpus") or [None])[0]
    if gpus:
        columns["gpu_model"] = gpus.get("Name", "unknown")
        columns["gpu_count"] = int(gpus.get("Count", 0))
        columns["gpu_memory_mib"] = int((gpus.get("MemoryInfo") or {}).get("SizeInMiB", 0))
    if "DefaultVCpus" in (described.get("VCpuInfo") or {}):
        columns["vcpus"] = int(described["VCpuInfo"]["DefaultVCpus"])
    if "SizeInMiB" in (described.get("MemoryInfo") or {}):
        columns["memory_mib"] = int(described["MemoryInfo"]["SizeInMiB"])
    net = described.get("NetworkInfo")
    if net:
        cards = tuple(
            NetworkCard(int(c.get("NetworkCardIndex", i)), tuple(c.get("InterfaceTypes") or ()),
                        int(c.get("MaximumNetworkInterfaces", 1)))
            for i, c in enumerate(net.get("NetworkCards") or []))
        columns["efa_max_interfaces"] = (
            int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0))
            if net.get("EfaSupported") else 0)
        columns["network_cards"] = int(net.get("MaximumNetworkCards", len(cards) or 1))
        if "NetworkPerformance" in net:
            columns["network_performance"] = net["NetworkPerformance"]
        if cards:
            columns["cards"] = cards
    archs = (described.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    if archs:
        columns["architecture"] = archs[0]
    return columns


def enrich(facts: InstanceFacts, described: dict[str, Any], region: str) -> InstanceFacts:
    """`facts` with the EC2 columns taken from one DescribeInstanceTypes entry.

    EC2 is the authority for what it reports (GPU count and memory, EFA limit, cards); the
    built-in row keeps the rest.
    """
    return replace(facts, **_ec2_columns(described),
                   source=f"built-in + DescribeInstanceTypes {region}")


def from_ec2(described: dict[str, Any], region: str) -> InstanceFacts:
    """Facts for a type launch's table does not list: everything EC2 says, nothing guessed."""
    columns = {"gpu_model": "none", "gpu_count": 0, "gpu_memory_mib": 0, "vcpus": 0,
               "memory_mib": 0, "architecture": "x86_64", "efa_max_interfaces": 0,
               "network_cards": 1, "network_performance": "unknown",
               **_ec2_columns(described)}
    return InstanceFacts(instance_type=described["InstanceType"], interconnect=UNKNOWN,
                         gpu_link=UNKNOWN, gpu_link_gbps=None, price=None,
                         source=f"DescribeInstanceTypes {region}", **columns)


def with_price(facts: InstanceFacts, price: Price | None) -> InstanceFacts:
    return replace(facts, price=price) if price is not None else facts


def differences(a: InstanceFacts, b: InstanceFacts) -> list[str]:
    """Field-by-field differences in the EC2 columns (shown when live facts disagree)."""
    skip = {"source", "cards"}
    return [
        f"{name}: built-in {getattr(a, name)!r}, EC2 {getattr(b, name)!r}"
        for name in a.__dataclass_fields__
        if name not in skip and getattr(a, name) != getattr(b, name)
    ]
