"""`nvidia-smi -q -x` (XML) and `nvidia-smi -q` (text) read into the health facts of each GPU.

Both forms carry the same fields under different spellings, and people paste the text form with
pieces cut out (`[...]`, a grep of one section, a prompt line in front). Both are read into one
`SmiReport`: per GPU the volatile ECC counters, retired pages, remapped rows, the reset /
recovery state the driver asks for, the clock event (throttle) reasons active, persistence mode
and the NVSwitch fabric state. A field the driver does not report ("N/A", "Requested
functionality has been deprecated") is None, never a guess.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.core.errors import LauncherError


class SmiParseError(LauncherError):
    """Text that is neither nvidia-smi's XML nor its `-q` report."""


@dataclass
class GpuHealth:
    bus_id: str | None = None
    name: str | None = None
    uuid: str | None = None
    persistence: bool | None = None
    mig: bool | None = None
    ecc_enabled: bool | None = None
    volatile_correctable: int | None = None      # since the driver loaded (SRAM + DRAM)
    volatile_uncorrectable: int | None = None
    aggregate_uncorrectable: int | None = None   # lifetime: history, not a present fault
    retired_single_bit: int | None = None
    retired_double_bit: int | None = None
    retired_pending: bool | None = None          # a page waits for a reset to be retired
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None            # a row waits for a reset to be remapped
    remap_failure: bool | None = None            # the remapper ran out: replace the GPU
    reset_required: bool | None = None
    drain_and_reset: bool | None = None
    recovery_action: str | None = None           # "None", "Reset", "Reboot", "Drain P2P", ...
    throttle_active: list[str] = field(default_factory=list)
    fabric_state: str | None = None              # NVSwitch systems: "Completed" when ready
    fabric_status: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SmiReport:
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None             # what the driver counts
    gpus: list[GpuHealth] = field(default_factory=list)   # what the report lists

    def to_json(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "cuda_version": self.cuda_version,
                "attached_gpus": self.attached_gpus, "gpus": [g.to_json() for g in self.gpus]}


# ------------------------------------------------------------------------------ values

_MISSING = {"", "n/a", "[n/a]", "none", "requested functionality has been deprecated",
            "not supported", "[not supported]", "unknown error"}


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value.lower() in _MISSING else value


def _int(value: str | None) -> int | None:
    value = _text(value)
    if value is None:
        return None
    match = re.match(r"^-?\d+", value)
    return int(match.group()) if match else None


def _yes(value: str | None) -> bool | None:
    value = _text(value)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "enabled", "active", "on", "true"):
        return True
    if lowered in ("no", "disabled", "not active", "off", "false"):
        return False
    return None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# Clock event reasons that mean the GPU is held below its clocks by something other than being
# idle or asked to (application clocks, sync boost, a display): slowdowns, power caps.
_THROTTLE_WORDS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                   "hw_power_brake_slowdown", "sw_thermal_slowdown")


# ------------------------------------------------------------------------------ XML


