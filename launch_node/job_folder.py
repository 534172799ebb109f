"""The job's own folder on a node: a view of the shipped copy made for one run and one node
(docs/workdir.md "Where the job runs"), so that every run starts from exactly what was shipped
(and what setup wrote beside it), and what a run writes (checkpoints, logs) stays with that
run: a second run never resumes from the first one's `snapshot.pt`, and two nodes sharing one
machine (`--local`) never write each other's files.

    <copy>.runs/
      .launch-lock         exclusive while a view is made or old ones are removed (short)
      <run id>/
        .launch-lock       shared by every rank of the run on this machine, from before its
                           first line until it ends (kept across exec); its mtime: when the
                           run last started a rank here (which runs are the newest)
        .launch-shipped.<node>   what the view held when it was made: a line per regular
                           file (inode, size, mtime, path), so that what the run wrote is
                           told from what was shipped (run_files, `launch fetch --workdir`)
        <node>/            the job's folder: every regular file of the copy hard-linked (one
                           link per file, no data copied), folders and symbolic links made
                           anew, launch's own `.launch-*` files at the copy's top left out

Made by launch_node/worker.py on the node, after it has checked the copy's content and while
it holds the copy's own lock (no ship changes the copy meanwhile). The first rank of a node
makes it; the node's other ranks, and its restarts, find it made. Nothing is followed through a
symbolic link: every folder is opened from its parent with O_NOFOLLOW, as in
launcher/workdir/node.py, since the job writes in these folders too. Where a hard link cannot
be made (another file system, a kernel refusing it) the file is copied, and said once.

Retention: the folders of the newest KEEP runs of a copy are kept (LAUNCH_JOB_FOLDERS_KEPT,
default 5); older ones go when a new one is made, except those whose run still holds its
lock.

Standard library only: nodes run it with their own interpreter.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

RUNS = ".runs"
LOCK = ".launch-lock"
OWN = ".launch-"
STAGING = ".launch-staging-"
SHIPPED = ".launch-shipped."
KEEP_ENV = "LAUNCH_JOB_FOLDERS_KEPT"
KEEP = 5
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# Where link(2) cannot be used and a copy can: another file system, a kernel that refuses
# to link a file the user does not own (protected_hardlinks), too many links, no link support.
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.EACCES)


class JobFolderError(Exception):
    """What the user must hear; the message names the folder."""


class Made:
    """The job's folder, held: `fd` its run's lock (shared; inheritable, for the rank's exec),
    `folder` a descriptor of the folder itself, `copied` files copied where a link failed
    (and why), `removed` older runs' folders removed."""

    def __init__(self, path: str, fd: int, folder: int, made: bool, copied: int,
                 why: str, removed: list[str]):
        self.path, self.fd, self.folder, self.made = path, fd, folder, made
        self.copied, self.why, self.removed = copied, why, removed


def keep_setting(env) -> int:
    value = env.get(KEEP_ENV, "")
    if not value:
        return KEEP
    try:
        keep = int(value)
    except ValueError:
        keep = 0
    if keep < 1:
        raise JobFolderError(f"{KEEP_ENV}={value!r}: give a whole number of runs, 1 or more")
    return keep


def plain(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def place(copy: str, job_folder: str) -> tuple[str, str]:
    """(run, node) when `job_folder` is `<copy>.runs/<run>/<node>`; JobFolderError else."""
    run_folder, node = os.path.split(job_folder)
    runs, run = os.path.split(run_folder)
    if runs != copy + RUNS or not plain(run) or not plain(node):
        raise JobFolderError(f"the job's folder {job_folder} is not <copy>{RUNS}/<run>/<node> "
                             f"of the copy {copy}")
    return run, node


def own_lock(dir_fd: int, where: str) -> int:
    """The lock file in a folder, opened as launch opens its own files where a job writes too:
    never through a link, never waiting on a FIFO, a regular file; a link, FIFO or folder in
    its place is replaced (the name is launch's)."""
    for attempt in (0, 1):
        try:
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644,
                         dir_fd=dir_fd)
        except OSError as err:
            if attempt or err.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise JobFolderError(f"{os.path.join(where, LOCK)}: {err.strerror}") from None
            _remove(dir_fd, LOCK)
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
        if attempt:
            break
        _remove(dir_fd, LOCK)
    raise JobFolderError(f"{os.path.join(where, LOCK)} is not a regular file and cannot be "
                         "replaced")


def _open_dir(parent: int, name: str, where: str, create: bool = True) -> int:
    if create:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as err:
        raise JobFolderError(f"{os.path.join(where, name)}: {err.strerror} (launch makes this "
                             "folder; a link or a file in its place is refused)") from None


def make(copy: str, job_folder: str, keep: int = KEEP) -> Made:
    """The job's folder `<copy>.runs/<run>/<node>`, made from the copy when absent, its run's
    lock held shared; older runs' folders beyond `keep` removed."""
    run, node = place(copy, job_folder)
    runs_path = copy + RUNS
    try:
        parent = os.open(os.path.dirname(copy) or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise JobFolderError(f"{os.path.dirname(copy)}: {err.strerror}") from None
    try:
        runs = _open_dir(parent, os.path.basename(runs_path), os.path.dirname(copy))
    finally:
        os.close(parent)
    held = folder = -1
    try:
        guard = own_lock(runs, runs_path)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)   # waits only while another rank makes a folder
            run_fd = _open_dir(runs, run, runs_path)
            try:
                held = own_lock(run_fd, os.path.join(runs_path, run))
                fcntl.flock(held, fcntl.LOCK_SH)
                os.utime(held)   # this run is the newest here now
                made, copied, why = False, 0, ""
                if not _is_dir(run_fd, node):
                    copied, why = _build(copy, run_fd, node, job_folder)
                    made = True
                folder = _open_dir(run_fd, node, os.path.join(runs_path, run), create=False)
            finally:
                os.close(run_fd)
            removed = _retire(runs, run, keep) if made else []
        finally:
            os.close(guard)
        os.set_inheritable(held, True)
        return Made(job_folder, held, folder, made, copied, why, removed)
    except OSError as err:
        for fd in (held, folder):
            if fd >= 0:
                os.close(fd)
        raise JobFolderError(f"{job_folder}: {err.strerror or err}") from None
    except BaseException:
        for fd in (held, folder):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        os.close(runs)


def _is_dir(parent: int, name: str) -> bool:
    """A folder (not a link to one) at `name`; anything else there is removed."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    os.unlink(name, dir_fd=parent)
    return False


def _build(copy: str, run_fd: int, node: str, where: str) -> tuple[int, str]:
    """The view, made in a staging folder and renamed into place (a rank killed midway leaves
    no half view: the next one removes the staging folder and starts again)."""
    for name in os.listdir(run_fd):
        if name.startswith(STAGING):
            _remove(run_fd, name)
    staging = f"{STAGING}{node}"
    os.mkdir(staging, 0o700, dir_fd=run_fd)
    top = os.open(copy, os.O_RDONLY | os.O_DIRECTORY)
    shipped: list[str] = []
    try:
        out = os.open(staging, _DIR, dir_fd=run_fd)
        try:
            counts = [0, ""]
            _link_tree(top, out, counts, top_level=True, shipped=shipped)
            os.fchmod(out, stat.S_IMODE(os.fstat(top).st_mode) | 0o700)
        finally:
            os.close(out)
    finally:
        os.close(top)
    # Written before the folder is in place: a view is never there without its record.
    _write_new(run_fd, SHIPPED + node, "".join(shipped).encode("utf-8", "surrogateescape"))
    os.rename(staging, node, src_dir_fd=run_fd, dst_dir_fd=run_fd)
    return counts[0], counts[1]


def _write_new(parent: int, name: str, data: bytes) -> None:
    """`name` in folder `parent` holding `data`, replacing whatever was there (a record left
    by a rank killed midway), never written through a link."""
    try:
        _remove(parent, name)
    except FileNotFoundError:
        pass
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                 dir_fd=parent)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _record(rel: str, st: os.stat_result) -> str:
    # Tab-separated, the path last: a path may hold tabs but never a newline (that one file,
    # rare, is then always counted as the run's: the safe side for a fetch).
    return f"{st.st_ino}\t{st.st_size}\t{st.st_mtime_ns}\t{rel}\n"


def _link_tree(src: int, dst: int, counts: list, top_level: bool = False,
               shipped: list[str] | None = None, prefix: str = "") -> None:
    """Every entry of folder `src` into folder `dst`: regular files hard-linked (copied where
    that fails), folders made and filled, symbolic links made with the same target; nothing
    else (FIFOs, sockets, devices: never shipped; setup's are left out). Never follows a link.
    Each regular file made is recorded in `shipped` (_record), by its path from the top."""
    with os.scandir(src) as listing:
        names = [e.name for e in listing]
    for name in names:
        if top_level and name.startswith(OWN):
            continue   # launch's lock, record, staging and setup files: the copy's, not the job's
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst)
            inner_src = os.open(name, _DIR, dir_fd=src)
            try:
                inner_dst = os.open(name, _DIR, dir_fd=dst)
                try:
                    _link_tree(inner_src, inner_dst, counts, shipped=shipped,
                               prefix=f"{prefix}{name}/")
                    os.fchmod(inner_dst, stat.S_IMODE(st.st_mode) | 0o700)
                finally:
                    os.close(inner_dst)
            finally:
                os.close(inner_src)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        elif stat.S_ISREG(st.st_mode):
            made = st   # a link is the same inode: its size and mtime, read above
            try:
                os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
            except OSError as err:
                if err.errno not in _NO_LINK:
                    raise
                copy_file(src, dst, name)
                counts[0] += 1
                counts[1] = counts[1] or os.strerror(err.errno)
                made = os.stat(name, dir_fd=dst, follow_symlinks=False)
            if shipped is not None and "\n" not in name:
                shipped.append(_record(prefix + name, made))


def copy_file(src: int, dst: int, name: str) -> None:
    """`name` of folder `src` copied into folder `dst` (its mode and modification time too),
    where a hard link cannot be made; opened without following a link or waiting on a FIFO."""
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    try:
        st = os.fstat(source)
        if not stat.S_ISREG(st.st_mode):
            return
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=dst)
        try:
            while True:
                chunk = os.read(source, 1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(source)


def run_files(job_folder: str) -> tuple[list[tuple[str, int]], str]:
    """What the run wrote in its job folder: (path from the folder, size) of every regular
    file that was not in the view when it was made, or is no longer what was put there (the
    job replaced it, or rewrote it in place: its size or mtime moved), but for Python's
    byte-code cache (`__pycache__/`: an import's by-product, not the run's output); and how
    that was told: "record" (the view's .launch-shipped record), or "links" for a view made before launch
    kept that record (a file with one link is the run's; a shipped file it rewrote in place
    is then missed). Symbolic links and other non-files are not listed; no link is followed.
    JobFolderError when the folder is not there."""
    run_folder, node = os.path.split(job_folder.rstrip("/"))
    shipped: dict[str, tuple[int, int, int]] | None = None
    try:
        with open(os.path.join(run_folder, SHIPPED + node), "rb") as f:
            raw = f.read().decode("utf-8", "surrogateescape")
        shipped = {}
        for line in raw.splitlines():
            ino, size, mtime, rel = line.split("\t", 3)
            shipped[rel] = (int(ino), int(size), int(mtime))
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        shipped = None   # unreadable: the links tell it, as for an old view
    try:
        top = os.open(job_folder, _DIR)
    except OSError as err:
        raise JobFolderError(f"{job_folder}: {err.strerror} (a run's job folder is removed "
                             "once newer runs than the newest kept ones have run)") from None
    out: list[tuple[str, int]] = []
    try:
        _list_run_files(top, "", shipped, out)
    finally:
        os.close(top)
    return out, "record" if shipped is not None else "links"


def _list_run_files(folder: int, prefix: str, shipped, out: list) -> None:
    with os.scandir(folder) as listing:
        names = [e.name for e in listing]
    for name in sorted(names):
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            continue
        rel = prefix + name
        if stat.S_ISDIR(st.st_mode):
            if name == "__pycache__":
                continue
            try:
                inner = os.open(name, _DIR, dir_fd=folder)
            except OSError:
                continue   # unreadable (the job took its own bits off): nothing to take
            try:
                _list_run_files(inner, rel + "/", shipped, out)
            finally:
                os.close(inner)
        elif stat.S_ISREG(st.st_mode):
            if shipped is None:
                if st.st_nlink == 1:
                    out.append((rel, st.st_size))
            elif shipped.get(rel) != (st.st_ino, st.st_size, st.st_mtime_ns):
                out.append((rel, st.st_size))


def open_run_file(job_folder: str, rel: str) -> int:
    """A descriptor of file `rel` of the job folder, opened for reading with no link followed
    on the way (every folder from its parent with O_NOFOLLOW) and no FIFO waited on: the job
    writes in these folders, and may have put a link where a file was listed."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise JobFolderError(f"{rel!r}: not a path inside the job folder")
    fd = os.open(job_folder, _DIR)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise JobFolderError(f"{rel}: no longer a regular file")
    return out


def _retire(runs: int, current: str, keep: int) -> list[str]:
    """Remove the folders of the runs beyond the newest `keep` (the current one counts),
    newest by when a rank last started there; a run whose lock is held (still running) is
    skipped. The removed runs' names."""
    found = []
    for name in os.listdir(runs):
        if name == current or not plain(name):
            continue
        try:
            st = os.stat(name, dir_fd=runs, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                continue
        except OSError:
            continue
        found.append((_started(runs, name, st.st_mtime_ns), name))
    found.sort(reverse=True)
    removed = []
    for _when, name in found[max(keep - 1, 0):]:
        try:
            run_fd = os.open(name, _DIR, dir_fd=runs)
        except OSError:
            continue
        try:
            lock = own_lock(run_fd, name)
        except JobFolderError:
            os.close(run_fd)
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            os.close(run_fd)
            continue   # its run still runs
        try:
            os.close(run_fd)
            _remove(runs, name)
            removed.append(name)
        except OSError:
            pass
        finally:
            os.close(lock)
    return removed


def _started(runs: int, name: str, otherwise: int) -> int:
    """When a rank of run `name` last started here: its lock's mtime (`otherwise` when none)."""
    try:
        fd = os.open(name, _DIR, dir_fd=runs)
    except OSError:
        return otherwise
    try:
        return os.stat(LOCK, dir_fd=fd, follow_symlinks=False).st_mtime_ns
    except OSError:
        return otherwise
    finally:
        os.close(fd)


def _remove(parent: int, name: str) -> None:
    """Whatever is at `name` (a whole folder too), never following a link."""
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, _DIR, dir_fd=parent)
    try:
        os.fchmod(fd, 0o700)   # a job may have taken its own write bit off a folder
        with os.scandir(fd) as listing:
            children = [e.name for e in listing]
        for child in children:
            _remove(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
