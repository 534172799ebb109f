"""Inside a Slurm job: each node's process (a torchrun agent, the rendezvous store, a sidecar,
setup) is a job step of its own (`srun --overlap --nodes=1 --nodelist=NODE`), started, streamed
and signalled by the run's pipeline on the allocation's first node, as SSH nodes are over their
connections. A step's output comes back through srun; its end is srun's exit status; stopping
it is a signal srun forwards to the step's processes, and `scancel JOB.STEP` when one must die
at once. Slurm ends whatever is left of a step when the step ends.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from launcher.backends.slurm.slurmctl import SlurmError, said, slurm
from launcher.execute.watcher_answers import KeptWatcher, WatcherAnswers, last_line
from launcher.job.runplan import NodeCommand
from launcher.runs.folder import STAMP_ENV

# In the step, before the command: its folders made, the node's interpreter's folder first on
# PATH (its pip, torchrun), then the command in its working folder, with only the variables
# of the step's environment a login would have (launcher/job/environment.py: the rule for every
# backend), Slurm's own and the devices it gave the step, and what --export named: the step
# inherits the batch job's whole environment, launch's shell's. $1 run dir, $2 cwd,
# $3 interpreter folder, $4 checkpoint folder or "", $5 the names kept (an extended regex).
STEP_SCRIPT = """mkdir -p "$1" || exit 97
[ -z "$4" ] || mkdir -p "$4" || exit 97
cd "$2" || exit 97
if [ -n "$3" ]; then PATH="$3:$PATH"; export PATH; fi
keep=$5
login=()
for name in $(compgen -e); do
  if [[ $name =~ $keep ]]; then login+=("$name=${!name}"); fi
done
shift 5
exec env -i ${login[@]+"${login[@]}"} "$@"
"""
SLURM_KEPT = ("SLURM.*", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
              "ZE_AFFINITY_MASK")


def kept_names(sbatch_args: tuple[str, ...] | list[str] = (), service: bool = False) -> str:
    """STEP_SCRIPT's regex: a login's variables, Slurm's and its devices', and the NAMEs of
    --export=ALL,NAME=VALUE,... in the job's sbatch arguments; for launch's own services
    (the checkpoint mirror) also the cloud settings the job has from launch's shell."""
    from launcher.job.environment import LOGIN_NAMES, LOGIN_PREFIXES, SERVICE_PREFIXES

    exported = []
    for arg in sbatch_args:
        if arg.startswith("--export="):
            exported += [t.split("=", 1)[0] for t in arg[len("--export="):].split(",")
                         if t and t.upper() != "ALL"]
    names = [*LOGIN_NAMES, *(f"{p}.*" for p in LOGIN_PREFIXES), *SLURM_KEPT,
             *(f"{p}.*" for p in (SERVICE_PREFIXES if service else ())),
             *(re.escape(n) for n in dict.fromkeys(exported))]
    return "^(" + "|".join(names) + ")$"


SIGNALLED_STEP = re.compile(r"^(slurmstepd(-\S+)?: error: \*\*\* STEP \S+ ON \S+ CANCELLED AT|"
                            r"srun: (error: \S+: task \d+: |forcing job termination|Job step "
                            r"aborted|Terminating))")


def job_id() -> str:
    found = os.environ.get("SLURM_JOB_ID")
    if not found:
        raise SlurmError("not inside a Slurm job (no SLURM_JOB_ID): the Slurm backend's "
                         "pipeline runs in the batch job launch submitted")
    return found


def srun_step(node: str, name: str, cpus: int | None = None) -> list[str]:
    """srun for one task on `node`, beside the job's other steps (--overlap: the pipeline's
    steps share the allocation), named for `scancel`."""
    argv = ["srun", f"--jobid={job_id()}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--quiet", "--kill-on-bad-exit=1", "--export=ALL",
            f"--job-name={name}"]
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")
    return argv


