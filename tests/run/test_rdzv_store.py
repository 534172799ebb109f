"""The rendezvous store (launch_node/rdzv_store.py) as a process: it serves torch's own
TCPStore clients on the socket it listened on before importing torch, and a port in use is
said at once, in the OS's words, with its own exit status."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from launch_node.rdzv_store import READY

# Each starts the store, an interpreter that imports torch.
pytestmark = pytest.mark.slow

STORE = Path(__file__).resolve().parents[2] / "launch_node" / "rdzv_store.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_in_use_is_named_and_the_store_exits_1():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = subprocess.run([sys.executable, str(STORE), "--host", "127.0.0.1", "--port",
                               str(port)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"rendezvous store could not listen on 127.0.0.1:{port}" in proc.stdout
    assert "address already in use" in proc.stdout.lower()


def test_torch_clients_share_the_store_on_its_early_socket():
    from torch.distributed import TCPStore

    port = free_port()
    store = subprocess.Popen([sys.executable, str(STORE), "--host", "127.0.0.1", "--port",
                              str(port)], stdout=subprocess.PIPE, text=True)
    try:
        # Connected at once, answered once the store is up.
        first = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        # On libuv's event loop (issue 37: thousands of agents), the early socket taken.
        assert store.stdout.readline() == f"{READY} 127.0.0.1:{port} (libuv backend)\n"
        second = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        first.set("rank0", "10.0.0.1")
        assert second.get("rank0") == b"10.0.0.1"
        assert second.add("joined", 1) == 1 and first.add("joined", 1) == 2
    finally:
        store.terminate()
        assert store.wait(timeout=30) == 0   # leaves at once on SIGTERM
