"""The part of an asynchronous checkpoint that holds up training on the keeper, alone: the
model's and AdamW's state copied to CPU (train/staging.py cpu_copy), into fresh memory
against into the previous save's tensors, and what is left at the save when the copy of the
optimizer's tensors is deferred to the writer thread (train/staging.py Staging.take; the
deferred copy is timed apart, as the writer thread makes it), in one process, alternating.

The demo's ViT-Tiny (5.3 M parameters; with AdamW's moments ~64 MB), after one optimizer step
so the moments exist. Prints a table, writes benchmarks/results/checkpoint_copy.json.

    .venv/bin/python benchmarks/checkpoint_copy.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from train.staging import Staging, cpu_copy  # noqa: E402
from train.model import build_vit  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default=str(REPO / "benchmarks/results/checkpoint_copy.json"))
    args = p.parse_args()
    torch.set_num_threads(1)   # the trainer's rank on a 2-core lab host
    model = build_vit("vit_tiny", 8, 4, 1, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()

    def state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    times: dict[str, list[float]] = {"fresh": [], "reused": [], "at the save": [],
                                     "deferred": []}
    previous = cpu_copy(state())
    staging = Staging(lambda s: None)
    staging.take(model, optimizer)[1].run()
    for _ in range(args.repeats):
        for variant in ("fresh", "reused"):
            t0 = time.perf_counter()
            copy = cpu_copy(state(), previous if variant == "reused" else None)
            times[variant].append(time.perf_counter() - t0)
            if variant == "reused":
                previous = copy
            del copy
        t0 = time.perf_counter()
        _, deferred = staging.take(model, optimizer)
        times["at the save"].append(time.perf_counter() - t0)
        times["deferred"].append(deferred.run())
    mb = sum(t.numel() * t.element_size() for t in previous["model"].values()) + sum(
        t.numel() * t.element_size() for s in previous["optimizer"]["state"].values()
        for t in s.values() if isinstance(t, torch.Tensor))
    rows = {v: statistics.median(ts) for v, ts in times.items()}
    table = "\n".join([
        f"{'copy to CPU':<12} {'median ms':>9} {'min ms':>7}",
        *(f"{v:<12} {rows[v] * 1e3:>9.2f} {min(times[v]) * 1e3:>7.2f}" for v in rows),
        f"reused / fresh: {rows['reused'] / rows['fresh']:.2f}, at the save / reused: "
        f"{rows['at the save'] / rows['reused']:.3f} ({mb / 1e6:.1f} MB of tensors, "
        f"{args.repeats} alternating repeats, one thread; deferred: the writer thread's part)"])
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(table + "\n")
    out.write_text(json.dumps({
        "what": "seconds to copy the demo ViT-Tiny's model and AdamW state to CPU",
        "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "bytes": mb, "median_s": rows, "samples_s": times}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