def step_argv(command: NodeCommand, stamp: str, attempt_offset: int = 0,
              keep: str | None = None) -> list[str]:
    env = {**command.env, STAMP_ENV: stamp}
    if attempt_offset:
        env["LAUNCH_ATTEMPT"] = str(int(env.get("LAUNCH_ATTEMPT", "0")) + attempt_offset)
    return ["bash", "-c", STEP_SCRIPT, "launch-step", command.run_dir,
            command.cwd or command.run_dir, os.path.dirname(env.get("LAUNCH_PYTHON", "")),
            env.get("LAUNCH_CHECKPOINT_DIR", ""), keep or kept_names(),
            *(f"{k}={v}" for k, v in env.items()), *command.argv]


def step_ids(name: str) -> list[str]:
    """The job's steps called `name` (squeue), as JOB.STEP."""
    proc = slurm(["squeue", "--steps", f"--jobs={job_id()}", "--noheader", "--format=%i %j"])
    return [line.split()[0] for line in proc.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1] == name]


class StepWatcher:
    """launch_node/node_probe.py `watch` on one node, a step kept for the run: a look is a line
    asked and a line answered, as over SSH (launcher/backends/ssh/watcher.py; the answers'
    framing: launcher/execute/watcher_answers.py). A look once started a step each time:
    srun, a slurmstepd and an interpreter on the node, ~55 ms of a core measured on the lab,
    every 2 s per node for the whole run. The probe reads its stdin to the end: when launch
    closes it, or launch dies, it leaves; the job's end ends it too."""

    def __init__(self, argv: list[str], where: str):
        self.where = where
        self._err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err)
        except FileNotFoundError:
            self._err.close()
            raise SlurmError("`srun` is not installed here: the Slurm backend's pipeline runs "
                             "in a Slurm job, where the client commands are on PATH") from None
        self.answers = WatcherAnswers(where)

    def ask(self, what: str, timeout: float) -> Any:
        """The answer to `what` (activity | heartbeats); LauncherError when none comes."""
        self.proc.stdin.write(f"{what}\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        out = self.proc.stdout.fileno()

        def recv() -> bytes:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise SlurmError(f"the node watcher on {self.where} did not answer in "
                                 f"{timeout:g} s")
            return os.read(out, 1 << 16)

        return self.answers.next(recv, self._last_error)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _last_error(self) -> str:
        self._err.seek(0)
        return last_line(self._err.read(), self.proc.poll())

    def close(self, wait_s: float = 2.0) -> None:
        """End of input: the probe leaves and srun with it; waited for, so that nothing of
        the run is left on the node when launch goes on (killed if it lingers)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass   # it ended already (a broken pipe)
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._err.close()


class StepProcess:
    """One node's process as a job step. `start()` may be called again after it ended (a
    restart): a new step."""

    _count = 0
    _lock = threading.Lock()

    def __init__(self, command: NodeCommand, stamp: str, label: str | None = None,
                 cpus: int | None = None, keep: str | None = None):
        self.name, self.command, self.stamp, self.label = command.name, command, stamp, label
        self.cpus, self.keep = cpus, keep
        self.proc: subprocess.Popen | None = None
        self.step_name = ""
        self.signalled = False
        self.attempt_offset = 0
        self._watcher = KeptWatcher(lambda: StepWatcher(
            [*srun_step(self.name, f"launch-watch-{self.name}"), *self.command.probe, "watch",
             self.command.run_dir, "--stamp", self.stamp, "--node", self.name],
            f"{self.name} (job {job_id()})"))

    def _step_name(self) -> str:
        with StepProcess._lock:
            StepProcess._count += 1
            return f"launch-{self.label or 'node'}-{self.name}-{StepProcess._count}"

    def start(self) -> None:
        self.step_name = self._step_name()
        self.signalled = False
        self.proc = subprocess.Popen(
            [*srun_step(self.name, self.step_name, self.cpus),
             *step_argv(self.command, self.stamp, self.attempt_offset, self.keep)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", bufsize=1, start_new_session=True)

    def run_to_end(self, line) -> int | None:
        self.start()
        assert self.proc is not None and self.proc.stdout is not None
        for text in self.proc.stdout:
            line(text.rstrip("\n"))
        return self.proc.wait()

    def lines(self) -> Iterator[str]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            # Slurm's own report of a step launch signalled: no news.
            if self.signalled and SIGNALLED_STEP.match(line):
                continue
            yield line

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        """The signal to the step's processes, by Slurm (`scancel --signal JOB.STEP`; measured
        on the lab: a SIGTERM to srun itself cancels the step, the task killed without its
        signal handler running). srun ends with the step."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signalled = True
        steps: list[str] = []
        for _ in range(10):   # a step just started is known to slurmctld a moment later
            steps = step_ids(self.step_name)
            if steps or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        for step in steps:
            slurm(["scancel", f"--signal={signal.Signals(sig).name.removeprefix('SIG')}", step],
                  timeout=30)
        if not steps and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL if sig == signal.SIGKILL else signal.SIGTERM)

    # ---- the hang watch (launcher/execute/watch.py) ---------------------------------------
    def _probe(self, *args: str, timeout: float) -> Any:
        """launch_node/node_probe.py on the node, as a step of its own."""
        proc = slurm([*srun_step(self.name, f"launch-probe-{self.name}"), *self.command.probe,
                      *args], timeout=timeout)
        if proc.returncode != 0:
            raise SlurmError(f"node probe on {self.name} (job {job_id()}) exited "
                             f"{proc.returncode}: {said(proc)[-300:]}")
        return json.loads(proc.stdout)

    def heartbeats(self) -> list[dict[str, Any]]:
        # The ranks write them into the node's folder, on the filesystem the nodes share with
        # the pipeline: read here, as the probe on the node would read them, instead of a
        # job step and an interpreter on the node every look.
        from launch_node.node_probe import read_heartbeats

        return read_heartbeats(self.command.run_dir)

    def activity(self) -> dict[str, Any]:
        return self._watcher.ask("activity")

    def dump_ranks(self, timeout: float) -> dict[str, Any]:
        return self._probe("dump", self.command.run_dir, "--stamp", self.stamp, "--timeout",
                           f"{timeout:g}", "--node", self.name, timeout=3 * timeout + 15)

    def kill_ranks(self, pids: list[int]) -> dict[str, Any]:
        return self._probe("kill", "--stamp", self.stamp, *map(str, pids), timeout=30)

    def close(self) -> None:
        self._watcher.close()


