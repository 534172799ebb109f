"""Hosts of an Ansible inventory over SSH (fabric): preflight, ship the code, start one
torchrun agent per host in its own session, stream, fetch each node's folder, summarize."""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.execute.backend import (GroupResult, LaunchOptions, NodeResult, Program,
                                    in_parallel)
from launcher.cluster.inventory import Node, load_inventory, select_nodes
from launcher.cluster.ssh_options import SshOptions
from launcher.core.errors import LauncherError
from launcher.core.node_code import code_files, code_root, content_hash
from launcher.job.recipe import Recipe
from launcher.job.runplan import Placement, RunPlan, plan_run
from launcher.job.spec import Job, default_job, workdir_folder_name


def node_run_dir(node: Node, run_id: str, uid: str) -> str:
    """`launch_run_root` (default .launch/runs, relative to the SSH login directory) / run id
    and the run's uid / node name. The uid (launcher/runs/folder.py) makes the folder this run's
    alone: a new run that reuses an id never finds an earlier run's checkpoints there (it
    once resumed from them silently), while a restart or `--resume` of the same run does. The
    node name is in the path so that hosts sharing a file system (NFS homes, the lab) never
    write into each other's folders."""
    return posixpath.join(node.run_root, f"{run_id}.{uid}", node.name)


def node_workdir(node: Node, local_workdir: str) -> str:
    """Where a node keeps the shipped copy of a workdir, beside its run folders (kept between
    runs: only what changed ships again, setup's outputs stay)."""
    base = posixpath.dirname(node.run_root.rstrip("/")) or "."
    return posixpath.join(base, "workdirs", workdir_folder_name(local_workdir))


def shipped_to(node: Node, local_workdir: str, facts: dict | None) -> str:
    """The copy the node's ship used (preflight's; a sibling of the usual one when another run
    held that with other content), else where it would go."""
    shipped = facts[node.name].shipped if facts else None
    return shipped.dest if shipped is not None else node_workdir(node, local_workdir)


def _on_node(home: str | None, path: str) -> str:
    """A path on the node: absolute once preflight told the login folder, else as the login
    folder sees it (a dry run connects to nothing)."""
    if path.startswith("/"):
        return path
    return posixpath.normpath(posixpath.join(home, path)) if home else path


def plan_inventory(recipe: Recipe, nodes: list[Node], run_id: str,
                   facts: dict | None = None, *, rdzv_port: int | None = None,
                   program: Program | None = None, job: Job | None = None,
                   workdir: Any = None, uid: str = "UID", attempt: int = 0) -> RunPlan:
    """The plan for hosts over SSH. Without facts (a dry run connects to nothing) the GPU
    count comes from the inventory, interface/cores are left for preflight to find, and paths
    are relative to each node's login folder."""
    job = job or default_job(recipe, program)
    notes = []
    if facts:
        nodes = [replace(n, gpus=facts[n.name].gpus,
                         interface=n.interface or facts[n.name].interface) for n in nodes]
    else:
        notes.append("dry run: no connection made; preflight fills in each node's network "
                     "interface (GLOO/NCCL_SOCKET_IFNAME), cores (OMP_NUM_THREADS), GPUs, the "
                     "settings in /etc/launch/nccl.env that `launch setup` writes on EFA nodes, "
                     "and makes the paths below (relative to the node's login folder) "
                     "absolute; UID stands for the run's own id, made when it starts")
    placements = {}
    for n in nodes:
        home = facts[n.name].home if facts else None
        run_dir = _on_node(home, node_run_dir(n, run_id, uid))
        placements[n.name] = Placement(
            python=n.python, code_dir=posixpath.join(run_dir, "code"), run_dir=run_dir,
            cwd=run_dir, cpus=n.cpus or (facts[n.name].cpus if facts else None),
            # launch_env_file (from `launch setup`); the recipe's env wins.
            extra_env=facts[n.name].env if facts else {},
            workdir=_on_node(home, shipped_to(n, job.workdir, facts)) if job.workdir else None,
            checkpoint_dir=posixpath.join(posixpath.dirname(run_dir), "checkpoints"))
    from launcher.job.mirror import with_mirror
    from launcher.job.spot import with_spot_watch

    plan = plan_run(recipe, nodes, run_id, placements, rdzv_port=rdzv_port, notes=tuple(notes),
                    program=program, job=job, workdir=workdir, attempt=attempt)
    return with_spot_watch(with_mirror(plan, recipe, placements, uid), nodes, placements)


