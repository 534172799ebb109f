"""Collective bandwidth sweep that torchrun starts on every rank (`launch bench`).

    python launch_bench/bench.py --op all_reduce --sizes 8,16,...,67108864 --dtype float
        --warmup-iters 5 --iters 20 --out-dir RUN_DIR/NODE

It follows nccl-tests' procedure for each size: warm-up iterations, a barrier, `--iters` timed
iterations, the time per iteration averaged over ranks, then one separate iteration on fresh
data whose result is checked element by element (the wrong ones are nccl-tests' #wrong, summed
over ranks). Rank 0 prints one line per size and writes OUT_DIR/bench-results.json; `launch`
turns that into nccl-tests' table, bandwidth.json and bandwidth.png. Imports nothing from
launcher/, like train/main.py.

With --gate it is the collective gate instead (launch_bench/gate.py): the last size over all nodes,
then over node pairs until the slow node is named; rank 0 writes OUT_DIR/gate-results.json.

Placements: torch.distributed has out-of-place forms of all_gather and reduce_scatter only;
all_reduce and broadcast work in place, so their out-of-place column is not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch_bench.gate import run_gate, write_results  # noqa: E402
from launch_node.worker import die_with_parent  # noqa: E402
from train.main import init_distributed  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPES = {"float": torch.float32, "bfloat16": torch.bfloat16}
PER_RANK_COUNT = ("all_gather", "reduce_scatter")  # nccl-tests' count column is per rank


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("--sizes", required=True,
                   help="comma-separated sizes in bytes (nccl-tests' size column)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float")
    p.add_argument("--warmup-iters", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--gate", action="store_true",
                   help="the collective gate (launch_bench/gate.py): the last size over all nodes, "
                        "then node pairs until the slow node is named")
    p.add_argument("--floor-gbs", type=float,
                   help="with --gate: the bus bandwidth every pair must reach (GB/s); without "
                        "it a node is judged against the others")
    p.add_argument("--timeout", type=float,
                   help="seconds any collective may take before it fails (default: torch's)")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    return args


def init_pattern(op: str, rank: int, world: int, n: int, dtype, device) -> torch.Tensor:
    """What rank `rank` sends. Each element of an all_reduce/reduce_scatter sum has exactly one
    non-zero contributor, rank r at global positions p with (p + r) % world == 0, adding r + 1:
    every partial sum is exact in any dtype, yet a lost, doubled or shifted contribution shows.
    all_gather sends ±(rank + 1) alternating, broadcast's root a short ramp."""
    if op in ("all_reduce", "reduce_scatter"):
        p = torch.arange(n, device=device, dtype=torch.int64)
        return torch.where((p + rank) % world == 0, float(rank + 1), 0.0).to(dtype)
    if op == "all_gather":
        sign = 1 - 2 * (torch.arange(n, device=device) % 2)
        return (sign * (rank + 1)).to(dtype)
    return (torch.arange(n, device=device) % 5 + 1).to(dtype)  # broadcast root


def expected(op: str, rank: int, world: int, count: int, dtype, device) -> torch.Tensor:
    """The result rank `rank` must hold after one op on `init_pattern` data."""
    if op == "all_reduce":
        p = torch.arange(count, device=device, dtype=torch.int64)
        return ((-p) % world + 1).to(dtype)
    if op == "reduce_scatter":
        p = torch.arange(rank * count, (rank + 1) * count, device=device, dtype=torch.int64)
        return ((-p) % world + 1).to(dtype)
    if op == "all_gather":
        return torch.cat([init_pattern(op, r, world, count, dtype, device) for r in range(world)])
    return init_pattern(op, 0, world, count, dtype, device)


class Collective:
    """Buffers and one call of the collective for a placement; `fresh()` re-initialises the
    send data and returns the tensor that holds the result."""

    def __init__(self, op: str, in_place: bool, rank: int, world: int, count: int, dtype,
                 device):
        self.op, self.in_place, self.rank, self.world = op, in_place, rank, world
        self.count, self.dtype, self.device = count, dtype, device
        total = count * world if op in PER_RANK_COUNT else count
        self.big = torch.empty(total, dtype=dtype, device=device)
        if op == "all_gather":
            self.recv = self.big
            self.send = (self.big.narrow(0, rank * count, count) if in_place
                         else torch.empty(count, dtype=dtype, device=device))
        elif op == "reduce_scatter":
            self.send = self.big
            self.recv = (self.big.narrow(0, rank * count, count) if in_place
                         else torch.empty(count, dtype=dtype, device=device))
        else:
            self.send = self.recv = self.big
        # Newer torch renamed the tensor forms (the old names warn); older nodes have only those.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def fresh(self) -> torch.Tensor:
        # The timed iterations left correct results behind: clear them (no expected value is
        # 0), or a collective that stopped working would still pass the check.
        self.recv.zero_()
        if not (self.op == "broadcast" and self.rank != 0):
            self.send.copy_(init_pattern(self.op, self.rank, self.world, self.send.numel(),
                                         self.dtype, self.device))
        return self.recv

    def __call__(self) -> None:
        if self.op == "all_reduce":
            dist.all_reduce(self.big)
        elif self.op == "broadcast":
            dist.broadcast(self.big, src=0)
        elif self.op == "all_gather":
            self._all_gather(self.recv, self.send)
        else:
            self._reduce_scatter(self.recv, self.send)


