"""SSH connections to nodes (fabric), with host keys verified the way OpenSSH does.

fabric's Connection accepts any unknown host key (paramiko AutoAddPolicy). launch instead
verifies against a known_hosts file, records new keys only when asked (like OpenSSH's
StrictHostKeyChecking=accept-new), and never accepts a changed key.

Nodes behind a jump host (a cluster whose only public address is its head, or a bastion) say
so in the inventory the way Ansible reads it: `-o ProxyCommand=ssh ... -W %h:%p HOST` or
`-o ProxyJump=HOST` in `ansible_ssh_common_args`. `connect()` opens the same path with fabric's
gateway, checking the jump host's key as well as the node's.
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

from launcher.cluster.inventory import Node
from launcher.cluster.ssh_options import SshOptions
from launcher.core import safefile
from launcher.core.errors import LauncherError

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
# A known_hosts file of 100,000 hosts is a few MB; a private key a few KB. Anything bigger
# (an inventory naming /dev/zero grew launch to 3 GB) is not one.
MAX_KNOWN_HOSTS = 64 * safefile.MIB
MAX_KEY_FILE = 1 * safefile.MIB
_HOP = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?P<host>[^:\s]+)(?::(?P<port>[0-9]+))?")
# Seconds a connection's data may stay unacknowledged before it counts as dead.
DEAD_LINK_S = 20.0
# ssh flags that take no value, so a ProxyCommand's destination can be told from its options.
_SSH_FLAGS = set("46AaCfGgKkMNnqsTtVvXxYy")


class HostProblem(LauncherError):
    """One node's problem, named by host, with what to do."""

    def __init__(self, host: str, why: str):
        self.host, self.why = host, why
        super().__init__(f"host {host}: {why}")


def ssh_options(common: str) -> list[tuple[str, str]]:
    """(lower-case option, value) for each `-o Key=Value` / `-oKey Value` / `-J hops` in an
    OpenSSH argument string such as ansible_ssh_common_args, in order."""
    words = shlex.split(common or "")
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-o", "-J") and i + 1 < len(words):
            value, i = words[i + 1], i + 2
            if word == "-J":
                out.append(("proxyjump", value))
                continue
        elif word.startswith("-o") and len(word) > 2:
            value, i = word[2:], i + 1
        else:
            i += 1
            continue
        key, sep, rest = value.partition("=")
        if not sep:
            key, _, rest = value.partition(" ")
        out.append((key.strip().lower(), rest.strip()))
    return out


def _options_of(node: Node) -> list[tuple[str, str]]:
    common = str(node.extra.get("ansible_ssh_common_args") or "")
    try:
        return ssh_options(common)
    except ValueError as err:
        raise HostProblem(node.name, f"ansible_ssh_common_args {common!r} is not valid shell "
                                     f"quoting ({err})") from None


def _option(node: Node, name: str) -> str | None:
    # OpenSSH: the first value given for an option wins.
    return next((v for k, v in _options_of(node) if k == name), None)


def known_hosts_for(node: Node, override: str | None) -> Path:
    """--known-hosts, else the inventory's `-o UserKnownHostsFile=` (so Ansible and launch
    agree on one file), else ~/.ssh/known_hosts."""
    if override:
        return Path(override).expanduser()
    value = _option(node, "userknownhostsfile")
    if value:
        return Path(value.split()[0]).expanduser()
    return Path(os.environ.get("LAUNCH_KNOWN_HOSTS", DEFAULT_KNOWN_HOSTS)).expanduser()


def proxy_command(host: str, *, port: int = 22, user: str | None = None,
                  key_file: str | None = None, known_hosts: str | None = None,
                  accept_new: bool = False) -> str:
    """An OpenSSH ProxyCommand that reaches %h:%p through `host`, with the jump host's key
    checked against `known_hosts` (what `launch provision` and the lab write for Ansible).
    `accept_new`: record the jump host's key the first time (its key was not verified yet)."""
    argv = ["ssh"]
    if key_file:
        argv += ["-i", key_file, "-o", "IdentitiesOnly=yes"]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o",
                 f"StrictHostKeyChecking={'accept-new' if accept_new else 'yes'}"]
    argv += ["-o", "BatchMode=yes", "-p", str(port), "-W", "%h:%p",
             f"{user}@{host}" if user else host]
    return shlex.join(argv)


