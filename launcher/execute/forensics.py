"""Hang forensics: every rank's stack and process state, and which ranks are stuck.

When no rank has completed a step for the hang timeout, every node describes its ranks
(launch_node/node_probe.py dump: /proc state, py-spy stacks, NCCL's flight recorder) and this module
sorts them. A rank whose main thread waits inside a collective (torch.distributed, or DDP's
gradient all-reduce inside backward while the process sleeps) is a victim: it waits for the
others. A stopped process, a dead one, or one busy anywhere else is *stuck*: the rank the
others wait for. Each rank's description goes to runs/<id>/hang/<node>.rank<r>.txt.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.core.names import path_component

HANG_DIR = "hang"
DUMP_TIMEOUT_S = 10.0

# py-spy: 'Thread 4242 (idle): "MainThread"' then '    function (path/file.py:123)'
_SPY_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<status>[^)]*)\)'
                         r'(?::\s*"(?P<name>[^"]*)")?')
_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>.+?):(?P<line>\d+)\)\s*$")
# faulthandler: 'Current thread 0x00007f (most recent call first):' then
# '  File "/path/file.py", line 123 in function'
_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')

# Where a rank waits for the others: the collectives (and joining the process group), DDP's
# own synchronisation, the comm hooks. A frame there that is a module being imported is not.
COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/nn/parallel/distributed.py",
                    "torch/distributed/algorithms/ddp_comm_hooks/")
# DDP all-reduces gradients from inside backward and waits for them before it returns: a
# rank that sleeps in backward is waiting on its peers, one that runs there is computing.
BACKWARD_FUNCS = ("backward", "_engine_run_backward", "run_backward")
WAITING_STATES = ("S", "D")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({short_path(self.file)}:{self.line})"


@dataclass
class Thread:
    tid: str
    name: str | None
    main: bool
    frames: list[Frame] = field(default_factory=list)   # innermost first


def short_path(path: str) -> str:
    """site-packages/torch/x.py -> torch/x.py; .../code/train/main.py -> train/main.py."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    m = re.search(r"(?:^|/)(train/[^/]+\.py)$", path)
    return m.group(1) if m else path


def parse_py_spy(text: str, pid: int | None = None) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _SPY_THREAD.match(line)
        if m:
            tid, name = m["tid"], m["name"]
            main = name == "MainThread" or (pid is not None and tid == str(pid))
            threads.append(Thread(tid, name, main))
            continue
        f = _SPY_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["func"], f["file"], int(f["line"])))
    if threads and not any(t.main for t in threads):
        threads[0].main = True  # py-spy lists the main thread first
    return threads


def parse_faulthandler(text: str) -> list[Thread]:
    """faulthandler's dump; the signal handler runs on the main thread: 'Current thread'."""
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            current = m["current"] == "Current thread"
            threads.append(Thread(m["tid"], "MainThread" if current else None, current))
            continue
        f = _FH_FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(Frame(f["func"], f["file"], int(f["line"])))
    return threads


def main_frames(rank: dict[str, Any]) -> list[Frame]:
    text = rank.get("stack")
    if not text:
        return []
    threads = (parse_faulthandler(text) if rank.get("stack_source") == "faulthandler"
               else parse_py_spy(text, rank.get("pid")))
    for thread in threads:
        if thread.main:
            return thread.frames
    return []


@dataclass(frozen=True)
class Verdict:
    node: str
    rank: int | None
    local_rank: int | None
    state: str                # "stopped (T)", "sleeping (S)", "gone"
    where: str                # "stuck" | "in_collective" | "unknown"
    frame: str | None         # the innermost frame of the main thread
    waiting_in: str | None    # the collective frame, for ranks in one
    step: int | None

    def to_json(self) -> dict[str, Any]:
        out = {"node": self.node, "rank": self.rank, "local_rank": self.local_rank,
               "state": self.state, "frame": self.frame, "step": self.step}
        if self.waiting_in:
            out["waiting_in"] = self.waiting_in
        return out


