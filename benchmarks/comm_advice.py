"""Does following launch's advice ever hurt? The demo recipe as it ships ("recipe") against the
same recipe with what launch advises when communication holds a run back ("advised":
ddp.comm_hook: auto and ddp.bucket_cap_mb: auto), on two kinds of link:

    local    `launch run --local --nodes 2`: two torchrun nodes on this machine, gloo over
             loopback (the demo; its recipe says loopback is not the bottleneck)
    capped   `launch run -i` on a 2-host lab (SSH hosts in network namespaces, launcher/lab/hosts.py)
             whose links tc caps at --cap each way: TCP between hosts that holds steps back

Each repeat runs the two variants back to back (a pair: whatever the shared machine is doing
weighs on both), through the real CLI. Reported per run: held-out accuracy, the wall time of
`launch run` (start-up, auto's probes and trial included: what a user waits), images/s (median
step), the mean step split (compute + data wait + communication wait), auto's decision with its
evidence; per kind of link: the speed of advised against recipe as recipe's wall time over
advised's (ratio of medians, and per pair), images/s likewise, and the accuracy difference per
pair (points) with its worst. The proof asked of the advice: accuracy within 1 point in every
pair, and faster on the capped link.

Runs are long on 2 cores (a local pair ~2.5 min, a capped pair ~4 min at 500mbit), so the
script takes them in chunks that merge into one JSON (benchmarks/results/comm_advice.json):

    flock /work/cpu.lock .venv/bin/python benchmarks/comm_advice.py --regime local --repeat 3
    flock /work/cpu.lock .venv/bin/python benchmarks/comm_advice.py --regime local --repeat 2
    flock /work/cpu.lock .venv/bin/python benchmarks/comm_advice.py --regime capped --repeat 2
    flock /work/cpu.lock .venv/bin/python benchmarks/comm_advice.py --regime capped --repeat 1
    .venv/bin/python benchmarks/comm_advice.py --table        # the table of all chunks

--fresh starts the JSON over. The capped regime needs root (network namespaces, tc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.nccl.advice import ADVISED_DDP, training_advice  # noqa: E402

DEMO = REPO / "launcher/recipes/vit-tiny-local.yml"
OUT = REPO / "benchmarks/results/comm_advice.json"
VARIANTS = ("recipe", "advised")


def variant_recipe(variant: str) -> dict:
    recipe = yaml.safe_load(DEMO.read_text())
    if variant == "advised":
        recipe["ddp"].update(ADVISED_DDP)
    recipe["name"] = f"demo-{variant}"
    return recipe


def launch(*args: str, cwd: Path, log: Path, timeout: float = 580) -> None:
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd,
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              stdin=subprocess.DEVNULL, env={**os.environ,
                                                             "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"launch {' '.join(args)} exited {proc.returncode}; see {log}:\n"
                         + "\n".join(log.read_text().splitlines()[-20:]))


def one_run(variant: str, where: list[str], work: Path, run_id: str) -> dict:
    recipe = work / f"{variant}.yml"
    recipe.write_text(yaml.safe_dump(variant_recipe(variant), sort_keys=False))
    started = time.perf_counter()
    launch("run", "--nodes", "2", str(recipe), *where, "--run-id", run_id, cwd=work,
           log=work / f"{run_id}.log")
    wall = time.perf_counter() - started
    run = work / "runs" / run_id
    summary = json.loads((run / "summary.json").read_text())
    result = json.loads((run / summary["rank0_node"] / "result.json").read_text())
    report = json.loads((run / "report.json").read_text())
    return {"variant": variant, "run_id": run_id, "accuracy": result["eval_accuracy"],
            "images_per_sec": result["images_per_sec"], "step_split": result["step_split"],
            "train_time_s": result["train_time_s"], "wall_s": round(wall, 1),
            "auto": result.get("auto"), "bucket_auto": result.get("bucket_auto"),
            "bucket_cap_mb": result["ddp"]["bucket_cap_mb"], "link": report["link"],
            "advice": report["advice"]}


def run_pairs(regime: str, repeat: int, cap: str, work: Path) -> list[dict]:
    lab = None
    if regime == "capped":
        from launcher.lab.hosts import Lab

        lab = Lab.create(work / "lab", 2)
        for host in lab.hosts:
            lab.cap(host.name, cap)
        where = ["-i", str(lab.inventory)]
    else:
        where = ["--local"]
    stamp = time.strftime("%H%M%S")
    rows = []
    try:
        for i in range(repeat):
            pair = []
            for variant in VARIANTS:
                row = one_run(variant, where, work, f"{regime}-{variant}-{stamp}-{i}")
                print(f"  {regime:<7} {variant:<8} accuracy {row['accuracy']:.4f} "
                      f"{row['images_per_sec']:8.1f} img/s, auto: "
                      f"{(row['auto'] or {}).get('choice', '-')}", file=sys.stderr, flush=True)
                pair.append(row)
            rows.append({"pair": f"{stamp}-{i}", "runs": pair})
    finally:
        if lab is not None:
            lab.destroy()
    return rows


def summarize(pairs: list[dict]) -> dict:
    """Per kind of link: advised / recipe as ratios, accuracy differences in points."""
    by = {v: [r for p in pairs for r in p["runs"] if r["variant"] == v] for v in VARIANTS}
    speed = [p["runs"][0]["wall_s"] / p["runs"][1]["wall_s"] for p in pairs]
    points = [100 * (p["runs"][1]["accuracy"] - p["runs"][0]["accuracy"]) for p in pairs]
    return {
        "pairs": len(pairs),
        # End to end: recipe's wall time over advised's (probes and trial included).
        "speed": round(statistics.median(r["wall_s"] for r in by["recipe"])
                       / statistics.median(r["wall_s"] for r in by["advised"]), 3),
        "speed_per_pair": [round(x, 3) for x in speed],
        "images_per_sec": round(statistics.median(r["images_per_sec"] for r in by["advised"])
                                / statistics.median(r["images_per_sec"] for r in by["recipe"]),
                                3),
        "accuracy_points_per_pair": [round(x, 2) for x in points],
        "worst_accuracy_points": round(min(points), 2),
        "within_1_point": all(abs(x) <= 1.0 for x in points),
        "auto_choices": [(r["auto"] or {}).get("choice") for r in by["advised"]],
    }


def print_table(doc: dict) -> None:
    print(f"{'link':<7} {'pair':<9} {'variant':<8} {'accuracy':>8} {'wall s':>7} {'img/s':>8} "
          f"{'step s':>7} {'= compute':>9} {'+ data':>7} {'+ comm':>7} {'buckets':>8}  auto")
    for regime, pairs in doc["regimes"].items():
        for pair in pairs:
            for r in pair["runs"]:
                sp = r["step_split"]
                auto = r["auto"] or {}
                print(f"{regime:<7} {pair['pair']:<9} {r['variant']:<8} {r['accuracy']:>8.4f} "
                      f"{r['wall_s']:>7.1f} {r['images_per_sec']:>8.1f} "
                      f"{sp['step_s']:>7.4f} {sp['compute_s']:>9.4f} "
                      f"{sp['data_wait_s']:>7.4f} {sp['comm_wait_s']:>7.4f} "
                      f"{r['bucket_cap_mb']:>8g}  {auto.get('choice', '-')}")
    print()
    print(f"{'link':<7} {'pairs':>5} {'speed x':>8} {'per pair':<28} {'img/s x':>7} "
          f"{'acc. points per pair':<30} {'worst':>6}  within 1 point")
    for regime, s in doc["summary"].items():
        print(f"{regime:<7} {s['pairs']:>5} {s['speed']:>8.3f} "
              f"{' '.join(f'{x:.2f}' for x in s['speed_per_pair']):<28} "
              f"{s['images_per_sec']:>7.3f} "
              f"{' '.join(f'{x:+.2f}' for x in s['accuracy_points_per_pair']):<30} "
              f"{s['worst_accuracy_points']:>+6.2f}  {s['within_1_point']}")
    print()
    for regime, pairs in doc["regimes"].items():
        recipe, advised = pairs[-1]["runs"]
        # The advice as launch words it now, from what the run measured.
        said = training_advice(recipe["step_split"], "none", None, recipe["link"], False)
        print(f"{regime}: what the report advises after the recipe's run: "
              + (" | ".join(said) or "nothing"))
        auto = advised["auto"] or {}
        print(f"{regime}: auto on the advised run: {auto.get('choice')}: {auto.get('reason')}")
    print(f"speed x: recipe's wall time / advised's (medians; start-up, auto's probes and "
          f"trial included); img/s x: advised / recipe (median steps); link cap in the "
          f"capped regime: {doc.get('link_cap')} each way per host (tc tbf)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regime", choices=["local", "capped"])
    p.add_argument("--repeat", type=int, default=1, help="pairs to run (default 1)")
    p.add_argument("--cap", default="500mbit", help="tc rate of the capped links")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--fresh", action="store_true", help="start the JSON over")
    p.add_argument("--table", action="store_true", help="only print the table of the JSON")
    args = p.parse_args()
    out = Path(args.out)
    doc = {"regimes": {}, "summary": {}}
    if out.exists() and not args.fresh:
        doc = json.loads(out.read_text())
    if args.regime and not args.table:
        with tempfile.TemporaryDirectory(prefix="comm-advice-") as tmp:
            pairs = run_pairs(args.regime, args.repeat, args.cap, Path(tmp))
        doc["regimes"].setdefault(args.regime, []).extend(pairs)
        doc["summary"] = {k: summarize(v) for k, v in doc["regimes"].items()}
        doc["link_cap"] = args.cap
        doc["advised_ddp"] = ADVISED_DDP
        doc["recipe"] = str(DEMO.relative_to(REPO))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
    if not doc["regimes"]:
        raise SystemExit(f"{out}: no runs yet; give --regime local or capped")
    print_table(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
