"""Parse the output of nccl-tests' `*_perf` binaries into an `NcclTestsRun`.

The columns are read from the table's own header line rather than assumed, because the layout
changed over the years: current builds print `size count type redop root` then
`time algbw busbw #wrong` twice (out-of-place, in-place); older ones have no `root` column, an
`error` column holding the largest deviation as a float, and all_gather once had no `redop`.
Old alltoall builds print a `redop` header column and leave it blank in the rows, so rows are
read from the right: the `time algbw busbw #wrong|error` groups are anchored at the end of the
row and only the `redop` cell of the leading columns may be missing.

A run that failed after its header (no rows, `Test NCCL failure ...`, `NCCL WARN ...`) is a
result too, `failed` with the lines that say why, since that is when its reader needs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.nccl.busbw import TYPE_SIZES
from launcher.nccl.debug_log import NcclDebugLog, debug_line, parse_debug_log, warning_text
from launcher.nccl.errors import NcclParseError
from launcher.nccl.text import integer, logical_lines, number

# `#  Rank  0 Group  0 Pid  28307 on      gpu59 device  0 [0x16] NVIDIA GeForce RTX 4090`
# `#   Rank  0 Pid   1320 on ip-172-31-20-228 device  0 [0x00] Tesla V100-SXM2-16GB` (old: no Group)
# `#  Rank  1 Group  0 Pid 1669515 on spark-dbf4 device  0 [000f:01:00] NVIDIA GB10` (PCI bus id)
_RANK_LINE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+"
    r"(?P<host>\S+)\s+device\s+(?P<device>\d+)\s+\[(?P<bus_id>[^\]]*)\]\s+(?P<gpu>.*?)\s*$"
)
# `# Collective test starting: all_reduce_perf` (newer builds; also `..._perf_mpi`)
_TEST_STARTING = re.compile(r"Collective test starting:\s*(?P<binary>\S+)")
# Any mention of a binary, e.g. the command line pasted above the output: `./all_gather_perf -b 8`
_BINARY_MENTION = re.compile(
    r"\b(?P<collective>all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)"
    r"_perf"
)
# `NCCL version 2.18.1+cuda12.1`, bare or inside an `NCCL INFO` line of NCCL_DEBUG=INFO
_NCCL_VERSION = re.compile(r"\bNCCL version (?P<version>\d+\.\d+\.\d+)")
# `# nccl-tests version 2.20.0 (b4d5bee) nccl-headers=23102 nccl-library=23102`
_LIBRARY_CODE = re.compile(r"nccl-library=(?P<code>\d+)")
# `# Avg bus bandwidth    : 66.0423 ` (may end in OK / FAILED when NCCL_TESTS_MIN_BW is set)
_AVG_BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*(?P<value>\S+)")
# `# Out of bounds values : 0 OK`
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(?P<count>\d+)")

# nccl-tests' own failure lines, from its TESTCHECK/NCCLCHECK/CUDACHECK macros:
# `GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error (run with ...) / '`
# `node: Test CUDA failure common.cu:297 'an illegal memory access was encountered'`
# ` .. GENOA-06 pid 5068: Test failure common.cu:590`
_TEST_FAILURE = re.compile(r"\bTest (?:\w+ )?failure\b")
# Error text that other layers print into the same output: torch's `NCCL error in: ...`,
# CUDA's `CUDA error: ...`, NCCL's `Cuda failure 1 'invalid argument'` inside a WARN.
_ERROR_TEXT = re.compile(r"\b(?:NCCL error|CUDA error|Cuda failure)\b")
# The one cell of the leading columns a row may leave blank (old alltoall builds).
_MAY_BE_BLANK = "redop"
_TIME_COLUMNS = ("time", "cputime")
_KNOWN_COLLECTIVE = re.compile(r"^(?P<name>\w+?)_perf(?:_mpi)?$")


@dataclass(frozen=True)
class Measurement:
    """One half of a row: the out-of-place or the in-place timing."""

    time_us: float | None
    algbw: float | None
    busbw: float | None
    wrong: int | None  # wrong elements; None for `N/A` and in the old layout, which has none
    error: float | None = None  # old layout only: the largest deviation seen (not a count)

    def to_json(self) -> dict:
        return {"time_us": self.time_us, "algbw": self.algbw, "busbw": self.busbw,
                "wrong": self.wrong}


@dataclass(frozen=True)
class ResultRow:
    size: int  # bytes, nccl-tests' `size` column (the larger of send and receive buffer)
    count: int
    type: str
    redop: str | None  # None where the layout has no redop column
    root: int | None  # None where the layout has no root column; -1 for rootless collectives
    out_of_place: Measurement | None
    in_place: Measurement | None

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        return tuple(m for m in (self.out_of_place, self.in_place) if m is not None)

    def to_json(self) -> dict:
        return {
            "size": self.size, "count": self.count, "type": self.type, "redop": self.redop,
            "root": self.root,
            "out_of_place": self.out_of_place.to_json() if self.out_of_place else None,
            "in_place": self.in_place.to_json() if self.in_place else None,
        }


@dataclass(frozen=True)
class RankDevice:
    """One `#  Rank N ... on HOST device D [BUSID] NAME` header line."""

    rank: int
    host: str
    device: int
    bus_id: str  # as printed: `0x07` (older builds) or `0000:61:00`
    gpu: str
    pid: int | None = None
    group: int | None = 0


@dataclass(frozen=True)
class NcclTestsRun:
    path: str
    collective: str | None  # e.g. "all_reduce"; None where the output does not say and the
    #                          numbers cannot tell (all_gather and alltoall look alike)
    devices: tuple[RankDevice, ...]  # sorted by rank
    rows: tuple[ResultRow, ...]
    nccl_version: str | None  # "2.21.5", without the "+cuda12.4" build suffix
    avg_busbw: float | None  # nccl-tests' own average over every row, tiny sizes included
    out_of_bounds: int | None  # the `# Out of bounds values` footer
    layout: str  # "current" (root and #wrong columns) or "old"
    collective_reason: str | None = None  # why `collective` is None
    failed: bool = False  # stopped with an error, or before its first size
    failure_reason: str | None = None  # the line that says why (or what is missing)
    failure_lines: tuple[str, ...] = ()  # Test failure lines, WARN lines, error text
    debug: NcclDebugLog | None = None  # what the NCCL_DEBUG lines in the output say

    @property
    def ranks(self) -> int | None:
        return len({d.rank for d in self.devices}) or None

    @property
    def hosts(self) -> list[str]:
        """Distinct hosts in rank order."""
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def gpus(self) -> list[str]:
        return [d.gpu for d in self.devices]

    @property
    def peak_busbw(self) -> float | None:
        """The largest busbw of any row and either placement: the large-message figure to hold
        against a link's rated speed, which the size-averaged `Avg bus bandwidth` is not."""
        values = [m.busbw for row in self.rows for m in row.measurements if m.busbw is not None]
        return max(values, default=None)

    @property
    def wrong_total(self) -> int | None:
        counts = [m.wrong for row in self.rows for m in row.measurements if m.wrong is not None]
        if counts:
            return sum(counts)
        # The old layout counts no wrong elements per row; its footer still counts them. With
        # nothing checked (`-c 0` prints N/A) the footer's 0 means nothing, so None.
        checked = any(m.error is not None for row in self.rows for m in row.measurements)
        return self.out_of_bounds if checked else None

    def to_json(self) -> dict:
        debug = self.debug.to_json() if self.debug else None
        if debug:
            del debug["kind"]
        return {
            "kind": "nccl-tests",
            "collective": self.collective,
            "collective_reason": self.collective_reason,
            "ranks": self.ranks,
            "hosts": self.hosts,
            "gpus": self.gpus,
            "nccl_version": self.nccl_version,
            "rows": [row.to_json() for row in self.rows],
            "avg_busbw": self.avg_busbw,
            "peak_busbw": self.peak_busbw,
            "wrong_total": self.wrong_total,
            "failed": self.failed,
            "failure_reason": self.failure_reason,
            "failure_lines": list(self.failure_lines),
            "debug": debug,
        }


def is_column_header(line: str) -> bool:
    """`#       size         count      type   redop    root     time   algbw   busbw ...`"""
    tokens = line.lstrip("# \t").split()
    return tokens[:2] == ["size", "count"] and "busbw" in tokens


def parse_nccl_tests(text: str, path: str = "<text>") -> NcclTestsRun:
    """Read one collective's nccl-tests output; NcclParseError names `path` if it is not that."""
    columns: list[str] | None = None
    time_scale = 1.0
    rows: list[ResultRow] = []
    devices: dict[tuple[int, str, int | None], RankDevice] = {}
    binaries: list[str] = []
    versions: list[str] = []
    failures: dict[str, None] = {}
    tests_failed = False
    has_debug_lines = False
    library_code = avg_busbw = out_of_bounds = None

    for lineno, line in logical_lines(text):
        if match := _NCCL_VERSION.search(line):
            versions.append(match["version"])
        stripped = line.strip()
        if nccl_line := debug_line(stripped):
            has_debug_lines = True
            if nccl_line.level == "WARN":
                failures.setdefault(f"NCCL WARN {warning_text(nccl_line)}")
            elif _ERROR_TEXT.search(nccl_line.message):
                failures.setdefault(stripped)
            continue
        if _TEST_FAILURE.search(stripped):
            tests_failed = True
            failures.setdefault(stripped)
            continue
        if _ERROR_TEXT.search(stripped):
            failures.setdefault(stripped)
        if not stripped.startswith("#"):
            if columns is not None and stripped[:1].isdigit():
                row = _parse_row(stripped.split(), columns, time_scale)
                if row is not None:
                    rows.append(row)
            continue
        if is_column_header(stripped):
            columns = _check_columns(stripped.lstrip("# \t").split(), path, lineno)
        elif stripped.lstrip("# \t").startswith("(B)"):
            # The units line under the header; the oldest builds timed in milliseconds.
            time_scale = 1000.0 if "(ms)" in stripped else 1.0
        elif match := _RANK_LINE.match(stripped):
            device = _rank_device(match)
            devices[(device.rank, device.host, device.pid)] = device
        elif match := _TEST_STARTING.search(stripped):
            binaries.append(match["binary"])
        elif match := _LIBRARY_CODE.search(stripped):
            library_code = int(match["code"])
        elif match := _AVG_BUSBW.search(stripped):
            avg_busbw = _number_or_none(match["value"])
        elif match := _OUT_OF_BOUNDS.search(stripped):
            out_of_bounds = int(match["count"])

    if columns is None:
        raise NcclParseError(path, "not nccl-tests output: no `#  size  count  type ... busbw` "
                                   "column header (the table that all_reduce_perf and the "
                                   "other *_perf binaries print)")
    version = versions[0] if versions else _decode_version_code(library_code)
    nranks = len({k[0] for k in devices})
    collective, reason = _collective(binaries, text, rows, nranks, path)
    failed = tests_failed or not rows
    failure_lines = tuple(failures) if failed else ()
    return NcclTestsRun(
        path=str(path),
        collective=collective,
        devices=tuple(sorted(devices.values(), key=lambda d: (d.rank, d.host))),
        rows=tuple(rows),
        nccl_version=version,
        avg_busbw=avg_busbw,
        out_of_bounds=out_of_bounds,
        layout="current" if "root" in columns and "error" not in columns else "old",
        collective_reason=reason,
        failed=failed,
        failure_reason=_failure_reason(failure_lines) if failed else None,
        failure_lines=failure_lines,
        debug=parse_debug_log(text, str(path)) if has_debug_lines else None,
    )


def _failure_reason(lines: tuple[str, ...]) -> str:
    """The line that says why: nccl-tests' own first failure (it quotes NCCL's or CUDA's error
    string), else the first WARN or error text, else what is missing."""
    quoted = [line for line in lines if _TEST_FAILURE.search(line) and "'" in line]
    if quoted or lines:
        return (quoted or list(lines))[0]
    return ("no result rows after the table header: the run stopped before its first size, "
            "or the output was cut there")


def _check_columns(columns: list[str], path: str, lineno: int) -> list[str]:
    if not any(c in _TIME_COLUMNS for c in columns):
        raise NcclParseError(path, f"line {lineno}: nccl-tests column header without a "
                                   f"`time` column: {' '.join(columns)}")
    return columns


def _parse_row(tokens: list[str], columns: list[str], time_scale: float) -> ResultRow | None:
    """A data row, or None for a line that is not one (a truncated last line, an interleaved
    log line that happens to start with a digit).

    The `time algbw busbw #wrong` groups are read from the right, so that a blank leading cell
    (old alltoall builds print no redop) shifts nothing. Extra tokens at the end (a build that
    prints more than its header names) are left unread.
    """
    first_group = next(i for i, name in enumerate(columns) if name in _TIME_COLUMNS)
    lead_columns, group_columns = columns[:first_group], columns[first_group:]
    missing = len(columns) - len(tokens)
    if missing > 0:
        if missing > 1 or _MAY_BE_BLANK not in lead_columns:
            return None
        lead_columns = [c for c in lead_columns if c != _MAY_BE_BLANK]
    lead = dict(zip(lead_columns, tokens))
    group_tokens = tokens[len(lead_columns):len(lead_columns) + len(group_columns)]
    starts = [i for i, name in enumerate(group_columns) if name in _TIME_COLUMNS]
    try:
        sides = [_measurement(group_columns, group_tokens, start, time_scale)
                 for start in starts]
        type_name = lead["type"]
        if _is_number(type_name):
            return None  # a row with a cell missing from another column than redop
        return ResultRow(
            size=int(lead["size"]),
            count=int(lead["count"]),
            type=type_name,
            redop=lead.get("redop"),
            root=int(lead["root"]) if "root" in lead else None,
            out_of_place=sides[0] if sides else None,
            in_place=sides[1] if len(sides) > 1 else None,
        )
    except (ValueError, KeyError):
        return None


