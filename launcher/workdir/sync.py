"""Shipping a scanned workdir (launcher/workdir/scan.py's Manifest) to a node's copy of it, by
content. launcher/workdir/node.py keeps that copy (one folder per node and workdir, across
runs) and says how it stays safe; this side sends the manifest and whatever contents the node
cannot find on its own. An unchanged folder sends nothing but its manifest, one changed file
travels alone, a deleted file is removed from the copy.

Over SSH it stays on the node's fabric connection, one exec channel. Measured on the SSH lab
before choosing: paramiko's channel moved 200 MB to one host in 0.68 s (0.50 s with AES-GCM,
which launcher/cluster/ssh.py now prefers), an OpenSSH `ssh` in 0.57 s handshake included; to two
hosts at once 0.90 s against 0.93 s. A second SSH client with its own copy of the connection's
settings (key, port, known_hosts policy, jump host) would buy nothing, and
benchmarks/workdir_sync.py shows the whole ship within 1.2x of `rsync -a`. Safe to call for
many nodes at once from threads: each call has its own channel and shares nothing.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.workdir import node
from launcher.workdir.scan import Manifest, WorkdirError

if TYPE_CHECKING:
    from fabric import Connection

# Sent to the node and run there by its own interpreter (python -c).
NODE_SOURCE = resources.files("launcher.workdir").joinpath("node.py").read_text()
CHANNEL_TIMEOUT = 300.0   # seconds one send or receive may stall before the node is given up
LOCK_NAME = node.LOCK     # in the folder used: a running job holds it shared


@dataclass(frozen=True)
class ShipStats:
    files_sent: int       # contents the node could not find itself (each sent once, however
    bytes_sent: int       # many files hold it), and their bytes
    files_total: int
    seconds: float
    dest: str             # the folder used: DEST, or a sibling when DEST was busy


def _sources(manifest: Manifest) -> dict[str, tuple[str, int]]:
    """sha256 -> (one file holding it, its size)."""
    out: dict[str, tuple[str, int]] = {}
    for e in manifest.entries:
        if e.kind == "file" and e.sha256 not in out:
            out[e.sha256] = (e.path, e.size)
    return out


def _open_source(manifest: Manifest, path: str):
    """The scanned file, never a link put in its place; WorkdirError when it is gone."""
    try:
        fd = os.open(manifest.root / path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise WorkdirError(_changed(manifest, path)) from None
    return os.fdopen(fd, "rb")


def _proven(manifest: Manifest, path: str, source) -> bool:
    """The open file still has the stat data that proved its content at the scan."""
    return manifest.proven.get(path) == node.stat_key(os.fstat(source.fileno()))


def _changed(manifest: Manifest, path: str) -> str:
    return (f"{manifest.root / path} changed after launch scanned the folder (or vanished): "
            "run again")


class _Reader:
    """A source file as the node side reads it: a read error or an early end is the file
    having changed since the scan (the node's own errors stay its own)."""

    def __init__(self, f, manifest: Manifest, path: str):
        self.f, self.manifest, self.path = f, manifest, path

    def read(self, n: int) -> bytes:
        try:
            data = self.f.read(n)
        except OSError:
            data = b""
        if not data:
            raise WorkdirError(_changed(self.manifest, self.path))
        return data


def ship_local(manifest: Manifest, dest: Path, *, busy: str = "sibling") -> ShipStats:
    """Make `dest` (on this machine, or on a file system the nodes share) hold the manifest's
    tree; `busy`: what to do when a running job uses it and the content differs ("sibling":
    use DEST.2, DEST.3, ...; "wait")."""
    started = time.perf_counter()
    sources = _sources(manifest)

    def fetch(missing: list[str], receive) -> None:
        for sha in missing:
            path, _size = sources[sha]
            with _open_source(manifest, path) as source:
                proven = _proven(manifest, path, source)
                receive(sha, _Reader(source, manifest, path), proven)
                if proven and not _proven(manifest, path, source):
                    raise WorkdirError(_changed(manifest, path))

    try:
        used, sent, nbytes = node.sync(str(dest), node.checked_entries(manifest.wire_entries()),
                                       manifest.digest, fetch, busy)
    except (node.ShipError, OSError) as err:
        raise WorkdirError(f"shipping workdir {manifest.root} to {dest}: {err}") from None
    return ShipStats(sent, nbytes, manifest.files, time.perf_counter() - started, used)


class _Channel:
    """Framed reads over a paramiko channel (see workdir/node.py serve)."""

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
        self.channel.sendall(memoryview(struct.pack(">I", len(data)) + data))   # see _Batch


def ship_ssh(conn: Connection, manifest: Manifest, dest: str, *, python: str,
             host: str | None = None, busy: str = "sibling") -> ShipStats:
    """Ship to the node behind the open fabric connection `conn`: `dest` is a path on the node
    (a relative one from the login folder, `~` expanded), `python` the node's interpreter
    (3.10+), `busy` as for ship_local. WorkdirError naming `host` (default: the connection's
    address) and the file when it fails."""
    from launcher.cluster.ssh import remote

    started = time.perf_counter()
    name = host or conn.host
    sources = _sources(manifest)

    def failure(why: str) -> WorkdirError:
        return WorkdirError(f"host {name}: shipping workdir {manifest.root} to {dest} failed: "
                            f"{why}")

    transport = conn.client.get_transport() if conn.is_connected else None
    if transport is None or not transport.is_active():
        raise failure("the SSH connection is not open")
    channel = transport.open_session()
    channel.settimeout(CHANNEL_TIMEOUT)
    link = _Channel(channel)

    def node_gone() -> WorkdirError:
        # No answer: the interpreter did not start, or died; its stderr and status say which.
        status = channel.exit_status if channel.status_event.wait(10) else None
        err = b""
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        if status == 127:
            return WorkdirError(f"host {name}: interpreter {python} (launch_python) not found: "
                                "run `launch setup` or set launch_python")
        return failure(f"{python} exited {status}: {last}")

    try:
        # -S: node.py needs only the standard library; no site-packages read at its start.
        channel.exec_command(remote(python, "-S", "-c", NODE_SOURCE, "serve", dest))
        if not link.skip_to_magic():
            raise node_gone()
        link.send_frame({"entries": manifest.wire_entries(), "digest": manifest.digest,
                         "busy": busy})
        answer = link.frame()
        if answer is None:
            raise node_gone()
        if "error" in answer:
            raise failure(answer["error"])
        missing = answer["missing"]
        if any(sha not in sources for sha in missing):
            raise failure("the node asked for content the manifest does not hold")
        try:
            batch = _Batch(channel)
            for sha in missing:
                _send_file(batch, manifest, *sources[sha])
            batch.flush()
        except OSError as err:
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
                         time.perf_counter() - started, answer["dest"])
    except (TimeoutError, EOFError, OSError) as err:
        raise failure(f"the connection failed ({type(err).__name__}: {err})") from None
    finally:
        channel.close()


