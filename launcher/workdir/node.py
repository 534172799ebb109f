"""The receiving side of a workdir ship: a managed mirror of the user's folder on each node.
Standard library only, Python 3.10+: launch is not installed on nodes, so
launcher/workdir/sync.py sends this file's text to the node's interpreter (`python -c SOURCE
serve DEST BUSY`); shipping to this machine or to Slurm's shared folder imports it instead, so
every backend runs the same code.

DEST is one folder per node and workdir that lives across runs, so that setup's outputs (a
`build_ext --inplace`, a downloaded file) stay beside the code. launch owns what it shipped and
nothing else:

    DEST/
      .launch-lock            flock(2): exclusive while a ship (or setup) changes the folder,
                              shared while a job runs from it
      .launch-shipped.json    what launch wrote: per file its sha256, mode and stat data as
                              written (dev, inode, size, mtime, ctime); links; folders
      .launch-staging-*/      new contents on their way in (a dropped ship leaves one; the
                              next ship removes it)
      ...                     the user's tree, plus whatever setup wrote (and jobs, before
                              they ran in folders of their own: DEST.runs/, job_folder.py)

A ship makes DEST hold exactly the manifest's files, links and folders: a file launch wrote
before and still on disk as written (stat data equal; ctime cannot be set from user space and
changes with every write, chmod or link) is kept; anything else the manifest holds is written
anew, by rename(2) over the old name, never in place (a job that kept a hard link or an open
file keeps the old content: each run's job folder, launch_node/job_folder.py, is hard links to
this copy's files); files and links launch wrote that the manifest no longer holds
are removed; files launch never wrote are left alone unless the manifest needs their name. A
file whose ctime alone moved (a job folder's link to it made or removed) is checked by its
content and, when intact, its record updated. A
file written within 20 ms of the record being taken is "racy" (a later change within the same
clock tick would keep its ctime), as in git's index: it is checked by its content next time.

Contents come from the cheapest place that provably holds them: a file of this folder or of a
sibling copy (below) whose stat data is still what its record says, checked again after the
copy, else the client over the network. Files are copied with copy_file_range(2): a reflink
where the file system has them, an in-kernel copy elsewhere.

Concurrency: the ship takes the lock exclusively. When a running job holds it (shared) and the
folder's content differs, the ship never changes files under it: with BUSY "sibling" it moves to
DEST.2, DEST.3, ... (the first that is free, or already holds the content), with "wait" it waits.
A new run whose content is already in a busy folder shares it. The folder a ship used is what
it answers.

The client is not trusted blindly: every path is relative, without `.`, `..` or empty parts,
under a folder the manifest lists; launch's own names are refused; every write goes through
folder descriptors opened with O_NOFOLLOW from DEST, so nothing is ever written or removed
through a symbolic link, even one a job planted; link targets must resolve inside DEST; every
content's sha256 is checked as it arrives.
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
import stat
import struct
import sys
import time
from collections import OrderedDict

MAGIC = b"\0LAUNCH-WORKDIR-3\0"   # the node's first bytes: what a login script printed before
CHUNK = 1 << 20                   # them is skipped by the client
LOCK = ".launch-lock"
STATE = ".launch-shipped.json"
STAGING = ".launch-staging-"
MAX_SLOTS = 16                    # DEST and DEST.2 .. DEST.16
MAX_LINK_HOPS = 40                # as Linux's ELOOP limit
RACY_NS = 20 * 10**6               # two ticks of the coarsest common kernel clock (HZ=100)
COARSE_RACY_NS = 2 * 10**9
RACY_REHASH_BYTES = 16 * 10**6     # hashed again next time rather than waited for
_SHA = re.compile(r"[0-9a-f]{64}")
_OPEN_DIRS = 64                   # folder descriptors kept open


class ShipError(Exception):
    """Something the user must hear about; the message says what and where."""


# ---- paths and links (also used by launcher/workdir/scan.py when scanning) ------------------------

def path_problem(path: object) -> str | None:
    """Why `path` cannot name something inside the shipped folder, or None."""
    if not isinstance(path, str) or not path:
        return "is not a path"
    if "\0" in path or path.startswith("/"):
        return "is not a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, `.` or `..` part"
    if reserved(path):
        return "is a name launch keeps for itself in the node's copy"
    return None


def reserved(path: str) -> bool:
    return path in (LOCK, STATE) or (path.startswith(STAGING) and "/" not in path)


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
    seen: dict[str, int] = {}   # 1: on the current path, 2: done
    for start in into:
        if start in seen:
            continue
        stack = [(start, iter(into.get(start, ())))]
        path = [start]
        seen[start] = 1
        while stack:
            here, edges = stack[-1]
            nxt = next(edges, None)
            if nxt is None:
                stack.pop()
                path.pop()
                seen[here] = 2
            elif seen.get(nxt) == 1:
                cyclic.update(path[path.index(nxt):])
            elif nxt not in seen:
                seen[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(into.get(nxt, ()))))
    return sorted(cyclic)


# ---- the manifest as the node receives it ----------------------------------------------------

def checked_entries(raw: object) -> list[tuple[str, str, int, int, str, str, int]]:
    """The entries a client sent, each (path, kind, mode, size, sha256, target, mtime_ns),
    sorted by path, after every check; ShipError names the first bad one."""
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
        if kind == "file" and not (isinstance(sha, str) and _SHA.fullmatch(sha)):
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


# ---- a folder, reached without following links -----------------------------------------------

class _Folders:
    """Descriptors of a tree's folders, each opened from its parent with O_NOFOLLOW, so that a
    link in the tree can never redirect a read or a write; a few are kept open."""

    def __init__(self, top: str):
        self.top = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        self.cached: OrderedDict[str, int] = OrderedDict()

    def fd(self, folder: str) -> int:
        if not folder:
            return self.top
        if folder in self.cached:
            self.cached.move_to_end(folder)
            return self.cached[folder]
        parent, _, name = folder.rpartition("/")
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                     dir_fd=self.fd(parent))
        self.cached[folder] = fd
        if len(self.cached) > _OPEN_DIRS:
            os.close(self.cached.popitem(last=False)[1])
        return fd

    def where(self, path: str) -> tuple[int, str]:
        parent, _, name = path.rpartition("/")
        return self.fd(parent), name

    def lstat(self, path: str) -> os.stat_result | None:
        try:
            fd, name = self.where(path)
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None

    def forget(self, folder: str) -> None:
        for cached in [c for c in self.cached if c == folder or c.startswith(folder + "/")]:
            os.close(self.cached.pop(cached))

    def remove(self, path: str) -> None:
        """Remove whatever is at `path` (a whole folder too), never following a link."""
        fd, name = self.where(path)
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            self.forget(path)
            _remove_tree(fd, name)
        else:
            os.unlink(name, dir_fd=fd)

    def close(self) -> None:
        for fd in self.cached.values():
            os.close(fd)
        os.close(self.top)


def _remove_tree(parent: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    try:
        with os.scandir(fd) as listing:
            children = [(e.name, e.is_dir(follow_symlinks=False)) for e in listing]
        for child, is_dir in children:
            if is_dir:
                _remove_tree(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def stat_key(st: os.stat_result) -> list[int]:
    """What says a file is still as it was: device, inode, size, mtime and ctime in ns."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


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
        raise OSError(errno.EIO, "the source was shorter than recorded")


