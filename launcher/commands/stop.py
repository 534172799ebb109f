"""`launch stop RUN_ID`: stop a run wherever it runs; every node stopped, nothing left."""

from __future__ import annotations

import argparse
import os
import signal
import time

from launcher.commands.detached import add_run_arguments, locate, read_json
from launcher.core.errors import LauncherError

HELP = """\
Asks the run's controller (a detached run's, wherever it lives; or the `launch run` process of
an attached run on this machine) to stop the run: every node gets SIGTERM, then SIGKILL after
the run's --grace, every process of the run is reaped by its stamp, and the run ends with
status `stopped` (exit code 143), its logs, summary and report kept. Waits until the run has
ended (--no-wait: returns at once).
"""
WAIT_S = 300.0


def register(sub) -> None:
    p = sub.add_parser("stop", help="stop a run (detached or not): every node, nothing left",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--no-wait", action="store_true", help="return once the stop is asked")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be stopped and where; stop nothing")
    p.set_defaults(func=main)


def main(args) -> int:
    from launcher.backends.local.home import FolderHome
    from launcher.runs.console import pid_alive
    from launcher.runs.leftovers import is_launch

    run = locate(args, dry_run=args.dry_run)
    if args.dry_run:
        print(f"run {run.run_id}: would ask its controller on {run.where} to stop it (SIGTERM "
              "to every node, SIGKILL after the grace period); nothing sent (--dry-run)")
        return 0
    home = run.home
    if home is None:
        # An attached run: its launch process on this machine is its controller.
        record = read_json((run.folder / "launch.json").read_bytes())
        pid = record.get("pid")
        if (run.folder / "summary.json").exists() or not pid_alive(pid) or not is_launch(pid):
            raise LauncherError(f"run {run.run_id} is not running here (no summary.json "
                                f"missing and no launch process {pid} of it alive)")

        def send(sig: int) -> str:
            os.kill(pid, sig)
            return f"sent {signal.Signals(sig).name} to launch (pid {pid})"

        home = FolderHome(run.run_id, run.folder, f"this machine (launch, pid {pid})",
                          lambda: pid_alive(pid) and is_launch(pid), send)
    if home.alive() is False:
        raise LauncherError(f"run {run.run_id} is not running ({home.where}): nothing to stop")
    print(f"launch: {home.stop(signal.SIGTERM, by_user=True)}")
    if args.no_wait:
        return 0
    deadline = time.monotonic() + WAIT_S
    while home.alive() is not False and time.monotonic() < deadline:
        time.sleep(0.5)
    summary = read_json(home.read("summary.json", 16 << 20))
    status = summary.get("status", "unknown")
    print(f"launch: run {run.run_id} {status}" + (f": {summary['failure']['reason']}"
                                                  if isinstance(summary.get("failure"), dict)
                                                  else ""))
    return 0 if status == "stopped" else 1
