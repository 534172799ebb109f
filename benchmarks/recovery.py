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
                 Beside the blocking time's parts (the exchange, the copy at the save, the wait
                 at the next optimizer.step) and the writer thread's (the deferred copy, the
                 write), the whole cost within each run: the keeper's steps the writer
                 overlapped, the save included, against its other steps (on a machine without
                 a spare core the writer's CPU time comes out of training).

    machine-loss the head host (host0) taken away as a machine goes (its link cut first, then
                 everything on it, its disk too) once it has trained past step K, with the
                 checkpoints mirrored to a folder the hosts share and `--recover`: a fresh lab
                 host replaces it (launch check, the collective gate), the run resumes from
                 the mirror's newest checkpoint. Measured: seconds from the loss to the first
                 resumed step (the benchmark's clock: the loss, and the first step line of the
                 resumed attempt), split into noticing (the hang watch's look unanswered,
                 the fleet asked), the recovery (the failed attempt's end beside the
                 replacement, its check, then the gate), and restarting (preflight, the
                 restore from the mirror, rendezvous, loading); and the steps done again. Once
                 without `--gate` and once with it (the gate then runs at the start and over
                 the replacement: `--gate no yes`), each `--repeat N` times (a median row per
                 case); `--logs DIR` keeps each run's log, every line with its second.
    mirror cost  the cost runs' async-10 again with `checkpoint.mirror` (the shared folder):
                 seconds each upload took (the watcher's own figure, in its process at nice
                 10, overlapping training), and what it cost training: the median step and
                 wall time per step against async-10 without a mirror, per checkpoint as a
                 share of one step.

Model: the demo's ViT-Tiny (12 blocks, width 192, 5.3 M parameters; a checkpoint with AdamW's
moments is ~64 MB), digits 8x8, batch 32 per rank, 2 hosts x 1 rank on CPU (gloo).