def _file_sha(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


# ---- one copy of the folder ------------------------------------------------------------------

def slot_path(dest: str, number: int) -> str:
    return dest if number == 1 else f"{dest}.{number}"


MAX_STATE_BYTES = 64 << 20        # the record of 40,000 files is ~6 MB


def own_file(folder: str, name: str, flags: int) -> int:
    """A descriptor of launch's own file `name` in a copy (the lock, the record), where the
    job can write too: never through a link (O_NOFOLLOW), never waiting on a FIFO
    (O_NONBLOCK), a regular file or OSError. launch_node/worker.py opens them the same way."""
    fd = os.open(os.path.join(folder, name), flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is not a regular file")
    return fd


def read_own_file(folder: str, name: str, limit: int = MAX_STATE_BYTES) -> bytes:
    """The whole of launch's own file `name` (own_file), at most `limit` bytes."""
    fd = own_file(folder, name, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.EFBIG, f"{name} is larger than {limit} bytes")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(errno.EFBIG, f"{name} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


class Copy:
    """One managed folder (DEST or a sibling) and its record of what launch wrote."""

    def __init__(self, path: str):
        self.path = path
        self.lock_fd = -1
        self.state: dict = {}
        self.refreshed = False   # a record's stat data was updated after a content check

    def load(self) -> Copy:
        """Read the record (under the lock: it is replaced whole, never edited in place)."""
        try:
            # A record the job replaced (a link, a FIFO, an endless file) is no record: the
            # copy is compared whole, and the next record is renamed over what is there.
            state = json.loads(read_own_file(self.path, STATE))
            if not isinstance(state, dict) or state.get("version") != 1:
                raise ValueError
        except (OSError, ValueError, RecursionError):
            state = {"version": 1, "digest": "", "written_ns": 0, "files": {}, "links": {},
                     "dirs": {}}
        self.state = state
        return self

    def lock(self, how: int) -> bool:
        if self.lock_fd < 0:
            try:
                self.lock_fd = own_file(self.path, LOCK, os.O_RDWR | os.O_CREAT)
            except OSError as err:
                # The job put something else in the lock's place (a link out of the copy, a
                # FIFO): the name is launch's, so that goes and a fresh lock takes its place.
                if err.errno not in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
                    raise
                try:
                    os.unlink(os.path.join(self.path, LOCK))
                except OSError:
                    pass
                try:
                    self.lock_fd = own_file(self.path, LOCK,
                                            os.O_RDWR | os.O_CREAT | os.O_EXCL)
                except OSError as again:
                    raise ShipError(f"{os.path.join(self.path, LOCK)} is not launch's lock "
                                    f"file and cannot be replaced: {again.strerror}") from None
        try:
            fcntl.flock(self.lock_fd, how)
            return True
        except BlockingIOError:
            return False

    def unlock(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def intact(self, folders: _Folders, path: str) -> bool:
        """The file launch wrote at `path` is still as written (racy ones: by content)."""
        record = self.state["files"].get(path)
        if record is None:
            return False
        try:
            fd, name = folders.where(path)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return False
            key = stat_key(st)
            if key != record[2:]:
                return self._relinked(fd, name, st, record)
            if not racy(record, self.state["written_ns"]):
                return True
            with _open_file(fd, name) as source:
                return stat_key(os.fstat(source)) == record[2:] and \
                    _file_sha(source) == record[0]
        except OSError:
            return False

    def _relinked(self, fd: int, name: str, st: os.stat_result, record: list) -> bool:
        """A file whose ctime alone moved (same inode, size, mtime and mode): a job folder's
        hard link to it was made or removed (launch_node/job_folder.py), or the job wrote it
        in place and set its time back. Checked by content; when it holds what launch wrote,
        its record takes the new stat data (saved by the ship: `refreshed`)."""
        key = stat_key(st)
        if key[:4] != record[2:6] or stat.S_IMODE(st.st_mode) != record[1]:
            return False
        with _open_file(fd, name) as source:
            if stat_key(os.fstat(source)) != key or _file_sha(source) != record[0]:
                return False
            if stat_key(os.fstat(source)) != key:   # written while it was read
                return False
        record[2:] = key
        self.refreshed = True
        return True


def racy(record: list, written_ns: int) -> bool:
    """Written so shortly before the record was taken that a change right after could have
    kept its ctime: within 20 ms, or within 2 s on a file system whose times have no
    sub-millisecond part (1 s or 2 s granularity)."""
    ctime = record[6]
    return ctime >= written_ns - (RACY_NS if ctime % 10**6 else COARSE_RACY_NS)


class _open_file:
    def __init__(self, dir_fd: int, name: str):
        self.fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *_) -> None:
        os.close(self.fd)


def _plan(copy: Copy, folders: _Folders, entries) -> list[int]:
    """Indexes of the file entries whose content or mode is not already right in the copy."""
    todo = []
    files = copy.state["files"]
    for i, (path, kind, mode, _size, sha, _target, _mtime) in enumerate(entries):
        if kind != "file":
            continue
        record = files.get(path)
        if record is None or record[0] != sha or record[1] != mode or \
                not copy.intact(folders, path):
            todo.append(i)
    return todo


def up_to_date(copy: Copy, entries, digest: str) -> bool:
    """The copy holds the manifest exactly (what a busy folder must show to be shared)."""
    if copy.state["digest"] != digest:
        return False
    folders = _Folders(copy.path)
    try:
        return not _plan(copy, folders, entries) and _shape_ok(folders, entries)
    finally:
        folders.close()


def _shape_ok(folders: _Folders, entries) -> bool:
    """Every folder and link of the manifest is in place (files: see _plan)."""
    try:
        for path, kind, _mode, _size, _sha, target, _mtime in entries:
            if kind == "file":
                continue
            st = folders.lstat(path)
            if kind == "dir" and (st is None or not stat.S_ISDIR(st.st_mode)):
                return False
            if kind == "link":
                fd, name = folders.where(path)
                if st is None or not stat.S_ISLNK(st.st_mode) or \
                        os.readlink(name, dir_fd=fd) != target:
                    return False
        return True
    except OSError:
        return False


def choose_copy(dest: str, entries, digest: str, busy: str) -> tuple[Copy, bool]:
    """The folder to ship into, locked: (copy, already up to date). Exclusively locked when it
    must change; shared when it is busy but already holds the content."""
    for number in range(1, MAX_SLOTS + 1):
        path = slot_path(dest, number)
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            raise ShipError(f"{path} exists and is not a folder") from None
        if os.path.islink(path) and number > 1:
            raise ShipError(f"{path} is a symbolic link, not a copy launch made")
        copy = Copy(path)
        if copy.lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
            return copy.load(), False
        if busy == "wait":
            copy.lock(fcntl.LOCK_EX)
            return copy.load(), False
        copy.lock(fcntl.LOCK_SH)   # waits for a ship or a setup, not for a running job
        if up_to_date(copy.load(), entries, digest):
            return copy, True
        copy.unlock()
    raise ShipError(f"{dest} and its {MAX_SLOTS - 1} siblings are all in use by running jobs "
                    "with other content")


def _sources(dest: str, copy: Copy, folders: _Folders, opened: list[_Folders]
             ) -> dict[str, list]:
    """sha256 -> places that may hold it: (folders, path, record) in this copy and in its
    siblings (read without their locks: a record is replaced whole, and each use is checked
    against it before and after the copy; a racy one by its content). Siblings' folders are
    added to `opened`, for the caller to close."""
    out: dict[str, list] = {}
    for number in range(1, MAX_SLOTS + 1):
        path = slot_path(dest, number)
        if path == copy.path:
            other, reach = copy, folders
        elif os.path.isdir(path) and not os.path.islink(path):
            other = Copy(path).load()
            try:
                reach = _Folders(path)
            except OSError:
                continue
            opened.append(reach)
        else:
            break
        written = other.state["written_ns"]
        for name, record in other.state["files"].items():
            out.setdefault(record[0], []).append((reach, name, record, racy(record, written)))
    return out


def _seal(fd: int, entry) -> None:
    """A staged file's final mode and time, set once its bytes are all written."""
    os.fchmod(fd, entry[2])
    os.utime(fd, ns=(entry[6], entry[6]))


def _copy_from(places: list, staging: int, staged: str, entry) -> bool:
    """Copy a content from the first place still holding it (stat data as recorded before and
    after the copy) into the staged file; False when none does."""
    size = entry[3]
    for reach, name, record, racy in places:
        try:
            fd, leaf = reach.where(name)
            with _open_file(fd, leaf) as source:
                before = stat_key(os.fstat(source))
                if before[:4] != record[2:6]:
                    continue
                # Its ctime alone moved (a job folder's link made or removed): by content.
                racy = racy or before[4] != record[6]
                out = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                              0o600, dir_fd=staging)
                try:
                    if racy:
                        same = _copy_hashing(source, out) == record[0]
                    else:
                        _copy(source, out, size)
                        same = True
                    _seal(out, entry)
                finally:
                    os.close(out)
                if same and stat_key(os.fstat(source)) == before:
                    return True
        except OSError:
            continue
    try:   # a copy found wrong on the way: the content comes from the client, into a new file
        os.unlink(staged, dir_fd=staging)
    except FileNotFoundError:
        pass
    return False


def _copy_hashing(src: int, dst: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(src, CHUNK):
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
    return digest.hexdigest()


def _receive(source, entry, staging: int, staged: str, proven: bool) -> None:
    """Exactly the entry's size in bytes from `source` (a binary file object) into the staged
    file, their sha256 checked unless the client `proven` them (it found the file with the
    stat data the scan recorded when it hashed it, and it found it so again after sending:
    the same reasoning as the hash cache's, and a hash here could not catch a client that
    lies, only one that errs, which that check catches)."""
    name, _kind, _mode, size, sha, _target, _mtime = entry
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=staging)
    try:
        digest = None if proven else hashlib.sha256()
        left = size
        while left:
            chunk = source.read(min(CHUNK, left))
            if not chunk:
                raise ShipError(f"the data of {name} ended {left} bytes early")
            if digest is not None:
                digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            left -= len(chunk)
        _seal(fd, entry)
    finally:
        os.close(fd)
    if digest is not None and digest.hexdigest() != sha:
        raise ShipError(f"{name} changed after launch scanned the folder (its content now "
                        f"hashes to {digest.hexdigest()[:12]}, not {sha[:12]}): run again")


def sync(dest: str, entries, digest: str, fetch, busy: str = "sibling"
         ) -> tuple[str, int, int]:
    """Make DEST (or the sibling `choose_copy` picks) hold exactly `entries`. `fetch(missing,
    receive)` must deliver each missing sha256, in order, by calling receive(sha, source) with
    a binary file object to read it from. Returns (the folder used, contents received, their
    bytes)."""
    dest = os.path.abspath(os.path.expanduser(dest))
    copy, ready = choose_copy(dest, entries, digest, busy)
    asked = []

    def once(missing, receive):
        asked.append(missing)
        fetch(missing, receive)

    try:
        received, nbytes = (0, 0) if ready else _update(dest, copy, entries, digest, once)
        if not asked:
            fetch([], None)   # the client always hears what is missing, even nothing
        return copy.path, received, nbytes
    finally:
        copy.unlock()


def _update(dest: str, copy: Copy, entries, digest: str, fetch) -> tuple[int, int]:
    folders = _Folders(copy.path)
    try:
        stale = [n for n in os.listdir(copy.path) if n.startswith(STAGING)]
        for name in stale:   # a dropped ship's, and under the lock: nobody's now
            folders.remove(name)
        todo = _plan(copy, folders, entries)
        if not todo and copy.state["digest"] == digest and _shape_ok(folders, entries):
            if copy.refreshed:
                _save_state(copy, folders)   # the next ship need not read those files again
            return 0, 0   # the record already describes exactly this tree
        staging_name = f"{STAGING}{os.getpid()}-{secrets.token_hex(4)}"
        os.mkdir(staging_name, 0o700, dir_fd=folders.top)
        staging = os.open(staging_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                          dir_fd=folders.top)
        try:
            received, nbytes = _stage(dest, copy, folders, entries, todo, staging, fetch)
            _apply(copy, folders, entries, todo, staging)
            copy.state["digest"] = digest
            _save_state(copy, folders)
        finally:
            os.close(staging)
            _remove_tree(folders.top, staging_name)
        return received, nbytes
    except OSError as err:
        raise ShipError(f"{copy.path}: {err.strerror or err}") from None
    finally:
        folders.close()


class _about:
    """OSErrors inside name the file (relative to the copy) they happened on."""

    def __init__(self, top: str, path: str):
        self.top, self.path = top, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, _tb) -> None:
        if isinstance(err, OSError) and not isinstance(err, BlockingIOError):
            raise ShipError(f"{os.path.join(self.top, self.path)}: {err.strerror or err}") \
                from None


def _stage(dest, copy, folders, entries, todo, staging, fetch) -> tuple[int, int]:
    """Every content `todo` needs, into the staging folder (named by entry index): from this
    folder or a sibling when one provably holds it, else from the client."""
    opened: list[_Folders] = []
    try:
        sources = _sources(dest, copy, folders, opened)
        first: dict[str, str] = {}           # sha -> the staged file already holding it
        waiting: dict[str, list[int]] = {}   # sha -> entries that need it from the client
        for i in todo:
            path, _kind, _mode, _size, sha, _target, _mtime = entries[i]
            with _about(copy.path, path):
                if sha in first:
                    _copy_staged(staging, first[sha], str(i), entries[i])
                elif sha in waiting:
                    waiting[sha].append(i)
                elif _copy_from(sources.get(sha, []), staging, str(i), entries[i]):
                    first[sha] = str(i)
                else:
                    waiting[sha] = [i]
    finally:
        for reach in opened:
            reach.close()
    got = [0, 0]

    def receive(sha: str, source, proven: bool = False) -> None:
        ids = waiting[sha]
        with _about(copy.path, entries[ids[0]][0]):
            _receive(source, entries[ids[0]], staging, str(ids[0]), proven)
        for i in ids[1:]:
            with _about(copy.path, entries[i][0]):
                _copy_staged(staging, str(ids[0]), str(i), entries[i])
        got[0] += 1
        got[1] += entries[ids[0]][3]

    fetch(list(waiting), receive)
    if got[0] != len(waiting):
        raise ShipError(f"{len(waiting) - got[0]} contents never arrived")
    return got[0], got[1]


def _copy_staged(staging: int, source: str, staged: str, entry) -> None:
    with _open_file(staging, source) as src:
        out = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=staging)
        try:
            _copy(src, out, entry[3])
            _seal(out, entry)
        finally:
            os.close(out)


