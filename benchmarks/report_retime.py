"""What the launch that followed a handed-over run (a Slurm run, launcher/pipeline/handover.py
report_again) spends writing the report again with its amended timeline (issue 39): the whole
report written again (write_run_report, what it did before) against only the timeline's parts
drawn again (launcher/report/retime.py rewrite_timeline). Each is measured in a fresh Python
process that has imported what `launch run` has by then, nothing of the report's writing,
alternately, each time on the report as the controller wrote it.

For each run folder: its summary gets a controller's timeline, the report is written (the
controller's), then the summary's timeline is amended as the follower amends it
(launcher/runs/timeline.py handed_over); each measurement starts from that state.

The run folders are the real runs tests/report/data/runs/ keeps (the demo run: the bundled
vit-tiny-local recipe, 330 steps on 2 local nodes), copied to a temporary folder. Run it under
the CPU lock (the machine is shared):

    flock /work/cpu.lock .venv/bin/python benchmarks/report_retime.py [--repeats 5] [RUN ...]

Prints a table, writes benchmarks/results/report_retime.json and report_retime.txt.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from report_page import REPO, arguments, each_run, write  # beside this file

REPORT = ("report.json", "report.md", "report.html", "summary.json")

# The report as the controller writes it, then the summary as the follower amends it.
SETUP = """
import json, sys
from pathlib import Path
from launcher.report.build import write_run_report
from launcher.runs.timeline import FOLLOWING, JOB, Timeline, handed_over

class Clock:
    def __init__(self, now):
        self.now = now
    def __call__(self):
        return self.now

run = Path(sys.argv[1])
path = run / "summary.json"
summary = json.loads(path.read_text())
clock = Clock(5000.0)
inner = Timeline(start=4999.0, clock=clock)
inner.begin(JOB)
for step in range(1, 21):
    clock.now += 0.5
    inner.line("node0", "0", f"LAUNCH_STEP step={step} loss=0.5")
inner.begin("report")
clock.now += 3.1
theirs = inner.to_json()
path.write_text(json.dumps({**summary, "timeline": theirs}))
write_run_report(run)
clock = Clock(100.0)
own = Timeline(start=99.0, clock=clock)
own.begin("hand-over")
clock.now += 0.7
own.begin(FOLLOWING)
clock.now += theirs["wall_s"] + 6.0
own.begin("report")
path.write_text(json.dumps({**summary, "timeline": handed_over(own, theirs)}))
"""

# One measurement, in a fresh interpreter that has imported what `launch run` has by then
# (the CLI, its run command, the hand-over): the import and the call, as report_again pays them.
PROBE = """
import json, sys, time
import launcher.cli, launcher.commands.run, launcher.pipeline.handover
t0 = time.perf_counter()
if sys.argv[2] == "whole":
    from launcher.report.build import write_run_report as write
else:
    from launcher.report.retime import rewrite_timeline as write
t1 = time.perf_counter()
write(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "write": t2 - t1, "total": t2 - t0}))
"""
VARIANTS = ("whole", "retime")


def python(*args: str) -> str:
    return subprocess.run([sys.executable, "-c", *args], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout


def measure(run_dir: Path, repeats: int) -> dict:
    python(SETUP, str(run_dir))
    kept = {name: (run_dir / name).read_bytes() for name in REPORT}
    samples: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:       # alternately: the machine's noise weighs on both
            for name, data in kept.items():
                (run_dir / name).write_bytes(data)
            samples[variant].append(json.loads(python(PROBE, str(run_dir), variant)))
    out = {v: {key: round(statistics.median(s[key] for s in samples[v]), 3)
               for key in ("import", "write", "total")} for v in VARIANTS}
    out["ratio"] = round(out["whole"]["total"] / out["retime"]["total"], 1)
    return out


def main() -> int:
    args = arguments(__doc__, "benchmarks/results/report_retime.json")
    results = each_run(args.runs, measure, args.repeats)
    lines = [f"{'run':<14} {'whole (s)':>10} {'retime (s)':>11} {'of which import':>16} "
             f"{'whole/retime':>13}"]
    for name, r in results.items():
        lines.append(f"{name:<14} {r['whole']['total']:>10.3f} {r['retime']['total']:>11.3f} "
                     f"{r['retime']['import']:>16.3f} {r['ratio']:>13.1f}")
    lines.append(f"median of {args.repeats} fresh processes each, alternately; import and "
                 "write, as report_again pays them after `launch run`'s own imports")
    write(args.out, results, args.repeats, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
