"""The hang watch's looks at one node (launcher/execute/watch.py: every rank's heartbeat, or
the run's processes), asked of launch_node/node_probe.py `watch` over one exec channel kept
for the run: a line asked, a line answered.

A look once started an interpreter on the node each time (node_probe.py heartbeats: ~50 ms of
a core) on every node, every 2 s, the run's own start included: measured on the 8-host lab,
3 s of CPU in a 15 s launch, more than the rendezvous store's torch import. Now each node
starts one, at the first look.

The node's end reads its stdin to the end: when launch closes the channel, or its connection
drops, or launch dies, it leaves.
"""

from __future__ import annotations

import socket
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
