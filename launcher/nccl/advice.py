"""What to change: DDP settings from the wiring, and from the measured share of step time spent
waiting on communication. Shared by `launch topo` and the run report. Pure.

The rule of thumb behind it: gradient compression and larger buckets pay off only where the
links are slow relative to the compute (PCIe between GPUs, sockets or one NIC between nodes);
behind NVSwitch and EFA/InfiniBand the all-reduce hides under the backward pass and
compression only adds work and accuracy risk. Rather than naming a compression by hand, the
advice names `ddp.comm_hook: auto`: the trainer measures its own wait on communication and
keeps PowerSGD only when steps get faster (README, recipes). A measured share beats the rule
of thumb.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def share_advice(comm_share: float | None, comm_hook: str | None) -> list[str]:
    """Advice from the trainer's measured wait; the share decides over the wiring."""
    if comm_share is None:
        return []
    percent = f"{comm_share:.0%}"
    if comm_hook == "auto":  # the trainer chose by measuring already; only the links remain
        return [f"{percent} of each step waits on communication even with comm_hook: auto: "
                "the links are the bottleneck (check the transports above)"] \
            if comm_share >= COMM_SHARE_HIGH else []
    if comm_share >= COMM_SHARE_HIGH:
        if comm_hook in (None, "none"):
            return [compress_advice(f"{percent} of each step waits on communication")]
        if comm_hook != "powersgd":
            return [f"{percent} of each step waits on communication even with {comm_hook} "
                    f"compression: {_AUTO}; or faster links (check the transports above)"]
        return [f"{percent} of each step waits on communication even with PowerSGD: the links "
                "are the bottleneck (check the transports above), or raise the per-GPU batch "
                "so each step computes longer"]
    if comm_hook not in (None, "none"):
        # Measured with compression on, the share says little about plain all-reduce's:
        # auto measures that first and keeps compression only when steps get faster.
        return [f"only {percent} of each step waits on communication with {comm_hook} "
                "compression: ddp.comm_hook: auto would measure plain all-reduce first and "
                f"keep compression (and its accuracy risk) only if it makes steps faster"]
    return []


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
