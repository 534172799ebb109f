"""Parse `nvidia-smi topo -m` into a `Topology`: link codes, NICs, affinity, and a class.

Classes: `nvswitch` when every GPU pair is linked by NVLink (NV#), `partial-nvlink` when some
pairs are, `pcie` when none are, and `single-gpu` for a machine with one GPU, which has no GPU
pair to judge (its worst_link is null). Codes are matched, never legend wording, which changed
between drivers; the old `SOC` spelling is read as `SYS`.

The GPU x GPU block is read strictly: every cell a known code, `X` on the diagonal. The NIC
columns are read tolerantly, because wide outputs (up to 18 NICs) come back from terminals
and issue trackers damaged: columns glued together (`NIC7NIC8`, `SYSSYS`) are split into
known codes, lines a terminal wrapped are joined, and the NIC count comes from the NIC legend.
Each repair is listed in `warnings`; a NIC cell that cannot be repaired leaves that GPU's NIC
links unread rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.nccl.errors import NcclParseError
from launcher.nccl.labels import strip_labels
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
_DEVICE = re.compile(r"(?:GPU|NIC)\d+")
# Known link codes run together by a paste: `SYSSYS`, `PXBSYS`, `NV12NV12`
_CODES = r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC"
_GLUED_CODES = re.compile(rf"(?:{_CODES}){{2,}}")


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
    warnings: tuple[str, ...] = ()  # what was repaired in a damaged paste, and what was not

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
            "warnings": list(self.warnings),
        }


def looks_like_topology(text: str) -> bool:
    """A `GPU0  X` row under a header with affinity columns: `nvidia-smi topo -m`, and not the
    look-alike `topo -p2p` matrix (its cells are OK/GNS/..., it has no affinity)."""
    lines = [line for _, line in logical_lines(text)]
    # A terminal may have wrapped the header anywhere, `CPU Affinity` included.
    unwrapped = "".join(strip_labels(line) for line in text.splitlines())
    return any(_FIRST_ROW.match(line) for line in lines) and "CPU Affinity" in unwrapped


def parse_topology(text: str, path: str = "<text>") -> Topology:
    lines = [strip_labels(line) for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if _FIRST_ROW.match(line)), None)
    header_at = _header_index(lines, start)
    if start is None or header_at is None:
        raise NcclParseError(path, "not `nvidia-smi topo -m` output: no `GPU0  GPU1 ... CPU "
                                   "Affinity` header above a `GPU0  X ...` row")
    warnings: list[str] = []
    # A header a terminal wrapped continues on the lines below it, up to the first row.
    header_line = "".join(lines[header_at:start])
    if start - header_at > 1:
        warnings.append(f"the header was wrapped over {start - header_at} lines; joined")
    columns = _device_columns(header_line, warnings)
    extras = [name for name in _EXTRA_COLUMNS if name in header_line]
    gpu_columns = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    nic_columns = [c for c in columns if c not in gpu_columns]

    rows: dict[str, tuple[list[str], list[str] | None, list[str]]] = {}
    for lineno, name, line in _matrix_rows(lines, start, columns, warnings):
        if name not in gpu_columns:
            continue  # NIC rows repeat what the GPU rows' NIC columns say
        tokens = line.split()[1:]
        codes = [_ALIASES.get(code, code) for code in tokens[:len(gpu_columns)]]
        if len(codes) < len(gpu_columns):
            raise NcclParseError(path, f"line {lineno}: row {name} has {len(codes)} GPU link "
                                       f"codes for {len(gpu_columns)} GPU columns")
        for column, code in zip(gpu_columns, codes):
            _check_code(path, lineno, name, column, code)
        nic_codes, rest = _nic_codes(tokens[len(gpu_columns):], len(nic_columns), name,
                                     warnings)
        rows[name] = (codes, nic_codes, rest)

    missing = [gpu for gpu in gpu_columns if gpu not in rows]
    if missing:
        raise NcclParseError(path, f"no matrix row for {', '.join(missing)}")
    legend = {m["column"]: m["name"] for line in lines if (m := _NIC_LEGEND.match(line))}
    nic_names = _nic_names(nic_columns, legend, warnings)

    def extra(gpu: str, name: str) -> str | None:
        rest = rows[gpu][2]
        index = extras.index(name) if name in extras else len(rest)
        return rest[index] if index < len(rest) else None

    return Topology(
        path=str(path),
        gpu_columns=tuple(gpu_columns),
        nic_names=nic_names,
        matrix=tuple(tuple(rows[g][0]) for g in gpu_columns),
        nic_links=tuple(tuple(rows[g][1] or ()) for g in gpu_columns),
        cpu_affinity=tuple(extra(g, "CPU Affinity") for g in gpu_columns),
        numa_affinity=tuple(extra(g, "NUMA Affinity") for g in gpu_columns),
        gpu_numa_id=tuple(extra(g, "GPU NUMA ID") for g in gpu_columns),
        warnings=tuple(warnings),
    )


def _header_index(lines: list[str], start: int | None) -> int | None:
    """The column header: the nearest line above the first row that starts with GPU0, with
    nothing but its wrapped continuation (no blank line) in between."""
    if start is None:
        return None
    for index in range(start - 1, max(start - 4, -1), -1):
        tokens = lines[index].split()
        if not tokens:
            return None
        if tokens[0] == "GPU0":
            return index
    return None


def _device_columns(header: str, warnings: list[str]) -> list[str]:
    """`GPU0 GPU1 NIC0 mlx5_1 CPU Affinity NUMA Affinity GPU NUMA ID` -> the device names;
    `NIC7NIC8` (glued by a paste) -> NIC7, NIC8."""
    columns = []
    for token in header.split():
        if token in ("CPU", "NUMA", "GPU"):
            break
        parts = _DEVICE.findall(token)
        if len(parts) > 1 and "".join(parts) == token:
            warnings.append(f"header: split glued {token!r} into {', '.join(parts)}")
            columns += parts
        else:
            columns.append(token)
    return columns


def _matrix_rows(lines: list[str], start: int, columns: list[str], warnings: list[str]):
    """(line number, row name, row text) for each matrix row, lines a terminal wrapped joined
    back onto their row (a wrap can cut a cell in two, so nothing is put between them)."""
    current: list = []
    for index in range(start, len(lines)):
        line = lines[index]
        tokens = line.split()
        if not tokens:
            break  # the blank line before `Legend:`
        if tokens[0] in columns:
            if current:
                yield tuple(current)
            current = [index + 1, tokens[0], line.rstrip()]
        elif current and not line.rstrip().endswith(":"):
            warnings.append(f"row {current[1]} was wrapped onto line {index + 1}; joined")
            current[2] += line.rstrip()
        else:
            break
    if current:
        yield tuple(current)


def _nic_codes(tokens: list[str], nics: int, row: str, warnings: list[str]
               ) -> tuple[list[str] | None, list[str]]:
    """(the row's NIC link codes, the affinity cells); (None, []) when the NIC cells cannot be
    read, since where the affinity cells start is then not known either."""
    codes: list[str] = []
    taken = 0
    for token in tokens:
        if len(codes) >= nics:
            break
        if re.fullmatch(_CODES, token):
            codes.append(_ALIASES.get(token, token))
        elif _GLUED_CODES.fullmatch(token):
            parts = re.findall(_CODES, token)
            warnings.append(f"row {row}: split glued {token!r} into {' '.join(parts)}")
            codes += [_ALIASES.get(part, part) for part in parts]
        else:
            break
        taken += 1
    if len(codes) != nics:
        warnings.append(f"row {row}: {len(codes)} NIC link codes for {nics} NIC columns; "
                        "its NIC links and affinity are not read")
        return None, []
    return codes, tokens[taken:]


def _nic_names(nic_columns: list[str], legend: dict[str, str], warnings: list[str]
               ) -> tuple[str, ...]:
    """NIC names from the legend (`NIC0: mlx5_0`), which a paste damages less than the
    header; else the header's own names (old drivers named the column `mlx5_0`)."""
    if not legend:
        return tuple(nic_columns)
    if sorted(legend) != sorted(nic_columns):
        warnings.append(f"the NIC legend names {len(legend)} NICs, the header "
                        f"{len(nic_columns)}; the legend is used")
        return tuple(legend[name] for name in sorted(legend, key=lambda n: int(n[3:])))
    return tuple(legend[c] for c in nic_columns)


def _check_code(path: str, lineno: int, row: str, column: str, code: str) -> None:
    if code == "X":
        if row != column:
            raise NcclParseError(path, f"line {lineno}: `X` (self) in row {row}, column {column}")
        return
    try:
        link_speed(code)
    except ValueError as err:
        raise NcclParseError(path, f"line {lineno}: row {row}, column {column}: {err}") from None
