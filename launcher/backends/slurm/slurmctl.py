"""Talking to Slurm from the login node, the way its users do: the client commands (sinfo,
sbatch, squeue, scontrol, scancel, srun) found on PATH, pointed at a cluster by SLURM_CONF or
the default /etc/slurm/slurm.conf. Parsing is kept apart from calling, and is pure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from launcher.core.errors import LauncherError

CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
# Job states after which nothing of the job runs anywhere (a job whose processes are still
# being killed shows COMPLETING, not one of these).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
GONE = "GONE"   # no longer known to slurmctld (purged after MinJobAge)
# Node states (sinfo %T) in which a node takes new jobs, now or when its current ones end;
# cloud nodes powered down to save money ("idle~") boot on demand and count too.
USABLE_STATES = {"idle", "mixed", "allocated", "completing", "planned"}


class SlurmError(LauncherError):
    pass


def missing_clients() -> list[str]:
    return [tool for tool in CLIENTS if shutil.which(tool) is None]


def slurm(argv: list[str], timeout: float = 30.0,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One client command (`env` added to launch's own environment, which sbatch and srun
    hand to the job); its non-zero exit is the caller's to read."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, **env} if env else None)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed here: launch --slurm runs on a Slurm "
                         "login node, where the Slurm client commands are on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv[:3])}` got no answer in {timeout:.0f} s: is "
                         f"slurmctld up? ({where_conf()})") from None


def where_conf() -> str:
    conf = os.environ.get("SLURM_CONF")
    return f"SLURM_CONF={conf}" if conf else "the cluster in /etc/slurm/slurm.conf"


def said(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}")


# ---- partitions and nodes ---------------------------------------------------------------

@dataclass
class Partition:
    name: str
    default: bool = False
    up: bool = True
    nodes: dict[str, str] = field(default_factory=dict)   # node name -> state (sinfo %T)
    cpus: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)    # from GRES gpu[:type]:N

    @property
    def usable(self) -> list[str]:
        return [n for n, state in self.nodes.items() if node_usable(state)]

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for state in self.nodes.values():
            counts[state] = counts.get(state, 0) + 1
        states = ", ".join(f"{c} {s}" for s, c in sorted(counts.items()))
        flags = (" (default)" if self.default else "") + ("" if self.up else " (down)")
        return f"{self.name}{flags}: {len(self.nodes)} node(s): {states or 'none'}"


def node_usable(state: str) -> bool:
    """`idle`, `idle~` (powered down), `mixed`, `allocated+` yes; `down*`, `drained`,
    `idle*` (not responding), `idle$` (a maintenance reservation) no. The suffixes are
    sinfo(1)'s NODE STATE CODES."""
    base = state.rstrip("*~#!%$@^-+")
    flags = state[len(base):]
    return base in USABLE_STATES and "*" not in flags and "$" not in flags


SINFO_FORMAT = "%P|%N|%T|%c|%G|%a"


def parse_sinfo(text: str) -> dict[str, Partition]:
    """`sinfo --noheader --Node --format=%P|%N|%T|%c|%G|%a`: one line per node and partition."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        name, node, state, cpus, gres, avail = fields
        default = name.endswith("*")
        name = name.rstrip("*")
        part = out.setdefault(name, Partition(name))
        part.default = part.default or default
        part.up = avail == "up"
        part.nodes[node] = state
        if cpus.isdigit():
            part.cpus[node] = int(cpus)
        part.gpus[node] = gres_gpus(gres)
    return out


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: 'gpu:8', 'gpu:a100:8(S:0-1)', 'gpu:4,nic:1' -> 8, 8, 4."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m[1])
    return total


def partitions() -> dict[str, Partition]:
    proc = slurm(["sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"])
    if proc.returncode != 0:
        raise SlurmError(f"sinfo failed ({where_conf()}): {said(proc)}")
    return parse_sinfo(proc.stdout)


def hostnames(nodelist: str) -> list[str]:
    """A hostlist expression (n[0-3,7]) as names, in Slurm's order."""
    proc = slurm(["scontrol", "show", "hostnames", nodelist])
    if proc.returncode != 0:
        raise SlurmError(f"scontrol show hostnames {nodelist}: {said(proc)}")
    return proc.stdout.split()


def node_addresses(names: list[str]) -> dict[str, str]:
    """NodeAddr of each node (the address slurmctld reaches it at; may be a name)."""
    proc = slurm(["scontrol", "show", "node", "--oneliner", ",".join(names)])
    found = {}
    for line in proc.stdout.splitlines():
        name, addr = _field(line, "NodeName"), _field(line, "NodeAddr")
        if name:
            found[name] = addr or name
    return {n: found.get(n, n) for n in names}


# ---- jobs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str                 # PENDING, RUNNING, ..., one of FINAL_STATES, or GONE
    reason: str = ""
    exit_code: str = ""        # "1:0": the batch script's exit code, and the signal
    nodelist: str = ""
    partition: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES or self.state == GONE

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING") or self.final

    def describe(self) -> str:
        text = f"job {self.job_id} {self.state}"
        if self.state == "PENDING" and self.reason and self.reason != "None":
            text += f" ({self.reason})"
        if self.state == "RUNNING" and self.nodelist:
            text += f" on {self.nodelist}"
        if self.final and self.exit_code:
            text += f", exit code {self.exit_code}"
        return text

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "state": self.state, "reason": self.reason,
                "exit_code": self.exit_code, "nodelist": self.nodelist,
                "partition": self.partition}


def _field(line: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", line)
    return m[1] if m else ""


def parse_job(job_id: str, text: str) -> JobInfo:
    """`scontrol show job --oneliner ID`."""
    line = next((ln for ln in text.splitlines() if f"JobId={job_id}" in ln), "")
    if not line:
        return JobInfo(job_id, GONE)
    nodelist = _field(line, "NodeList")
    return JobInfo(job_id, _field(line, "JobState"), _field(line, "Reason"),
                   _field(line, "ExitCode"), "" if nodelist == "(null)" else nodelist,
                   _field(line, "Partition"))


def job_info(job_id: str) -> JobInfo:
    proc = slurm(["scontrol", "show", "job", "--oneliner", job_id])
    if proc.returncode != 0 and "Invalid job id" in proc.stderr:
        return JobInfo(job_id, GONE)
    if proc.returncode != 0:
        raise SlurmError(f"scontrol show job {job_id}: {said(proc)}")
    return parse_job(job_id, proc.stdout)


def scancel(job_id: str, *, kill: bool = False) -> None:
    """Cancel the job (SIGTERM to every process, SIGKILL after KillWait), or with `kill`
    SIGKILL to all of them, batch script included, at once."""
    argv = ["scancel", "--signal=KILL", "--full", job_id] if kill else ["scancel", job_id]
    slurm(argv, timeout=30)
