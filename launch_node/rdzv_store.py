"""The rendezvous store, in a process of its own on the head node.

    python launch_node/rdzv_store.py --host 10.0.0.1 --port 29500

torchrun's c10d rendezvous keeps its state in a TCPStore. By default the head node's agent
hosts it, so the store dies with that agent: at the end of a successful run the head's agent
often exited before the other agents had closed the rendezvous, and they printed a C++ stack
trace ("recvVector failed ... has failed to shutdown the rendezvous") before "succeeded"; and a
restarted head agent could not rejoin a rendezvous whose store had gone. Here every agent is a
client (is_host=0), and launch stops this process after the last agent has left.

It listens before it imports torch (~1.5 s of CPU), and hands that socket to the TCPStore: an
agent that connects sooner waits in the listen queue and is answered the moment the store is
up. Refused instead, it waited c10d's fixed 1 s connect backoff before trying again (measured:
a client done 1 ms after the store came up with the early socket, 1.05 s after without), and
agents start at the same moment as this process. A port in use is said at once, too.

Prints one line when the store is up (with its backend: libuv, which torch uses by default
from 2.4 and which pytorch measured starting 96K ranks in 100 s), then sleeps until
SIGTERM/SIGINT.
Imports only torch, like the trainer.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from datetime import timedelta

READY = "rendezvous store listening on"


def listen(host: str, port: int) -> socket.socket:
    """The store's socket, bound and listening, as TCPStore binds its own (SO_REUSEADDR: a
    connection of a run that just ended, in TIME_WAIT, does not make the port busy)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Every agent of a large cluster may be queued here before the store answers.
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True, help="the head node's private address")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    # Leave at once on SIGTERM/SIGINT: nothing to flush, and the interpreter's normal exit
    # with torch loaded took ~1.7 s of every run's end. The kernel closes the socket.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    try:
        sock = listen(args.host, args.port)
    except OSError as err:  # port in use, address not ours: say it and go
        print(f"rendezvous store could not listen on {args.host}:{args.port}: {err}",
              flush=True)
        return 1
    from torch.distributed import TCPStore

    try:
        store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                         multi_tenant=True, timeout=timedelta(seconds=60),
                         master_listen_fd=sock.fileno())
    except Exception as err:  # noqa: BLE001 (say it and go)
        print(f"rendezvous store could not start on {args.host}:{args.port}: {err}",
              flush=True)
        return 1
    sock.detach()   # the store's now: it closes it
    # libuv's event loop serves thousands of agents where the older backend's thread per
    # connection did not (torch's default from 2.4, and it takes the early socket; said so
    # that a torch which falls back to the old one shows in the run's log).
    backend = "libuv" if getattr(store, "libuvBackend", False) else "classic"
    print(f"{READY} {args.host}:{store.port} ({backend} backend)", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
