"""Checkpoints: the state a run continues from exactly, written without holding up training.

What is saved: the model, the optimizer (AdamW moments), the step, the data-order position
(epoch and the steps already taken in it: the DistributedSampler's offset), every rank's RNG
states (torch, CUDA, Python, numpy), the comm hook's state (PowerSGD's iteration, generator,
warm-start P/Q and each rank's error-feedback residual; `comm_hook: auto`'s decision), and the
settings the state depends on (train/options.py RESUME_KEYS). The learning rate is a function
of the step (train/main.py lr_at), so the step restores the schedule. There is no AMP loss
scaler to save: precisions are fp32 and bf16, and bf16 needs no loss scaling.

Who writes: one rank, the *keeper*: local rank 0 of the head node (LAUNCH_CHECKPOINT_NODE),
so that checkpoints live in the head's run folder (runs/<id>/<head>/checkpoints/) whichever
rank the rendezvous numbered 0 (c10d orders nodes by address and agent pid, so rank 0 moves
when an agent restarts). Every rank sends the keeper its own part (RNG, residuals) in one
collective (train/rank_parts.py); the keeper copies the rest to CPU, the optimizer's tensors
while the next step runs (train/staging.py), and a thread writes the file
(launch_node/checkpoint_files.py: temp file, fsync, rename) while training goes on. The other
ranks never wait on the keeper's disk.

Who reads: the keeper alone (only the head's disk needs the file); it sends the shared state to
every rank and each rank its own part.
"""

from __future__ import annotations

import math
import os
import queue
import random
import signal
import statistics
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from launch_node import checkpoint_files as files
from launch_node.spot import INTERRUPTIBLE_ENV, LAST_CHANCE
from train.ddp import hook_checkpoint, rebuild_buckets_first, restore_hook
from train.options import OPTIONS, RESUME_KEYS, resume_signature
from train.rank_parts import Packed, PartGather, unpack
from train.staging import Staging

KEEPER_ENV = "LAUNCH_CHECKPOINT_NODE"


@dataclass(frozen=True)
class CheckpointPolicy:
    every_steps: int | None = None
    every_minutes: float | None = None
    keep: int = 2
    asynchronous: bool = True

    @classmethod
    def from_args(cls, args) -> CheckpointPolicy:
        return cls(args.checkpoint_every_steps, args.checkpoint_every_minutes,
                   args.checkpoint_keep, args.checkpoint_asynchronous)

    @property
    def enabled(self) -> bool:
        return self.every_steps is not None or self.every_minutes is not None


def signature_of(args, world: int) -> dict[str, Any]:
    by_key = {o.key: getattr(args, o.dest) for o in OPTIONS if o.key in RESUME_KEYS}
    return resume_signature(by_key, world)


