"""What to change: DDP settings from the wiring, and from a run's measured step split. Shared by
`launch topo` and the run report. Pure.

The rule of thumb behind the wiring advice: gradient compression and larger buckets pay off
only where the links are slow relative to the compute (PCIe between GPUs, sockets or one NIC
between nodes); behind NVSwitch and EFA/InfiniBand the all-reduce hides under the backward
pass and compression only adds work and accuracy risk. Rather than naming a compression by
hand, it names `ddp.comm_hook: auto`: the trainer measures its own wait on communication and
keeps PowerSGD only when a trial shows steps faster and its loss on the trajectory of plain
all-reduce (train/autocomm.py).

A run's report advises a change only where launch's benchmark (benchmarks/comm_advice.py)
measured that it helps on that kind of link: MEASURED holds what it measured, and a test holds
MEASURED to benchmarks/results/comm_advice.json. On one machine, where the nodes talk over
loopback, and where compute dominates, the advice says so instead, with the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.nccl.links import facts, interconnect_class
from launcher.nccl.topology import Topology
from train.options import AUTO_MIN_COMM_SHARE

# One rule with the trainer's comm_hook auto (train/options.py): from this share of the step
# spent waiting on communication, compression may pay and auto tries it; below it,
# communication hides under the backward pass and there is nothing to gain.
COMM_SHARE_HIGH = AUTO_MIN_COMM_SHARE

SLOW_GPU_LINKS = ("pcie", "partial-nvlink")
_CLASS_ORDER = ("pcie", "partial-nvlink", "nvswitch", "single-gpu")  # slowest first
_AUTO = ("set ddp.comm_hook: auto and ddp.bucket_cap_mb: auto: the trainer times its "
         "all-reduces, sizes the buckets to them, and switches to PowerSGD only if that makes "
         "steps faster")


def slowest_class(classes: list[str]) -> str | None:
    """The interconnect class that bounds a job spanning nodes of these classes."""
    return min(classes, key=_CLASS_ORDER.index) if classes else None


def compress_advice(why: str) -> str:
    return f"{why}: {_AUTO}"


def wiring_advice(link_class: str | None, nnodes: int, fast_network: bool | None) -> list[str]:
    """Advice from the interconnect class of the nodes and whether the network between them is
    EFA/InfiniBand (None: not known)."""
    if link_class in SLOW_GPU_LINKS:
        pairs = "PCIe" if link_class == "pcie" else "PCIe for some pairs"
        return [compress_advice(f"GPUs talk over {pairs} (no NVSwitch)")]
    if nnodes > 1 and fast_network is False:
        return [compress_advice("nodes talk over TCP sockets (no EFA or InfiniBand)")]
    if link_class == "nvswitch" and (nnodes == 1 or fast_network):
        between = " and EFA/InfiniBand between nodes" if nnodes > 1 else ""
        return [f"NVSwitch between all GPUs{between}: no compression needed "
                "(ddp.comm_hook: none, the default 25 MB buckets)"]
    return []


# What the advice asks for when communication holds a run back on a link where it helps.
ADVISED_DDP = {"comm_hook": "auto", "bucket_cap_mb": "auto"}
ADVISED = " and ".join(f"ddp.{key}: {value}" for key, value in ADVISED_DDP.items())
BENCHMARK = "benchmarks/results/comm_advice.json"

ONE_MACHINE = "one machine"      # several nodes on one host: they talk over loopback
TCP = "tcp"                      # hosts over TCP sockets (gloo, or NCCL's NET/Socket)
FAST = "fast"                    # EFA or InfiniBand between hosts
ONE_NODE = "one node"            # a single node: its GPUs' own links
LINK_WORDS = {ONE_MACHINE: "loopback between nodes on one machine",
              TCP: "TCP between hosts", FAST: "EFA/InfiniBand between hosts",
              ONE_NODE: "the links inside one node"}


@dataclass(frozen=True)
class Measured:
    """benchmarks/comm_advice.py on one kind of link: the demo recipe with ADVISED_DDP
    against without it, in pairs run back to back."""

    link: str                    # how the benchmark made the link
    pairs: int
    speed: float                 # wall time of a run without the advice / with it (medians)
    worst_accuracy_points: float  # the lowest accuracy difference of a pair, in points

    @property
    def helps(self) -> bool:
        """Faster by more than the noise of a shared machine, accuracy within a point."""
        return self.speed >= 1.1 and self.worst_accuracy_points >= -1.0


MEASURED = {
    ONE_MACHINE: Measured("--local, 2 nodes, gloo over loopback", 5, 0.947, 0.0),
    TCP: Measured("2 lab hosts, TCP capped at 500mbit each way", 3, 2.415, -0.56),
}


def link_kind(addresses: list[str], transports: list[str], backend: str | None) -> str | None:
    """The kind of link a run's gradients crossed: `addresses` of its nodes, the transports
    NCCL logged (empty for gloo)."""
    if len(addresses) == 1:
        return ONE_NODE
    if len(set(addresses)) == 1:
        return ONE_MACHINE
    if any("Libfabric" in t or t.startswith("NET/IB") for t in transports):
        return FAST
    if backend == "gloo" or any(t.startswith("NET/Socket") for t in transports):
        return TCP
    return None


def _waits(split: dict) -> str:
    return (f"{split['comm_share']:.0%} of each step ({split['comm_wait_s']:.4f} s of "
            f"{split['step_s']:.4f} s, {split['statistic']} of {split['steps']} steps) waits on "
            "communication")


def training_advice(split: dict | None, comm_hook: str | None, auto: dict | None,
                    kind: str | None, transports_shown: bool) -> list[str]:
    """Advice from a run's measured step split: a change only where the benchmark measured
    that it helps on this kind of link; else what holds the run, and why nothing is advised."""
    if not split:
        return []
    if comm_hook == "auto":
        return _auto_advice(auto, split, kind)
    if comm_hook not in (None, "none"):
        return []   # a compression chosen by hand: no measurement of switching to say more
    if split["comm_share"] < COMM_SHARE_HIGH:
        return [f"nothing to change: compute dominates: {_waits(split)}; below "
                f"{COMM_SHARE_HIGH:.0%} compression has nothing to gain"]
    measured = MEASURED.get(kind)
    where = LINK_WORDS.get(kind, "links of an unknown kind")
    if measured is not None and not measured.helps:
        why = f", but over {where}, not a cluster's links" if kind == ONE_MACHINE else \
            f" over {where}"
        return [f"nothing to change: {_waits(split)}{why}; "
                f"{_measured_words(measured, ADVISED)}"]
    if measured is not None:
        return [f"{_waits(split)} over {where}: set {ADVISED}; "
                f"{_measured_words(measured, 'them')}; the trainer keeps PowerSGD only if a "
                "trial on this run's links shows it faster without its loss straying from "
                "plain all-reduce's"]
    look = "; check the transports above" if transports_shown and kind == FAST else ""
    return [f"no compression advised: {_waits(split)} over {where}, where launch's benchmark "
            f"has measured none (it measured {' and '.join(LINK_WORDS[k] for k in MEASURED)})"
            f"{look}"]


def _measured_words(measured: Measured, named: str) -> str:
    return (f"launch's benchmark measured the demo with {named} at {measured.speed:.2f}x "
            f"the speed of the demo without them on {measured.link} (wall time, auto's "
            f"trial included), worst accuracy {measured.worst_accuracy_points:+.2f} points "
            f"({measured.pairs} pairs, {BENCHMARK})")


def _auto_advice(auto: dict | None, split: dict, kind: str | None) -> list[str]:
    if not auto:
        return []
    waits = f"{_waits(split)}" + (f" over {LINK_WORDS[kind]}" if kind in LINK_WORDS else "")
    if auto.get("decided_at_step") is None:
        return [f"{waits}; comm_hook auto had no time to decide ({auto['reason']}): give the "
                "run more steps"]
    kept = "chose PowerSGD" if auto["choice"] == "powersgd" else "kept plain all-reduce"
    return [f"nothing to change: {waits}; comm_hook auto {kept} after step "
            f"{auto['decided_at_step']}: {auto['reason']}"]


def topology_differences(topologies: Mapping[str, Topology],
                         instance_types: Mapping[str, str | None]) -> list[str]:
    """Nodes that disagree with each other or with the catalog row of their instance type."""
    out = []
    shapes = {name: (t.link_class, t.gpus, t.nics, t.worst_link)
              for name, t in topologies.items()}
    if len(set(shapes.values())) > 1:
        out.append("nodes differ: " + "; ".join(
            f"{name} {cls}, {gpus} GPU(s), {nics} NIC(s), worst link {worst or 'n/a'}"
            for name, (cls, gpus, nics, worst) in shapes.items()))
    for name, topo in topologies.items():
        itype = instance_types.get(name)
        expected = interconnect_class(itype)
        if expected is None:
            continue
        row = facts(itype)
        if row is not None and row.gpu_count != topo.gpus:
            out.append(f"{name}: {itype} has {row.gpu_count} GPUs but nvidia-smi shows "
                       f"{topo.gpus}: a GPU is missing or hidden (check nvidia-smi, dmesg)")
        if topo.gpus > 1 and topo.link_class != expected:
            out.append(f"{name}: {itype} should be {expected} but nvidia-smi shows "
                       f"{topo.link_class} (worst link {topo.worst_link}): check the driver "
                       "and fabric manager (nvidia-fabricmanager on NVSwitch machines)")
    return out
