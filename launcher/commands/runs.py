"""`launch runs [--runs-dir DIR] [--json] [--stop RUN_ID]`: the runs in a runs folder."""

from __future__ import annotations

import argparse
import json
import math

from launcher.core.errors import LauncherError
from launcher.core.table import format_table, printable

HELP = """\
Lists the run folders in --runs-dir (default runs/), in the order they started, after a line
naming the folder it looked in, one line each: run id, recipe, backend
(local, ssh, slurm), nodes, status, when it started, how long it ran, steps, the last loss and
the held-out accuracy when known, and the goodput: the share of the wall time spent in steps
that were kept (summary.json `timeline`; '-' where a run folder does not say). A run is "running"
while its launch process lives; once it wrote its summary, the summary's status (succeeded,
failed, interrupted, stopped, preempted); "abandoned" when launch died without one (killed,
out of memory): its node agents die with launch, and any process of it still alive on this
machine is listed (found by the run's stamp, never by name). --stop RUN_ID ends those
processes. A run folder whose files are not what launch writes is listed as unreadable or
unknown, with the file and key that are wrong below the table; the other runs are listed as
usual. A run folder that is a symbolic link is listed as refused and not read.
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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _number(value: float | None, form: str) -> str:
    if value is None:
        return "-"
    return str(value) if not math.isfinite(value) else format(value, form)


def _row(s) -> tuple[str, ...]:
    status = s.status + (f", {len(s.leftover_pids)} process(es) left" if s.leftover_pids
                         else "") + (f" ({s.where})" if s.where else "")
    return (s.run_id, s.recipe or "-", s.backend or "-",
            "-" if s.nodes is None else str(s.nodes), status, s.started_at or "-",
            _duration(s.duration_s), "-" if s.steps is None else str(s.steps),
            _number(s.loss, ".4f"), _number(s.accuracy, ".2%"), _number(s.goodput, ".0%"))


def ask_detached(runs_dir: str, states: list, timeout: float = 10.0) -> None:
    """A detached run's state, asked where it lives (all at once, each bounded): running
    there, or ended (`launch fetch` brings its folder and summary here)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from launcher.commands.detached import recorded

    def ask(state) -> str:
        run = recorded(state.run_id, runs_dir)
        alive = run.home.alive()
        if alive is None:
            return "unknown"
        if alive:
            return "running"
        summary = run.home.read("summary.json", 1 << 20)
        try:
            return "ended: " + str(json.loads(summary or b"{}").get("status", "unknown"))
        except ValueError:
            return "ended"

    if not states:
        return
    pool = ThreadPoolExecutor(max_workers=min(16, len(states)))
    futures = {pool.submit(ask, s): s for s in states}
    done, _ = wait(futures, timeout=timeout)
    for future, state in futures.items():
        if future in done and future.exception() is None:
            state.status = f"detached, {future.result()}"
        else:
            state.status = "detached, not reachable now"
    pool.shutdown(wait=False, cancel_futures=True)


def main(args) -> int:
    from launcher.runs.leftovers import runs_in, stop

    states = runs_in(args.runs_dir)
    ask_detached(args.runs_dir, [s for s in states if s.status == "detached"])
    if args.stop:
        match = [s for s in states if s.run_id == args.stop]
        if not match:
            raise LauncherError(f"--stop {printable(args.stop)}: no run of that id in "
                                f"{args.runs_dir}/")
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
        print(json.dumps([s.to_json() for s in states], indent=2))
        return 0
    from pathlib import Path

    where = printable(str(Path(args.runs_dir).absolute()))
    if not states:
        print(f"no runs in {where}/ (a run made with --runs-dir DIR is listed by "
              "`launch runs --runs-dir DIR`)")
        return 0
    print(f"{len(states)} run(s) in {where}/, in the order they started (another folder: "
          "--runs-dir DIR)")
    print(format_table(("run", "recipe", "backend", "nodes", "status", "started", "duration",
                        "steps", "loss", "accuracy", "goodput"), [_row(s) for s in states]), end="")
    for s in states:
        if s.problem:
            print(f"{s.run_id}: {printable(s.problem)}")
    return 0