class _Batch:
    """Small files' bytes gathered into sends of about a megabyte: SSH packets then go out
    full (32 kB), not one short packet per file; paramiko's cost is per packet. Handed over
    as a memoryview: paramiko's sendall cuts what is left after each packet with s[sent:],
    which copies the rest of a bytes object every time (16 MB copied per MB sent)."""

    def __init__(self, channel):
        self.channel = channel
        self.pending = bytearray()

    def sendall(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) >= node.CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            with memoryview(self.pending) as view:
                self.channel.sendall(view)
            self.pending.clear()


def _send_file(channel, manifest: Manifest, path: str, size: int) -> None:
    """The file's `size` bytes into the channel; WorkdirError when the file is no longer
    what the scan read (the node then sees the channel close and keeps nothing of it)."""
    with _open_source(manifest, path) as source:
        proven = _proven(manifest, path, source)
        channel.sendall(b"\1" if proven else b"\0")
        left = size
        while left:
            try:
                chunk = source.read(min(node.CHUNK, left))
            except OSError:
                chunk = b""
            if not chunk:
                raise WorkdirError(_changed(manifest, path))
            channel.sendall(chunk)
            left -= len(chunk)
        if proven and not _proven(manifest, path, source):
            raise WorkdirError(_changed(manifest, path))
