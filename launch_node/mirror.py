"""Checkpoints mirrored off the node that writes them, to S3 or a shared folder, as they are
written; and brought back from there when the node's own copy is gone.

    python launch_node/mirror.py watch   FOLDER DEST --layout trainer|job [--status FILE]
    python launch_node/mirror.py restore FOLDER DEST --layout trainer|job
    python launch_node/mirror.py newest  DEST --layout trainer|job        (JSON)

DEST is `s3://bucket/prefix/<run>.<uid>` or a folder on a shared filesystem
(`/fsx/ckpt/<run>.<uid>`), one per run:

    DEST/run.json                        which run the mirror belongs to
    DEST/objects/<unit>/<version>/<file> a checkpoint's files, under a version of their own
    DEST/manifests/<unit>.json           written last, once every file of that version is there

A *unit* is one checkpoint: for the bundled trainer (`--layout trainer`) the pair
step-NNNNNNNN.pt/.json, taken once complete by launch_node/checkpoint_files.py's rule (the .json is
written last); for a job of the user's own (`--layout job`) each top-level entry of
LAUNCH_CHECKPOINT_DIR (a file or a folder), taken once it has settled: names starting with `.`
or ending in `.tmp` are skipped (write there, then rename), a file counts once no process has
it open for writing, and a folder once, besides, its files kept their size and time across two
looks (a sharded save adds its files one after the other).

A unit counts in the mirror only once its manifest exists, and the manifest is written after
every file of the unit is there (a multipart upload exists only once completed), so a mirror
killed at any point leaves either the whole checkpoint or one that is never chosen. Every
upload goes under a new version: a unit written again under the same name (a job that keeps
overwriting `last.pt`) never mixes an old and a new file; the old version is deleted after the
new manifest is in place. Units the node deleted (the trainer's `keep`, the job's own pruning)
are deleted from the mirror too, but only those older than a unit this process uploaded: a
mirror started on an empty folder (a replacement node) deletes nothing.

The watcher runs beside the job with a lower CPU priority (nice 10) and holds every file it
uploads open from the moment it picks it, so a checkpoint the trainer prunes meanwhile is still
uploaded whole. SIGTERM: the units ready by then are uploaded, then it exits (launch waits for
that when the run ends).

Imports only the standard library, and boto3 for s3:// destinations (the node's interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch_node import checkpoint_files  # noqa: E402

FORMAT = 1
MANIFESTS = "manifests"
OBJECTS = "objects"
RUN_FILE = "run.json"
STATUS_FILE = "mirror.json"
LAYOUTS = ("trainer", "job")
# S3: parts of 64 MiB (a multi-GB checkpoint in a few dozen parts; s3transfer raises the size
# itself past 10,000 parts), 4 at a time.
PART_BYTES = 64 << 20
CONCURRENCY = 4
NICE = 10
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_S3 = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?")


class MirrorError(Exception):
    """The mirror could not be read or written (bad destination, no access, a full disk)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


# ---- where the mirror is ------------------------------------------------------------------


