"""A submitted Slurm job as the supervisor sees it (execute/supervisor.py): one NodeProcess per
node of the allocation, the batch script and the rendezvous store as services on the head.

Nothing runs as a child of launch: the nodes write into the run folder, on the filesystem
they share with the login node, and launch follows those files. A node's end is its exit_code
file (the job script writes it when torchrun returns) or, when Slurm ended the job first, the
job's final state. Stopping a node is cancelling the job: Slurm signals every process of it on
every node.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from launcher.core.errors import RunFailed
from launcher.core.node_code import code_root, snapshot
from launcher.execute.backend import LaunchOptions
from launcher.execute.runner import execute_plan
from launcher.execute.supervisor import StopRequest, interrupt_words
from launcher.execute.watcher_answers import KeptWatcher, WatcherAnswers, last_line
from launcher.job.setup import SETUP_LOG
from launcher.report.display import make_display
from launcher.runs.folder import STAMP_ENV, RunFolder
from launcher.backends.slurm.sbatch import (AGENT_OUT, EXIT_FILE, JOB_OUT, SCRIPT_NAME, STORE_EXIT, STORE_OUT,
                             SlurmJob, node_facts)
from launcher.backends.slurm.slurmctl import (JobInfo, SlurmError, hostnames, job_info, node_addresses, said,
                               scancel, slurm, where_conf)

# A node Slurm ended (cancelled, time limit, a peer's failure with --kill-on-bad-exit) was
# sent SIGTERM; it reports no exit code of its own.
ENDED_BY_SLURM = -signal.SIGTERM


class JobWatch:
    """The job's state, asked of slurmctld at most every `interval` seconds however many node
    processes poll it; cancelling it, once per kind."""

    def __init__(self, job_id: str, interval: float = 0.5,
                 ask: Callable[[str], JobInfo] = job_info):
        self.job_id, self.interval, self._ask = job_id, interval, ask
        self._lock = threading.Lock()
        self._info: JobInfo | None = None
        self._at = 0.0
        self.cancelled: set[bool] = set()

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

    def final(self) -> bool:
        return self.info().final

    def cancel(self, kill: bool = False) -> None:
        """scancel, unless the job is ending already (by itself, or cancelled by someone
        else: then `cancelled` stays empty, and the run says who ended it)."""
        info = self.info(fresh=True)
        if info.final or (info.state == "COMPLETING" and not kill):
            return
        with self._lock:
            if kill in self.cancelled:
                return
            self.cancelled.add(kill)
        scancel(self.job_id, kill=kill)

    def wait_final(self, timeout: float, poll: float = 0.2,
                   stop: Callable[[], bool] = lambda: False) -> JobInfo:
        """The job's state once nothing of it runs anywhere, or its state at the timeout
        (or when `stop()`)."""
        deadline = time.monotonic() + timeout
        info = self.info(fresh=True)
        while not info.final and time.monotonic() < deadline and not stop():
            time.sleep(poll)
            info = self.info(fresh=True)
        return info


def follow(path: Path, done: Callable[[], bool], poll: float = 0.1) -> Iterator[str]:
    """The lines of a file the job appends to, as they arrive; ends once `done()` and all
    that was written is read (`done` is asked before the last read, so no line is lost)."""
    while not path.exists():
        if done():
            if not path.exists():
                return
            break
        time.sleep(poll)
    partial = ""
    with open(path, errors="replace") as f:
        while True:
            finished = done()
            chunk = f.read()
            if chunk:
                *lines, partial = (partial + chunk).split("\n")
                yield from lines
            if finished:
                if partial:
                    yield partial
                return
            if not chunk:
                time.sleep(poll)


def _read_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None   # not written yet, or being written


class StepWatcher:
    """launch_node/node_probe.py `watch` on one node, a step that overlaps the job's (srun
    --overlap), kept for the run: a look is a line asked and a line answered, as over SSH
    (launcher/backends/ssh/watcher.py; the answers' framing: launcher/execute/watcher_answers.py).
    A look once started a step each time: srun, a slurmstepd and an interpreter on the node,
    ~55 ms of a core measured on the lab, every 2 s per node for the whole run. The probe reads
    its stdin to the end: when launch closes it, or launch dies, it leaves; the job's end ends
    it too."""

    def __init__(self, argv: list[str], where: str):
        self.where = where
        self._err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err)
        except FileNotFoundError:
            self._err.close()
            raise SlurmError("`srun` is not installed here: launch --slurm runs on a Slurm "
                             "login node, where the Slurm client commands are on PATH") from None
        self.answers = WatcherAnswers(where)

    def ask(self, what: str, timeout: float) -> Any:
        """The answer to `what` (activity | heartbeats); LauncherError when none comes."""
        self.proc.stdin.write(f"{what}\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        out = self.proc.stdout.fileno()

        def recv() -> bytes:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise SlurmError(f"the node watcher on {self.where} did not answer in "
                                 f"{timeout:g} s")
            return os.read(out, 1 << 16)

        return self.answers.next(recv, self._last_error)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _last_error(self) -> str:
        self._err.seek(0)
        return last_line(self._err.read(), self.proc.poll())

    def close(self, wait_s: float = 2.0) -> None:
        """End of input: the probe leaves and srun with it; waited for, so that nothing of
        the run is left on the node when launch goes on (killed if it lingers)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass   # it ended already (a broken pipe)
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._err.close()


class SlurmNodeProcess:
    """One node's torchrun agent in the job."""

    label = None
    # Slurm's steps are the job script's: it starts every node again when the run may restart
    # (launcher/backends/slurm/sbatch.py); launch cannot start one node's agent by itself.
    restartable = False

    def __init__(self, name: str, node_dir: Path, watch: JobWatch,
                 probe: tuple[str, ...] = (), stamp: str = ""):
        self.name, self.node_dir, self.watch = name, node_dir, watch
        self.probe, self.stamp = probe, stamp
        self._code: int | None = None
        self._watcher = KeptWatcher(lambda: StepWatcher(
            [*self._srun(), *self.probe, "watch", str(self.node_dir), "--stamp", self.stamp,
             "--node", self.name], f"{self.name} (job {self.watch.job_id})"))

    def start(self) -> None:
        pass   # srun starts it, inside the job

    def lines(self) -> Iterator[str]:
        yield from follow(self.node_dir / AGENT_OUT, lambda: self.poll() is not None)

    def poll(self) -> int | None:
        if self._code is None:
            code = _read_code(self.node_dir / EXIT_FILE)
            if code is None and self.watch.final():
                # Look once more: the node may have written it just before the job ended.
                code = _read_code(self.node_dir / EXIT_FILE)
                code = ENDED_BY_SLURM if code is None else code
            self._code = code
        return self._code

    def signal(self, sig: int) -> None:
        self.watch.cancel(kill=sig == signal.SIGKILL)

    # ---- the hang watch (launcher/execute/watch.py) ---------------------------------------
    def _srun(self) -> list[str]:
        return ["srun", f"--jobid={self.watch.job_id}", "--overlap", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.name}", "--quiet"]

    def _probe(self, *args: str, timeout: float) -> Any:
        """launch_node/node_probe.py on the node, as a step of the running job that overlaps the
        job's own (srun --overlap: it needs no free resources)."""
        proc = slurm([*self._srun(), *self.probe, *args], timeout=timeout)
        if proc.returncode != 0:
            raise SlurmError(f"node probe on {self.name} (job {self.watch.job_id}) exited "
                             f"{proc.returncode}: {said(proc)[-300:]}")
        return json.loads(proc.stdout)

    def heartbeats(self) -> list[dict[str, Any]]:
        # The ranks write them into the node's folder, on the filesystem the nodes share with
        # launch (it reads their output and exit codes there too): read here, as the probe on
        # the node would read them, instead of a job step and an interpreter on the node every
        # look (srun, slurmstepd and node_probe.py: ~55 ms of a core, every 2 s per node).
        from launch_node.node_probe import read_heartbeats

        return read_heartbeats(self.node_dir)

    def activity(self) -> dict[str, Any]:
        return self._watcher.ask("activity")

    def close(self) -> None:
        """The node's watcher step, if one was started (the job's end would end it too)."""
        self._watcher.close()

    def dump_ranks(self, timeout: float) -> dict[str, Any]:
        return self._probe("dump", str(self.node_dir), "--stamp", self.stamp, "--timeout",
                           f"{timeout:g}", "--node", self.name, timeout=3 * timeout + 15)

    def kill_ranks(self, pids: list[int]) -> dict[str, Any]:
        return self._probe("kill", "--stamp", self.stamp, *map(str, pids), timeout=30)


class SlurmService:
    """A process of the batch script on the head, as the supervisor's service: the script
    itself (label "job": its own lines and srun's) or the rendezvous store (label "store").
    The script starts and stops them; one ends the run by itself only when the script wrote
    its `exit_file` (the store died while the agents ran: the script stops srun then)."""

    def __init__(self, head: str, label: str, output: Path, watch: JobWatch,
                 exit_file: Path | None = None):
        self.name, self.label, self.output, self.watch = head, label, output, watch
        self.exit_file = exit_file
        self.stopping = self.abandoned = False

    def start(self) -> None:
        pass

    def lines(self) -> Iterator[str]:
        yield from follow(self.output, lambda: self.abandoned or self.watch.final())

    def poll(self) -> int | None:
        code = _read_code(self.exit_file) if self.exit_file else None
        if code is not None:
            return code
        if not self.stopping:
            return None
        info = self.watch.info()
        return (0 if self.exit_file else exit_status(info.exit_code)) if info.final else None

    def signal(self, sig: int) -> None:
        # Asked to stop once every node has ended: the script stops its processes itself. At
        # the second ask (the grace period is over) launch stops following them; the job's
        # final state is still waited for and reported.
        self.abandoned = self.stopping
        self.stopping = True


def exit_status(exit_code: str) -> int:
    """Slurm's "code:signal" as a process status: 1:0 -> 1, 0:15 -> -15."""
    try:
        code, _, sig = exit_code.partition(":")
        return -int(sig) if sig and int(sig) else int(code)
    except ValueError:
        return 0


# ---- carrying out a run ------------------------------------------------------------------

# Filesystems on this machine's own disks or memory: compute nodes see them only if they are
# this machine (a one-box cluster) or something exports them.
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay",
                     "f2fs", "vfat", "exfat", "ntfs", "devtmpfs"}
