"""The host x check table `launch check` prints, the evidence lines under it, and its JSON."""

from __future__ import annotations

from typing import Any

from launcher.check.health import FAIL, OK, SKIP, WARN, Check
from launcher.core.table import format_table

CELL = {OK: "ok", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}


def render(rows: list[tuple[str, dict[str, Check]]], verbose: bool = False) -> str:
    """rows: (host, checks by column). Evidence follows for every cell that is not ok (all
    cells with `verbose`), host by host."""
    if not rows:
        return "no host to check\n"
    columns = list(rows[0][1])
    for _, checks in rows[1:]:
        columns += [c for c in checks if c not in columns]
    table = format_table(("host", *columns),
                         [(host, *(CELL[checks[c].status] if c in checks else "-"
                                   for c in columns)) for host, checks in rows])
    lines = [table]
    shown = [(host, c) for host, checks in rows for c in checks.values()
             if verbose or c.status in (WARN, FAIL)]
    if shown:
        width = max(len(host) for host, _ in shown)
        name_width = max(len(c.name) for _, c in shown)
        lines.append("evidence:\n")
        for host, check in shown:
            lines.append(f"  {host.ljust(width)}  {check.name.ljust(name_width)}  "
                         f"{CELL[check.status].ljust(4)}  {check.evidence}\n")
    return "".join(lines)


def summary(rows: list[tuple[str, dict[str, Check]]]) -> str:
    failing = {host: [c.name for c in checks.values() if c.status == FAIL]
               for host, checks in rows}
    warned = sum(1 for _, checks in rows for c in checks.values() if c.status == WARN)
    bad = {h: names for h, names in failing.items() if names}
    if not bad:
        return (f"launch check: {len(rows)} host(s), no failed check"
                + (f" ({warned} warning(s))" if warned else ""))
    listed = "; ".join(f"{host}: {', '.join(names)}" for host, names in bad.items())
    return f"launch check: {len(bad)} of {len(rows)} host(s) failed a check ({listed})"


def to_json(rows: list[tuple[str, dict[str, Check]]], **extra: Any) -> dict[str, Any]:
    return {"hosts": [{"name": host, "checks": {n: c.to_json() for n, c in checks.items()},
                       "failed": [n for n, c in checks.items() if c.status == FAIL]}
                      for host, checks in rows],
            "failed_hosts": [host for host, checks in rows
                             if any(c.status == FAIL for c in checks.values())],
            **extra}