def _find(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    return None if found is None else (found.text or "")


def _gpu_from_xml(gpu: ET.Element) -> GpuHealth:
    volatile = gpu.find("ecc_errors/volatile")
    aggregate = gpu.find("ecc_errors/aggregate")

    def counters(block: ET.Element | None, kind: str) -> int | None:
        if block is None:
            return None
        # sram_uncorrectable (<= R550), sram_uncorrectable_parity/_secded (R550+),
        # dram_*; drivers before Ampere: single_bit/total, double_bit/total.
        values = [_int(child.text) for child in block
                  if child.tag.startswith(("sram_" + kind, "dram_" + kind))]
        legacy = "single_bit" if kind == "correctable" else "double_bit"
        values.append(_int(_find(block, f"{legacy}/total")))
        return _sum(values)

    remap = gpu.find("remapped_rows")
    reasons = gpu.find("clocks_event_reasons")
    if reasons is None:
        reasons = gpu.find("clocks_throttle_reasons")   # the name before R535
    active = []
    if reasons is not None:
        for child in reasons:
            name = re.sub(r"^clocks?_(event|throttle)_reasons?_", "", child.tag)
            if name in _THROTTLE_WORDS and _yes(child.text):
                active.append(name)
    return GpuHealth(
        bus_id=gpu.get("id") or _text(_find(gpu, "pci/pci_bus_id")),
        name=_text(_find(gpu, "product_name")),
        uuid=_text(_find(gpu, "uuid")),
        persistence=_yes(_find(gpu, "persistence_mode")),
        mig=_yes(_find(gpu, "mig_mode/current_mig")),
        ecc_enabled=_yes(_find(gpu, "ecc_mode/current_ecc")),
        volatile_correctable=counters(volatile, "correctable"),
        volatile_uncorrectable=counters(volatile, "uncorrectable"),
        aggregate_uncorrectable=counters(aggregate, "uncorrectable"),
        retired_single_bit=_int(_find(gpu, "retired_pages/multiple_single_bit_retirement/"
                                      "retired_count")),
        retired_double_bit=_int(_find(gpu, "retired_pages/double_bit_retirement/"
                                      "retired_count")),
        retired_pending=_any_yes(_find(gpu, "retired_pages/pending_blacklist"),
                                 _find(gpu, "retired_pages/pending_retirement")),
        remap_correctable=_int(_find(remap, "remapped_row_corr")) if remap is not None else None,
        remap_uncorrectable=_int(_find(remap, "remapped_row_unc")) if remap is not None
        else None,
        remap_pending=_yes(_find(remap, "remapped_row_pending")) if remap is not None else None,
        remap_failure=_yes(_find(remap, "remapped_row_failure")) if remap is not None else None,
        reset_required=_yes(_find(gpu, "gpu_reset_status/reset_required")),
        drain_and_reset=_yes(_find(gpu, "gpu_reset_status/drain_and_reset_recommended")),
        recovery_action=_text(_find(gpu, "gpu_recovery_action")),
        throttle_active=active,
        fabric_state=_text(_find(gpu, "fabric/state")),
        fabric_status=_text(_find(gpu, "fabric/status")),
    )


def _any_yes(*values: str | None) -> bool | None:
    answers = [_yes(v) for v in values]
    if any(answers):
        return True
    return False if any(a is False for a in answers) else None


def parse_xml(text: str, source: str = "nvidia-smi -q -x") -> SmiReport:
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as err:
        raise SmiParseError(f"{source}: not valid XML ({err})") from None
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"{source}: XML whose root is <{root.tag}>, not nvidia-smi's "
                            "<nvidia_smi_log>")
    return SmiReport(driver_version=_text(_find(root, "driver_version")),
                     cuda_version=_text(_find(root, "cuda_version")),
                     attached_gpus=_int(_find(root, "attached_gpus")),
                     gpus=[_gpu_from_xml(g) for g in root.findall("gpu")])


# ------------------------------------------------------------------------------ text (-q)

_GPU_HEADER = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
# A pasted command line: "user@host:~$ nvidia-smi -a", "$ nvidia-smi -q", "nvidia-smi -q".
_PROMPT = re.compile(r"^(\S+@\S+.*?[$#]\s|[$#]\s|nvidia-smi\b)")
_KEY_VALUE = re.compile(r"^(?P<key>[A-Za-z0-9][^:]*?)\s*:\s?(?P<value>.*)$")


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip()).lower()


class _TextGpu:
    """One GPU's lines as (section path, key, value), sections found by indentation."""

    def __init__(self, bus_id: str | None):
        self.bus_id = bus_id
        self.items: list[tuple[tuple[str, ...], str, str]] = []

    def get(self, section: str | None, key: str) -> str | None:
        for path, k, value in self.items:
            if k == key and (section is None or section in path):
                return value
        return None

    def all(self, section: str) -> list[tuple[tuple[str, ...], str, str]]:
        return [item for item in self.items if section in item[0]]


