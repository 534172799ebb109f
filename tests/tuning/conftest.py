from __future__ import annotations

import socket

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world_of_one():
    """A real gloo process group of one rank in this process: DDP and hooks run for real."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()
