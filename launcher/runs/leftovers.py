"""Runs whose launch process died before writing a summary, and what they left running.

Every run folder records launch's pid and the run's process stamp (launch.json, written when
the folder is made); summary.json is written when the run ends. A folder with the first and
not the second, whose launch process is gone, is an abandoned run: launch was killed (SIGKILL,
OOM, a closed laptop). Its node agents die with launch (parent-death signal here, the SSH
session's watchdog on nodes), but this is where a survivor would be found and named: by the
run's stamp in the processes' environment, never by name.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.names import RULES
from launcher.runs.folder import LAUNCH_FILE, STAMP_ENV
from launcher.runs.progress import PROGRESS_FILE
from launcher.runs.schema import (MAX_SMALL, LaunchRecord, MetricsLine, PlanRecord,
                                  ProgressLine, SummaryRecord, read_lines, read_record)

# The last logged step of a run still going: read from the end of its head's metrics.
_METRICS_TAIL = 64 * safefile.KIB


@dataclass
class RunState:
    run_id: str
    folder: Path
    # running | abandoned | unknown | unreadable, or what summary.json says (succeeded,
    # failed, interrupted, stopped, preempted...: one short word, checked)
    status: str
    launch_pid: int | None = None
    started_at: str | None = None
    leftover_pids: list[int] = field(default_factory=list)   # processes of it, this machine
    recipe: str | None = None
    backend: str | None = None
    nodes: int | None = None
    duration_s: float | None = None
    steps: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    # The time in kept steps / the wall time (summary.json timeline: launcher/runs/timeline.py).
    goodput: float | None = None
    # Why a file of the folder could not be read (the folder is listed all the same).
    problem: str | None = None
    # A detached run: where it lives (its record, detached.json), while this folder has no
    # summary of it; `launch runs` asks there how it is.
    where: str | None = None

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "folder": str(self.folder), "status": self.status,
                "recipe": self.recipe, "backend": self.backend, "nodes": self.nodes,
                "launch_pid": self.launch_pid, "started_at": self.started_at,
                "duration_s": self.duration_s, "steps": self.steps, "loss": self.loss,
                "accuracy": self.accuracy, "goodput": self.goodput, "leftover_pids": self.leftover_pids,
                "problem": self.problem, "where": self.where}


def pids_with_env(key: str, value: str) -> list[int]:
    """Processes of this user whose environment has key=value."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def is_launch(pid: int) -> bool:
    """Whether `pid` is still a launch process (pids are reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith((b"launch", b"launcher")) or part == b"launcher.cli"
               for part in cmdline)


def _backend(plan: PlanRecord | None, summary: SummaryRecord | None) -> str | None:
    """Where it ran: plan.json's own word when it has one, Slurm's job in the summary, else
    the nodes' addresses (this machine's loopback: local; others: ssh)."""
    if plan is not None and plan.backend:
        return plan.backend
    if summary is not None and summary.slurm is not None:
        return "slurm"
    addresses = [n.address for n in plan.nodes] if plan is not None else []
    if not addresses or any(a is None for a in addresses):
        return None
    return "local" if all(a in ("127.0.0.1", "localhost", "::1") for a in addresses) else "ssh"


def _elapsed(started_at: str | None) -> float | None:
    try:
        start = datetime.fromisoformat(started_at or "")
        return max(0.0, (datetime.now(start.tzinfo) - start).total_seconds())
    except (TypeError, ValueError):
        return None


def run_state(folder: Path, *, with_leftovers: bool = True) -> RunState | None:
    """The state of one run folder, or None when launch did not make it (no launch.json).
    A file that is not what launch writes is named in `problem`, never a traceback."""
    runs = folder.parent
    detached = _detached_where(folder)
    if safefile.lstat(folder / LAUNCH_FILE, within=runs) is None:
        # A run detached to another machine: only its record is here (until `launch fetch`).
        return None if detached is None else RunState(folder.name, folder, "detached",
                                                       where=detached)
    state = RunState(folder.name, folder, "unknown")
    try:
        launch = read_record(LaunchRecord, folder / LAUNCH_FILE, within=runs,
                             max_bytes=MAX_SMALL)
    except LauncherError as err:
        state.status, state.problem = "unreadable", str(err)
        return state
    state.launch_pid, state.started_at = launch.pid, launch.started_at
    summary = plan = None
    problems = []
    for name, model in (("summary.json", SummaryRecord), ("plan.json", PlanRecord)):
        if safefile.lstat(folder / name, within=runs) is None:
            continue
        try:
            record = read_record(model, folder / name, within=runs)
        except LauncherError as err:
            problems.append(str(err))
            continue
        if model is SummaryRecord:
            summary = record
        else:
            plan = record
    state.problem = "; ".join(problems) or None
    if summary is not None:
        state.status = summary.status or "unknown"
    elif any(p.startswith(str(folder / "summary.json")) for p in problems):
        state.status = "unknown"
    elif detached is not None:
        state.status, state.where = "detached", detached
    elif launch.pid is not None and is_launch(launch.pid):
        state.status = "running"
    else:
        state.status = "abandoned"
    state.recipe = (plan.recipe.name if plan and plan.recipe else None) or \
        (summary.recipe if summary else None)
    state.backend = _backend(plan, summary)
    state.nodes = (plan.nnodes if plan and plan.nnodes is not None else
                   len(plan.nodes) if plan and plan.nodes else
                   summary.nnodes if summary else None)
    if summary is not None:
        state.duration_s = summary.duration_s
        if summary.timeline is not None:
            state.goodput = summary.timeline.goodput
        state.steps, state.loss, state.accuracy = (summary.steps, summary.final_loss,
                                                   summary.eval_accuracy)
        progress = summary.progress if isinstance(summary.progress, dict) else {}
        if state.steps is None and isinstance(progress.get("step"), int):
            # A job of the user's own: what its LAUNCH_STEP lines reported.
            state.steps = progress["step"]
            loss = progress.get("loss")
            state.loss = float(loss) if isinstance(loss, (int, float)) else None
    elif state.status == "running":
        state.duration_s = _elapsed(launch.started_at)
    if summary is None and plan is not None and plan.nodes:
        _last_logged(state, folder, plan.nodes[0].name)
    if with_leftovers and launch.stamp and state.status in ("abandoned", "unknown"):
        state.leftover_pids = pids_with_env(STAMP_ENV, launch.stamp)
    return state


def _detached_where(folder: Path) -> str | None:
    """Where a detached run lives, as its record says (launcher/pipeline/handover.py)."""
    import json

    path = folder / "detached.json"
    if safefile.lstat(path, within=folder.parent) is None:
        return None
    try:
        record = json.loads(safefile.read_bytes(path, "detached.json", max_bytes=MAX_SMALL))
        return str(record.get("where") or "elsewhere")
    except (LauncherError, ValueError, AttributeError):
        return "elsewhere (its record, detached.json, is unreadable)"


def _last_logged(state: RunState, folder: Path, head: str) -> None:
    """A run without a summary: its last logged step and loss, from its head's metrics (the
    trainer's) or the run's progress.jsonl (a job's LAUNCH_STEP lines)."""
    for path, model in ((folder / head / "metrics.jsonl", MetricsLine),
                        (folder / PROGRESS_FILE, ProgressLine)):
        if safefile.lstat(path, within=folder.parent) is None:
            continue
        try:
            lines = read_lines(model, path, within=folder.parent, max_bytes=_METRICS_TAIL)
        except LauncherError:
            continue
        if lines:
            state.steps, state.loss = lines[-1].step, lines[-1].loss
            return


def runs_in(runs_dir: str | Path) -> list[RunState]:
    """Every run folder in `runs_dir`, each as far as it can be read; an entry that is a link
    is listed as refused, never followed."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    root = root.resolve()
    states = []
    for name in sorted(os.listdir(root)):
        folder = root / name
        info = safefile.lstat(folder, within=root)
        if info is None:
            continue
        if RULES["run id"].problem(name) is not None:
            continue   # not a folder launch makes (run ids are checked names)
        if os.path.islink(folder):
            if os.path.isfile(os.path.join(folder, LAUNCH_FILE)):
                states.append(RunState(name, folder, "refused", problem=(
                    f"{folder} is a symbolic link: launch reads no run folder through a link")))
            continue
        if not os.path.isdir(folder):
            continue
        state = run_state(folder)
        if state is not None:
            states.append(state)
    # In the order they started (the newest last, by the prompt); a folder that does not say
    # when (refused, unreadable) by its name, first.
    return sorted(states, key=lambda s: (s.started_at or "", s.run_id))


def abandoned_warnings(runs_dir: str | Path) -> list[str]:
    """One line per abandoned run with processes still alive here (for `launch run`)."""
    out = []
    for state in runs_in(runs_dir):
        if state.status == "abandoned" and state.leftover_pids:
            pids = ", ".join(map(str, state.leftover_pids[:8]))
            out.append(f"run {state.run_id}: launch (pid {state.launch_pid}) died without a "
                       f"summary and {len(state.leftover_pids)} of its processes still run "
                       f"here (pids {pids}); `launch runs --stop {state.run_id}` ends them")
    return out


def stop(state: RunState) -> list[int]:
    """SIGKILL the run's leftover processes (found by its stamp); returns the pids sent."""
    sent = []
    for pid in state.leftover_pids:
        try:
            os.kill(pid, signal.SIGKILL)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent
