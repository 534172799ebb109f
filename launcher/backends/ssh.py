"""Hosts of an Ansible inventory over SSH (fabric): preflight, ship the code, start one
torchrun agent per host in its own session, stream, fetch each node's folder, summarize."""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path

from launcher.backends.base import (GroupResult, LaunchOptions, NodeResult, Program,
                                    in_parallel, trainer_code_dir)
from launcher.errors import LauncherError
from launcher.inventory import Node, load_inventory, select_nodes
from launcher.plan import Placement, RunPlan, plan_run
from launcher.recipe import Recipe
from launcher.ssh import SshOptions


def node_run_dir(node: Node, run_id: str) -> str:
    """`launch_run_root` (default .launch/runs, relative to the SSH login directory, so the
    plan needs no knowledge of the node's $HOME) / run id / node name. The node name is in
    the path so that hosts sharing a file system (NFS homes, the lab) never write into each
    other's folders."""
    return posixpath.join(node.run_root, run_id, node.name)


def plan_inventory(recipe: Recipe, nodes: list[Node], run_id: str,
                   facts: dict | None = None, *, rdzv_port: int | None = None,
                   program: Program | None = None) -> RunPlan:
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
                      launch: LaunchOptions, code: dict) -> dict:
    """Run and collect a planned run on open connections (the code is on the nodes already,
    checked by preflight); returns the summary."""
    from launcher.execute.remote_agent import SshNodeProcess, fetch_tree
    from launcher.execute.runner import execute_plan
    from launcher.runfolder import RunFolder

    commands = {c.name: c for c in plan.nodes}
    folder = RunFolder.for_launch(launch.runs_dir, plan.run_id, resume=launch.resume)
    # Every node provably runs the same code: the hash each node computed is this one.
    folder.write_json("code.json", code)
    procs = [SshNodeProcess(commands[n.name], n, conns[n.name], options, folder.stamp)
             for n in nodes]
    head = nodes[0]
    store = SshNodeProcess(plan.store, head, conns[head.name], options, folder.stamp,
                           label="store")

    by_proc = {p.name: p for p in procs}

    def collect() -> None:
        def fetch(name: str):
            # The node process's connection: opened again if it dropped during the run.
            return fetch_tree(by_proc[name].connection(), commands[name].cwd,
                              folder.node_dir(name))

        for name, result in in_parallel(fetch, list(commands)).items():
            if isinstance(result, Exception):
                print(f"launch: warning: {result}")
        for proc in procs:
            proc.close()

    return execute_plan(plan, folder, procs, after=collect, grace_s=launch.grace_s,
                        display=launch.display, store=store)


class SshBackend:
    kind = "ssh"

    def __init__(self, inventory: str | Path, options: SshOptions | None = None,
                 limit: str | None = None):
        self.inventory = str(inventory)
        self.options = options or SshOptions()
        self.limit = limit
        self.all_nodes = load_inventory(self.inventory, limit=limit)

    def describe(self, count: int) -> str:
        return f"{count} host(s) of {self.inventory} over SSH"

    def nodes(self, count: int | None) -> list[Node]:
        return select_nodes(self.all_nodes, len(self.all_nodes) if count is None else count,
                            self.inventory)

    def gpus(self, nodes: list[Node]) -> list[int]:
        from launcher.nccl.links import facts as catalog_facts

        out = []
        for node in nodes:
            row = catalog_facts(node.instance_type) if node.gpus is None else None
            out.append(node.gpus if node.gpus is not None else (row.gpu_count if row else 0))
        return out

    def plan(self, recipe: Recipe, nodes: list[Node], run_id: str, *, runs_dir: str = "runs",
             program: Program | None = None, rdzv_port: int | None = None) -> RunPlan:
        return plan_inventory(recipe, nodes, run_id, rdzv_port=rdzv_port, program=program)

    def launch(self, recipe: Recipe, nodes: list[Node], run_id: str, options: LaunchOptions,
               *, program: Program | None = None, rdzv_port: int | None = None) -> dict:
        """Preflight (the code shipped on the way), plan with the nodes' facts, run, collect."""
        from launcher.execute.remote_agent import code_files, content_hash
        from launcher.preflight import Shipment, close_all, preflight

        port = rdzv_port or recipe.rendezvous.port
        code_dir = trainer_code_dir()
        files = code_files(code_dir)
        recipe_file = Path(recipe.source) if Path(recipe.source).is_file() else None
        shipment = Shipment(code_dir, files, content_hash(code_dir, files),
                            lambda node: node_run_dir(node, run_id), recipe_file,
                            remove_on_failure=not options.resume)
        conns, facts = preflight(nodes, recipe, self.options, port, shipment)
        try:
            plan = plan_inventory(recipe, nodes, run_id, facts, rdzv_port=port, program=program)
            return execute_inventory(plan, nodes, conns, self.options, options,
                                     {"sha256": shipment.sha256, "files": files})
        finally:
            close_all(conns)

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        from launcher.ssh import connect, remote

        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]

        def one(node: Node) -> NodeResult:
            try:
                conn = connect(node, self.options)
            except LauncherError as err:  # unreachable, host key, authentication: by host
                return NodeResult(node.name, error=str(err))
            try:
                result = conn.run(remote(*argv), hide=True, warn=True, in_stream=False,
                                  timeout=timeout)
                return NodeResult(node.name, result.exited, result.stdout, result.stderr)
            except Exception as err:  # noqa: BLE001 (a dropped session is this node's answer)
                return NodeResult(node.name, error=f"{type(err).__name__}: {err}")
            finally:
                conn.close()

        by_name = {n.name: n for n in nodes}
        answers = in_parallel(lambda name: one(by_name[name]), by_name)
        return GroupResult({name: answer if isinstance(answer, NodeResult)
                            else NodeResult(name, error=str(answer))
                            for name, answer in answers.items()})
