"""Where a PowerSGD step's time goes, on a 2-host lab cluster (SSH hosts in network
namespaces) with a free and a capped link: the demo's ViT-Tiny in several DDP variants, in
the same two processes, taking turns every few steps (so the shared machine's noise weighs
on each alike).

Per variant, the mean step and its parts:

    step       wall time of one optimizer step
    compute    the step less the exposed communication wait (forward, backward, optimizer)
    wait       exposed wait: from the last gradient to the end of backward (train/commtime.py)
    chain      from the first bucket's hook call to the last bucket's result
    transfer   time within the chain with an all-reduce in flight (their union)
    compress   the chain less the transfer: PowerSGD's own compute (and the hand-offs)
    hidden     the part of the chain that ran before the last gradient, under backward
    KB         bytes each host sent per step (its interface counter)

The rows are the trainer's own DDP (train/ddp.py wrap_ddp) built from DDPSettings, so a
variant is a set of recipe settings. Timing only (no accuracy): benchmarks/ddp_tuning.py
trains each variant to the end.

Needs root. Prints a table, writes benchmarks/results/powersgd_split.json.

    .venv/bin/python benchmarks/powersgd_split.py [--cap 100mbit] [--rounds 6] [--steps 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PORT = 29700
# The settings every variant starts from: the tuned DDP of benchmarks/ddp_tuning.py.
# PowerSGD from the third step: only its steady state is timed here.
TUNED = {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 5.0,
         "powersgd_start_iter": 2}
VARIANTS: dict[str, dict] = {
    "default": {"static_graph": False, "gradient_as_bucket_view": False, "bucket_cap_mb": 25.0},
    "torch": {"comm_hook": "powersgd", "powersgd_hook": "torch"},
    "torch-b25": {"comm_hook": "powersgd", "powersgd_hook": "torch", "bucket_cap_mb": 25.0},
    "fp32": {"comm_hook": "powersgd", "powersgd_wire": "fp32"},
    "bf16": {"comm_hook": "powersgd", "powersgd_wire": "bf16"},
    "bf16-b25": {"comm_hook": "powersgd", "powersgd_wire": "bf16", "bucket_cap_mb": 25.0},
    "fp32-b25": {"comm_hook": "powersgd", "powersgd_wire": "fp32", "bucket_cap_mb": 25.0},
    "bf16-b10": {"comm_hook": "powersgd", "powersgd_wire": "bf16", "bucket_cap_mb": 10.0},
    "bf16-noef-b25": {"comm_hook": "powersgd", "powersgd_wire": "bf16", "bucket_cap_mb": 25.0,
                      "powersgd_error_feedback": False},
}


# ---- the worker: one rank, in a lab host's network namespace --------------------------------


class Clock:
    """All-reduces and hook chains of the steps, as (start, end) intervals on this clock."""

    def __init__(self):
        self.flights: list[list[float]] = []
        self.chain_start: float | None = None
        self.chain_end = 0.0

    def reset(self) -> None:
        self.flights, self.chain_start, self.chain_end = [], None, 0.0


def instrument(clock: Clock) -> None:
    """Every async all-reduce's flight, and every comm hook call's span, onto `clock`."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        work = original(tensor, *args, **kwargs)
        if work is not None:
            flight = [time.perf_counter(), 0.0]
            clock.flights.append(flight)
            work.get_future().add_done_callback(
                lambda _f: flight.__setitem__(1, time.perf_counter()))
        return work

    dist.all_reduce = all_reduce
    register = DDP.register_comm_hook

    def register_timed(self, state, hook):
        def timed(state, bucket):
            if clock.chain_start is None:
                clock.chain_start = time.perf_counter()
            fut = hook(state, bucket)

            def ended(_f):
                clock.chain_end = max(clock.chain_end, time.perf_counter())

            fut.add_done_callback(ended)
            return fut

        timed.__name__ = timed.__qualname__ = hook.__name__
        return register(self, state, timed)

    DDP.register_comm_hook = register_timed
    del torch


