"""How launch reaches hosts over SSH, as the command line says it (--known-hosts,
--accept-new-host-keys): a value every command and backend passes along. Kept apart from
launcher/cluster/ssh.py's connections so that a command that never connects (a local run, a
Slurm job, a dry run) does not import paramiko and fabric: ~0.13 s of CPU at every start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SshOptions:
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
