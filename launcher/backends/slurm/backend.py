"""Slurm: the run is one batch job, submitted from the login node; Slurm picks the nodes, and
the run's pipeline runs in the job.

    launch run RECIPE --slurm --nodes N [--partition P] [--account A] [--time HH:MM:SS]
                      [--sbatch-arg=--qos=high]... [--python PATH] [--gpus-per-node G]

On the login node (the client) the backend checks the partition, ships the workdir and launch's
code into the run folder on the shared filesystem, and submits the job (launcher/backends/
slurm/sbatch.py): its script starts launch's controller on the allocation's first node. There
the same backend, made again with `allocation`, gives the pipeline the allocation's nodes and
starts every node's processes as job steps (launcher/backends/slurm/steps.py): restarts, the
hang watch, the checkpoint mirror, the gate and the report are the same Python as every
backend's. `launch run --slurm` follows the job (attached: Ctrl-C stops the run); with
--detach it returns once the job is submitted.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from launcher.backends.slurm.options import SLURM_FLAGS
from launcher.backends.slurm.slurmctl import (Partition, SlurmError, hostnames, missing_clients,
                                              node_addresses, partitions, said, slurm,
                                              where_conf)
from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from launcher.execute.backend import (YES, Capabilities, GroupResult, NodeResult, no)
from launcher.job.request import RunRequest
from launcher.job.plans import plan_request
from launcher.job.recipe import Slurm, check_recipe_for_hardware
from launcher.job.runplan import NodeCommand, Placement, RunPlan
from launcher.job.sbatch_args import batch_path_problem
from launcher.job.spec import workdir_folder_name

MAX_SLURM_NODES = 4096

_FEATURES = {
    "restarts": YES, "resume": YES, "hang watch": YES, "gate": YES, "stragglers": YES,
    "report": YES, "checkpoint mirror": YES,
    "spot notices": no("Slurm owns its nodes' lives: a preempted or failed node ends the job "
                       "(PREEMPTED, NODE_FAIL), and `launch run --resume` continues the run in "
                       "a new one"),
    "machine recovery": no("Slurm gives and replaces nodes itself: `launch run --resume` "
                           "submits a new job that gets healthy ones"),
    "nccl-tests": no("nccl-tests runs over SSH or on this machine; on Slurm, measure with the "
                     "torch.distributed sweep (drop --nccl-tests) or srun the nccl-tests "
                     "binary yourself"),
}
CONTROLLER = "the Slurm job itself, on the allocation's first node"


def slurm_workdir(runs: Path, workdir: str, digest: str | None) -> Path:
    """The workdir's shipped copy the nodes share: beside the runs, on the filesystem they see,
    one per content (`digest`). A job waits in the queue holding nothing, so a copy shared by
    every version of the project would change under a submitted job when its author edits
    and submits again; one copy per content never does. Runs of the same content share it
    (setup runs once; a change of content runs setup again anyway: its key holds the
    digest)."""
    folder = runs / ".workdirs" / workdir_folder_name(workdir)
    return folder / digest[:16] if digest else folder


def slurm_settings(recipe_block: Slurm | None, flags: dict[str, Any]) -> Slurm:
    """The recipe's slurm block with the flags given on the command line on top (extra sbatch
    arguments add to the recipe's: sbatch takes the last of a repeated option)."""
    data = (recipe_block or Slurm()).model_dump()
    for key, value in flags.items():
        if value is None or value == []:
            continue
        data[key] = [*data[key], *value] if key == "sbatch_args" else value
    try:
        return Slurm.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        where = SLURM_FLAGS.get(key, key) if key in flags and flags[key] not in (None, []) \
            else f"slurm.{key}"
        raise LauncherError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


