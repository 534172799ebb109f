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
      report.html         the same report as a page with plots (launcher/report_html.py)
      bandwidth.*         (launch bench) the sweep as a table, JSON and a plot
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.errors import LauncherError
from launcher.names import path_component
from launcher.yamlfile import shorten

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LAUNCH_FILE = "launch.json"
RECIPE_COPY = "recipe.yml"
STAMP_ENV = "LAUNCH_RUN_STAMP"  # in the environment of every process of a run
# What an attempt leaves at the top of the run folder; a resumed run moves them to
# attempts/<n>/ first. Node folders stay: their logs are appended to, their checkpoints and
# heartbeats are what the next attempt continues from.
ATTEMPT_FILES = ("plan.json", "summary.json", "report.md", "report.json", "report.html",
                 "metrics.jsonl", "progress.jsonl", "code.json")


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def new_run_id(prefix: str, now: datetime | None = None) -> str:
    """<prefix>-<date>-<time>-<hex>; the prefix (a recipe name) is cut so that the id stays a
    usable folder name however long the name."""
    now = now or datetime.now()
    return f"{prefix[:64]}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise LauncherError(
            f"--run-id {shorten(run_id)}: use up to 128 letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (it names the run folder and the rendezvous)"
        )
    return run_id


class RunFolder:
    def __init__(self, root: Path, stamp: str = ""):
        self.root = root
        # Marks every process of this run (LAUNCH_RUN_STAMP): the run id plus a random token,
        # so that cleanup never reaches another run that happens to share the id.
        self.stamp = stamp

    @staticmethod
    def new_uid() -> str:
        return secrets.token_hex(4)

    @classmethod
    def uid_for(cls, runs_dir: str | Path, run_id: str, resume: bool) -> str:
        """The run's own id (kept in launch.json): a new one for a new run, the folder's for a
        resumed one. Node-side folders are named by it (launcher/backends/ssh.py)."""
        if not resume:
            return cls.new_uid()
        return cls.existing(runs_dir, run_id).uid or cls.new_uid()

    @property
    def uid(self) -> str | None:
        try:
            value = json.loads((self.root / LAUNCH_FILE).read_text()).get("uid")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{8}", value) else None

    @classmethod
    def create(cls, runs_dir: str | Path, run_id: str, uid: str | None = None) -> RunFolder:
        check_run_id(run_id)
        runs = Path(runs_dir)
        if runs.exists() and not runs.is_dir():
            raise LauncherError(f"--runs-dir {runs} is a file, not a folder")
        root = runs.resolve() / run_id
        if root.exists():
            raise LauncherError(f"run folder {root} already exists: pass another --run-id "
                                "(logs of earlier runs are never overwritten)")
        try:
            root.mkdir(parents=True)
        except OSError as err:
            raise LauncherError(f"cannot create the run folder {root} (--runs-dir): "
                                f"{err.strerror or err}") from None
        folder = cls(root, f"{run_id}.{secrets.token_hex(8)}")
        folder.write_json(LAUNCH_FILE, {"run_id": run_id, "uid": uid or cls.new_uid(),
                                        "stamp": folder.stamp, "pid": os.getpid(),
                                        "host": socket.gethostname(), "started_at": _now(),
                                        "attempt": 1})
        return folder

    @classmethod
    def existing(cls, runs_dir: str | Path, run_id: str) -> RunFolder:
        """A run folder launch wrote earlier (for --resume); nothing is changed."""
        check_run_id(run_id)
        runs = Path(runs_dir).resolve()
        root = runs / run_id
        if not (root / LAUNCH_FILE).is_file() or not (root / "plan.json").is_file():
            known = sorted(p.parent.name for p in runs.glob("*/launch.json"))[-5:]
            hint = f" (runs there: {', '.join(known)})" if known else ""
            raise LauncherError(
                f"--resume {run_id}: no run folder {root} written by launch (launch.json and "
                f"plan.json); check the run id and --runs-dir{hint}")
        return cls(root)

    def attempts(self) -> int:
        try:
            return int(json.loads((self.root / LAUNCH_FILE).read_text()).get("attempt", 1))
        except (OSError, ValueError, AttributeError):
            return 1

    def begin_attempt(self, also: tuple[str, ...] = ()) -> int:
        """Move the previous attempt's files (and those matching the `also` patterns, relative
        to the folder: a backend's own, e.g. Slurm's per-node exit codes) to attempts/<n>/ and
        mark a new attempt, with a new process stamp. Returns the new attempt's number."""
        previous = self.attempts()
        keep = self.root / "attempts" / str(previous)
        keep.mkdir(parents=True, exist_ok=True)
        for name in ATTEMPT_FILES:
            if (self.root / name).exists():
                (self.root / name).replace(keep / name)
        for pattern in also:
            for path in sorted(self.root.glob(pattern)):
                if path.is_file() and not path.is_symlink() and \
                        path.relative_to(self.root).parts[0] != "attempts":
                    target = keep / path.relative_to(self.root)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    path.replace(target)
        shutil.copy2(self.root / LAUNCH_FILE, keep / LAUNCH_FILE)
        uid = self.uid or self.new_uid()
        self.stamp = f"{self.root.name}.{secrets.token_hex(8)}"
        self.write_json(LAUNCH_FILE, {"run_id": self.root.name, "uid": uid,
                                      "stamp": self.stamp, "pid": os.getpid(),
                                      "host": socket.gethostname(), "started_at": _now(),
                                      "attempt": previous + 1})
        return previous + 1

    def attempt_base(self) -> int:
        """Where LAUNCH_ATTEMPT starts for this attempt: every earlier attempt (`--resume`)
        counts once, and so does every restart it made (its summary's restarts)."""
        base = 0
        for n in range(1, self.attempts()):
            base += 1
            try:
                summary = json.loads((self.root / "attempts" / str(n) / "summary.json")
                                     .read_text())
                base += len(summary.get("restarts") or [])
            except (OSError, ValueError, AttributeError, TypeError):
                continue
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
        if target.exists():
            return
        try:
            if text is not None:
                target.write_text(text)
            elif Path(source).is_file():
                shutil.copyfile(source, target)
        except OSError:
            pass

    def node_dir(self, node: str) -> Path:
        return self.root / path_component(node, "node name")

    def node_log(self, node: str) -> Path:
        return self.node_dir(node) / "node.log"

    def write_json(self, name: str, data: Any) -> Path:
        path = self.root / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
        return path

    def trainer_result(self, nodes: list[str]) -> tuple[str | None, dict[str, Any]]:
        """The node that held rank 0 wrote result.json; c10d decides which node that is."""
        for node in nodes:
            path = self.node_dir(node) / "result.json"
            if path.exists():
                try:
                    return node, json.loads(path.read_text())
                except json.JSONDecodeError:
                    return node, {}
        return None, {}

    def gather_metrics(self, nodes: list[str]) -> Path | None:
        for node in nodes:
            src = self.node_dir(node) / "metrics.jsonl"
            if src.exists():
                dst = self.root / "metrics.jsonl"
                shutil.copyfile(src, dst)
                return dst
        return None
