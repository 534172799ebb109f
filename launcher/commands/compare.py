"""`launch compare RUN [RUN...] [--runs-dir DIR] [--json] [--html FILE]`: runs side by side."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launcher.commands.report import find_run_dir

HELP = """\
Puts runs side by side in one table: images/s, step time and its split into compute, data
wait and communication wait, the share of the step spent waiting on communication, bytes sent
per step, held-out accuracy, final loss, bus bandwidth against the link's peak, and the cost
where the nodes' instance type has a list price; every later run's figure with its ratio
against the first run (1.25x). Then the recipe keys whose values differ between the runs
(from each run folder's recipe.yml). --html FILE writes the same as a page with plots.
A RUN is a run folder or a run id in --runs-dir. Nothing in the run folders is changed.
"""


def register(sub) -> None:
    p = sub.add_parser("compare", help="runs side by side, with ratios against the first",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders or run ids")
    p.add_argument("--runs-dir", default="runs",
                   help="where to look for bare run ids (default: runs/)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a page")
    p.set_defaults(func=main)


def main(args) -> int:
    from launcher.report.compare import load_comparison, render_text, to_json

    comparison = load_comparison([find_run_dir(r, args.runs_dir) for r in args.runs])
    if args.html:
        from launcher.report.compare_html import write_compare_html

        path = write_compare_html(comparison, Path(args.html))
    print(json.dumps(to_json(comparison), indent=2) if args.json else render_text(comparison),
          end="\n" if args.json else "")
    if args.html:
        print(f"page: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0