class SlurmBackend:
    name = "slurm"

    def __init__(self, flags: dict[str, Any] | None = None, cwd: str | None = None,
                 allocation: bool | None = None):
        self.flags = flags or {}
        self.cwd = cwd or os.getcwd()
        # Inside the job (the pipeline's own backend): the allocation's nodes, job steps.
        self.allocation = bool(allocation)
        self.capabilities = Capabilities(
            attached=_FEATURES, detached=_FEATURES, controller=CONTROLLER, shared_files=True,
            placed_later=not self.allocation, attached_here=self.allocation)
        self.facts: dict[str, dict] = {}
        slurm_settings(None, self.flags)   # a bad flag is reported before anything else

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> SlurmBackend:
        return cls(settings.get("flags") or {}, cwd=settings.get("cwd"),
                   allocation=settings.get("allocation"))

    def to_json(self) -> dict[str, Any]:
        return {"flags": self.flags, "cwd": self.cwd}

    def settings(self, recipe) -> Slurm:
        return slurm_settings(recipe.slurm if recipe else None, self.flags)

    # ---- Backend -------------------------------------------------------------------------
    def describe(self, count: int) -> str:
        part = self.flags.get("partition")
        where = f"partition {part}" if part else "the default partition"
        return f"{count} node(s) of a Slurm allocation ({where})"

    def where_nodes(self, nodes: list[Node]) -> str:
        return ", ".join(n.name for n in nodes) if self.allocation \
            else self.describe(len(nodes))

    def nodes(self, count: int | None) -> list[Node]:
        """Inside the job: the allocation's nodes, head first (Slurm's order), by NodeAddr.
        Outside: stand-ins for the nodes Slurm will allocate."""
        if self.allocation:
            from launcher.backends.slurm.steps import job_id

            names = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
            count = len(names) if count is None else count
            if len(names) < count:
                raise SlurmError(f"job {job_id()} has {len(names)} node(s); the run asks for "
                                 f"{count}")
            addresses = _resolved(node_addresses(names[:count]))
            gpus = self.flags.get("gpus_per_node")
            return [Node(name=n, address=addresses[n], private_address=addresses[n], gpus=gpus)
                    for n in names[:count]]
        count = 2 if count is None else count
        if not 1 <= count <= MAX_SLURM_NODES:
            raise LauncherError(f"--nodes {count}: a Slurm job has 1 to {MAX_SLURM_NODES} nodes")
        gpus = self.flags.get("gpus_per_node")
        return [Node(name=f"allocated{i}", address="", private_address="", gpus=gpus)
                for i in range(count)]

    def gpus(self, nodes: list[Node]) -> list[int]:
        return [n.gpus or 0 for n in nodes]

    # ---- planning ------------------------------------------------------------------------
    def placements(self, request: RunRequest, nodes: list[Node], run_dir: str,
                   shipped_to: str | None) -> dict[str, Placement]:
        settings = self.settings(request.recipe)
        job = request.job
        workdir = shipped_to or (str(slurm_workdir(Path(run_dir).parent, job.workdir,
                                                   request.workdir.digest
                                                   if request.workdir else None))
                                 if job.workdir else None)
        return {n.name: Placement(
            python=settings.python, code_dir=f"{run_dir}/code", run_dir=f"{run_dir}/{n.name}",
            cwd=f"{run_dir}/{n.name}", cpus=self.facts.get(n.name, {}).get("cpus"),
            # The nodes share the workdir's copy, beside the runs on the shared filesystem.
            workdir=workdir, checkpoint_dir=f"{run_dir}/checkpoints") for n in nodes}

    def run_plan(self, request: RunRequest, nodes: list[Node], *, uid: str = "UID",
                 attempt: int = 0, shipped_to: str | None = None) -> RunPlan:
        run_dir = str(Path(self.cwd, request.runs_dir).resolve() / request.run_id)
        port = request.rdzv_port or request.recipe.rendezvous.port
        notes = () if self.allocation else (
            "Slurm picks the nodes: the pipeline in the job plans with their names, addresses, "
            "interfaces and CPUs once it runs",)
        return plan_request(request, nodes, self.placements(request, nodes, run_dir, shipped_to),
                            rdzv_port=port, uid=uid, attempt=attempt, notes=notes)

    def plan(self, request: RunRequest, nodes: list[Node]):
        """Inside the job: the run's plan. Outside: the batch job (what --dry-run prints and a
        real run submits), with the plan its pipeline would start on stand-in nodes; pure:
        nothing is asked of Slurm (a real run asks it in preflight)."""
        if self.allocation:
            return self.run_plan(request, nodes)
        from launcher.backends.slurm.sbatch import SlurmJob

        settings = self.settings(request.recipe)
        gpus = nodes[0].gpus if nodes[0].gpus is not None else settings.gpus_per_node
        if gpus is not None:
            check_recipe_for_hardware(request.recipe, [gpus] * len(nodes))
            settings = settings.model_copy(update={"gpus_per_node": gpus})
        run_dir = str(Path(self.cwd, request.runs_dir).resolve() / request.run_id)
        if batch_path_problem(run_dir):
            raise LauncherError(f"--runs-dir: {batch_path_problem(run_dir)}")
        shown = [replace(n, address=f"<{n.name}'s NodeAddr>",
                         private_address=f"<{n.name}'s address>", gpus=gpus or 0) for n in nodes]
        return SlurmJob(run_id=request.run_id, recipe_name=request.recipe.name,
                        recipe_source=request.recipe.source, run_dir=run_dir,
                        nnodes=len(nodes), settings=settings,
                        controller_python=sys.executable,
                        plan=self.run_plan(request, shown))

    def preflight(self, recipe, count: int) -> Partition:
        """Slurm's client commands are here and the partition has `count` nodes that take
        jobs; every problem is an exit-2 error naming what to do."""
        missing = missing_clients()
        if missing:
            raise SlurmError(f"the Slurm client commands {', '.join(missing)} are not on PATH: "
                             "launch --slurm runs on a Slurm login node (apt-get install "
                             "slurm-client; or load the cluster's slurm module)")
        settings = self.settings(recipe)
        found = partitions()
        listing = "; ".join(p.describe() for p in found.values()) or "none"
        if settings.partition:
            names = settings.partition.split(",")
            unknown = [n for n in names if n not in found]
            if unknown:
                raise SlurmError(f"--partition {settings.partition}: no partition "
                                 f"{', '.join(unknown)} in {where_conf()}; partitions: {listing}")
        else:
            names = [p.name for p in found.values() if p.default]
            if not names:
                raise SlurmError(f"{where_conf()} has no default partition: pass --partition "
                                 f"(or slurm.partition); partitions: {listing}")
        chosen = [found[n] for n in names]
        down = [p.name for p in chosen if not p.up]
        if down and len(down) == len(chosen):
            raise SlurmError(f"partition {', '.join(down)} is down; partitions: {listing}")
        usable = sorted({n for p in chosen if p.up for n in p.usable})
        if len(usable) < count:
            raise SlurmError(
                f"--nodes {count}: partition {', '.join(names)} has {len(usable)} node(s) that "
                f"take jobs ({', '.join(usable) or 'none'}); partitions: {listing}")
        merged = Partition(",".join(names), nodes={n: s for p in chosen
                                                   for n, s in p.nodes.items()})
        for p in chosen:
            merged.cpus.update(p.cpus)
            merged.gpus.update(p.gpus)
        return merged

    # ---- the client: submitting the job --------------------------------------------------
    def hand_over(self, request: RunRequest, nodes: list[Node]) -> dict[str, Any]:
        """The partition checked, the workdir and launch's code staged on the shared
        filesystem, the run folder made there with its handover, the job submitted."""
        from launcher.backends.slurm.sbatch import SCRIPT_NAME
        from launcher.core.node_code import code_files, code_root, controller_files, snapshot
        from launcher.pipeline.handover import HANDOVER, HANDOVER_MODE, handover_doc
        from launcher.runs.folder import RunFolder, STAMP_ENV

        partition = self.preflight(request.recipe, len(nodes))
        if nodes[0].gpus is None and self.settings(request.recipe).gpus_per_node is None:
            # A job gets the GPUs it asks for; ask for what every usable node has.
            have = [partition.gpus.get(n, 0) for n in partition.usable]
            nodes = [replace(n, gpus=min(have) if have else 0) for n in nodes]
        flags = dict(self.flags)
        if nodes[0].gpus and not flags.get("gpus_per_node"):
            flags["gpus_per_node"] = nodes[0].gpus
        job = self.plan(request, nodes)   # refuses what the nodes cannot run, before anything
        runs = Path(self.cwd, request.runs_dir).resolve()
        shipped = None
        if request.workdir is not None:
            from launcher.workdir.sync import ship_local

            # Staged once on the shared filesystem: every node reads that copy.
            shipped = ship_local(request.workdir, slurm_workdir(runs, request.job.workdir,
                                                                request.workdir.digest))
        uid = RunFolder.uid_for(runs, request.run_id, request.resume)
        folder = RunFolder.for_launch(runs, request.run_id, resume=request.resume, uid=uid,
                                      also=ATTEMPT_FILES)
        note = shared_filesystem_note(folder.root)
        if note:
            print(f"launch: note: {note}", flush=True)
        root = code_root()
        code = snapshot(root, folder.root / "code", [*code_files(root), *controller_files(root)])
        folder.write_json("code.json", code)
        folder.keep_recipe(request.recipe.source, request.recipe.text)
        if shipped is not None:
            print(f"launch: workdir {request.workdir.root}: {shipped.files_sent} of "
                  f"{shipped.files_total} file(s) shipped to {shipped.dest}, which every node "
                  "reads", flush=True)
        inside = SlurmBackend(flags, cwd=self.cwd)
        folder.write_json(HANDOVER, handover_doc(
            inside, request, uid, str(runs),
            settings={**inside.to_json(), "allocation": True},
            shipped=shipped.dest if shipped else None), mode=HANDOVER_MODE)
        (folder.root / SCRIPT_NAME).write_text(job.script())
        proc = slurm(job.sbatch_argv(), timeout=60, env={STAMP_ENV: folder.stamp})
        if proc.returncode != 0:
            raise SlurmError(f"sbatch refused the job ({where_conf()}): {said(proc)}")
        job_id = proc.stdout.strip().split(";")[0]   # --parsable: "id" or "id;cluster"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {said(proc)}")
        folder.write_json("slurm.json", {"job_id": job_id, "sbatch": job.sbatch_argv(),
                                         "script": SCRIPT_NAME})
        part = job.settings.partition or "the default partition"
        print(f"launch: submitted batch job {job_id} ({job.nnodes} node(s), {part}); script "
              f"{folder.root / SCRIPT_NAME}", flush=True)
        return {"run_dir": str(folder.root), "job_id": job_id, "where": f"Slurm job {job_id}"}

    def describe_hand_over(self, request: RunRequest, nodes: list[Node]) -> list[str]:
        return ["  (the batch script below: launch's controller, from the run's own copy of "
                "launch in the run folder)"]

    def home(self, handle: dict[str, Any]):
        from launcher.backends.slurm.home import SlurmHome

        return SlurmHome(handle["run_id"], Path(handle["run_dir"]), str(handle["job_id"]))

    def controller_of(self, run_id: str) -> str:
        return f"the Slurm job of run {run_id}"

    def find_run(self, run_id: str, runs_dir: str) -> dict[str, Any] | None:
        import json

        root = Path(self.cwd, runs_dir).resolve() / run_id
        try:
            job_id = json.loads((root / "slurm.json").read_text())["job_id"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return {"run_id": run_id, "backend": self.name, "settings": self.to_json(),
                "run_dir": str(root), "job_id": job_id, "where": f"Slurm job {job_id}"}

    # ---- inside the job: the pipeline's nodes ----------------------------------------------
    def adopt(self, session: dict[str, Any]) -> None:
        self.shipped = session.get("shipped")

    def open(self, request: RunRequest, nodes: list[Node], uid: str) -> SlurmSession:
        """Every node's address on its route to the head, its interface, CPUs and GPUs, asked
        of the nodes themselves (one step on all of them)."""
        from launcher.backends.slurm.steps import node_facts

        found = node_facts(len(nodes), nodes[0].private_address,
                           self.settings(request.recipe).gpus_per_node or nodes[0].gpus)
        self.facts = found
        placed = [replace(n, private_address=found[n.name]["addr"],
                          interface=found[n.name]["iface"],
                          gpus=n.gpus if n.gpus is not None else found[n.name]["gpus"])
                  for n in nodes]
        check_recipe_for_hardware(request.recipe, [n.gpus or 0 for n in placed])
        return SlurmSession(self, placed, getattr(self, "shipped", None))

    def fetch_job_files(self, targets, dest, dry_run: bool = False):
        """What the run wrote in its job folders: on this machine's disk (its nodes' files
        are here; launcher/workdir/job_files.py)."""
        from launcher.workdir.job_files import fetch_here

        return fetch_here(targets, dest, dry_run)

    # ---- run_on_all ----------------------------------------------------------------------
    def run_on_all(self, nodes: list[Node], argv: list[str], *, timeout: float,
                   env: dict[str, str] | None = None) -> GroupResult:
        """argv once on each of len(nodes) nodes, through srun in an allocation of its own;
        results by the allocated nodes' names, in the allocation's order."""
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        self.preflight(None, len(nodes))
        return srun_on_nodes(self.settings(None), len(nodes), argv, timeout)


class SlurmSession:
    """One attempt inside the job: each node's process a job step (launcher/backends/slurm/
    steps.py); the nodes write into the shared run folder, so nothing is fetched."""

    def __init__(self, backend: SlurmBackend, nodes: list[Node], shipped: str | None):
        self.backend, self.nodes, self.shipped = backend, nodes, shipped
        self.recipe = None

    def plan(self, request: RunRequest, uid: str, attempt: int) -> RunPlan:
        self.recipe = request.recipe
        return self.backend.run_plan(request, self.nodes, uid=uid, attempt=attempt,
                                     shipped_to=self.shipped)

    def announce(self) -> list[str]:
        from launcher.backends.slurm.steps import job_id

        facts = self.backend.facts
        return [f"job {job_id()}: " + "; ".join(
            f"{n.name} {facts[n.name]['addr']} ({facts[n.name]['iface']}, "
            f"{facts[n.name]['cpus']} CPU(s))" for n in self.nodes)]

    def code_record(self) -> dict | None:
        return None   # the client wrote code.json when it staged the code

    def process(self, command: NodeCommand, stamp: str, label: str | None = None):
        from launcher.backends.slurm.steps import StepProcess, kept_names

        return StepProcess(command, stamp, label,
                           cpus=self.backend.facts.get(command.name, {}).get("cpus"),
                           keep=kept_names(self.backend.settings(self.recipe).sbatch_args,
                                           service=command.service))

    def run(self, command: NodeCommand, stamp: str, label: str, line) -> int | None:
        return self.process(command, stamp, label).run_to_end(line)

    def collect(self, plan: RunPlan, folder, skip: set[str] = frozenset()) -> None:
        pass   # the nodes wrote into the run folder; a step's end ends all of its processes

    def close(self) -> None:
        pass


def _resolved(addresses: dict[str, str]) -> dict[str, str]:
    """NodeAddr may be a name: the store and the agents want the address."""
    import socket

    out = {}
    for name, addr in addresses.items():
        try:
            out[name] = socket.getaddrinfo(addr, None, socket.AF_INET)[0][4][0]
        except OSError:
            raise SlurmError(f"no IPv4 address for node {name} (its NodeAddr {addr} in "
                             "scontrol show node)") from None
    return out


# What a job leaves in its run folder besides launch's own files: moved to attempts/<n>/ when
# `--resume` submits the next one.
ATTEMPT_FILES = ("job.sbatch", "slurm.json", "slurm-*.out", "*/setup.log")
# Filesystems on this machine's own disks or memory: compute nodes see them only if they are
# this machine (a one-box cluster) or something exports them.
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay",
                     "f2fs", "vfat", "exfat", "ntfs", "devtmpfs"}


def filesystem(path: Path) -> tuple[str, str]:
    """(mount point, type) of the filesystem holding `path`, from /proc/self/mounts."""
    best = ("/", "unknown")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    target = str(path)
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return best


def shared_filesystem_note(root: Path) -> str | None:
    """Says so when the run folder is on a disk of this machine."""
    mount, kind = filesystem(root)
    if kind not in LOCAL_FILESYSTEMS:
        return None
    return (f"the run folder is on {kind} mounted at {mount}, a filesystem of this machine: "
            "compute nodes see it only if they run on this machine (a one-box cluster such as "
            "`launch lab up --slurm`) or it is exported to them; on a cluster, put runs on the "
            "shared filesystem (--runs-dir in your home, on NFS or Lustre)")


# ---- run_on_all ----------------------------------------------------------------------------

# Each task names its node first and reports its command's exit code last.
TASK_SCRIPT = 'echo "@launch-node $SLURMD_NODENAME"; "$@"; echo "@launch-exit $?"'


def srun_takes() -> set[str]:
    """The long options the installed srun takes (its --help): a recipe's sbatch arguments
    that srun would refuse (--mail-type, --array, ...) are a batch job's only."""
    proc = slurm(["srun", "--help"], timeout=30)
    return set(re.findall(r"--([a-z][a-z0-9-]*)", proc.stdout + proc.stderr))