Needs root. Prints a table, writes benchmarks/results/recovery.json and recovery.txt. `--cases`
runs some of the cases; the others keep their last results (with their own notes).

    .venv/bin/python benchmarks/recovery.py [--kill-at 75] [--steps 150] [--cost-steps 120]
        [--cases recovery cost machine-loss] [--gate no yes] [--repeat 1] [--logs DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.backends.ssh.backend import SshBackend  # noqa: E402
from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.cluster.ssh import SshOptions  # noqa: E402
from launcher.core.errors import RunFailed  # noqa: E402
from launcher.job.request import Recover, RunRequest  # noqa: E402
from launcher.pipeline.run import run_here  # noqa: E402
from launcher.job.recipe import recipe_from_mapping  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402
from launcher.report.display import PlainDisplay  # noqa: E402
from launch_node.heartbeat import heartbeat_path, read_heartbeat  # noqa: E402


def recipe(name: str, steps: int, checkpoint: dict | None, restarts: int = 0,
           log_every: int = 10):
    base = yaml.safe_load((REPO / "launcher/recipes/vit-tiny-local.yml").read_text())
    base["name"] = name
    base["train"].pop("epochs")
    base["train"].update(steps=steps, log_every=log_every)
    base["rendezvous"]["timeout"] = 120
    base["restarts"] = restarts
    if checkpoint:
        base["checkpoint"] = checkpoint
    return recipe_from_mapping(base, f"benchmarks/recovery.py:{name}")


class TimedDisplay(PlainDisplay):
    """Lines to a log file, and the times every line of each kind arrived."""

    def __init__(self, stream, marks: tuple[str, ...]):
        super().__init__(stream)
        self.marks = marks
        self.times: dict[str, list[float]] = {mark: [] for mark in marks}

    def line(self, node: str, rank: str, text: str) -> None:
        now = time.monotonic()
        for mark in self.marks:
            if mark in text:
                self.times[mark].append(now)
        super().line(node, rank, text)

    def last_between(self, mark: str, after: float, before: float) -> float | None:
        """When the last line of `mark` in (after, before] arrived (every rank's, say)."""
        inside = [t for t in self.times[mark] if after < t <= before]
        return max(inside) if inside else None


# A restart's milestones, in order, as the lines that mark them (the last rank's line counts):
# torchrun's agent saw its worker die; the new workers started (launch_node/worker.py, before they
# import torch); their process group formed (train/main.py); the keeper built the data, model
# and DDP and loaded the checkpoint; the first step since the restart ended.
RESTART_MARKS = (("detect", "failed (exitcode:"),
                 ("stop + agents' rendezvous", "launch: worker rank"),
                 ("worker start + process group", ": backend "),
                 ("data, model, DDP + checkpoint load", "resumed from checkpoint step"),
                 ("first step", "first step since the restart"))


def restart_split(display: TimedDisplay, killed_at: float) -> dict[str, float] | None:
    """Seconds of each part of the kill -> first step, each from the previous milestone."""
    end = display.last_between(RESTART_MARKS[-1][1], killed_at, float("inf"))
    if end is None:
        return None
    out, before = {}, killed_at
    for name, mark in RESTART_MARKS:
        t = display.last_between(mark, before, end)
        if t is None:
            return None
        out[name] = round(t - before, 3)
        before = t
    return out


def launch(lab: Lab, rec, run_id: str, runs: Path, port: int, display) -> dict:
    try:
        with redirect_stdout(io.StringIO()):  # the run report; kept in the run folder
            return run_here(SshBackend(lab.inventory, SshOptions()),
                            RunRequest(rec, run_id, len(load_inventory(lab.inventory)),
                                       runs_dir=str(runs), rdzv_port=port), display=display)
    except RunFailed as err:
        raise SystemExit(f"{run_id} failed:\n{err}") from None


def killer(lab: Lab, run_id: str, kill_at: int, out: dict) -> threading.Thread:
    """Kills host1's rank once its heartbeat shows step >= kill_at (a process of this run:
    its environment carries the run id)."""
    def watch():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            # The node's folder is named by the run's uid (launcher/backends/ssh/backend.py).
            found = sorted((lab.dir / "node-runs").glob(f"{run_id}.*/host1"))
            record = read_heartbeat(heartbeat_path(found[0], 0)) if found else None
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
                           tuple(mark for _, mark in RESTART_MARKS))
    killed: dict = {}
    thread = killer(lab, run_id, kill_at, killed)
    summary = launch(lab, rec, run_id, runs, port, display)
    thread.join(timeout=1)
    (restart,) = summary["restarts"]
    killed_at = killed.get("killed_at")
    first = None if killed_at is None else display.last_between(
        RESTART_MARKS[-1][1], killed_at, float("inf"))
    return {
        "checkpoint_every_steps": interval,
        "killed_after_step": killed.get("killed_after_step"),
        "resumed_from_step": restart["resumed_from_step"],
        "steps_lost": restart["steps_lost"],
        "kill_to_first_step_s": None if first is None or "killed_at" not in killed
        else round(first - killed["killed_at"], 3),
        "split_s": None if killed_at is None else restart_split(display, killed_at),
        "launch_saw_failure_to_first_step_s": restart["recovered_in_s"],
        "checkpoint_load_s": restart["checkpoint_load_s"],
        **trainer_facts(summary, runs / run_id),
    }


def trainer_facts(summary: dict, folder: Path) -> dict:
    """The median step and the accuracy, from rank 0's result.json (the summary keeps only
    some of the trainer's facts)."""
    result = json.loads((folder / summary["rank0_node"] / "result.json").read_text())
    return {"step_time_s": result["step_time_s"], "accuracy": result["eval_accuracy"]}


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
        "fence_s_per_save": stats["fence_s_per_save"] if stats else None,
        "deferred_copy_s_per_save": stats["deferred_copy_s_per_save"] if stats else None,
        "write_s_per_save": stats["write_s_per_save"] if stats else None,
        "cost_per_step_pct": round(100.0 * blocking / (result["steps"] * step_s), 3),
        # Within the run: the steps the writer thread overlapped against the others (each
        # from one step's end to the next on the keeper, the save included).
        "steps_while_writing": stats["steps_while_writing"] if stats else 0,
        "step_s_while_writing": stats["step_s_while_writing"] if stats else None,
        "step_s_otherwise": stats["step_s_otherwise"] if stats else None,
        "whole_cost_s_per_save": stats["cost_s_per_save"] if stats else None,
        "whole_cost_per_step_pct": round(
            100.0 * stats["cost_s_per_save"] * stats["saves"]
            / (result["steps"] * stats["step_s_otherwise"]), 3) if stats else 0.0,
    }


