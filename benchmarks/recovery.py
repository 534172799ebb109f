"""What surviving a failure costs, on a 2-host lab cluster (SSH hosts in network namespaces):

    recovery     a worker on host1 is killed (SIGKILL) once it has trained past step K;
                 torchrun restarts the workers, the rendezvous re-forms, the trainer resumes
                 from the last checkpoint. Measured per checkpoint interval (10 and 50 steps):
                 seconds from the kill to the first step after the resume (the benchmark's own
                 clock: the kill, and the arrival of the trainer's "first step since the
                 restart" line), the part of it spent reading and sharing the checkpoint, and
                 the steps done again (the kill's step minus the checkpoint's).
    cost         the same recipe without checkpoints, then with a checkpoint every 10 steps
                 written asynchronously (the keeper copies to CPU, a thread writes) and
                 synchronously. The cost per step is the time a checkpoint holds up training
                 on the keeper (the ranks' exchange, the copy, waiting for the previous write;
                 synchronous: the write too), measured in the trainer, over the steps taken,
                 as a share of the median step time. The end-to-end time per step of every
                 variant is shown beside it: on a shared machine it moves by more than the
                 checkpoints cost, so the share measured in the trainer is the figure to use.

Model: the demo's ViT-Tiny (12 blocks, width 192, 5.3 M parameters; a checkpoint with AdamW's
moments is ~64 MB), digits 8x8, batch 32 per rank, 2 hosts x 1 rank on CPU (gloo).

Needs root. Prints a table, writes benchmarks/results/recovery.json and recovery.txt.

    .venv/bin/python benchmarks/recovery.py [--kill-at 75] [--steps 150] [--cost-steps 120]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.backends import LaunchOptions  # noqa: E402
from launcher.backends.ssh import SshBackend  # noqa: E402
from launcher.display import PlainDisplay  # noqa: E402
from launcher.errors import RunFailed  # noqa: E402
from launcher.inventory import load_inventory  # noqa: E402
from launcher.lab import Lab  # noqa: E402
from launcher.recipe import recipe_from_mapping  # noqa: E402
from launcher.ssh import SshOptions  # noqa: E402
from train.heartbeat import heartbeat_path, read_heartbeat  # noqa: E402


def recipe(name: str, steps: int, checkpoint: dict | None, restarts: int = 0):
    base = yaml.safe_load((REPO / "launcher/recipes/vit-tiny-local.yml").read_text())
    base["name"] = name
    base["train"].pop("epochs")
    base["train"].update(steps=steps, log_every=10)
    base["rendezvous"]["timeout"] = 120
    base["restarts"] = restarts
    if checkpoint:
        base["checkpoint"] = checkpoint
    return recipe_from_mapping(base, f"benchmarks/recovery.py:{name}")


class TimedDisplay(PlainDisplay):
    """Lines to a log file, and the time the first of each kind of line arrived."""

    def __init__(self, stream, marks: tuple[str, ...]):
        super().__init__(stream)
        self.marks = marks
        self.seen: dict[str, float] = {}

    def line(self, node: str, rank: str, text: str) -> None:
        now = time.monotonic()
        for mark in self.marks:
            if mark in text:
                self.seen.setdefault(mark, now)
        super().line(node, rank, text)


def launch(lab: Lab, rec, run_id: str, runs: Path, port: int, display) -> dict:
    try:
        with redirect_stdout(io.StringIO()):  # the run report; kept in the run folder
            return SshBackend(lab.inventory, SshOptions()).launch(
                rec, load_inventory(lab.inventory), run_id, LaunchOptions(str(runs),
                                                                          display=display),
                rdzv_port=port)
    except RunFailed as err:
        raise SystemExit(f"{run_id} failed:\n{err}") from None


def killer(lab: Lab, run_id: str, kill_at: int, out: dict) -> threading.Thread:
    """Kills host1's rank once its heartbeat shows step >= kill_at (a process of this run:
    its environment carries the run id)."""
    beat = heartbeat_path(lab.dir / "node-runs" / run_id / "host1", 0)

    def watch():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            record = read_heartbeat(beat)
            if record and record.get("phase") == "train" and record["step"] >= kill_at:
                pid = record["pid"]
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if f"LAUNCH_RUN_ID={run_id}".encode() in env:
                    out["killed_at"] = time.monotonic()
                    out["killed_after_step"] = record["step"]
                    os.kill(pid, signal.SIGKILL)
                    return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def recovery_row(lab: Lab, interval: int, steps: int, kill_at: int, runs: Path, port: int,
                 logs: Path) -> dict:
    run_id = f"recover-every-{interval}"
    rec = recipe(run_id, steps, {"every_steps": interval, "keep": 2}, restarts=1)
    display = TimedDisplay(open(logs / f"{run_id}.log", "w"),  # noqa: SIM115
                           ("first step since the restart",))
    killed: dict = {}
    thread = killer(lab, run_id, kill_at, killed)
    summary = launch(lab, rec, run_id, runs, port, display)
    thread.join(timeout=1)
    (restart,) = summary["restarts"]
    first = display.seen.get("first step since the restart")
    return {
        "checkpoint_every_steps": interval,
        "killed_after_step": killed.get("killed_after_step"),
        "resumed_from_step": restart["resumed_from_step"],
        "steps_lost": restart["steps_lost"],
        "kill_to_first_step_s": None if first is None or "killed_at" not in killed
        else round(first - killed["killed_at"], 3),
        "launch_saw_failure_to_first_step_s": restart["recovered_in_s"],
        "checkpoint_load_s": restart["checkpoint_load_s"],
        "step_time_s": summary["step_time_s"],
        "accuracy": summary["eval_accuracy"],
    }


def cost_row(lab: Lab, name: str, steps: int, checkpoint: dict | None, runs: Path, port: int,
             logs: Path) -> dict:
    run_id = f"cost-{name}"
    rec = recipe(run_id, steps, checkpoint)
    summary = launch(lab, rec, run_id, runs, port,
                     PlainDisplay(open(logs / f"{run_id}.log", "w")))  # noqa: SIM115
    result = json.loads((runs / run_id / summary["rank0_node"] / "result.json").read_text())
    stats = result.get("checkpoint")
    step_s = result["step_time_s"]
    blocking = stats["blocking_s"] if stats else 0.0
    return {
        "variant": name,
        "steps": result["steps"],
        "median_step_s": step_s,
        "wall_per_step_s": round(result["train_time_s"] / result["steps"], 6),
        "saves": stats["saves"] if stats else 0,
        "bytes": stats["bytes"] if stats else 0,
        "blocking_s_per_save": stats["blocking_s_per_save"] if stats else None,
        "exchange_s_per_save": stats["exchange_s_per_save"] if stats else None,
        "copy_s_per_save": stats["copy_s_per_save"] if stats else None,
        "write_s_per_save": stats["write_s_per_save"] if stats else None,
        "cost_per_step_pct": round(100.0 * blocking / (result["steps"] * step_s), 3),
    }


def table(recovery: list[dict], cost: list[dict], note: str) -> str:
    lines = ["recovery: a worker on host1 killed (SIGKILL) after step K, checkpoints kept 2",
             f"{'every':>5} {'killed after':>12} {'resumed from':>12} {'steps lost':>10} "
             f"{'kill->first step s':>18} {'of which load s':>15} {'step s':>7}"]
    for r in recovery:
        lines.append(f"{r['checkpoint_every_steps']:>5} {r['killed_after_step']:>12} "
                     f"{r['resumed_from_step']:>12} {r['steps_lost']:>10} "
                     f"{r['kill_to_first_step_s']:>18.2f} {r['checkpoint_load_s'] or 0:>15.2f} "
                     f"{r['step_time_s']:>7.3f}")
    lines += ["", "cost of checkpointing every 10 steps (keeper's blocking time over the steps "
              "taken, as a share of the median step)",
              f"{'variant':<12} {'saves':>5} {'MB':>6} {'blocking s/save':>15} "
              f"{'write s/save':>12} {'median step s':>13} {'wall s/step':>11} "
              f"{'cost/step':>9}"]
    for c in cost:
        mb = c["bytes"] / 1e6 if c["bytes"] else 0
        lines.append(f"{c['variant']:<12} {c['saves']:>5} {mb:>6.1f} "
                     f"{c['blocking_s_per_save'] or 0:>15.4f} {c['write_s_per_save'] or 0:>12.4f} "
                     f"{c['median_step_s']:>13.4f} {c['wall_per_step_s']:>11.4f} "
                     f"{c['cost_per_step_pct']:>8.2f}%")
    lines += ["", note]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="steps of the recovery runs")
    p.add_argument("--kill-at", type=int, default=75,
                   help="kill host1's worker once it has done this many steps")
    p.add_argument("--cost-steps", type=int, default=120, help="steps of the cost runs")
    p.add_argument("--intervals", type=int, nargs="+", default=[10, 50])
    p.add_argument("--out", default=str(REPO / "benchmarks/results/recovery.json"))
    args = p.parse_args()

    recovery, cost = [], []
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        runs, logs = Path(tmp) / "runs", Path(tmp)
        lab = Lab.create(Path(tmp) / "lab", 2)
        try:
            port = 29900
            for interval in args.intervals:
                port += 1
                row = recovery_row(lab, interval, args.steps, args.kill_at, runs, port, logs)
                recovery.append(row)
                print(f"  every {interval}: {row['kill_to_first_step_s']}s from the kill to "
                      f"the first resumed step, {row['steps_lost']} step(s) lost",
                      file=sys.stderr, flush=True)
            for name, checkpoint in (("none", None),
                                     ("async-10", {"every_steps": 10, "asynchronous": True}),
                                     ("sync-10", {"every_steps": 10, "asynchronous": False})):
                port += 1
                row = cost_row(lab, name, args.cost_steps, checkpoint, runs, port, logs)
                cost.append(row)
                print(f"  {name}: {row['cost_per_step_pct']}% per step", file=sys.stderr,
                      flush=True)
        finally:
            lab.destroy()
    note = (f"2 lab hosts x 1 rank, gloo on CPU ({os.cpu_count()} cores), load average at the "
            f"end {os.getloadavg()[0]:.1f}: the machine is shared with other work, so wall "
            "times carry its noise; the trainer's own blocking-time figure does not depend on "
            "a comparison between runs.")
    text = table(recovery, cost, note)
    print(text, end="")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"recovery": recovery, "cost": cost, "note": note,
                               "model": "vit_tiny (12 blocks, width 192, 5.3 M params), digits "
                                        "8x8, patch 4, batch 32 per rank, 2 lab hosts x 1 rank",
                               "kill_at_step": args.kill_at}, indent=2) + "\n")
    out.with_suffix(".txt").write_text(text)
    print(f"wrote {out} and {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
