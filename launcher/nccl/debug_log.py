"""Read what NCCL_DEBUG=INFO logs say about the wiring NCCL actually used.

Any number of files from any ranks are merged into one `NcclDebugLog`: the version, the
network module, the OFI provider and NIC count, how many connections each transport carries,
the channel count, the world size, the hosts and the WARN messages.

Lines are read after the launcher labels are stripped (`launcher.nccl.labels`). A line that
lost its `HOST:PID:TID [DEV]` prefix (grep output, a prefix cut by whoever pasted it) still
counts, with its host unknown: `lines_without_host` says how many did.

Transport names. A connection line `... via P2P/IPC/read` or `[send] via NET/IB/5/GDRDMA` is
counted under its transport with the device index and modes dropped: `P2P/IPC`, `P2P/CUMEM`,
`P2P/direct pointer`, `SHM`, `NET/Socket`, `NET/IB`, `NET/AWS Libfabric`, `NET/Libfabric`.
GDRDMA stays part of a network transport's name (`NET/IB/GDRDMA`, `NET/AWS Libfabric/GDRDMA`)
because whether the NIC reads GPU memory directly or bounces through host memory is a speed
difference worth seeing in the counts themselves, without a second field to cross-read.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.nccl.errors import NcclParseError
from launcher.nccl.text import logical_lines

# The prefix of every NCCL log line, searched anywhere in the line (after the known launcher
# labels are gone) so that a label nobody listed yet may still stand before it:
# `ip-10-0-0-5:4127:4190 [3] NCCL INFO ...` (HOST:PID:TID [CUDA DEVICE]). WARN lines carry
# where they were raised: `graph/search.cc:1135`, or in plugins written in C++ a whole
# signature: `int cm_req_handle_error_entry(nccl_net_ofi_context_t*, fid_cq*, ...):46`.
# The look-behind starts a host only where a word begins: without it, a 100 KB line of word
# characters made the search quadratic (33 s in `launch inspect`).
_PREFIX = re.compile(
    r"(?<![\w.-])(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[[^\]]*\]"
    r"(?: (?!NCCL )(?P<where>.+?))? NCCL (?P<level>INFO|WARN|TRACE|ABORT) (?P<message>.*)$"
)
# The same line with its host unknown, at the start of a line:
# `NCCL INFO Channel 00/0 : 3[3] -> 11[3] [receive] via NET/IBext_v8/3/GDRDMA` (grep output,
# or a prefix stripped by the writer), `[0] NCCL INFO Using network AWS Libfabric` (prefix cut
# to the device), `<cluster_name>:919:1150 [0] NCCL INFO ...` (host name redacted).
_NO_HOST = re.compile(
    r"^(?:\S+:\d+:\d+ )?(?:\[\d+\] )?(?:(?P<where>\S+:\d+) )?"
    r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) (?P<message>.*)$"
)
# `NCCL version 2.21.5+cuda12.4` (also bare, as NCCL_DEBUG=VERSION prints it)
_VERSION = re.compile(r"\bNCCL version (?P<version>\d+\.\d+\.\d+)")
# `Using network Socket` | `Using network IB` | `Using network AWS Libfabric` | `... Libfabric`
_NETWORK = re.compile(r"^Using network (?P<network>.+?)\s*$")
# `NET/OFI Selected Provider is efa (found 4 nics)` (aws-ofi-nccl before 1.9) and
# `NET/OFI Selected provider is efa, fabric is efa (found 4 nics)` (later plugins)
_PROVIDER = re.compile(
    r"Selected [Pp]rovider is (?P<provider>[^\s,]+)(?:, fabric is \S+)? "
    r"\(found (?P<nics>\d+) nics?\)"
)
# Connections:
# `Channel 02/0 : 3[201d0] -> 4[901c0] via P2P/IPC/read`
# `Channel 00/1 : 12[4] -> 2[2] [receive] via NET/AWS Libfabric/1/GDRDMA/Shared`
# `Channel 01 : 24[101c0] -> 31[a01d0] via P2P/IPC/read` (no connection index before 2.12)
# `Ring 00 : 35 -> 34 [send] via NET/Socket/0` (NCCL 2.4 and older)
_CONNECTION = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<index>\d+))? : (?P<src>\d+)(?:\[\w+\])? -> "
    r"(?P<dst>\d+)(?:\[\w+\])? (?:\[(?P<side>send|receive)\] )?via (?P<via>.+?)\s*$"
)
# The ring order of each channel, every rank once: `Channel 00/24 :    0   1   2   3`
# (24 channels, 4 ranks)
_RING = re.compile(r"^Channel \d+/(?P<total>\d+) :(?P<ranks>(?:\s+\d+)+)\s*$")
# `2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer` (2.17+)
_COLL_CHANNELS = re.compile(r"^(?P<count>\d+) coll channels")
# `comm 0x7f5780001ca0 rank 15 nranks 32 cudaDev 7 nvmlDev 7 - Init COMPLETE`, and since
# NCCL 2.19 also `comm 0x55bde5d092d0 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0`
_RANK = re.compile(r"\brank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)\b")


@dataclass(frozen=True)
class OfiProvider:
    provider: str  # "efa"; several providers seen are joined: "efa, tcp"
    nics: int  # the fewest any rank found: the one that limits the job

    def to_json(self) -> dict:
        return {"provider": self.provider, "nics": self.nics}


@dataclass(frozen=True)
class NcclDebugLog:
    paths: tuple[str, ...]
    nccl_versions: tuple[str, ...]  # sorted; more than one means the ranks disagree
    networks: tuple[str, ...]  # sorted; more than one means some ranks fell back
    efa: OfiProvider | None  # the libfabric provider aws-ofi-nccl selected, if it was loaded
    transports: dict[str, int]  # transport name -> connections, sorted by name
    channels: int | None
    ranks: int | None  # the largest communicator's nranks (else the longest ring): world size
    hosts: tuple[str, ...]  # in order of their lowest rank, hosts without ranks last
    warnings: tuple[str, ...] = ()  # the NCCL WARN messages, each once, in order, where raised
    lines_without_host: int = 0  # NCCL lines pasted without their HOST:PID:TID prefix

    @property
    def nccl_version(self) -> str | None:
        return ", ".join(self.nccl_versions) or None

    @property
    def network(self) -> str | None:
        return ", ".join(self.networks) or None

    @property
    def uses_socket(self) -> bool:
        """NCCL moved inter-node traffic over TCP sockets, the slow path that a missing or
        failed EFA/IB plugin falls back to. A single node's log says `Using network Socket`
        too, with no network connection at all: that alone is no warning."""
        return "NET/Socket" in self.transports or (
            "Socket" in self.networks and len(self.hosts) > 1)

    def to_json(self) -> dict:
        return {
            "kind": "nccl-debug",
            "nccl_version": self.nccl_version,
            "network": self.network,
            "efa": self.efa.to_json() if self.efa else None,
            "transports": dict(self.transports),
            "channels": self.channels,
            "ranks": self.ranks,
            "hosts": list(self.hosts),
            "nccl_warnings": list(self.warnings),
            "lines_without_host": self.lines_without_host,
        }


def transport_name(via: str) -> str:
    """The name a connection is counted under; see the module docstring."""
    parts = via.split("/")
    if parts[0] == "P2P":
        return "/".join(parts[:2])
    if parts[0] == "NET" and len(parts) > 1:
        gdr = any(part.startswith("GDRDMA") for part in parts[2:])
        return f"NET/{parts[1]}" + ("/GDRDMA" if gdr else "")
    return parts[0]


# More WARN messages than this are summarised by their count: a failing rank repeats the same
# few for every connection, and the first ones say why.
MAX_WARNINGS = 20


@dataclass(frozen=True)
class DebugLine:
    host: str | None  # None when the line lost its HOST:PID:TID prefix
    level: str  # INFO, WARN, TRACE or ABORT
    where: str | None  # a WARN's source location or function, as printed
    message: str


def debug_line(line: str) -> DebugLine | None:
    """An NCCL log line (labels already stripped), or None for any other line."""
    if "NCCL " not in line:
        return None
    if match := _PREFIX.search(line):
        return DebugLine(match["host"], match["level"], match["where"], match["message"])
    if match := _NO_HOST.match(line):
        return DebugLine(None, match["level"], match["where"], match["message"])
    return None


def is_debug_line(line: str) -> bool:
    return debug_line(line) is not None


def warning_text(line: DebugLine) -> str:
    """`NET/OFI aws-ofi-nccl initialization failed (int nccl_net_ofi_create_plugin(...):418)`"""
    return f"{line.message} ({line.where})" if line.where else line.message


def parse_debug_log(text: str, path: str = "<text>") -> NcclDebugLog:
    return parse_debug_logs([(path, text)])


def parse_debug_logs(sources: Iterable[tuple[str, str]]) -> NcclDebugLog:
    """Merge (path, text) logs of any ranks; NcclParseError names a file with no NCCL lines."""
    paths: list[str] = []
    versions: set[str] = set()
    networks: set[str] = set()
    providers: dict[str, int] = {}
    # connection key -> side ("send", "receive" or "") -> lines; see _count_connections
    connections: dict[tuple, Counter] = defaultdict(Counter)
    ring_totals: list[int] = []
    ring_sizes: list[int] = []
    coll_channels: list[int] = []
    nranks: list[int] = []
    host_ranks: dict[str, set[int]] = {}
    warnings: dict[str, None] = {}
    without_host = 0

    for path, text in sources:
        paths.append(str(path))
        seen_nccl_line = False
        for _, text_line in logical_lines(text):
            if match := _VERSION.search(text_line):
                versions.add(match["version"])
            line = debug_line(text_line)
            if line is None:
                continue
            seen_nccl_line = True
            if line.host is None:
                without_host += 1
                ranks_on_host: set[int] = set()
            else:
                ranks_on_host = host_ranks.setdefault(line.host, set())
            message = line.message
            if line.level == "WARN":
                warnings.setdefault(warning_text(line))
            elif match := _CONNECTION.match(message):
                key = (match["channel"], match["index"], match["src"], match["dst"],
                       transport_name(match["via"]))
                connections[key][match["side"] or ""] += 1
            elif match := _RING.match(message):
                ring_totals.append(int(match["total"]))
                ring_sizes.append(len(match["ranks"].split()))
            elif match := _NETWORK.match(message):
                networks.add(match["network"])
            elif match := _PROVIDER.search(message):
                provider, nics = match["provider"], int(match["nics"])
                providers[provider] = min(nics, providers.get(provider, nics))
            elif match := _COLL_CHANNELS.match(message):
                coll_channels.append(int(match["count"]))
            elif match := _RANK.search(message):
                ranks_on_host.add(int(match["rank"]))
                nranks.append(int(match["nranks"]))
        if not seen_nccl_line:
            raise NcclParseError(path, "not an NCCL_DEBUG=INFO log: no "
                                       "`HOST:PID:TID [DEV] NCCL INFO ...` lines")

    channel_ids = {key[0] for key in connections}
    return NcclDebugLog(
        paths=tuple(paths),
        nccl_versions=tuple(sorted(versions)),
        networks=tuple(sorted(networks)),
        efa=OfiProvider(", ".join(sorted(providers)), min(providers.values()))
        if providers else None,
        transports=_count_connections(connections),
        channels=max(ring_totals or coll_channels or [len(channel_ids)]) or None,
        # A ring lists every rank of its communicator once: the world size where no line
        # states nranks.
        ranks=max(nranks or ring_sizes, default=None),
        hosts=tuple(sorted(host_ranks, key=lambda h: (min(host_ranks[h], default=1 << 62), h))),
        warnings=_capped(list(warnings)),
        lines_without_host=without_host,
    )


def _capped(warnings: list[str]) -> tuple[str, ...]:
    if len(warnings) <= MAX_WARNINGS:
        return tuple(warnings)
    more = len(warnings) - MAX_WARNINGS
    return (*warnings[:MAX_WARNINGS], f"... and {more} more different WARN messages")


def _count_connections(connections: dict[tuple, Counter]) -> dict[str, int]:
    """A network connection is logged twice, `[send]` by one rank and `[receive]` by its peer;
    P2P and SHM ones once. The same line repeats once per communicator. So a connection key
    counts as often as its most frequent side: not doubled, yet complete when only one end's
    log is at hand."""
    totals: Counter = Counter()
    for key, sides in connections.items():
        totals[key[-1]] += max(sides.values())
    return dict(sorted(totals.items()))
