"""`launch attach RUN_ID`: a detached run's terminal here, from where it is now to its end."""

from __future__ import annotations

import argparse

from launcher.commands.detached import add_run_arguments, locate
from launcher.core.errors import LauncherError
from launcher.runs.screen import SCREEN_ALL_NODES

HELP = """\
Shows a detached run (`launch run --detach`) as `launch run` would have: every line it printed
from its start, the live view, then what comes until it ends, and exits with the run's exit
code and its closing message. Ctrl-C only detaches: the run goes on, and `launch attach`
follows it again. Works from any machine that has the run's record (runs/RUN_ID/detached.json,
written when it was started) or the flags that say where it runs (-i INVENTORY or --cluster
NAME: the controller host's runs; --slurm: the run folder on the shared filesystem).
"""


def register(sub) -> None:
    p = sub.add_parser("attach", help="follow a detached run: its lines, live view and end",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--all-lines", action="store_true",
                   help="show every node's lines; above "
                        f"{SCREEN_ALL_NODES} nodes a run's terminal shows the head's lines, every "
                        "error and launch's own, the rest in the node logs only (as `launch run "
                        "--all-lines`)")
    p.set_defaults(func=main)


def main(args) -> int:
    from launcher.pipeline.handover import attach, finish

    run = locate(args)
    if not run.detached:
        raise LauncherError(f"run {run.run_id} is not detached: it ran (or runs) in the launch "
                            f"process that started it; its logs: launch logs {run.run_id}")
    end = attach(run.home, all_lines=args.all_lines)
    finish(run.home, end)
    return 0
