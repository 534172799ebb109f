"""What report.html costs at the end of a run: the time `launch` spends writing the run report
(report.json and report.md, then the page with its plots), each measured in a fresh Python
process as at the end of `launch run` (matplotlib is imported there for the first time).

Variants per run folder, each the median of --repeats fresh processes:
    text      build_report + report.json + report.md (what every run paid before the page)
    page      report.html alone, after the text (matplotlib's import included)
    total     both: write_run_report as `launch run` calls it

The run folders are the real runs tests/report/data/runs/ keeps (the demo run among them:
the bundled vit-tiny-local recipe, 330 steps on 2 local nodes), copied to a temporary folder.
Run it under the CPU lock (the machine is shared):

    flock /work/cpu.lock .venv/bin/python benchmarks/report_page.py [--repeats 5] [RUN ...]

Prints a table, writes benchmarks/results/report_page.json and report_page.txt.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "tests/report/data/runs"

# One measurement, in a fresh interpreter: the same calls write_run_report makes, timed apart.
PROBE = """
import json, sys, time
t0 = time.perf_counter()
from launcher.report.build import REPORT_JSON, REPORT_MD, build_report, render_markdown
from launcher.report.html import write_report_html
from pathlib import Path
run_dir = Path(sys.argv[1])
report = build_report(run_dir)
markdown = render_markdown(report)
(run_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\\n")
(run_dir / REPORT_MD).write_text(markdown)
t1 = time.perf_counter()
path = write_report_html(run_dir, report, markdown)
t2 = time.perf_counter()
print(json.dumps({"text": t1 - t0, "page": t2 - t1, "total": t2 - t0,
                  "bytes": path.stat().st_size}))
"""


def measure(run_dir: Path, repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", PROBE, str(run_dir)], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
        samples.append(json.loads(out))
    return {key: round(statistics.median(s[key] for s in samples), 3)
            for key in ("text", "page", "total")} | {"bytes": samples[-1]["bytes"],
                                                     "repeats": repeats}


def arguments(doc: str, out: str):
    """The command line report_page.py and report_retime.py share: run folders, repeats,
    the JSON's path."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run folders (default: every run in "
                                          "tests/report/data/runs)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(REPO / out))
    return p.parse_args()


def each_run(runs: list[str], measure, repeats: int) -> dict:
    """measure(a copy of the run folder, repeats) for every run folder given (default: the
    report tests' runs), each copied first: a report written there changes nothing kept."""
    folders = [Path(r) for r in runs] or sorted(d for d in RUNS.iterdir() if d.is_dir())
    results = {}
    with tempfile.TemporaryDirectory(prefix="report-bench-") as tmp:
        for folder in folders:
            copy = Path(tmp) / folder.name
            shutil.copytree(folder, copy)
            results[folder.name] = measure(copy, repeats)
    return results


def write(out: str, results: dict, repeats: int, lines: list[str]) -> None:
    """The table printed, and kept beside the JSON (.txt)."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": results, "repeats": repeats,
                                "python": sys.version.split()[0]}, indent=2) + "\n")
    path.with_suffix(".txt").write_text(text)


def main() -> int:
    args = arguments(__doc__, "benchmarks/results/report_page.json")
    results = each_run(args.runs, measure, args.repeats)
    lines = [f"{'run':<14} {'text (s)':>9} {'page (s)':>9} {'total (s)':>10} "
             f"{'page/text':>10} {'page KB':>8}"]
    for name, r in results.items():
        lines.append(f"{name:<14} {r['text']:>9.3f} {r['page']:>9.3f} {r['total']:>10.3f} "
                     f"{r['page'] / r['text']:>10.1f} {r['bytes'] / 1024:>8.0f}")
    lines.append(f"median of {args.repeats} fresh processes each; page includes importing "
                 "matplotlib, as at the end of `launch run`")
    write(args.out, results, args.repeats, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
