"""`launch report RUN_DIR [--bench DIR] [--json]`: write the run report again and print it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launcher.report.build import (REPORT_JSON, REPORT_MD, ReportError, checked_report,
                             render_markdown, write_run_report)
from launcher.report.html import REPORT_HTML

HELP = f"""\
Regenerates RUN_DIR/{REPORT_MD}, {REPORT_JSON} and {REPORT_HTML} (launch writes them after
every run, failed ones too) from the files in the run folder: per node the interconnect, NCCL
version, network and transports NCCL used, EFA expected against used; the measured bus
bandwidth against the link's peak; images/s and the share of step time spent waiting on
communication; warnings and what to change. Prints the report (warnings in red on a
terminal), or with --json report.json. {REPORT_HTML} is the same report as a page with plots
(loss, throughput, each rank's step split, communication share, bus bandwidth, restarts and
exits); it needs no network to open.

The bus bandwidth comes from RUN_DIR/bandwidth.json (a `launch bench` folder), from --bench, or
else from the newest bench among RUN_DIR's sibling run folders that ran on the same nodes.
"""


def register(sub) -> None:
    p = sub.add_parser("report", help="regenerate and print a run's report (report.md)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN", help="a run folder (runs/<run_id>) or a run id")
    p.add_argument("--runs-dir", default="runs",
                   help="where to look for a bare run id (default: runs/)")
    p.add_argument("--bench", metavar="BANDWIDTH_JSON",
                   help="quote this bench's bandwidth.json (or its run folder)")
    p.add_argument("--json", action="store_true", help="print report.json instead")
    p.add_argument("--dry-run", action="store_true",
                   help=f"print the report without writing {REPORT_MD} and {REPORT_JSON}")
    p.set_defaults(func=main)


def find_run_dir(run: str, runs_dir: str) -> Path:
    """A run folder as given, or a bare run id looked up in --runs-dir."""
    given = Path(run)
    if given.is_dir():
        return given
    by_id = Path(runs_dir) / run
    if "/" not in run and by_id.is_dir():
        return by_id
    raise ReportError(f"no run folder {run} here or in {runs_dir}/: pass runs/<run_id>, a run "
                      "id (with --runs-dir if the runs are elsewhere), or a folder path")


def main(args) -> int:
    bench = args.bench
    if bench and Path(bench).is_dir():
        bench = str(Path(bench) / "bandwidth.json")
    if bench and not Path(bench).is_file():
        raise ReportError(f"--bench {args.bench}: no bandwidth.json there; pass the run folder "
                          "of a `launch bench` or its bandwidth.json")
    make = checked_report if args.dry_run else write_run_report
    report = make(find_run_dir(args.run_dir, args.runs_dir), bench=bench)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_markdown(report, color=sys.stdout.isatty()), end="")
    return 0