FINAL_WAIT_S = 30.0   # for the job's processes to be gone once the run has ended
POLL_S = 0.2


def filesystem(path: Path) -> tuple[str, str]:
    """(mount point, type) of the filesystem holding `path`, from /proc/self/mounts."""
    best = ("/", "unknown")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    target = str(path)
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return best


def shared_filesystem_note(root: Path) -> str | None:
    """Says so when the run folder is on a disk of this machine."""
    mount, kind = filesystem(root)
    if kind not in LOCAL_FILESYSTEMS:
        return None
    return (f"the run folder is on {kind} mounted at {mount}, a filesystem of this machine: "
            "compute nodes see it only if they run on this machine (a one-box cluster such as "
            "`launch lab up --slurm`) or it is exported to them; on a cluster, put runs on the "
            "shared filesystem (--runs-dir in your home, on NFS or Lustre)")


def not_shared_error(root: Path, info: JobInfo) -> SlurmError:
    return SlurmError(
        f"{info.describe()} without writing anything into the run folder {root}: the compute "
        "nodes do not see it. The run folder must be on a filesystem the nodes share with "
        "this login node (your home, NFS, Lustre): pass --runs-dir there")


def submit(job: SlurmJob, stamp: str) -> str:
    """sbatch the job; its id. The run's stamp goes with the environment sbatch exports to the
    job, so that every process of it carries it (the node probes find them by it)."""
    proc = slurm(job.sbatch_argv(), timeout=60, env={STAMP_ENV: stamp})
    if proc.returncode != 0:
        raise SlurmError(f"sbatch refused the job ({where_conf()}): {said(proc)}")
    job_id = proc.stdout.strip().split(";")[0]   # --parsable: "id" or "id;cluster"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {said(proc)}")
    return job_id


