"""The receiving side of a workdir ship: a content-addressed cache per node, and the run's own
copy built from it. Standard library only, Python 3.10+: launch is not installed on nodes, so
launcher/workdir_sync.py sends this file's text to the node's interpreter (`python -c SOURCE
serve DEST CACHE`); shipping to this machine or to Slurm's shared folder imports it instead,
so every backend runs the same code.

    CACHE/
      lock               flock(2): shared while a ship runs, exclusive to prune
      objects/ab/cd...   one read-only file per content (sha256), complete or absent
      tmp/               objects being received: a dropped ship leaves one here
      states/<digest>    the objects one shipped folder state used, newest first when pruning

Why copies, never hard links: the run's folder is the job's to change. A job that rewrites or
truncates a shipped file in place would, through a hard link, rewrite the cached object, and
with it what every later run gets, and the file of a concurrent run holding the same inode;
detecting that later by stat is too late for the concurrent run. So DEST gets its own files,
copied with copy_file_range(2): a reflink (copy-on-write, free) where the file system has them
(XFS, btrfs, NFS 4.2 server-side), an in-kernel copy elsewhere. Objects are never handed out:
nothing but this program opens them.

Why flock: two launches may ship to one node at once. Objects appear by rename(2) of a fully
written and verified temporary file, so writers never see half an object and two writers of
the same object write the same bytes. What must not run beside a ship is pruning (it deletes
objects a ship has just counted as present): ships hold the lock shared from the first look
at the cache to the last copy, pruning takes it exclusively and only when it is free. A ship
killed midway (connection dropped) leaves only a temporary file, which pruning removes; the
lock goes with the process.

The client is not trusted blindly: every path is relative, without `.`, `..` or empty parts,
under a folder the manifest lists; files are created with O_EXCL|O_NOFOLLOW through folder
descriptors opened with O_NOFOLLOW, so nothing is ever written through a symbolic link; link
targets must resolve inside DEST; every object's sha256 is checked as it is received.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import struct
import sys
import time
from collections import OrderedDict

MAGIC = b"\0LAUNCH-WORKDIR-1\0"     # the node's first bytes: anything a login script printed
CHUNK = 1 << 20                     # before it is skipped by the client
KEEP_STATES = 8                     # folder states whose objects pruning keeps
PRUNE_SLACK = 4                     # prune when this many states more have accumulated
MAX_LINK_HOPS = 40                  # as Linux's ELOOP limit
_SHA = re.compile(r"^[0-9a-f]{64}$")
_OPEN_DIRS = 64                     # folder descriptors kept open while copying


class ShipError(Exception):
    """Something the user must hear about; the message says what and where."""


# ---- paths and links (also used by launcher/workdir.py when scanning) ------------------------

def path_problem(path: object) -> str | None:
    """Why `path` cannot name something inside the shipped folder, or None."""
    if not isinstance(path, str) or not path:
        return "is not a path"
    if "\0" in path or path.startswith("/"):
        return "is not a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, `.` or `..` part"
    return None


def resolve_link(kinds: dict[str, str], targets: dict[str, str], link: str
                 ) -> tuple[str, str]:
    """Where the link at `link` leads inside the tree: (state, path). `kinds` maps every path
    of the tree to file|link|dir (the top folder is ""), `targets` every link to its target.
    States: "ok" (path is what it reaches, a file or folder of the tree), "dangling" (a part is
    missing, or a file is used as a folder; path is the spot, read lexically from there on),
    "escapes" (absolute, or `..` above the top, even through other links or after a missing
    part: the job could create that part later), "loop" (more than 40 links followed, as the
    kernel's ELOOP)."""
    if targets[link].startswith("/"):
        return "escapes", targets[link]
    parts = link.split("/")[:-1]
    todo = list(reversed(targets[link].split("/")))
    hops = 0
    state = "ok"
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return "escapes", ".."
            parts.pop()
            continue
        here = "/".join([*parts, part])
        kind = kinds.get(here) if state == "ok" else None
        if kind == "link":
            hops += 1
            if hops > MAX_LINK_HOPS:
                return "loop", here
            target = targets[here]
            if target.startswith("/"):
                return "escapes", target
            todo.extend(reversed(target.split("/")))
            continue
        parts.append(part)
        if state == "ok" and (kind is None or (kind == "file" and any(
                p not in ("", ".") for p in todo))):
            state = "dangling"
    return state, "/".join(parts)


def link_cycles(kinds: dict[str, str], resolved: dict[str, str]) -> list[str]:
    """Links that make the tree infinite to anyone who follows links: a link to a folder that
    holds the link itself (`a/l -> ..`, `l -> .`), or links leading into each other's folders
    (`a/l -> ../b`, `b/m -> ../a`). `resolved`: link -> the folder it reaches."""
    links = sorted(resolved)
    into = {}
    for link, folder in resolved.items():
        if kinds.get(folder) == "dir":
            # The links inside `folder`: "/" sorts just before "0".
            low = bisect.bisect_left(links, folder + "/") if folder else 0
            high = bisect.bisect_left(links, folder + "0") if folder else len(links)
            into[link] = links[low:high]
    cyclic: set[str] = set()
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(start: str) -> None:
        stack = [(start, iter(into.get(start, ())))]
        path = [start]
        state[start] = 1
        while stack:
            node, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(nxt) == 1:
                cyclic.update(path[path.index(nxt):])
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(into.get(nxt, ()))))

    for link in into:
        if link not in state:
            visit(link)
    return sorted(cyclic)


