"""`launch runs [--runs-dir DIR] [--json] [--stop RUN_ID]`: the runs in a runs folder."""

from __future__ import annotations

import argparse
import json

from launcher.errors import LauncherError
from launcher.table import format_table

HELP = """\
Lists the run folders in --runs-dir (default runs/): run id, status, when it started, launch's
pid. A run is "running" while its launch process lives, "succeeded"/"failed" once it wrote its
summary, and "abandoned" when launch died without one (killed, out of memory): its node agents
die with launch, and any process of it still alive on this machine is listed (found by the
run's stamp, never by name). --stop RUN_ID ends those processes.
"""


def register(sub) -> None:
    p = sub.add_parser("runs", help="list runs (running, finished, abandoned) and leftovers",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-dir", default="runs", help="where run folders are (default: runs/)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--stop", metavar="RUN_ID",
                   help="end what an abandoned run left running on this machine")
    p.add_argument("--dry-run", action="store_true",
                   help="with --stop: name the processes it would end; end none")
    p.set_defaults(func=main)


def main(args) -> int:
    from launcher.leftovers import runs_in, stop

    states = runs_in(args.runs_dir)
    if args.stop:
        match = [s for s in states if s.run_id == args.stop]
        if not match:
            raise LauncherError(f"--stop {args.stop}: no run of that id in {args.runs_dir}/")
        state = match[0]
        if state.status == "running":
            raise LauncherError(f"run {state.run_id} is still supervised by launch (pid "
                                f"{state.launch_pid}): stop that launch (Ctrl-C) instead")
        if args.dry_run:
            pids = state.leftover_pids
            print(f"run {state.run_id}: would stop {len(pids)} process(es)"
                  + (f" ({', '.join(map(str, pids))})" if pids else "") + " (--dry-run)")
            return 0
        sent = stop(state)
        print(f"run {state.run_id}: stopped {len(sent)} process(es)"
              + (f" ({', '.join(map(str, sent))})" if sent else ""))
        return 0
    if args.json:
        print(json.dumps([{"run_id": s.run_id, "folder": str(s.folder), "status": s.status,
                           "launch_pid": s.launch_pid, "started_at": s.started_at,
                           "leftover_pids": s.leftover_pids} for s in states], indent=2))
        return 0
    if not states:
        print(f"no runs in {args.runs_dir}/")
        return 0
    rows = [(s.run_id, s.status + (f", {len(s.leftover_pids)} process(es) left"
                                   if s.leftover_pids else ""),
             s.started_at or "?", str(s.launch_pid or "?")) for s in states]
    print(format_table(("run", "status", "started", "launch pid"), rows), end="")
    return 0
