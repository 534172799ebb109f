"""How long `./scripts/demo` takes, as a user waits for it: the README's demo time.

Runs `./scripts/demo` (the bundled vit-tiny-local recipe, 2 local nodes, 15 epochs) --runs
times back to back, each into a run folder of its own, and records for each: the wall time
from start to the prompt, the CPU time the demo's processes used (all of them: launch, the
rendezvous store, both torchrun agents, both ranks), the run's own duration (summary.json), the
1-minute load average just before it started, and the machine's cores. The wall time depends
on what else the machine does; the CPU time hardly does, so wall / (CPU / cores) says how much
of the wait was other work's (1.0: the demo had the cores to itself).

    .venv/bin/python benchmarks/demo_time.py [--runs 2]

Prints a table, writes benchmarks/results/demo_time.json and demo_time.txt. Needs the venv
made already (./scripts/demo makes it the first time; that first run's install is not timed
here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(runs_dir: Path, run_id: str) -> dict:
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu_s(), time.monotonic()
    proc = subprocess.run([str(REPO / "scripts" / "demo"), "--run-id", run_id, "--runs-dir",
                           str(runs_dir)], cwd=REPO, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall, cpu = time.monotonic() - t0, children_cpu_s() - cpu0
    if proc.returncode != 0:
        sys.exit(f"the demo failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    summary = json.loads((runs_dir / run_id / "summary.json").read_text())
    return {"run_id": run_id, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "run_duration_s": summary.get("duration_s"), "load1_before": round(load, 2),
            "eval_accuracy": summary.get("eval_accuracy"),
            "contention": round(wall / (cpu / (os.cpu_count() or 1)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="demo-time-") as tmp:
        for i in range(args.runs):
            rows.append(one_run(Path(tmp), f"demo-time-{i + 1}"))
            print(json.dumps(rows[-1]), flush=True)
    header = ("run", "wall s", "CPU s", "run's duration s", "load before", "wall/(CPU/cores)",
              "accuracy")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    lines += [" | ".join(str(v) for v in (r["run_id"], r["wall_s"], r["cpu_s"],
                                         r["run_duration_s"], r["load1_before"],
                                         r["contention"], r["eval_accuracy"])) for r in rows]
    table = "\n".join(lines) + "\n"
    print(table)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "cores": os.cpu_count(), "runs": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "demo_time.json").write_text(json.dumps(doc, indent=2) + "\n")
    (OUT / "demo_time.txt").write_text(table)


if __name__ == "__main__":
    main()
