"""Hosts of an Ansible inventory over SSH (fabric): preflight (every host reached and checked,
the code and the workdir shipped), one node agent per host started in its own session, its
lines streamed, its folder fetched. A detached run's pipeline lives on the head, or on the
inventory's controller host (launcher/backends/ssh/home.py)."""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.cluster.inventory import Node, load_inventory, select_nodes
from launcher.cluster.ssh_options import SshOptions
from launcher.core.errors import LauncherError
from launcher.core.node_code import code_files, code_root, content_hash
from launcher.backends.ssh.options import DEFAULT_FANOUT
from launcher.execute.backend import (YES, Capabilities, GroupResult, NodeResult, in_parallel,
                                      no)
from launcher.job.request import RunRequest
from launcher.job.plans import plan_request
from launcher.job.runplan import NodeCommand, Placement, RunPlan
from launcher.job.spec import workdir_folder_name


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


def plan_inventory(request: RunRequest, nodes: list[Node], facts: dict | None = None, *,
                   uid: str = "UID", attempt: int = 0, fanout: int | None = None) -> RunPlan:
    """The plan for hosts over SSH. Without facts (a dry run connects to nothing) the GPU
    count comes from the inventory, interface/cores are left for preflight to find, and paths
    are relative to each node's login folder."""
    job = request.job
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
        if fanout is not None:
            notes.append(f"preflight connects to and checks at most {fanout} host(s) at a "
                         f"time (--fanout)")
    placements = {}
    for n in nodes:
        home = facts[n.name].home if facts else None
        run_dir = _on_node(home, node_run_dir(n, request.run_id, uid))
        placements[n.name] = Placement(
            python=n.python, code_dir=posixpath.join(run_dir, "code"), run_dir=run_dir,
            cwd=run_dir, cpus=n.cpus or (facts[n.name].cpus if facts else None),
            # launch_env_file (from `launch setup`); the recipe's env wins.
            extra_env=facts[n.name].env if facts else {},
            workdir=_on_node(home, shipped_to(n, job.workdir, facts)) if job.workdir else None,
            checkpoint_dir=posixpath.join(posixpath.dirname(run_dir), "checkpoints"))
    plan = plan_request(request, nodes, placements,
                        rdzv_port=request.rdzv_port or request.recipe.rendezvous.port, uid=uid,
                        attempt=attempt, notes=tuple(notes))
    sendable(plan)
    return plan


def sendable(plan: RunPlan) -> None:
    """Over SSH a node's command is one line of UTF-8 text (the remote shell's): an argument
    or a variable's value holding bytes that are not UTF-8 (a file name from another system;
    --local and Slurm pass such bytes as they are) is refused before anything starts, naming
    it, rather than failing in the middle of a start with a codec error."""
    for command in plan.nodes:
        named = [(f"argument {arg!a}", arg) for arg in command.argv] + \
                [(f"the value of {key!a}" if key in command.masked
                  else f"{key}={value!a}", f"{key}={value}")
                 for key, value in command.env.items()]
        for what, text in named:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise LauncherError(
                    f"node {command.name}: {what} holds bytes that are not UTF-8, which a "
                    "command line over SSH cannot carry: rename what it names, or give it "
                    "through a file in the workdir") from None


ATTACHED = {
    "restarts": YES, "resume": YES, "hang watch": YES, "gate": YES, "stragglers": YES,
    "report": YES, "checkpoint mirror": YES, "spot notices": YES, "machine recovery": YES,
    "nccl-tests": YES,
}
DETACHED = {
    **ATTACHED,
    "machine recovery": no("a replacement is made with the cloud credentials of the machine "
                           "that provisioned the cluster (or the lab's own), which the "
                           "controller on the cluster does not hold: run attached with "
                           "--recover"),
}
CAPABILITIES = Capabilities(attached=ATTACHED, detached=DETACHED,
                            controller="the head node over SSH (or the inventory's "
                                       "`controller` host), with the cluster's own key")


