"""A node's probe answer (launcher/check/ask_node.py) judged: one Check per column of the table,
each `ok | warn | fail | skipped` with the evidence line a person needs to act.

Pure: facts in, checks out. What each node is expected to have comes from the inventory (gpus,
launch_interface, instance_type) and the catalog row of its instance type (GPUs, EFA devices,
NVSwitch); what is unknown is not held against a node.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from launcher.check.fabric import parse_fi_info, parse_nvlink_status
from launcher.check.nvsmi import SmiParseError, SmiReport, parse_xml
from launcher.check.xid import parse_kernel_log, summarize
from launcher.cluster.catalog import NVSWITCH, PARTIAL_NVLINK
from launcher.cluster.inventory import Node
from launcher.nccl.links import facts as catalog_facts

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skipped"
# The table's columns, in order. `reach`: launch got the node's answer at all.
COLUMNS = ("reach", "gpus", "ecc", "remap", "reset", "throttle", "persist", "xid", "nvlink",
           "fabric", "efa", "memlock", "iface", "clock", "versions", "disk")
GPU_COLUMNS = ("ecc", "remap", "reset", "throttle", "persist", "xid", "nvlink", "fabric")
# Above this the nodes' logs no longer line up and timeouts computed from wall clocks drift;
# minutes off breaks anything that signs requests with the time (S3, Kerberos).
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 300.0
GIB = 1 << 30


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Expectation:
    """What a node should have, from the inventory and the catalog (None: not known)."""

    gpus: int | None
    efa: int | None
    nvswitch: bool | None
    nvlink: bool | None
    instance_type: str | None
    private_address: str
    interface: str | None
    min_free_bytes: int


def expectation(node: Node, min_free_bytes: int) -> Expectation:
    row = catalog_facts(node.instance_type)
    gpus = node.gpus if node.gpus is not None else (row.gpu_count if row else None)
    return Expectation(
        gpus=gpus, efa=row.efa_max_interfaces if row else None,
        nvswitch=(row.interconnect == NVSWITCH) if row else None,
        nvlink=(row.interconnect in (NVSWITCH, PARTIAL_NVLINK)) if row else None,
        instance_type=node.instance_type, private_address=node.private_address,
        interface=node.interface, min_free_bytes=min_free_bytes)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0] if lines else "no output"


def _gpu_label(bus_id: str | None) -> str:
    return f"GPU {bus_id}" if bus_id else "a GPU"


def _human_bytes(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


# ------------------------------------------------------------------------------ GPUs


def smi_report(probe: dict) -> tuple[SmiReport | None, str | None]:
    """nvidia-smi -q -x parsed, or why there is none ('not installed', its error)."""
    smi = probe.get("nvidia_smi") or {}
    if smi.get("rc") == 127:
        return None, "nvidia-smi is not installed (no NVIDIA driver)"
    if smi.get("rc") != 0:
        return None, (f"nvidia-smi -q -x failed (exit {smi.get('rc')}): "
                      f"{_first_line(smi.get('stderr') or smi.get('stdout'))}")
    try:
        return parse_xml(smi.get("stdout", ""), "nvidia-smi -q -x"), None
    except SmiParseError as err:
        return None, str(err)


def check_gpus(report: SmiReport | None, why: str | None, expect: Expectation) -> Check:
    where = (f"inventory/catalog ({expect.instance_type})" if expect.instance_type
             else "inventory")
    if report is None:
        if not expect.gpus:
            return Check("gpus", SKIP, f"no GPU: {why}")
        return Check("gpus", FAIL, f"{where} says {expect.gpus} GPU(s) but {why}: check the "
                                   "driver (`launch setup`, `nvidia-smi`)")
    found = len(report.gpus)
    names = Counter(g.name or "unknown" for g in report.gpus)
    listed = ", ".join(f"{n}x {name}" for name, n in names.items()) or "none listed"
    if report.attached_gpus is not None and report.attached_gpus != found:
        listed += f" (the driver counts {report.attached_gpus})"
    if expect.gpus is None:
        return Check("gpus", OK, f"{found} GPU(s): {listed} (nothing to compare with: set gpus "
                                 "or instance_type in the inventory)")
    if found < expect.gpus:
        return Check("gpus", FAIL, f"{found} of the {expect.gpus} GPU(s) the {where} expects: "
                                   f"{listed}; a GPU that fell off the bus or a driver that "
                                   "did not load (see the xid column)")
    if found > expect.gpus:
        return Check("gpus", WARN, f"{found} GPU(s), the {where} expects {expect.gpus}: {listed}")
    return Check("gpus", OK, f"{found} GPU(s) as expected: {listed}")


def check_ecc(report: SmiReport) -> Check:
    bad = [g for g in report.gpus if (g.volatile_uncorrectable or 0) > 0]
    if bad:
        return Check("ecc", FAIL, "; ".join(
            f"{_gpu_label(g.bus_id)}: {g.volatile_uncorrectable} uncorrectable ECC error(s) "
            "since the driver loaded" for g in bad) + ": drain the node, reset the GPU")
    off = [g for g in report.gpus if g.ecc_enabled is False]
    notes = []
    corrected = sum(g.volatile_correctable or 0 for g in report.gpus)
    if corrected:
        notes.append(f"{corrected} corrected error(s) since the driver loaded")
    lifetime = sum(g.aggregate_uncorrectable or 0 for g in report.gpus)
    if lifetime:
        notes.append(f"{lifetime} uncorrectable in the GPUs' lifetime (history)")
    if off:
        return Check("ecc", WARN, f"ECC is off on {len(off)} GPU(s) "
                                  f"({', '.join(g.bus_id or '?' for g in off)}): memory errors go "
                                  "undetected")
    if all(g.volatile_uncorrectable is None for g in report.gpus):
        return Check("ecc", OK, "no ECC counters reported (a GPU without ECC)")
    return Check("ecc", OK, "no uncorrectable ECC error since the driver loaded"
                 + (f"; {', '.join(notes)}" if notes else ""))


def check_remap(report: SmiReport) -> Check:
    failed = [g for g in report.gpus if g.remap_failure]
    if failed:
        return Check("remap", FAIL, "; ".join(f"{_gpu_label(g.bus_id)}: row remapping failed"
                                              for g in failed)
                     + ": the GPU has run out of spare rows; it needs replacing")
    pending = [g for g in report.gpus if g.remap_pending or g.retired_pending]
    if pending:
        parts = []
        for g in pending:
            what = []
            if g.remap_pending:
                what.append(f"row remap pending ({g.remap_uncorrectable or 0} uncorrectable, "
                            f"{g.remap_correctable or 0} correctable rows)")
            if g.retired_pending:
                what.append("page retirement pending")
            parts.append(f"{_gpu_label(g.bus_id)}: {', '.join(what)}")
        return Check("remap", FAIL, "; ".join(parts) + ": reset the GPU (or reboot) to apply it")
    reported = [g for g in report.gpus if g.remap_pending is not None
                or g.retired_pending is not None]
    if not reported:
        return Check("remap", OK, "remapped rows / retired pages not reported (MIG, or a GPU "
                                  "without them)")
    rows = sum((g.remap_uncorrectable or 0) + (g.remap_correctable or 0) for g in reported)
    return Check("remap", OK, "nothing pending" + (f"; {rows} row(s) remapped before" if rows
                                                   else ""))


def check_reset(report: SmiReport) -> Check:
    asked = []
    for g in report.gpus:
        if g.reset_required:
            asked.append(f"{_gpu_label(g.bus_id)}: reset required")
        if g.drain_and_reset:
            asked.append(f"{_gpu_label(g.bus_id)}: drain and reset recommended")
        if g.recovery_action and g.recovery_action.lower() != "none":
            asked.append(f"{_gpu_label(g.bus_id)}: recovery action {g.recovery_action}")
    if asked:
        return Check("reset", FAIL, "; ".join(asked) + ": the GPU is unusable until then "
                                                     "(DCGM's health check may still say "
                                                     "Healthy, DCGM #263)")
    return Check("reset", OK, "no reset or recovery action pending")


def check_throttle(report: SmiReport) -> Check:
    hardware = {g.bus_id: [r for r in g.throttle_active if r.startswith("hw_")]
                for g in report.gpus}
    software = {g.bus_id: [r for r in g.throttle_active if r.startswith("sw_")]
                for g in report.gpus}
    if any(hardware.values()):
        return Check("throttle", FAIL, "; ".join(
            f"{_gpu_label(b)}: {', '.join(r)}" for b, r in hardware.items() if r)
            + " active at idle: power or cooling problem (check `nvidia-smi -q -d PERFORMANCE`)")
    if any(software.values()):
        return Check("throttle", WARN, "; ".join(
            f"{_gpu_label(b)}: {', '.join(r)}" for b, r in software.items() if r)
            + " active: clocks held down by a power cap or temperature")
    return Check("throttle", OK, "no slowdown or power cap active")


def check_persist(report: SmiReport) -> Check:
    off = [g.bus_id or "?" for g in report.gpus if g.persistence is False]
    if off:
        return Check("persist", WARN, f"persistence mode off on {len(off)} GPU(s): every process "
                                      "pays the driver's initialisation; `launch setup` enables "
                                      "nvidia-persistenced")
    return Check("persist", OK, "persistence mode on" if report.gpus else "no GPU listed")


def check_xid(probe: dict) -> Check:
    log = probe.get("kernel_log")
    if log is None:
        return Check("xid", SKIP, "no NVIDIA driver")
    if log.get("source") is None:
        return Check("xid", WARN, f"kernel log not readable ({log.get('error')}): Xids not "
                                  "checked (run as root, or allow dmesg: kernel.dmesg_restrict)")
    events = parse_kernel_log("\n".join(log.get("lines") or []))
    fatal = [e for e in events if e.fatal]
    if fatal:
        return Check("xid", FAIL, f"{summarize(events)} in `{log['source']}` since boot: "
                                  f"last: {fatal[-1].line}")
    if events:
        return Check("xid", WARN, f"{summarize(events)} in `{log['source']}` since boot "
                                  "(none of the fatal ones)")
    return Check("xid", OK, f"no Xid since boot (`{log['source']}`)")


def check_nvlink(probe: dict, expect: Expectation) -> Check:
    answer = probe.get("nvlink") or {}
    gpus = parse_nvlink_status(answer.get("stdout", "")) if answer.get("rc") == 0 else []
    with_links = [g for g in gpus if g.links]
    if not with_links:
        if expect.nvlink:
            return Check("nvlink", FAIL, f"{expect.instance_type} has NVLink but `nvidia-smi "
                                         f"nvlink -s` lists no link "
                                         f"({_first_line(answer.get('stderr', '')) or 'empty'})")
        return Check("nvlink", SKIP, "no NVLink (PCIe only)")
    down = [(g, g.inactive) for g in with_links if g.inactive]
    links = sum(len(g.links) for g in with_links)
    if down:
        status = FAIL if expect.nvlink is not False else WARN
        return Check("nvlink", status, "; ".join(
            f"GPU {g.index}: link(s) {', '.join(map(str, idx))} inactive" for g, idx in down)
            + f" ({sum(len(i) for _, i in down)} of {links} links down): traffic detours or "
              "NCCL falls back; reboot, else the board needs service")
    speeds = sorted({v for g in with_links for v in g.links.values() if v is not None})
    return Check("nvlink", OK, f"all {links} links of {len(with_links)} GPU(s) up "
                               f"({'/'.join(f'{s:g}' for s in speeds)} GB/s each)")


def check_fabric(probe: dict, report: SmiReport, expect: Expectation) -> Check:
    states = {g.bus_id: (g.fabric_state, g.fabric_status) for g in report.gpus
              if g.fabric_state is not None}
    nvswitch = bool(expect.nvswitch) or probe.get("nvswitches", 0) > 0 or bool(states)
    if not nvswitch:
        return Check("fabric", SKIP, "not an NVSwitch system")
    manager = probe.get("fabricmanager") or {}
    active = (manager.get("stdout") or "").strip()
    problems = []
    if manager.get("rc") == 127:
        problems.append("systemctl not available to ask about nvidia-fabricmanager")
    elif active != "active":
        problems.append(f"nvidia-fabricmanager is {active or 'unknown'}")
    for bus, (state, status) in states.items():
        if state != "Completed" or (status and status != "Success"):
            problems.append(f"{_gpu_label(bus)}: fabric {state}/{status}")
    if problems:
        return Check("fabric", FAIL, "; ".join(problems) + ": CUDA fails with 'system not yet "
                                                           "initialized' (error 802) until the "
                                                           "fabric manager has set up the "
                                                           "NVSwitches")
    detail = f", fabric state Completed on {len(states)} GPU(s)" if states else ""
    return Check("fabric", OK, f"nvidia-fabricmanager active{detail}")


# ------------------------------------------------------------------------------ network


def efa_devices(probe: dict) -> list[str]:
    """EFA devices as libfabric lists them, else as the kernel has them bound."""
    answer = probe.get("fi_info") or {}
    info = parse_fi_info((answer.get("stdout") or "") + "\n" + (answer.get("stderr") or ""))
    return info.devices or list(probe.get("efa_sysfs") or [])


def check_efa(probe: dict, expect: Expectation) -> Check:
    answer = probe.get("fi_info") or {}
    info = parse_fi_info((answer.get("stdout") or "") + "\n" + (answer.get("stderr") or ""))
    sysfs = probe.get("efa_sysfs") or []
    found = max(len(info.devices), len(sysfs))
    names = ", ".join(info.devices or sysfs)
    if not expect.efa:
        if found:
            return Check("efa", OK, f"{found} EFA device(s): {names}")
        why = ("has none" if expect.efa == 0 else "is not known (set instance_type)")
        return Check("efa", SKIP, f"no EFA device; the instance type {why}")
    if answer.get("rc") == 127 and not sysfs:
        return Check("efa", FAIL, f"{expect.instance_type} has {expect.efa} EFA device(s) but "
                                  "fi_info is not installed: run `launch setup` (role efa)")
    if found < expect.efa:
        seen = names or info.error or _first_line(answer.get("stderr", ""))
        return Check("efa", FAIL, f"{found} of the {expect.efa} EFA device(s) of "
                                  f"{expect.instance_type} ({seen}): NCCL will run on fewer "
                                  "NICs or over sockets")
    return Check("efa", OK, f"{found} EFA device(s) as {expect.instance_type} has: {names}")


def check_memlock(probe: dict, expect: Expectation, efa_found: bool) -> Check:
    limit = probe.get("memlock") or {}
    if "soft" not in limit:
        return Check("memlock", WARN, "not reported")
    if limit["soft"] is None:
        return Check("memlock", OK, "ulimit -l unlimited")
    shown = f"ulimit -l {limit['soft'] // 1024} KiB"
    if limit.get("hard") is None:
        shown += " (hard: unlimited)"
    if expect.efa or efa_found:
        return Check("memlock", FAIL, f"{shown}: EFA/libfabric registers (pins) memory and needs "
                                      "it unlimited (/etc/security/limits.d: memlock unlimited)")
    return Check("memlock", WARN, f"{shown}: fine for sockets, but RDMA (EFA, InfiniBand) needs "
                                  "unlimited")


def check_iface(probe: dict, expect: Expectation) -> Check:
    net = probe.get("net") or {}
    addresses = net.get("addresses") or {}
    name = addresses.get(expect.private_address)
    if name is None:
        held = ", ".join(sorted(addresses)) or net.get("error") or "none"
        return Check("iface", FAIL, f"private_ip {expect.private_address} is not an address of "
                                    f"this host (it has {held}): ranks could not bind to it; "
                                    "fix private_ip")
    info = (net.get("interfaces") or {}).get(name) or {}
    detail = f"{name} holds {expect.private_address}"
    facts = [f"state {info.get('operstate')}"]
    if info.get("mtu"):
        facts.append(f"mtu {info['mtu']}")
    if info.get("speed") and not str(info["speed"]).startswith("-"):
        facts.append(f"{info['speed']} Mb/s")
    detail += f" ({', '.join(facts)})"
    if expect.interface and expect.interface != name:
        return Check("iface", FAIL, f"{detail}, but the inventory's launch_interface is "
                                    f"{expect.interface}: GLOO/NCCL_SOCKET_IFNAME would name the "
                                    "wrong interface")
    if info.get("operstate") == "down":
        return Check("iface", FAIL, f"{detail}: the link is down")
    return Check("iface", OK, detail + ": launch uses it for GLOO/NCCL_SOCKET_IFNAME")


def check_disk(probe: dict, expect: Expectation) -> Check:
    disk = probe.get("disk") or {}
    if "free_bytes" not in disk:
        return Check("disk", WARN, f"free space under {disk.get('path')} unknown: "
                                   f"{disk.get('error', 'not reported')}")
    free = disk["free_bytes"]
    where = f"{_human_bytes(free)} free at {disk.get('measured_at')} (run folders, checkpoints)"
    if free < expect.min_free_bytes:
        return Check("disk", FAIL, f"{where}, under the {_human_bytes(expect.min_free_bytes)} "
                                   "asked (--min-free-gb)")
    if free < 2 * expect.min_free_bytes:
        return Check("disk", WARN, f"{where}, under twice the {_human_bytes(expect.min_free_bytes)}"
                                   " asked")
    return Check("disk", OK, where)


# ------------------------------------------------------------------------------ across nodes


def check_versions(probes: dict[str, dict]) -> dict[str, Check]:
    """torch and NCCL must agree across nodes (collectives of different NCCL builds hang or
    fail); driver and CUDA differences are warned about."""
    fields = {}
    for name, probe in probes.items():
        torch = probe.get("torch") or {}
        report, _ = smi_report(probe)
        fields[name] = {"torch": torch.get("torch"), "nccl": torch.get("nccl"),
                        "driver": report.driver_version if report else None,
                        "cuda": report.cuda_version if report else None,
                        "python": probe.get("python_version")}
    common = {key: Counter(f[key] for f in fields.values() if f[key]).most_common(1)
              for key in ("torch", "nccl", "driver", "cuda", "python")}
    out = {}
    for name, probe in probes.items():
        mine = fields[name]
        torch = probe.get("torch") or {}
        shown = ", ".join(f"{k} {v}" for k, v in mine.items() if v)
        if "error" in torch:
            out[name] = Check("versions", FAIL, f"{probe.get('python')} cannot import torch "
                                                f"({torch['error']}): run `launch setup` or set "
                                                "launch_python")
            continue
        differs = {k: (mine[k], common[k][0][0]) for k in mine
                   if mine[k] and common[k] and mine[k] != common[k][0][0]}
        if any(k in differs for k in ("torch", "nccl", "python")):
            out[name] = Check("versions", FAIL, "; ".join(
                f"{k} {mine} where the other nodes have {theirs}"
                for k, (mine, theirs) in differs.items()) + ": install one version everywhere")
        elif differs:
            out[name] = Check("versions", WARN, "; ".join(
                f"{k} {mine} where the other nodes have {theirs}"
                for k, (mine, theirs) in differs.items()))
        else:
            out[name] = Check("versions", OK, shown + (" (same on every node)"
                                                       if len(probes) > 1 else ""))
    return out


def check_clocks(offsets: dict[str, float]) -> dict[str, Check]:
    """offsets: node clock minus this machine's when the answer arrived (s). Each node is held
    against the median node, so that this machine's own clock does not count."""
    if not offsets:
        return {}
    # A real node's clock (the lower middle one), not the mean of two.
    reference = statistics.median_low(offsets.values()) if len(offsets) > 1 else 0.0
    against = "the nodes' median" if len(offsets) > 1 else "this machine"
    out = {}
    for name, offset in offsets.items():
        delta = offset - reference
        text = (f"{delta:+.2f} s from {against} (to within the time an answer takes to "
                "arrive)")
        if abs(delta) >= CLOCK_FAIL_S:
            out[name] = Check("clock", FAIL, f"{text}: fix time sync (chrony/NTP) on the node")
        elif abs(delta) >= CLOCK_WARN_S:
            out[name] = Check("clock", WARN, f"{text}: logs of different nodes will not line "
                                             "up; check chrony/NTP")
        else:
            out[name] = Check("clock", OK, text)
    return out