def classify(node: str, rank: dict[str, Any]) -> Verdict:
    letter = rank.get("state")
    state = "gone" if letter in (None, "gone") else f"{rank.get('state_name', letter)} ({letter})"
    frames = main_frames(rank)
    innermost = str(frames[0]) if frames else None

    def verdict(where: str, waiting_in: str | None = None) -> Verdict:
        return Verdict(node, rank.get("rank"), rank.get("local_rank"), state, where, innermost,
                       waiting_in, rank.get("step"))

    if letter in (None, "gone", "T", "t", "Z", "X"):
        return verdict("stuck")   # stopped or dead: the others wait for it
    if not frames:
        return verdict("unknown")
    for frame in frames:
        if frame.function != "<module>" and any(part in frame.file for part in COLLECTIVE_FILES):
            return verdict("in_collective", str(frame))
    if letter in WAITING_STATES:
        for frame in frames:
            if frame.function in BACKWARD_FUNCS and ("torch/" in frame.file):
                return verdict("in_collective", f"{frame} (DDP's gradient all-reduce)")
    return verdict("stuck")


def dump_text(node: str, rank: dict[str, Any], verdict: Verdict) -> str:
    lines = [
        f"node {node}, rank {rank.get('rank')} (local rank {rank.get('local_rank')}), pid "
        f"{rank.get('pid')}" + (f": {rank['cmd']}" if rank.get("cmd") else ""),
        f"process state: {verdict.state}" + (f", waiting in kernel function {rank['wchan']}"
                                              if rank.get("wchan") else ""),
        f"last heartbeat: step {rank.get('step')}, phase {rank.get('phase')}, restart "
        f"{rank.get('attempt')}" if rank.get("phase") is not None else
        "no heartbeat (a job of your own: found by the run's stamp in its environment)",
        f"verdict: {verdict.where.replace('_', ' ')}"
        + (f" ({verdict.waiting_in})" if verdict.waiting_in else ""),
        f"stack source: {rank.get('stack_source') or 'none'}",
    ]
    if rank.get("error"):
        lines.append(f"note: {rank['error']}")
    if rank.get("nccl_trace"):
        lines.append(f"NCCL flight recorder dump (on the node): {rank['nccl_trace']}")
    lines.append("")
    lines.append(rank.get("stack") or "(no stack could be read)")
    return "\n".join(lines).rstrip() + "\n"


# What "no progress" meant: a step on every rank (the trainer's heartbeats), or for a job of
# the user's own no sign of life at all (launcher/execute/watch.py ActivityClock).
NO_STEP = "no rank completed a step"
NO_SIGN = "no rank showed progress (no output, no CPU time, no LAUNCH_STEP line)"


@dataclass
class HangReport:
    idle_s: float
    timeout_s: float
    verdicts: list[Verdict]
    pids: dict[tuple[str, int | None], int]   # (node, rank) -> pid, for a restart
    dumps: list[str]
    nccl_traces: list[str]
    errors: list[str]
    idle_means: str = NO_STEP

    @property
    def stuck(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.where == "stuck"]

    def stuck_nodes(self) -> list[str]:
        return list(dict.fromkeys(v.node for v in self.stuck))

    def pids_to_restart(self) -> dict[str, list[int]]:
        """Per node, the processes a restart kills so that torchrun starts its workers again:
        the stuck ranks that still run, else (nothing stands out) every rank."""
        chosen = [v for v in self.stuck if v.state != "gone"] or \
            [v for v in self.verdicts if v.state != "gone"]
        out: dict[str, list[int]] = {}
        for v in chosen:
            pid = self.pids.get((v.node, v.rank))
            if pid is not None:
                out.setdefault(v.node, []).append(pid)
        return out

    def to_json(self, detected_at_s: float, action: str) -> dict[str, Any]:
        return {
            "detected_at_s": round(detected_at_s, 3),
            "idle_s": round(self.idle_s, 3), "timeout_s": round(self.timeout_s, 3),
            "stuck": [v.to_json() for v in self.stuck],
            "in_collective": [v.to_json() for v in self.verdicts if v.where == "in_collective"],
            "unknown": [v.to_json() for v in self.verdicts if v.where == "unknown"],
            "dumps": self.dumps, "nccl_traces": self.nccl_traces, "errors": self.errors,
            "action": action,
        }

    def reason(self) -> str:
        stuck = self.stuck
        idle = f"hang: {self.idle_means} for {self.idle_s:.0f}s (hang timeout {self.timeout_s:g}s)"
        if not stuck:
            return f"{idle} and no rank stands out as stuck"
        named = ", ".join(f"{_who(v)} on node {v.node} ({v.state})" for v in stuck)
        return f"{idle}; stuck: {named}"

    def lines(self, folder: Path) -> list[str]:
        where = Path(self.dumps[0]).parent if self.dumps else Path(HANG_DIR)
        out = [f"{self.reason()}; every rank's stack in {folder / where}/"]
        for title, where in (("stuck (not in a collective)", "stuck"),
                             ("waiting in a collective", "in_collective"),
                             ("undetermined (no stack)", "unknown")):
            for v in self.verdicts:
                if v.where != where:
                    continue
                at = v.waiting_in if where == "in_collective" else v.frame
                out.append(f"  {title}: {_who(v)} on node {v.node}: {v.state}"
                           + (f", at {at}" if at else "")
                           + (f", last step {v.step}" if v.step is not None else ""))
        out += [f"  note: {e}" for e in self.errors]
        return out


def _who(v: Verdict) -> str:
    return f"rank {v.rank}" if v.rank is not None else "a process"


def investigate(procs: list, idle_s: float, timeout_s: float, folder: Path,
                timeout: float = DUMP_TIMEOUT_S, number: int = 1,
                idle_means: str = NO_STEP) -> HangReport:
    """Every node at once describes its ranks; verdicts and dump files: hang/ for the run's
    first hang, hang/<number>/ for later ones (a restarted run that hung again)."""
    def ask(proc):
        return proc.dump_ranks(timeout)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(procs)))) as pool:
        answers = dict(zip([p.name for p in procs], pool.map(_safe(ask), procs)))
    relative = HANG_DIR if number == 1 else f"{HANG_DIR}/{number}"
    out_dir = folder / relative
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts, dumps, traces, errors = [], [], [], []
    pids: dict[tuple[str, int | None], int] = {}
    for node, answer in answers.items():
        if isinstance(answer, Exception):
            errors.append(f"node {node} could not be asked for its ranks' stacks: {answer}")
            continue
        if not answer.get("py_spy"):
            errors.append(f"node {node}: py-spy is not installed in the node's Python "
                          "environment (`launch setup` installs it)")
        for rank in sorted(answer.get("ranks", []), key=lambda r: (r.get("rank") is None,
                                                                   r.get("rank"))):
            verdict = classify(node, rank)
            verdicts.append(verdict)
            if rank.get("pid") is not None:
                pids[(node, rank.get("rank"))] = int(rank["pid"])
            # A command's processes carry no rank (it brought its own launcher): by pid.
            who = f"rank{rank['rank']}" if rank.get("rank") is not None else \
                f"pid{rank.get('pid')}"
            name = f"{path_component(node, 'node name')}.{who}.txt"
            (out_dir / name).write_text(dump_text(node, rank, verdict))
            dumps.append(f"{relative}/{name}")
            if rank.get("nccl_trace"):
                traces.append(f"{node}:{rank['nccl_trace']}")
    verdicts.sort(key=lambda v: (v.rank is None, v.rank))
    return HangReport(idle_s, timeout_s, verdicts, pids, dumps, traces, errors, idle_means)


def _safe(fn):
    def call(item):
        try:
            return fn(item)
        except Exception as err:  # noqa: BLE001 (reported per node)
            return err
    return call
