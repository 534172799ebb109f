"""Pure planning: recipe + job + nodes + run id -> one command per node (a torchrun agent, or
the user's own command).

Nothing here touches the network, the disk or the clock: `--dry-run` prints exactly the value
a real run executes.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.cluster.inventory import Node
from launcher.core.errors import RecipeError
from launcher.job.environment import FROM_FLAG, FROM_LOGIN, FROM_RECIPE, masked, path_with
from launcher.job.recipe import Recipe
from launcher.job.spec import Job, job_of
from launcher.job.torchrun import endpoint, torchrun_argv
from train.options import argv_for


@dataclass(frozen=True)
class Placement:
    """Where things are on one node; chosen by the executor (local folder or remote run dir)."""

    python: str          # interpreter with torch on the node
    code_dir: str        # the folder holding launch's node code on the node (core/node_code.py)
    run_dir: str         # the node's own folder for logs, NCCL debug files, metrics
    cwd: str | None = None
    # The job's shipped workdir on the node (where it runs), and the run's checkpoint folder
    # (LAUNCH_CHECKPOINT_DIR: one per run, kept across restarts and `--resume`).
    workdir: str | None = None
    checkpoint_dir: str | None = None
    cpus: int | None = None              # cores this node agent may use (OMP_NUM_THREADS)
    visible_gpus: tuple[int, ...] | None = None   # CUDA_VISIBLE_DEVICES split on one machine
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. the EFA env file's values
    # The node's login environment when launch must give it (launcher/job/environment.py: on
    # this machine, the login's variables of launch's own environment); empty where the node
    # has its own (a process over SSH gets its login's).
    login_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeCommand:
    name: str
    address: str
    private_address: str
    is_head: bool
    gpus: int
    argv: tuple[str, ...]
    env: dict[str, str]
    run_dir: str
    cwd: str | None
    instance_type: str | None = None  # from the inventory; run reports look up the catalog
    # The node's interpreter and launch_node/node_probe.py: what launch runs there to read the
    # ranks' heartbeats and dump their stacks when the run hangs.
    probe: tuple[str, ...] = ()
    # Where a variable of `env` comes from when not launch's own (launcher/job/environment.py
    # FROM_*), and the names given with --env, whose values are shown and kept masked.
    env_from: dict[str, str] = field(default_factory=dict)
    masked: frozenset[str] = frozenset()
    # The job's own folder on the node (launch_node/job_folder.py: a view of the shipped
    # copy for this run and node, made by launch_node/worker.py when the job starts); None
    # when the job has no shipped workdir. `cwd` is where the node's command starts (the copy).
    job_dir: str | None = None
    # Launch's own process (the checkpoint mirror), not the user's job: beside launch (--local,
    # a Slurm job's steps) it also takes launch's cloud settings (environment.py
    # SERVICE_PREFIXES), as launch itself would reach the bucket; never sent over SSH.
    service: bool = False

    def shown_env(self) -> dict[str, str]:
        """`env` as printed and kept (plan.json): --env values masked."""
        return {k: masked(v) if k in self.masked else v for k, v in self.env.items()}

    def shell_line(self) -> str:
        """What a person would type; also the one string a remote shell receives."""
        env = [f"{k}={v}" for k, v in self.env.items()]
        return shlex.join(["env", *env, *self.argv]) if env else shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "address": self.address,
            "private_address": self.private_address, "is_head": self.is_head,
            "gpus": self.gpus, "argv": list(self.argv), "env": self.shown_env(),
            "env_from": dict(self.env_from),
            "run_dir": self.run_dir, "cwd": self.cwd, "instance_type": self.instance_type,
            "probe": list(self.probe), **({"service": True} if self.service else {}),
            **({"job_dir": self.job_dir} if self.job_dir else {}),
        }


@dataclass(frozen=True)
class Recovery:
    """What launch does when a run fails or stops making progress (the recipe's restarts,
    hang_timeout_s and checkpoint block, after the command line's overrides)."""

    restarts: int = 0
    hang_timeout_s: float | None = None   # None: max(300 s, 20x the median step)
    # How long a restarted node agent may take to be back in the rendezvous (its peers wait
    # that long in it: the rendezvous join timeout).
    restart_deadline_s: float = 600.0
    checkpoint_every: str | None = None   # "10 steps" | "5 minutes", for people
    user_job: bool = False                # the user's own job: no heartbeat, its own checkpoints

    def to_json(self) -> dict[str, Any]:
        return {"restarts": self.restarts, "hang_timeout_s": self.hang_timeout_s,
                "restart_deadline_s": self.restart_deadline_s,
                "checkpoint_every": self.checkpoint_every}

    def describe(self) -> str:
        hang = (f"{self.hang_timeout_s:g} s" if self.hang_timeout_s is not None
                else "900 s, or max(300 s, 20x the median step its LAUNCH_STEP lines show)"
                if self.user_job else "max(300 s, 20x the median step)")
        ckpt = ("your job's checkpoints in LAUNCH_CHECKPOINT_DIR, kept across restarts and "
                "--resume" if self.user_job else
                f"checkpoints every {self.checkpoint_every}" if self.checkpoint_every
                else "no checkpoints")
        restarts = (f"up to {self.restarts} restart(s)" if self.restarts
                    else "no restarts (fail-fast)")
        return f"recovery: {restarts}; {ckpt}; hang timeout {hang} (stacks dumped, then " \
               f"{'restart' if self.restarts else 'stop'})"


def recovery_of(recipe: Recipe, job: Job | None = None) -> Recovery:
    ckpt = recipe.checkpoint
    every = None
    if ckpt is not None and ckpt.writes:
        every = (f"{ckpt.every_steps} steps" if ckpt.every_steps is not None
                 else f"{ckpt.every_minutes:g} minutes")
    return Recovery(restarts=recipe.restarts, hang_timeout_s=recipe.hang_timeout_s,
                    restart_deadline_s=float(recipe.rendezvous.timeout), checkpoint_every=every,
                    user_job=job is not None and job.kind in ("script", "module", "command"))


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    recipe_name: str
    recipe_source: str
    rdzv_endpoint: str
    nproc_per_node: int
    nodes: tuple[NodeCommand, ...]
    notes: tuple[str, ...] = ()
    # The rendezvous store, a process of its own on the head (launch_node/rdzv_store.py): every
    # agent is a client of it, so no agent's exit can take the rendezvous down with it.
    store: NodeCommand | None = None
    recovery: Recovery = field(default_factory=lambda: Recovery())
    job: Job = field(default_factory=lambda: Job("trainer"))
    # What is shipped of the job's workdir (launcher/workdir/scan.py Manifest), when it has one.
    workdir: Any = None
    # The folder the recipe's relative paths start from (a resume reads the run's copy of the
    # recipe from the run folder, and its workdir is still relative to the original's), and
    # the YAML of a recipe made from the command line (it has no file to copy).
    recipe_base_dir: str | None = None
    recipe_text: str | None = None
    # Where checkpoints are mirrored off the head (launcher/job/mirror.py MirrorPlan), if anywhere.
    mirror: Any = None
    # The interruption-notice watcher on each spot node (launcher/job/spot.py).
    spot: tuple[NodeCommand, ...] = ()

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "recipe": {"name": self.recipe_name, "source": self.recipe_source,
                       "base_dir": self.recipe_base_dir},
            "job": self.job.to_json(),
            "workdir": self.workdir.to_json() if self.workdir is not None else None,
            "rendezvous": {"backend": "c10d", "endpoint": self.rdzv_endpoint, "id": self.run_id},
            "nnodes": self.nnodes, "nproc_per_node": self.nproc_per_node,
            "world_size": self.world_size,
            "nodes": [n.to_json() for n in self.nodes],
            "store": self.store.to_json() if self.store else None,
            "recovery": self.recovery.to_json(),
            "mirror": self.mirror.to_json() if self.mirror is not None else None,
            "spot": [w.to_json() for w in self.spot],
            "notes": list(self.notes),
        }

    def render(self) -> str:
        per_node = ("1 command per node (it starts its own processes)"
                    if not self.job.uses_torchrun else
                    f"{self.nproc_per_node} process(es) = world size {self.world_size}")
        lines = [
            f"run {self.run_id}: recipe {self.recipe_name} ({self.recipe_source})",
            f"  job: {self.job.describe()}",
            f"  {self.nnodes} node(s) x {per_node}; c10d rendezvous at {self.rdzv_endpoint} "
            f"(id {self.run_id})",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  {self.recovery.describe()}")
        lines += render_workdir(self.workdir, self.job.setup)
        if self.mirror is not None:
            lines += self.mirror.render()
        if self.spot:
            lines += ["", f"spot nodes {', '.join(w.name for w in self.spot)}: a watcher reads "
                          "EC2's interruption notice (instance metadata) and sends the ranks "
                          "there SIGUSR1, the last-chance checkpoint signal:",
                      "    " + shlex.join(self.spot[0].argv)]
        if self.store:
            lines += ["", f"rendezvous store on {self.store.name} (started first, stopped after "
                          "the last agent):", "    " + shlex.join(self.store.argv)]
        login_given = any(v.startswith(FROM_LOGIN) for v in self.nodes[0].env_from.values())
        lines += ["", *environment_lines(login_given)]
        for node in self.nodes:
            role = "head, rendezvous store here" if node.is_head else "worker"
            lines += ["", f"node {node.name} ({node.address}, {role}, {node.gpus} GPU(s))"]
            if node.job_dir:
                lines.append(f"  job folder: {node.job_dir}")
                lines.append(f"    (the job runs here: made when it starts from the node's "
                             f"copy {node.cwd}, files hard-linked; what the run writes stays "
                             "here)")
            elif node.cwd:
                lines.append(f"  cwd:  {node.cwd}")
            lines.append("  env (launch's own unless marked):")
            lines += env_lines(node)
            lines.append("  command:")
            lines.append("    " + shlex.join(node.argv))
        return "\n".join(lines)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def env_lines(node: NodeCommand, indent: str = "    ") -> list[str]:
    """Each variable of the node's env as `K=V`, marked with where it comes from when that is
    not launch (--env values masked)."""
    out = []
    for k, v in node.shown_env().items():
        text = f"{indent}{k}={shlex.quote(v)}"
        source = node.env_from.get(k)
        out.append(f"{text}    # {source}" if source else text)
    return out


def environment_lines(login_given: bool, login: str | None = None) -> list[str]:
    """The rule for every rank's environment, as --dry-run states it
    (launcher/job/environment.py); `login` says what the node's login environment is."""
    base = login or (
        "here, the variables of launch's own environment that a login would set, marked "
        "`login` below" if login_given else
        "what a command started over SSH gets there, from its login shell")
    return ["environment of every rank (docs/jobs.md#the-environment): the node's login "
            f"environment ({base}); then the recipe's env:, --env, and launch's own. Nothing "
            "else of launch's environment: --env NAME passes one"]


def render_workdir(manifest: Any, setup: tuple[str, ...]) -> list[str]:
    """The dry run's account of what is shipped and what runs before the job."""
    lines: list[str] = []
    if manifest is not None:
        lines += ["", "workdir (shipped to every node's copy; the job runs in a folder of its "
                      "own made from it, below):"]
        lines += [f"  {line}" for line in manifest.render()]
    if setup:
        lines += ["", "setup (on every node, in the workdir, before the job; again only when the "
                      "workdir's content or these commands change):"]
        lines += [f"  $ {command}" for command in setup]
    return lines


def trainer_args(recipe: Recipe, out_dir: str) -> list[str]:
    """The recipe's train and ddp blocks as train/main.py flags, each value one argv item,
    spelled by the trainer's own option table (train/options.py)."""
    return [*argv_for(recipe.model_dump()), "--out-dir", out_dir]


def resolve_nproc(recipe: Recipe, gpus: int) -> int:
    """`auto` is the node's GPU count, or 1 process on a CPU node."""
    if recipe.nproc_per_node == "auto":
        return gpus if gpus > 0 else 1
    return recipe.nproc_per_node


# NCCL's flight recorder: the last collectives of every rank, kept in memory and written when
# launch's hang forensics asks through the named pipe (or when NCCL's watchdog times out).
# NCCL only: gloo and CPU nodes do not get these.
FLIGHT_RECORDER_ENTRIES = "2000"


def flight_recorder_env(run_dir: str) -> dict[str, str]:
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # <stem><rank>: the dump; <stem><rank>.pipe: writing to it asks for one.
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{run_dir}/hang/nccl-trace.rank",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{run_dir}/hang/nccl-trace.rank",
    }


