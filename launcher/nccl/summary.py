"""Short human summaries of parsed logs, one fact a line, warnings last."""

from __future__ import annotations

from collections import Counter

from launcher.nccl.debug_log import NcclDebugLog
from launcher.nccl.detect import Parsed
from launcher.nccl.nccl_tests import NcclTestsRun
from launcher.nccl.topology import Topology


def summary_lines(parsed: Parsed) -> list[str]:
    """The summary of one parsed file, first line naming it and its kind."""
    if isinstance(parsed, NcclTestsRun):
        return _nccl_tests(parsed)
    if isinstance(parsed, NcclDebugLog):
        return _debug_log(parsed)
    return _topology(parsed)


def human_bytes(size: int) -> str:
    """1073741824 -> "1 GiB"; sizes that are not a whole unit keep their bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _gb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GB/s"


def _hosts(ranks: int | None, hosts: list[str] | tuple[str, ...]) -> str:
    ranks_text = "unknown" if ranks is None else str(ranks)
    if not hosts:
        return f"  ranks: {ranks_text}; hosts: not named in the lines"
    return f"  ranks: {ranks_text} on {len(hosts)} host(s): {', '.join(hosts)}"


# At most this many failure lines in a summary: nccl-tests prints one per stack frame.
_FAILURE_LINES = 8


def _nccl_tests(run: NcclTestsRun) -> list[str]:
    gpus = Counter(run.gpus)
    collective = run.collective or f"output (collective unknown: {run.collective_reason})"
    lines = [
        f"{run.path}: nccl-tests {collective}",
        _hosts(run.ranks, run.hosts),
        "  gpus: " + (", ".join(f"{n}x {name}" for name, n in gpus.items()) or "n/a"),
        f"  NCCL: {run.nccl_version or 'version not printed'}",
    ]
    if run.rows:
        peak_row = max(run.rows, key=lambda r: max(
            (m.busbw for m in r.measurements if m.busbw is not None), default=-1.0))
        lines += [
            f"  busbw: peak {_gb(run.peak_busbw)} at {human_bytes(peak_row.size)}, "
            f"average {_gb(run.avg_busbw)} (nccl-tests' mean over all {len(run.rows)} sizes)",
            f"  wrong: {'not checked' if run.wrong_total is None else run.wrong_total}",
        ]
    if run.failed:
        lines.append(f"  FAILED: {run.failure_reason}")
        shown = [line for line in run.failure_lines if line != run.failure_reason]
        lines += [f"    {line}" for line in shown[:_FAILURE_LINES]]
        if len(shown) > _FAILURE_LINES:
            lines.append(f"    ... {len(shown) - _FAILURE_LINES} more")
    if run.wrong_total:
        lines.append(f"  warning: {run.wrong_total} wrong results: the collective returned "
                     f"corrupt data; do not trust these timings")
    if run.debug is not None:
        lines.append("  NCCL_DEBUG lines in the output:")
        lines += ["  " + line for line in _debug_log(run.debug)[1:]]
    return lines


def _debug_log(log: NcclDebugLog) -> list[str]:
    efa = (f"provider {log.efa.provider}, {log.efa.nics} NIC(s)" if log.efa
           else "no libfabric provider selected")
    transports = ", ".join(f"{name} {count}" for name, count in log.transports.items())
    lines = [
        f"{', '.join(log.paths)}: NCCL_DEBUG log",
        f"  NCCL: {log.nccl_version or 'version not logged'}",
        _hosts(log.ranks, log.hosts),
        f"  network: {log.network or 'not logged'}",
        f"  EFA: {efa}",
        f"  channels: {log.channels if log.channels is not None else 'n/a'}",
        f"  transports (connections): {transports or 'none logged'}",
    ]
    if log.lines_without_host:
        lines.append(f"  {log.lines_without_host} line(s) without their HOST:PID:TID prefix: "
                     "hosts are not known from them")
    lines += [f"  NCCL WARN: {warning}" for warning in log.warnings]
    if len(log.nccl_versions) > 1:
        lines.append(f"  warning: ranks run different NCCL versions ({log.nccl_version})")
    if len(log.networks) > 1:
        lines.append(f"  warning: ranks chose different networks ({log.network})")
    if log.uses_socket:
        lines.append("  warning: NCCL used TCP sockets (NET/Socket) between nodes: EFA or "
                     "InfiniBand was not used; check the OFI/IB plugin and NCCL_SOCKET_IFNAME")
    return lines


def _topology(topo: Topology) -> list[str]:
    nics = f" ({', '.join(topo.nic_names)})" if topo.nic_names else ""
    return [
        f"{topo.path}: nvidia-smi topo -m",
        f"  class: {topo.link_class}",
        f"  worst GPU link: {topo.worst_link or 'n/a (one GPU)'}",
        f"  GPUs: {topo.gpus}, NICs: {topo.nics}{nics}",
    ] + [f"  repaired: {warning}" for warning in topo.warnings]
