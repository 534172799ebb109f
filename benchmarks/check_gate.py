"""What `launch check` and its collective gate cost, and what they measure, on a lab cluster:
the health table alone, then `--collective` with every link free and with one host's link
capped with tc (the capped host must be named). Wall time of each command, the bus bandwidth
of the all-nodes all-reduce and of every pair the gate measured.

Needs root (it builds a lab of SSH hosts in network namespaces). Prints a table and writes
benchmarks/results/check_gate.json.

    .venv/bin/python benchmarks/check_gate.py [--hosts 3] [--cap 10mbit] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.core.table import format_table  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402


def launch(args: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - started, proc


def gate_figures(cwd: Path) -> dict:
    """The newest gate folder's numbers."""
    folder = max((cwd / "runs").glob("gate-*"), key=lambda p: p.stat().st_mtime)
    gate = json.loads((folder / "gate.json").read_text())
    results = gate["results"] or {}
    search = results.get("search") or {}
    return {"all_nodes_busbw_gbs": (results.get("all_nodes") or {}).get("busbw_gbs"),
            "pairs": search.get("pairs", []), "rounds": len(search.get("rounds", [])),
            "named": gate["bad"], "job_s": json.loads((folder / "summary.json").read_text())
            ["duration_s"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--cap", default="10mbit")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab.create(Path(tmp) / "lab", hosts=args.hosts)
        try:
            inventory = str(lab.inventory)
            capped = lab.hosts[1].name
            cases = [("check", [], None), ("check --collective", ["--collective"], None),
                     (f"check --collective, {capped} at {args.cap}", ["--collective"], capped)]
            for label, extra, cap in cases:
                for repeat in range(args.repeats):
                    if cap:
                        lab.cap(cap, args.cap)
                    seconds, proc = launch(["check", "-i", inventory, "--min-free-gb", "0",
                                            "--rdzv-port", str(29700 + len(records)), *extra],
                                           Path(tmp))
                    if cap:
                        lab.uncap(cap)
                    record = {"case": label, "repeat": repeat, "wall_s": round(seconds, 2),
                              "exit_code": proc.returncode}
                    if extra:
                        record.update(gate_figures(Path(tmp)))
                    records.append(record)
                    pairs = record.get("pairs") or []
                    rows.append((label, str(repeat), f"{seconds:.1f}", str(proc.returncode),
                                 "-" if not extra else f"{record['all_nodes_busbw_gbs']:.4g}",
                                 "-" if not pairs else
                                 f"{min(p['busbw_gbs'] for p in pairs):.4g}-"
                                 f"{max(p['busbw_gbs'] for p in pairs):.4g}",
                                 ", ".join(record.get("named") or []) or "-"))
        finally:
            lab.destroy()
    table = format_table(("case", "run", "wall s", "exit", "all-nodes GB/s", "pairs GB/s",
                          "named"), rows)
    print(table, end="")
    summary = {}
    for label, *_ in cases:
        walls = [r["wall_s"] for r in records if r["case"] == label]
        summary[label] = {"median_wall_s": statistics.median(walls)}
    out = REPO / "benchmarks/results/check_gate.json"
    out.write_text(json.dumps({"hosts": args.hosts, "cap": args.cap, "cpus": os.cpu_count(),
                               "load_avg": os.getloadavg(), "summary": summary,
                               "runs": records}, indent=2) + "\n")
    (out.with_suffix(".txt")).write_text(table)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