class SshBackend:
    name = "ssh"
    capabilities = CAPABILITIES

    def __init__(self, inventory: str | Path | None, options: SshOptions | None = None,
                 limit: str | None = None, nodes: list[Node] | None = None,
                 fanout: int = DEFAULT_FANOUT):
        self.inventory = str(inventory) if inventory else None
        self.options = options or SshOptions()
        self.limit = limit
        # At most this many hosts connected to, probed or fetched from at a time (--fanout).
        self.fanout = max(1, int(fanout))
        # A controller is given its nodes as the cluster sees them (launcher/backends/ssh/
        # home.py), and what the client's preflight found and shipped (`adopt`).
        hosts = nodes if nodes is not None else load_inventory(self.inventory, limit=limit)
        # The inventory's controller host (`launch_controller: true`): where detached runs'
        # pipelines live, never one of a run's nodes.
        self.controller_host = next((n for n in hosts if str(n.extra.get(
            "launch_controller", "")).lower() in ("true", "yes", "1")), None)
        self.all_nodes = [n for n in hosts if n is not self.controller_host]
        self.adopted: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SshBackend:
        options = SshOptions(known_hosts=settings.get("known_hosts"),
                             accept_new_host_keys=bool(settings.get("accept_new_host_keys")))
        fanout = int(settings.get("fanout") or DEFAULT_FANOUT)
        if settings.get("controller"):
            # A detached run's controller: the nodes as the cluster sees them, no inventory.
            return cls(None, options, nodes=[Node(**n) for n in settings["nodes"]],
                       fanout=fanout)
        return cls(settings["inventory"], options, limit=settings.get("limit"), fanout=fanout)

    def to_json(self) -> dict[str, Any]:
        # The inventory by its absolute path: a record (detached.json, plan.json) is read
        # again from wherever `launch attach` or `launch fetch` is run.
        inventory = os.path.abspath(self.inventory) \
            if self.inventory and os.path.exists(self.inventory) else self.inventory
        return {"inventory": inventory, "limit": self.limit, "fanout": self.fanout,
                "known_hosts": self.options.known_hosts,
                "accept_new_host_keys": self.options.accept_new_host_keys}

    def adopt(self, session: dict[str, Any]) -> None:
        """A controller's first attempt: the client's preflight checked the nodes and shipped
        the code and the workdir already; connecting is all that is left."""
        self.adopted = session

    def describe(self, count: int) -> str:
        return f"{count} host(s) of {self.inventory or 'the run'} over SSH"

    def where_nodes(self, nodes: list[Node]) -> str:
        return ", ".join(f"{n.name} ({n.address})" for n in nodes)

    def nodes(self, count: int | None) -> list[Node]:
        return select_nodes(self.all_nodes, len(self.all_nodes) if count is None else count,
                            self.inventory or "the run's hosts")

    def gpus(self, nodes: list[Node]) -> list[int]:
        from launcher.nccl.links import facts as catalog_facts

        out = []
        for node in nodes:
            row = catalog_facts(node.instance_type) if node.gpus is None else None
            out.append(node.gpus if node.gpus is not None else (row.gpu_count if row else 0))
        return out

    def plan(self, request: RunRequest, nodes: list[Node]) -> RunPlan:
        return plan_inventory(request, nodes, fanout=self.fanout)

    def shipment(self, request: RunRequest, uid: str, extra_files: list[str] = ()):
        """What preflight uploads to every node: launch's node code (and `extra_files` of it:
        a controller's launcher/), the recipe, the job's workdir."""
        from launcher.backends.ssh.preflight import Shipment

        job = request.job
        code_dir = code_root()
        files = code_files(code_dir)
        recipe_file = Path(request.recipe.source) if Path(request.recipe.source).is_file() \
            else None
        return Shipment(code_dir, files, content_hash(code_dir, files),
                        lambda node: node_run_dir(node, request.run_id, uid), recipe_file,
                        remove_on_failure=not request.resume, job=job,
                        workdir=request.workdir,
                        node_workdir=lambda node: node_workdir(node, job.workdir)
                        if job.workdir else None)

    def open(self, request: RunRequest, nodes: list[Node], uid: str) -> SshSession:
        """Preflight: every node reached and checked at once, the code and the workdir shipped
        on the way; every problem of every host reported together, nothing started."""
        from launcher.backends.ssh.preflight import preflight

        if self.adopted is not None:
            return self._adopted_session(nodes)
        shipment = self.shipment(request, uid)
        port = request.rdzv_port or request.recipe.rendezvous.port
        held: dict = {}   # each node's probe, left waiting to start its agent
        conns, facts = preflight(nodes, request.recipe, self.options, port, shipment,
                                 fanout=self.fanout, held=held)
        return SshSession(self, nodes, conns, facts,
                          {"sha256": shipment.sha256, "files": shipment.files}, held)

    def _adopted_session(self, nodes: list[Node]) -> SshSession:
        from launcher.backends.ssh.preflight import NodeFacts, PreflightFailed, close_all
        from launcher.cluster.ssh import HostProblem, connect

        adopted, self.adopted = self.adopted, None
        by_name = {n.name: n for n in nodes}
        answers = in_parallel(lambda name: connect(by_name[name], self.options), by_name,
                              max_workers=self.fanout)
        problems = [a if isinstance(a, HostProblem) else HostProblem(name, str(a))
                    for name, a in answers.items() if isinstance(a, Exception)]
        conns = {name: a for name, a in answers.items() if not isinstance(a, Exception)}
        if problems:
            close_all(conns)
            raise PreflightFailed(problems)
        facts = {name: NodeFacts(**{k: v for k, v in f.items() if k != "shipped"},
                                 shipped=ShippedTo(f["shipped"]) if f.get("shipped") else None)
                 for name, f in adopted["facts"].items()}
        return SshSession(self, nodes, conns, facts, adopted.get("code"))

    # ---- detached runs --------------------------------------------------------------------
    def controller_node(self, nodes: list[Node]) -> Node:
        return self.controller_host or nodes[0]

    def hand_over(self, request: RunRequest, nodes: list[Node]) -> dict[str, Any]:
        """Preflight from here (the head also gets launch itself, and is checked for what
        its controller needs), the handover written on the head, the controller started
        there in a session of its own."""
        from launcher.backends.ssh.home import (as_seen_from_the_cluster, cluster_key,
                                                cluster_known_hosts, controller_line,
                                                controller_runs, INCOMING)
        from launcher.backends.ssh.preflight import close_all, preflight
        from launcher.cluster.ssh import remote
        from launcher.core.node_code import controller_files
        from launcher.pipeline.handover import HANDOVER_MODE, handover_doc
        from launcher.runs.folder import RunFolder

        head = self.controller_node(nodes)
        uid = RunFolder.uid_for(request.runs_dir, request.run_id, request.resume)
        shipment = self.shipment(request, uid)
        extra = controller_files(code_root())
        controlling = replace(shipment, controller=head.name, controller_files=extra,
                              controller_sha256=content_hash(code_root(),
                                                             [*shipment.files, *extra]),
                              controller_key=cluster_key(head))
        port = request.rdzv_port or request.recipe.rendezvous.port
        apart = head is self.controller_host
        conns, facts = preflight(nodes, request.recipe, self.options, port,
                                 shipment if apart else controlling, fanout=self.fanout)
        if apart:
            # A controller host of its own: launch itself shipped there and checked too.
            try:
                more, found = preflight([head], request.recipe, self.options, 0,
                                        replace(controlling, job=None, workdir=None))
            except BaseException:
                close_all(conns)
                raise
            conns.update(more)
            facts = {**facts, **found}
        try:
            home = facts[head.name].home
            runs = _on_node(home, controller_runs(head))
            incoming = posixpath.join(runs, INCOMING, f"{request.run_id}.{uid}.json")
            doc = handover_doc(
                self, request, uid, runs,
                settings={"controller": True, "nodes": as_seen_from_the_cluster(nodes, head),
                          "known_hosts": _on_node(home, cluster_known_hosts(head))},
                facts={name: {**vars(f), "shipped": f.shipped.dest if f.shipped else None}
                       for name, f in facts.items() if name != head.name or not apart},
                code={"sha256": shipment.sha256, "files": shipment.files})
            conn = conns[head.name]
            conn.run(remote("sh", "-c", 'umask 077 && mkdir -p "$1"', "launch-mkdir",
                            posixpath.dirname(incoming)), hide=True, in_stream=False, timeout=30)
            with conn.sftp().open(incoming, "wb") as f:
                f.chmod(HANDOVER_MODE)   # --env's values: the user's alone
                f.write(json.dumps(doc).encode())
            code_dir = posixpath.join(_on_node(home, node_run_dir(head, request.run_id, uid)),
                                      "code")
            started = conn.run(remote(*controller_line(head.python, code_dir, incoming, runs)),
                               hide=True, warn=True, in_stream=False, timeout=30)
            pid = started.stdout.strip().splitlines()[-1:] or ["?"]
            if started.exited != 0 or not pid[0].isdigit():
                raise LauncherError(f"{head.name}: the run's controller did not start "
                                    f"({started.stderr.strip()[-300:] or started.exited})")
        finally:
            close_all(conns)
        return {"run_dir": posixpath.join(runs, request.run_id), "controller": head.name,
                "pid": int(pid[0]), "where": f"{head.name} ({head.address}), pid {pid[0]}"}

    def describe_hand_over(self, request: RunRequest, nodes: list[Node]) -> list[str]:
        from launcher.backends.ssh.home import cluster_key, controller_line, controller_runs

        head = self.controller_node(nodes)
        runs = controller_runs(head)
        line = controller_line(head.python, posixpath.join(node_run_dir(
            head, request.run_id, "UID"), "code"), posixpath.join(runs, ".incoming",
                                                                  f"{request.run_id}.UID.json"),
            runs)
        return [f"  on {head.name} ({head.address}): " + " ".join(shlex.quote(a) for a in line),
                f"  the controller reaches the nodes by their private addresses with the "
                f"cluster's key {cluster_key(head)} on {head.name}; its run folder: "
                f"{posixpath.join(runs, request.run_id)} there"]

    def home(self, handle: dict[str, Any]):
        from launcher.backends.ssh.home import SshHome

        return SshHome(self, handle)

    def controller_of(self, run_id: str) -> str:
        """Where a detached run's controller would be, for a dry run (connects to nothing)."""
        head = self.nodes(None)[0]
        return f"{head.name} ({head.address})"

    def find_run(self, run_id: str, runs_dir: str) -> dict[str, Any] | None:
        from launcher.backends.ssh.home import find_run

        return find_run(self, run_id)

    def fetch_job_files(self, targets, dest, dry_run: bool = False):
        """What the run wrote in its job folders on the hosts, over SFTP
        (launcher/backends/ssh/job_files.py)."""
        from launcher.backends.ssh.job_files import fetch_job_files

        return fetch_job_files(self, targets, dest, dry_run)

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
        answers = in_parallel(lambda name: one(by_name[name]), by_name, max_workers=self.fanout)
        return GroupResult({name: answer if isinstance(answer, NodeResult)
                            else NodeResult(name, error=str(answer))
                            for name, answer in answers.items()})