def ssh_common_args(known_hosts: str | None = None, proxy: str | None = None,
                    strict: bool = True) -> str:
    """ansible_ssh_common_args: the host key file and, for a node behind a jump host, the
    ProxyCommand. One string for Ansible's ssh and for `connect()` alike. Without `strict`
    the file is named but Ansible's own accept-new policy applies (keys not yet recorded)."""
    parts: list[str] = []
    if known_hosts:
        parts += ["-o", f"UserKnownHostsFile={known_hosts}"]
        if strict:
            parts += ["-o", "StrictHostKeyChecking=yes"]
    if proxy:
        parts += ["-o", f"ProxyCommand={proxy}"]
    return shlex.join(parts)


@dataclass(frozen=True)
class _Hop:
    host: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    jump: str | None = None      # further ProxyJump hops in front of this one


def _parse_hop(text: str) -> _Hop | None:
    m = _HOP.fullmatch(text.strip())
    if not m:
        return None
    return _Hop(m.group("host"), int(m.group("port") or 22), m.group("user"))


def parse_proxy_command(command: str) -> _Hop | None:
    """The jump host of `ssh [options] -W %h:%p [user@]host`; None for any other command."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv or os.path.basename(argv[0]) != "ssh":
        return None
    user = key = known = None
    port, forward, dest = 22, None, None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in ("-i", "-p", "-l", "-o", "-W", "-J", "-F", "-b", "-c", "-E", "-m", "-S"):
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            if word == "-i":
                key = value
            elif word == "-p":
                port = int(value) if value.isdigit() else 0
            elif word == "-l":
                user = value
            elif word == "-W":
                forward = value
            elif word in ("-J", "-F"):
                return None   # nested jumps or another config: leave it to OpenSSH
            elif word == "-o":
                k, _, v = value.partition("=")
                if k.strip().lower() == "userknownhostsfile":
                    known = v.strip().split()[0] if v.strip() else None
                elif k.strip().lower() in ("proxyjump", "proxycommand"):
                    return None
            i += 2
        elif word.startswith("-") and set(word[1:]) <= _SSH_FLAGS:
            i += 1
        elif dest is None and not word.startswith("-"):
            dest, i = word, i + 1
        else:
            return None
    if forward != "%h:%p" or not dest or not port:
        return None
    hop = _parse_hop(dest)
    if hop is None:
        return None
    return _Hop(hop.host, port if port != 22 else hop.port, hop.user or user, key, known)


def load_known_hosts(client: paramiko.SSHClient, path: Path, host: str) -> None:
    """The known_hosts file's keys into the client, read as a regular file of bounded size (a
    FIFO or a device named by an inventory would hang or swamp paramiko's own reader), then
    parsed line by line as paramiko's HostKeys.load does."""
    try:
        text = safefile.read_bytes(path, "known_hosts", max_bytes=MAX_KNOWN_HOSTS).decode(
            "utf-8", errors="replace")
    except safefile.UnsafeFile as err:
        raise HostProblem(host, f"known_hosts {err}") from None
    keys = client.get_host_keys()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except paramiko.SSHException:
            continue
        if entry is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)


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


class _NodeConnection(Connection):
    """A Connection whose jump host connection (if any) opens with a timeout and closes with
    it, and whose transport prefers AES-GCM (_Transport)."""

    def __init__(self, *args, connect_kwargs: dict | None = None, **kwargs):
        super().__init__(*args, connect_kwargs={"transport_factory": _Transport,
                                                **(connect_kwargs or {})}, **kwargs)

    def open_gateway(self):
        if not isinstance(self.gateway, Connection):
            return super().open_gateway()
        self.gateway.open()
        return self.gateway.transport.open_channel(
            kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0),
            timeout=self.connect_timeout)

    def close(self):
        super().close()
        if isinstance(self.gateway, Connection):
            self.gateway.close()


