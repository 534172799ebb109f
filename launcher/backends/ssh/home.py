"""A detached run over SSH: its pipeline on the head node (the controller: launch itself, with
the head's interpreter), which reaches the other nodes by their private addresses with the
cluster's own key (what `launch setup`'s cluster_ssh role installs: never the user's key or a
forwarded agent), and keeps the run folder in its login folder
(`<launch_run_root>/../controller/<run id>/`, private to the user).

The client does what an attached run's preflight does (every node reached and checked, the
code and the workdir shipped; the head also gets launcher/ and is checked for launch's own
dependencies and the cluster key), writes handover.json beside the controller's runs, starts
the controller in a session of its own there, and leaves. `SshHome` is that run seen from any
machine with the inventory: its files read and followed over one SFTP session, its controller
signalled by its pid after checking the pid is still it.
"""

from __future__ import annotations

import json
import posixpath
import signal
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError

CLUSTER_KEY = "~/.ssh/launch_cluster_ed25519"    # roles/cluster_ssh: the key between nodes
CLUSTER_KNOWN_HOSTS = "~/.ssh/known_hosts"       # ... and every node's host key
CONTROLLER_MODULE = "launcher.commands.controller"
INCOMING = ".incoming"
POLL_S = 0.3
ALIVE_EVERY_S = 5.0


def controller_runs(node: Node) -> str:
    """The controller's runs folder on `node`, relative to its login folder (or absolute)."""
    base = posixpath.dirname(node.run_root.rstrip("/")) or "."
    return posixpath.join(base, "controller")


def cluster_key(node: Node) -> str:
    return str(node.extra.get("launch_cluster_key") or CLUSTER_KEY)


def cluster_known_hosts(node: Node) -> str:
    return str(node.extra.get("launch_cluster_known_hosts") or CLUSTER_KNOWN_HOSTS)


def as_seen_from_the_cluster(nodes: list[Node], controller: Node) -> list[dict[str, Any]]:
    """The run's nodes as the controller reaches them: by private address, on port 22, with the
    cluster's key; no jump host (it is inside the cluster)."""
    out = []
    for node in nodes:
        extra = {k: v for k, v in node.extra.items() if k != "ansible_ssh_common_args"}
        seen = replace(node, address=node.private_address, port=22,
                       key_file=cluster_key(controller), extra=extra)
        out.append(seen.to_json())
    return out


def controller_line(python: str, code_dir: str, incoming: str, runs: str) -> list[str]:
    """sh -c: the controller started in a session of its own (setsid), its output appended to
    a log beside its handover, its pid printed. umask 077: what it writes on the head (logs,
    summaries, --env values in the handover) is the user's alone."""
    script = ('umask 077 && mkdir -p "$4" && cd "$4" && PYTHONPATH="$2" setsid "$1" -m '
              + CONTROLLER_MODULE
              + ' --incoming "$3" "$4" </dev/null >>"$3.log" 2>&1 & echo "$!"')
    return ["sh", "-c", script, "launch-controller", python, code_dir, incoming, runs]


