"""Entry point torchrun starts on every rank: `python train/main.py --model vit_tiny ...`.

Rank 0 prints progress lines (parsed by `launch` for its progress display), appends one JSON
object per logged step to OUT_DIR/metrics.jsonl and writes OUT_DIR/result.json at the end.
Every rank keeps a heartbeat file (launch_node/heartbeat.py); with a `checkpoint:` block the run
saves its state on schedule and, when started again (a restart, `launch run --resume`),
continues from the latest checkpoint (train/checkpoint.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

# Run as a script (torchrun's entrypoint): make `train.*` importable from the shipped folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from train.autocomm import AutoCompression, BucketChoice, decide_bucket_cap_mb  # noqa: E402
from train.checkpoint import Checkpointer, CheckpointPolicy, signature_of  # noqa: E402
from train.commtime import CommTimer, InterfaceCounter  # noqa: E402
from train.data import DataSplits, ResumableSampler, load_dataset  # noqa: E402
from train.ddp import AUTO, DDPSettings, wrap_ddp  # noqa: E402
from launch_node.heartbeat import Heartbeat  # noqa: E402
from launch_node.worker import die_with_parent  # noqa: E402
from train.model import build_vit, count_parameters  # noqa: E402
from train.options import add_options, lr_warmup_steps  # noqa: E402
from train.stepsplit import split  # noqa: E402
from train.stragglers import StragglerWatch  # noqa: E402
from train.trial import trial_round  # noqa: E402

WARMUP_STEPS_EXCLUDED = 3  # first steps pay for allocation and bucket rebuilds; not throughput


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options declared in train/options.py (what a recipe's train/ddp blocks hold, and
    what launch passes), plus where to write and which backend to use."""
    p = argparse.ArgumentParser(description=__doc__)
    add_options(p)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--out-dir", default=".", help="where rank 0 writes metrics and results")
    args = p.parse_args(argv)
    if args.steps is not None and args.epochs is not None:
        p.error("give --steps or --epochs, not both")
    if args.steps is None and args.epochs is None:
        args.epochs = 1.0
    return args


def lr_at(step: int, total: int, warmup: int, base: float) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def evaluate(model, held_out, batch_size: int, device, rank: int, world: int, autocast):
    """Exact accuracy: every held-out image is scored once (rank r takes r, r+world, ...)."""
    shard = Subset(held_out, list(range(rank, len(held_out), world)))
    correct = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    with torch.no_grad():
        for images, labels in DataLoader(shard, batch_size=batch_size):
            images, labels = images.to(device), labels.to(device)
            with autocast():
                logits = model(images)
            correct[0] += (logits.argmax(1) == labels).sum()
            correct[1] += labels.numel()
    dist.all_reduce(correct)
    return (correct[0] / correct[1]).item() if correct[1] > 0 else None