def srun_argv(settings: Slurm, count: int, argv: list[str], timeout: float,
              takes: set[str]) -> list[str]:
    """srun in an allocation of its own, with the sbatch arguments srun also `takes` (they are
    stored spelled out in full: launcher/job/sbatch_args.py)."""
    minutes = max(1, math.ceil(timeout / 60))
    out = ["srun", f"--nodes={count}", "--ntasks-per-node=1", "--label",
           "--kill-on-bad-exit=0", f"--time={minutes}", "--job-name=launch-run-on-all"]
    if settings.partition:
        out.append(f"--partition={settings.partition}")
    if settings.account:
        out.append(f"--account={settings.account}")
    shared = [a for a in settings.sbatch_args
              if a.startswith("--") and a[2:].split("=", 1)[0] in takes]
    return [*out, *shared, "bash", "-c", TASK_SCRIPT, "launch-task", *argv]


def parse_labelled(text: str) -> dict[int, list[str]]:
    """srun --label output: "<task>: line" -> lines by task."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+): ?(.*)$", line)
        if m:
            out.setdefault(int(m[1]), []).append(m[2])
    return out


def srun_on_nodes(settings: Slurm, count: int, argv: list[str], timeout: float) -> GroupResult:
    cmd = srun_argv(settings, count, argv, timeout, srun_takes())
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        # The allocation may have to wait for nodes: a minute on top of the command's time.
        out, err = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)   # srun cancels its step and gives the nodes back
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    stdout, stderr = parse_labelled(out), parse_labelled(err)
    results: dict[str, NodeResult] = {}
    for task in range(count):
        lines = stdout.get(task, [])
        name = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("@launch-node ")),
                    f"task{task}")
        code = next((int(ln.split(" ", 1)[1]) for ln in lines
                     if ln.startswith("@launch-exit ") and ln.split(" ", 1)[1].isdigit()), None)
        body = [ln for ln in lines if not ln.startswith(("@launch-node ", "@launch-exit "))]
        if code is None:
            own = [ln for ln in err.splitlines() if ln.startswith("srun:")]
            why = " ".join(own[-3:]) or f"no answer from the node (srun exit {proc.returncode})"
            results[name] = NodeResult(name, error=why)
        else:
            results[name] = NodeResult(name, code, "\n".join(body) + ("\n" if body else ""),
                                       "\n".join(stderr.get(task, [])))
    return GroupResult(results)