class SshHome:
    """A detached run's folder and controller on the controller host, from here."""

    def __init__(self, backend, handle: dict[str, Any]):
        self.backend, self.handle = backend, handle
        self.run_id = handle["run_id"]
        self.root = handle["run_dir"]
        self.where = handle["where"]
        self.pid = int(handle.get("pid") or 0)
        self._node = next((n for n in backend.all_nodes if n.name == handle["controller"]), None)
        if self._node is None:
            raise LauncherError(f"run {self.run_id}: its controller host {handle['controller']} "
                                f"is not in {backend.inventory} any more")
        self._conn = None
        self._sftp = None
        self._alive_at = 0.0
        self._alive: bool | None = None

    # ---- the connection -----------------------------------------------------------------
    def _sftp_session(self):
        if self._sftp is None:
            from launcher.cluster.ssh import connect

            self._conn = connect(self._node, self.backend.options)
            self._sftp = self._conn.sftp()
        return self._sftp

    def _run(self, argv: list[str], timeout: float = 30.0):
        from launcher.cluster.ssh import remote

        self._sftp_session()
        return self._conn.run(remote(*argv), hide=True, warn=True, in_stream=False,
                              timeout=timeout)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = self._sftp = None

    # ---- RunHome ------------------------------------------------------------------------
    def read(self, name: str, limit: int) -> bytes | None:
        sftp = self._sftp_session()
        path = posixpath.join(self.root, name)
        try:
            if not stat.S_ISREG(sftp.lstat(path).st_mode or 0):
                return None
            with sftp.open(path, "rb") as f:
                return f.read(limit)
        except OSError:
            return None

    def follow(self, name: str, offset: int, done) -> Iterator[bytes]:
        """New bytes of the file as it grows, over the one SFTP session (no process or channel
        per look); b"" at every look that found nothing."""
        sftp = self._sftp_session()
        path = posixpath.join(self.root, name)
        while True:
            finished = done()
            chunk = b""
            try:
                with sftp.open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(1 << 20)
            except OSError:
                pass
            if chunk:
                offset += len(chunk)
                yield chunk
                continue
            if finished:
                return
            yield b""
            time.sleep(POLL_S)

    def alive(self) -> bool | None:
        """The controller's own record says it ended; else its pid, looked at every few
        seconds (a process, its command line naming this run's folder)."""
        record = self.read("controller.json", 1 << 16)
        try:
            if record and "ended_at" in json.loads(record):
                return False
        except ValueError:
            pass
        now = time.monotonic()
        if self._alive is None or now - self._alive_at > ALIVE_EVERY_S:
            self._alive_at = now
            try:
                result = self._run(["sh", "-c", 'tr "\\0" " " </proc/"$1"/cmdline 2>/dev/null',
                                    "launch-alive", str(self.pid)])
                self._alive = CONTROLLER_MODULE in result.stdout and self.run_id in result.stdout
            except Exception:  # noqa: BLE001 (cannot tell now: the connection dropped)
                self.close()
                return None
        return self._alive

    def stop(self, sig: int, by_user: bool = False) -> str:
        from launcher.backends.local.home import stop_doc
        from launcher.runs.folder import STOP_FILE

        if by_user:
            sftp = self._sftp_session()
            with sftp.open(posixpath.join(self.root, STOP_FILE), "wb") as f:
                f.write(json.dumps(stop_doc(sig)).encode())
        name = signal.Signals(sig).name.removeprefix("SIG")
        result = self._run(["sh", "-c", 'tr "\\0" " " </proc/"$2"/cmdline 2>/dev/null | '
                            'grep -qF -- "$3" && kill -s "$1" "$2"', "launch-stop", name,
                            str(self.pid), self.run_id])
        if result.exited != 0:
            return f"the controller of run {self.run_id} ({self.where}) has ended already"
        return f"sent SIG{name} to the run's controller ({self.where})"

    def fetch(self, dest: Path) -> int:
        from launcher.backends.ssh.agent import fetch_tree

        self._sftp_session()
        return len(fetch_tree(self._conn, self.root, Path(dest), skip=(), within=Path(dest).parent))

    def local_folder(self) -> None:
        return None   # on the controller's host: `launch fetch` copies it

    def settle(self, status: str | None = None, reason: str | None = None,
               amend=None) -> None:
        # The run folder is on the controller's host; no `launch run` follows a run handed
        # over there (SSH runs attached here, or detached: `launch attach`'s wall time is
        # not the run's), so nothing is amended.
        pass

    def ending(self) -> str | None:
        return None

    def log_hint(self) -> str:
        return f"{self._node.name}:{posixpath.join(self.root, 'controller.log')}"


def find_run(backend, run_id: str) -> dict[str, Any] | None:
    """A run's handle, looked up on the controller host (from a machine that did not start it:
    its controller.json in the controller's runs folder)."""
    head = backend.nodes(None)[0]
    from launcher.cluster.ssh import connect, remote

    conn = connect(head, backend.options)
    try:
        runs = controller_runs(head)
        result = conn.run(remote("sh", "-c", 'cd "$1" 2>/dev/null && cd "$2" && pwd && '
                                 'cat controller.json', "launch-find", runs, run_id),
                          hide=True, warn=True, in_stream=False, timeout=30)
    finally:
        conn.close()
    if result.exited != 0:
        return None
    folder, _, record = result.stdout.partition("\n")
    try:
        pid = json.loads(record).get("pid")
    except ValueError:
        pid = None
    return {"run_id": run_id, "backend": backend.name, "settings": backend.to_json(),
            "run_dir": folder.strip(), "controller": head.name, "pid": pid,
            "where": f"{head.name} ({head.address}), pid {pid}"}
