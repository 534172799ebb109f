from __future__ import annotations

import sys
from pathlib import Path

from launcher.lab.slurm import SlurmLab


def slurm_env(lab: SlurmLab) -> dict[str, str]:
    """How a user on the login node points launch at the lab; nothing from the caller's own
    Slurm setup."""
    return {"SLURM_CONF": str(lab.conf)}


def slurm_args(*args: str) -> list[str]:
    """--slurm with the interpreter that has torch: the lab's nodes share this machine's."""
    return ["--slurm", "--python", sys.executable, *args]


def job_processes(lab: SlurmLab) -> dict[str, list[str]]:
    """What runs on each host besides its slurmd: must be nothing once a run has ended."""
    left = {}
    for host in lab.hosts:
        found = []
        for pid in lab.job_pids(host.name):
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                             .decode(errors="replace").strip())
            except OSError:
                continue
        if found:
            left[host.name] = found
    return left


def worker_pids(lab: SlurmLab, host: str) -> list[int]:
    """Trainer ranks (not their torchrun agent) running on a lab host."""
    found = []
    for pid in lab.job_pids(host):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" not in args and any(a.endswith(b"train/main.py")
                                                        for a in args):
            found.append(pid)
    return found


def jobs(lab: SlurmLab) -> list[str]:
    """Job ids slurmctld knows (any state)."""
    proc = lab.client(["squeue", "--noheader", "--states=all", "--format=%i %T"])
    return proc.stdout.split("\n") if proc.stdout.strip() else []

