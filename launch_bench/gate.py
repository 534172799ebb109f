"""The collective gate, run inside one torchrun job (`launch_bench/bench.py --gate`): an all-reduce over
all nodes, then, when it is under the floor (or there is no floor to judge by), pairwise
all-reduces in rounds of disjoint node pairs (launch_bench/gatesearch.py picks them) until the slow
node is named. One job for all rounds: the pairs are process subgroups of the same world, so
the gate pays for starting torch and forming the rendezvous once.

Rank 0 writes OUT_DIR/gate-results.json: the all-nodes figure, every pair measured and the
search's verdict. Imports nothing from launcher/.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from launch_bench.gatesearch import GateSearch

RESULTS_FILE = "gate-results.json"
# Time one pair may spend timing when its first all-reduce shows a slow link; at least
# MIN_ITERS operations are timed whatever it costs.
BUDGET_S = 2.0
MIN_ITERS = 3


def bus_bandwidth_gbs(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all_reduce busbw: S / t x 2(n-1)/n, in GB/s."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def timed_all_reduce(group, count: int, dtype, device, warmup: int, iters: int, sync,
                     budget_s: float = BUDGET_S) -> float:
    """Seconds of the median all-reduce on this rank. The median of single timed operations,
    not their mean: one descheduled moment on a busy node must not make its pair look slow.
    A slow link shows in its first operation: the group agrees on how many to time from the
    slowest rank's first one, so a link at a few Mbit/s costs seconds, not minutes."""
    tensor = torch.ones(count, dtype=dtype, device=device)
    if device.type == "cuda":
        # NCCL sets up a group's communicator on its first collective: not a link's speed.
        dist.all_reduce(tensor, group=group)
    sync()
    started = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    sync()
    first = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MAX, group=group)
    slow = first.item() * (warmup + iters) > budget_s
    warmup = 0 if slow else warmup - 1
    iters = max(MIN_ITERS, min(iters, int(budget_s / max(first.item(), 1e-9)))) if slow else iters
    for _ in range(max(0, warmup)):
        dist.all_reduce(tensor, group=group)
    sync()
    dist.barrier(group=group)
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def node_ranks(ranks: list[dict]) -> dict[str, list[int]]:
    """node name -> its ranks, nodes in the order their first rank comes."""
    out: dict[str, list[int]] = {}
    for rank, info in enumerate(ranks):
        out.setdefault(info["node"], []).append(rank)
    return out


def run_gate(*, size: int, dtype, device, sync, warmup: int, iters: int,
             floor_gbs: float | None, timeout_s: float, ranks: list[dict]) -> dict | None:
    """Every rank calls it; rank 0 gets the results, the others None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    count = max(1, size // torch.tensor([], dtype=dtype).element_size())
    size = count * torch.tensor([], dtype=dtype).element_size()
    by_node = node_ranks(ranks)
    nodes = list(by_node)

    seconds = timed_all_reduce(None, count, dtype, device, warmup, iters, sync)
    total = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    all_seconds = total.item() / world
    all_busbw = bus_bandwidth_gbs(size, all_seconds, world)
    if rank == 0:
        print(f"gate: all-reduce of {size} B over {len(nodes)} node(s) ({world} ranks): "
              f"{all_busbw:.4g} GB/s", flush=True)

    search = GateSearch(nodes, floor=floor_gbs)
    pairwise = len(nodes) >= 3 and (floor_gbs is None or all_busbw < floor_gbs)
    if len(nodes) == 2:
        # The all-nodes run was the only pair there is.
        search.record(nodes[0], nodes[1], all_busbw)
    while pairwise:
        box = [search.next_round() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        pairs = box[0]
        if not pairs:
            break
        mine = None
        groups = []
        for index, (a, b) in enumerate(pairs):
            members = sorted(by_node[a] + by_node[b])
            group = dist.new_group(members, timeout=timedelta(seconds=timeout_s))
            groups.append(group)
            if rank in members:
                mine = (index, group)
        answer: tuple[int, float | None] | None = None
        if mine is not None:
            index, group = mine
            try:
                answer = (index, timed_all_reduce(group, count, dtype, device, warmup, iters,
                                                  sync))
            except RuntimeError as err:   # a pair that times out is the finding, not a crash
                print(f"gate: pair {pairs[index]} failed: {err}", flush=True)
                answer = (index, None)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, answer)
        if rank == 0:
            for index, (a, b) in enumerate(pairs):
                times = [t for i, t in filter(None, gathered) if i == index]
                members = len(by_node[a]) + len(by_node[b])
                busbw = (None if not times or any(t is None for t in times)
                         else bus_bandwidth_gbs(size, sum(times) / len(times), members))
                search.record(a, b, busbw)
                shown = "failed" if busbw is None else f"{busbw:.4g} GB/s"
                print(f"gate: round {len(search.rounds)}: {a} + {b}: {shown}", flush=True)
        for group in groups:
            if group is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
    if rank != 0:
        return None
    return {"size": size, "world_size": world, "nodes": by_node,
            "all_nodes": {"busbw_gbs": all_busbw, "time_s": all_seconds},
            "pairwise": pairwise, "search": search.verdict()}


def write_results(out_dir: str, result: dict) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{RESULTS_FILE}.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out / RESULTS_FILE)
    return out / RESULTS_FILE
