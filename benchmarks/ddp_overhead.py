"""DDP overhead in one process: the bare model vs DDP with its defaults vs DDP tuned
(static_graph, gradient_as_bucket_view, larger buckets), same model, same batches.

A world of one still runs DDP's machinery (bucketing, hooks, an all-reduce over a group of
one), so the difference is DDP's own cost, not communication. Variants are interleaved in
rounds so that machine noise hits all of them alike; the table shows median step time,
images/s and overhead against the bare model.

    .venv/bin/python benchmarks/ddp_overhead.py                 # CPU: ViT-Ti, 16 px
    .venv/bin/python benchmarks/ddp_overhead.py --device cuda   # GPU: ViT-B/16, 224 px, bf16, NCCL

On one GPU the default settings finish in about 3 minutes (ViT-B/16 at batch 64).
Writes benchmarks/results/ddp_overhead_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from train.ddp import DDPSettings, wrap_ddp  # noqa: E402
from train.model import build_vit, count_parameters  # noqa: E402

VARIANTS = {
    "bare": None,
    "ddp-default": DDPSettings(),
    "ddp-tuned": DDPSettings(static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=100),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", help="default: vit_b16 on cuda, vit_tiny on cpu")
    p.add_argument("--image-size", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", help="default: benchmarks/results/ddp_overhead_<device>.json")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    model_name = args.model or ("vit_b16" if cuda else "vit_tiny")
    image = args.image_size or (224 if cuda else 16)
    patch = 16 if image >= 64 else 4
    batch = args.batch_size or (64 if cuda else 32)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else nullcontext

    torch.manual_seed(0)
    images = torch.randn(batch, 3, image, image, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    runs = {}
    for name, settings in VARIANTS.items():
        torch.manual_seed(0)
        model = build_vit(model_name, image, patch, 3, 1000).to(device)
        wrapped = model if settings is None else wrap_ddp(model, settings, device)[0]
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
        runs[name] = (wrapped, opt, [])
    params = count_parameters(runs["bare"][0])

    def step(wrapped, opt) -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(wrapped(images), labels)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    for wrapped, opt, _ in runs.values():
        for _ in range(args.warmup):
            step(wrapped, opt)
    for _ in range(args.rounds):
        for wrapped, opt, times in runs.values():
            times.extend(step(wrapped, opt) for _ in range(args.steps_per_round))

    bare = statistics.median(runs["bare"][2])
    rows = []
    for name, (_, _, times) in runs.items():
        med = statistics.median(times)
        rows.append({"variant": name, "step_time_s": med, "images_per_sec": batch / med,
                     "overhead_pct": 100.0 * (med / bare - 1.0), "samples": len(times)})
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{model_name} ({params / 1e6:.1f} M params), {image} px, batch {batch}, "
          f"{'bf16 autocast, NCCL' if cuda else 'fp32, gloo'}, {gpu}, "
          f"torch {torch.__version__}, {os.environ.get('OMP_NUM_THREADS', 'default')} threads")
    print(f"{'variant':<12} {'step (ms)':>10} {'images/s':>10} {'overhead':>9}")
    for r in rows:
        print(f"{r['variant']:<12} {r['step_time_s'] * 1e3:>10.1f} {r['images_per_sec']:>10.1f} "
              f"{r['overhead_pct']:>+8.1f}%")
    out = Path(args.out or REPO / f"benchmarks/results/ddp_overhead_{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model_name, "parameters": params, "image_size": image,
                               "batch_size": batch, "device": gpu, "torch": torch.__version__,
                               "results": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
