"""Plain fixed-width tables for terminal output (no colour: output is read by tests and pipes)."""

from __future__ import annotations


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n"
                   for row in table)
