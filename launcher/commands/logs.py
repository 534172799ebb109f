"""`launch logs RUN_ID [--node N] [-f]`: a run's node logs, wherever the run lives."""

from __future__ import annotations

import argparse
import sys
import time

from launcher.commands.detached import add_run_arguments, locate, read_json
from launcher.core.errors import LauncherError
from launcher.core.names import path_component

HELP = """\
Prints every node's log of a run (<node>/node.log: each line as `node/rank: text`, every line
the node printed), or one node's (--node). -f follows them as they grow until the run ends.
The run is found as `launch attach` finds it: this machine's runs folder, or where the flags
say it runs (-i INVENTORY, --cluster NAME, --slurm).
"""
MAX_LOG = 1 << 30


def register(sub) -> None:
    p = sub.add_parser("logs", help="print (or follow, -f) a run's node logs, wherever it runs",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--node", metavar="NODE", help="only this node's log")
    p.add_argument("-f", "--follow", action="store_true",
                   help="follow the logs as they grow, until the run ends")
    p.set_defaults(func=main)


def main(args) -> int:
    from launcher.backends.local.home import FolderHome
    from launcher.runs.console import pid_alive

    run = locate(args)
    home = run.home
    if home is None:
        record = read_json((run.folder / "launch.json").read_bytes())
        pid = record.get("pid")
        home = FolderHome(run.run_id, run.folder, "this machine",
                          lambda: pid_alive(pid) and not (run.folder / "summary.json").exists(),
                          lambda sig: "")
    plan = read_json(home.read("plan.json", 64 << 20))
    nodes = [str(n.get("name")) for n in plan.get("nodes", []) if isinstance(n, dict)]
    if args.node:
        if nodes and args.node not in nodes:
            raise LauncherError(f"--node {args.node}: run {run.run_id} has nodes "
                                f"{', '.join(nodes)}")
        nodes = [args.node]
    if not nodes:
        raise LauncherError(f"run {run.run_id} has no plan yet ({home.where}): its nodes are not "
                            "known; try again in a moment")
    names = [f"{path_component(n, 'node name')}/node.log" for n in nodes]
    if not args.follow:
        for name in names:
            data = home.read(name, MAX_LOG)
            sys.stdout.write((data or b"").decode(errors="replace"))
        sys.stdout.flush()
        return 0
    ended = lambda: home.alive() is False  # noqa: E731
    followers = {name: home.follow(name, 0, ended) for name in names}
    while followers:
        for name in list(followers):
            try:
                chunk = next(followers[name])
            except StopIteration:
                del followers[name]
                continue
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        time.sleep(0.05)
    return 0
