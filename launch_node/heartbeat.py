"""Each rank's sign of life, read by launch to notice a run that stopped making progress.

    OUT_DIR/heartbeat/local<local_rank>.json    {"rank", "pid", "step", "phase", ...}

Rewritten (atomically: temp file, rename) after every optimizer step and at every phase change
(setup, train, evaluate, done). launch reads the files of every node (launcher/execute/watch.py)
and, when none changes for the hang timeout, dumps each rank's stack (launch_node/node_probe.py). A
stopped or wedged rank cannot write, and the ranks waiting for it in a collective cannot
either: no file changes, whichever rank is at fault.

Also registers SIGUSR2 to print every thread's stack into OUT_DIR/heartbeat/stack.local<r>.txt:
where py-spy may not attach (ptrace restricted on the node), a rank blocked in a collective
still answers that signal (faulthandler writes from its C signal handler).

Imports only the standard library.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = "heartbeat"
STACK_SIGNAL = signal.SIGUSR2
# Recent steps whose median launch uses for its default hang timeout (20x the median step).
MEDIAN_WINDOW = 50


def heartbeat_path(out_dir: str | Path, local_rank: int) -> Path:
    return Path(out_dir) / HEARTBEAT_DIR / f"local{local_rank}.json"


def stack_path(out_dir: str | Path, local_rank: int) -> Path:
    return Path(out_dir) / HEARTBEAT_DIR / f"stack.local{local_rank}.txt"


def median(values) -> float:
    """statistics.median, without its import: node_probe.py imports this module, and the hang
    watch starts it on every node (statistics and socket were ~60 ms of its ~110 ms of CPU)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Heartbeat:
    """One rank's heartbeat file. Created before the process group, so that a rank stuck
    joining it is found too (RANK and LOCAL_RANK come from torchrun's environment)."""

    def __init__(self, out_dir: str | Path, warmup_steps: int = 3):
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.path = heartbeat_path(out_dir, self.local_rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        pipe = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
        if pipe:  # NCCL makes its flight recorder's pipe there, and fails if the folder is not
            Path(pipe).parent.mkdir(parents=True, exist_ok=True)
        # What the process this one replaces (a restart, a resume) had reached: read before the
        # first write overwrites it.
        self.previous = read_heartbeat(self.path)
        self.node = os.environ.get("LAUNCH_NODE") or os.uname().nodename
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.warmup_steps = warmup_steps
        self._recent: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._seen_steps = 0
        self._stack_file = open(stack_path(out_dir, self.local_rank), "w")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=self._stack_file, all_threads=True,
                              chain=False)
        self.beat(0, "setup")

    def previous_step(self) -> int | None:
        """The last step the replaced process completed (None: no earlier process here)."""
        if not self.previous or self.previous.get("pid") == os.getpid():
            return None
        step = self.previous.get("step")
        return step if isinstance(step, int) else None

    def step_done(self, step: int, step_time_s: float) -> None:
        self._seen_steps += 1
        if self._seen_steps > self.warmup_steps:
            self._recent.append(step_time_s)
        self.beat(step, "train")

    def beat(self, step: int, phase: str) -> None:
        record = {
            "node": self.node, "rank": self.rank, "local_rank": self.local_rank,
            "pid": os.getpid(), "attempt": self.attempt, "step": step, "phase": phase,
            "time": time.time(),
            "median_step_s": round(median(self._recent), 6) if self._recent else None,
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a full disk must not stop training; launch then sees no progress and says so

    def close(self) -> None:
        faulthandler.unregister(STACK_SIGNAL)
        self._stack_file.close()
