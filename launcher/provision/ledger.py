"""The ledger: launch's local record of every AWS resource it asked for, per cluster.

`$LAUNCH_HOME/clusters/<cluster>/ledger.json` (LAUNCH_HOME defaults to ~/.launch). A record is
written *before* each creating call (state "requested", with the idempotency token) and updated
after it ("created" with the id, or "failed"), so a crash or Ctrl-C between the two still leaves a
trace that teardown and cleanup follow. AWS tags remain the other source of truth; the ledger adds
what tags cannot: resources whose creation was never confirmed, and clusters in other regions.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from launcher.errors import LauncherError
from launcher.home import cluster_dir, launch_home
from launcher.provision.plan import iso

LIVE = ("requested", "created")


class LedgerError(LauncherError):
    pass


def now_iso() -> str:
    return iso(datetime.now(timezone.utc))


class Ledger:
    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data

    # ---- files ------------------------------------------------------------------------------
    @classmethod
    def path_for(cls, cluster: str, home: Path | None = None) -> Path:
        return cluster_dir(cluster, home) / "ledger.json"

    @classmethod
    def load(cls, cluster: str, home: Path | None = None) -> "Ledger | None":
        return cls.read(cls.path_for(cluster, home))

    @classmethod
    def read(cls, path: Path) -> "Ledger | None":
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise LedgerError(f"{path}: cannot read the ledger ({err}); move it away, then run "
                              "`launch teardown` to find the cluster's resources by their "
                              "tags") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise LedgerError(
                f"{path}: the ledger is not valid JSON ({err}); fix or move it away, then run "
                "`launch teardown` to find the cluster's resources by their tags"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("resources", []), list) \
                or not isinstance(data.get("events", []), list):
            raise LedgerError(
                f"{path}: not a ledger launch wrote (expected an object with resources and "
                "events); move it away, then run `launch teardown` to find the cluster's "
                "resources by their tags")
        return cls(path, data)

    @classmethod
    def open(cls, cluster: str, region: str, home: Path | None = None) -> "Ledger":
        """The cluster's ledger, created when missing. A ledger of a torn-down cluster restarts."""
        ledger = cls.load(cluster, home)
        if ledger is None or ledger.status == "deleted":
            ledger = cls(cls.path_for(cluster, home), {
                "cluster": cluster, "region": region, "status": "new", "created_at": None,
                "resources": [], "events": [],
            })
        return ledger

    @classmethod
    def all(cls, home: Path | None = None) -> list["Ledger"]:
        root = (home or launch_home()) / "clusters"
        found = [cls.read(p) for p in sorted(root.glob("*/ledger.json"))]
        return [ledger for ledger in found if ledger is not None]

    def save(self) -> None:
        # Write-then-rename: an interrupted write never leaves half a ledger behind.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, self.path)

    @contextmanager
    def locked(self) -> Iterator["Ledger"]:
        """Hold the cluster's lock: two launch processes never change one cluster at once."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LedgerError(
                    f"another launch process is working on cluster {self.cluster} "
                    f"(lock {self.path.parent / '.lock'}); wait for it to finish"
                ) from None
            try:
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ---- fields -----------------------------------------------------------------------------
    @property
    def cluster(self) -> str:
        return self.data["cluster"]

    @property
    def region(self) -> str:
        return self.data["region"]

    @property
    def status(self) -> str:
        return self.data.get("status", "new")

    @property
    def resources(self) -> list[dict[str, Any]]:
        return self.data.setdefault("resources", [])

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def event(self, text: str) -> None:
        self.data.setdefault("events", []).append({"at": now_iso(), "what": text})
        self.save()

    # ---- resources --------------------------------------------------------------------------
    def intend(self, kind: str, run: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, "id": None, "state": "requested", "run": run,
                  "requested_at": now_iso(), **fields}
        self.resources.append(record)
        self.save()
        return record

    def created(self, record: dict[str, Any], resource_id: str, **fields: Any) -> None:
        record.update(id=resource_id, state="created", created_at=now_iso(), **fields)
        self.save()

    def add_created(self, kind: str, resource_id: str, run: str, **fields: Any) -> None:
        """A resource that came into being as part of another request (an instance of a launch)."""
        self.resources.append({"kind": kind, "id": resource_id, "state": "created", "run": run,
                               "created_at": now_iso(), **fields})
        self.save()

    def failed(self, record: dict[str, Any], why: str) -> None:
        record.update(state="failed", why=why)
        self.save()

    def deleted(self, kind: str, resource_id: str) -> None:
        for record in self.resources:
            if record["kind"] == kind and record["id"] == resource_id and \
                    record["state"] in LIVE:
                record.update(state="deleted", deleted_at=now_iso())
        self.save()

    def settle(self, record: dict[str, Any], state: str) -> None:
        record.update(state=state, deleted_at=now_iso())
        self.save()

    def live(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.resources
                if r["state"] in LIVE and (kind is None or r["kind"] == kind)]

    def live_ids(self, kind: str) -> list[str]:
        return [r["id"] for r in self.live(kind) if r["id"]]