class Clocked(io.TextIOBase):
    """A log whose every line starts with the seconds since `zero` (time.monotonic()), so that
    the machine-loss log shows where each second between the loss and the first resumed step
    went: launch's messages, its `recover:` lines on stderr and the nodes' lines, in order."""

    def __init__(self, stream, zero: float):
        self.stream, self.zero, self.lock, self.at_start = stream, zero, threading.Lock(), True

    def write(self, text: str) -> int:
        with self.lock:
            for part in text.splitlines(keepends=True):
                if self.at_start:
                    self.stream.write(f"{time.monotonic() - self.zero:9.3f} ")
                self.stream.write(part)
                self.at_start = part.endswith("\n")
            self.stream.flush()
        return len(text)


class LossDisplay(PlainDisplay):
    """Lines to a log file; the steps each attempt reached and when the resumed one began."""

    STEP = re.compile(r"^step (\d+)/\d+ ")

    def __init__(self, stream):
        super().__init__(stream)
        self.reached = 0
        self.attempts: list[float] = []       # when each attempt's run began
        self.resumed_at: float | None = None  # the trainer's "resumed from checkpoint" line
        self.first_step_at: float | None = None

    def line(self, node: str, rank: str, text: str) -> None:
        now = time.monotonic()
        match = self.STEP.match(text)
        if match and len(self.attempts) == 1:
            self.reached = max(self.reached, int(match.group(1)))
        if text.startswith("resumed from checkpoint step") and len(self.attempts) > 1:
            self.resumed_at = self.resumed_at or now
        if match and self.resumed_at is not None:
            self.first_step_at = self.first_step_at or now
        super().line(node, rank, text)

    def message(self, text: str) -> None:
        if text.startswith("run ") and " node(s), " in text:
            self.attempts.append(time.monotonic())
        super().message(text)


def machine_loss_row(lab: Lab, interval: int, steps: int, lose_at: int, runs: Path, port: int,
                     logs: Path, gate: bool = False, repeat: int = 0) -> dict:
    run_id = f"lose-head-every-{interval}" + ("-gated" if gate else "") + \
        (f"-{repeat + 1}" if repeat else "")
    head = lab.hosts[0].name
    mirror_dir = lab.dir / "mirror"
    rec = recipe(run_id, steps, {"every_steps": interval, "keep": 2, "mirror": str(mirror_dir)},
                 log_every=1)
    log = Clocked(open(logs / f"{run_id}.log", "w"), time.monotonic())  # noqa: SIM115
    display = LossDisplay(log)
    lost: dict = {}

    def loser():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if display.reached >= lose_at:
                lost["at"], lost["wall"] = time.monotonic(), time.time()
                log.write(f"--- {head} lost\n")
                lab.lose(head)
                # Its disk goes with it: the head's checkpoints are only in the mirror now.
                for folder in (lab.dir / "node-runs").glob(f"{run_id}.*/{head}"):
                    shutil.rmtree(folder, ignore_errors=True)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=loser, daemon=True)
    thread.start()
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(log):
            summary = run_here(SshBackend(lab.inventory, SshOptions()),
                               RunRequest(rec, run_id, len(load_inventory(lab.inventory)),
                                          runs_dir=str(runs), rdzv_port=port,
                                          recover=Recover(1, 900), gate=gate),
                               display=display)
    except RunFailed as err:
        raise SystemExit(f"{run_id} failed:\n{err}") from None
    thread.join(timeout=1)
    (recovery,) = summary["recoveries"]
    noticed = datetime.fromisoformat(recovery["detected_at"]).timestamp() - lost["wall"]
    back = display.first_step_at - lost["at"]
    return {
        "checkpoint_every_steps": interval,
        "gate": gate,   # `--gate`: the run gates at its start, and so after a replacement
        "repeat": repeat + 1,
        "lost": f"{head} (the head)",
        "lost_after_step": display.reached,
        "resumed_from_step": recovery["resumed_from_step"],
        "steps_lost": display.reached - recovery["resumed_from_step"],
        "loss_to_first_step_s": round(back, 3),
        # The loss noticed: the hang watch's look unanswered, the fleet asked. (Rows before
        # 2026-12-04 measured to the attempt's end, its nodes stopped and files fetched, as
        # `notice_and_stop_s`: the replacement began only then.)
        "noticed_s": round(noticed, 3),
        # From then to the restart: the attempt stopped, its files fetched, its summary and
        # report written, while the replacement is made, set up and checked (begun at once,
        # launcher/pipeline/recover.py Replacements); then the gate when the run gates.
        "recovery_s": recovery["recovered_in_s"],
        "replace_s": recovery["replace_s"], "setup_s": recovery["setup_s"],
        "check_s": recovery["checked_s"], "gate_s": recovery["gate_s"],
        # Preflight (code shipped, nodes checked), the restore from the mirror, rendezvous,
        # the checkpoint loaded, the first step.
        "restart_s": round(back - noticed - recovery["recovered_in_s"], 3),
        "relaunch_to_resumed_line_s": round(display.resumed_at - display.attempts[1], 3),
        "replacement": recovery["replacement"],
        **trainer_facts(summary, runs / run_id),
    }