# ------------------------------------------------------------------------------ one node


def node_checks(probe: dict, expect: Expectation) -> dict[str, Check]:
    """Every per-node column (versions and clock come from check_versions/check_clocks)."""
    checks: dict[str, Check] = {"reach": Check("reach", OK, f"answered in "
                                                            f"{probe.get('probe_s', 0):.1f} s as "
                                                            f"{probe.get('hostname')}")}
    report, why = smi_report(probe)
    checks["gpus"] = check_gpus(report, why, expect)
    if report is None:
        reason = "no GPU" if checks["gpus"].status == SKIP else "no GPU report"
        for name in GPU_COLUMNS:
            checks[name] = Check(name, SKIP, reason)
        # The kernel log still tells why a GPU node has no report (Xid 79).
        if probe.get("kernel_log") is not None:
            checks["xid"] = check_xid(probe)
    else:
        checks["ecc"] = check_ecc(report)
        checks["remap"] = check_remap(report)
        checks["reset"] = check_reset(report)
        checks["throttle"] = check_throttle(report)
        checks["persist"] = check_persist(report)
        checks["xid"] = check_xid(probe)
        checks["nvlink"] = check_nvlink(probe, expect)
        checks["fabric"] = check_fabric(probe, report, expect)
    checks["efa"] = check_efa(probe, expect)
    checks["memlock"] = check_memlock(probe, expect, bool(efa_devices(probe)))
    checks["iface"] = check_iface(probe, expect)
    checks["disk"] = check_disk(probe, expect)
    return checks


def unreachable(why: str) -> dict[str, Check]:
    checks = {name: Check(name, SKIP, "no answer from the node") for name in COLUMNS}
    checks["reach"] = Check("reach", FAIL, why)
    return checks
