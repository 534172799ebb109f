"""The hang watch's looks at one node (launcher/execute/watch.py: every rank's heartbeat, or
the run's processes), asked of launch_node/node_probe.py `watch` over one exec channel kept
for the run: a line asked, a line answered.

A look once started an interpreter on the node each time (node_probe.py heartbeats: ~50 ms of
a core) on every node, every 2 s, the run's own start included: measured on the 8-host lab,
3 s of CPU in a 15 s launch, more than the rendezvous store's torch import. Now each node
starts one, at the first look.

The node's end reads its stdin to the end: when launch closes the channel, or its connection
drops, or launch dies, it leaves.

SessionWatcher is the same watcher started inside the node agent's own session
(launcher/backends/ssh/agent.py START_SCRIPT), so a node costs one SSH session for the run, not
two: its answers come on that session's stderr, read by the output pump, and are matched to
the look that asked by a number. NodeWatcher stays for what comes after the agent ended (a
late look, a reap nobody did), for a start without one, and for a start whose watcher ended
while its agent goes on: START_SCRIPT says that in a line of its own (`@@launch-watch gone
STATUS`). Only that line gives the session's watcher up; a look answered late (a loaded node)
fails alone, and the next is asked of the same watcher (giving it up at a late answer opened a
session of its own on every slow node).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from fabric import Connection

from launcher.core.errors import LauncherError
from launcher.execute.watcher_answers import MAX_ANSWER, WatcherAnswers, last_line


class NodeWatcher:
    def __init__(self, conn: Connection, command: str, where: str):
        self.where = where
        conn.open()
        self.channel = conn.client.get_transport().open_session()
        self.channel.exec_command(command)
        self.answers = WatcherAnswers(where)

    def alive(self) -> bool:
        transport = self.channel.get_transport()
        return not self.channel.closed and transport is not None and transport.is_active()

    def ask(self, what: str, timeout: float) -> Any:
        """The answer to `what` (heartbeats | activity); LauncherError when none comes."""
        self.channel.settimeout(timeout)
        self.channel.sendall(f"{what}\n".encode())
        return self.answers.next(self._recv, self._last_error)

    def _recv(self) -> bytes:
        try:
            return self.channel.recv(1 << 16)
        except socket.timeout:
            raise LauncherError(f"the node watcher on {self.where} did not answer in "
                                f"{self.channel.gettimeout():g} s") from None

    def _last_error(self) -> str:
        err = b""
        while self.channel.recv_stderr_ready() and len(err) < MAX_ANSWER:
            err += self.channel.recv_stderr(1 << 16)
        return last_line(err, self.channel.exit_status if self.channel.exit_status_ready()
                         else None)

    def close(self, wait_s: float = 2.0) -> None:
        """End of input: the node's end leaves; waited for (its exit status), so that nothing
        of the run is left on the node when launch goes on."""
        try:
            self.channel.shutdown_write()
            self.channel.status_event.wait(wait_s)
        except Exception:  # noqa: BLE001 (a dropped channel: the node's end has its EOF)
            pass
        finally:
            self.channel.close()


# launch_node/node_probe.py ANSWER_MARK: a line of the agent's session's stderr that is an answer.
ANSWER_MARK = "@@launch-watch "


class SessionWatcher:
    """The looks of the watcher in one start of a node's agent. `take` is fed every marked
    line of the session's stderr (the pump's thread); `ask` (the hang watch's threads, a
    stop's signal) sends `WHAT N` on the session's stdin and waits for answer N. An answer to
    a look that gave up waiting is dropped, never taken for the next one's."""

    def __init__(self, where: str):
        self.where = where
        self.channel: Any = None       # set once the session is started
        self.end: Any = None           # the guard's last line: what its reap killed
        self._cond = threading.Condition()
        self._waiting: dict[str, str | None] = {}
        self._count = 0
        self._gone: str | None = None   # the watcher's exit status, once it has ended

    def take(self, line: str) -> None:
        ident, _, text = line[len(ANSWER_MARK):].partition(" ")
        with self._cond:
            if ident == "end":
                try:
                    self.end = json.loads(text)
                except ValueError:
                    self.end = {"error": text[:300]}
            elif ident == "gone":
                # START_SCRIPT's line once the watcher's process ended: after its `end`, or
                # in its place when it could not start. No look is answered from here on.
                self._gone = text.strip() or "?"
            elif ident in self._waiting:
                self._waiting[ident] = text
            self._cond.notify_all()

    def _state(self) -> tuple[bool, bool]:
        """(the agent's session is over, its connection lives); the session is started."""
        channel = self.channel
        transport = channel.get_transport()
        return (channel.closed or channel.eof_received,
                transport is not None and transport.is_active())

    def ended(self) -> bool:
        """The session is over, or its connection is."""
        if self.channel is None:
            return False
        over, connected = self._state()
        return over or not connected

    def alive(self) -> bool:
        return self.channel is not None and self._gone is None and not self.ended()

    def finished(self) -> bool:
        """The agent's session is over while its connection lives: the agent ended."""
        if self.channel is None:
            return False
        over, connected = self._state()
        return over and connected

    def ask(self, what: str, timeout: float) -> Any:
        with self._cond:
            self._count += 1
            ident = str(self._count)
            self._waiting[ident] = None
        try:
            self.channel.sendall(f"{what} {ident}\n".encode())
            deadline = time.monotonic() + timeout
            with self._cond:
                while self._waiting[ident] is None:
                    left = deadline - time.monotonic()
                    if self.ended():
                        raise LauncherError(f"the node watcher on {self.where} ended with "
                                            "its node's command")
                    if self._gone is not None:
                        raise LauncherError(f"the node watcher on {self.where} ended (exit "
                                            f"status {self._gone}); its node's command goes on")
                    if left <= 0:
                        # A late answer (a loaded node) is no reason to give the watcher
                        # up: the next look asks it again. Only its end (`gone`) is.
                        raise LauncherError(f"the node watcher on {self.where} did not "
                                            f"answer in {timeout:g} s")
                    self._cond.wait(min(left, 0.5))
                text = self._waiting[ident]
        except OSError as err:   # the session's channel closed under the send
            raise LauncherError(f"the node watcher on {self.where}: {err}") from None
        finally:
            with self._cond:
                self._waiting.pop(ident, None)
        try:
            answer = json.loads(text)
        except ValueError:
            raise LauncherError(f"the node watcher on {self.where} answered something that "
                                f"is not JSON: {text[:200]!r}") from None
        if isinstance(answer, dict) and set(answer) == {"error"}:
            raise LauncherError(f"the node watcher on {self.where}: {answer['error']}")
        return answer

    def close(self) -> None:
        """Nothing: the session is the agent's, and ends with it."""
