"""The ledger: launch's local record of every AWS resource it asked for, per cluster.

`$LAUNCH_HOME/clusters/<cluster>/ledger.json` (LAUNCH_HOME defaults to ~/.launch). A record is
written *before* each creating call (state "requested", with the idempotency token) and updated
after it ("created" with the id, or "failed"), so a crash or Ctrl-C between the two still leaves a
trace that teardown and cleanup follow. AWS tags remain the other source of truth; the ledger adds
what tags cannot: resources whose creation was never confirmed, and clusters in other regions.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, ValidationError

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.home import cluster_dir, launch_home
from launcher.provision.plan import iso
from launcher.runs.schema import Number, Short, Text, Word

LIVE = ("requested", "created")
MAX_LEDGER = 16 * safefile.MIB   # thousands of resources and events are a few hundred KB
_MOVE_AWAY = ("move it away, then run `launch teardown` to find the cluster's resources by "
              "their tags")


class _Schema(BaseModel):
    model_config = ConfigDict(extra="allow")


class LedgerResource(_Schema):
    kind: Short
    id: Short | None = None
    state: Word
    run: Short | None = None


class LedgerEvent(_Schema):
    at: Short
    what: Text


class LedgerSchema(_Schema):
    """What launch reads of a ledger (the rest is kept as written)."""

    cluster: Short
    region: Short
    status: Word = "new"
    created_at: Short | None = None
    expires_at: Short | None = None
    inventory: Short | None = None
    instance_type: Short | None = None
    price_per_hour: Number | None = None
    resources: list[LedgerResource] = []
    events: list[LedgerEvent] = []


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
        """The ledger at `path` (None when there is none): a regular file of bounded size
        (launcher/core/safefile.py) whose every field launch reads has the type it expects."""
        try:
            data = safefile.read_json(path, "ledger", max_bytes=MAX_LEDGER)
        except safefile.UnsafeFile as err:
            if err.missing:
                return None
            raise LedgerError(f"{path}: cannot read the ledger: {err.why}; fix or "
                              f"{_MOVE_AWAY}") from None
        if not isinstance(data, dict):
            raise LedgerError(f"{path}: not a ledger launch wrote (expected an object with "
                              f"resources and events); {_MOVE_AWAY}")
        try:
            LedgerSchema.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            said = "missing" if err["type"] == "missing" else \
                err["msg"].removeprefix("Value error, ").replace("Input should be", "expected")
            raise LedgerError(f"{path}: {key}: {said}: not a ledger launch wrote; fix it or "
                              f"{_MOVE_AWAY}") from None
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
        # Write-then-rename (a fresh temporary file): an interrupted write never leaves half a
        # ledger behind, and a link planted in its place is replaced, not written through.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        safefile.write_json(self.path, self.data)

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