class _Transport(paramiko.Transport):
    """AES-GCM first, as OpenSSH servers offer it: paramiko moved 200 MB a quarter faster with
    it than with its default aes128-ctr + hmac-sha2-256 (an AEAD cipher needs no separate MAC
    pass; measured on the SSH lab for benchmarks/workdir_sync.py). Every cipher paramiko
    accepts stays on the list, for servers without GCM."""

    _preferred_ciphers = (
        "aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
        *(c for c in paramiko.Transport._preferred_ciphers if "-gcm@" not in c))


def _hop_node(node: Node, hop: _Hop) -> Node:
    # As OpenSSH does: the jump host's key is checked against the file its own ssh command
    # names, else the user's known_hosts (command-line options do not reach jump hosts).
    known = hop.known_hosts or os.environ.get("LAUNCH_KNOWN_HOSTS", DEFAULT_KNOWN_HOSTS)
    common = ssh_common_args(known)
    if hop.jump:
        common += " " + shlex.join(["-o", f"ProxyJump={hop.jump}"])
    return Node(name=f"{node.name} (jump host {hop.host})", address=hop.host,
                private_address=hop.host, port=hop.port, user=hop.user or node.user,
                key_file=hop.key_file or node.key_file,
                extra={"ansible_ssh_common_args": common})


def gateway_for(node: Node) -> Node | str | None:
    """What the inventory says stands between this machine and the node: a jump host (as a
    Node to connect to), a ProxyCommand launch cannot read (run as it is), or nothing."""
    for key, value in _options_of(node):
        if key == "proxyjump":
            if value.lower() == "none":
                return None
            *front, last = [h for h in value.split(",") if h.strip()]
            hop = _parse_hop(last)
            if hop is None:
                raise HostProblem(node.name, f"ProxyJump {value!r} in ansible_ssh_common_args "
                                             "is not [user@]host[:port]")
            return _hop_node(node, _Hop(hop.host, hop.port, hop.user,
                                        jump=",".join(front) or None))
        if key == "proxycommand":
            if value.lower() == "none":
                return None
            hop = parse_proxy_command(value)
            return _hop_node(node, hop) if hop else value
    return None


def _open(conn: Connection) -> None:
    try:
        conn.open()
    except BaseException:
        conn.close()   # and the jump host's connection with it
        raise