# ---- the manifest as the node receives it ----------------------------------------------------

def checked_entries(raw: object) -> list[tuple[str, str, int, int, str, str, int]]:
    """The entries a client sent, each (path, kind, mode, size, sha256, target, mtime_ns),
    after every check; ShipError names the first bad one."""
    if not isinstance(raw, list):
        raise ShipError("the manifest is not a list of entries")
    out = []
    kinds: dict[str, str] = {"": "dir"}
    targets: dict[str, str] = {}
    for item in raw:
        if not isinstance(item, list) or len(item) != 7:
            raise ShipError(f"manifest entry {str(item)[:80]!r} is malformed")
        path, kind, mode, size, sha, target, mtime = item
        why = path_problem(path)
        if why:
            raise ShipError(f"manifest path {str(path)[:200]!r} {why}")
        if kind not in ("file", "link", "dir") or path in kinds:
            raise ShipError(f"manifest entry {path!r}: unknown kind or listed twice")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (mode, size, mtime)) \
                or not 0 <= mode <= 0o777 or size < 0:
            raise ShipError(f"manifest entry {path!r}: bad mode, size or time")
        if kind == "file" and not (isinstance(sha, str) and _SHA.match(sha)):
            raise ShipError(f"manifest entry {path!r}: bad sha256")
        if kind == "link":
            if not isinstance(target, str) or not target or "\0" in target:
                raise ShipError(f"manifest entry {path!r}: bad link target")
            targets[path] = target
        kinds[path] = kind
        out.append((path, kind, mode, size, sha if kind == "file" else "",
                    target if kind == "link" else "", mtime))
    for path, kind, *_ in out:
        parent = path.rpartition("/")[0]
        if kinds.get(parent) != "dir":
            raise ShipError(f"manifest entry {path!r}: its folder {parent!r} is not listed "
                            "as a folder")
    for link in targets:
        state, where = resolve_link(kinds, targets, link)
        if state in ("escapes", "loop"):
            raise ShipError(f"link {link!r} -> {targets[link]!r} {state} ({where})")
    return sorted(out)


# ---- the cache -------------------------------------------------------------------------------