def measure(coll: Collective, warmup: int, iters: int, check: bool, sync) -> dict:
    coll.fresh()
    for _ in range(warmup):
        coll()
    sync()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        coll()
    sync()
    seconds = (time.perf_counter() - started) / iters
    wrong = None
    if check:
        result = coll.fresh()
        coll()
        sync()
        want = expected(coll.op, coll.rank, coll.world, coll.count, coll.dtype, coll.device)
        wrong = int((result != want).sum().item())
    # nccl-tests reports the time averaged over ranks and the wrong elements of all ranks.
    totals = torch.tensor([seconds, float(wrong or 0)], dtype=torch.float64,
                          device=coll.device)
    dist.all_reduce(totals)
    return {"time_s": totals[0].item() / coll.world,
            "wrong": None if wrong is None else int(totals[1].item())}


def describe_rank(args, local_rank: int, device: torch.device) -> dict:
    # Ranks are listed by node name, the last part of the node's folder in every launch
    # layout: local nodes share one host name, and the node name is what the run folder uses.
    info = {"node": Path(os.path.abspath(args.out_dir)).name,
            "hostname": socket.gethostname(), "pid": os.getpid(),
            "device": local_rank, "bus_id": "cpu", "gpu": "cpu (gloo)"}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            info["bus_id"] = (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:"
                              f"{getattr(props, 'pci_device_id', 0):02x}")
    return info


def save_topology(out_dir: Path) -> None:
    """The node's `nvidia-smi topo -m` beside its results, so the bench's run report can name
    the interconnect it measured. Best effort: a bench never fails for want of it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return
    try:
        proc = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    if proc.returncode == 0 and proc.stdout.strip():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "topology.txt").write_text(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    args = parse_args(argv)
    backend, device, local_rank = init_distributed(args.backend, args.timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if device.type == "cuda" and local_rank == 0:
        save_topology(Path(args.out_dir))
    dtype = DTYPES[args.dtype]
    type_size = torch.tensor([], dtype=dtype).element_size()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ranks = [None] * world
    dist.all_gather_object(ranks, describe_rank(args, local_rank, device))
    if args.gate:
        result = run_gate(size=args.sizes[-1], dtype=dtype, device=device, sync=sync,
                          warmup=args.warmup_iters, iters=args.iters,
                          floor_gbs=args.floor_gbs, timeout_s=args.timeout or 1800.0,
                          ranks=ranks)
        if rank == 0:
            nccl = (".".join(str(v) for v in torch.cuda.nccl.version())
                    if backend == "nccl" else None)
            write_results(args.out_dir, {**result, "backend": backend, "dtype": args.dtype,
                                         "torch": torch.__version__, "nccl_version": nccl,
                                         "ranks": ranks})
        dist.destroy_process_group()
        return 0
    if rank == 0:
        print(f"bench {args.op} {args.dtype} on {world} rank(s), backend {backend}: "
              f"{len(args.sizes)} sizes", flush=True)

    rows = []
    placements = (False, True) if args.op in PER_RANK_COUNT else (True,)
    for size in args.sizes:
        elements = size // type_size
        count = elements // world if args.op in PER_RANK_COUNT else elements
        if count == 0:
            continue  # too small to give every rank one element
        row = {"size": count * type_size * (world if args.op in PER_RANK_COUNT else 1),
               "count": count, "out_of_place": None, "in_place": None}
        for in_place in placements:
            coll = Collective(args.op, in_place, rank, world, count, dtype, device)
            row["in_place" if in_place else "out_of_place"] = measure(
                coll, args.warmup_iters, args.iters, args.check, sync)
            del coll
        rows.append(row)
        if rank == 0:
            timing = row["in_place"]
            print(f"size {row['size']} B: {timing['time_s'] * 1e6:.1f} us in place, "
                  f"wrong {timing['wrong']}", flush=True)

    if rank == 0:
        nccl = None
        if backend == "nccl":
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        result = {"op": args.op, "dtype": args.dtype, "world_size": world, "backend": backend,
                  "warmup_iters": args.warmup_iters, "iters": args.iters,
                  "checked": args.check, "torch": torch.__version__, "nccl_version": nccl,
                  "ranks": ranks, "rows": rows}
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "bench-results.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out / "bench-results.json")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
