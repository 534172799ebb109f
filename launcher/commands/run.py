"""`launch run RECIPE [--nodes N] [--local | -i INVENTORY | --cluster NAME] [--dry-run]`,
and `launch run --resume RUN_ID` to continue a stopped run from its last checkpoint."""

from __future__ import annotations

import sys

from launcher.backends import LaunchOptions, add_where_arguments, backend_from_args, print_plan
from launcher.commands.common import grace_seconds, hang_seconds, port_number, restart_count
from launcher.errors import LauncherError
from launcher.recipe import Recipe, load_recipe, recipe_warnings
from launcher.runfolder import check_run_id, new_run_id


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a recipe on N nodes (this machine, an inventory's hosts, a cluster)",
        description="Turn a recipe into one torchrun command per node, start them, stream and "
        "keep every log, and stop all nodes when one fails (or restart, with --max-restarts). "
        "Without -i or --cluster the nodes run on this machine.",
    )
    p.add_argument("recipe", nargs="?",
                   help="recipe YAML, or the name of a bundled one (`launch recipes`); with "
                        "--resume, default: the recipe the run started with")
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
    p.add_argument("--resume", metavar="RUN_ID",
                   help="continue a failed or interrupted run from its last checkpoint, in its "
                        "run folder (a new attempt; earlier logs are kept)")
    p.set_defaults(func=main)


def with_overrides(recipe: Recipe, args) -> Recipe:
    """--max-restarts and --hang-timeout win over the recipe (argparse checked their range)."""
    update = {}
    if args.max_restarts is not None:
        update["restarts"] = args.max_restarts
    if args.hang_timeout is not None:
        update["hang_timeout_s"] = args.hang_timeout
    return recipe.model_copy(update=update) if update else recipe


def main(args) -> int:
    if args.json and not args.dry_run:
        raise LauncherError("--json prints the plan and goes with --dry-run")
    if args.exclude_bad and not args.gate:
        raise LauncherError("--exclude-bad leaves out the nodes the collective gate names: "
                            "give --gate too")
    point = None
    if args.resume:
        from launcher.resume import find_resume_point

        if args.run_id and args.run_id != args.resume:
            raise LauncherError(f"--resume {args.resume} continues that run in its folder; "
                                f"--run-id {args.run_id} would name another")
        point = find_resume_point(args.runs_dir, check_run_id(args.resume, "--resume"),
                                  args.recipe)
        recipe, run_id = point.recipe, args.resume
    elif args.recipe is None:
        raise LauncherError("launch run needs a recipe (a YAML file or a bundled name: `launch "
                            "recipes`), or --resume RUN_ID")
    else:
        recipe = load_recipe(args.recipe)
        run_id = check_run_id(args.run_id) if args.run_id else new_run_id(recipe.name)
    recipe = with_overrides(recipe, args)
    for warning in recipe_warnings(recipe):
        print(f"launch: warning: {warning}", file=sys.stderr)
    default_count = len(point.node_names) if point else recipe.nodes
    count = args.nodes if args.nodes is not None else default_count
    if count < 1:
        raise LauncherError(f"--nodes must be at least 1, got {count}")
    backend = backend_from_args(args, count)
    nodes = backend.nodes(count)
    # A real run plans inside backend.launch (over SSH after preflight, which reports every
    # host's problems at once); a dry run and a resume check need the plan now.
    plan = backend.plan(recipe, nodes, run_id, runs_dir=args.runs_dir,
                        rdzv_port=args.rdzv_port) if args.dry_run or point else None
    if point is not None:
        from launcher.resume import check_resume

        notes = check_resume(point, recipe, [n.name for n in nodes], plan.world_size,
                             checkpoint_must_be_here=backend.kind == "local")
        for note in notes:
            print(f"launch: {note}", file=sys.stderr)
    if args.dry_run:
        if args.gate:
            print("launch: --gate: a real run first runs the collective gate on "
                  f"{', '.join(n.name for n in nodes)}"
                  + (" and the inventory's spare hosts" if args.exclude_bad else ""),
                  file=sys.stderr)
        print_plan(plan, args.json)
        return 0
    from launcher.leftovers import abandoned_warnings

    for warning in abandoned_warnings(args.runs_dir):
        print(f"launch: warning: {warning}", file=sys.stderr)
    if args.gate:
        from launcher.check.gate import gate_before_run

        nodes = gate_before_run(backend, recipe, nodes, run_id=run_id, runs_dir=args.runs_dir,
                                exclude_bad=args.exclude_bad, grace_s=args.grace,
                                rdzv_port=args.rdzv_port)
    backend.launch(recipe, nodes, run_id,
                   LaunchOptions(args.runs_dir, args.grace, resume=point is not None),
                   rdzv_port=args.rdzv_port)
    return 0
