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


@pytest.fixture
def capped_lab(tmp_path_factory):
    """Two lab hosts whose links are capped at 20 Mbit/s each way."""
    from launcher.lab.hosts import Lab, lab_unavailable_reason

    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    lab = Lab.create(tmp_path_factory.mktemp("lab") / "lab", hosts=2, cap="20mbit")
    yield lab
    lab.destroy()
