"""Write results in nccl-tests' own table layout, so that `launch bench` output reads like
`all_reduce_perf` output and `parse_nccl_tests` reads it back.

Widths and number formats follow nccl-tests' src/util.cu: a `%12li  %12li  %8s  %6s  %6s`
preamble, then `  %7s  %6s  %6s  %6g` per placement, the floats squeezed into their width by
dropping decimals as they grow.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.nccl.busbw import TYPE_SIZES, algo_bandwidth, bus_bandwidth, element_count
from launcher.nccl.nccl_tests import Measurement, RankDevice, ResultRow

_COLUMNS = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s "


def measured_row(collective: str, nranks: int, *, size: int, type: str, redop: str = "sum",
                 root: int = -1, out_of_place: tuple[float, int | None] | None,
                 in_place: tuple[float, int | None] | None) -> ResultRow:
    """A row from measured (seconds, wrong elements) pairs; wrong None prints `N/A`.

    `size` is the larger buffer in bytes, as nccl-tests counts it; the count column and both
    bandwidths are derived from it the way nccl-tests derives them.
    """

    def measure(timing: tuple[float, int | None] | None) -> Measurement | None:
        if timing is None:
            return None
        seconds, wrong = timing
        return Measurement(
            time_us=seconds * 1e6,
            algbw=algo_bandwidth(size, seconds),
            busbw=bus_bandwidth(collective, size, seconds, nranks),
            wrong=wrong,
        )

    return ResultRow(
        size=size,
        count=element_count(collective, size, TYPE_SIZES[type], nranks),
        type=type, redop=redop, root=root,
        out_of_place=measure(out_of_place), in_place=measure(in_place),
    )


def format_float(value: float | None, width: int) -> str:
    """A float in `width` characters the way nccl-tests' getFloatStr does it: two decimals while
    they fit, then one, then none, then exponent notation."""
    if value is None:
        return "N/A".rjust(width)
    digits = len(str(int(value))) if value >= 1 else 0
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    if digits < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def format_row(row: ResultRow) -> str:
    """One data line, without a newline."""
    redop = row.redop if row.redop is not None else "none"
    root = row.root if row.root is not None else -1
    line = f"{row.size:12d}  {row.count:12d}  {row.type:>8}  {redop:>6}  {root:6d}"
    for side in (row.out_of_place, row.in_place):
        if side is None:
            line += " " * 32  # nccl-tests' blank body for a placement it did not run
            continue
        # nccl-tests prints `    N/A`, one column narrower than a count: kept for fidelity.
        wrong = "  N/A" if side.wrong is None else f"{float(side.wrong):6g}"
        line += (f"  {format_float(side.time_us, 7)}  {format_float(side.algbw, 6)}"
                 f"  {format_float(side.busbw, 6)}  {wrong}")
    return line


def header_lines(collective: str, devices: Sequence[RankDevice], *, min_bytes: int,
                 max_bytes: int, warmup_iters: int, iters: int, step_factor: int = 2,
                 nccl_version: str | None = None, comment: str | None = None) -> list[str]:
    """Everything above the first data row, for printing before the sweep has finished."""
    lines = [f"# {comment}"] if comment else []
    if nccl_version:
        lines.append(f"# NCCL version {nccl_version}")
    lines += [
        f"# Collective test starting: {collective}_perf",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: "
        f"{step_factor}(factor) warmup iters: {warmup_iters} iters: {iters} agg iters: 1 "
        f"validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [f"#  Rank {d.rank:2d} Group {d.group or 0:2d} Pid {d.pid or 0:6d} on {d.host:>10} "
              f"device {d.device:2d} [{d.bus_id}] {d.gpu}" for d in devices]
    lines += [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
        % ("", "", "", "", ""),
        _COLUMNS % ("size", "count", "type", "redop", "root",
                    "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"),
        _COLUMNS % ("(B)", "(elements)", "", "", "",
                    "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]
    return [line.rstrip() for line in lines]


def footer_lines(collective: str, rows: Sequence[ResultRow]) -> list[str]:
    """The summary under the table; the average is over every busbw printed, as nccl-tests'."""
    sides = [m for row in rows for m in row.measurements]
    wrong = sum(m.wrong for m in sides if m.wrong is not None)
    busbws = [m.busbw for m in sides if m.busbw is not None]
    average = sum(busbws) / len(busbws) if busbws else 0.0
    return [
        f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {average:g}",
        "#",
        f"# Collective test concluded: {collective}_perf",
    ]


def render_table(collective: str, devices: Sequence[RankDevice], rows: Sequence[ResultRow], *,
                 warmup_iters: int, iters: int, nccl_version: str | None = None,
                 comment: str | None = None) -> str:
    """A whole nccl-tests style report: header, one line per row, footer."""
    sizes = [row.size for row in rows] or [0]
    lines = header_lines(collective, devices, min_bytes=min(sizes), max_bytes=max(sizes),
                         warmup_iters=warmup_iters, iters=iters, nccl_version=nccl_version,
                         comment=comment)
    lines += [format_row(row) for row in rows]
    lines += footer_lines(collective, rows)
    return "\n".join(lines) + "\n"