def _interrupted_exit(signum: int) -> int:
    return 130 if signum == signal.SIGINT else 128 + signum


# What a job leaves in its run folder besides launch's own files: moved to attempts/<n>/ when
# `--resume` submits the next one (a node's old exit code would end the new attempt at once).
ATTEMPT_FILES = (SCRIPT_NAME, "slurm.json", JOB_OUT.format(job_id="*"), f"*/{AGENT_OUT}",
                 f"*/{EXIT_FILE}", f"*/{EXIT_FILE}.*", f"*/{STORE_OUT}", f"*/{STORE_EXIT}",
                 f"*/{SETUP_LOG}")


def run_job(job: SlurmJob, folder: RunFolder, options: LaunchOptions,
            recipe_file: str | None, recipe_text: str | None = None, *,
            shipped: Any = None) -> dict[str, Any]:
    """Submit, follow the job to its end (the workdir staged already: `shipped`, a
    launcher/workdir_sync.ShipStats); the summary, or RunFailed (logs kept) / SlurmError
    (exit 2: the job could not run at all)."""
    display = options.display or make_display()
    note = shared_filesystem_note(folder.root)
    if note:
        display.message(f"note: {note}")
    folder.write_json("code.json", snapshot(code_root(), folder.root / "code"))
    folder.keep_recipe(recipe_file or "", recipe_text)
    if shipped is not None:
        display.message(f"workdir {job.workdir.root}: {shipped.files_sent} of "
                        f"{shipped.files_total} file(s) shipped to {shipped.dest}, which every "
                        "node reads")
    (folder.root / SCRIPT_NAME).write_text(job.script())
    slurm_doc: dict[str, Any] = {"sbatch": job.sbatch_argv(), "script": SCRIPT_NAME}
    with StopRequest() as stop:
        try:
            job_id = submit(job, folder.stamp)
        except SlurmError as err:
            _record(folder, slurm_doc, None, "failed", str(err))
            raise
        slurm_doc["job_id"] = job_id
        folder.write_json("slurm.json", slurm_doc)
        watch = JobWatch(job_id)
        try:
            return _follow_job(job, folder, job_id, watch, stop, display, options, slurm_doc)
        except BaseException:
            # Whatever went wrong on this side, the job must not run on unwatched.
            if not watch.info(fresh=True).final:
                watch.cancel()
            raise