def union(intervals: list[list[float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from train.commtime import CommTimer
    from train.data import load_dataset
    from train.ddp import DDPSettings, wrap_ddp
    from train.model import build_vit

    clock = Clock()
    instrument(clock)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    variants = json.loads(args.variants)
    data = load_dataset("digits", 8)
    gen = torch.Generator().manual_seed(rank)
    order = torch.randperm(len(data.train), generator=gen).tolist()
    batches = [(torch.stack([data.train[i][0] for i in order[j:j + 32]]),
                torch.tensor([int(data.train[i][1]) for i in order[j:j + 32]]))
               for j in range(0, len(order) - 31, 32)]
    runs = {}
    for name, settings in variants.items():
        torch.manual_seed(0)
        model = build_vit("vit_tiny", 8, 4, data.in_channels, data.num_classes)
        ddp, state = wrap_ddp(model, DDPSettings(**settings), torch.device("cpu"))
        runs[name] = {"ddp": ddp, "state": state, "timer": CommTimer(ddp.module, torch.device("cpu")),
                      "opt": torch.optim.AdamW(ddp.parameters(), lr=5e-4), "rows": []}
    tx = Path(f"/sys/class/net/{os.environ['GLOO_SOCKET_IFNAME']}/statistics/tx_bytes")
    step = 0
    for round_ in range(args.rounds + 1):   # round 0: warm-up (bucket rebuilds, allocations)
        for name, run in runs.items():
            for _ in range(args.steps):
                images, labels = batches[step % len(batches)]
                step += 1
                clock.reset()
                dist.barrier()
                sent = int(tx.read_text())
                t0 = time.perf_counter()
                run["opt"].zero_grad(set_to_none=True)
                loss = F.cross_entropy(run["ddp"](images), labels)
                loss.backward()
                run["timer"].backward_done()
                run["opt"].step()
                dt = time.perf_counter() - t0
                times = run["timer"].step_done(dt)
                sent = int(tx.read_text()) - sent
                if round_ == 0:
                    continue
                last_grad = run["timer"]._last_grad_at
                chain = (clock.chain_end - clock.chain_start) if clock.chain_start else 0.0
                transfer = union([f for f in clock.flights if f[1] > 0])
                hidden = max(0.0, min(last_grad, clock.chain_end) - clock.chain_start) \
                    if clock.chain_start else 0.0
                run["rows"].append([dt, times.comm_wait_s, chain, transfer, hidden, sent,
                                    len(clock.flights)])
    out = {name: run["rows"] for name, run in runs.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(gathered))
    for run in runs.values():
        run["timer"].close()
    runs.clear()
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver -----------------------------------------------------------------------------


def settings_of(overrides: dict) -> dict:
    from train.ddp import DDPSettings

    base = {f.name: f.default for f in dataclasses.fields(DDPSettings)}
    return {**base, **TUNED, **overrides}


def run_regime(lab, regime: str, variants: dict, args, tmp: Path, port: int) -> dict:
    out = tmp / f"{regime}.json"
    head = lab.hosts[0]
    procs = []
    for rank, host in enumerate(lab.hosts):
        env = {**os.environ, "MASTER_ADDR": head.rank_address, "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(len(lab.hosts)), "LOCAL_RANK": "0",
               "GLOO_SOCKET_IFNAME": host.ifname, "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, __file__, "--worker",
             "--variants", json.dumps(variants), "--rounds", str(args.rounds),
             "--steps", str(args.steps), "--worker-out", str(out)], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"{regime}: workers exited {codes}")
    gathered = json.loads(out.read_text())
    result = {}
    for name in variants:
        rows = [r for per_rank in gathered for r in per_rank[name]]
        n = len(rows)
        mean = [sum(r[i] for r in rows) / n for i in range(7)]
        step, wait, chain, transfer, hidden, sent, calls = mean
        steps = sorted(r[0] for r in rows)
        result[name] = {
            "step_s": round(step, 5), "median_step_s": round(steps[n // 2], 5),
            "compute_s": round(step - wait, 5), "wait_s": round(wait, 5),
            "chain_s": round(chain, 5), "transfer_s": round(transfer, 5),
            "compress_s": round(max(0.0, chain - transfer), 5), "hidden_s": round(hidden, 5),
            "kb_per_step": round(sent / 1e3, 1), "all_reduces": round(calls, 1),
            "images_per_sec": round(64 / steps[n // 2], 1), "samples": n,
        }
    return result


def table(results: dict) -> str:
    head = (f"{'regime':<7} {'variant':<22} {'img/s':>6} {'x free':>6} {'step s':>7} "
            f"{'compute':>7} {'wait':>6} {'chain':>6} {'transfer':>8} {'compress':>8} "
            f"{'hidden':>6} {'KB':>7} {'calls':>5}")
    lines = [head]
    free_default = results.get("free", {}).get("default", {}).get("images_per_sec")
    for regime, rows in results.items():
        for name, r in rows.items():
            ratio = f"{r['images_per_sec'] / free_default:.2f}" if free_default else "-"
            lines.append(
                f"{regime:<7} {name:<22} {r['images_per_sec']:>6.1f} {ratio:>6} "
                f"{r['median_step_s']:>7.4f} {r['compute_s']:>7.4f} {r['wait_s']:>6.4f} "
                f"{r['chain_s']:>6.4f} {r['transfer_s']:>8.4f} {r['compress_s']:>8.4f} "
                f"{r['hidden_s']:>6.4f} {r['kb_per_step']:>7.1f} {r['all_reduces']:>5.1f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cap", default="100mbit")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    p.add_argument("--regimes", nargs="+", default=["free", "capped"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--out", default=str(REPO / "benchmarks/results/powersgd_split.json"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args, _ = p.parse_known_args()
    if args.worker:
        args.variants = sys.argv[sys.argv.index("--variants") + 1]
        worker(args)
        return 0

    from launcher.lab import Lab

    variants = {name: settings_of(VARIANTS[name]) for name in args.variants}
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="powersgd-split-") as tmp:
        lab = Lab.create(Path(tmp) / "lab", 2)
        try:
            for i, regime in enumerate(args.regimes):
                for host in lab.hosts:
                    (lab.cap(host.name, args.cap) if regime == "capped"
                     else lab.uncap(host.name))
                results[regime] = run_regime(lab, regime, variants, args, Path(tmp), PORT + i)
                print(table({regime: results[regime]}), file=sys.stderr, flush=True)
        finally:
            lab.destroy()
    text = table(results)
    print(text)
    load = os.getloadavg()[0]
    print(f"means over {args.rounds} rounds x {args.steps} steps per variant per rank (img/s: "
          f"median step); link cap {args.cap} (tc tbf); load average {load:.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"regimes": results, "link_cap": args.cap,
                               "variants": {n: VARIANTS[n] for n in args.variants},
                               "base": TUNED, "load_average": load,
                               "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
