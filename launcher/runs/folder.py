"""The run folder `runs/<run_id>/`: plan.json, one folder per node, metrics and summary.

    runs/<run_id>/
      launch.json         who runs it: launch's pid and host, the run's process stamp
      plan.json           the exact plan that ran (argv and env per node)
      summary.json        status, world size, steps, images/s, final loss, eval accuracy
      metrics.jsonl       rank 0's logged steps (step, loss, images_per_sec, step_time_s, ...)
      <node>/node.log     every line the node printed, prefixed node/local_rank
      <node>/torchrun/    torchrun's per-rank stdout/stderr files
      <node>/nccl-debug.<host>.<pid>.log   NCCL_DEBUG=INFO output, one file per rank
      <node>/result.json  the trainer's final numbers (on the node that held rank 0)
      <node>/heartbeat/   each rank's last step (launch's hang watch reads them)
      <head>/checkpoints/ step-NNNNNNNN.pt + .json (recipe `checkpoint:`)
      hang/<node>.rank<r>.txt   every rank's stack and process state when the run hung
      recipe.yml          the recipe as it was when the run started (`--resume` reads it)
      attempts/<n>/       an earlier attempt's plan, summary and report (`--resume`)
      code.json           (-i runs) the hash of the code every node ran
      report.md/.json     interconnect, transports, bus bandwidth, communication share, advice
      bandwidth.*         (launch bench) the sweep as a table, JSON and a plot
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.names import RULES, check_name, path_component
from launcher.runs.schema import (MAX_RECORD, MAX_SMALL, LaunchRecord, ResultRecord,
                                SummaryRecord, read_record)
from launcher.core.yamlfile import MAX_BYTES as MAX_RECIPE

LAUNCH_FILE = "launch.json"
RECIPE_COPY = "recipe.yml"
STAMP_ENV = "LAUNCH_RUN_STAMP"  # in the environment of every process of a run
STOP_FILE = "stop.json"         # `launch stop` asked the run's controller to stop (who, when)
# What an attempt leaves at the top of the run folder; a resumed run moves them to
# attempts/<n>/ first. Node folders stay: their logs are appended to, their checkpoints and
# heartbeats are what the next attempt continues from.
ATTEMPT_FILES = ("plan.json", "summary.json", "report.md", "report.json", "report.html",
                 "metrics.jsonl", "progress.jsonl", "code.json", STOP_FILE, "handover.json",
                 "console.jsonl", "controller.json", "controller.log")
MAX_METRICS = 256 * safefile.MIB
# The one kind of FIFO a run folder holds: NCCL's flight recorder pipe on GPU ranks, where
# launcher/job/runplan.py points TORCH_NCCL_DEBUG_INFO_PIPE_FILE (<node>/hang/nccl-trace.rank<r>.pipe).
_FLIGHT_RECORDER = re.compile(r"[^/]+/hang/nccl-trace\.rank[0-9]+\.pipe")


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def new_run_id(prefix: str, now: datetime | None = None) -> str:
    """<prefix>-<date>-<time>-<hex>; the prefix (a recipe name) is cut so that the id stays a
    usable folder name however long the name."""
    now = now or datetime.now()
    return f"{prefix[:64]}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_run_id(run_id: str, what: str = "--run-id") -> str:
    return check_name("run id", run_id, what)


class RunFolder:
    """A run folder, and every file launch writes or reads in it: through launcher/core/safefile.py
    with the runs folder (the root's parent) as the trusted folder, so that nothing in the run
    folder, the root itself included, is followed if it is a link."""

    def __init__(self, root: Path, stamp: str = ""):
        self.root = root
        # Marks every process of this run (LAUNCH_RUN_STAMP): the run id plus a random token,
        # so that cleanup never reaches another run that happens to share the id.
        self.stamp = stamp

    @property
    def runs(self) -> Path:
        return self.root.parent

    @staticmethod
    def new_uid() -> str:
        return secrets.token_hex(4)

    @classmethod
    def uid_for(cls, runs_dir: str | Path, run_id: str, resume: bool) -> str:
        """The run's own id (kept in launch.json): a new one for a new run, the folder's for a
        resumed one. Node-side folders are named by it (launcher/backends/ssh/backend.py)."""
        if not resume:
            return cls.new_uid()
        return cls.existing(runs_dir, run_id).uid or cls.new_uid()

    @property
    def uid(self) -> str | None:
        try:
            return self.launch_record().uid
        except LauncherError:
            return None

    @classmethod
    def create(cls, runs_dir: str | Path, run_id: str, uid: str | None = None) -> RunFolder:
        check_run_id(run_id)
        runs = Path(runs_dir)
        if runs.exists() and not runs.is_dir():
            raise LauncherError(f"--runs-dir {runs} is a file, not a folder")
        root = runs.resolve() / run_id
        if root.exists() or root.is_symlink():
            raise LauncherError(f"run folder {root} already exists: pass another --run-id "
                                "(logs of earlier runs are never overwritten)")
        try:
            root.mkdir(parents=True)
        except FileExistsError:
            raise LauncherError(f"run folder {root} already exists: pass another --run-id "
                                "(logs of earlier runs are never overwritten)") from None
        except OSError as err:
            raise LauncherError(f"cannot create the run folder {root} (--runs-dir): "
                                f"{err.strerror or err}") from None
        folder = cls(root, f"{run_id}.{secrets.token_hex(8)}")
        folder.write_json(LAUNCH_FILE, folder._launch_doc(run_id, 1, uid or cls.new_uid()))
        return folder

    @classmethod
    def existing(cls, runs_dir: str | Path, run_id: str) -> RunFolder:
        """A run folder launch wrote earlier (for --resume); nothing is changed. A folder that
        is a link, or whose launch.json or plan.json is not a plain file, is refused."""
        check_run_id(run_id, "--resume")
        runs = Path(runs_dir).resolve()
        root = runs / run_id
        if root.is_symlink() or root.exists():
            safefile.check_folder(root, "run folder")   # a link, or not a folder: says so
            found = [safefile.lstat(root / n, within=runs) for n in (LAUNCH_FILE, "plan.json")]
            if all(info is not None for info in found):
                for name, info in zip((LAUNCH_FILE, "plan.json"), found):
                    if not stat.S_ISREG(info.st_mode):
                        raise LauncherError(f"--resume {run_id}: {root / name} is not a plain "
                                            "file (a link, FIFO, device or folder): not a run "
                                            "folder launch can continue")
                # The run goes on writing here (node logs, torchrun's, NCCL's, checkpoints,
                # stacks): nothing in it may lead elsewhere or block a writer.
                foreign = safefile.foreign_entries(root, within=runs, fifos=_FLIGHT_RECORDER)
                if foreign:
                    raise LauncherError(
                        f"--resume {run_id}: {root} holds what neither launch nor its trainer "
                        f"makes: {'; '.join(foreign[:5])}"
                        + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                        + ". Remove them (or copy the real files there) and resume again")
                return cls(root)
        known = sorted(name for name in _listing(runs)
                       if RULES["run id"].problem(name) is None
                       and safefile.is_file(runs / name / LAUNCH_FILE, within=runs))[-5:]
        hint = f" (runs there: {', '.join(known)})" if known else ""
        raise LauncherError(
            f"--resume {run_id}: no run folder {root} written by launch (launch.json and "
            f"plan.json, plain files); check the run id and --runs-dir{hint}")

    def _launch_doc(self, run_id: str, attempt: int, uid: str) -> dict[str, Any]:
        return {"run_id": run_id, "uid": uid, "stamp": self.stamp, "pid": os.getpid(),
                "host": socket.gethostname(), "started_at": _now(), "attempt": attempt}

    def launch_record(self) -> LaunchRecord:
        """launch.json as its schema (RunFileError naming the key when it is not)."""
        return read_record(LaunchRecord, self.root / LAUNCH_FILE, within=self.runs,
                           max_bytes=MAX_SMALL)

    def attempts(self) -> int:
        """The attempt launch.json records; 1 when it cannot be read (this is asked when a run
        ends, and must not cost the run its summary: --resume checks strictly first)."""
        try:
            return self.launch_record().attempt
        except LauncherError:
            return 1

    def begin_attempt(self, also: tuple[str, ...] = ()) -> int:
        """Move the previous attempt's files (and those matching the `also` patterns, relative
        to the folder: a backend's own, e.g. Slurm's per-node exit codes) to attempts/<n>/ and
        mark a new attempt, with a new process stamp and the run's uid kept. Returns the new
        attempt's number. Everything is moved inside the run folder (a planted link moves as
        the link it is, never followed)."""
        record = self.launch_record()
        previous = record.attempt
        keep = self.root / "attempts" / str(previous)
        safefile.make_dirs(keep, within=self.runs)
        for name in ATTEMPT_FILES:
            if safefile.lstat(self.root / name, within=self.runs) is not None:
                safefile.move(self.root / name, keep / name, within=self.runs)
        for pattern in also:
            for path in sorted(self.root.glob(pattern)):
                rel = path.relative_to(self.root)
                if rel.parts[0] != "attempts" and safefile.is_file(path, within=self.runs):
                    safefile.make_dirs((keep / rel).parent, within=self.runs)
                    safefile.move(path, keep / rel, within=self.runs)
        safefile.copy(self.root / LAUNCH_FILE, keep / LAUNCH_FILE, "launch", max_bytes=MAX_SMALL,
                      within=self.runs)
        self.stamp = f"{self.root.name}.{secrets.token_hex(8)}"
        self.write_json(LAUNCH_FILE, self._launch_doc(self.root.name, previous + 1,
                                                      record.uid or self.new_uid()))
        return previous + 1

    def attempt_base(self) -> int:
        """Where LAUNCH_ATTEMPT starts for this attempt: every earlier attempt (`--resume`)
        counts once, and so does every restart it made (its summary's restarts)."""
        base = 0
        for n in range(1, self.attempts()):
            base += 1
            try:
                summary = read_record(SummaryRecord, self.root / "attempts" / str(n) /
                                      "summary.json", within=self.runs)
            except LauncherError:
                continue
            base += sum(r.restarted for r in summary.restarts)
        return base

    @classmethod
    def for_launch(cls, runs_dir: str | Path, run_id: str, resume: bool = False,
                   uid: str | None = None, also: tuple[str, ...] = ()) -> RunFolder:
        """A new run folder, or (resume) the existing one with a new attempt begun (`also`:
        see begin_attempt)."""
        if not resume:
            return cls.create(runs_dir, run_id, uid)
        folder = cls.existing(runs_dir, run_id)
        folder.begin_attempt(also)
        return folder

    def keep_recipe(self, source: str, text: str | None = None) -> None:
        """A copy of the recipe the run started with, once (a resume keeps the first); `text`
        for a recipe that has no file (made from the command line)."""
        target = self.root / RECIPE_COPY
        try:
            if safefile.lstat(target, within=self.runs) is not None:
                return
            data = text.encode() if text is not None else \
                safefile.read_bytes(source, "recipe", max_bytes=MAX_RECIPE)
            safefile.write_bytes(target, data, within=self.runs)
        except LauncherError:
            pass   # a bundled recipe's name, or a recipe gone since it was read: no copy

    def stop_request(self) -> dict[str, Any] | None:
        """What `launch stop` wrote (launcher/pipeline/handover.py), if it asked."""
        import json

        try:
            data = json.loads(safefile.read_bytes(self.root / STOP_FILE, "stop request",
                                                  max_bytes=MAX_SMALL))
        except (LauncherError, ValueError):
            return None
        return data if isinstance(data, dict) else {}

    def node_dir(self, node: str) -> Path:
        return self.root / path_component(node, "node name")

    def node_log(self, node: str) -> Path:
        return self.node_dir(node) / "node.log"

    def write_json(self, name: str, data: Any, mode: int = 0o644) -> Path:
        return safefile.write_json(self.root / name, data, within=self.runs, mode=mode)

    def read(self, model, name: str, max_bytes: int = MAX_RECORD):
        """A file of the run folder as its schema (launcher/runs/schema.py)."""
        return read_record(model, self.root / name, within=self.runs, max_bytes=max_bytes)

    def trainer_result(self, nodes: list[str]) -> tuple[str | None, dict[str, Any]]:
        """The node that held rank 0 wrote result.json; c10d decides which node that is."""
        for node in nodes:
            path = self.node_dir(node) / "result.json"
            if safefile.lstat(path, within=self.runs) is not None:
                try:
                    record = read_record(ResultRecord, path, within=self.runs)
                except LauncherError:
                    return node, {}
                return node, record.model_dump(exclude_unset=True)
        return None, {}

    def gather_metrics(self, nodes: list[str]) -> Path | None:
        for node in nodes:
            src = self.node_dir(node) / "metrics.jsonl"
            if safefile.lstat(src, within=self.runs) is not None:
                try:
                    return safefile.copy(src, self.root / "metrics.jsonl", "metrics",
                                         max_bytes=MAX_METRICS, within=self.runs)
                except LauncherError:
                    return None   # the node's own file stays where it is
        return None


def _listing(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []

