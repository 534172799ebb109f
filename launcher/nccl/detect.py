"""Tell which of the three texts a file holds, and parse it as that."""

from __future__ import annotations

from pathlib import Path

from launcher.core import safefile
from launcher.nccl.debug_log import NcclDebugLog, is_debug_line, parse_debug_log
from launcher.nccl.errors import NcclParseError
from launcher.nccl.nccl_tests import NcclTestsRun, is_column_header, parse_nccl_tests
from launcher.nccl.text import logical_lines
from launcher.nccl.topology import Topology, looks_like_topology, parse_topology

Parsed = NcclTestsRun | NcclDebugLog | Topology

KINDS = ("nccl-tests", "nccl-debug", "topology")

EXPECTED = ("expected nccl-tests output (a `#  size  count  type ...` table), an NCCL_DEBUG=INFO "
            "log (`HOST:PID:TID [DEV] NCCL INFO ...` lines) or `nvidia-smi topo -m` output "
            "(a `GPU0  X ...` matrix)")


def detect_kind(text: str) -> str | None:
    """"nccl-tests", "nccl-debug", "topology" or None.

    nccl-tests output run with NCCL_DEBUG=INFO carries NCCL log lines too: its table is what
    the user ran for, so the table decides first.
    """
    lines = [line for _, line in logical_lines(text)]
    if any(line.lstrip().startswith("#") and is_column_header(line) for line in lines):
        return "nccl-tests"
    if looks_like_topology(text):
        return "topology"
    if any(is_debug_line(line) for line in lines):
        return "nccl-debug"
    return None


def parse_text(text: str, path: str = "<text>") -> Parsed:
    kind = detect_kind(text)
    if kind == "nccl-tests":
        return parse_nccl_tests(text, path)
    if kind == "topology":
        return parse_topology(text, path)
    if kind == "nccl-debug":
        return parse_debug_log(text, path)
    raise NcclParseError(path, f"not a log `launch inspect` knows: {EXPECTED}")


MAX_LOG_BYTES = 256 << 20  # a day of NCCL_DEBUG=INFO from 8 ranks fits; /dev/zero does not


def read_text(path: str | Path) -> str:
    """A log's text; undecodable bytes are replaced rather than refused (logs carry them).
    Only regular files: a FIFO or a device (`launch inspect /dev/zero`) would never end."""
    try:
        raw = safefile.read_bytes(path, "log", max_bytes=MAX_LOG_BYTES)
    except safefile.UnsafeFile as err:
        if err.missing:
            why = "cannot read it: No such file or directory"
        elif "folder" in err.why or "regular file" in err.why:
            why = ("not a regular file (a folder, FIFO or device): give a saved log or output "
                   "file")
        elif "bytes" in err.why:
            why = f"{err.why}: cut the part you need"
        else:
            why = f"cannot read it: {err.why}"
        raise NcclParseError(str(path), why) from None
    return raw.decode("utf-8", errors="replace")


def parse_file(path: str | Path) -> Parsed:
    return parse_text(read_text(path), str(path))
