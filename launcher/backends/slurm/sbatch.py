"""A run as one Slurm batch job, as a value: the job script and the sbatch command line.

Pure: built from the recipe and the run folder only, so `--dry-run` prints exactly what a real
run submits, and contacts nothing. What only the allocation knows (the node names, the head's
address, each node's own address and interface, its CPUs) the script finds on the nodes
themselves; the plan holds markers for those values, rendered as the script's shell variables.

    sbatch --parsable --job-name=RUN_ID --nodes=N --ntasks-per-node=1 ... RUN_DIR/job.sbatch

The script runs on the allocation's first node (the head): it starts the rendezvous store
there (launch_node/rdzv_store.py), then one torchrun agent per node with `srun --kill-on-bad-exit=1`,
and stops the store when srun ends. Every value from a recipe reaches the script through
`shell_word` (shlex), never pasted.
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.job.environment import LOGIN_NAMES, LOGIN_PREFIXES
from launcher.job.recipe import Slurm
from launcher.job.runplan import (NodeCommand, Recovery, RunPlan, environment_lines,
                                  render_workdir)
from launcher.job.setup import SETUP_LOG, setup_argv
from launcher.job.spec import Job

SCRIPT_NAME = "job.sbatch"
AGENT_OUT = "agent.out"       # a node's torchrun output, in its folder
EXIT_FILE = "exit_code"       # a node's torchrun exit code, written when it ends by itself
JOB_OUT = "slurm-{job_id}.out"  # the batch script's own output (sbatch --output)
STORE_OUT = "store.out"       # the rendezvous store's output, in the head's folder
STORE_EXIT = "store_exit_code"  # written only when the store ended before the agents


def marker(name: str) -> str:
    """A value the job finds at run time, written as the shell variable `name`. NUL can occur
    in no argument, environment value or recipe value, so no recipe can forge a marker."""
    return f"\0{name}\0"


NODE = marker("node")             # the node's Slurm name ($SLURMD_NODENAME)
NODE_RANK = marker("node_rank")   # its index in the allocation ($SLURM_NODEID), head 0
NODE_ADDRS = marker("node_addrs")  # every node's address, head first, comma-separated
ATTEMPT = marker("launch_attempt")  # the run's attempts before (`--resume`) + this step's
ADDR = marker("addr")             # the node's own address: its route's source to the head
IFACE = marker("iface")           # the interface holding that address
HEAD_ADDR = marker("head_addr")   # the allocation's first node's address (NodeAddr)
OMP_THREADS = marker("omp_threads")  # the node's CPUs in the job divided by its ranks


def shell_word(value: str) -> str:
    """One argument as one shell word: literal text quoted with shlex, markers as the double-
    quoted variable. The one place where recipe values meet the shell."""
    parts = value.split("\0")
    if len(parts) % 2 == 0:
        raise ValueError(f"unbalanced marker in {value!r}")
    words = [f'"${{{part}}}"' if i % 2 else shlex.quote(part)
             for i, part in enumerate(parts) if i % 2 or part]
    return "".join(words) or "''"


def fill(value: str, values: dict[str, str]) -> str:
    """The value with its markers replaced (unknown ones as "${name}", how the script says it)."""
    parts = value.split("\0")
    return "".join(values.get(part, f"${{{part}}}") if i % 2 else part
                   for i, part in enumerate(parts))


def comment(text: str) -> str:
    """A shell comment line: a newline in a path must not end it."""
    return "# " + re.sub(r"[\r\n]", " ", text)


def comment_block(text: str, width: int = 95) -> str:
    """Shell comment lines holding `text`, wrapped."""
    return "\n".join(textwrap.wrap(text, width, initial_indent="# ", subsequent_indent="# "))


# The ranks' environment starts from the node's login variables (launcher/job/environment.py);
# the job's own shell has launch's whole environment (sbatch exports it), so run_node keeps
# only these of it, in the array `login`, and starts the agent and setup with `env -i`.
LOGIN_ARRAY = '${login[@]+"${login[@]}"}'   # empty-safe under `set -u` before bash 4.4
SLURM_KEPT = ("SLURM*", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
              "ZE_AFFINITY_MASK")


def login_patterns(exported: tuple[str, ...] = ()) -> str:
    """The `case` patterns of the variables run_node keeps: a login's, Slurm's own and the
    devices it gave the step, and what the user exported by name (--export=ALL,NAME=...)."""
    names = [*LOGIN_NAMES, *(f"{p}*" for p in LOGIN_PREFIXES), *SLURM_KEPT]
    return "|".join([*names, *(shell_word(n) for n in exported)])


def exported_names(sbatch_args: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """NAME of each --export=ALL,NAME=VALUE,... token (sbatch_args holds checked options)."""
    names = []
    for arg in sbatch_args:
        if arg.startswith("--export="):
            names += [t.split("=", 1)[0] for t in arg[len("--export="):].split(",")
                      if t.upper() != "ALL" and t]
    return tuple(dict.fromkeys(names))


def command_lines(env: dict[str, str], argv: tuple[str, ...] | list[str],
                  indent: str, clean: bool = False) -> str:
    """`env K=V ... PROGRAM ARGS` as shell words, a line per variable and per option;
    `clean`: `env -i` with the login variables run_node kept, then K=V."""
    words = (["env -i " + LOGIN_ARRAY] if clean else ["env"]) + \
        [shell_word(f"{k}={v}") for k, v in env.items()]
    lines = [" ".join(words[:1]), *words[1:]] if env or clean else []
    current: list[str] = []
    previous = "-"
    for arg in argv:
        # A line per option with its value, and one for the program after its launcher's
        # options (the first plain word that follows a value).
        if current and (arg.startswith("--") or not (arg.startswith("-")
                                                     or previous.startswith("-"))):
            lines.append(" ".join(current))
            current = []
        current.append(shell_word(arg))
        previous = arg
    lines.append(" ".join(current))
    return f" \\\n{indent}  ".join(lines)


@dataclass(frozen=True)
class SlurmJob:
    """The batch job of one run: what --dry-run prints and what a real run submits."""

    run_id: str
    recipe_name: str
    recipe_source: str
    run_dir: str                 # absolute; on a filesystem the compute nodes share
    nnodes: int
    nproc_per_node: int
    rdzv_port: int
    settings: Slurm
    node: NodeCommand            # every node's agent, markers for what the node finds itself
    store: NodeCommand | None    # the rendezvous store on the head (none for a command job)
    notes: tuple[str, ...] = ()
    job: Job = field(default_factory=lambda: Job("trainer"))
    workdir: Any = None          # the shipped workdir's manifest (launcher/workdir/scan.py)
    setup_key: str | None = None  # launcher/job/setup.py: when setup runs again
    recovery: Recovery = field(default_factory=Recovery)
    attempt_base: int = 0        # LAUNCH_ATTEMPT of the first step (earlier attempts: --resume)
    recipe_base_dir: str | None = None   # where the recipe's relative paths start (RunPlan)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def script_path(self) -> str:
        return f"{self.run_dir}/{SCRIPT_NAME}"

    @property
    def rdzv_endpoint(self) -> str:
        return fill(self._endpoint(), {})

    def _endpoint(self) -> str:
        return f"{HEAD_ADDR}:{self.rdzv_port}"

    # ---- the sbatch command line ------------------------------------------------------
    def sbatch_argv(self, sbatch: str = "sbatch") -> list[str]:
        s = self.settings
        # The extra arguments first: one missing its value (`--qos` alone) then swallows one
        # of launch's options, which sbatch refuses, rather than the script's path.
        argv = [sbatch, "--parsable", *s.sbatch_args, f"--job-name={self.run_id}",
                f"--nodes={self.nnodes}",
                # One run is one attempt: a job Slurm requeued (its node failed) would start
                # again into the same run folder while launch reports the first one's end.
                "--ntasks-per-node=1", "--no-requeue", f"--chdir={self.run_dir}",
                f"--output={self.run_dir}/{JOB_OUT.format(job_id='%j')}"]
        if s.exclusive:
            argv.append("--exclusive")
        if s.partition:
            argv.append(f"--partition={s.partition}")
        if s.account:
            argv.append(f"--account={s.account}")
        if s.time:
            argv.append(f"--time={s.time}")
        if s.gpus_per_node:
            argv.append(f"--gpus-per-node={s.gpus_per_node}")
        return [*argv, self.script_path]

    # ---- the script --------------------------------------------------------------------
    def script(self, shown: bool = False) -> str:
        """The batch script; `shown`: as printed and kept in the plan, --env values masked
        (the job's own file holds them: the ranks read them from it)."""
        node_env = self.node.shown_env() if shown else self.node.env
        run_dir = shell_word(self.run_dir)
        # LAUNCH_CHECKPOINT_DIR: made for the job, which may expect it there.
        checkpoints = shell_word(self.node.env.get("LAUNCH_CHECKPOINT_DIR") or self.run_dir)
        node_cmd = command_lines(node_env, self.node.argv, "  ", clean=True)
        header = comment(f"launch run {self.run_id}: recipe {self.recipe_name} "
                         f"({self.recipe_source}), {self.nnodes} node(s) x "
                         f"{self.nproc_per_node} process(es)")
        submitted = comment(f"Submitted by launch: {shlex.join(self.sbatch_argv())}")
        python_dir = self.settings.python.rpartition("/")[0]
        path_line = (f"  PATH={shell_word(python_dir)}:$PATH; export PATH\n"
                     if python_dir else "")
        path_line += f"""  # What the ranks and setup get of this shell's environment (docs/jobs.md): a login's
  # variables, Slurm's, and what --export named; the recipe's env, --env and launch's follow.
  local -a login=()
  for name in $(compgen -e); do
    case $name in
      {login_patterns(exported_names(self.settings.sbatch_args))}) login+=("$name=${{!name}}") ;;
    esac
  done
"""
        workdir = self.node.cwd if self.job.workdir else None
        go_to_work = (f"  cd {shell_word(workdir)} || finish 1\n" if workdir else "")
        setup = ""
        if self.job.setup and workdir:
            setup_cmd = command_lines(node_env, setup_argv(str(self.setup_key),
                                                                self.job.setup), "    ",
                                      clean=True)
            setup = f"""  # Setup, once per copy of the workdir: the nodes share it here, and the first to take its
  # lock runs it while the others wait, then find it done (launcher/job/setup.py).
  {{
    {setup_cmd}
  }} 2>&1 | tee -a "$dir"/{SETUP_LOG}
  code=${{PIPESTATUS[0]}}
  if [ "$code" -ne 0 ]; then
    echo "launch: setup failed on node $node with exit code $code; no job starts"
    finish "$code"
  fi
"""
        restarts = self.recovery.restarts
        what = ("the rendezvous store there, then one torchrun agent per node (srun), and stops "
                "the store when srun ends" if self.store else
                "the job's command once per node (srun), its own launcher doing the rest")
        if restarts:
            what += (f"; when a node fails, every node again (a new srun step, and store), up "
                     f"to {restarts} time(s)")
        if self.store:
            store_cmd = command_lines(self.store.env, self.store.argv, "    ")
            start_store = f"""  # The rendezvous store, a process of its own on the head: no agent's exit can take the
  # rendezvous down with it. A fresh one each attempt: the last one's rendezvous is closed.
  mkdir -p {run_dir}/"$head" || exit 1
  (
    node=$head
    cd {run_dir}/"$node" || exit 1
    exec {store_cmd}
  ) >>{run_dir}/"$head"/{STORE_OUT} 2>&1 &
  store=$!
"""
            wait_step = f"""  # Whichever ends first: srun (the step is over) or the store (the step cannot go on).
  wait -n
  if kill -0 "$agents" 2>/dev/null; then
    wait "$store"
    code=$?
    [ "$final" = 1 ] && echo "$code" >{run_dir}/"$head"/{STORE_EXIT}
    echo "launch: the rendezvous store on $head exited with code $code; stopping the nodes"
    kill -TERM "$agents"
    wait "$agents"
    status=1
  else
    wait "$agents"
    status=$?
    kill -TERM "$store" 2>/dev/null
    wait "$store"
  fi
"""
        else:
            start_store = ""
            wait_step = '  wait "$agents"\n  status=$?\n'
        purpose = comment_block(f"Runs on the allocation's first node, the head: starts {what}.")
        node_comment = comment_block(
            "One node: its address is the source address of its route to the head, its "
            "interface the one holding that address (GLOO/NCCL_SOCKET_IFNAME); its files go to "
            "the node's own folder, its job runs in "
            f"{'the workdir' if workdir else 'that folder'}. $2: the step's attempt (0, then one "
            "more per restart); $3: 1 when no restart may follow it.")
        return f"""#!/bin/bash
{header}
{submitted}
{purpose}
set -u

{node_comment}
run_node() {{
  local node=$SLURMD_NODENAME head_addr=$1 attempt=$2 final=$3 addr iface omp_threads agent
  local code stopped= dir node_rank=$SLURM_NODEID launch_attempt=$(( {self.attempt_base} + $2 ))
  dir={run_dir}/"$node"
  mkdir -p "$dir" {checkpoints} && cd "$dir" || exit 1
  exec >>"$dir"/{AGENT_OUT} 2>&1
  addr=$(ip -4 -o route get "$head_addr" | sed -n 's/.* src \\([^ ]*\\).*/\\1/p')
  iface=$(ip -4 -o addr show to "$addr/32" | awk '{{sub(/@.*/, "", $2); print $2; exit}}')
  if [ -z "$addr" ] || [ -z "$iface" ]; then
    echo "launch: node $node found no address on its route to the head $head_addr (iproute2's ip)"
    finish 1
  fi
  # The node's CPUs in this job, shared by its ranks: one OpenMP thread per CPU, no more.
  omp_threads=$(( ${{SLURM_CPUS_ON_NODE:-1}} / {self.nproc_per_node} ))
  [ "$omp_threads" -ge 1 ] || omp_threads=1
  echo "launch: node $node: address $addr, interface $iface, $omp_threads thread(s) per rank"
{path_line}{go_to_work}{setup}  # Slurm stops a job by signalling its processes: this shell waits for the agent to stop its
  # workers, or Slurm would count the node done while they still run; a node stopped so
  # records -15 (SIGTERM), one that ended by itself its agent's exit code.
  trap 'stopped=1; kill -TERM "$agent" 2>/dev/null' TERM
  {node_cmd} &
  agent=$!
  while :; do
    wait "$agent"
    code=$?
    kill -0 "$agent" 2>/dev/null || break
  done
  [ -z "$stopped" ] || code=-15
  finish "$code"
}}
# The node's end: its exit_code, which launch follows; a step that may be restarted writes the
# attempt's own (exit_code.<attempt>) and the batch script decides which one ends the run.
finish() {{
  if [ "$final" = 1 ]; then echo "$1" >"$dir"/{EXIT_FILE}; else echo "$1" >"$dir"/{EXIT_FILE}.$attempt; fi
  exit "$1"
}}
export -f run_node finish

head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# NodeAddr may be a name: the store and the agents want the address.
node_address() {{
  local addr
  addr=$(scontrol show node -o "$1" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
  getent ahostsv4 "$addr" | awk 'NR == 1 {{print $1}}'
}}
head_addr=$(node_address "$head")
if [ -z "$head_addr" ]; then
  echo "launch: no IPv4 address for the head node $head (its NodeAddr in scontrol show node)"
  exit 1
fi
# Every node's address, head first (LAUNCH_NODE_ADDRS).
node_addrs=
for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  node_addrs=${{node_addrs:+$node_addrs,}}$(node_address "$name")
done
export node_addrs
echo "launch: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, head $head ($head_addr)"

restarts={restarts}
attempt=0
while :; do
  final=$(( attempt >= restarts ? 1 : 0 ))
{start_store}  srun --export=ALL --kill-on-bad-exit=1 --nodes={self.nnodes} --ntasks={self.nnodes} \\
    --ntasks-per-node=1 bash -c 'run_node "$@"' run_node "$head_addr" "$attempt" "$final" &
  agents=$!
{wait_step}  if [ "$status" -eq 0 ] || [ "$final" = 1 ]; then
    break
  fi
  attempt=$(( attempt + 1 ))
  echo "launch: the step ended with exit code $status; starting every node again (restart $attempt of $restarts)"
done
# A step that could have been restarted left exit_code.<attempt>: the run ends with it.
if [ "$final" != 1 ]; then
  for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    if [ -f {run_dir}/"$name"/{EXIT_FILE}.$attempt ]; then
      cp {run_dir}/"$name"/{EXIT_FILE}.$attempt {run_dir}/"$name"/{EXIT_FILE}
    fi
  done
fi
exit "$status"
"""

    # ---- printing ----------------------------------------------------------------------
    def render(self) -> str:
        s = self.settings
        where = ", ".join(x for x in (f"partition {s.partition}" if s.partition else
                                      "the default partition",
                                      f"account {s.account}" if s.account else "",
                                      f"time limit {s.time}" if s.time else "") if x)
        per_node = (f"{self.nproc_per_node} process(es) = world size {self.world_size}"
                    if self.store else "1 command per node (it starts its own processes)")
        lines = [
            f"run {self.run_id}: recipe {self.recipe_name} ({self.recipe_source})",
            f"  job: {self.job.describe()}",
            f"  Slurm batch job: {self.nnodes} node(s) x {per_node}, {where}; c10d rendezvous "
            f"at {self.rdzv_endpoint} on the allocation's first node (id {self.run_id})",
            *(f"  note: {note}" for note in self.notes),
            "", *environment_lines(False, login=(
                "here, of the environment sbatch gives the job (launch's own) the variables a "
                "login would set, with Slurm's SLURM_* and the GPUs it gave the step: "
                "run_node's `login` below")),
            *render_workdir(self.workdir, self.job.setup),
            "",
            "submit:",
            "  " + shlex.join(self.sbatch_argv()),
            "",
            f"{self.script_path}:",
            self.script(shown=True),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        def command(cmd: NodeCommand) -> dict[str, Any]:
            return {"argv": [fill(a, {}) for a in cmd.argv],
                    "env": {k: fill(v, {}) for k, v in cmd.shown_env().items()},
                    "cwd": fill(cmd.cwd or "", {})}

        return {
            "run_id": self.run_id,
            "backend": "slurm",
            "recipe": {"name": self.recipe_name, "source": self.recipe_source,
                       "base_dir": self.recipe_base_dir},
            "rendezvous": {"backend": "c10d", "endpoint": self.rdzv_endpoint,
                           "id": self.run_id},
            "nnodes": self.nnodes, "nproc_per_node": self.nproc_per_node,
            "world_size": self.world_size,
            "run_dir": self.run_dir,
            "sbatch": {"argv": self.sbatch_argv(), "script": self.script_path},
            "script": self.script(shown=True),
            "job": self.job.to_json(),
            "workdir": self.workdir.to_json() if self.workdir is not None else None,
            "node": command(self.node),
            "store": command(self.store) if self.store else None,
            "notes": list(self.notes),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    # ---- once Slurm has placed it ------------------------------------------------------
    def run_plan(self, nodes: list[tuple[str, str]],
                 found: dict[str, dict[str, str]] | None = None) -> RunPlan:
        """The plan with the allocation's nodes, head first ((name, NodeAddr) pairs), and
        what each node reported about itself (`found`, see node_facts), for plan.json and
        the run's bookkeeping."""
        found = found or {}
        head_name, head_addr = nodes[0]
        head_addr = found.get(head_name, {}).get("addr", head_addr)

        addrs = ",".join(found.get(name, {}).get("addr", addr) for name, addr in nodes)

        def place(cmd: NodeCommand, name: str, addr: str, is_head: bool) -> NodeCommand:
            values = {"node": name, "addr": addr, "head_addr": head_addr,
                      "node_rank": str([n for n, _ in nodes].index(name)),
                      "node_addrs": addrs, **found.get(name, {})}
            return replace(cmd, name=name, address=addr, private_address=values["addr"],
                           is_head=is_head, argv=tuple(fill(a, values) for a in cmd.argv),
                           env={k: fill(v, values) for k, v in cmd.env.items()},
                           run_dir=f"{self.run_dir}/{name}",
                           cwd=f"{self.run_dir}/{name}")

        commands = tuple(place(self.node, name, addr, i == 0)
                         for i, (name, addr) in enumerate(nodes))
        return RunPlan(run_id=self.run_id, recipe_name=self.recipe_name,
                       recipe_source=self.recipe_source,
                       rdzv_endpoint=fill(self._endpoint(), {"head_addr": head_addr}),
                       nproc_per_node=self.nproc_per_node, nodes=commands,
                       notes=self.notes, job=self.job, workdir=self.workdir,
                       store=place(self.store, head_name, head_addr, True)
                       if self.store else None, recovery=self.recovery,
                       recipe_base_dir=self.recipe_base_dir)


_FACTS = re.compile(r"^launch: node (?P<node>\S+): address (?P<addr>\S+), interface "
                    r"(?P<iface>\S+), (?P<omp_threads>\d+) thread\(s\) per rank$")


def node_facts(first_line: str) -> dict[str, str] | None:
    """What a node's job script reported about itself (its first line of output)."""
    m = _FACTS.match(first_line.strip())
    return None if m is None else {k: m[k] for k in ("addr", "iface", "omp_threads")}