# Where the other nodes are, for a job that brings its own launcher (docs/jobs.md): filled in
# per node by plan_run, or (Slurm) by the job script once the allocation is known.
CLUSTER_ENV = ("LAUNCH_NODE_RANK", "LAUNCH_NUM_NODES", "LAUNCH_NODE_ADDRS", "LAUNCH_HEAD_ADDR",
               "LAUNCH_RDZV_PORT", "LAUNCH_GPUS_PER_NODE")


def cluster_env(rank: int, nodes: list[Node], head_addr: str, port: int,
                gpus: int) -> dict[str, str]:
    return {"LAUNCH_NODE_RANK": str(rank), "LAUNCH_NUM_NODES": str(len(nodes)),
            "LAUNCH_NODE_ADDRS": ",".join(n.private_address for n in nodes),
            "LAUNCH_HEAD_ADDR": head_addr, "LAUNCH_RDZV_PORT": str(port),
            "LAUNCH_GPUS_PER_NODE": str(gpus)}


# Beside the node's copy of the workdir, one folder per run, one per node in it
# (launch_node/job_folder.py RUNS and its layout).
JOB_FOLDERS = ".runs"


def job_folder(copy: str, run_id: str, uid: str, node: str) -> str:
    """Where the job of run `run_id` (its own id `uid`, launcher/runs/folder.py) runs on
    `node`: its own view of the node's copy. By the uid, as the SSH run folders: a new run
    that reuses an id never finds an earlier one's files, a restart or `--resume` of the same
    run finds its own. Run ids, uids and node names are checked names (launcher/core/names.py),
    one folder each."""
    return f"{copy}{JOB_FOLDERS}/{run_id}.{uid}/{node}"