def _measurement(columns: list[str], tokens: list[str], start: int, time_scale: float
                 ) -> Measurement:
    """The `time algbw busbw #wrong|error` group whose time column is at `start`; ValueError
    for cells that are not what the column holds (a row cut short shifts them)."""
    group = {}
    for index in range(start + 1, len(columns)):
        if columns[index] in _TIME_COLUMNS:
            break
        group.setdefault(columns[index], tokens[index])
    time_us = number(tokens[start])
    if time_us is not None and time_us < 0:
        raise ValueError(f"negative time {tokens[start]!r}")
    wrong = group.get("#wrong")
    if wrong is not None and not re.fullmatch(r"\d+|N/A", wrong):
        raise ValueError(f"{wrong!r} is not a count of wrong elements")
    return Measurement(
        time_us=None if time_us is None else time_us * time_scale,
        algbw=number(group["algbw"]),
        busbw=number(group["busbw"]),
        wrong=integer(wrong) if wrong is not None else None,
        error=number(group["error"]) if "error" in group else None,
    )


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _rank_device(match: re.Match) -> RankDevice:
    return RankDevice(
        rank=int(match["rank"]),
        host=match["host"],
        device=int(match["device"]),
        bus_id=match["bus_id"],
        gpu=match["gpu"],
        pid=int(match["pid"]),
        group=int(match["group"]) if match["group"] is not None else None,
    )


def _number_or_none(token: str) -> float | None:
    try:
        return number(token)
    except ValueError:
        return None


def _decode_version_code(code: int | None) -> str | None:
    """NCCL_VERSION_CODE: 22105 is 2.21.5 since NCCL 2.9; 2708 was 2.7.8 before that."""
    if code is None or code <= 0:
        return None
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _collective(binaries: list[str], text: str, rows: list[ResultRow], nranks: int,
                path: str) -> tuple[str | None, str | None]:
    """(collective, why it is None)."""
    named = sorted({_binary_collective(b) for b in binaries})
    if len(named) > 1:
        raise NcclParseError(path, f"holds the results of several collectives "
                                   f"({', '.join(named)}); give `launch inspect` one per file "
                                   f"(split it at the `# Collective test starting` lines)")
    if named:
        return named[0], None
    mentioned = {m["collective"] for m in _BINARY_MENTION.finditer(text)}
    if len(mentioned) == 1:
        return mentioned.pop(), None
    return _infer_collective(rows, nranks)


def _binary_collective(binary: str) -> str:
    match = _KNOWN_COLLECTIVE.match(binary.rsplit("/", 1)[-1])
    return match["name"] if match else binary


_UNNAMED = "the output never names its binary"


def _infer_collective(rows: list[ResultRow], nranks: int) -> tuple[str | None, str | None]:
    """Tell the collective from the columns when the output never names it: a root means
    broadcast or reduce; a count covering the whole size means all_reduce, a per-rank count
    with a reduction reduce_scatter. all_gather and alltoall print alike; so do all_reduce and
    sendrecv on 2 ranks (busbw = algbw for both)."""
    row = next((r for r in rows if r.count > 0 and r.type in TYPE_SIZES), None)
    if row is None:
        return None, (f"{_UNNAMED}, and no result row to tell it from" if not rows else
                      f"{_UNNAMED}, and no row has a count and a known type to tell it from")
    reduces = row.redop not in (None, "none")
    if row.root is not None and row.root >= 0:
        return ("reduce" if reduces else "broadcast"), None
    whole = row.count * TYPE_SIZES[row.type] == row.size
    if not reduces:
        blank = "no redop" if row.redop is None else "redop none"
        return None, (f"{_UNNAMED}; all_gather and alltoall print the same table ({blank}, "
                      "root -1)" if not whole else
                      f"{_UNNAMED}, and a row without reduction over the whole buffer fits "
                      "several collectives")
    if not whole:
        return "reduce_scatter", None
    if nranks == 1:
        return None, f"{_UNNAMED}, and on one rank every collective prints the same table"
    if nranks == 2:
        return None, (f"{_UNNAMED}; on 2 ranks all_reduce and sendrecv print the same table "
                      "(redop sum, root -1, busbw = algbw)")
    if nranks == 0 and not _busbw_above_algbw(rows):
        return None, (f"{_UNNAMED} and lists no ranks; busbw = algbw fits a 2-rank all_reduce "
                      "as well as sendrecv")
    return "all_reduce", None


def _busbw_above_algbw(rows: list[ResultRow]) -> bool:
    """all_reduce's busbw is algbw x 2(n-1)/n: above algbw from 3 ranks on; sendrecv's never.
    Read on the row moving the most data per second, where rounding matters least."""
    sides = [m for row in rows for m in row.measurements
             if m.algbw is not None and m.busbw is not None and m.algbw > 0]
    if not sides:
        return False
    fastest = max(sides, key=lambda m: m.algbw)
    return fastest.busbw > fastest.algbw * 1.05
