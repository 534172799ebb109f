"""Finding a run wherever it lives, for `launch attach`, `logs`, `stop` and `fetch`: this
machine's record of a detached run (runs/<id>/detached.json, written when it was handed over),
else the backend the command line names (-i/--cluster: the controller host's runs; --slurm:
the shared run folder), else a run folder here (an attached run, or one already fetched)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from launcher.backends import backend_named
from launcher.commands.where import add_where_arguments, where_from_args
from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.table import printable
from launcher.runs.folder import LAUNCH_FILE, check_run_id


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID", help="the run's id (as `launch run` printed it)")
    p.add_argument("--runs-dir", default="runs",
                   help="where this machine keeps run folders (default: runs/)")
    add_where_arguments(p)


class Located:
    """A run: its backend and its home (launcher/execute/backend.py RunHome), or its folder
    here when it is not detached."""

    def __init__(self, run_id: str, backend=None, handle: dict | None = None,
                 home=None, folder: Path | None = None, where: str | None = None):
        self.run_id, self.backend, self.handle, self.home = run_id, backend, handle, home
        self.folder = folder
        # Where it would be looked for (a dry run connects to nothing to find it).
        self.where = where or (home.where if home is not None else "this machine")

    @property
    def detached(self) -> bool:
        return self.home is not None


def recorded(run_id: str, runs_dir: str) -> Located | None:
    """A run this machine handed over, from its record (runs/<id>/detached.json)."""
    local = Path(runs_dir).resolve() / run_id
    record = local / "detached.json"
    if not safefile.is_file(record, within=local.parent):
        return None
    try:
        handle = json.loads(safefile.read_bytes(record, "detached.json", max_bytes=1 << 20))
        backend = backend_named(handle["backend"], handle.get("settings") or {})
    except (ValueError, KeyError, TypeError) as err:
        raise LauncherError(f"{record}: not a record launch wrote ({err}); remove it, or "
                            "name where the run lives (-i/--cluster/--slurm)") from None
    return Located(run_id, backend, handle, backend.home(handle), local)


def locate(args, dry_run: bool = False) -> Located:
    run_id = check_run_id(args.run_id, "RUN_ID")
    local = Path(args.runs_dir).resolve() / run_id
    found = recorded(run_id, args.runs_dir)
    if found is not None:
        return found
    if where_from_args(args).given:
        from launcher.backends import backend_for

        backend = backend_for(where_from_args(args), 1, say=lambda _: None)
        if dry_run:
            return Located(run_id, backend, where=backend.controller_of(run_id))
        handle = backend.find_run(run_id, args.runs_dir)
        if handle is None:
            raise LauncherError(f"no run {printable(run_id)} on "
                                f"{backend.capabilities.controller}")
        return Located(run_id, backend, handle, backend.home(handle), None)
    if safefile.is_file(local / LAUNCH_FILE, within=local.parent):
        return Located(run_id, folder=local)
    raise LauncherError(f"no run {printable(run_id)} in {local.parent}: a detached run started "
                        "elsewhere is found with the flags that say where it runs "
                        "(-i INVENTORY, --cluster NAME, --slurm) or --runs-dir")


def read_json(raw: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
