"""The rendezvous store, in a process of its own on the head node.

    python launch_node/rdzv_store.py --host 10.0.0.1 --port 29500

torchrun's c10d rendezvous keeps its state in a TCPStore. By default the head node's agent
hosts it, so the store dies with that agent: at the end of a successful run the head's agent
often exited before the other agents had closed the rendezvous, and they printed a C++ stack
trace ("recvVector failed ... has failed to shutdown the rendezvous") before "succeeded"; and a
restarted head agent could not rejoin a rendezvous whose store had gone. Here every agent is a
client (is_host=0), and launch stops this process after the last agent has left.

Prints one line when it listens (launch waits for it), then sleeps until SIGTERM/SIGINT.
Imports only torch, like the trainer.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from datetime import timedelta

READY = "rendezvous store listening on"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True, help="the head node's private address")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    # Leave at once on SIGTERM/SIGINT: nothing to flush, and the interpreter's normal exit
    # with torch loaded took ~1.7 s of every run's end. The kernel closes the socket.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    from torch.distributed import TCPStore

    try:
        store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                         multi_tenant=True, timeout=timedelta(seconds=60))
    except Exception as err:  # noqa: BLE001 (port in use, address not ours: say it and go)
        print(f"rendezvous store could not listen on {args.host}:{args.port}: {err}",
              flush=True)
        return 1
    print(f"{READY} {args.host}:{store.port}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
