"""Node agents on remote hosts over SSH (fabric): started in a session of their own (the code
is on the node already: preflight's probe wrote it, and its session, held, becomes the first
start's), with the node's watcher beside them in that session (looks, signals, the guard, the
reap, the node's files when few), streamed by the one output pump; signalled by recorded
process group; the node's files fetched."""

from __future__ import annotations

import base64
import json
import posixpath
import queue
import re
import signal as signals
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fabric import Connection

from launcher.backends.ssh.pump import Pumped, pump, start_on
from launcher.backends.ssh.watcher import ANSWER_MARK, NodeWatcher, SessionWatcher
from launcher.cluster.inventory import Node
from launcher.cluster.ssh import connect, remote
from launcher.cluster.ssh_options import SshOptions
from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.execute.watcher_answers import KeptWatcher
from launcher.job.runplan import NodeCommand
from launcher.runs.folder import STAMP_ENV
from launcher.runs.logs import LineSink

PGID_FILE = "launch.pgid"
# Runs in the node's folder (the job's workdir, or the node's run folder) as its own session
# leader (setsid), so $$ is the process group id every process of the node agent shares;
# recorded (in a file named by a path from there) before torchrun replaces it, and given to
# every process of this start as LAUNCH_AGENT_SESSION. $3: a folder to put first on PATH (the
# node's interpreter's: its pip, torchrun, deepspeed); $4: a folder the job finds made
# (LAUNCH_CHECKPOINT_DIR), or "". $5-$9: the node's watcher (launch_node/node_probe.py
# `watch --guard`: its interpreter, its path, the node's run folder, the node, the run's
# stamp), or $5 "" for none (a command run to its end).
# The watcher answers the hang watch's looks and launch's signals on this session (stdin in,
# the channel's stderr out: the job's own stderr goes to its stdout), and is the agent's guard:
# it holds the SSH session's stdin, which only ends when the session does: if launch dies (even
# by SIGKILL) or the connection drops, it stops the agent's process group (SIGTERM, SIGKILL
# 3 s later: torchrun given SIGTERM was seen hanging at exit on its --tee log threads) instead
# of leaving the node training unsupervised; when the agent ends first (sshd then closes its
# stdin), it reaps what of this start is left and leaves. The shell loop after it is the guard
# when there is no watcher, or when it failed: the agent is never left unguarded.
# SSH_CLIENT and SSH2_CLIENT go: bash reads ~/.bashrc when it finds them and thinks itself
# the shell sshd started, and every `bash -c` below (each setup line, a command job's shell)
# then did, putting ~/.bashrc's PATH (pyenv's shims, seen) before the node's interpreter's
# folder: `pip install` in setup installed into another Python. The login shell that ran this
# line has read it already; what it exported is here.
# stderr joins stdout: one SSH channel, the node's lines in the order printed.
START_SCRIPT = """cd "$1" || exit 97
echo $$ > "$2"
unset SSH_CLIENT SSH2_CLIENT
if [ -n "$3" ]; then PATH="$3:$PATH"; export PATH; fi
if [ -n "$4" ]; then mkdir -p "$4" || exit 97; fi
LAUNCH_AGENT_SESSION=$$; export LAUNCH_AGENT_SESSION
exec 3<&0 4>&2
(
  trap '' TERM
  if [ -n "$5" ]; then
    "$5" -S "$6" watch "$7" --stamp "$9" --node "$8" --guard $$ >&4 2>&4 4>&-
    echo "@@launch-watch gone $?" >&4
  fi
  exec 4>&-
  while read -r _; do :; done
  kill -0 $$ 2>/dev/null || exit 0
  kill -s TERM -- -$$ 2>/dev/null
  sleep 3
  kill -s KILL -- -$$ 2>/dev/null
) <&3 >/dev/null 2>&1 &
shift 9
exec "$@" </dev/null 2>&1 3<&- 4>&-
"""
SETSID_NOTE = re.compile(r"setsid: child \d+ did not exit normally")
SIGNAL_SCRIPT = 'pgid=$(cat "$2" 2>/dev/null) || exit 0; kill -s "$1" -- "-$pgid" 2>/dev/null; exit 0'


def remove_tree(conn: Connection, node_dir: str) -> None:
    """Remove what preflight's probe wrote on the node (its run folder, and the run's folder
    when that leaves it empty): preflight failed, nothing of the run may stay."""
    parent = posixpath.dirname(node_dir.rstrip("/"))
    conn.run(remote("sh", "-c", 'rm -rf -- "$1"; rmdir -- "$2" 2>/dev/null; exit 0', "rm",
                    node_dir, parent), hide=True, warn=True, in_stream=False, timeout=60)


class SshNodeProcess:
    """One node agent over SSH. `start()` may be called again after it ended (a restart): each
    start has its own output queue, so the previous start's reader drains its own lines and
    ends; a connection that dropped is opened again."""

    # A start is a round trip to the node: the supervisor starts every node's at once.
    starts_remotely = True

    def __init__(self, command: NodeCommand, node: Node, conn: Connection, options: SshOptions,
                 stamp: str, label: str | None = None, held: Any = None):
        self.name = command.name
        self.command, self.node, self.conn, self.options = command, node, conn, options
        self.stamp, self.label = stamp, label
        # Each process launch starts in the node's folder records its own process group.
        # In the node's own run folder (relative paths: from its cwd), never the workdir, which
        # nodes on a shared filesystem share.
        self.pgid_path = posixpath.join(command.run_dir or ".",
                                        f"launch-{label}.pgid" if label else PGID_FILE)
        self.started: Pumped | None = None   # this start's channel and its output
        # Preflight's probe, waiting on the node to become the first start's agent
        # (launcher/backends/ssh/preflight.py): no second session, no second login shell.
        self._held = held
        self.exit_code: int | None = None
        self._reconnected: list[Connection] = []
        # The hang watch's looks at the node (launcher/backends/ssh/watcher.py): the watcher in
        # this start's session, or, where it has none (or after it ended), one on a channel of
        # its own, opened at the first look, again after a failed one.
        self._session: SessionWatcher | None = None
        self._watcher = KeptWatcher(self._open_watcher)
        # Restarts of the run before this start of the node (launch restarted it): added to
        # the plan's LAUNCH_ATTEMPT.
        self.attempt_offset = 0
        self._new_output()

    def _new_output(self) -> None:
        self._lines: queue.Queue = queue.Queue()
        self._out = LineSink(self._lines.put)
        session = SessionWatcher(self.node.address) if self._watched() else None
        self._session = session
        self._err = LineSink(lambda line: self._wrapper_line(line, session))

    def _watched(self) -> bool:
        """Whether the node's watcher can live in its agent's session: the plan's probe is
        the node's interpreter, -S, node_probe.py (runplan.py)."""
        probe = self.command.probe
        return len(probe) == 3 and probe[1] == "-S"

    def _wrapper_line(self, line: str, session: SessionWatcher | None) -> None:
        """The channel's stderr: the job's own goes to its stdout (START_SCRIPT's 2>&1), so
        only the node's watcher, setsid and the start script write here. The watcher's
        answers go to the look that asked. setsid -w's note on a child ended by a signal
        ("setsid: child 123 did not exit normally: Success") is left out: it says nothing
        the exit status does not, and it was the last line of a stopped node's excerpt, in
        place of the job's own."""
        if session is not None and line.startswith(ANSWER_MARK):
            session.take(line)
        elif not SETSID_NOTE.match(line):
            self._lines.put(line)

    def _open_watcher(self):
        session = self._session
        if session is not None and session.alive():
            return session
        if session is not None and session.finished():
            # The agent ended (its exit is on its way): nothing of it to look at, and a
            # watcher of its own would cost the node a session (a login shell) for nothing.
            raise LauncherError(f"node {self.name}: its agent has ended")
        return self._channel_watcher()

    def _channel_watcher(self) -> NodeWatcher:
        return NodeWatcher(self.connection(),
                           self._probe_line("watch", self.command.run_dir, "--stamp",
                                            self.stamp, "--node", self.name),
                           self.node.address)

    def connection(self) -> Connection:
        """The node's connection, a new one if it dropped (restarts, probes, fetching)."""
        transport = self.conn.client.get_transport() if self.conn.client else None
        if transport is None or not transport.is_active():
            self.conn = connect(self.node, self.options)
            self._reconnected.append(self.conn)
        return self.conn

    def _start_line(self, watched: bool = False) -> str:
        """The command started on the node as START_SCRIPT starts it: its own session, its
        process group recorded, ended with the SSH session; `watched`: the node's watcher in
        that session."""
        return remote(*self._start_argv(watched))

    def _start_argv(self, watched: bool = False) -> list[str]:
        values = {**self.command.env, STAMP_ENV: self.stamp}
        if self.attempt_offset:
            values["LAUNCH_ATTEMPT"] = str(int(values.get("LAUNCH_ATTEMPT", "0"))
                                           + self.attempt_offset)
        env = [f"{k}={v}" for k, v in values.items()]
        probe = self.command.probe
        watcher = [probe[0], probe[2], self.command.run_dir or ".", self.name, self.stamp] \
            if watched else ["", "", "", "", ""]
        return ["setsid", "-w", "sh", "-c", START_SCRIPT, "launch-node",
                self.command.cwd or ".", self.pgid_path,
                posixpath.dirname(values.get("LAUNCH_PYTHON", "")),
                values.get("LAUNCH_CHECKPOINT_DIR", ""), *watcher,
                "env", *env, *self.command.argv]

    def start(self) -> None:
        """The node's command on the session preflight's probe was left waiting on (the
        first start), else on a channel of its own; its output read by this process's one
        pump thread (launcher/backends/ssh/pump.py), not two threads per node."""
        if self.started is not None:  # a restart: fresh output, fresh exit status
            self._new_output()
            self.exit_code = None
        session = self._session
        held, self._held = self._held, None
        if held is not None and not held.closed and not held.eof_received:
            # The held probe execs the start line: sent as its length, then its JSON.
            line = json.dumps(self._start_argv(watched=session is not None)).encode()
            try:
                held.set_combine_stderr(False)
                held.sendall(b"%d\n%s" % (len(line), line))
            except OSError:
                held.close()   # its connection broke: a session of its own, as a restart
                held = None
            if held is not None:
                self.started = pump().add(held, self._out, self._err)
        else:
            held = None
        if held is None:
            conn = self.connection()
            conn.open()
            self.started = start_on(conn.client.get_transport(),
                                    self._start_line(watched=session is not None), self._out,
                                    self._err)
        if session is not None:
            session.channel = self.started.channel

    def run_to_end(self, line: Callable[[str], None]) -> int | None:
        """The command to its end (setup, a restore), its lines to `line`."""
        out, err = LineSink(line), LineSink(line)
        result = self.connection().run(self._start_line(), hide=True, warn=True, pty=False,
                                       in_stream=False, out_stream=out, err_stream=err)
        out.close()
        err.close()
        return result.exited

    def lines(self) -> Iterator[str]:
        # This start's queue and sinks: a restart replaces them for the next reader.
        lines, out, err, started = self._lines, self._out, self._err, self.started
        while True:
            try:
                yield lines.get(timeout=0.2)
            except queue.Empty:
                if self.exit_code is not None or self.started is not started:
                    out.close()
                    err.close()
                    while not lines.empty():
                        yield lines.get()
                    return

    def poll(self) -> int | None:
        if self.exit_code is not None or self.started is None:
            return self.exit_code
        transport = self.conn.client.get_transport()
        channel = self.started.channel
        if self.started.done.is_set() and channel.exit_status_ready():
            # Every line it sent is in the queue by now (the pump set `done` after the last).
            code = channel.recv_exit_status()
            channel.close()
            # paramiko reports -1 when the channel closed without an exit status.
            self.exit_code = 255 if code in (-1, None) else code
        elif transport is None or not transport.is_active():
            self._lines.put(f"[launch] SSH connection to {self.node.address} dropped")
            self.exit_code = 255
        return self.exit_code

    def signal(self, sig: int) -> None:
        """Signal the node's process group by the id it recorded: never by name. Asked of
        the watcher in its session where it lives (no login shell started on every node of a
        stopped run), else in a session of its own."""
        name = signals.Signals(sig).name.removeprefix("SIG")
        session = self._session
        if session is not None and session.alive():
            try:
                session.ask(f"signal {name}", timeout=10)
                return
            except LauncherError:
                pass
        pgid_file = posixpath.join(self.command.cwd or ".", self.pgid_path)
        line = remote("sh", "-c", SIGNAL_SCRIPT, "launch-signal", name, pgid_file)
        for attempt in range(2):
            try:
                # Never self.conn.run on a dropped connection: fabric would reopen it under the
                # SFTP client it cached, and fetching the node's files later would fail.
                conn = self.connection() if attempt == 0 else connect(self.node, self.options)
                conn.run(line, hide=True, warn=True, in_stream=False, timeout=15)
                if attempt:
                    conn.close()
                return
            except Exception:  # the session's connection may be the thing that broke
                continue

    # ---- the hang watch (launcher/execute/watch.py) ---------------------------------------
    def _probe_line(self, *args: str) -> str:
        """launch_node/node_probe.py on the node, with the node's Python, in the node's folder."""
        return remote("sh", "-c", 'cd "$1" && shift && exec "$@"', "launch-probe",
                      self.command.cwd or ".", *self.command.probe, *args)

    def _probe(self, *args: str, timeout: float) -> Any:
        result = self.connection().run(self._probe_line(*args), hide=True, warn=True,
                                        in_stream=False, timeout=timeout)
        if result.exited != 0:
            raise LauncherError(f"node probe on {self.node.address} exited {result.exited}: "
                                f"{result.stderr.strip()[-300:]}")
        return json.loads(result.stdout)

    def heartbeats(self) -> list[dict[str, Any]]:
        return self._watcher.ask("heartbeats")

    def quiet_s(self) -> float | None:
        """Seconds the hang watch's look now waiting on the node has gone unanswered (None
        while none waits)."""
        return self._watcher.quiet_s()

    def forsake(self) -> None:
        """The node's machine is gone (its fleet said so): its connection closed now, so the
        node ends (poll: 255) without waiting for TCP to give up on a host that will never
        answer (keepalives, TCP_USER_TIMEOUT: ~20 s)."""
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.close()

    def activity(self) -> dict[str, Any]:
        return self._watcher.ask("activity")

    def dump_ranks(self, timeout: float) -> dict[str, Any]:
        return self._probe("dump", self.command.run_dir, "--stamp", self.stamp, "--timeout",
                           f"{timeout:g}", "--node", self.name, timeout=3 * timeout + 15)

    def kill_ranks(self, pids: list[int]) -> dict[str, Any]:
        return self._probe("kill", "--stamp", self.stamp, *map(str, pids), timeout=30)

    def reap(self) -> dict[str, Any]:
        """Every process of the run still on the node, killed (after its agent ended): what
        the guard in the agent's session reaped when it ended, else asked of the hang watch's
        watcher kept for the run, or of one started now where none was."""
        session = self._session
        if session is not None and session.end is not None:
            return session.end
        if session is not None and session.finished():   # its guard said nothing (killed)
            watcher = self._channel_watcher()
            try:
                return watcher.ask("reap", timeout=30)
            finally:
                watcher.close()
        return self._watcher.ask("reap", timeout=30)

    def folder_files(self) -> dict[str, str] | None:
        """The node's folder as the guard in the agent's session sent it when the agent
        ended ({path: base64}), when it was small; None: fetch it (fetch_tree). Handed over
        once: launch holds no node's files longer than it must."""
        session = self._session
        end = session.end if session is not None else None
        files = end.pop("files", None) if isinstance(end, dict) else None
        return files if isinstance(files, dict) else None

    def close(self) -> None:
        """The node watcher, and connections this process opened again (the original belongs
        to the backend)."""
        self._watcher.close()
        for conn in self._reconnected:
            conn.close()
        self._reconnected = []


