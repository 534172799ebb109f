"""Reading and writing the small files launch keeps and reads, when anyone may have put
something else there.

A runs folder can be shared, and a run folder can be copied in from anywhere: a FIFO named
summary.json hung `launch runs`, `/dev/zero` or a sparse 4 GB file where a ledger or a
known_hosts file was expected grew launch to gigabytes, and a symbolic link planted as
`report.md.tmp`, `launch.json`, `attempts/` or a node's `node.log` let whoever planted it choose
where `launch report` or `--resume` wrote or moved files. Every such file goes through here:

- reads take regular files only, opened without blocking (a FIFO or a device is refused, not
  waited on) and up to a size cap; JSON is parsed with nesting bounded (what its numbers may
  be is the schema's business: launcher/runs/schema.py);
- writes go to a temporary file created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW) in the target
  folder, then renamed over the target: a planted link is replaced, never written through;
- below a trusted folder (`within`: the runs folder a run folder is in) no symbolic link is
  followed, at any level: every folder on the way is opened with O_NOFOLLOW relative to the
  one before it, so a run folder whose parts are links is refused, never left.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from launcher.core.errors import LauncherError

KIB, MIB = 1 << 10, 1 << 20
MAX_JSON_DEPTH = 200
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafeFile(LauncherError):
    def __init__(self, path: str | Path, why: str, missing: bool = False):
        self.path, self.why, self.missing = str(path), why, missing
        super().__init__(f"{path}: {why}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _explain(path: Path, err: OSError) -> UnsafeFile:
    if err.errno == errno.ENOENT:
        return UnsafeFile(path, "does not exist", missing=True)
    if err.errno in (errno.ELOOP, errno.EMLINK) or (err.errno == errno.ENOTDIR
                                                     and path.is_symlink()):
        return UnsafeFile(path, "is a symbolic link: launch follows no link inside a run "
                                "folder; remove it (or copy the real file there)")
    if err.errno == errno.ENOTDIR:
        return UnsafeFile(path, "is not a folder (launch expects one there)")
    if err.errno == errno.ENXIO:
        return UnsafeFile(path, "is a FIFO or socket, not a file")
    return UnsafeFile(path, f"cannot be opened: {err.strerror or err}")


def _relative(path: Path, within: Path) -> tuple[str, ...]:
    try:
        parts = path.relative_to(within).parts
    except ValueError:
        raise UnsafeFile(path, f"is not inside {within}") from None
    if not parts or any(p in ("..", ".") for p in parts):
        raise UnsafeFile(path, f"is not a file inside {within}")
    return parts


@contextmanager
def _parent_fd(path: Path, within: Path | None, *, create: bool = False) -> Iterator[int]:
    """A descriptor of `path`'s folder: opened as given when `within` is None, else walked
    from `within` with no link followed (folders made on the way when `create`)."""
    if within is None:
        try:
            fd = os.open(path.parent, _DIR_FLAGS)
        except OSError as err:
            raise _explain(path.parent, err) from None
        try:
            yield fd
        finally:
            os.close(fd)
        return
    parts = _relative(path, within)
    try:
        fd = os.open(within, _DIR_FLAGS)
    except OSError as err:
        raise _explain(within, err) from None
    try:
        current = within
        for part in parts[:-1]:
            current = current / part
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as err:
                    raise UnsafeFile(current, f"cannot be made: {err.strerror or err}") from None
            try:
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                raise _explain(current, err) from None
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _open_file(path: Path, flags: int, within: Path | None, *, follow: bool, mode: int = 0o644,
               create_dirs: bool = False) -> int:
    flags |= os.O_NONBLOCK | os.O_CLOEXEC
    if within is not None or not follow:
        flags |= os.O_NOFOLLOW
    if within is None:
        try:
            return os.open(path, flags, mode)
        except NotADirectoryError:
            raise UnsafeFile(path, "a folder on its path is a file") from None
        except OSError as err:
            raise _explain(path, err) from None
    with _parent_fd(path, within, create=create_dirs) as dfd:
        try:
            return os.open(path.name, flags, mode, dir_fd=dfd)
        except OSError as err:
            raise _explain(path, err) from None


def _regular(fd: int, path: Path, what: str) -> os.stat_result:
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise UnsafeFile(path, f"is a folder, not a {what} file")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(path, f"is not a regular file ({_kind(info.st_mode)}); give the "
                               f"{what} as a file")
    return info


@contextmanager
def _reading(path: Path, what: str, within: Path | None, follow: bool
             ) -> Iterator[tuple[int, os.stat_result]]:
    fd = _open_file(path, os.O_RDONLY, within, follow=follow)
    try:
        yield fd, _regular(fd, path, what)
    finally:
        os.close(fd)


def _chunks(fd: int, path: Path, max_bytes: int) -> Iterator[bytes]:
    total = 0
    while True:
        try:
            chunk = os.read(fd, 1 * MIB)
        except OSError as err:
            raise UnsafeFile(path, f"cannot be read: {err.strerror or err}") from None
        if not chunk:
            return
        total += len(chunk)
        if total > max_bytes:
            raise UnsafeFile(path, f"grew past {max_bytes} bytes while launch read it")
        yield chunk


def read_bytes(path: str | Path, what: str, *, max_bytes: int, within: Path | None = None,
               follow: bool = True, tail: bool = False) -> bytes:
    """A regular file's bytes, at most `max_bytes` (more is refused; with `tail`, the last
    `max_bytes` are read instead). `within`: no link followed below that folder; `follow`
    False: the file itself may not be a link either."""
    path = Path(path)
    with _reading(path, what, within, follow) as (fd, info):
        if info.st_size > max_bytes:
            if not tail:
                raise UnsafeFile(path, f"is {info.st_size} bytes; a {what} is at most "
                                       f"{max_bytes} bytes")
            os.lseek(fd, info.st_size - max_bytes, os.SEEK_SET)
        return b"".join(_chunks(fd, path, max_bytes))


def read_head(path: str | Path, what: str, count: int, *, within: Path | None = None) -> bytes:
    """The first `count` bytes of a regular file (of any size)."""
    path = Path(path)
    with _reading(path, what, within, within is None) as (fd, _):
        try:
            return os.read(fd, count)
        except OSError as err:
            raise UnsafeFile(path, f"cannot be read: {err.strerror or err}") from None


def read_text(path: str | Path, what: str, *, max_bytes: int, within: Path | None = None,
              follow: bool = True, tail: bool = False) -> str:
    raw = read_bytes(path, what, max_bytes=max_bytes, within=within, follow=follow, tail=tail)
    if tail and len(raw) == max_bytes:
        raw = raw[raw.find(b"\n") + 1:]     # the first line was cut
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsafeFile(path, f"is not UTF-8 text (byte {err.start})") from None


def _depth(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (iteratively: no recursion to exhaust)."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if level > limit:
            return True
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, level + 1) for v in item]
    return False


def loads_json(text: str, name: str | Path) -> Any:
    """JSON from a file launch did not necessarily write: nesting bounded, every failure an
    UnsafeFile naming the file. Whether a number may be NaN or 1e999 (inf) is the schema's
    business (launcher/runs/schema.py): a diverged run's loss is NaN, a step count never."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise UnsafeFile(name, "not valid JSON: nested too deeply") from None
    except ValueError as err:
        raise UnsafeFile(name, f"not valid JSON ({err})") from None
    if _depth(data, MAX_JSON_DEPTH):
        raise UnsafeFile(name, f"not valid JSON: nested more than {MAX_JSON_DEPTH} levels")
    return data