def _apply(copy: Copy, folders: _Folders, entries, todo: list[int], staging: int) -> None:
    """Put the staged files in place and make the tree match: removals of what launch wrote
    and the manifest dropped, folders (shallow first), files (rename over the old name),
    links, then folders launch made that are gone (when empty) and folder modes."""
    files, links, dirs = copy.state["files"], copy.state["links"], copy.state["dirs"]
    wanted = {e[0]: e[1] for e in entries}
    for owned, kind, test in ((files, "file", stat.S_ISREG), (links, "link", stat.S_ISLNK)):
        for path in sorted(owned, reverse=True):
            if wanted.get(path) == kind:
                continue
            st = folders.lstat(path)
            if st is not None and test(st.st_mode):
                fd, name = folders.where(path)
                os.unlink(name, dir_fd=fd)
            del owned[path]
    for path, kind, mode, *_ in entries:
        if kind != "dir":
            continue
        with _about(copy.path, path):
            st = folders.lstat(path)
            if st is None or not stat.S_ISDIR(st.st_mode):
                if st is not None:
                    folders.remove(path)
                fd, name = folders.where(path)
                os.mkdir(name, 0o700, dir_fd=fd)
        dirs[path] = mode
    for i in todo:
        path, _kind, mode, _size, sha, _target, _mtime = entries[i]
        with _about(copy.path, path):
            fd, name = folders.where(path)
            try:
                os.rename(str(i), name, src_dir_fd=staging, dst_dir_fd=fd)
            except OSError as err:
                if err.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                folders.remove(path)   # a folder where the manifest has a file: it goes
                os.rename(str(i), name, src_dir_fd=staging, dst_dir_fd=fd)
            files[path] = [sha, mode,
                           *stat_key(os.stat(name, dir_fd=fd, follow_symlinks=False))]
    for path, kind, _mode, _size, _sha, target, _mtime in entries:
        if kind != "link":
            continue
        with _about(copy.path, path):
            fd, name = folders.where(path)
            st = folders.lstat(path)
            if st is None or not stat.S_ISLNK(st.st_mode) or \
                    os.readlink(name, dir_fd=fd) != target:
                if st is not None and stat.S_ISDIR(st.st_mode):
                    folders.remove(path)
                temporary = f"{STAGING}link-{secrets.token_hex(6)}"
                os.symlink(target, temporary, dir_fd=fd)
                os.rename(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
        links[path] = target
    for path in sorted(dirs, reverse=True):
        if wanted.get(path) != "dir":
            del dirs[path]
            folders.forget(path)
            try:
                fd, name = folders.where(path)
                os.rmdir(name, dir_fd=fd)
            except OSError:
                pass   # setup's or the job's files are still in it: theirs, it stays
    for path, mode in dirs.items():
        # Folders keep their owner's rwx: setup and the job write there.
        if stat.S_IMODE(os.fstat(folders.fd(path)).st_mode) != mode | 0o700:
            os.fchmod(folders.fd(path), mode | 0o700)


def _save_state(copy: Copy, folders: _Folders) -> None:
    # When much was just written, the record is taken a racy margin later, so that those
    # files are not racy next time (a later change falls in a later clock tick): one short
    # sleep instead of hashing much of a fresh copy again on the next ship.
    now = time.time_ns()
    recent = [r for r in copy.state["files"].values() if r[6] >= now - RACY_NS]
    if sum(r[4] for r in recent) > RACY_REHASH_BYTES:
        time.sleep(max(0, max(r[6] for r in recent) + RACY_NS - now) / 1e9)
    copy.state["written_ns"] = time.time_ns()
    temporary = f"{STAGING}state-{secrets.token_hex(6)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                 dir_fd=folders.top)
    with os.fdopen(fd, "w") as f:
        # dumps, not dump: only the one-shot encoder is the C one (5x faster here).
        f.write(json.dumps(copy.state, separators=(",", ":")))
    os.rename(temporary, STATE, src_dir_fd=folders.top, dst_dir_fd=folders.top)


# ---- over SSH: one exec channel, framed JSON both ways, raw contents in between --------------

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


def serve(dest: str) -> int:
    """Client -> {"entries", "digest", "busy"}; node -> {"missing": [sha...]}; client -> each
    missing content as a byte (1: proven by the client, see _receive) and its bytes, back to
    back; node -> {"received", "bytes", "dest"} or {"error"} at any point."""
    source, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(MAGIC)
    out.flush()
    try:
        request = _read_frame(source)
        entries = checked_entries(request.get("entries"))
        digest, busy = request.get("digest"), request.get("busy")
        if not isinstance(digest, str) or not _SHA.fullmatch(digest) or \
                busy not in ("sibling", "wait"):
            raise ShipError("the request is malformed")

        def fetch(missing, receive):
            _frame(out, {"missing": missing})
            for sha in missing:   # each content: a byte (1: proven, 0: hash it), its bytes
                receive(sha, source, source.read(1) == b"\1")

        used, received, nbytes = sync(dest, entries, digest, fetch, busy)
        _frame(out, {"received": received, "bytes": nbytes, "dest": used})
        return 0
    except (ShipError, OSError, ValueError) as err:
        text = str(err) if isinstance(err, ShipError) else f"{type(err).__name__}: {err}"
        try:
            _frame(out, {"error": text})
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2]))
    sys.exit("usage: node.py serve DEST")
