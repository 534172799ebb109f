"""`launch fetch RUN_ID`: a detached run's folder copied to this machine's runs folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.commands.detached import add_run_arguments, locate
from launcher.core.errors import LauncherError

HELP = """\
Copies the run folder of a detached run from where it lives (the controller host over SSH)
into this machine's runs folder (runs/RUN_ID/: logs, summary, plan, metrics, node folders), and
writes its report here again (report.md/.json/.html), so that `launch report`, `launch runs`
and `launch compare` read it as any run. A run on this machine or on a Slurm cluster's shared
filesystem is there already. Fetching again brings what changed since.
"""


def register(sub) -> None:
    p = sub.add_parser("fetch", help="copy a detached run's folder here (logs, summary, report)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="say where it would be fetched from; copy nothing")
    p.set_defaults(func=main)


def main(args) -> int:
    run = locate(args, dry_run=args.dry_run)
    if run.home is None and run.folder is not None:
        print(f"run {run.run_id}: its folder is here already ({run.folder})")
        return 0
    dest = Path(args.runs_dir).resolve() / run.run_id
    if args.dry_run:
        print(f"run {run.run_id}: would copy its folder from {run.where} into {dest}; "
              "nothing copied (--dry-run)")
        return 0
    count = run.home.fetch(dest)
    if count == 0 and not (dest / "summary.json").exists() and run.home.alive() is False:
        raise LauncherError(f"run {run.run_id}: nothing fetched from {run.home.where}")
    try:
        from launcher.report.build import write_run_report

        if (dest / "summary.json").exists():
            write_run_report(dest)
    except Exception as err:  # noqa: BLE001 (the files are here; the report can be retried)
        print(f"launch: warning: no run report ({type(err).__name__}: {err}); "
              f"`launch report {dest}` retries it")
    print(f"run {run.run_id}: {count} file(s) fetched from {run.home.where} into {dest}"
          + ("" if run.home.alive() is False else " (the run is still going: fetch again later)"))
    return 0
