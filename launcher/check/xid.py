"""Xid events in a kernel log (dmesg, journalctl -k, syslog), and which of them take a node out.

The driver logs `NVRM: Xid (PCI:0000:cb:00): 13, pid=..., name=..., <message>`; the prefix in
front of it varies (dmesg's `[ 1843.308145]` or `[Fri Aug 30 11:43:09 2024]`, journald's
`kernel: `, syslog's date and host) and is not needed. Newer drivers report a GPU that fell off
the bus over several lines without any Xid (`NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off
the bus`); that is read as the Xid 79 it means (NVSentinel #155, gpud #1209).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

# Xids after which the GPU (or the node) cannot be trusted with a job until someone acts: the
# list of issue 16, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors).
FATAL_XIDS = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# Others seen often, named in the evidence; they are usually a program's fault (13, 31, 43, 45)
# or a symptom of another event, so they warn.
OTHER_XIDS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    109: "context switch timeout",
    154: "GPU recovery action changed",
}

_XID = re.compile(r"(?:NVRM: )?Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_PROCESS = re.compile(r"name=(?P<name>[^,\s]+)")
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<code>\d+)")
_FALLEN_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9A-Fa-f:.]+)")


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str
    message: str
    line: str
    process: str | None = None
    caused_by: int | None = None       # "caused by previous Xid 149"
    from_text: bool = False            # no Xid number in the log: read from the message

    @property
    def fatal(self) -> bool:
        return self.code in FATAL_XIDS

    @property
    def meaning(self) -> str:
        return FATAL_XIDS.get(self.code) or OTHER_XIDS.get(self.code) or "see NVIDIA's Xid catalog"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fatal": self.fatal, "meaning": self.meaning}


def parse_kernel_log(text: str) -> list[XidEvent]:
    events: list[XidEvent] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _XID.search(line)
        if match:
            rest = match["rest"].strip()
            process = _PROCESS.search(rest)
            caused = _CAUSED_BY.search(rest)
            events.append(XidEvent(
                code=int(match["code"]), pci=match["pci"], message=rest, line=line.strip(),
                process=process["name"] if process else None,
                caused_by=int(caused["code"]) if caused else None))
            continue
        fallen = _FALLEN_GPU.search(line)
        if fallen:
            # The message goes on over the next lines: "... installed in this system has" /
            # "NVRM: fallen off the bus and is not responding to commands."
            window = " ".join(lines[i:i + 3])
            if "fallen off the bus" in window:
                events.append(XidEvent(code=79, pci=fallen["pci"],
                                       message="GPU has fallen off the bus", line=line.strip(),
                                       from_text=True))
    return events


def summarize(events: list[XidEvent]) -> str:
    """One line: each Xid with its count, GPUs and meaning, fatal ones first."""
    by_code: dict[int, list[XidEvent]] = {}
    for event in events:
        by_code.setdefault(event.code, []).append(event)
    parts = []
    for code in sorted(by_code, key=lambda c: (c not in FATAL_XIDS, c)):
        group = by_code[code]
        pcis = sorted({e.pci for e in group})
        parts.append(f"Xid {code} x{len(group)} on {', '.join(pcis)} ({group[0].meaning})")
    return "; ".join(parts)