def write_files(files: dict[str, str], local_dir: Path, where: str) -> list[Path]:
    """The node's folder as its guard sent it (SshNodeProcess.folder_files) written into
    local_dir, nothing outside the run folder <runs>/<run id>/<node> (the rules fetch_tree
    keeps: a path a node names is relative, with no empty, `.` or `..` part)."""
    within = local_dir.parent.parent
    written = []
    for name, text in files.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts) \
                or not isinstance(text, str):
            raise LauncherError(f"{where} sent its folder with a file named {name!r}: not a "
                                "path inside it; its folder was not written")
        try:
            data = base64.b64decode(text, validate=True)
        except ValueError:
            raise LauncherError(f"{where} sent {name} in its folder in a form that is not "
                                "base64; it was not written") from None
        safefile.write_bytes(local_dir.joinpath(*parts), data, within=within)
        written.append(local_dir.joinpath(*parts))
    return written


def fetch_tree(conn: Connection, remote_dir: str, local_dir: Path,
               skip: tuple[str, ...] = ("code",), within: Path | None = None) -> list[Path]:
    """Copy a remote folder (all but `skip`) into local_dir, writing nothing outside `within`
    (default: the runs folder of <runs>/<run id>/<node>); returns the files written."""
    within = within if within is not None else local_dir.parent.parent
    sftp = conn.sftp()
    written = []

    def walk(rdir: str, ldir: Path):
        for entry in sftp.listdir_attr(rdir):
            rpath = posixpath.join(rdir, entry.filename)
            if rdir == remote_dir and entry.filename in skip:
                continue
            if "/" in entry.filename or entry.filename in ("", ".", ".."):
                continue   # a name no file has: it would leave the node's folder
            if stat.S_ISDIR(entry.st_mode or 0):
                walk(rpath, ldir / entry.filename)
            elif stat.S_ISREG(entry.st_mode or 0):
                # Into the run folder with no link there followed (launcher/core/safefile.py):
                # <runs>/<run id>/<node>/... is below the runs folder.
                safefile.write_with(ldir / entry.filename, lambda f: sftp.getfo(rpath, f),
                                    within=within)
                written.append(ldir / entry.filename)

    try:
        walk(remote_dir, local_dir)
    except OSError as err:
        raise LauncherError(f"could not fetch {remote_dir} from {conn.host}: {err}") from None
    return written