class FolderStore:
    """A folder on a filesystem the nodes share (NFS, FSx): every write is a temp file,
    fsync and rename."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.url = root

    def _path(self, key: str) -> Path:
        return self.root / key

    def put_file(self, key: str, src: IO[bytes], size: int) -> None:
        def copy(out: IO[bytes]) -> None:
            # In the kernel (sendfile): the job's ranks share the node's cores with this copy.
            offset = 0
            while offset < size:
                sent = os.sendfile(out.fileno(), src.fileno(), offset, min(size - offset,
                                                                          64 << 20))
                if sent == 0:
                    raise MirrorError(f"{getattr(src, 'name', '?')} ended at {offset} of "
                                      f"{size} bytes while it was copied")
                offset += sent

        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_files.write_atomic(path, copy)

    def put_json(self, key: str, data: Any) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_files.write_json_atomic(path, data)

    def get_json(self, key: str) -> Any:
        try:
            return json.loads(self._path(key).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def keys(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.endswith(checkpoint_files.TMP_SUFFIX))

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except OSError:
            return None

    def get_file(self, key: str, dest: Path) -> None:
        with open(self._path(key), "rb") as src:
            checkpoint_files.write_atomic(dest, lambda out: shutil.copyfileobj(src, out,
                                                                                8 << 20))

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        for key in keys:  # the version folders left empty
            parent = self._path(key).parent
            while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    def abort_incomplete(self, prefix: str) -> int:
        """Temp files of a copy that never completed (its process was killed)."""
        base = self._path(prefix)
        gone = 0
        for path in base.rglob(f"*{checkpoint_files.TMP_SUFFIX}") if base.is_dir() else []:
            path.unlink(missing_ok=True)
            gone += 1
        return gone


class S3Store:
    """An S3 prefix, through boto3 (credentials, region and endpoint the usual AWS way: the
    node's instance profile, AWS_* variables, ~/.aws). Files go up with s3transfer's multipart
    upload, which makes the object exist only once every part is in."""

    def __init__(self, bucket: str, prefix: str, part_bytes: int = PART_BYTES,
                 concurrency: int = CONCURRENCY):
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
        except ImportError:
            raise MirrorError(f"boto3 is not installed beside {sys.executable}: the S3 mirror "
                              f"needs it on the node ({sys.executable} -m pip install boto3), "
                              "or mirror to a shared folder instead") from None
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = boto3.client("s3")
        self.config = TransferConfig(multipart_threshold=part_bytes,
                                     multipart_chunksize=part_bytes,
                                     max_concurrency=concurrency)

    def _key(self, key: str) -> str:
        return join(self.prefix, key)

    def _call(self, what: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as err:
            error = err.response.get("Error", {})
            raise MirrorError(f"{what} {self.url}: {error.get('Code', '?')}: "
                              f"{error.get('Message', err)}") from None
        except BotoCoreError as err:
            raise MirrorError(f"{what} {self.url}: {err}") from None

    def put_file(self, key: str, src: IO[bytes], size: int) -> None:
        self._call("upload to", self.client.upload_fileobj, src, self.bucket, self._key(key),
                   Config=self.config)

    def put_json(self, key: str, data: Any) -> None:
        body = (json.dumps(data, indent=2) + "\n").encode()
        self._call("write to", self.client.put_object, Bucket=self.bucket, Key=self._key(key),
                   Body=body, ContentType="application/json")

    def get_json(self, key: str) -> Any:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise MirrorError(f"read {self.url}/{key}: {err}") from None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def keys(self, prefix: str) -> list[str]:
        out = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(prefix) + "/")
        strip = len(self.prefix) + 1 if self.prefix else 0
        for page in self._call("list", lambda: list(pages)):
            out += [item["Key"][strip:] for item in page.get("Contents", [])]
        return sorted(out)

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket,
                                           Key=self._key(key))["ContentLength"]
        except ClientError:
            return None

    def get_file(self, key: str, dest: Path) -> None:
        tmp = dest.with_name(dest.name + checkpoint_files.TMP_SUFFIX)
        self._call("download from", self.client.download_file, self.bucket, self._key(key),
                   str(tmp), Config=self.config)
        os.replace(tmp, dest)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start:start + 1000]]
            self._call("delete in", self.client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": batch, "Quiet": True})

    def abort_incomplete(self, prefix: str) -> int:
        """Multipart uploads of a mirror process that was killed mid-upload: their parts are
        billed until aborted. One process writes a run's mirror, so any found at its start is
        a dead predecessor's."""
        found = self._call("list uploads in", self.client.list_multipart_uploads,
                           Bucket=self.bucket, Prefix=self._key(prefix) + "/")
        uploads = found.get("Uploads", [])
        for upload in uploads:
            self._call("abort an upload in", self.client.abort_multipart_upload,
                       Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        return len(uploads)


def mirror_problem(value: str) -> str | None:
    """Why `checkpoint.mirror` cannot be used, or None."""
    if not value or len(value) > 1024 or _CONTROL.search(value):
        return "expected s3://BUCKET/PREFIX or an absolute folder, without control characters"
    try:
        parse_dest(value)
    except MirrorError as err:
        return str(err)
    return None


def parse_dest(dest: str) -> tuple[str, str, str]:
    """("s3", bucket, prefix) or ("folder", path, ""); MirrorError saying why not."""
    if dest.startswith("s3://"):
        match = _S3.fullmatch(dest)
        bucket = dest[5:].split("/", 1)[0]
        if match is None or ".." in bucket:
            raise MirrorError(f"{dest}: {bucket or '(no bucket)'} is not an S3 bucket name "
                              "(3-63 lowercase letters, digits, '.' and '-')")
        return "s3", match.group(1), match.group(2) or ""
    if "://" in dest:
        raise MirrorError(f"{dest}: only s3:// URLs and folders are mirrors")
    if not dest.startswith("/"):
        raise MirrorError(f"{dest}: a folder mirror is an absolute path that every node mounts "
                          "at the same place (/fsx/checkpoints, an NFS share); or "
                          "s3://BUCKET/PREFIX")
    return "folder", dest, ""


def store_for(dest: str, **s3: Any) -> FolderStore | S3Store:
    kind, where, prefix = parse_dest(dest)
    return S3Store(where, prefix, **s3) if kind == "s3" else FolderStore(where)


# ---- what a checkpoint is ------------------------------------------------------------------


@dataclass
class Unit:
    """One checkpoint ready on the node: its name, its files (relative to the folder), how it
    sorts (the trainer's step; a job's newest file time), each file's (path, size, mtime_ns)
    and, for the trainer, what it was written under (its .json)."""

    name: str
    files: list[str]
    order: float
    signature: tuple = ()
    meta: dict[str, Any] | None = None


def _signature(folder: Path, files: list[str]) -> tuple:
    out = []
    for path in files:
        st = (folder / path).stat()
        out.append((path, st.st_size, st.st_mtime_ns))
    return tuple(out)


def trainer_units(folder: Path) -> dict[str, Unit]:
    out = {}
    for found in checkpoint_files.complete(folder):
        stem = checkpoint_files.stem(found.step)
        files = [f"{stem}.pt", f"{stem}.json"]
        try:
            out[stem] = Unit(stem, files, float(found.step), _signature(folder, files),
                             found.meta)
        except OSError:
            continue  # pruned meanwhile
    return out


_TRAINER_FILE = re.compile(r"(step-\d{8,})\.(pt|json)")


def present_units(folder: Path, layout: str) -> set[str]:
    """Units the folder still holds in any form (a pruning in progress counts as present)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    if layout == "trainer":
        return {m.group(1) for m in map(_TRAINER_FILE.fullmatch, names) if m}
    return {n for n in names if not _skipped(n)}


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(checkpoint_files.TMP_SUFFIX)


def entry_files(folder: Path, name: str) -> list[str]:
    top = folder / name
    if top.is_file():
        return [name]
    return sorted(str(p.relative_to(folder)) for p in top.rglob("*")
                  if p.is_file() and not any(_skipped(part) for part in
                                             p.relative_to(folder).parts))


def open_for_writing(folder: Path) -> set[str]:
    """Files under `folder` some process holds open for writing (/proc/<pid>/fdinfo flags),
    as paths relative to it: a checkpoint still being written, whatever its name."""
    root = str(folder.resolve())
    busy = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if not target.startswith(root + "/"):
                continue
            try:
                flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1]
                            .split()[0], 8)
            except (OSError, IndexError, ValueError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                busy.add(os.path.relpath(target, root))
    return busy


class JobUnits:
    """A job's checkpoints: the entries of its folder that have settled. `mirrored(name,
    signature)`: already in the mirror as it is (not looked at further: the look through
    /proc is for new ones only)."""

    def __init__(self, mirrored: Callable[[str, tuple], bool] = lambda name, sig: False):
        self._seen: dict[str, tuple] = {}
        self.mirrored = mirrored

    def __call__(self, folder: Path) -> dict[str, Unit]:
        looked: dict[str, tuple] = {}
        for name in sorted(present_units(folder, "job")):
            try:
                looked[name] = _signature(folder, entry_files(folder, name))
            except OSError:
                continue  # changing under our feet: the next look
        # A file is whole once closed; a folder may still be getting files.
        stable = [n for n, sig in looked.items() if sig and not self.mirrored(n, sig)
                  and ((folder / n).is_file() or self._seen.get(n) == sig)]
        busy = open_for_writing(folder) if stable else set()
        self._seen = looked
        out = {}
        for name in stable:
            files = [path for path, _, _ in looked[name]]
            if any(f in busy for f in files):
                continue
            newest = max(mtime for _, _, mtime in looked[name]) / 1e9
            out[name] = Unit(name, files, newest, looked[name])
        return out


# ---- the mirror's own records --------------------------------------------------------------


def manifest_key(unit: str) -> str:
    return join(MANIFESTS, f"{unit}.json")


def complete_units(store) -> dict[str, dict[str, Any]]:
    """The units whose manifest exists and names every file it promises, by name."""
    out = {}
    for key in store.keys(MANIFESTS):
        if not key.endswith(".json"):
            continue
        manifest = store.get_json(key)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            continue
        out[manifest["unit"]] = manifest
    return out


def newest(store) -> dict[str, Any] | None:
    units = complete_units(store)
    return max(units.values(), key=lambda m: (m["order"], m["unit"])) if units else None


def object_key(unit: str, version: str, path: str) -> str:
    return join(OBJECTS, unit, version, path)


@dataclass
class Status:
    """What the watcher did, for the run's summary (mirror.json in the node's folder)."""

    dest: str
    layout: str
    uploaded: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    aborted_uploads: int = 0

    def to_json(self) -> dict[str, Any]:
        seconds = [u["seconds"] for u in self.uploaded]
        return {"dest": self.dest, "layout": self.layout, "units": len(self.uploaded),
                "bytes": sum(u["bytes"] for u in self.uploaded),
                "upload_s_per_unit": round(sum(seconds) / len(seconds), 3) if seconds else None,
                "last": self.uploaded[-1] if self.uploaded else None,
                "uploaded": self.uploaded[-50:], "deleted": self.deleted[-50:],
                "failures": self.failures[-20:], "aborted_uploads": self.aborted_uploads}


class Mirror:
    """Uploads the ready units of one folder, newest first, and keeps the mirror's set equal
    to the folder's."""

    def __init__(self, folder: Path, store, layout: str, status: Status,
                 say=lambda text: print(text, flush=True)):
        self.folder, self.store, self.layout, self.status = folder, store, layout, status
        self.say = say
        self.mirrored = complete_units(store)
        self.units = trainer_units if layout == "trainer" else \
            JobUnits(lambda name, sig: not self._changed(Unit(name, [], 0.0, sig)))
        self.newest_uploaded: float | None = None

    def pass_once(self) -> int:
        """Upload what is ready and not mirrored yet; returns the number uploaded."""
        ready = self.units(self.folder)
        pending = [u for u in ready.values() if self._changed(u)]
        done = 0
        for unit in sorted(pending, key=lambda u: (u.order, u.name), reverse=True):
            if self.upload(unit):
                done += 1
        self.forget_deleted()
        return done

    def _changed(self, unit: Unit) -> bool:
        manifest = self.mirrored.get(unit.name)
        return manifest is None or manifest.get("signature") != _as_lists(unit.signature)

    def upload(self, unit: Unit) -> bool:
        t0 = time.monotonic()
        version = secrets.token_hex(6)
        handles: list[tuple[str, IO[bytes]]] = []
        try:
            # Every file opened first: one pruned from now on still uploads whole.
            for path in unit.files:
                handles.append((path, open(self.folder / path, "rb")))
            sizes = {path: os.fstat(f.fileno()).st_size for path, f in handles}
            for path, f in handles:
                self.store.put_file(object_key(unit.name, version, path), f, sizes[path])
            seconds = time.monotonic() - t0
            manifest = {"format": FORMAT, "unit": unit.name, "version": version,
                        "files": [{"path": p, "bytes": sizes[p]} for p in unit.files],
                        "bytes": sum(sizes.values()), "order": unit.order,
                        "signature": _as_lists(unit.signature), "meta": unit.meta,
                        "uploaded_s": round(seconds, 3), "completed_at": _now(),
                        "node": os.environ.get("LAUNCH_NODE")}
            self.store.put_json(manifest_key(unit.name), manifest)
        except FileNotFoundError:
            return False  # gone before it could be taken: the next look decides
        except (MirrorError, OSError) as err:
            self.failed(f"{unit.name}: {err}")
            return False
        finally:
            for _, f in handles:
                f.close()
        previous = self.mirrored.get(unit.name)
        self.mirrored[unit.name] = manifest
        self.newest_uploaded = max(self.newest_uploaded or unit.order, unit.order)
        if previous is not None:
            self._drop_objects(unit.name, keep=version)
        self.status.uploaded.append({"unit": unit.name, "bytes": manifest["bytes"],
                                     "seconds": manifest["uploaded_s"],
                                     "completed_at": manifest["completed_at"]})
        self.say(f"mirror: {unit.name} ({manifest['bytes'] / 1e6:.1f} MB) in {self.store.url} "
                 f"after {seconds:.2f}s")
        return True

    def forget_deleted(self) -> None:
        """Units the node deleted, once something newer was uploaded by this process (so
        never the mirror's newest because the folder is empty: a replacement node)."""
        if self.newest_uploaded is None:
            return
        present = present_units(self.folder, self.layout)
        for name, manifest in list(self.mirrored.items()):
            if name in present or manifest["order"] >= self.newest_uploaded:
                continue
            try:
                self.store.delete([manifest_key(name)])
                self._drop_objects(name, keep=None)
            except MirrorError as err:
                self.failed(f"deleting {name}: {err}")
                continue
            del self.mirrored[name]
            self.status.deleted.append(name)

    def _drop_objects(self, unit: str, keep: str | None) -> None:
        prefix = join(OBJECTS, unit)
        stale = [k for k in self.store.keys(prefix)
                 if keep is None or not k.startswith(join(prefix, keep) + "/")]
        if stale:
            self.store.delete(stale)

    def failed(self, text: str) -> None:
        self.status.failures.append(text)
        self.say(f"mirror: could not mirror {text}")


def _as_lists(signature: tuple) -> list[list[Any]]:
    return [list(item) for item in signature]


# ---- the commands --------------------------------------------------------------------------


def write_status(path: Path | None, status: Status) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint_files.write_json_atomic(path, status.to_json())


def watch(folder: Path, dest: str, layout: str, status_file: Path | None,
          interval: float = 1.0, retry_s: float = 10.0) -> int:
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        os.nice(NICE)   # the job's ranks come first
    except OSError:
        pass
    store = store_for(dest)
    status = Status(store.url, layout)
    status.aborted_uploads = store.abort_incomplete(OBJECTS)
    mirror = Mirror(folder, store, layout, status)
    print(f"mirror: watching {folder} -> {store.url}"
          + (f" ({status.aborted_uploads} unfinished upload(s) of an earlier process "
             "aborted)" if status.aborted_uploads else ""), flush=True)
    write_status(status_file, status)
    drain = 2   # looks after SIGTERM: a folder unit settles over two
    while True:
        last = bool(stop) and (drain := drain - 1) <= 0
        failures = len(status.failures)
        try:
            uploaded = mirror.pass_once()
        except (MirrorError, OSError) as err:  # the store or the disk: try again later
            mirror.failed(str(err))
            uploaded = 0
        failed = len(status.failures) != failures
        if uploaded or failed:
            write_status(status_file, status)
        if last:
            break
        stopped = bool(stop)   # a SIGTERM during the wait ends it; after one, waits are whole
        deadline = time.monotonic() + (interval if stopped or not failed else retry_s)
        while time.monotonic() < deadline and bool(stop) == stopped:
            time.sleep(0.2)
    write_status(status_file, status)
    print(f"mirror: stopped; {len(status.uploaded)} checkpoint(s) mirrored", flush=True)
    return 0


def restore(folder: Path, dest: str, layout: str, run: dict[str, Any] | None = None) -> int:
    """Bring the mirror's checkpoints the folder lacks back into it (the trainer: the newest,
    when it is newer than the folder's newest; a job: every unit missing by name). With
    `run`, first writes run.json unless there: the mirror is checked writable before the
    job starts."""
    store = store_for(dest)
    if run is not None and store.get_json(RUN_FILE) is None:
        store.put_json(RUN_FILE, {**run, "created_at": _now()})
    units = complete_units(store)
    if layout == "trainer":
        local = checkpoint_files.latest(folder)
        best = max(units.values(), key=lambda m: m["order"]) if units else None
        wanted = [best] if best and (local is None or best["order"] > local.step) else []
    else:
        present = present_units(folder, layout)
        wanted = [m for m in units.values() if m["unit"] not in present]
    for manifest in sorted(wanted, key=lambda m: m["order"]):
        t0 = time.monotonic()
        fetch(store, manifest, folder)
        print(f"mirror: restored {manifest['unit']} ({manifest['bytes'] / 1e6:.1f} MB) from "
              f"{store.url} in {time.monotonic() - t0:.2f}s", flush=True)
    return 0


def fetch(store, manifest: dict[str, Any], folder: Path) -> None:
    """The unit's files into `folder`, each whole (temp name, rename), with the times they
    had (so the watcher there takes them for the mirrored ones, not new ones); for the
    trainer the .json last, so the checkpoint is complete only once its state is in place."""
    files = sorted(manifest["files"], key=lambda f: f["path"].endswith(".json"))
    for item in files:
        key = object_key(manifest["unit"], manifest["version"], item["path"])
        if store.size(key) != item["bytes"]:
            raise MirrorError(f"{store.url}: {key} is missing or not {item['bytes']} bytes "
                              "as its manifest says")
    mtimes = {path: mtime for path, _, mtime in manifest.get("signature") or []}
    for item in files:
        target = folder / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(object_key(manifest["unit"], manifest["version"], item["path"]), target)
        if item["path"] in mtimes:
            os.utime(target, ns=(mtimes[item["path"]], mtimes[item["path"]]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("watch", "restore"):
        cmd = sub.add_parser(name)
        cmd.add_argument("folder", type=Path)
        cmd.add_argument("dest")
        cmd.add_argument("--layout", choices=LAYOUTS, required=True)
    sub.choices["watch"].add_argument("--status", type=Path)
    sub.choices["watch"].add_argument("--interval", type=float, default=1.0)
    sub.choices["restore"].add_argument("--run-json", help="what run.json says, if not there")
    nw = sub.add_parser("newest")
    nw.add_argument("dest")
    args = p.parse_args(argv)
    try:
        if args.what == "watch":
            return watch(args.folder, args.dest, args.layout, args.status, args.interval)
        if args.what == "restore":
            return restore(args.folder, args.dest, args.layout,
                           json.loads(args.run_json) if args.run_json else None)
        print(json.dumps(newest(store_for(args.dest))))
        return 0
    except MirrorError as err:
        print(f"mirror: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
