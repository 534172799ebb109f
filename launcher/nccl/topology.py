"""Parse `nvidia-smi topo -m` into a `Topology`: link codes, NICs, affinity, and a class.

Classes: `nvswitch` when every GPU pair is linked by NVLink (NV#), `partial-nvlink` when some
pairs are, `pcie` when none are, and `single-gpu` for a machine with one GPU, which has no GPU
pair to judge (its worst_link is null). Codes are matched, never legend wording, which changed
between drivers; the old `SOC` spelling is read as `SYS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.nccl.errors import NcclParseError
from launcher.nccl.text import logical_lines

# PCIe distances, fastest first: one switch, several switches, a host bridge, across host
# bridges inside a NUMA node, across NUMA nodes (SOC in drivers before 2017).
_PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")
_ALIASES = {"SOC": "SYS"}
_NVLINK = re.compile(r"^NV(?P<links>\d+)$")
# The first matrix row of every driver's output: `GPU0     X      NV12    NV12 ...`
_FIRST_ROW = re.compile(r"^\s*GPU0\s+X(?:\s|$)")
# The legend of newer drivers: `  NIC0: mlx5_0`
_NIC_LEGEND = re.compile(r"^\s*(?P<column>NIC\d+)\s*:\s*(?P<name>\S+)\s*$")
# Header cells after the device columns, in the order drivers print them.
_EXTRA_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def link_speed(code: str) -> int:
    """A sortable speed for a link code: NV# above every PCIe path, more links faster."""
    code = _ALIASES.get(code, code)
    if match := _NVLINK.match(code):
        return 100 + int(match["links"])
    if code in _PCIE_ORDER:
        return len(_PCIE_ORDER) - _PCIE_ORDER.index(code)
    raise ValueError(f"unknown link code {code!r} (expected X, NV#, PIX, PXB, PHB, NODE or SYS)")


@dataclass(frozen=True)
class Topology:
    path: str
    gpu_columns: tuple[str, ...]  # "GPU0", "GPU1", ...
    nic_names: tuple[str, ...]  # from the NIC legend (`mlx5_0`), else the column header
    matrix: tuple[tuple[str, ...], ...]  # GPU x GPU codes, "X" on the diagonal
    nic_links: tuple[tuple[str, ...], ...]  # GPU x NIC codes
    cpu_affinity: tuple[str | None, ...]  # per GPU, as printed ("0-47,96-143")
    numa_affinity: tuple[str | None, ...]
    gpu_numa_id: tuple[str | None, ...]  # newer drivers only; None elsewhere

    @property
    def gpus(self) -> int:
        return len(self.gpu_columns)

    @property
    def nics(self) -> int:
        return len(self.nic_names)

    def gpu_pair_links(self) -> list[str]:
        return [self.matrix[i][j] for i in range(self.gpus) for j in range(i + 1, self.gpus)]

    @property
    def link_class(self) -> str:
        links = self.gpu_pair_links()
        if not links:
            return "single-gpu"
        nvlinks = sum(1 for code in links if _NVLINK.match(code))
        if nvlinks == len(links):
            return "nvswitch"
        return "partial-nvlink" if nvlinks else "pcie"

    @property
    def worst_link(self) -> str | None:
        """The slowest GPU-GPU code: what a ring through every GPU is held to."""
        return min(self.gpu_pair_links(), key=link_speed, default=None)

    def to_json(self) -> dict:
        return {
            "kind": "topology",
            "gpus": self.gpus,
            "nics": self.nics,
            "matrix": [list(row) for row in self.matrix],
            "class": self.link_class,
            "worst_link": self.worst_link,
        }


def looks_like_topology(text: str) -> bool:
    """A `GPU0  X` row under a header with affinity columns: `nvidia-smi topo -m`, and not the
    look-alike `topo -p2p` matrix (its cells are OK/GNS/..., it has no affinity)."""
    lines = [line for _, line in logical_lines(text)]
    return any(_FIRST_ROW.match(line) for line in lines) and any(
        "CPU Affinity" in line for line in lines)


def parse_topology(text: str, path: str = "<text>") -> Topology:
    lines = list(logical_lines(text))
    start = next((i for i, (_, line) in enumerate(lines) if _FIRST_ROW.match(line)), None)
    header_at = _header_index(lines, start)
    if start is None or header_at is None:
        raise NcclParseError(path, "not `nvidia-smi topo -m` output: no `GPU0  GPU1 ... CPU "
                                   "Affinity` header above a `GPU0  X ...` row")
    header_line = lines[header_at][1]
    columns = _device_columns(header_line)
    extras = [name for name in _EXTRA_COLUMNS if name in header_line]
    gpu_columns = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    nic_columns = [c for c in columns if c not in gpu_columns]

    rows: dict[str, tuple[list[str], list[str]]] = {}
    for lineno, line in lines[start:]:
        tokens = line.split()
        if not tokens or tokens[0] not in columns:
            break  # the blank line before `Legend:`
        codes = [_ALIASES.get(code, code) for code in tokens[1:1 + len(columns)]]
        rest = tokens[1 + len(columns):]
        if len(codes) < len(columns):
            raise NcclParseError(path, f"line {lineno}: row {tokens[0]} has {len(codes)} link "
                                       f"codes for {len(columns)} columns")
        for column, code in zip(columns, codes):
            _check_code(path, lineno, tokens[0], column, code)
        rows[tokens[0]] = (codes, rest)

    missing = [gpu for gpu in gpu_columns if gpu not in rows]
    if missing:
        raise NcclParseError(path, f"no matrix row for {', '.join(missing)}")
    legend = {m["column"]: m["name"] for _, line in lines if (m := _NIC_LEGEND.match(line))}

    def extra(gpu: str, name: str) -> str | None:
        rest = rows[gpu][1]
        index = extras.index(name) if name in extras else len(rest)
        return rest[index] if index < len(rest) else None

    return Topology(
        path=str(path),
        gpu_columns=tuple(gpu_columns),
        nic_names=tuple(legend.get(c, c) for c in nic_columns),
        matrix=tuple(tuple(rows[g][0][columns.index(c)] for c in gpu_columns)
                     for g in gpu_columns),
        nic_links=tuple(tuple(rows[g][0][columns.index(c)] for c in nic_columns)
                        for g in gpu_columns),
        cpu_affinity=tuple(extra(g, "CPU Affinity") for g in gpu_columns),
        numa_affinity=tuple(extra(g, "NUMA Affinity") for g in gpu_columns),
        gpu_numa_id=tuple(extra(g, "GPU NUMA ID") for g in gpu_columns),
    )


def _header_index(lines: list[tuple[int, str]], start: int | None) -> int | None:
    """The column header: the last non-blank line above the first row, starting with GPU0."""
    for index in range(start - 1 if start else -1, -1, -1):
        tokens = lines[index][1].split()
        if tokens:
            return index if tokens[0] == "GPU0" else None
    return None


def _device_columns(header: str) -> list[str]:
    """`GPU0 GPU1 NIC0 mlx5_1 CPU Affinity NUMA Affinity GPU NUMA ID` -> the device names."""
    columns = []
    for token in header.split():
        if token in ("CPU", "NUMA", "GPU"):
            break
        columns.append(token)
    return columns


def _check_code(path: str, lineno: int, row: str, column: str, code: str) -> None:
    if code == "X":
        if row != column:
            raise NcclParseError(path, f"line {lineno}: `X` (self) in row {row}, column {column}")
        return
    try:
        link_speed(code)
    except ValueError as err:
        raise NcclParseError(path, f"line {lineno}: row {row}, column {column}: {err}") from None