@dataclass(frozen=True)
class ShippedTo:
    """Where a node's workdir went, as a controller is told (launcher/workdir/sync.py's ship
    stats, of which planning reads only this)."""

    dest: str


class SshSession:
    """One attempt over SSH: a connection per node, opened by preflight, kept to the end."""

    def __init__(self, backend: SshBackend, nodes: list[Node], conns: dict, facts: dict,
                 code: dict, held: dict | None = None):
        self.backend, self.nodes, self.conns, self.facts = backend, nodes, conns, facts
        self.code = code
        # Preflight's probes left waiting on each node: the first start of its agent takes
        # its session (launcher/backends/ssh/preflight.py); a later start opens its own.
        self.held = held or {}
        self.by_node = {n.name: n for n in nodes}
        self.procs: dict[str, Any] = {}   # the node agents, by node (their connections)

    def plan(self, request: RunRequest, uid: str, attempt: int) -> RunPlan:
        return plan_inventory(request, self.nodes, self.facts, uid=uid, attempt=attempt)

    def announce(self) -> list[str]:
        return []   # preflight said it already

    def code_record(self) -> dict | None:
        return self.code

    def process(self, command: NodeCommand, stamp: str, label: str | None = None):
        from launcher.backends.ssh.agent import SshNodeProcess

        node = self.by_node[command.name]
        proc = SshNodeProcess(command, node, self.conns[command.name], self.backend.options,
                              stamp, label=label,
                              held=self.held.pop(command.name, None) if label is None else None)
        if label is None:
            self.procs[command.name] = proc
        return proc

    def run(self, command: NodeCommand, stamp: str, label: str, line) -> int | None:
        return self.process(command, stamp, label).run_to_end(line)

    def collect(self, plan: RunPlan, folder, skip: set[str] = frozenset()) -> None:
        """Whatever of the run still lives on a node (a job's child in a session of its own:
        found by the run's stamp, never by name) reaped, and the node's folder fetched."""
        from launcher.backends.ssh.agent import fetch_tree, write_files

        commands = {c.name: c for c in plan.nodes}

        def fetch(name: str):
            proc = self.procs.get(name)
            if proc is None:
                return None
            try:
                proc.reap()
            except Exception as err:  # noqa: BLE001 (the fetch still goes on)
                print(f"launch: warning: node {name}: could not look for leftovers: {err}")
            # Sent with its agent's end when small: no SFTP session (a login shell) for it.
            files = proc.folder_files()
            if files is not None:
                return write_files(files, folder.node_dir(name), f"node {name}")
            return fetch_tree(proc.connection(), commands[name].run_dir, folder.node_dir(name))

        # `skip`: nodes whose machine is gone, and its files with it.
        for name, result in in_parallel(fetch, [n for n in commands if n not in skip],
                                        max_workers=self.backend.fanout).items():
            if isinstance(result, Exception):
                print(f"launch: warning: {result}")
        for proc in self.procs.values():
            proc.close()

    def close(self) -> None:
        from launcher.backends.ssh.preflight import close_all, release_held

        release_held(self.held, self.backend.fanout)   # probes never asked to start
        close_all(self.conns)
