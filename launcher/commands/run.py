"""`launch run RECIPE (--local | -i INVENTORY) [--nodes N] [--dry-run [--json]]`."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from launcher.commands.common import add_ssh_arguments
from launcher.errors import LauncherError
from launcher.inventory import local_nodes
from launcher.plan import Placement, RunPlan, plan_run
from launcher.recipe import Recipe, check_recipe_for_hardware, load_recipe
from launcher.runfolder import RunFolder, check_run_id, new_run_id


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a recipe on N nodes (this machine with --local, or an inventory)",
        description="Turn a recipe into one torchrun command per node, start them, stream and "
        "keep every log, and stop all nodes when one fails.",
    )
    p.add_argument("recipe", help="recipe YAML (see recipes/)")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the recipe's `nodes`)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true",
                       help="run the N node agents on this machine (gloo on CPU, NCCL on GPUs)")
    where.add_argument("-i", "--inventory", help="Ansible YAML inventory; the first N hosts run")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (node, address, command, environment) and change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument("--run-id", help="name of the run (default: <recipe>-<date>-<time>-<hex>)")
    p.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs/)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping nodes (default 5)")
    p.add_argument("--rdzv-port", type=int,
                   help="with -i: rendezvous port on the head (default: the recipe's)")
    add_ssh_arguments(p)
    p.set_defaults(func=main)


def code_dir() -> str:
    """The folder holding train/ (a checkout, or site-packages for an installed wheel)."""
    here = Path(__file__).resolve().parent.parent.parent
    if (here / "train" / "main.py").exists():
        return str(here)
    import importlib.util

    spec = importlib.util.find_spec("train.main")
    if spec is None or spec.origin is None:
        raise LauncherError("cannot find the trainer (train/main.py); reinstall launch")
    return str(Path(spec.origin).parent.parent)


def plan_local(recipe: Recipe, count: int, run_id: str, runs_dir: str,
               gpus_total: int, cpus_total: int, port: int, program=None) -> RunPlan:
    """N node agents on this machine, GPUs split between them by CUDA_VISIBLE_DEVICES."""
    if gpus_total and gpus_total < count:
        raise LauncherError(
            f"--local --nodes {count} needs at least one GPU per node but this machine has "
            f"{gpus_total}; use --nodes {gpus_total}, or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to run on CPU with gloo"
        )
    per_node = gpus_total // count if gpus_total else 0
    nodes = [replace(n, gpus=per_node) for n in local_nodes(count)]
    check_recipe_for_hardware(recipe, [per_node] * count)
    root = Path(runs_dir).resolve() / run_id
    placements = {
        n.name: Placement(
            python=sys.executable, code_dir=code_dir(), run_dir=str(root / n.name),
            cwd=os.getcwd(), cpus=max(1, cpus_total // count),
            visible_gpus=tuple(range(i * per_node, (i + 1) * per_node)) if per_node else None,
        )
        for i, n in enumerate(nodes)
    }
    notes = (f"--local: rendezvous port {port} was free when planned (recipe port "
             f"{recipe.rendezvous.port} is for clusters)",)
    return plan_run(recipe, nodes, run_id, placements, rdzv_port=port, notes=notes,
                    program=program)


def execute_local(plan: RunPlan, runs_dir: str, grace_s: float = 5.0) -> dict:
    """Runs a local plan to the end; returns the summary or raises RunFailed."""
    from launcher.execute.local import LocalNodeProcess, reap_run
    from launcher.execute.runner import execute_plan

    folder = RunFolder.create(runs_dir, plan.run_id)
    procs = [LocalNodeProcess(cmd) for cmd in plan.nodes]
    return execute_plan(plan, folder, procs, grace_s=grace_s,
                        after=lambda: reap_run(plan.run_id))


def run_local(args, recipe: Recipe, count: int, run_id: str) -> int:
    from launcher.execute.local import free_port, local_gpu_count

    plan = plan_local(recipe, count, run_id, args.runs_dir, local_gpu_count(),
                      os.cpu_count() or 1, free_port())
    if args.dry_run:
        print(plan.dumps() if args.json else plan.render())
        return 0
    execute_local(plan, args.runs_dir, args.grace)
    return 0


def main(args) -> int:
    recipe = load_recipe(args.recipe)
    count = args.nodes if args.nodes is not None else recipe.nodes
    if count < 1:
        raise LauncherError(f"--nodes must be at least 1, got {count}")
    if args.json and not args.dry_run:
        raise LauncherError("--json prints the plan and goes with --dry-run")
    run_id = check_run_id(args.run_id) if args.run_id else new_run_id(recipe.name)
    if args.local:
        return run_local(args, recipe, count, run_id)
    if args.inventory:
        from launcher.commands.run_ssh import run_inventory

        return run_inventory(args, recipe, count, run_id)
    raise LauncherError(
        "say where to run: --local to run the nodes on this machine, or -i INVENTORY.yml for "
        "hosts over SSH (see inventory.example.yml)"
    )
