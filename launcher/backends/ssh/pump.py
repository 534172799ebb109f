"""One thread that reads the output of every node's command channel, for all the runs of this
process (launcher/backends/ssh/agent.py starts each node's command on a channel of its own).

fabric's asynchronous run() gave each node's command two threads of its own (invoke's stdout
and stderr readers), beside paramiko's transport thread and the supervisor's reader: four
threads per host (measured with py-spy on a 4-host lab run: handle_stdout, handle_stderr,
Thread-N, read-hostN each 4), a thousand at 256 hosts. Here the channels are watched with one
selector: paramiko gives each channel a file descriptor that is readable while data waits on
its stdout or stderr and for ever once the channel is closed (Channel.fileno), so one thread
drains whichever is ready and hands the bytes, decoded as UTF-8 across chunk boundaries, to
each node's line sinks.
"""

from __future__ import annotations

import codecs
import os
import selectors
import threading
import time
from typing import Any

CHUNK = 1 << 16


class Pumped:
    """One channel's output, drained into `out` and `err` (write(str)/close()); `done` once
    the channel has ended and everything it sent was handed over."""

    def __init__(self, channel: Any, out: Any, err: Any):
        self.channel, self.out, self.err = channel, out, err
        self.fd = -1   # the channel's pipe, as registered with the selector
        self.done = threading.Event()
        self._decoders = (codecs.getincrementaldecoder("utf-8")(errors="replace"),
                          codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def drain(self) -> bool:
        """Whatever waits now handed over; True once the channel has ended (nothing more
        will come)."""
        channel = self.channel
        while channel.recv_ready():
            data = channel.recv(CHUNK)
            if not data:
                break
            self.out.write(self._decoders[0].decode(data))
        while channel.recv_stderr_ready():
            data = channel.recv_stderr(CHUNK)
            if not data:
                break
            self.err.write(self._decoders[1].decode(data))
        ended = channel.closed or (channel.eof_received and not channel.recv_ready()
                                   and not channel.recv_stderr_ready())
        if ended:
            for sink, decoder in zip((self.out, self.err), self._decoders):
                tail = decoder.decode(b"", final=True)
                if tail:
                    sink.write(tail)
        return ended


class ChannelPump:
    """The selector thread; started with the first channel, kept for the process's life
    (a daemon thread: it holds nothing a run's end must wait for)."""

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: list[Pumped] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, channel: Any, out: Any, err: Any) -> Pumped:
        """Drain `channel` into the sinks from now on. Registered by the pump's own thread
        (a selector is not to be changed while another thread selects on it)."""
        pumped = Pumped(channel, out, err)
        channel.fileno()   # paramiko makes the channel's pipe now, before data can arrive
        with self._lock:
            self._pending.append(pumped)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ssh-output",
                                                daemon=True)
                self._thread.start()
        os.write(self._wake_w, b"x")
        return pumped

    def _run(self) -> None:
        while True:
            try:
                for key, _events in self._selector.select():
                    if key.data is None:
                        self._take_pending()
                        continue
                    self._serve(key.data)
            except Exception:  # noqa: BLE001 (the one reader of every node: it must go on)
                time.sleep(0.05)   # never a hot loop on an error that repeats

    def _take_pending(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            pending, self._pending = self._pending, []
        for pumped in pending:
            pumped.fd = pumped.channel.fileno()
            try:
                self._selector.register(pumped.fd, selectors.EVENT_READ, pumped)
            except KeyError:
                # The number of a pipe closed while registered (a channel closed by hand
                # before its end was seen), now another channel's: the stale entry goes.
                stale = self._selector.get_key(pumped.fd).data
                self._selector.unregister(pumped.fd)
                if stale is not None:
                    stale.done.set()
                self._selector.register(pumped.fd, selectors.EVENT_READ, pumped)
            self._serve(pumped)   # what arrived before it was registered

    def _serve(self, pumped: Pumped) -> None:
        try:
            ended = pumped.drain()
        except Exception:  # noqa: BLE001 (a channel that broke under us has ended)
            ended = True
        if ended:
            try:
                # By the number registered: fileno() of a channel closed by hand makes a pipe.
                self._selector.unregister(pumped.fd)
            except (KeyError, ValueError, OSError):
                pass
            pumped.done.set()


_PUMP: ChannelPump | None = None
_PUMP_LOCK = threading.Lock()


def pump() -> ChannelPump:
    """This process's pump."""
    global _PUMP
    with _PUMP_LOCK:
        if _PUMP is None:
            _PUMP = ChannelPump()
        return _PUMP


def start_on(transport: Any, command: str, out: Any, err: Any) -> Pumped:
    """`command` exec'd on a new session channel of `transport`, its output pumped into the
    sinks. Its stdin stays open (the node's watchdog reads it: launcher/backends/ssh/agent.py
    START_SCRIPT) until the channel closes."""
    channel = transport.open_session()
    try:
        channel.exec_command(command)
    except BaseException:
        channel.close()
        raise
    return pump().add(channel, out, err)