def execute_inventory(plan: RunPlan, nodes: list[Node], conns: dict, options: SshOptions,
                      launch: LaunchOptions, code: dict, folder) -> dict:
    """Run and collect a planned run on open connections (the code and the workdir are on
    the nodes already, checked by preflight); returns the summary."""
    from launcher.backends.ssh.agent import prepare_ssh
    from launcher.backends.ssh.agent import SshNodeProcess, fetch_tree
    from launcher.execute.mirrored import ssh_runner, watcher, with_restore
    from launcher.execute.runner import execute_plan
    from launcher.execute.sidecar import Preemptions, Sidecar

    commands = {c.name: c for c in plan.nodes}
    # Every node provably runs the same code: the hash each node computed is this one.
    folder.write_json("code.json", code)
    procs = [SshNodeProcess(commands[n.name], n, conns[n.name], options, folder.stamp)
             for n in nodes]
    head = nodes[0]
    store = SshNodeProcess(plan.store, head, conns[head.name], options, folder.stamp,
                           label="store") if plan.store else None

    by_proc = {p.name: p for p in procs}
    by_node = {n.name: n for n in nodes}

    def collect() -> None:
        def fetch(name: str):
            if launch.node_lost is not None and launch.node_lost(by_node[name]):
                return None   # the machine is gone, and its files with it
            # The node process's connection: opened again if it dropped during the run.
            proc = by_proc[name]
            # Whatever of the run still lives there (a job's child in a session of its own):
            # found by the run's stamp, never by name.
            try:
                proc.reap()
            except Exception as err:  # noqa: BLE001 (the fetch still goes on)
                print(f"launch: warning: node {name}: could not look for leftovers: {err}")
            return fetch_tree(proc.connection(), commands[name].run_dir, folder.node_dir(name))

        for name, result in in_parallel(fetch, list(commands)).items():
            if isinstance(result, Exception):
                print(f"launch: warning: {result}")
        for proc in procs:
            proc.close()

    mirror = watcher(plan, lambda cmd: SshNodeProcess(cmd, head, conns[head.name], options,
                                                       folder.stamp, label="mirror"))
    notices = Preemptions()
    spot = [Sidecar(SshNodeProcess(cmd, by_node[cmd.name], conns[cmd.name], options,
                                   folder.stamp, label="spot"), "spot watcher", notices.line)
            for cmd in plan.spot]
    return execute_plan(plan, folder, procs, after=collect, grace_s=launch.grace_s,
                        display=launch.display, store=store, services=[*mirror, *spot],
                        prepare=with_restore(prepare_ssh(plan, by_proc, plan.workdir), plan,
                                             ssh_runner(by_proc)), verdict=notices.judge,
                        node_lost=(lambda name: launch.node_lost(by_node[name]))
                        if launch.node_lost else None)


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
             program: Program | None = None, rdzv_port: int | None = None,
             job: Job | None = None, workdir: Any = None, attempt: int = 0) -> RunPlan:
        return plan_inventory(recipe, nodes, run_id, rdzv_port=rdzv_port, program=program,
                              job=job, workdir=workdir, attempt=attempt)

    def launch(self, recipe: Recipe, nodes: list[Node], run_id: str, options: LaunchOptions,
               *, program: Program | None = None, rdzv_port: int | None = None,
               job: Job | None = None, workdir: Any = None) -> dict:
        """Preflight (the code and the workdir shipped on the way), the run folder, plan with
        the nodes' facts, setup, run, collect; with `options.recover`, again on replacements
        of lost machines (launcher/backends/ssh/replace.py)."""
        if options.recover is not None:
            from launcher.backends.ssh.replace import launch_recovering

            return launch_recovering(self, recipe, nodes, run_id, options, program=program,
                                     rdzv_port=rdzv_port, job=job, workdir=workdir)
        from launcher.backends.ssh.preflight import Shipment, close_all, preflight
        from launcher.runs.folder import RunFolder

        job = job or default_job(recipe, program)
        port = rdzv_port or recipe.rendezvous.port
        code_dir = code_root()
        files = code_files(code_dir)
        recipe_file = Path(recipe.source) if Path(recipe.source).is_file() else None
        uid = RunFolder.uid_for(options.runs_dir, run_id, options.resume)
        shipment = Shipment(code_dir, files, content_hash(code_dir, files),
                            lambda node: node_run_dir(node, run_id, uid), recipe_file,
                            remove_on_failure=not options.resume, job=job, workdir=workdir,
                            node_workdir=lambda node: node_workdir(node, job.workdir)
                            if job.workdir else None)
        conns, facts = preflight(nodes, recipe, self.options, port, shipment)
        try:
            folder = RunFolder.for_launch(options.runs_dir, run_id, resume=options.resume,
                                          uid=uid)
            plan = plan_inventory(recipe, nodes, run_id, facts, rdzv_port=port, program=program,
                                  job=job, workdir=workdir, uid=uid,
                                  attempt=folder.attempt_base())
            return execute_inventory(plan, nodes, conns, self.options, options,
                                     {"sha256": shipment.sha256, "files": files}, folder)
        finally:
            close_all(conns)

    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        from launcher.cluster.ssh import connect, remote

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