class Cache:
    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        for sub in ("objects", "tmp", "states"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self._lock_fd = -1

    def object(self, sha: str) -> str:
        return os.path.join(self.root, "objects", sha[:2], sha[2:])

    def lock_shared(self) -> None:
        self._lock_fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def missing(self, entries) -> list[str]:
        """The distinct contents the cache lacks, in the manifest's order. An object of the
        wrong size (a crash before its data reached the disk) counts as missing."""
        out, seen = [], set()
        for _path, kind, _mode, size, sha, _target, _mtime in entries:
            if kind != "file" or sha in seen:
                continue
            seen.add(sha)
            try:
                if os.stat(self.object(sha)).st_size == size:
                    continue
            except FileNotFoundError:
                pass
            out.append(sha)
        return out

    def receive(self, sha: str, size: int, source, name: str = "") -> None:
        """Read exactly `size` bytes from `source` (a binary file object), check their sha256
        and make them the object `sha` (of the file `name`, for messages)."""
        tmp = os.path.join(self.root, "tmp", f"{os.getpid()}-{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            digest = hashlib.sha256()
            left = size
            while left:
                chunk = source.read(min(CHUNK, left))
                if not chunk:
                    raise ShipError(f"the data of {name or sha[:12]} ended {left} bytes early")
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(chunk)
            if digest.hexdigest() != sha:
                raise ShipError(f"{name or sha[:12]} arrived with other content than scanned "
                                f"(sha256 {digest.hexdigest()[:12]}, not {sha[:12]}): did "
                                "it change during the ship? run again")
            os.close(fd)
            fd = -1
            os.makedirs(os.path.dirname(self.object(sha)), exist_ok=True)
            os.rename(tmp, self.object(sha))
        finally:
            if fd >= 0:
                os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)

    def record(self, digest: str, shas) -> None:
        """Remember which objects this folder state uses (pruning keeps the newest states)."""
        path = os.path.join(self.root, "states", digest)
        now = time.time_ns()   # the fine clock: file times may tick only every few ms
        if os.path.exists(path):
            os.utime(path, ns=(now, now))
            return
        tmp = os.path.join(self.root, "tmp", f"state-{os.getpid()}-{secrets.token_hex(6)}")
        with open(tmp, "w") as f:
            json.dump(sorted(set(shas)), f)
        os.utime(tmp, ns=(now, now))
        os.rename(tmp, path)

    def prune(self) -> bool:
        """Drop objects no recent state uses, and whatever dropped ships left in tmp/. Only
        when no other ship holds the lock (it may be about to copy any object); False if it
        did not run."""
        states_dir = os.path.join(self.root, "states")
        states = sorted(os.listdir(states_dir),
                        key=lambda n: os.stat(os.path.join(states_dir, n)).st_mtime_ns,
                        reverse=True)
        if len(states) <= KEEP_STATES + PRUNE_SLACK:
            return False
        fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            keep: set[str] = set()
            for name in states[:KEEP_STATES]:
                with open(os.path.join(states_dir, name)) as f:
                    keep.update(json.load(f))
            for name in states[KEEP_STATES:]:
                os.unlink(os.path.join(states_dir, name))
            objects = os.path.join(self.root, "objects")
            for prefix in os.listdir(objects):
                for rest in os.listdir(os.path.join(objects, prefix)):
                    if prefix + rest not in keep:
                        os.unlink(os.path.join(objects, prefix, rest))
            for name in os.listdir(os.path.join(self.root, "tmp")):
                os.unlink(os.path.join(self.root, "tmp", name))
            return True
        finally:
            os.close(fd)


# ---- the run's copy --------------------------------------------------------------------------

def prepare_dest(dest: str) -> str:
    """DEST as an absolute path, created; it must not exist yet or be an empty folder."""
    dest = os.path.abspath(os.path.expanduser(dest))
    try:
        os.makedirs(dest)
    except FileExistsError:
        if os.path.islink(dest) or not os.path.isdir(dest):
            raise ShipError(f"{dest} exists and is not a folder") from None
        if os.listdir(dest):
            raise ShipError(f"{dest} is not empty: the workdir goes into a new folder") from None
    return dest


def check_apart(dest: str, cache_root: str) -> None:
    """The run's folder and the cache must not hold each other."""
    if dest == cache_root or dest.startswith(cache_root + "/") or \
            cache_root.startswith(dest + "/"):
        raise ShipError(f"the destination {dest} and the cache {cache_root} overlap")


class _Folders:
    """Descriptors of DEST's folders, each opened from its parent with O_NOFOLLOW, so that a
    link in the tree can never redirect a write; a few are kept open."""

    def __init__(self, dest: str):
        self.top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
        self.open: OrderedDict[str, int] = OrderedDict()

    def fd(self, folder: str) -> int:
        if not folder:
            return self.top
        if folder in self.open:
            self.open.move_to_end(folder)
            return self.open[folder]
        parent, _, name = folder.rpartition("/")
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd(parent))
        self.open[folder] = fd
        if len(self.open) > _OPEN_DIRS:
            os.close(self.open.popitem(last=False)[1])
        return fd

    def close(self) -> None:
        for fd in self.open.values():
            os.close(fd)
        os.close(self.top)


def _copy(src: int, dst: int, size: int) -> None:
    left = size
    try:
        while left:
            done = os.copy_file_range(src, dst, left)
            if not done:
                break
            left -= done
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                             errno.EPERM):
            raise
        while left:
            chunk = os.read(src, min(CHUNK, left))
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view):]
            left -= len(chunk)
    if left:
        raise ShipError(f"a cached object was {left} bytes shorter than recorded")


