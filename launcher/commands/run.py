"""`launch run RECIPE [--nodes N] [--local | -i INVENTORY | --cluster NAME | --slurm]`,
`launch run SCRIPT.py [-- ARGS]` and `launch run -m MODULE [-- ARGS]` (your own code, the
current folder shipped, no recipe needed), and `launch run --resume RUN_ID` to continue a
stopped run."""

from __future__ import annotations

import sys

from pathlib import Path

from launcher.backends import backend_for, print_plan
from launcher.commands.where import add_where_arguments, where_from_args
from launcher.commands.common import (byte_size, grace_seconds, hang_seconds, nproc_count,
                                      port_number, recover_count, recover_seconds,
                                      restart_count)
from launcher.core.errors import LauncherError
from launcher.job.request import Recover, RunRequest
from launcher.job.recipe import Recipe, load_recipe, recipe_from_mapping, recipe_warnings
from launcher.job.spec import check_target, job_of, script_recipe
from launcher.runs.folder import check_run_id, new_run_id
from launcher.runs.screen import SCREEN_ALL_NODES

DEFAULT_WORKDIR_LIMIT = 1 << 30


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run your script, module or command (or a recipe) on N nodes: this "
                    "machine, an inventory's hosts, a cluster, Slurm",
        description="Start your own training script (SCRIPT.py, -m MODULE) or a recipe's job "
        "on every node: one torchrun per node with a c10d rendezvous (a recipe's `command:` "
        "brings its own launcher), the workdir shipped first; stream and keep every log, and "
        "stop all nodes when one fails (or restart, with --max-restarts). Without -i, "
        "--cluster or --slurm the nodes run on this machine. Arguments after `--` go to your "
        "script: launch run -i hosts.yml --nodes 2 train.py -- --epochs 3",
    )
    p.add_argument("recipe", nargs="?", metavar="RECIPE|SCRIPT.py",
                   help="a recipe YAML or the name of a bundled one (`launch recipes`), or "
                        "your script (a .py file in the workdir, default the current folder); "
                        "with --resume, default: the recipe the run started with")
    p.add_argument("-m", "--module", metavar="MODULE",
                   help="run `python -m MODULE` from the workdir instead of a script")
    p.add_argument("--workdir", metavar="DIR",
                   help="with a script or -m: the folder shipped to every node and run in "
                        "(default: the current folder; .gitignore and .launchignore honoured)")
    p.add_argument("--nproc-per-node", type=nproc_count, metavar="N",
                   help="with a script or -m: processes per node (default: the node's GPUs, "
                        "1 on a CPU node)")
    p.add_argument("--setup", action="append", metavar="COMMAND",
                   help="with a script or -m: a shell line run on every node in the workdir "
                        "before the job, again only when the workdir or the commands change "
                        "(repeatable)")
    p.add_argument("--workdir-limit", type=byte_size, default=DEFAULT_WORKDIR_LIMIT,
                   metavar="SIZE",
                   help="refuse to ship a workdir larger than this (default 1GB; a warning "
                        "names the largest files above 100MB)")
    p.add_argument("--env", action="append", metavar="KEY[=VALUE]",
                   help="a variable for every rank (and setup), over the recipe's env: "
                        "KEY=VALUE, or KEY for the value it has in launch's environment; "
                        "repeatable. Ranks get the node's login environment, the recipe's env "
                        "and these, nothing else of launch's environment (docs/jobs.md)")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the recipe's `nodes`)")
    add_where_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (node, address, command, environment) and change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument("--run-id", help="name of the run (default: <recipe>-<date>-<time>-<hex>)")
    p.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs/)")
    p.add_argument("--grace", type=grace_seconds, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping nodes (default 5)")
    p.add_argument("--gate", action="store_true",
                   help="before starting, run the collective gate (an all-reduce over the "
                        "nodes, then node pairs, against the recipe's gate.min_busbw_gbs) and "
                        "refuse to start (exit 3) naming a node that would hold the run back")
    p.add_argument("--bench", action="store_true",
                   help="before starting, measure the all-reduce bus bandwidth across the nodes "
                        "(`launch bench`'s sweep, in runs/RUN_ID-bench): the run's report "
                        "compares it with the link's peak")
    p.add_argument("--exclude-bad", action="store_true",
                   help="with --gate: measure every inventory host and run on the first "
                        "healthy ones instead of refusing")
    p.add_argument("--rdzv-port", type=port_number,
                   help="rendezvous port on the head (default: the recipe's; a free one on "
                        "this machine)")
    p.add_argument("--max-restarts", type=restart_count, metavar="N",
                   help="restart after up to N failures (a worker or node agent dying, a "
                        "hang), resuming from the last checkpoint (default: the recipe's "
                        "`restarts`; 0 stops at the first failure)")
    p.add_argument("--hang-timeout", type=hang_seconds, metavar="S",
                   help="seconds without a completed step before every rank's stack is "
                        "dumped and the run restarts or stops (default: the recipe's "
                        "`hang_timeout_s`, else max(300, 20x the median step))")
    p.add_argument("--recover", type=recover_count, nargs="?", const=2, metavar="N",
                   help="with --cluster (or an inventory `launch provision` or `launch lab` "
                        "wrote): when a node's machine is lost (EC2 says stopped, terminated "
                        "or reclaimed), put a new one in its place, set it up, check it and "
                        "resume from the newest checkpoint; up to N times (default 2)")
    p.add_argument("--recover-timeout", type=recover_seconds, metavar="S",
                   help="with --recover: seconds one replacement may take (provision, setup, "
                        "check, gate; default 1800)")
    p.add_argument("--resume", metavar="RUN_ID",
                   help="continue a failed or interrupted run from its last checkpoint, in its "
                        "run folder (a new attempt; earlier logs are kept)")
    p.add_argument("--detach", action="store_true",
                   help="hand the run to a controller where it lives (the head node, the "
                        "inventory's controller host, the Slurm job, or a session of its own "
                        "here) and return with its id: `launch attach RUN_ID` follows it, "
                        "`launch logs`, `launch stop` (docs/run.md#detached-runs)")
    p.add_argument("--all-lines", action="store_true",
                   help="show every node's lines on the terminal; above "
                        f"{SCREEN_ALL_NODES} nodes it shows the head's lines, every error and "
                        "launch's own (every line is in the node logs either way)")
    # What follows `--` on the command line: the script's or module's own arguments, taken
    # off before argparse reads the rest (launcher/cli.py).
    p.set_defaults(func=main, job_args=[])


def _recover(args) -> Recover | None:
    """--recover N [--recover-timeout S]; the timeout alone would do nothing, so it is refused."""
    if args.recover is None:
        if args.recover_timeout is not None:
            raise LauncherError(f"--recover-timeout {args.recover_timeout:g} is the time one "
                                "machine replacement may take: it goes with --recover")
        return None
    if args.recover_timeout is None:
        return Recover(args.recover)   # its default timeout (launcher/job/request.py)
    return Recover(args.recover, args.recover_timeout)


def with_overrides(recipe: Recipe, args) -> Recipe:
    """--max-restarts and --hang-timeout win over the recipe (argparse checked their range)."""
    update = {}
    if args.max_restarts is not None:
        update["restarts"] = args.max_restarts
    if args.hang_timeout is not None:
        update["hang_timeout_s"] = args.hang_timeout
    return recipe.model_copy(update=update) if update else recipe


def with_env(recipe: Recipe, args) -> Recipe:
    """--env KEY=VALUE / --env KEY as entries of the recipe's env (winning over its own),
    checked by the recipe's rule for names; the names are remembered, so that their values
    are shown masked (launcher/job/environment.py)."""
    import os

    from launcher.job.environment import env_flags

    values = env_flags(args.env, os.environ)
    if not values:
        return recipe
    return recipe.model_copy(update={
        "env": {**recipe.env, **values},
        "command_line_env": tuple(dict.fromkeys([*recipe.command_line_env, *values]))})


def _is_script(target: str | None) -> bool:
    return target is not None and target.endswith(".py")


def _command_line_recipe(args) -> Recipe:
    """The recipe `launch run SCRIPT.py` / `-m MODULE` stands for (`launch init --script`
    writes the same one); relative paths start from the current folder."""
    if args.module and args.recipe:
        raise LauncherError(f"-m {args.module} runs a module: give no script or recipe "
                            f"({args.recipe}) with it")
    data = script_recipe(script=None if args.module else args.recipe, module=args.module,
                         args=args.job_args, workdir=args.workdir or ".",
                         nproc_per_node=args.nproc_per_node, setup=args.setup or [])
    import yaml

    text = ("# The recipe `launch run` made from its command line (`launch init --script` "
            "writes the same)\n" + yaml.safe_dump(data, sort_keys=False))
    return recipe_from_mapping(data, "<command line>", Path.cwd(), text=text)


def _recipe_only(args, recipe_is_file: bool) -> None:
    """Flags that describe a job made from the command line do not go with a recipe."""
    given = [flag for flag, value in (("-- ARGS", args.job_args), ("--workdir", args.workdir),
                                      ("--nproc-per-node", args.nproc_per_node),
                                      ("--setup", args.setup)) if value]
    if given and recipe_is_file:
        raise LauncherError(f"{', '.join(given)}: with a recipe, set them in the recipe "
                            "(job.args, workdir, nproc_per_node, setup); these flags go with "
                            "SCRIPT.py or -m MODULE")


def scan(job, limit: int, runs_dir: str, dry_run: bool = False):
    """The workdir's manifest (launcher/workdir/scan.py), its warnings said on stderr, and for
    a real run what the ignore rules left out (a dry run lists it all). The runs folder is
    never shipped, even inside the workdir (`launch run train.py` from a project puts runs/
    there: every earlier run's logs would go to every node)."""
    if job.workdir is None:
        return None
    from launcher.workdir.scan import scan_workdir

    manifest = scan_workdir(Path(job.workdir), limit_bytes=limit, limit_hint="--workdir-limit",
                            leave_out={Path(runs_dir).resolve(): "the runs folder (--runs-dir)"})
    for warning in manifest.warnings:
        print(f"launch: warning: workdir: {warning}", file=sys.stderr)
    if manifest.secrets:
        print(f"launch: warning: workdir {job.workdir}: these files look like secrets and "
              f"will be shipped to every node: {', '.join(s.path for s in manifest.secrets)} (leave them out "
              "with a .launchignore line each)", file=sys.stderr)
    if not dry_run:
        from launcher.workdir.left_out import left_out_note

        note = left_out_note(manifest)
        if note:
            print(f"launch: {note}", file=sys.stderr)
    return manifest


def main(args) -> int:
    if args.json and not args.dry_run:
        raise LauncherError("--json prints the plan and goes with --dry-run")
    if args.exclude_bad and not args.gate:
        raise LauncherError("--exclude-bad leaves out the nodes the collective gate names: "
                            "give --gate too")
    point = None
    if args.resume:
        from launcher.runs.resume import find_resume_point

        if args.run_id and args.run_id != args.resume:
            raise LauncherError(f"--resume {args.resume} continues that run in its folder; "
                                f"--run-id {args.run_id} would name another")
        _recipe_only(args, True)
        point = find_resume_point(args.runs_dir, check_run_id(args.resume, "--resume"),
                                  args.recipe)
        recipe, run_id = point.recipe, args.resume
    elif args.recipe is None and not args.module:
        raise LauncherError("launch run needs your script (train.py), a module (-m pkg.train), "
                            "a recipe (a YAML file or a bundled name: `launch recipes`), or "
                            "--resume RUN_ID")
    else:
        if args.module or _is_script(args.recipe):
            recipe = _command_line_recipe(args)
        else:
            _recipe_only(args, True)
            recipe = load_recipe(args.recipe)
        run_id = check_run_id(args.run_id) if args.run_id else new_run_id(recipe.name)
    recipe = with_env(with_overrides(recipe, args), args)
    for warning in recipe_warnings(recipe):
        print(f"launch: warning: {warning}", file=sys.stderr)
    job = job_of(recipe)
    manifest = scan(job, args.workdir_limit, args.runs_dir, args.dry_run)
    check_target(job, manifest, recipe.source)
    default_count = len(point.node_names) if point else recipe.nodes
    count = args.nodes if args.nodes is not None else default_count
    if count < 1:
        raise LauncherError(f"--nodes must be at least 1, got {count}")
    backend = backend_for(where_from_args(args), count)
    request = RunRequest(recipe, run_id, count, job=job, workdir=manifest,
                         runs_dir=args.runs_dir, grace_s=args.grace, rdzv_port=args.rdzv_port,
                         resume=point is not None,
                         recover=_recover(args),
                         gate=args.gate, exclude_bad=args.exclude_bad, bench=args.bench,
                         detach=args.detach, all_lines=args.all_lines)
    from launcher.pipeline.run import check_supported

    check_supported(backend, request, args.detach)
    nodes = backend.nodes(count)
    if request.recover is not None:
        from launcher.pipeline.recover import fleet_source

        fleet_source(nodes)   # the run's own refusal, before anything starts (and on a dry run)
    # A real run plans in its pipeline (over SSH after preflight, which reports every host's
    # problems at once); a dry run and a resume check need the plan now.
    plan = backend.plan(request, nodes) if args.dry_run or point else None
    if point is not None:
        from launcher.runs.resume import check_resume

        notes = check_resume(point, recipe, [n.name for n in nodes], plan.world_size,
                             checkpoint_must_be_here=backend.capabilities.one_machine,
                             placed_later=backend.capabilities.placed_later)
        for note in notes:
            print(f"launch: {note}", file=sys.stderr)
    if args.dry_run:
        if args.bench:
            print(f"launch: --bench: a real run first measures the all-reduce bus bandwidth on "
                  f"{', '.join(n.name for n in nodes)} (runs/{run_id}-bench)", file=sys.stderr)
        if args.gate:
            print("launch: --gate: a real run first runs the collective gate on "
                  f"{', '.join(n.name for n in nodes)}"
                  + (" and the inventory's spare hosts" if args.exclude_bad else ""),
                  file=sys.stderr)
        if args.detach or not backend.capabilities.attached_here:
            from launcher.pipeline.handover import describe_hand_over

            for line in describe_hand_over(backend, request, nodes):
                print(f"launch: {line}", file=sys.stderr)
        print_plan(plan, args.json)
        return 0
    from launcher.runs.leftovers import abandoned_warnings

    for warning in abandoned_warnings(args.runs_dir):
        print(f"launch: warning: {warning}", file=sys.stderr)
    from launcher.pipeline.run import run
    from launcher.runs.timeline import Timeline, process_start

    # The run's wall time begins with this process (launcher/runs/timeline.py).
    run(backend, request, timeline=Timeline(process_start()))
    return 0
