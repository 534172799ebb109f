"""`launch run RECIPE [--nodes N] [--local | -i INVENTORY | --cluster NAME] [--dry-run]`."""

from __future__ import annotations

import sys

from launcher.backends import LaunchOptions, add_where_arguments, backend_from_args, print_plan
from launcher.commands.common import grace_seconds, port_number
from launcher.errors import LauncherError
from launcher.recipe import load_recipe, recipe_warnings
from launcher.runfolder import check_run_id, new_run_id


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a recipe on N nodes (this machine, an inventory's hosts, a cluster)",
        description="Turn a recipe into one torchrun command per node, start them, stream and "
        "keep every log, and stop all nodes when one fails. Without -i or --cluster the nodes "
        "run on this machine.",
    )
    p.add_argument("recipe", help="recipe YAML, or the name of a bundled one (`launch recipes`)")
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
    p.set_defaults(func=main)


def main(args) -> int:
    if args.json and not args.dry_run:
        raise LauncherError("--json prints the plan and goes with --dry-run")
    if args.exclude_bad and not args.gate:
        raise LauncherError("--exclude-bad leaves out the nodes the collective gate names: "
                            "give --gate too")
    recipe = load_recipe(args.recipe)
    for warning in recipe_warnings(recipe):
        print(f"launch: warning: {warning}", file=sys.stderr)
    count = args.nodes if args.nodes is not None else recipe.nodes
    if count < 1:
        raise LauncherError(f"--nodes must be at least 1, got {count}")
    run_id = check_run_id(args.run_id) if args.run_id else new_run_id(recipe.name)
    backend = backend_from_args(args, count)
    nodes = backend.nodes(count)
    if args.dry_run:
        if args.gate:
            print("launch: --gate: a real run first runs the collective gate on "
                  f"{', '.join(n.name for n in nodes)}"
                  + (" and the inventory's spare hosts" if args.exclude_bad else ""),
                  file=sys.stderr)
        print_plan(backend.plan(recipe, nodes, run_id, runs_dir=args.runs_dir,
                                rdzv_port=args.rdzv_port), args.json)
        return 0
    from launcher.leftovers import abandoned_warnings

    for warning in abandoned_warnings(args.runs_dir):
        print(f"launch: warning: {warning}", file=sys.stderr)
    if args.gate:
        from launcher.check.gate import gate_before_run

        nodes = gate_before_run(backend, recipe, nodes, run_id=run_id, runs_dir=args.runs_dir,
                                exclude_bad=args.exclude_bad, grace_s=args.grace,
                                rdzv_port=args.rdzv_port)
    backend.launch(recipe, nodes, run_id, LaunchOptions(args.runs_dir, args.grace),
                   rdzv_port=args.rdzv_port)
    return 0