def init_distributed(backend: str, timeout_s: float | None = None
                     ) -> tuple[str, torch.device, int]:
    """Joins the process group torchrun set up: NCCL on this rank's GPU, else gloo on CPU
    (`auto`). Returns the backend, the device and the local rank. `timeout_s` bounds every
    collective (torch's default is 30 minutes; the collective gate wants a hang to be an
    answer)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if timeout_s is None:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return backend, device, local_rank


@dataclass
class Training:
    """Everything one rank holds while it trains; built by `setup`, advanced by `train_step`."""

    args: argparse.Namespace
    backend: str
    device: torch.device
    rank: int
    world: int
    local_rank: int
    data: DataSplits
    ddp: DDP
    hook_state: Any
    settings: DDPSettings
    buckets: BucketChoice | None      # bucket_cap_mb: auto's measurement
    comm: CommTimer
    auto: AutoCompression | None
    sent: InterfaceCounter
    optimizer: torch.optim.Optimizer
    sampler: ResumableSampler
    loader: DataLoader
    steps_per_epoch: int
    total: int
    warmup: int
    images_per_step: int
    out_dir: Path
    heartbeat: Heartbeat
    checkpoints: Checkpointer | None = None
    metrics_file: Any = None          # rank 0 only
    step: int = 0
    epoch: int = 0                    # epochs started (0-based index of the current one)
    resume_offset: int = 0            # steps of the current epoch a checkpoint had taken
    resumed_from: int | None = None   # the checkpoint's step, when this process resumed
    restarted: bool = False           # an earlier process of this run trained here before
    step_times: list[float] = field(default_factory=list)
    last_loss: float = float("nan")
    window: Window | None = None      # the steps since the last progress line (rank 0 logs)
    started: float = 0.0
    watch: StragglerWatch | None = None   # every rank's own compute, for stragglers

    @property
    def epochs_total(self) -> int:
        return math.ceil(self.total / self.steps_per_epoch)

    def autocast(self):
        if self.args.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()


def choose_buckets(args, model, device, rank: int) -> BucketChoice | None:
    """`bucket_cap_mb: auto`: measure the link until clear, pick the size
    (train/autocomm.py)."""
    if args.bucket_cap_mb != AUTO:
        return None
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Sized for PowerSGD where it may run (train/autocomm.py choose_bucket_cap_mb).
    compressing = args.comm_hook in ("powersgd", AUTO)
    choice = decide_bucket_cap_mb(device, gradient_bytes, compressing=compressing)
    args.bucket_cap_mb = choice.bucket_cap_mb
    if rank == 0:
        link = choice.probe
        rounds = ", ".join(f"{r:g}" for r in choice.rounds)
        verdict = (f"-> {choice.bucket_cap_mb:g} MiB buckets" if choice.choice == "decided"
                   else f"undecided, DDP's default {choice.bucket_cap_mb:g} MiB kept")
        print(f"bucket_cap_mb auto: {gradient_bytes / 2**20:.1f} MiB of gradients; "
              f"{len(choice.rounds)} probe round(s) gave {rounds} MiB (last: all-reduce "
              f"latency {link.latency_s * 1e3:.2f} ms, bandwidth "
              f"{link.bandwidth_bytes_per_s / 1e6:.1f} MB/s) {verdict}", flush=True)
    return choice


def setup(args: argparse.Namespace) -> Training:
    """Process group, data, model, DDP with its hook, optimizer and sampler; then the latest
    checkpoint, if there is one."""
    # Before the process group: a rank stuck joining it has a heartbeat to be found by.
    heartbeat = Heartbeat(args.out_dir, warmup_steps=WARMUP_STEPS_EXCLUDED)
    backend, device, local_rank = init_distributed(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} on {socket.gethostname()}: backend {backend}, device {device}",
          flush=True)
    torch.manual_seed(args.seed)
    data = load_dataset(args.dataset, args.image_size)
    model = build_vit(args.model, args.image_size, args.patch_size, data.in_channels,
                      data.num_classes, depth=args.depth, width=args.width,
                      heads=args.heads).to(device)
    buckets = choose_buckets(args, model, device, rank)
    settings = DDPSettings.from_args(args)
    ddp, hook_state = wrap_ddp(model, settings, device)
    sampler = ResumableSampler(data.train, num_replicas=world, rank=rank, shuffle=True,
                               seed=args.seed, drop_last=True)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers)
    steps_per_epoch = len(loader) // args.grad_accum_steps
    if steps_per_epoch == 0:
        raise SystemExit(f"batch_size {args.batch_size} x {world} ranks x grad_accum_steps "
                         f"{args.grad_accum_steps} exceeds the {len(data.train)} training images")
    total = args.steps or max(1, int(round(args.epochs * steps_per_epoch)))
    warmup = lr_warmup_steps(args.warmup_steps, total)
    run = Training(
        args=args, backend=backend, device=device, rank=rank, world=world,
        local_rank=local_rank, data=data, ddp=ddp, hook_state=hook_state, settings=settings,
        buckets=buckets, comm=CommTimer(ddp.module, device),
        auto=AutoCompression(hook_state, total_steps=total, lr_warmup_steps=warmup,
                             start_iter=args.powersgd_start_iter)
        if settings.comm_hook == AUTO else None,
        sent=InterfaceCounter(),
        optimizer=torch.optim.AdamW(ddp.parameters(), lr=args.lr,
                                    weight_decay=args.weight_decay),
        sampler=sampler, loader=loader, steps_per_epoch=steps_per_epoch, total=total,
        warmup=warmup,
        images_per_step=args.batch_size * world * args.grad_accum_steps,
        out_dir=Path(args.out_dir), heartbeat=heartbeat,
    )
    run.watch = StragglerWatch(rank, world, device, local_rank)
    run.checkpoints = Checkpointer(CheckpointPolicy.from_args(args), run.out_dir,
                                   signature_of(args, world), device, rank, world)
    resume(run)
    if rank == 0:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        run.metrics_file = open(run.out_dir / "metrics.jsonl", "a")  # noqa: SIM115
        print(f"model {args.model}: {count_parameters(model) / 1e6:.2f} M parameters, "
              f"{len(data.train)} training images, {total} steps of {run.images_per_step} "
              f"images ({run.epochs_total} epoch(s)); ddp: {settings.describe()}", flush=True)
    return run


def resume(run: Training) -> None:
    """Continue from the latest checkpoint, if checkpoints are on and one exists; the keeper
    says from where and what the restart cost (launch reads the line into summary.json)."""
    meta = run.checkpoints.restore(run) if run.checkpoints.policy.enabled else None
    previous = run.heartbeat.previous_step()
    run.restarted = previous is not None
    if meta is not None:
        run.resumed_from = meta["step"]
    if run.checkpoints.is_keeper and (meta is not None or previous is not None):
        where = (f"resumed from checkpoint step {meta['step']} ({meta['file']}, epoch "
                 f"{meta['epoch'] + 1}, {meta['offset']} step(s) into it, read and shared in "
                 f"{meta['load_s']:.2f}s)" if meta is not None
                 else "no checkpoint to resume from: starting over at step 0")
        lost = "" if previous is None else (
            f"; the previous attempt had reached step {previous}: "
            f"{max(0, previous - run.step)} step(s) lost")
        print(where + lost, flush=True)
    run.heartbeat.beat(run.step, "ready")


def train_step(run: Training, batches) -> float:
    """One optimizer step (with its gradient accumulation); returns the summed loss."""
    args, device, ddp = run.args, run.device, run.ddp
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(run.step, run.total, run.warmup, args.lr)
    run.optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for micro in range(args.grad_accum_steps):
        images, labels = next(batches)
        images, labels = images.to(device), labels.to(device)
        sync = micro == args.grad_accum_steps - 1
        with (nullcontext() if sync else ddp.no_sync()):
            with run.autocast():
                loss = F.cross_entropy(ddp(images), labels) / args.grad_accum_steps
            loss.backward()
        if sync:
            run.comm.backward_done()
        loss_sum += loss.item()
    run.optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return loss_sum


def after_step(run: Training, dt: float) -> None:
    """Bookkeeping every rank does after a step: timings, auto's choice, the wire counter."""
    run.step += 1
    run.step_times.append(dt)
    run.comm.step_done(dt)
    run.heartbeat.step_done(run.step, dt)
    run.watch.step_done(run.step, run.comm.steps[-1], run.last_loss)
    if run.step % run.args.log_every == 0 or run.step == run.total:
        run.watch.end_interval(run.step)   # every rank: one small all_gather; rank 0 judges
    if run.step == max(WARMUP_STEPS_EXCLUDED + (run.resumed_from or 0), run.total // 2):
        # Bytes per step in steady state: after compression warm-up and auto's choice.
        run.sent.mark_start(run.step)
    if len(run.step_times) == 1 and run.restarted and run.checkpoints.is_keeper:
        print(f"step {run.step}: first step since the restart", flush=True)
    elif len(run.step_times) == 1 and run.rank == 0:
        # When training began, for launch's run timeline (launcher/runs/timeline.py).
        print(f"step {run.step}: first step", flush=True)
    if run.checkpoints.policy.enabled and run.checkpoints.due(run.step):
        run.checkpoints.save(run)
    if run.auto:
        say_auto(run, run.auto.after_step(run.step, run.comm.steps[-1], run.device))


def say_auto(run: Training, decision) -> None:
    """Rank 0 logs comm_hook auto's decision (launch's log and the report quote it)."""
    if decision is not None and run.rank == 0:
        print(f"comm_hook auto: {decision.choice} after step {decision.decided_at_step} "
              f"({decision.reason})", flush=True)


class Window:
    """The steps since the last progress line."""

    def __init__(self):
        self.loss = self.time = 0.0
        self.n = 0

    def add(self, loss: float, dt: float) -> None:
        self.loss, self.time, self.n = self.loss + loss, self.time + dt, self.n + 1


def one_step(run: Training, batches) -> float:
    """A training step with everything every step does around it; returns its loss."""
    t0 = time.perf_counter()
    loss = train_step(run, batches)
    dt = time.perf_counter() - t0
    run.last_loss = loss
    after_step(run, dt)
    run.window.add(loss, dt)
    if run.rank == 0 and (run.step % run.args.log_every == 0 or run.step == run.total):
        log_progress(run, run.window)
        run.window = Window()
    return loss


def log_progress(run: Training, window: Window) -> None:
    """Rank 0: one metrics.jsonl record and one progress line (launch parses the line)."""
    record = {
        "step": run.step, "epoch": run.epoch + 1, "loss": round(window.loss / window.n, 6),
        "lr": run.optimizer.param_groups[0]["lr"],
        "step_time_s": round(window.time / window.n, 6),
        "images_per_sec": round(run.images_per_step * window.n / window.time, 3),
        "time_s": round(time.perf_counter() - run.started, 3),
        "split": split(run.comm.steps[-window.n:]),
        **run.watch.interval_record(run.step),
    }
    run.metrics_file.write(json.dumps(record) + "\n")
    run.metrics_file.flush()
    print(f"step {run.step}/{run.total} epoch {run.epoch + 1}/{run.epochs_total} "
          f"loss {record['loss']:.4f} lr {record['lr']:.2e} "
          f"step_time {record['step_time_s']:.3f}s {record['images_per_sec']:.1f} img/s, "
          f"waiting on communication {record['split']['comm_share']:.0%}", flush=True)


def train(run: Training) -> None:
    run.started = time.perf_counter()
    run.ddp.train()
    run.window = Window()
    while run.step < run.total:
        # A resumed run starts its first epoch where its checkpoint left it.
        skip, run.resume_offset = run.resume_offset, 0
        run.sampler.start_at(run.epoch, skip * run.args.batch_size * run.args.grad_accum_steps)
        batches = run.comm.timed(iter(run.loader))
        end = run.step + run.steps_per_epoch - skip
        while run.step < min(end, run.total):
            if run.auto and run.auto.trial_due(run.step, min(end, run.total) - run.step):
                say_auto(run, trial_round(run, batches, one_step, train_step))
                continue
            one_step(run, batches)
        run.epoch += 1


def wire_bytes(run: Training) -> dict[str, Any]:
    """Bytes per step each node's interface sent, from every node's own counter. Nodes that
    share one counter (local nodes on loopback, in one network namespace) are one entry: each
    of them would otherwise report the whole machine's traffic as its own."""
    run.sent.mark_end(run.step)
    node = os.environ.get("LAUNCH_NODE") or socket.gethostname()
    mine = (node, run.sent.counter_id(), run.sent.per_step) if run.local_rank == 0 else None
    gathered: list = [None] * run.world
    dist.all_gather_object(gathered, mine)
    by_counter: dict[Any, dict[str, Any]] = {}
    for name, counter, per_step in filter(None, gathered):
        if per_step is None:
            continue
        entry = by_counter.setdefault(counter, {"nodes": [], "bytes": []})
        entry["nodes"].append(name)
        entry["bytes"].append(per_step)
    out = {}
    for (_, iface), entry in by_counter.items():
        label = "+".join(sorted(entry["nodes"]))
        out[label] = {"bytes_per_step": round(max(entry["bytes"])), "interface": iface,
                      "shared": len(entry["nodes"]) > 1}
    return out


def finish(run: Training) -> dict[str, Any] | None:
    """Final loss, held-out accuracy; rank 0 writes result.json. Returns rank 0's result."""
    train_time = time.perf_counter() - run.started
    run.heartbeat.beat(run.step, "evaluate")
    run.checkpoints.close()  # the last write finishes before the run counts as done
    checkpointing = run.checkpoints.stats_json() if run.checkpoints.policy.enabled else None
    wire = wire_bytes(run)
    final = torch.tensor([run.last_loss], dtype=torch.float64, device=run.device)
    dist.all_reduce(final)
    final_loss = final.item() / run.world
    accuracy = None
    held_out = run.data.held_out
    if held_out is not None and len(held_out) > 0:
        accuracy = evaluate(run.ddp.module, held_out, run.args.batch_size, run.device, run.rank,
                            run.world, run.autocast)
    run.heartbeat.beat(run.step, "done")
    if run.rank != 0:
        return None
    steady = run.step_times[WARMUP_STEPS_EXCLUDED:] or run.step_times
    # None when a resumed run had no step left to take.
    median_step = statistics.median(steady) if steady else None
    result = {
        "steps": run.step, "epochs": run.epoch, "world_size": run.world,
        "backend": run.backend, "device": run.device.type,
        "parameters": count_parameters(run.ddp.module),
        "final_loss": round(final_loss, 6), "eval_accuracy": accuracy,
        "eval_images": len(held_out) if held_out is not None else 0,
        "images_per_sec": round(run.images_per_step / median_step, 3) if median_step else None,
        "step_time_s": round(median_step, 6) if median_step else None,
        "train_time_s": round(train_time, 3),
        "ddp": asdict(run.settings),
        "step_split": split(run.comm.steps[WARMUP_STEPS_EXCLUDED:] or run.comm.steps),
        **run.watch.result(),
        "resumed_from_step": run.resumed_from,
        "restart_count": run.heartbeat.attempt,
    }
    if checkpointing is not None:
        result["checkpoint"] = checkpointing
    if wire:
        result["tx_bytes_per_step"] = {k: v["bytes_per_step"] for k, v in wire.items()}
        result["tx_counters"] = wire
    if run.buckets is not None:
        result["bucket_auto"] = run.buckets.to_json()
    if run.auto is not None:
        result["auto"] = run.auto.outcome(run.step)
        if run.auto.decision is None:
            print(f"comm_hook auto: undecided ({result['auto']['reason']}); the last steps used "
                  f"{result['auto']['last_steps_used']}", flush=True)
    if run.hook_state is not None and (run.auto is None or run.auto.uses_powersgd()):
        result["powersgd_compression_rate"] = run.hook_state.compression_stats()[0]
    if run.args.save_model:
        torch.save(run.ddp.module.state_dict(), run.out_dir / "model.pt")
    (run.out_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    run.metrics_file.close()
    acc = "n/a" if accuracy is None else f"{accuracy:.4f}"
    speed = "n/a" if result["images_per_sec"] is None else f"{result['images_per_sec']:.1f}"
    print(f"done: {run.step} steps in {train_time:.1f}s, final loss {final_loss:.4f}, "
          f"held-out accuracy {acc}, {speed} img/s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    run = setup(parse_args(argv))
    train(run)
    finish(run)
    # DDP's reducer and the hook states hold the process group: drop them first, or
    # destroy_process_group() leaves it (and gloo's worker threads) to be torn down during
    # interpreter finalization, where gloo aborted one rank in ~1 of 20 runs here
    # ("terminate called without an active exception") after the other had finished.
    run.heartbeat.close()
    run.ddp = run.hook_state = run.auto = None
    del run
    shutdown()
    return 0


def shutdown() -> None:
    """Leave together, then free the process group while the interpreter is whole."""
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
