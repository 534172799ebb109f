"""Wait for SSH on new instances and record their host keys.

A key is trusted when the instance's console output (written by cloud-init, read through the EC2
API, so not through the network path an attacker could sit on) lists it. When the console output
is not there yet, the key seen over SSH is recorded and the summary says it was taken on first use.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko

from launcher.errors import LauncherError

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


def scan(host: str, port: int = 22, timeout: float = 10.0) -> str:
    """The host key an SSH server offers, as "<type> <base64>"."""
    sock = socket.create_connection((host, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        transport.close()


def wait_for_ssh(hosts: list[str], *, port: int = 22, timeout: float = 600.0,
                 delay: float = 5.0, sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Scanned host key per host, once every host answers; SshWaitError naming those that don't."""
    deadline = time.monotonic() + timeout
    keys: dict[str, str] = {}
    errors: dict[str, str] = {}
    while True:
        for host in hosts:
            if host in keys:
                continue
            try:
                keys[host] = scan(host, port, timeout=min(10.0, timeout))
                errors.pop(host, None)
            except (OSError, paramiko.SSHException, EOFError) as err:
                errors[host] = str(err) or type(err).__name__
        if len(keys) == len(hosts):
            return keys
        if time.monotonic() + delay > deadline:
            missing = ", ".join(f"{h} ({errors.get(h, 'no answer')})" for h in hosts
                                if h not in keys)
            raise SshWaitError(
                f"SSH did not answer within {timeout:.0f} s on {missing}. Check that --ssh-cidr "
                "covers this machine's address and that nothing between blocks port 22"
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
