"""Each rank's part of a checkpoint reaches the keeper whole (train/rank_parts.py): tensors of
every kind as raw bytes beside the pickle, one gather a save, and a part that outgrew the
capacity agreed at the first save completed point to point."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from train.checkpoint import rng_state
from train.rank_parts import pack, unpack


def test_a_part_comes_back_equal_with_its_tensors_types_and_shapes():
    random.seed(3)
    part = {"rank": 1, "rng": rng_state(torch.device("cpu")),
            "hook": {"pieces": {0: {"error": torch.randn(3, 2), "p": torch.empty(0, 4)},
                                7: {"q": torch.tensor(2.5, dtype=torch.bfloat16)}}},
            "view": torch.arange(12.0).reshape(3, 4)[:, 1],       # not contiguous
            "flags": torch.tensor([True, False]), "none": None, "text": "x"}
    back = unpack(pack(part))
    assert back["rng"]["python"] == random.getstate()   # the tuple, as random.setstate wants
    assert torch.equal(back["rng"]["torch"], part["rng"]["torch"])
    np_keys = back["rng"]["numpy"]["keys"]
    assert np_keys.dtype == torch.int64 and torch.equal(np_keys, part["rng"]["numpy"]["keys"])
    pieces = back["hook"]["pieces"]
    assert torch.equal(pieces[0]["error"], part["hook"]["pieces"][0]["error"])
    assert pieces[0]["p"].shape == (0, 4)
    assert pieces[7]["q"].dtype == torch.bfloat16 and pieces[7]["q"].shape == ()
    assert pieces[7]["q"].item() == 2.5
    assert back["view"].tolist() == [1.0, 5.0, 9.0]
    assert back["flags"].tolist() == [True, False]
    assert (back["none"], back["text"], back["rank"]) == (None, "x", 1)


RANK = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    from train.rank_parts import PartGather, Packed, unpack
    store, rank, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=3)
    parts = PartGather(keeper=1, rank=rank, world=3, device=torch.device("cpu"))
    saves = []
    # Save 0 agrees on the capacity; at save 2 rank 2's part is ~4 MB, far beyond it.
    for save, size in enumerate((10, 12, 1_000_000)):
        n = size if rank == 2 else 10
        got = parts.gather({"rank": rank, "save": save, "values": torch.arange(n) * (rank + 1)})
        if got is not None:
            saves.append([unpack(p) if isinstance(p, Packed) else p for p in got])
    if saves:
        torch.save({"saves": saves, "capacity": parts.capacity}, out)
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_three_ranks_parts_reach_the_keeper_whole_also_past_the_capacity(tmp_path):
    out = tmp_path / "parts.pt"
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(REPO), str(tmp_path / "store"),
                               str(rank), str(out)], stderr=subprocess.PIPE, text=True)
             for rank in range(3)]
    for proc in ranks:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    got = torch.load(out, weights_only=True)
    assert got["capacity"] < 1_000_000 * 8   # the large part did not fit: it went point to point
    for save, size in enumerate((10, 12, 1_000_000)):
        parts = got["saves"][save]
        assert [p["rank"] for p in parts] == [0, 1, 2]
        assert all(p["save"] == save for p in parts)
        for rank, part in enumerate(parts):
            n = size if rank == 2 else 10
            assert torch.equal(part["values"], torch.arange(n) * (rank + 1))
