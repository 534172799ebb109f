"""SSH connections to nodes (fabric), with host keys verified the way OpenSSH does.

fabric's Connection accepts any unknown host key (paramiko AutoAddPolicy). launch instead
verifies against a known_hosts file, records new keys only when asked (like OpenSSH's
StrictHostKeyChecking=accept-new), and never accepts a changed key.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Connection

from launcher.errors import LauncherError
from launcher.inventory import Node

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_KNOWN_HOSTS_OPT = re.compile(r"UserKnownHostsFile[= ](\S+)")


class HostProblem(LauncherError):
    """One node's problem, named by host, with what to do."""

    def __init__(self, host: str, why: str):
        self.host, self.why = host, why
        super().__init__(f"host {host}: {why}")


def known_hosts_for(node: Node, override: str | None) -> Path:
    """--known-hosts, else the inventory's `-o UserKnownHostsFile=` (so Ansible and launch
    agree on one file), else ~/.ssh/known_hosts."""
    if override:
        return Path(override).expanduser()
    common = str(node.extra.get("ansible_ssh_common_args") or "")
    for word in shlex.split(common):
        m = _KNOWN_HOSTS_OPT.search(word)
        if m:
            return Path(m.group(1)).expanduser()
    return Path(os.environ.get("LAUNCH_KNOWN_HOSTS", DEFAULT_KNOWN_HOSTS)).expanduser()


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Record an unknown key in the known_hosts file (a changed key still fails earlier:
    paramiko raises BadHostKeyException before consulting the policy)."""

    _lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


@dataclass(frozen=True)
class SshOptions:
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0

    @classmethod
    def from_args(cls, args) -> SshOptions:
        known = args.known_hosts
        if known and Path(known).expanduser().is_dir():
            raise LauncherError(f"--known-hosts {known} is a folder: give the known_hosts file "
                                "(e.g. ~/.ssh/known_hosts)")
        return cls(known_hosts=known, accept_new_host_keys=args.accept_new_host_keys)


def connect(node: Node, options: SshOptions) -> Connection:
    """An open fabric Connection to the node, or HostProblem saying what went wrong."""
    known_hosts = known_hosts_for(node, options.known_hosts)
    kwargs: dict = {"banner_timeout": options.connect_timeout,
                    "auth_timeout": options.connect_timeout}
    if node.key_file:
        key = Path(node.key_file).expanduser()
        if not key.exists():
            raise HostProblem(node.name, f"private key {key} (ansible_ssh_private_key_file) "
                                         "does not exist")
        # Only the inventory's key: a stray agent or ~/.ssh key must not make a wrong
        # inventory look right.
        kwargs.update(key_filename=str(key), look_for_keys=False, allow_agent=False)
    conn = Connection(node.address, user=node.user, port=node.port,
                      connect_timeout=options.connect_timeout, connect_kwargs=kwargs)
    client = paramiko.SSHClient()
    if known_hosts.exists():
        client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(
        _AcceptNew(known_hosts) if options.accept_new_host_keys else paramiko.RejectPolicy())
    conn.client = client
    where = f"{node.address}:{node.port}"
    try:
        conn.open()
    except paramiko.BadHostKeyException as err:
        raise HostProblem(
            node.name,
            f"HOST KEY CHANGED for {where} (known_hosts {known_hosts} has a different "
            f"{err.expected_key.get_name()} key). This can be an attack, or a re-created "
            f"instance; if you know it is the latter, remove the old key with "
            f"`ssh-keygen -f {known_hosts} -R {node.address}` and connect again",
        ) from None
    except paramiko.AuthenticationException:
        raise HostProblem(
            node.name,
            f"SSH authentication as {conn.user!r} at {where} failed with key "
            f"{node.key_file or '(default keys)'}: check ansible_user and "
            "ansible_ssh_private_key_file",
        ) from None
    except paramiko.SSHException as err:
        if "not found in known_hosts" in str(err):
            raise HostProblem(
                node.name,
                f"the host key of {where} is not in {known_hosts}; verify the host and pass "
                "--accept-new-host-keys to record it (or add it with ssh-keyscan)",
            ) from None
        raise HostProblem(node.name, f"SSH to {where} failed: {err}") from None
    except (socket.timeout, TimeoutError):
        raise HostProblem(node.name, f"SSH to {where} timed out after "
                                     f"{options.connect_timeout:.0f}s: is the host up and "
                                     "port open?") from None
    except OSError as err:
        raise HostProblem(node.name, f"cannot reach {where}: "
                                     f"{err.strerror or err}; is the host up and "
                                     "ansible_host/ansible_port right?") from None
    transport = conn.client.get_transport()
    if transport is not None:
        transport.set_keepalive(5)  # notice a dead link in seconds, not at the TCP timeout
    return conn


def remote(*argv: str) -> str:
    """The one place a remote shell receives a string: every argument quoted."""
    return shlex.join(argv)