class UploadDisplay(PlainDisplay):
    """Each step line's arrival and duration, and each upload's end and duration (the
    watcher's "after X s"), on this process's clock: steps and uploads line up in one run."""

    STEP = re.compile(r"^step (\d+)/\d+ .* step_time ([0-9.]+)s ")
    UPLOAD = re.compile(r"^mirror: (step-\d+) \(.*\) in .* after ([0-9.]+)s$")

    def __init__(self, stream):
        super().__init__(stream)
        self.steps: list[tuple[int, float, float]] = []    # (step, started, ended)
        self.uploads: list[tuple[str, float, float]] = []  # (unit, started, ended)

    def line(self, node: str, rank: str, text: str) -> None:
        now = time.monotonic()
        step, upload = self.STEP.match(text), self.UPLOAD.match(text)
        if step:
            self.steps.append((int(step.group(1)), now - float(step.group(2)), now))
        if upload:
            self.uploads.append((upload.group(1), now - float(upload.group(2)), now))
        super().line(node, rank, text)


def mirror_cost_row(lab: Lab, steps: int, interval: int, runs: Path, port: int,
                    logs: Path) -> dict:
    """The mirror's cost within one run: steps that overlapped an upload against the others
    of the same run (a comparison between runs carried more of the shared machine's noise
    than the uploads cost). The steps right after a checkpoint are left out of both: the
    trainer's own writer runs then, whatever the mirror does."""
    run_id = "cost-async-mirror"
    rec = recipe(run_id, steps, {"every_steps": interval, "asynchronous": True,
                                 "mirror": str(lab.dir / "mirror-cost")}, log_every=1)
    display = UploadDisplay(open(logs / f"{run_id}.log", "w"))  # noqa: SIM115
    summary = launch(lab, rec, run_id, runs, port, display)
    warm = 5
    usable = [(n, a, b) for n, a, b in display.steps
              if n > warm and n % interval not in (1, 2)]
    during = [u for u in display.uploads if u[1] < display.steps[-1][2]]

    def overlaps(a: float, b: float) -> bool:
        return any(a < end and start < b for _, start, end in during)

    busy = [b - a for _, a, b in usable if overlaps(a, b)]
    quiet = sorted(b - a for _, a, b in usable if not overlaps(a, b))
    base = quiet[len(quiet) // 2]
    # For scale: the trainer's own writer thread (the two steps after each checkpoint, not
    # overlapping an upload), which the blocking-time figure of the cost table leaves out.
    writing = [b - a for n, a, b in display.steps
               if n > warm and n % interval in (1, 2) and not overlaps(a, b)]
    saves = max(1, len([n for n, _, _ in display.steps if n > warm and n % interval == 0]))
    mirror = summary["mirror"]
    return {
        "checkpoint_every_steps": interval, "steps": len(display.steps),
        "uploads": mirror["units"], "uploads_during_training": len(during),
        "bytes_per_upload": mirror["bytes"] // max(1, mirror["units"]),
        "upload_s_per_checkpoint": mirror["upload_s_per_unit"],
        "median_step_s": round(base, 6),
        "upload_in_steps": round(mirror["upload_s_per_unit"] / base, 3),
        "steps_overlapping_uploads": len(busy),
        "overlapping_step_ratio": round(sum(busy) / len(busy) / base, 4) if busy else None,
        "cost_per_checkpoint_share_of_step": round(
            sum(b - base for b in busy) / base / max(1, len(during)), 4),
        "writer_cost_per_checkpoint_share_of_step": round(
            sum(b - base for b in writing) / base / saves, 4),
    }


def recovery_table(recovery: list[dict]) -> list[str]:
    lines = ["recovery: a worker on host1 killed (SIGKILL) after step K, checkpoints kept 2",
             f"{'every':>5} {'killed after':>12} {'resumed from':>12} {'steps lost':>10} "
             f"{'kill->first step s':>18} {'of which load s':>15} {'step s':>7}"]
    for r in recovery:
        lines.append(f"{r['checkpoint_every_steps']:>5} {r['killed_after_step']:>12} "
                     f"{r['resumed_from_step']:>12} {r['steps_lost']:>10} "
                     f"{r['kill_to_first_step_s']:>18.2f} {r['checkpoint_load_s'] or 0:>15.2f} "
                     f"{r['step_time_s']:>7.3f}")
    split = [r for r in recovery if r.get("split_s")]
    if split:
        lines += ["", "its split (s, each from the previous line's mark; the last rank's line)",
                  f"{'every':>5} " + " ".join(f"{name:>{max(10, len(name))}}"
                                              for name, _ in RESTART_MARKS)]
        for r in split:
            lines.append(f"{r['checkpoint_every_steps']:>5} " + " ".join(
                f"{r['split_s'][name]:>{max(10, len(name))}.2f}" for name, _ in RESTART_MARKS))
    return lines


def cost_table(cost: list[dict]) -> list[str]:
    lines = ["cost of checkpointing every 10 steps (keeper's blocking time over the steps "
             "taken, as a share of the median step)",
             f"{'variant':<15} {'saves':>5} {'MB':>6} {'blocking s/save':>15} "
             f"{'write s/save':>12} {'median step s':>13} {'wall s/step':>11} "
             f"{'cost/step':>9}"]
    for c in cost:
        mb = c["bytes"] / 1e6 if c["bytes"] else 0
        lines.append(f"{c['variant']:<15} {c['saves']:>5} {mb:>6.1f} "
                     f"{c['blocking_s_per_save'] or 0:>15.4f} {c['write_s_per_save'] or 0:>12.4f} "
                     f"{c['median_step_s']:>13.4f} {c['wall_per_step_s']:>11.4f} "
                     f"{c['cost_per_step_pct']:>8.2f}%")
    saving = [c for c in cost if c["saves"]]
    if saving and all(c.get("fence_s_per_save") is not None for c in saving):
        lines += ["", "a save's blocking time (ms; the ranks' exchange, the copy at the save "
                      "with the wait for the previous write, the wait at the next "
                      "optimizer.step) and the writer thread's (ms)",
                  f"{'variant':<15} {'exchange':>8} {'copy':>6} {'fence':>6} "
                  f"{'= blocking':>10} {'deferred copy':>13} {'write':>7}"]
        for c in saving:
            lines.append(f"{c['variant']:<15} {1e3 * c['exchange_s_per_save']:>8.2f} "
                         f"{1e3 * c['copy_s_per_save']:>6.2f} {1e3 * c['fence_s_per_save']:>6.2f} "
                         f"{1e3 * c['blocking_s_per_save']:>10.2f} "
                         f"{1e3 * c['deferred_copy_s_per_save']:>13.2f} "
                         f"{1e3 * c['write_s_per_save']:>7.2f}")
        lines += ["", "within each run, the keeper's steps the writer overlapped (the save "
                      "included) against its other steps: the whole cost, the writer's CPU "
                      "time taken from training included",
                  f"{'variant':<15} {'steps':>5} {'their median s':>14} {'others s':>9} "
                  f"{'cost s/save':>11} {'whole cost/step':>15}"]
        for c in saving:
            lines.append(f"{c['variant']:<15} {c['steps_while_writing']:>5} "
                         f"{c['step_s_while_writing']:>14.4f} {c['step_s_otherwise']:>9.4f} "
                         f"{c['whole_cost_s_per_save']:>11.4f} "
                         f"{c['whole_cost_per_step_pct']:>14.2f}%")
    return lines


def loss_table(loss: list[dict], mirror: dict | None) -> list[str]:
    lines = ["machine loss: the head taken away after step K (its disk too), checkpoints "
             "mirrored to a shared folder, --recover: a fresh lab host replaces it",
             "(noticed: the loss to the fleet's answer; recovery: from there to the restart, "
             "the attempt's end overlapping the replacement; of it: replace+check+gate)",
             f"{'every':>5} {'gate':>4} {'lost after':>10} {'resumed from':>12} "
             f"{'steps lost':>10} {'loss->first step s':>18} {'noticed s':>9} "
             f"{'recovery s':>10} {'of it: r+c+g s':>14} {'restart s':>9}"]

    def figures(r: dict) -> tuple[float, ...]:
        return (r["loss_to_first_step_s"], r["noticed_s"], r["recovery_s"],
                r["replace_s"] + r["setup_s"] + r["check_s"] + (r["gate_s"] or 0.0),
                r["restart_s"])

    def row(first: str, values: tuple[float, ...]) -> str:
        back, noticed, recovery, parts, restart = values
        return (f"{first} {back:>18.2f} {noticed:>9.2f} {recovery:>10.2f} {parts:>14.2f} "
                f"{restart:>9.2f}")

    for r in loss:
        lines.append(row(f"{r['checkpoint_every_steps']:>5} {'yes' if r.get('gate') else 'no':>4} "
                         f"{r['lost_after_step']:>10} {r['resumed_from_step']:>12} "
                         f"{r['steps_lost']:>10}", figures(r)))
    cases: dict[tuple, list[dict]] = {}
    for r in loss:
        cases.setdefault((r["checkpoint_every_steps"], bool(r.get("gate"))), []).append(r)
    for (every, gate), rows in cases.items():
        if len(rows) > 1:
            medians = tuple(statistics.median(values)
                            for values in zip(*(figures(r) for r in rows)))
            lines.append(row(f"{every:>5} {'yes' if gate else 'no':>4} "
                             f"{f'median of {len(rows)}':>34}", medians))
    if mirror is not None:
        lines += ["", f"mirror cost within one run (checkpoint every {mirror['checkpoint_every_steps']} "
                      "steps to a shared folder; steps overlapping an upload against the others)",
                  f"  {mirror['uploads']} uploads of {mirror['bytes_per_upload'] / 1e6:.1f} MB, "
                  f"{mirror['upload_s_per_checkpoint']:.3f} s each "
                  f"({mirror['upload_in_steps']:.2f} steps' time, in its own process at nice 10)",
                  f"  {mirror['steps_overlapping_uploads']} steps overlapped an upload, each "
                  f"x{mirror['overlapping_step_ratio']} of the median step "
                  f"{mirror['median_step_s']:.4f} s: "
                  f"{100 * mirror['cost_per_checkpoint_share_of_step']:.1f}% of a step per "
                  "checkpoint",
                  "  for scale, the trainer's own writer thread in the same run (the 2 steps "
                  "after each checkpoint): "
                  f"{100 * mirror['writer_cost_per_checkpoint_share_of_step']:.1f}% of a step "
                  "per checkpoint"]
    return lines


def load_previous(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="steps of the recovery runs")
    p.add_argument("--kill-at", type=int, default=75,
                   help="kill host1's worker (take host0 away) once it has done this many steps")
    p.add_argument("--cost-steps", type=int, default=120, help="steps of the cost runs")
    p.add_argument("--intervals", type=int, nargs="+", default=[10, 50])
    p.add_argument("--cases", nargs="+", default=["recovery", "cost", "machine-loss"],
                   choices=["recovery", "cost", "machine-loss"])
    p.add_argument("--gate", nargs="+", default=["no", "yes"], choices=["no", "yes"],
                   help="machine loss: runs without and with `--gate` (which also gates the "
                        "replacement)")
    p.add_argument("--repeat", type=int, default=1,
                   help="machine loss: each case this many times (the table adds their "
                        "median: one run's wall times carry the machine's noise)")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/recovery.json"))
    p.add_argument("--logs", help="keep each run's log here (machine loss: every line with "
                                  "its second); default: removed with the lab")
    args = p.parse_args()

    out = Path(args.out)
    data = load_previous(out)
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        runs, logs = Path(tmp) / "runs", Path(args.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        lab = Lab.create(Path(tmp) / "lab", 2)
        note = ""
        try:
            port = 29900
            if "recovery" in args.cases:
                recovery = []
                for interval in args.intervals:
                    port += 1
                    row = recovery_row(lab, interval, args.steps, args.kill_at, runs, port, logs)
                    recovery.append(row)
                    print(f"  every {interval}: {row['kill_to_first_step_s']}s from the kill "
                          f"to the first resumed step, {row['steps_lost']} step(s) lost",
                          file=sys.stderr, flush=True)
                data["recovery"] = recovery
            if "cost" in args.cases:
                cost = []
                for name, checkpoint in (("none", None),
                                         ("async-10", {"every_steps": 10,
                                                       "asynchronous": True}),
                                         ("sync-10", {"every_steps": 10,
                                                      "asynchronous": False})):
                    port += 1
                    row = cost_row(lab, name, args.cost_steps, checkpoint, runs, port, logs)
                    cost.append(row)
                    print(f"  {name}: {row['cost_per_step_pct']}% per step", file=sys.stderr,
                          flush=True)
                data["cost"] = cost
            if "machine-loss" in args.cases:
                port += 1
                data["mirror_cost"] = mirror_cost_row(lab, args.cost_steps, 10, runs, port,
                                                      logs)
                print(f"  mirror: {data['mirror_cost']['cost_per_checkpoint_share_of_step']} "
                      "of a step per checkpoint", file=sys.stderr, flush=True)
            if "machine-loss" in args.cases:
                loss = []
                for interval, gate, repeat in ((i, g == "yes", k) for i in args.intervals
                                               for g in args.gate
                                               for k in range(args.repeat)):
                    port += 1
                    # Each case loses the head anew: the lab's head is the replacement now.
                    row = machine_loss_row(lab, interval, args.steps, args.kill_at, runs,
                                           port, logs, gate, repeat)
                    loss.append(row)
                    print(f"  machine loss, every {interval}, gate {'yes' if gate else 'no'}"
                          f"{f', run {repeat + 1}' if args.repeat > 1 else ''}: "
                          f"{row['loss_to_first_step_s']}s "
                          f"from the loss to the first resumed step, {row['steps_lost']} "
                          "step(s) lost", file=sys.stderr, flush=True)
                    lab = Lab.load(lab.dir)   # the replacement is the head now
                data["machine_loss"] = loss
        finally:
            lab.destroy()
        note = (f"2 lab hosts x 1 rank, gloo on CPU ({os.cpu_count()} cores), load average at "
                f"the end {os.getloadavg()[0]:.1f}: the machine is shared with other work, so "
                "wall times carry its noise; the trainer's own blocking-time figure does not "
                "depend on a comparison between runs.")
    for case in args.cases:
        data.setdefault("notes", {})[case] = note
    data["model"] = ("vit_tiny (12 blocks, width 192, 5.3 M params), digits 8x8, patch 4, "
                     "batch 32 per rank, 2 lab hosts x 1 rank")
    data["kill_at_step"] = args.kill_at
    data.pop("note", None)
    # The measurements first: a table that cannot be drawn must not lose minutes of runs.
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    lines = []
    if data.get("recovery"):
        lines += recovery_table(data["recovery"]) + [""]
    if data.get("cost"):
        lines += cost_table(data["cost"]) + [""]
    if data.get("machine_loss"):
        lines += loss_table(data["machine_loss"], data.get("mirror_cost")) + [""]
    lines += [f"{case}: {text}" for case, text in data.get("notes", {}).items()]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out.with_suffix(".txt").write_text(text)
    print(f"wrote {out} and {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