def read_json(path: str | Path, what: str, *, max_bytes: int, within: Path | None = None,
              follow: bool = True) -> Any:
    return loads_json(read_text(path, what, max_bytes=max_bytes, within=within, follow=follow),
                      path)


def _write(path: Path, fill: Callable[[BinaryIO], object], within: Path | None,
           mode: int = 0o644) -> Path:
    """What `fill(f)` writes, into a temporary file made with O_EXCL|O_NOFOLLOW beside `path`
    (folders below `within` made as needed), renamed over `path` once whole."""
    tmp = f".{path.name[:100]}.{secrets.token_hex(6)}.tmp"
    with _parent_fd(path, within, create=within is not None) as dfd:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as err:
            raise UnsafeFile(path, f"cannot be written: {err.strerror or err}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as err:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(err, IsADirectoryError):
                raise UnsafeFile(path, "is a folder; launch writes a file there") from None
            if isinstance(err, OSError):
                raise UnsafeFile(path, f"cannot be written: {err.strerror or err}") from None
            raise
    return path


def write_bytes(path: str | Path, data: bytes, *, within: Path | None = None,
                mode: int = 0o644) -> Path:
    """`data` into `path` through a fresh temporary file in the same folder (created with
    O_EXCL|O_NOFOLLOW, renamed over `path`): whatever `path` was (a link, a FIFO), it is
    replaced, never written through. Folders below `within` are made as needed."""
    return _write(Path(path), lambda f: f.write(data), within, mode)


def write_with(path: str | Path, write: Callable[[BinaryIO], object], *, within: Path,
               mode: int = 0o644) -> Path:
    """What `write(f)` writes (a download, a stream) into `path`, with the rules of
    write_bytes: a fresh temporary file renamed over the target, no link followed."""
    return _write(Path(path), write, within, mode)


def write_text(path: str | Path, text: str, *, within: Path | None = None,
               mode: int = 0o644) -> Path:
    return write_bytes(path, text.encode(), within=within, mode=mode)


def write_json(path: str | Path, data: Any, *, within: Path | None = None,
               mode: int = 0o644) -> Path:
    return write_text(path, json.dumps(data, indent=2) + "\n", within=within, mode=mode)


def open_append(path: str | Path, *, within: Path) -> TextIO:
    """A log file opened for appending lines, made (with its folders) if missing; a link or a
    FIFO in its place is refused rather than opened."""
    path = Path(path)
    fd = _open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, within, follow=False,
                    create_dirs=True)
    try:
        _regular(fd, path, "log")
    except UnsafeFile:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")


