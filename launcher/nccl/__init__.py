"""Bandwidth logs and topology: parsers for nccl-tests output, NCCL_DEBUG=INFO logs and
`nvidia-smi topo -m`, nccl-tests' bandwidth formulas, and its table layout for `launch bench`.

Every parser is pure (text in, dataclass out, `to_json()` for the JSON shape) and raises
`NcclParseError(path, why)` for text that is not what it reads.
"""

from launcher.nccl.busbw import (
    COLLECTIVES, TYPE_SIZES, algo_bandwidth, bus_bandwidth, bus_factor, element_count,
)
from launcher.nccl.debug_log import NcclDebugLog, OfiProvider, parse_debug_log, parse_debug_logs
from launcher.nccl.detect import detect_kind, parse_file, parse_text, read_text
from launcher.nccl.errors import NcclParseError
from launcher.nccl.nccl_tests import (
    Measurement, NcclTestsRun, RankDevice, ResultRow, parse_nccl_tests,
)
from launcher.nccl.perf_table import (
    footer_lines, format_row, header_lines, measured_row, render_table,
)
from launcher.nccl.topology import Topology, link_speed, parse_topology

__all__ = [
    "COLLECTIVES", "TYPE_SIZES", "Measurement", "NcclDebugLog", "NcclParseError",
    "NcclTestsRun", "OfiProvider", "RankDevice", "ResultRow", "Topology", "algo_bandwidth",
    "bus_bandwidth", "bus_factor", "detect_kind", "element_count", "footer_lines",
    "format_row", "header_lines", "link_speed", "measured_row", "parse_debug_log",
    "parse_debug_logs", "parse_file", "parse_nccl_tests", "parse_text", "parse_topology",
    "read_text", "render_table",
]