def connect(node: Node, options: SshOptions) -> Connection:
    """An open fabric Connection to the node, or HostProblem saying what went wrong."""
    # What can be refused here is refused before a jump host's connection is opened for it:
    # one opened and then abandoned stayed open (once per node of a bad inventory).
    known_hosts = known_hosts_for(node, options.known_hosts)
    kwargs: dict = {"banner_timeout": options.connect_timeout,
                    "auth_timeout": options.connect_timeout}
    if node.key_file:
        key = Path(node.key_file).expanduser()
        if not key.exists():
            raise HostProblem(node.name, f"private key {key} (ansible_ssh_private_key_file) "
                                         "does not exist")
        try:   # paramiko reads it itself: a FIFO or a device must not reach it
            safefile.read_bytes(key, "private key", max_bytes=MAX_KEY_FILE)
        except safefile.UnsafeFile as err:
            raise HostProblem(node.name, f"ansible_ssh_private_key_file {err}") from None
        # Only the inventory's key: a stray agent or ~/.ssh key must not make a wrong
        # inventory look right.
        kwargs.update(key_filename=str(key), look_for_keys=False, allow_agent=False)
    client = paramiko.SSHClient()
    if known_hosts.exists():
        load_known_hosts(client, known_hosts, node.name)
    client.set_missing_host_key_policy(
        _AcceptNew(known_hosts) if options.accept_new_host_keys else paramiko.RejectPolicy())
    via = gateway_for(node)
    gateway: Connection | str | None = None
    if isinstance(via, Node):
        try:
            gateway = connect(via, options)
        except HostProblem as problem:
            raise HostProblem(node.name, f"jump host {via.address}: {problem.why}") from None
    elif isinstance(via, str):
        gateway = via
    conn = _NodeConnection(node.address, user=node.user, port=node.port,
                           connect_timeout=options.connect_timeout, connect_kwargs=kwargs,
                           gateway=gateway)
    conn.client = client
    where = f"{node.address}:{node.port}"
    if isinstance(via, Node):
        where += f" (through {via.address})"
    try:
        _open(conn)
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
    except paramiko.ChannelException as err:
        raise HostProblem(
            node.name, f"the jump host could not open a connection to {where} "
                       f"({err.text or err}): is the node up and ansible_host its address?",
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
        if isinstance(transport.sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
            # The keepalives alone only queue up when the host is gone without a word (a
            # machine lost, a spot reclaim): the kernel retried them for ~15 minutes before
            # the connection failed. Unacknowledged for this long, it fails now.
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                      int(DEAD_LINK_S * 1000))
    return conn


def remote(*argv: str) -> str:
    """The one place a remote shell receives a string: every argument quoted."""
    return shlex.join(argv)


def run_with_input(conn: Connection, command: str, data: bytes, *, timeout: float,
                   limit: int = 4 << 20) -> tuple[int, str]:
    """`command` on the open connection with `data` as its stdin, on one exec channel:
    (exit status, stdout and stderr together). invoke's run() feeds a stdin stream to the
    channel a byte at a time. Output past `limit` bytes ends the command (status -1): a node
    cannot grow launch's memory without bound."""
    return Started(conn, command).finish(data, timeout=timeout, limit=limit)


class Started:
    """A command started on the open connection, its stdin given later (`finish`): it runs
    while launch does something else first."""

    def __init__(self, conn: Connection, command: str):
        conn.open()
        self.channel = conn.client.get_transport().open_session()
        try:
            self.channel.set_combine_stderr(True)
            self.channel.exec_command(command)
        except BaseException:
            self.channel.close()
            raise

    def finish(self, data: bytes, *, timeout: float, limit: int = 4 << 20) -> tuple[int, str]:
        """As run_with_input, for the command started."""
        channel = self.channel
        try:
            channel.settimeout(timeout)
            try:
                channel.sendall(data)
                channel.shutdown_write()
            except OSError:
                pass   # it ended without reading its input: its output and status say why
            return self._read(limit)
        finally:
            channel.close()

    def hold(self, data: bytes, mark: bytes, *, timeout: float, limit: int = 4 << 20
             ) -> tuple[int | None, str]:
        """`data` given, its stdin left open: (None, its output) once a line of output
        begins with `mark` (the command then waits for more on its stdin: the channel is
        kept, `self.channel`), else, when it ended first, (its exit status, its output) as
        `finish` says them."""
        channel = self.channel
        channel.settimeout(timeout)
        try:
            channel.sendall(data)
        except OSError:
            pass   # it ended without reading its input: its output and status say why
        status, text = self._read(limit, mark)
        if status is None:
            channel.settimeout(None)
        else:
            channel.close()
        return status, text

    def _read(self, limit: int, mark: bytes | None = None) -> tuple[int | None, str]:
        """The output to its end: (exit status, output); -1 past `limit` bytes (the command
        then ends with the channel); (None, output so far) once a whole line begins with
        `mark`."""
        channel, buffer = self.channel, b""
        while chunk := channel.recv(1 << 16):
            buffer += chunk
            if len(buffer) > limit:
                channel.close()
                return -1, (f"{buffer[:limit].decode(errors='replace')}\n(output over "
                            f"{limit >> 20} MB: cut, command ended)")
            if mark is not None:
                done = buffer.rpartition(b"\n")[0]
                if done.startswith(mark) or b"\n" + mark in done:
                    return None, buffer.decode(errors="replace")
        return channel.recv_exit_status(), buffer.decode(errors="replace")

    def close(self) -> None:
        """Never finished: its stdin ends with the channel."""
        self.channel.close()
