"""Shipping a scanned workdir (launcher/workdir.py's Manifest) into a run's folder, by content.

Every node keeps a cache of file contents (launcher/workdir_node.py says its layout and why
it is safe); a ship sends only the contents the cache lacks, then the node copies the run's
tree out of its cache. An unchanged folder sends nothing but its manifest, one changed file
sends that file alone, and a file deleted here is simply absent from the next run's folder
(every run's folder is new).

Over SSH it stays on the node's fabric connection, one exec channel: measured on the SSH lab
(benchmarks/workdir_sync.py), paramiko's channel moved 200 MB as fast as an OpenSSH `ssh`
(it encrypts with OpenSSL), so a second SSH client with its own copy of the connection's
settings (key, port, known_hosts policy, jump host) would buy nothing. Safe to call for many
nodes at once from threads: each call has its own channel and shares nothing.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import workdir_node as node
from launcher.workdir import Manifest, WorkdirError

if TYPE_CHECKING:
    from fabric import Connection

NODE_SOURCE = Path(node.__file__).read_text()
CHANNEL_TIMEOUT = 300.0   # seconds one send or receive may stall before the node is given up


@dataclass(frozen=True)
class ShipStats:
    files_sent: int       # contents the node's cache lacked (each sent once, however many
    bytes_sent: int       # files hold it), and their bytes
    files_total: int
    seconds: float


def _sources(manifest: Manifest) -> dict[str, tuple[str, int]]:
    """sha256 -> (one file holding it, its size)."""
    out: dict[str, tuple[str, int]] = {}
    for e in manifest.entries:
        if e.kind == "file" and e.sha256 not in out:
            out[e.sha256] = (e.path, e.size)
    return out


def _open_source(manifest: Manifest, path: str):
    fd = os.open(manifest.root / path, os.O_RDONLY | os.O_NOFOLLOW)
    return os.fdopen(fd, "rb")


def _changed(manifest: Manifest, path: str) -> str:
    return (f"{manifest.root / path} changed after launch scanned the folder (or vanished): "
            "run again")


def ship_local(manifest: Manifest, dest: Path, cache: Path) -> ShipStats:
    """`dest` (new, or an empty folder) gets exactly the manifest's tree, through the cache
    folder `cache` on this machine (or on a file system the nodes share)."""
    started = time.perf_counter()
    sources = _sources(manifest)
    try:
        entries = node.checked_entries(manifest.wire_entries())
        store = node.Cache(str(cache))
        where = node.prepare_dest(str(dest))
        node.check_apart(where, store.root)

        def fetch(missing: list[str]) -> None:
            for sha in missing:
                path, size = sources[sha]
                try:
                    with _open_source(manifest, path) as f:
                        store.receive(sha, size, f, path)
                except (node.ShipError, OSError):
                    raise node.ShipError(_changed(manifest, path)) from None

        sent, nbytes = node.ship(store, where, entries, manifest.digest, fetch)
    except (node.ShipError, OSError) as err:
        raise WorkdirError(f"shipping workdir {manifest.root} to {dest}: {err}") from None
    return ShipStats(sent, nbytes, manifest.files, time.perf_counter() - started)


class _Channel:
    """Framed reads over a paramiko channel (see workdir_node.serve)."""

    def __init__(self, channel):
        self.channel = channel
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.channel.recv(1 << 16)
        self.buffer += data
        return bool(data)

    def skip_to_magic(self) -> bool:
        while node.MAGIC not in self.buffer:
            if not self._fill():
                return False
        self.buffer = self.buffer[self.buffer.index(node.MAGIC) + len(node.MAGIC):]
        return True

    def frame(self) -> dict | None:
        while len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack(
                ">I", self.buffer[:4])[0]:
            if not self._fill():
                return None
        (length,) = struct.unpack(">I", self.buffer[:4])
        data, self.buffer = self.buffer[4:4 + length], self.buffer[4 + length:]
        return json.loads(data)

    def send_frame(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.channel.sendall(struct.pack(">I", len(data)) + data)


def ship_ssh(conn: Connection, manifest: Manifest, dest: str, cache: str, python: str, *,
             host: str | None = None) -> ShipStats:
    """Ship to the node behind the open fabric connection `conn`: `dest` (new, or an empty
    folder) and `cache` are paths on the node (relative ones from the login folder, `~`
    expanded); `python` the node's interpreter (3.10+). HostProblem naming `host` (default
    the connection's address) when it fails."""
    from launcher.ssh import HostProblem, remote

    started = time.perf_counter()
    name = host or conn.host
    sources = _sources(manifest)

    def failure(why: str) -> HostProblem:
        return HostProblem(name, f"shipping the workdir to {dest} failed: {why}")

    transport = conn.client.get_transport() if conn.is_connected else None
    if transport is None or not transport.is_active():
        raise failure("the SSH connection is not open")
    channel = transport.open_session()
    channel.settimeout(CHANNEL_TIMEOUT)
    link = _Channel(channel)

    def node_gone() -> HostProblem:
        # No answer: the interpreter did not start, or died; its stderr and status say which.
        status = channel.exit_status if channel.status_event.wait(10) else None
        err = b""
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        if status == 127:
            return HostProblem(name, f"interpreter {python} (launch_python) not found: run "
                                     "`launch setup` or set launch_python")
        return failure(f"{python} exited {status}: {last}")

    try:
        channel.exec_command(remote(python, "-c", NODE_SOURCE, "serve", dest, cache))
        if not link.skip_to_magic():
            raise node_gone()
        link.send_frame({"entries": manifest.wire_entries(), "digest": manifest.digest})
        answer = link.frame()
        if answer is None:
            raise node_gone()
        if "error" in answer:
            raise failure(answer["error"])
        missing = answer["missing"]
        if any(sha not in sources for sha in missing):
            raise failure("the node asked for content the manifest does not hold")
        try:
            for sha in missing:
                path, size = sources[sha]
                _send_file(channel, manifest, path, size)
        except OSError as err:
            if isinstance(err, (FileNotFoundError, _ShortRead)):
                raise WorkdirError(_changed(manifest, path)) from None
            # The node stopped reading: its answer says why.
            answer = link.frame()
            raise failure(answer["error"] if answer and "error" in answer else str(err)) \
                from None
        answer = link.frame()
        if answer is None:
            raise node_gone()
        if "error" in answer:
            raise failure(answer["error"])
        return ShipStats(answer["received"], answer["bytes"], manifest.files,
                         time.perf_counter() - started)
    except (TimeoutError, EOFError) as err:
        raise failure(f"the node stopped answering ({type(err).__name__})") from None
    finally:
        channel.close()


class _ShortRead(OSError):
    pass


def _send_file(channel, manifest: Manifest, path: str, size: int) -> None:
    with _open_source(manifest, path) as f:
        left = size
        while left:
            chunk = f.read(min(node.CHUNK, left))
            if not chunk:
                raise _ShortRead()
            channel.sendall(chunk)
            left -= len(chunk)