def _follow_job(job: SlurmJob, folder: RunFolder, job_id: str, watch: JobWatch, stop,
                display, options: LaunchOptions, slurm_doc: dict) -> dict[str, Any]:
    partition = job.settings.partition or "the default partition"
    display.message(f"submitted batch job {job_id} ({job.nnodes} node(s), {partition}); "
                    f"script {folder.root / SCRIPT_NAME}")
    info = _wait_for_start(watch, stop, display)
    if stop.signum is not None:
        return _never_ran(job, folder, watch, display, slurm_doc,
                          f"{interrupt_words(stop.signum)} while job {job_id} was "
                          f"{info.state}", _interrupted_exit(stop.signum))
    output = folder.root / JOB_OUT.format(job_id=job_id)
    if not info.nodelist:
        return _never_ran(job, folder, watch, display, slurm_doc,
                          f"{info.describe()} before it started", 1)
    if info.final and not output.exists():
        time.sleep(1.0)   # a shared filesystem may show a new file late
        if not output.exists():
            _record(folder, slurm_doc, watch.info(fresh=True), "failed")
            raise not_shared_error(folder.root, info)
    names = hostnames(info.nodelist)
    addresses = node_addresses(names)
    pairs = [(n, addresses[n]) for n in names]
    plan = job.run_plan(pairs)
    procs = [SlurmNodeProcess(n, folder.node_dir(n), watch, job.node.probe, folder.stamp)
             for n in names]
    head_dir = folder.node_dir(names[0])
    services = [SlurmService(names[0], "store", head_dir / STORE_OUT, watch,
                             head_dir / STORE_EXIT),
                SlurmService(names[0], "job", output, watch)]

    def after() -> None:
        for proc in procs:
            proc.close()   # the watcher steps, before the job's end is waited for
        final = watch.wait_final(FINAL_WAIT_S, stop=lambda: stop.count > 1)
        display.message(final.describe() if final.final else
                        f"{final.describe()}: still not ended {FINAL_WAIT_S:.0f} s after the "
                        f"run; `scancel {job_id}` or ask the cluster's admins")
        slurm_doc["final"] = final
        found = {}
        for name in names:
            first = _first_line(folder.node_dir(name) / AGENT_OUT)
            facts = node_facts(first) if first else None
            if facts:
                found[name] = facts
        folder.write_json("plan.json", job.run_plan(pairs, found).to_json())

    def extra() -> dict[str, Any]:
        final: JobInfo = slurm_doc.get("final") or watch.info()
        return {"slurm": {**final.to_json(), "sbatch": slurm_doc["sbatch"],
                          "script": SCRIPT_NAME}}

    try:
        return execute_plan(plan, folder, procs, display=display, after=after,
                            grace_s=options.grace_s, services=services, extra=extra)
    except RunFailed as err:
        final = slurm_doc.get("final") or watch.info()
        # A job that ran on nodes which cannot see the run folder ends without writing a
        # line there, however quickly launch saw it running: say so, whatever the nodes'
        # missing exit codes looked like (Slurm's ending took them for killed nodes).
        if final.final and not output.exists() and not any(
                folder.node_dir(n).joinpath(AGENT_OUT).exists() for n in names):
            error = not_shared_error(folder.root, final)
            _record(folder, slurm_doc, final, "failed", str(error))
            raise error from None
        why = ended_by_slurm(final, bool(watch.cancelled))
        if why:
            raise RunFailed(f"{why}\n{err}", exit_code=err.exit_code) from None
        raise
    finally:
        for proc in procs:
            proc.close()