def materialize(cache: Cache, dest: str, entries) -> None:
    """DEST (absolute, existing, empty) gets exactly the entries: folders, then files copied
    from the cache with their mode and modification time, then links (last, so no link exists
    while anything is written)."""
    folders = _Folders(dest)
    try:
        for path, kind, mode, *_ in entries:
            if kind == "dir":
                parent, _, name = path.rpartition("/")
                os.mkdir(name, 0o700, dir_fd=folders.fd(parent))
        for path, kind, mode, size, sha, _target, mtime in entries:
            if kind != "file":
                continue
            parent, _, name = path.rpartition("/")
            src = os.open(cache.object(sha), os.O_RDONLY)
            try:
                dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                              dir_fd=folders.fd(parent))
                try:
                    _copy(src, dst, size)
                    os.fchmod(dst, mode)
                    os.utime(dst, ns=(mtime, mtime))
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        for path, kind, _mode, _size, _sha, target, _mtime in entries:
            if kind == "link":
                parent, _, name = path.rpartition("/")
                os.symlink(target, name, dir_fd=folders.fd(parent))
        # Folders keep their owner's rwx: the job writes in its folder, cleanup removes it.
        for path, kind, mode, *_ in entries:
            if kind == "dir":
                os.fchmod(folders.fd(path), mode | 0o700)
    finally:
        folders.close()


def remove_partial(dest: str) -> None:
    """What a failed ship put in DEST goes again (DEST itself stays)."""
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def ship(cache: Cache, dest: str, entries, digest: str, fetch) -> tuple[int, int]:
    """The whole receiving side: under the shared lock, ask `fetch(missing shas)` to deliver
    the objects the cache lacks (it calls cache.receive for each, in order), build DEST, and
    record the state. Returns (objects received, their bytes). On failure DEST is emptied."""
    sizes = {sha: size for _p, kind, _m, size, sha, _t, _mt in entries if kind == "file"}
    cache.lock_shared()
    try:
        missing = cache.missing(entries)
        fetch(missing)
        try:
            materialize(cache, dest, entries)
        except BaseException:
            remove_partial(dest)
            raise
        cache.record(digest, sizes)
    finally:
        cache.unlock()
    try:
        cache.prune()
    except OSError:
        pass   # pruning is housekeeping; the next ship tries again
    return len(missing), sum(sizes[sha] for sha in missing)


# ---- over SSH: one exec channel, framed JSON both ways, raw object bytes in between -----------

def _frame(out, payload: dict) -> None:
    data = json.dumps(payload).encode()
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def _read_frame(source) -> dict:
    head = source.read(4)
    if len(head) != 4:
        raise ShipError("the client closed the connection")
    (length,) = struct.unpack(">I", head)
    data = source.read(length)
    if len(data) != length:
        raise ShipError("the client closed the connection")
    return json.loads(data)


def serve(dest: str, cache_root: str) -> int:
    """Client -> {"entries", "digest"}; node -> {"missing": [sha...]}; client -> the missing
    objects' bytes, back to back; node -> {"received", "bytes"} or {"error"} at any point."""
    source, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(MAGIC)
    out.flush()
    try:
        request = _read_frame(source)
        entries = checked_entries(request.get("entries"))
        digest = request.get("digest")
        if not isinstance(digest, str) or not _SHA.match(digest):
            raise ShipError("the manifest's digest is malformed")
        cache = Cache(cache_root)
        dest_path = prepare_dest(dest)
        check_apart(dest_path, cache.root)
        names = {}
        for path, kind, _m, size, sha, _t, _mt in entries:
            if kind == "file":
                names.setdefault(sha, (path, size))

        def fetch(missing):
            _frame(out, {"missing": missing})
            for sha in missing:
                cache.receive(sha, names[sha][1], source, names[sha][0])

        received, nbytes = ship(cache, dest_path, entries, digest, fetch)
        _frame(out, {"received": received, "bytes": nbytes})
        return 0
    except (ShipError, OSError, ValueError) as err:
        text = str(err) if isinstance(err, ShipError) else f"{type(err).__name__}: {err}"
        try:
            _frame(out, {"error": text})
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2], sys.argv[3]))
    sys.exit("usage: workdir_node.py serve DEST CACHE")
