"""`launch fetch RUN_ID`: a detached run's folder copied to this machine's runs folder;
`--workdir`: what the run wrote in its nodes' job folders too (launcher/workdir/job_files.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.commands.detached import add_run_arguments, locate
from launcher.commands.where import where_from_args
from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.runs.screen import SCREEN_ALL_NODES
from launcher.workdir import job_files
from launcher.workdir.job_files import FOLDER
from launcher.workdir.scan import human_bytes

HELP = """\
Copies the run folder of a detached run from where it lives (the controller host over SSH)
into this machine's runs folder (runs/RUN_ID/: logs, summary, plan, metrics, node folders), and
writes its report here again (report.md/.json/.html), so that `launch report`, `launch runs`
and `launch compare` read it as any run. A run on this machine or on a Slurm cluster's shared
filesystem is there already. Fetching again brings what changed since.

--workdir also brings what the run wrote in each node's job folder (the folder its job ran in:
checkpoints, logs, outputs its script wrote in its working directory), for any run, attached or
detached, on every backend: into RUN_ID/workdir/NODE/ here. Only what the run wrote or changed
comes back, not the shipped files beside it. A run's job folders are kept on the nodes for the
newest 5 runs of a workdir (LAUNCH_JOB_FOLDERS_KEPT); fetch them before they go. The nodes are
reached as the run reached them (its plan.json, or its detached record); -i/--cluster say where
when the inventory moved.
"""


def register(sub) -> None:
    p = sub.add_parser("fetch", help="copy a detached run's folder here (logs, summary, report)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--workdir", action="store_true",
                   help="also copy what the run wrote in each node's job folder (its script's "
                        "checkpoints, logs, outputs) into RUN_ID/workdir/NODE/")
    p.add_argument("--dry-run", action="store_true",
                   help="say where it would be fetched from (with --workdir: what each node's "
                        "job folder holds that the run wrote); copy nothing")
    p.set_defaults(func=main)


def main(args) -> int:
    run = locate(args, dry_run=args.dry_run)
    if run.home is None and run.folder is not None:
        print(f"run {run.run_id}: its folder is here already ({run.folder})")
        return fetch_workdir(args, run, run.folder) if args.workdir else 0
    dest = Path(args.runs_dir).resolve() / run.run_id
    if args.dry_run:
        print(f"run {run.run_id}: would copy its folder from {run.where} into {dest}; "
              "nothing copied (--dry-run)")
        if args.workdir and (dest / "plan.json").exists():
            return fetch_workdir(args, run, dest)
        if args.workdir:
            print(f"run {run.run_id}: then what the run wrote in its nodes' job folders, into "
                  f"{dest / FOLDER}/NODE/ (its plan, which names them, is not here yet)")
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
    return fetch_workdir(args, run, dest) if args.workdir else 0


def fetch_workdir(args, run, run_dir: Path) -> int:
    """What the run wrote in its nodes' job folders, into run_dir/workdir/<node>/; 1 when a
    node's could not be read."""
    plan = _plan(run_dir)
    targets = job_files.targets(plan, run_dir / "plan.json")
    if not targets:
        print(f"run {run.run_id}: its job ran in no job folder of its own (no workdir was "
              "shipped, or it is launch's own workload): nothing more to fetch")
        return 0
    backend = _backend(args, run, plan, run_dir)
    dest = run_dir / FOLDER
    if not args.dry_run:
        safefile.make_dirs(dest, within=run_dir)
    found = backend.fetch_job_files(targets, dest, dry_run=args.dry_run)
    failed = 0
    # A line per node up to the screen's limit; beyond it the totals (every node's files are
    # in dest/NODE/), and every node that could not be read, whatever their number.
    shown = {n.node for n in found[:SCREEN_ALL_NODES]} if len(found) > SCREEN_ALL_NODES \
        else {n.node for n in found}
    for node in found:
        if node.error:
            failed += 1
            print(f"launch: {node.node}: its job folder {node.job_dir} could not be read: "
                  f"{node.error}", file=sys.stderr)
            continue
        if node.node not in shown:
            continue
        if args.dry_run:
            shown = ", ".join(rel for rel, _ in node.files[:5])
            more = f" and {len(node.files) - 5} more" if len(node.files) > 5 else ""
            print(f"  {job_files.describe(node)}: would copy into {dest / node.node}/"
                  + (f" ({shown}{more})" if shown else ""))
            continue
        print(f"  {job_files.describe(node)}: {node.copied} copied into {dest / node.node}/")
        if node.how != "record":
            print(f"    ({job_files.HOW[node.how]})")
        for why in node.skipped[:3]:
            print(f"    skipped {why}")
        if len(node.skipped) > 3:
            print(f"    skipped {len(node.skipped) - 3} more")
    read = [n for n in found if not n.error]
    if len(read) > len(shown):
        print(f"  {len(read)} node(s): {sum(len(n.files) for n in read)} file(s), "
              f"{human_bytes(sum(n.size for n in read))} written by the run"
              + ("" if args.dry_run else
                 f", {sum(n.copied for n in read)} copied into {dest}/NODE/"))
    if args.dry_run:
        print(f"run {run.run_id}: nothing copied (--dry-run)")
    return 1 if failed else 0


def _plan(run_dir: Path) -> dict:
    path = run_dir / "plan.json"
    try:
        plan = safefile.read_json(path, "plan.json", max_bytes=64 << 20, within=run_dir)
    except LauncherError as err:
        if getattr(err, "missing", False) or not path.exists():
            raise LauncherError(f"{path} is missing: the run ended before its nodes were "
                                "planned, so no job folder was made") from None
        raise
    if not isinstance(plan, dict):
        raise LauncherError(f"{path}: not a plan launch wrote")
    return plan


def _backend(args, run, plan: dict, run_dir: Path):
    """How the nodes are reached: the flags that say where (an inventory that moved), else
    the detached run's record, else how the run itself was made (plan.json)."""
    if where_from_args(args).given:
        from launcher.backends import backend_for

        return backend_for(where_from_args(args), 1, say=lambda _: None)
    if run.backend is not None:
        return run.backend
    name, settings = plan.get("backend"), plan.get("backend_settings")
    if not isinstance(name, str) or not isinstance(settings, dict):
        raise LauncherError(f"{run_dir / 'plan.json'} does not say how its nodes were reached "
                            "(a run of an older launch): name where it ran (-i INVENTORY, "
                            "--cluster NAME, --slurm or --local)")
    from launcher.backends import backend_named

    try:
        return backend_named(name, settings)
    except LauncherError as err:   # the inventory it read moved or went
        raise LauncherError(f"{err} (as {run_dir / 'plan.json'} names it): name where the "
                            "run's nodes are now (-i INVENTORY or --cluster NAME)") from None
    except (KeyError, TypeError, ValueError) as err:
        raise LauncherError(f"{run_dir / 'plan.json'}: its backend {name!r} cannot be made "
                            f"again ({err}): name where it ran (-i INVENTORY, --cluster NAME, "
                            "--slurm or --local)") from None