# Final states in which Slurm, not a node of the run, ended the job; what each means.
SLURM_ENDINGS = {
    "TIMEOUT": "the job reached its time limit (--time / slurm.time, or the partition's)",
    "NODE_FAIL": "a node of the allocation failed",
    "PREEMPTED": "a job of higher priority preempted it",
    "OUT_OF_MEMORY": "a node ran out of memory",
    "DEADLINE": "the job reached its deadline",
    "BOOT_FAIL": "a node failed to boot",
}


def ended_by_slurm(info: JobInfo, cancelled_by_launch: bool) -> str | None:
    """Why the job ended, when neither a node nor launch ended it."""
    if info.state in SLURM_ENDINGS:
        return f"Slurm ended job {info.job_id} ({info.state}): {SLURM_ENDINGS[info.state]}."
    if info.state == "CANCELLED" and not cancelled_by_launch:
        return (f"job {info.job_id} was cancelled outside launch (scancel by you or the "
                "cluster's admins).")
    return None


def _wait_for_start(watch: JobWatch, stop, display) -> JobInfo:
    """Polls until the job runs (or ended, or launch is asked to stop), showing each new
    state (PENDING with Slurm's reason, RUNNING on its nodes)."""
    shown = ""
    while True:
        info = watch.info(fresh=True)
        text = info.describe()
        if text != shown:
            display.message(text)
            shown = text
        if info.running or stop.signum is not None:
            return info
        time.sleep(POLL_S)


def _first_line(path: Path) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.readline()
    except OSError:
        return ""


def _record(folder: RunFolder, slurm_doc: dict, info: JobInfo | None, status: str,
            reason: str = "", interrupted: bool = False) -> None:
    """summary.json of a run whose job never ran (or was never accepted)."""
    summary = {"run_id": folder.root.name, "status": status, "run_dir": str(folder.root),
               "slurm": {**(info.to_json() if info else {}), "sbatch": slurm_doc["sbatch"],
                         "script": SCRIPT_NAME}}
    if reason:
        summary["failure"] = {"reason": reason, "interrupted": interrupted}
    folder.write_json("summary.json", summary)


def _never_ran(job: SlurmJob, folder: RunFolder, watch: JobWatch, display, slurm_doc: dict,
               reason: str, code: int) -> dict[str, Any]:
    """The job ended or was cancelled before any node started."""
    watch.cancel()
    final = watch.wait_final(FINAL_WAIT_S)
    display.message(final.describe())
    folder.write_json("plan.json", job.to_json())
    _record(folder, slurm_doc, final, "interrupted" if code != 1 else "failed", reason,
            interrupted=code != 1)
    raise RunFailed(f"run {job.run_id} failed: {reason}; cancelled it. Script and summary kept "
                    f"in {folder.root}", exit_code=code)
