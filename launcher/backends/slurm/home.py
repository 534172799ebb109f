"""A run in a Slurm job, seen from the login node: its folder on the shared filesystem, its
pipeline the job's batch step (launch's controller). Following it shows the job's states until
its controller speaks (PENDING with Slurm's reason, RUNNING on its nodes); stopping it is a
signal to the batch step (`scancel --batch --signal`), or cancelling the job while it waits."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from launcher.backends.local.home import FolderHome
from launcher.backends.slurm.sbatch import JOB_OUT
from launcher.backends.slurm.slurmctl import JobInfo, SlurmError, job_info, slurm
from launcher.runs.console import CONSOLE, follow_file

# Final states in which Slurm, not the run, ended the job; what each means.
SLURM_ENDINGS = {
    "TIMEOUT": "the job reached its time limit (--time / slurm.time, or the partition's)",
    "NODE_FAIL": "a node of the allocation failed",
    "PREEMPTED": "a job of higher priority preempted it",
    "OUT_OF_MEMORY": "a node ran out of memory",
    "DEADLINE": "the job reached its deadline",
    "BOOT_FAIL": "a node failed to boot",
}

class JobWatch:
    """The job's state, asked of slurmctld at most every `interval` seconds."""

    def __init__(self, job_id: str, interval: float = 0.5,
                 ask: Callable[[str], JobInfo] = job_info):
        self.job_id, self.interval, self._ask = job_id, interval, ask
        self._lock = threading.Lock()
        self._info: JobInfo | None = None
        self._at = 0.0

    def info(self, fresh: bool = False) -> JobInfo:
        with self._lock:
            if self._info is not None and self._info.final:
                return self._info   # final states never change
            now = time.monotonic()
            if fresh or self._info is None or now - self._at >= self.interval:
                try:
                    self._info = self._ask(self.job_id)
                except SlurmError:
                    # slurmctld busy or restarting: the job runs on meanwhile; ask again later.
                    self._info = self._info or JobInfo(self.job_id, "UNKNOWN")
                self._at = now
            return self._info

def message(text: str) -> bytes:
    return (json.dumps({"k": "msg", "text": text}) + "\n").encode()

class SlurmHome(FolderHome):
    def __init__(self, run_id: str, root: Path, job_id: str):
        self.job_id = job_id
        self.watch = JobWatch(job_id)
        self.asked: list[str] = []
        super().__init__(run_id, root, f"Slurm job {job_id}", self._alive_now, self._send)

    def _alive_now(self) -> bool:
        return not self.watch.info().final

    def _send(self, sig: int) -> str:
        info = self.watch.info(fresh=True)
        if info.final:
            return f"{info.describe()}: nothing to stop"
        self.asked.append(signal.Signals(sig).name)
        if info.state in ("RUNNING", "COMPLETING"):
            # The batch step is the run's pipeline: it stops the nodes' steps in order.
            slurm(["scancel", "--batch", f"--signal={signal.Signals(sig).name}", self.job_id])
            return f"sent {signal.Signals(sig).name} to job {self.job_id}'s pipeline"
        slurm(["scancel", self.job_id])   # not started: nothing of it runs yet
        return f"cancelled job {self.job_id} ({info.state})"

    def follow(self, name: str, offset: int, done) -> Iterator[bytes]:
        """The console; before its controller speaks, the job's own states as messages."""
        if name != CONSOLE:
            yield from follow_file(self.root / name, offset, done)
            return
        shown = ""
        while not (self.root / CONSOLE).exists():
            info = self.watch.info(fresh=True)
            text = info.describe()
            if text != shown:
                shown = text
                yield message(text)
            if info.final or done():
                break
            yield b""
            time.sleep(0.2)
        yield from follow_file(self.root / name, offset, done)

    def final(self, wait_s: float = 30.0) -> JobInfo:
        """The job's state once it is over (waited for: its steps may still be ending)."""
        deadline = time.monotonic() + wait_s
        info = self.watch.info(fresh=True)
        while not info.final and time.monotonic() < deadline:
            time.sleep(0.2)
            info = self.watch.info(fresh=True)
        return info

    def ending(self) -> str | None:
        """Why the job ended when neither the run nor launch ended it."""
        info = self.final()
        if info.state in SLURM_ENDINGS:
            return f"Slurm ended job {self.job_id} ({info.state}): {SLURM_ENDINGS[info.state]}."
        if info.state == "CANCELLED" and not self.asked:
            return (f"job {self.job_id} was cancelled outside launch (scancel by you or the "
                    "cluster's admins).")
        return None

    def log_hint(self) -> str:
        info = self.watch.info(fresh=True)
        out = self.root / JOB_OUT.format(job_id=self.job_id)
        if info.final and not out.exists() and not (self.root / CONSOLE).exists():
            return (f"{info.describe()} without writing anything into the run folder "
                    f"{self.root}: the compute nodes do not see it. The run folder must be on a "
                    "filesystem the nodes share with this login node (your home, NFS, "
                    "Lustre): pass --runs-dir there")
        tail = ""
        try:
            tail = "\n".join(out.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            pass
        return f"{info.describe()}; {out}" + (f":\n{tail}" if tail else "")

    def settle(self, status: str | None = None, reason: str | None = None,
               amend=None, wait_s: float = 30.0) -> None:
        """The job's final state (waited for: its steps may still be ending) in the run's
        summary.json, as `slurm`; a summary made when the run never wrote one (`status`,
        `reason`: it was cancelled before it started, or Slurm ended it); `amend(summary)`'s
        changes (the timeline as the following `launch run` saw it)."""
        from launcher.core import safefile

        info = self.final(wait_s)
        path = self.root / "summary.json"
        try:
            doc = json.loads((self.root / "slurm.json").read_text())
        except (OSError, ValueError):
            return
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            if status is None:
                return
            summary = {"run_id": self.run_id, "run_dir": str(self.root)}
        if status is not None:
            summary["status"] = status
            summary["failure"] = {**(summary.get("failure") or {}), "reason": reason,
                                  "interrupted": status == "interrupted"}
        summary["slurm"] = {**info.to_json(), "sbatch": doc.get("sbatch"),
                            "script": doc.get("script")}
        if amend is not None:
            amend(summary)
        safefile.write_json(path, summary, within=self.root.parent)