def _text_gpu(raw: _TextGpu) -> GpuHealth:
    def count(kind: str, scope: str) -> int | None:
        values = []
        for path, key, value in raw.all("ecc errors"):
            if scope not in path:
                continue
            # "SRAM Uncorrectable", "SRAM Uncorrectable Parity/SEC-DED", "DRAM Uncorrectable";
            # drivers before Ampere: "Single Bit"/"Double Bit" sections with a "Total" line.
            if re.match(rf"^(sram|dram) {kind}\b", key):
                values.append(_int(value))
            legacy = "single bit" if kind == "correctable" else "double bit"
            if key == "total" and legacy in path:
                values.append(_int(value))
        return _sum(values)

    reasons = raw.all("clocks event reasons") or raw.all("clocks throttle reasons")
    active = []
    for _, key, value in reasons:
        name = key.replace(" ", "_")
        if name in _THROTTLE_WORDS and _yes(value):
            active.append(name)
    return GpuHealth(
        bus_id=raw.bus_id,
        name=_text(raw.get(None, "product name")),
        uuid=_text(raw.get(None, "gpu uuid")),
        persistence=_yes(raw.get(None, "persistence mode")),
        mig=_yes(raw.get("mig mode", "current")),
        ecc_enabled=_yes(raw.get("ecc mode", "current")),
        volatile_correctable=count("correctable", "volatile"),
        volatile_uncorrectable=count("uncorrectable", "volatile"),
        aggregate_uncorrectable=count("uncorrectable", "aggregate"),
        retired_single_bit=_int(raw.get("retired pages", "single bit ecc")),
        retired_double_bit=_int(raw.get("retired pages", "double bit ecc")),
        retired_pending=_any_yes(raw.get("retired pages", "pending page blacklist"),
                                 raw.get("retired pages", "pending page retirement")),
        remap_correctable=_int(raw.get("remapped rows", "correctable error")),
        remap_uncorrectable=_int(raw.get("remapped rows", "uncorrectable error")),
        remap_pending=_yes(raw.get("remapped rows", "pending")),
        remap_failure=_yes(raw.get("remapped rows", "remapping failure occurred")),
        reset_required=_yes(raw.get("gpu reset status", "reset required")),
        drain_and_reset=_yes(raw.get("gpu reset status", "drain and reset recommended")),
        recovery_action=_text(raw.get(None, "gpu recovery action")),
        throttle_active=active,
        fabric_state=_text(raw.get("fabric", "state")),
        fabric_status=_text(raw.get("fabric", "status")),
    )


def parse_text(text: str, source: str = "nvidia-smi -q") -> SmiReport:
    """`nvidia-smi -q` as printed, or a piece of it: lines outside the report (a prompt, `[...]`,
    `...`) are skipped; a piece without its `GPU <bus id>` header is one GPU of unknown bus."""
    report = SmiReport()
    gpus: list[_TextGpu] = []
    current: _TextGpu | None = None
    stack: list[tuple[int, str]] = []    # (indent, section) of the open sections
    for line in text.expandtabs().splitlines():
        if not line.strip() or line.strip().startswith(("[...]", "...", "====")) \
                or _PROMPT.match(line.strip()):
            continue
        header = _GPU_HEADER.match(line.strip())
        if header and len(line) - len(line.lstrip()) == 0:
            current = _TextGpu(header["bus"])
            gpus.append(current)
            stack = []
            continue
        indent = len(line) - len(line.lstrip())
        match = _KEY_VALUE.match(line.strip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if match is None:
            if re.match(r"^[A-Za-z][\w .()/-]*$", line.strip()):
                stack.append((indent, _key(line)))   # a section title: its keys are deeper
            continue
        key, value = _key(match["key"]), match["value"].strip()
        if current is None:
            if key == "driver version":
                report.driver_version = _text(value)
                continue
            if key == "cuda version":
                report.cuda_version = _text(value)
                continue
            if key == "attached gpus":
                report.attached_gpus = _int(value)
                continue
            if key in ("timestamp",):
                continue
            current = _TextGpu(None)
            gpus.append(current)
        if not value and not match["value"]:
            stack.append((indent, key))          # "GPU Memory Power Readings :"-like titles
            continue
        current.items.append((tuple(s for _, s in stack), key, value))
    report.gpus = [_text_gpu(g) for g in gpus]
    if not report.gpus and report.driver_version is None:
        raise SmiParseError(f"{source}: no GPU and no driver version in it: not the output of "
                            "`nvidia-smi -q`")
    return report


def parse_smi(text: str, source: str = "nvidia-smi") -> SmiReport:
    """XML (`-q -x`) or text (`-q`), told apart by the first tag."""
    stripped = text.lstrip()
    if stripped.startswith("<?xml") or stripped.startswith("<nvidia_smi_log"):
        return parse_xml(text, source)
    return parse_text(text, source)