def signature_problems(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each setting that differs, as 'key: checkpoint X, now Y'."""
    return [f"{key}: checkpoint {saved.get(key)!r}, now {value!r}"
            for key, value in now.items() if saved.get(key) != value]


# ---- state pieces ------------------------------------------------------------------------


def rng_state(device: torch.device) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _python_rng_from_lists(value: Any) -> Any:
    """random.getstate() is (int, tuple, float|None); a checkpoint may give lists back."""
    version, internal, gauss = value
    return version, tuple(internal), gauss


STEP_SAMPLE = 4096


@dataclass
class Stats:
    """Where checkpointing time goes, on the keeper: `blocking_s` holds up training (the
    ranks' exchange, waiting for the previous write, the part of the CPU copy made at the save,
    waiting at the next optimizer.step for the rest; with synchronous writes all of the copy and
    the write too), `deferred_copy_s` and `write_s` are the writer thread's. A writer thread
    takes CPU time that training would have had, which blocking_s does not show: each step's
    time (from one step's end to the next, the save included) is kept apart for steps the
    writer overlapped, and what those took beyond the other steps' median is the save's whole
    cost in this run."""

    saves: int = 0
    blocking_s: float = 0.0
    exchange_s: float = 0.0     # the ranks' parts gathered (a collective)
    copy_s: float = 0.0         # the previous write waited for, the copy made at the save
    deferred_copy_s: float = 0.0  # the optimizer's tensors copied while training goes on
    fence_s: float = 0.0        # training waited for that copy (in blocking_s)
    write_s: float = 0.0
    waited_s: float = 0.0
    last_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    last_chance_steps: list[int] = field(default_factory=list)  # saved on a notice
    # Seconds of the last STEP_SAMPLE steps the writer overlapped, and of the others (their
    # medians); every overlapped step's count and sum. Bounded: the keeper times every step of
    # runs that may take millions.
    steps_writing: deque = field(default_factory=lambda: deque(maxlen=STEP_SAMPLE))
    steps_clear: deque = field(default_factory=lambda: deque(maxlen=STEP_SAMPLE))
    writing_count: int = 0
    writing_sum_s: float = 0.0

    def step_timed(self, seconds: float, writing: bool) -> None:
        if writing:
            self.steps_writing.append(seconds)
            self.writing_count += 1
            self.writing_sum_s += seconds
        else:
            self.steps_clear.append(seconds)

    def to_json(self) -> dict[str, Any]:
        clear = statistics.median(self.steps_clear) if self.steps_clear else None
        writing = statistics.median(self.steps_writing) if self.steps_writing else None
        overlap_cost = None if clear is None or not self.saves else \
            (self.writing_sum_s - self.writing_count * clear) / self.saves
        return {"saves": self.saves, "blocking_s": round(self.blocking_s, 6),
                "blocking_s_per_save": round(self.blocking_s / self.saves, 6)
                if self.saves else None,
                "exchange_s_per_save": round(self.exchange_s / self.saves, 6)
                if self.saves else None,
                "copy_s_per_save": round(self.copy_s / self.saves, 6) if self.saves else None,
                "deferred_copy_s_per_save": round(self.deferred_copy_s / self.saves, 6)
                if self.saves else None,
                "fence_s_per_save": round(self.fence_s / self.saves, 6) if self.saves else None,
                "write_s_per_save": round(self.write_s / self.saves, 6) if self.saves else None,
                "waited_for_previous_s": round(self.waited_s, 6),
                "bytes": self.last_bytes, "failures": self.failures,
                "last_chance_steps": self.last_chance_steps,
                "steps_while_writing": self.writing_count,
                "step_s_while_writing": None if writing is None else round(writing, 6),
                "step_s_otherwise": None if clear is None else round(clear, 6),
                "cost_s_per_save": None if overlap_cost is None else round(overlap_cost, 6)}

    def fenced(self, seconds: float) -> None:
        self.fence_s += seconds
        self.blocking_s += seconds


class Writer:
    """Writes one checkpoint at a time: in a thread (asynchronous) or in the caller. The
    thread lives as long as the writer and waits for work: starting one per save made the
    save wait until the new thread got a core (up to ~5 ms on the busy lab)."""

    def __init__(self, folder: Path, keep: int, asynchronous: bool, stats: Stats):
        self.folder, self.keep, self.asynchronous, self.stats = folder, keep, asynchronous, stats
        self._thread: threading.Thread | None = None
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self.busy: tuple[float, float] | None = None   # the last write's start and end

    def submit(self, state: dict[str, Any], meta: dict[str, Any],
               prepare: Callable[[], None] = lambda: None) -> None:
        """`prepare` finishes `state` (in the writer's thread when asynchronous)."""
        self.wait()
        self.busy = (time.perf_counter(), math.inf)
        if not self.asynchronous:
            self._write(state, meta, prepare)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="checkpoint-writer",
                                            daemon=True)
            self._thread.start()
        self._idle.clear()
        self._work.put((state, meta, prepare))

    def wait(self) -> float:
        if self._idle.is_set():
            return 0.0
        t0 = time.perf_counter()
        self._idle.wait()
        waited = time.perf_counter() - t0
        self.stats.waited_s += waited
        return waited

    def _serve(self) -> None:
        while True:
            state, meta, prepare = self._work.get()
            try:
                self._write(state, meta, prepare)
            except Exception as err:  # noqa: BLE001 (the checkpoint is lost, not the run)
                traceback.print_exc()
                self._failed(meta, err)
            finally:
                self._idle.set()

    def _failed(self, meta: dict[str, Any], err: Exception) -> None:
        message = f"checkpoint at step {meta['step']} not written: {err}"
        self.stats.failures.append(message)
        print(message, flush=True)

    def _write(self, state: dict[str, Any], meta: dict[str, Any],
               prepare: Callable[[], None]) -> None:
        try:
            prepare()
            t0 = time.perf_counter()
            self._write_files(state, meta)
            self.stats.write_s += time.perf_counter() - t0
        finally:
            self.busy = (self.busy[0], time.perf_counter())

    def _write_files(self, state: dict[str, Any], meta: dict[str, Any]) -> None:
        name = files.stem(meta["step"])
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            size = files.write_atomic(self.folder / f"{name}.pt",
                                      lambda f: torch.save(state, f))
            files.write_json_atomic(self.folder / f"{name}.json",
                                    {**meta, "bytes": size, "file": f"{name}.pt"})
            files.prune(self.folder, self.keep)
            self.stats.last_bytes = size
        except OSError as err:  # a full disk costs the checkpoint, not the run
            self._failed(meta, err)


class Checkpointer:
    """Saves on schedule and restores at start-up; every rank has one (saving and restoring are
    collectives: every rank calls them at the same step)."""

    def __init__(self, policy: CheckpointPolicy, out_dir: Path, signature: dict[str, Any],
                 device: torch.device, rank: int, world: int):
        self.policy, self.signature, self.device = policy, signature, device
        self.rank, self.world = rank, world
        self.folder = Path(out_dir) / files.CHECKPOINT_DIR
        self.keeper = self._find_keeper()
        self.stats = Stats()
        self.writer = Writer(self.folder, policy.keep, policy.asynchronous, self.stats) \
            if self.is_keeper else None
        self._last_save_at = time.monotonic()
        self._step_ended_at: float | None = None
        self.parts = PartGather(self.keeper, rank, world, device)
        self.staging = Staging(self.stats.fenced) if self.is_keeper else None
        self.interruptible = os.environ.get(INTERRUPTIBLE_ENV) == "1"
        self._notice = False
        if policy.enabled and threading.current_thread() is threading.main_thread():
            # Only with checkpoints on: a rank without the handler is left alone by the
            # spot watcher (it would die of SIGUSR1's default action).
            signal.signal(LAST_CHANCE, self._noticed)

    def _noticed(self, signum, frame) -> None:
        self._notice = True

    @property
    def is_keeper(self) -> bool:
        return self.rank == self.keeper

    def _find_keeper(self) -> int:
        """Local rank 0 of the node launch named; rank 0 when run by hand."""
        head = os.environ.get(KEEPER_ENV)
        mine = head is not None and head == os.environ.get("LAUNCH_NODE") \
            and int(os.environ.get("LOCAL_RANK", "0")) == 0
        flags: list = [None] * self.world
        dist.all_gather_object(flags, mine)
        return flags.index(True) if True in flags else 0

    # ---- saving ---------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether to save after `step`; called after every step."""
        if self.is_keeper:
            self._clock()
        scheduled = self.policy.every_steps is not None and step % self.policy.every_steps == 0
        if self.policy.every_minutes is None and not self.interruptible:
            return scheduled
        # Ranks' clocks differ, and a notice reaches one node's ranks: the keeper's clock
        # decides, a notice anywhere counts, and every rank learns both (a save is a
        # collective, so all must agree on the step). 2: a notice, 1: the keeper's clock.
        late = self.policy.every_minutes is not None and self.is_keeper and \
            time.monotonic() - self._last_save_at >= self.policy.every_minutes * 60
        flag = torch.tensor([2.0 if self._notice else 1.0 if late else 0.0],
                            device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() >= 2:
            self._notice = False
            if self.is_keeper:
                self.stats.last_chance_steps.append(step)
                print(f"last-chance checkpoint at step {step}: a node got an interruption "
                      "notice", flush=True)
        return scheduled or flag.item() > 0

    def _clock(self) -> None:
        """The step that just ended, from the previous one's end: with the writer or not."""
        now = time.perf_counter()
        if self._step_ended_at is not None:
            busy = self.writer.busy
            writing = busy is not None and busy[0] < now and busy[1] > self._step_ended_at
            self.stats.step_timed(now - self._step_ended_at, writing)
        self._step_ended_at = now

    def save(self, run) -> None:
        """At step run.step: every rank sends its part; the keeper copies and hands the
        state to the writer."""
        t0 = time.perf_counter()
        hook_shared, hook_mine = hook_checkpoint(run.hook_state)
        mine = {"rank": self.rank, "rng": rng_state(self.device), "hook": hook_mine}
        parts = self.parts.gather(mine)
        self._last_save_at = time.monotonic()
        if not self.is_keeper:
            return
        t1 = time.perf_counter()
        # The previous state's tensors are written to again: its write must have ended.
        self.writer.wait()
        meta = {
            "format": files.FORMAT, "step": run.step, "epoch": run.epoch,
            "offset": run.step - run.epoch * run.steps_per_epoch, "total": run.total,
            "signature": self.signature, "written_at": time.time(),
        }
        staged, deferred = self.staging.take(run.ddp.module, run.optimizer)
        state = {
            "meta": meta, **staged, "hook": hook_shared,
            "auto": run.auto.state_dict() if run.auto is not None else None,
            "ranks": parts,
        }

        def prepare() -> None:
            self.stats.deferred_copy_s += deferred.run()
            state["ranks"] = [unpack(p) if isinstance(p, Packed) else p for p in parts]

        t2 = time.perf_counter()
        self.writer.submit(state, meta, prepare)
        self.stats.saves += 1
        self.stats.exchange_s += t1 - t0
        self.stats.copy_s += t2 - t1
        self.stats.blocking_s += time.perf_counter() - t0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.wait()

    def stats_json(self) -> dict[str, Any] | None:
        """The keeper's numbers, on every rank (rank 0 writes result.json)."""
        box = [self.stats.to_json() if self.is_keeper else None]
        dist.broadcast_object_list(box, src=self.keeper)
        return box[0]

    # ---- restoring -------------------------------------------------------------------------
    def _read_latest(self) -> tuple[dict[str, Any] | None, str]:
        """The newest complete checkpoint that loads (keeper only); a damaged one is skipped
        with a line saying so."""
        for found in reversed(files.complete(self.folder)):
            try:
                state = torch.load(found.state, map_location="cpu", weights_only=True)
                return state, found.name
            except Exception as err:  # noqa: BLE001 (a torn or foreign file: try the older)
                print(f"checkpoint {found.state} could not be read ({type(err).__name__}: "
                      f"{err}); trying the one before it", flush=True)
        return None, ""

    def restore(self, run) -> dict[str, Any] | None:
        """Load the latest checkpoint into `run` on every rank; returns its meta, or None when
        there is none. Raises SystemExit when it was written under other settings."""
        t0 = time.perf_counter()
        header: list = [None]
        state = None
        if self.is_keeper:
            state, name = self._read_latest()
            if state is None:
                header[0] = {"status": "none"}
            else:
                problems = signature_problems(state["meta"]["signature"], self.signature)
                header[0] = {"status": "mismatch" if problems else "ok", "file": name,
                             "problems": problems, "meta": state["meta"]}
        dist.broadcast_object_list(header, src=self.keeper)
        head = header[0]
        if head["status"] == "none":
            return None
        if head["status"] == "mismatch":
            raise SystemExit(
                f"checkpoint {self.folder / head['file']} was written under other settings "
                "and cannot be resumed: " + "; ".join(head["problems"]))
        shared = [None]
        if self.is_keeper:
            shared[0] = {k: state[k] for k in ("model", "optimizer", "hook", "auto")}
        dist.broadcast_object_list(shared, src=self.keeper)
        mine: list = [None]
        dist.scatter_object_list(mine, state["ranks"] if self.is_keeper else None,
                                 src=self.keeper)
        self._apply(run, head["meta"], shared[0], mine[0])
        return {**head["meta"], "file": head["file"], "load_s": time.perf_counter() - t0}

    def _apply(self, run, meta, shared, mine) -> None:
        run.ddp.module.load_state_dict(shared["model"])
        run.optimizer.load_state_dict(shared["optimizer"])
        # The optimizer's saved hyper-parameters would override the recipe's: the recipe
        # decides (the learning rate is set every step from the schedule anyway).
        for group in run.optimizer.param_groups:
            group["weight_decay"] = run.args.weight_decay
        restore_hook(run.hook_state, shared["hook"], mine["hook"])
        size = run.args.image_size
        rebuild_buckets_first(run.ddp, run.hook_state, torch.zeros(
            run.args.batch_size, run.data.in_channels, size, size, device=self.device))
        if run.auto is not None:
            run.auto.load_state_dict(shared["auto"], meta["step"])
        rng = dict(mine["rng"])
        rng["python"] = _python_rng_from_lists(rng["python"])
        set_rng_state(rng, self.device)
        run.step, run.epoch = meta["step"], meta["epoch"]
        run.resume_offset = meta["offset"]
        self._last_save_at = time.monotonic()
