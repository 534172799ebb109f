"""Wait for SSH on new instances and record their host keys.

A key is trusted when the instance's console output (written by cloud-init, read through the EC2
API, so not through the network path an attacker could sit on) lists it. When the console output
is not there yet, the key seen over SSH is recorded and the summary says it was taken on first use.
"""

from __future__ import annotations

import base64
import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko

from launcher.core.errors import LauncherError

# paramiko logs every failed handshake with a traceback on stderr; an instance still booting
# fails many, and wait_for_ssh reports the last error per host itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
END = "-----END SSH HOST KEY KEYS-----"


class SshWaitError(LauncherError):
    exit_code = 1


class HostKeyMismatch(LauncherError):
    exit_code = 1


@dataclass(frozen=True)
class HostKey:
    host: str
    key: str          # "<type> <base64>"
    verified: bool    # listed in the console output


class Tunnel:
    """An SSH connection to a jump host (the head, or --jump) that reaches the hosts behind it.

    The jump host's own key must already be trusted (`known`: "<type> <base64>" lines for it):
    a tunnel through an unverified host would make every key scanned through it worthless.
    """

    def __init__(self, host: str, port: int, user: str | None, key_file: str | None,
                 known: list[str], timeout: float = 10.0):
        self.host, self.port, self.user, self.key_file = host, port, user, key_file
        self.known, self.timeout = known, timeout
        self.client: paramiko.SSHClient | None = None

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        for line in self.known:
            kind, blob = line.split()[:2]
            client.get_host_keys().add(name, kind, paramiko.PKey.from_type_string(
                kind, base64.b64decode(blob)))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(self.host, port=self.port, username=self.user,
                       key_filename=self.key_file, look_for_keys=False, allow_agent=False,
                       timeout=self.timeout, banner_timeout=self.timeout,
                       auth_timeout=self.timeout)
        return client

    def open(self, host: str, port: int) -> paramiko.Channel:
        if self.client is None or not self.client.get_transport() \
                or not self.client.get_transport().is_active():
            self.client = self._connect()
        transport = self.client.get_transport()
        assert transport is not None
        return transport.open_channel("direct-tcpip", (host, port), ("", 0),
                                      timeout=self.timeout)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def scan(host: str, port: int = 22, timeout: float = 10.0, tunnel: Tunnel | None = None) -> str:
    """The host key an SSH server offers, as "<type> <base64>" (through `tunnel` if given)."""
    sock = tunnel.open(host, port) if tunnel else socket.create_connection((host, port),
                                                                           timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


def wait_for_ssh(hosts: list[str], *, port: int = 22, timeout: float = 600.0,
                 delay: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                 tunnel: Tunnel | None = None) -> dict[str, str]:
    """Scanned host key per host, once every host answers; SshWaitError naming those that don't.
    With `tunnel`, the hosts are reached through it (their private addresses)."""
    deadline = time.monotonic() + timeout
    keys: dict[str, str] = {}
    errors: dict[str, str] = {}
    while True:
        for host in hosts:
            if host in keys:
                continue
            try:
                keys[host] = scan(host, port, timeout=min(10.0, timeout), tunnel=tunnel)
                errors.pop(host, None)
            except paramiko.BadHostKeyException as err:
                raise HostKeyMismatch(
                    f"jump host {err.hostname} offered a host key other than the one recorded "
                    "for it: something may be intercepting SSH; nothing was recorded") from None
            except (OSError, paramiko.SSHException, EOFError) as err:
                errors[host] = str(err) or type(err).__name__
        if len(keys) == len(hosts):
            return keys
        if time.monotonic() + delay > deadline:
            missing = ", ".join(f"{h} ({errors.get(h, 'no answer')})" for h in hosts
                                if h not in keys)
            via = f" through {tunnel.host}" if tunnel else ""
            raise SshWaitError(
                f"SSH did not answer within {timeout:.0f} s on {missing}{via}. Check that "
                "--ssh-cidr covers this machine's address and that nothing between blocks port 22"
            )
        sleep(delay)


def console_keys(console_output: str) -> list[str]:
    """Host keys cloud-init printed to the console, as "<type> <base64>" lines."""
    keys: list[str] = []
    inside = False
    for line in console_output.splitlines():
        # Console lines can carry a "[   12.3] cloud-init[...]:" style prefix; match the markers
        # anywhere in the line and take the key from the "<type> <base64>" pair.
        if BEGIN in line:
            inside = True
            continue
        if END in line:
            inside = False
            continue
        if inside:
            parts = line.split()
            for i, part in enumerate(parts[:-1]):
                if part.startswith(("ssh-", "ecdsa-")):
                    keys.append(f"{part} {parts[i + 1]}")
                    break
    return keys


def trusted_keys(host: str, scanned: str, console_output: str) -> list[HostKey]:
    """The keys to record for `host`; HostKeyMismatch when the console contradicts SSH."""
    listed = console_keys(console_output)
    if not listed:
        return [HostKey(host, scanned, verified=False)]
    if scanned not in listed:
        raise HostKeyMismatch(
            f"{host} offered SSH host key {scanned.split()[0]} that its console output does not "
            "list: something between you and the instance may be intercepting SSH. Nothing was "
            "recorded; check the instance before connecting"
        )
    return [HostKey(host, key, verified=True) for key in listed]


def write_known_hosts(path: Path, keys: list[HostKey]) -> None:
    """Replace the lines of these hosts in `path` (addresses are reused by EC2 over time)."""
    hosts = {k.host for k in keys}
    kept: list[str] = []
    if path.exists():
        kept = [line for line in path.read_text().splitlines()
                if line.split(" ", 1)[0] not in hosts]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in kept + [f"{k.host} {k.key}" for k in keys]))
