"""`launch run -i INVENTORY`: preflight, ship, start over SSH, stream, fetch, summarize."""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path

from launcher.commands.run import code_dir as code_dir_path
from launcher.errors import LauncherError
from launcher.execute.ssh import (SshNodeProcess, code_files, content_hash, fetch_tree,
                                  in_parallel, ship)
from launcher.inventory import Node, load_inventory, select_nodes
from launcher.plan import Placement, RunPlan, plan_run
from launcher.preflight import NodeFacts, close_all, preflight
from launcher.recipe import Recipe
from launcher.runfolder import RunFolder
from launcher.ssh import SshOptions


def node_run_dir(node: Node, run_id: str) -> str:
    """`launch_run_root` (default .launch/runs, relative to the SSH login directory, so the
    plan needs no knowledge of the node's $HOME) / run id / node name. The node name is in
    the path so that hosts sharing a file system (NFS homes, the lab) never write into each
    other's folders."""
    return posixpath.join(node.run_root, run_id, node.name)


def plan_inventory(recipe: Recipe, nodes: list[Node], run_id: str,
                   facts: dict[str, NodeFacts] | None = None, *, rdzv_port: int | None = None,
                   program=None) -> RunPlan:
    """The plan for hosts over SSH. Without facts (a dry run connects to nothing) the GPU
    count comes from the inventory and interface/cores are left for preflight to find."""
    notes = []
    if facts:
        nodes = [replace(n, gpus=facts[n.name].gpus,
                         interface=n.interface or facts[n.name].interface) for n in nodes]
    else:
        notes.append("dry run: no connection made; preflight fills in each node's network "
                     "interface (GLOO/NCCL_SOCKET_IFNAME), cores (OMP_NUM_THREADS), GPUs and "
                     "the settings in /etc/launch/nccl.env that `launch setup` writes on EFA "
                     "nodes")
    notes.append("each node runs in its own folder (cwd); paths in its command are relative")
    placements = {
        n.name: Placement(python=n.python, code_dir="code", run_dir=".",
                          cwd=node_run_dir(n, run_id),
                          cpus=n.cpus or (facts[n.name].cpus if facts else None),
                          # launch_env_file (from `launch setup`); the recipe's env wins.
                          extra_env=facts[n.name].env if facts else {})
        for n in nodes
    }
    return plan_run(recipe, nodes, run_id, placements, rdzv_port=rdzv_port, notes=tuple(notes),
                    program=program)


def execute_inventory(plan: RunPlan, nodes: list[Node], conns: dict, options: SshOptions,
                      runs_dir: str, recipe_file: str | None, grace_s: float = 5.0,
                      display=None) -> dict:
    """Ship, run and collect a planned run on open connections; returns the summary."""
    from launcher.execute.runner import execute_plan

    by_name = {n.name: n for n in nodes}
    commands = {c.name: c for c in plan.nodes}
    code_dir = Path(code_dir_path())
    files = code_files(code_dir)
    local_hash = content_hash(code_dir, files)
    folder = RunFolder.create(runs_dir, plan.run_id)

    def ship_one(name: str) -> str:
        return ship(conns[name], by_name[name], commands[name].cwd, code_dir, files,
                    Path(recipe_file) if recipe_file else None)

    shipped = in_parallel(ship_one, list(commands))
    problems = [f"host {n}: copying the code failed: {r}" for n, r in shipped.items()
                if isinstance(r, Exception)]
    problems += [f"host {n}: the code on the node hashes to {r[:12] or '(nothing)'}, "
                 f"launch's copy to {local_hash[:12]}"
                 for n, r in shipped.items() if not isinstance(r, Exception) and r != local_hash]
    if problems:
        raise LauncherError(f"nothing was started (run folder {folder.root}):\n  "
                            + "\n  ".join(problems))
    # Every node provably runs the same code: the hash each node computed is this one.
    folder.write_json("code.json", {"sha256": local_hash, "files": files})

    procs = [SshNodeProcess(commands[n.name], n, conns[n.name], options) for n in nodes]

    def collect() -> None:
        def fetch(name: str):
            return fetch_tree(conns[name], commands[name].cwd, folder.node_dir(name))

        for name, result in in_parallel(fetch, list(commands)).items():
            if isinstance(result, Exception):
                print(f"launch: warning: {result}")

    return execute_plan(plan, folder, procs, after=collect, grace_s=grace_s, display=display)


def launch_on_inventory(recipe: Recipe, nodes: list[Node], run_id: str, runs_dir: str,
                        options: SshOptions, *, rdzv_port: int | None = None, program=None,
                        grace_s: float = 5.0, recipe_file: str | None = None,
                        display=None) -> dict:
    """Preflight, plan with the nodes' facts, ship, run, collect: the whole SSH path (also
    used by `launch bench -i` with its own program). Returns the run's summary."""
    port = rdzv_port or recipe.rendezvous.port
    conns, facts = preflight(nodes, recipe, options, port)
    try:
        plan = plan_inventory(recipe, nodes, run_id, facts, rdzv_port=port, program=program)
        return execute_inventory(plan, nodes, conns, options, runs_dir, recipe_file, grace_s,
                                 display=display)
    finally:
        close_all(conns)


def run_inventory(args, recipe: Recipe, count: int, run_id: str) -> int:
    nodes = select_nodes(load_inventory(args.inventory), count, args.inventory)
    if args.dry_run:
        plan = plan_inventory(recipe, nodes, run_id, rdzv_port=args.rdzv_port)
        print(plan.dumps() if args.json else plan.render())
        return 0
    options = SshOptions.from_args(args)
    launch_on_inventory(recipe, nodes, run_id, args.runs_dir, options,
                        rdzv_port=args.rdzv_port, grace_s=args.grace, recipe_file=recipe.source)
    return 0