# The node's facts, from the node (one step on every node at once): its address on its route
# to the head, the interface holding it, its CPUs in this job, its GPUs in this job.
FACTS_SCRIPT = r"""head=$1
addr=$(ip -4 -o route get "$head" | sed -n 's/.* src \([^ ]*\).*/\1/p')
iface=$(ip -4 -o addr show to "$addr/32" | awk '{sub(/@.*/, "", $2); print $2; exit}')
gpus=0
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .); fi
echo "@launch-facts $SLURMD_NODENAME $addr $iface ${SLURM_CPUS_ON_NODE:-1} $gpus"
"""


def parse_facts(text: str) -> dict[str, dict]:
    """FACTS_SCRIPT's lines, by node."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "@launch-facts":
            _, name, addr, iface, cpus, gpus = parts
            found[name] = {"addr": addr, "iface": iface, "cpus": int(cpus) if cpus.isdigit()
                           else 1, "gpus": int(gpus) if gpus.isdigit() else 0}
    return found


def node_facts(count: int, head_addr: str, gpus_per_node: int | None) -> dict[str, dict]:
    """Every node's facts, by Slurm name."""
    argv = ["srun", f"--jobid={job_id()}", "--overlap", f"--nodes={count}",
            f"--ntasks={count}", "--ntasks-per-node=1", "--quiet", "--export=ALL",
            "--job-name=launch-facts"]
    if gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    proc = slurm([*argv, "bash", "-c", FACTS_SCRIPT, "launch-facts", head_addr], timeout=120)
    found = parse_facts(proc.stdout)
    if len(found) < count:
        raise SlurmError(f"the nodes of job {job_id()} did not all say where they are "
                         f"({len(found)} of {count} answered): {said(proc)[-500:]}")
    missing = [n for n, f in found.items() if not f["addr"] or not f["iface"]]
    if missing:
        raise SlurmError(f"node(s) {', '.join(missing)} found no address on their route to the "
                         f"head {head_addr} (iproute2's ip)")
    return found
