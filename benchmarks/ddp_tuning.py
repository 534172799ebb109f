"""Does the DDP tuning pay? The same ViT recipe on the digits set, trained on a 2-host lab
cluster (SSH hosts in network namespaces) in several DDP variants, on a free link and on a
link capped with tc so that plain DDP spends most of its time communicating.

    variants: default         plain DDP(model)
              tuned           static_graph, gradient_as_bucket_view, bucket_cap_mb 5
              tuned+fp16      tuned + fp16 gradient compression
              tuned+powersgd  tuned + PowerSGD rank 4 (10 plain warm-up steps), launch's hook
                              (train/powersgd.py: bf16 on the wire, two all-reduces a bucket)
              tuned+powersgd-torch    the same with torch's powerSGD_hook, fp32 on the wire
              tuned+powersgd-b25      launch's hook with 25 MB buckets
              tuned+powersgd-r2       launch's hook at rank 2
              auto            comm_hook: auto, bucket_cap_mb: auto (measured by the trainer)

The last line compares the capped link's best variant with the free link's default.

Every variant sees the same seed and the same samples. Reported per variant: images/s
(median over steps after warm-up), step time, bytes sent per step per host (from the host's
interface counters, read by the trainer), held-out accuracy, and the compute /
communication split measured in the trainer (train/commtime.py). The table is `launch
compare`'s (launcher/report/compare.py) of each regime's run folders, ratios against `default`.

Needs root. Prints a table, writes benchmarks/results/ddp_tuning.json and ddp_tuning.png.

    .venv/bin/python benchmarks/ddp_tuning.py [--cap 100mbit] [--epochs 15]   # ~35 min on 2 cores
        [--variants ...] [--skip capped/default ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.backends.ssh.backend import SshBackend  # noqa: E402
from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.cluster.ssh import SshOptions  # noqa: E402
from launcher.core.errors import RunFailed  # noqa: E402
from launcher.job.request import RunRequest  # noqa: E402
from launcher.pipeline.run import run_here  # noqa: E402
from launcher.job.recipe import recipe_from_mapping  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402
from launcher.report.compare import load_comparison, render_text  # noqa: E402
from launcher.report.display import PlainDisplay  # noqa: E402

TUNED = {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 5}
VARIANTS = {
    "default": {},
    "tuned": TUNED,
    "tuned+fp16": {**TUNED, "comm_hook": "fp16"},
    "tuned+powersgd": {**TUNED, "comm_hook": "powersgd",
                       "powersgd": {"rank": 4, "start_iter": 10}},
    # What else was tried for the capped link (benchmarks/README.md): fewer, larger buckets
    # (fewer hook chains, less overlap with backward); rank 2 (half of the factors' work).
    "tuned+powersgd-b25": {**TUNED, "bucket_cap_mb": 25, "comm_hook": "powersgd",
                           "powersgd": {"rank": 4, "start_iter": 10}},
    "tuned+powersgd-r2": {**TUNED, "comm_hook": "powersgd",
                          "powersgd": {"rank": 2, "start_iter": 10}},
    # torch's own powerSGD_hook, fp32 on the wire: what train/powersgd.py is measured against.
    "tuned+powersgd-torch": {**TUNED, "comm_hook": "powersgd",
                             "powersgd": {"rank": 4, "start_iter": 10, "hook": "torch",
                                          "wire": "fp32"}},
    "auto": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": "auto",
             "comm_hook": "auto", "powersgd": {"rank": 4}},
}


def variant_recipe(name: str, epochs: float) -> dict:
    base = yaml.safe_load((REPO / "launcher/recipes/vit-tiny-local.yml").read_text())
    base["name"] = f"tuning-{name.replace('+', '-')}"
    base["train"].update(epochs=epochs, log_every=10)
    base["ddp"] = VARIANTS[name]
    return base


def run_variant(lab: Lab, name: str, regime: str, epochs: float, runs: Path,
                port: int) -> tuple[dict, Path]:
    recipe = recipe_from_mapping(variant_recipe(name, epochs), f"benchmarks/ddp_tuning.py:{name}")
    run_id = f"{regime}-{recipe.name}"
    quiet = PlainDisplay(open(runs.parent / f"{run_id}.log", "w"))  # noqa: SIM115
    try:
        summary = run_here(SshBackend(lab.inventory, SshOptions()),
                           RunRequest(recipe, run_id, len(load_inventory(lab.inventory)),
                                      runs_dir=str(runs), rdzv_port=port), display=quiet)
    except RunFailed as err:
        raise SystemExit(f"{regime}/{name} failed:\n{err}") from None
    result = json.loads((runs / run_id / summary["rank0_node"] / "result.json").read_text())
    per_host = result.get("tx_bytes_per_step") or {}
    return runs / run_id, {
        "images_per_sec": result["images_per_sec"],
        "step_time_s": result["step_time_s"],
        "bytes_per_step": max(per_host.values()) if per_host else None,
        "bytes_per_step_per_host": per_host,
        "accuracy": result["eval_accuracy"],
        # The mean step's parts (train/stepsplit.py): compute + data wait + comm wait.
        "compute_s": result["step_split"]["compute_s"] + result["step_split"]["data_wait_s"],
        "comm_s": result["step_split"]["comm_wait_s"],
        "steps": result["steps"],
        "auto": result.get("auto"),
        "bucket_cap_mb": result["ddp"]["bucket_cap_mb"],
    }


def variant_table(folders: dict[str, Path]) -> str:
    """The variants' run folders side by side, as `launch compare` prints them: ratios
    against the first variant."""
    return render_text(load_comparison(list(folders.values()), labels=list(folders)))


def print_table(results: dict, folders: dict[str, dict[str, Path]], cap: str) -> None:
    for regime, by_variant in folders.items():
        print(f"{regime} link:")
        print(variant_table(by_variant))
    for regime, rows in results.items():
        d = rows.get("default")
        if d and d["compute_s"]:
            print(f"{regime}: default spends {d['comm_s']:.3f}s waiting on communication per "
                  f"step against {d['compute_s']:.3f}s of compute "
                  f"({d['comm_s'] / d['compute_s']:.1f}x)")
        auto = rows["auto"].get("auto") if "auto" in rows else None
        if auto:
            print(f"{regime}: auto chose {auto['choice']} at step {auto['decided_at_step']}: "
                  f"{auto['reason']}; bucket_cap_mb {rows['auto']['bucket_cap_mb']}")
    free = results.get("free", {}).get("default")
    if free and results.get("capped"):
        name, best = max(results["capped"].items(), key=lambda kv: kv[1]["images_per_sec"])
        print(f"capped best ({name}) vs free default: {best['images_per_sec']:.1f} / "
              f"{free['images_per_sec']:.1f} img/s = "
              f"{best['images_per_sec'] / free['images_per_sec']:.2f}x, accuracy "
              f"{best['accuracy']:.4f} vs {free['accuracy']:.4f}")
    print(f"link cap in the capped regime: {cap} each way per host (tc tbf)")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (regime, rows) in zip(axes[0], results.items()):
        names = list(rows)
        ax.bar(names, [rows[n]["images_per_sec"] for n in names], color="tab:blue")
        ax.set_title(f"{regime} link")
        ax.set_ylabel("images/s")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cap", default="100mbit", help="tc rate for the capped regime")
    p.add_argument("--epochs", type=float, default=15,
                   help="default: the demo recipe's 15 (330 steps); every variant sees the same samples")
    p.add_argument("--regimes", nargs="+", default=["free", "capped"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--skip", nargs="+", default=[], metavar="REGIME/VARIANT",
                   help="leave these out (capped/default: 1.9 s a step, ~10 minutes)")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/ddp_tuning.json"))
    args = p.parse_args()

    results: dict = {}
    folders: dict[str, dict[str, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="ddp-tuning-") as tmp:
        lab = Lab.create(Path(tmp) / "lab", 2)
        try:
            port = 29800
            for regime in args.regimes:
                for host in lab.hosts:
                    if regime == "capped":
                        lab.cap(host.name, args.cap)
                    else:
                        lab.uncap(host.name)
                results[regime], folders[regime] = {}, {}
                for name in args.variants:
                    if f"{regime}/{name}" in args.skip:
                        continue
                    port += 1
                    folder, row = run_variant(lab, name, regime, args.epochs,
                                              Path(tmp) / "runs", port)
                    results[regime][name], folders[regime][name] = row, folder
                    print(f"  {regime:<7} {name:<15} {row['images_per_sec']:8.1f} img/s, "
                          f"accuracy {row['accuracy']:.4f}", file=sys.stderr, flush=True)
        finally:
            lab.destroy()
        print_table(results, folders, args.cap)   # from the run folders, before they go
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"regimes": results, "link_cap": args.cap,
                               "load": os.getloadavg(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "model": "vit_tiny (12 blocks, width 192, 5.3 M params), "
                                        f"digits 8x8, patch 4, batch 32 per rank, "
                                        f"{args.epochs:g} epochs, 2 lab hosts x 1 rank"},
                              indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