def make_dirs(path: str | Path, *, within: Path) -> Path:
    """`path` and the folders above it, below `within`, with no link followed."""
    path = Path(path)
    with _parent_fd(path / "_", within, create=True):
        pass
    return path


def move(src: str | Path, dst: str | Path, *, within: Path) -> None:
    """Rename `src` to `dst` (both below `within`, no link followed on the way); a link at
    `src` is moved as the link it is."""
    src, dst = Path(src), Path(dst)
    with _parent_fd(src, within) as sfd, _parent_fd(dst, within, create=True) as dfd:
        try:
            os.replace(src.name, dst.name, src_dir_fd=sfd, dst_dir_fd=dfd)
        except OSError as err:
            raise UnsafeFile(src, f"cannot be moved to {dst}: {err.strerror or err}") from None


def copy(src: str | Path, dst: str | Path, what: str, *, max_bytes: int,
         within: Path) -> Path:
    """A regular file copied whole (at most `max_bytes`, streamed) with the rules above."""
    src, dst = Path(src), Path(dst)
    with _reading(src, what, within, False) as (fd, info):
        if info.st_size > max_bytes:
            raise UnsafeFile(src, f"is {info.st_size} bytes; a {what} is at most "
                                  f"{max_bytes} bytes")
        def fill(f: BinaryIO) -> None:
            for chunk in _chunks(fd, src, max_bytes):
                f.write(chunk)

        return _write(dst, fill, within)


def lstat(path: str | Path, *, within: Path) -> os.stat_result | None:
    """The entry itself (a link is not followed, nor any folder on the way); None when
    missing."""
    path = Path(path)
    try:
        with _parent_fd(path, within) as dfd:
            try:
                return os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
            except OSError as err:
                raise _explain(path, err) from None
    except UnsafeFile as err:
        if err.missing:
            return None
        raise


def is_file(path: str | Path, *, within: Path) -> bool:
    """A regular file there (not a link to one)."""
    try:
        info = lstat(path, within=within)
    except UnsafeFile:
        return False
    return info is not None and stat.S_ISREG(info.st_mode)


def listdir(path: str | Path, *, within: Path) -> list[str]:
    """The names in a folder below `within` (no link followed); [] when it is missing."""
    path = Path(path)
    try:
        with _parent_fd(path / "_", within) as dfd:
            try:
                return sorted(os.listdir(dfd))
            except OSError as err:
                raise _explain(path, err) from None
    except UnsafeFile as err:
        if err.missing:
            return []
        raise


def foreign_entries(folder: str | Path, *, within: Path, fifos: re.Pattern | None = None,
                    limit: int = 100_000) -> list[str]:
    """Every symbolic link, FIFO, socket or device in the tree of `folder` (below `within`),
    as 'relative/path (what)', but FIFOs whose relative path `fifos` matches whole. Walked
    with no link followed; more than `limit` entries is itself a finding."""
    folder = Path(folder)
    try:
        return _foreign(folder, within, fifos, limit)
    except OSError as err:   # a folder unreadable, or changing while it is walked
        raise UnsafeFile(folder, f"cannot be walked: {err.strerror or err}") from None


def _foreign(folder: Path, within: Path, fifos: re.Pattern | None, limit: int) -> list[str]:
    found: list[str] = []
    seen = 0
    with _parent_fd(folder / "_", within) as top:
        stack = [(os.dup(top), "")]
        try:
            while stack:
                fd, prefix = stack.pop()
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            seen += 1
                            rel = prefix + entry.name
                            if seen > limit:
                                found.append(f"more than {limit} entries")
                                return found
                            if entry.is_symlink():
                                found.append(f"{rel} (a symbolic link to "
                                             f"{os.readlink(entry.name, dir_fd=fd)!r})")
                            elif entry.is_dir(follow_symlinks=False):
                                sub = os.open(entry.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                                stack.append((sub, rel + "/"))
                            elif not entry.is_file(follow_symlinks=False):
                                mode = entry.stat(follow_symlinks=False).st_mode
                                if not (stat.S_ISFIFO(mode) and fifos is not None
                                        and fifos.fullmatch(rel)):
                                    found.append(f"{rel} ({_kind(mode)})")
                finally:
                    os.close(fd)
        finally:
            for fd, _ in stack:
                os.close(fd)
    return found


def check_folder(path: str | Path, what: str) -> Path:
    """`path` itself is a folder, not a link to one (nor anything else)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeFile(path, f"does not exist (no {what} there)") from None
    except OSError as err:
        raise UnsafeFile(path, f"cannot be read: {err.strerror or err}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFile(path, f"is a symbolic link to {os.readlink(path)!r}: launch uses a "
                               f"{what} only where it is, never through a link")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFile(path, f"is {_kind(info.st_mode)}, not a {what}")
    return path
