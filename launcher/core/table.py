"""Plain fixed-width tables for terminal output (no colour: output is read by tests and pipes)."""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, Unicode line separators: an escape sequence from a file (a run
# folder's summary, a node's log) would otherwise reach the terminal and act there.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` with control characters shown escaped (\\x1b, \\n), as Python writes them."""
    def escape(m: re.Match) -> str:
        char = m.group()
        return char if keep_newlines and char == "\n" else repr(char)[1:-1]

    return _CONTROL.sub(escape, text)


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    table = [header, *[tuple(printable(cell) for cell in row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n"
                   for row in table)