def node_env(recipe: Recipe, run_id: str, node: Node, place: Placement,
             nproc: int, job_dir: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The node's env (launcher/job/environment.py's layers) and where each value not
    launch's own comes from. `job_dir`: the job's own folder, when it runs in one."""
    # PYTHONUNBUFFERED: torchrun re-prints its workers' lines on its own stdout, a pipe (or
    # an SSH channel) that Python would otherwise flush only every 8 KB.
    # LAUNCH_PYTHON: the node's interpreter; its folder goes first on PATH where the node's
    # processes start (launcher/execute/prepare.py path_with), so the job's own commands find
    # the python, pip, torchrun, deepspeed installed beside it.
    env: dict[str, str] = dict(place.login_env)
    sources = {k: FROM_LOGIN for k in env}
    if "PATH" in env:
        env["PATH"] = path_with(place.python, env["PATH"])
        sources["PATH"] = f"{FROM_LOGIN}, LAUNCH_PYTHON's folder first"
    env.update({"LAUNCH_RUN_ID": run_id, "LAUNCH_NODE": node.name,
                "PYTHONUNBUFFERED": "1", "LAUNCH_PYTHON": place.python})
    if place.cpus:
        # Ranks sharing a node would otherwise each start one OpenMP thread per core and
        # oversubscribe it (measured: a CPU ViT step went from ~2.8 s to ~1.0 s).
        env["OMP_NUM_THREADS"] = str(max(1, place.cpus // nproc))
    env["NCCL_DEBUG"] = "INFO"
    # %h and %p make one file per rank process; NCCL expands them itself.
    env["NCCL_DEBUG_FILE"] = f"{place.run_dir}/nccl-debug.%h.%p.log"
    if node.interface:
        # Must name the interface that owns the rendezvous address, not the first one the
        # host lists, or gloo/NCCL connect over the wrong network.
        env["GLOO_SOCKET_IFNAME"] = node.interface
        env["NCCL_SOCKET_IFNAME"] = node.interface
    if place.visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in place.visible_gpus)
    if node.gpus:
        env.update(flight_recorder_env(place.run_dir))
    if recipe.restarts:
        # torchrun's agents share one TCPStore for their workers, hosted by the agent of rank
        # 0 and remembered by the others from the first round. A restarted agent gets a new
        # pid, c10d orders agents by (address, pid), and rank 0 moves: the old agent then sent
        # its workers to its old store, the new one to a new store, and every worker waited in
        # init_process_group forever (seen here with 2 local nodes). Without sharing, rank 0
        # publishes a fresh address every round.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if place.checkpoint_dir:
        env["LAUNCH_CHECKPOINT_DIR"] = place.checkpoint_dir
    env.update(place.extra_env)
    for k in place.extra_env:
        sources.pop(k, None)
    env.update(recipe.env_strings())
    sources.update({k: FROM_FLAG if k in recipe.command_line_env else FROM_RECIPE
                    for k in recipe.env})
    if place.workdir:
        # The job's folder first: the job imports its own code before anything installed,
        # the recipe's PYTHONPATH entries after it (relative ones from the workdir).
        # LAUNCH_WORKDIR is the folder the job runs in; LAUNCH_WORKDIR_COPY the node's copy
        # it is made from (launch_node/worker.py).
        folder = job_dir or place.workdir
        env["LAUNCH_WORKDIR"] = folder
        if job_dir:
            env["LAUNCH_WORKDIR_COPY"] = place.workdir
        env["PYTHONPATH"] = ":".join(p for p in (folder, env.get("PYTHONPATH")) if p)
        if "PYTHONPATH" in sources:
            sources["PYTHONPATH"] += ", after the workdir"
    return env, sources


def trainer_program(recipe: Recipe) -> Callable[[Placement], list[str]]:
    """The bundled trainer as the program torchrun starts: train/main.py with the recipe as
    flags, through launch's worker entry."""
    return lambda place: [f"{place.code_dir}/launch_node/worker.py", "script",
                          f"{place.code_dir}/train/main.py",
                          *trainer_args(recipe, place.run_dir)]


def job_program(job: Job) -> Callable[[Placement], list[str]]:
    """The user's script or module as the program torchrun starts, through launch's worker
    entry (launch_node/worker.py: LAUNCH_ATTEMPT, PYTHONPATH, the rank's life tied to its agent)."""
    return lambda place: [f"{place.code_dir}/launch_node/worker.py", *job.worker_argv()]


def workload_program(job: Job) -> Callable[[Placement], list[str]]:
    """launch's own workload: its program in the node's code folder, writing into the node's
    folder."""
    return lambda place: [f"{place.code_dir}/{job.target}", *job.args,
                          "--out-dir", place.run_dir]


def program_of(recipe: Recipe, job: Job) -> Callable[[Placement], list[str]] | None:
    """What torchrun starts on every node for `job`; None for a command (its own launcher)."""
    if job.is_trainer:
        return trainer_program(recipe)
    if job.kind == "workload":
        return workload_program(job)
    return job_program(job) if job.uses_torchrun else None


def plan_run(
    recipe: Recipe,
    nodes: list[Node],
    run_id: str,
    placements: dict[str, Placement],
    *,
    rdzv_port: int | None = None,
    notes: tuple[str, ...] = (),
    rdzv_host: str | None = None,
    job: Job | None = None,
    workdir: Any = None,
    attempt: int | str = 0,
    node_cluster_env: dict[str, str] | None = None,
    uid: str = "UID",
) -> RunPlan:
    """One command per node; the first node is the head: the rendezvous store runs there.

    The job (default: the recipe's) decides what each node runs: a torchrun agent starting
    the script, module, trainer or launch's own workload (`launch bench` and the gate: every
    workload goes through the same launch path), or the user's own command. `rdzv_host` is the head's address when only the allocation knows it
    (Slurm: a marker the job script fills in; `node_cluster_env` then holds markers for the
    LAUNCH_* cluster variables too); default the head's private address. `attempt`: where
    LAUNCH_ATTEMPT starts (a resumed run continues the count); `workdir` the shipped folder's
    manifest, for the printed plan; `uid` the run's own id (its job folders are named by it).
    """
    job = job or job_of(recipe)
    program = program_of(recipe, job)
    if not nodes:
        raise ValueError("a run needs at least one node")
    head = nodes[0]
    port = rdzv_port if rdzv_port is not None else recipe.rendezvous.port
    rdzv_host = rdzv_host or head.private_address
    rdzv = endpoint(rdzv_host, port)
    gpus = [node.gpus or 0 for node in nodes]
    nprocs = {resolve_nproc(recipe, g) for g in gpus}
    if len(nprocs) != 1:
        # torchrun needs the same process count on every node; `auto` on mixed nodes would not.
        raise RecipeError(recipe.source, "nproc_per_node",
                          f"is 'auto' but the nodes have different GPU counts {gpus}; torchrun "
                          "needs the same process count on every node: set a number")
    nproc = nprocs.pop()
    commands = []
    for rank, (node, node_gpus) in enumerate(zip(nodes, gpus)):
        place = placements[node.name]
        if program is not None:
            argv = torchrun_argv(
                place.python, nnodes=len(nodes), nproc_per_node=nproc, rdzv_endpoint=rdzv,
                rdzv_id=run_id, local_addr=node.private_address, is_host=False,
                join_timeout=recipe.rendezvous.timeout, log_dir=f"{place.run_dir}/torchrun",
                max_restarts=recipe.restarts,
            ) + program(place)
        elif place.workdir:
            # The command holds the shipped copy it runs in (launch_node/worker.py exec).
            # -S: worker.py needs only the standard library before it execs the command (the
            # command's own Python, if any, starts afresh with its site-packages).
            argv = [place.python, "-S", f"{place.code_dir}/launch_node/worker.py", "exec",
                    *job.args]
        else:
            argv = list(job.args)
        # launch's own workloads do not start through the worker, which makes the folder.
        job_dir = job_folder(place.workdir, run_id, uid, node.name) \
            if place.workdir and job.kind != "workload" else None
        env, env_from = node_env(recipe, run_id, node, place, nproc, job_dir)
        if place.workdir and workdir is not None:
            # What the copy must hold when the job starts (launch_node/worker.py checks it).
            env["LAUNCH_WORKDIR_DIGEST"] = workdir.digest
        if program is not None:
            env.update(job.worker_env())
        env.update(node_cluster_env or cluster_env(rank, nodes, rdzv_host, port, node_gpus))
        env["LAUNCH_ATTEMPT"] = str(attempt)
        if job.is_trainer and recipe.checkpoint is not None:
            # The trainer's checkpoint keeper: local rank 0 of the head (train/checkpoint.py).
            env["LAUNCH_CHECKPOINT_NODE"] = head.name
        commands.append(NodeCommand(
            name=node.name, address=node.address, private_address=node.private_address,
            is_head=node is head, gpus=node_gpus, argv=tuple(argv),
            env=env, run_dir=place.run_dir,
            cwd=place.workdir or place.cwd, job_dir=job_dir, instance_type=node.instance_type,
            # -S: no site-packages (node_probe.py needs only the standard library): ~30 ms of
            # CPU less at each start on every node (more where site-packages hold torch's).
            probe=(place.python, "-S", f"{place.code_dir}/launch_node/node_probe.py"),
            env_from=env_from, masked=frozenset(recipe.command_line_env),
        ))
    head_place = placements[head.name]
    store = NodeCommand(
        name=head.name, address=head.address, private_address=head.private_address,
        is_head=True, gpus=0,
        argv=(head_place.python, f"{head_place.code_dir}/launch_node/rdzv_store.py",
              "--host", rdzv_host, "--port", str(port)),
        env={**head_place.login_env, "LAUNCH_RUN_ID": run_id, "LAUNCH_NODE": head.name,
             "PYTHONUNBUFFERED": "1"},
        run_dir=head_place.run_dir, cwd=head_place.cwd, instance_type=head.instance_type,
    )
    return RunPlan(
        run_id=run_id, recipe_name=recipe.name, recipe_source=recipe.source,
        rdzv_endpoint=rdzv, nproc_per_node=nproc, nodes=tuple(commands),
        notes=notes, store=None if not job.uses_torchrun else store,
        recovery=recovery_of(recipe, job), job=job, workdir=workdir,
        recipe_base_dir=recipe.base_dir, recipe_text=recipe.text,
    )
