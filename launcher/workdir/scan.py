"""The user's code folder (`workdir:`): what launch ships to every node, as a manifest.

`scan_workdir(root)` walks the folder once and says exactly what will arrive: every file (its
mode and sha256), link and folder, and what is left out and why. What decides:

- Ignore rules. Every `.gitignore` in the folder, read with git's own semantics
  (launcher/workdir/gitignore.py), and, when the folder is inside a git repository, the `.gitignore`
  files above it up to the repository's top and `.git/info/exclude`, as git would apply them.
  Not read: git's global excludes file (this machine's taste, not the project's). Rules decide
  by name, as git's do: a file git already tracks is still left out when a rule matches it
  (launch reads the rules, not git's index; `!name` in .launchignore brings it back).
  `.launchignore` files, same syntax, ADD to .gitignore: a folder's .launchignore rules count
  as if written after its .gitignore's, so they can also re-include (`!data/small.csv`).
  SkyPilot's `.skyignore`, by contrast, silently replaces .gitignore when present, a known
  surprise (its #4015). As in git, nothing inside a left-out folder can come back, and
  launch does not even look inside one (a `.git` or `node_modules` costs nothing).
  `.git` is never shipped. A `.gitignore` that is a symbolic link is not read (git does not
  follow them either); a warning says so.
- Links are shipped as links, never followed. A link is refused (WorkdirError naming it and
  its target) when its target is absolute, climbs out of the folder (resolved the way the
  kernel does, through other links of the folder), or makes a loop: `a -> b -> a`, a link to
  its own folder or one above it (`l -> .`, SkyPilot #814 uploaded that forever), or links
  leading into each other's folders. A link that points to nothing in the folder (dangling,
  or to something left out) is shipped as it is, with a warning: it dangles the same way on
  the node, and may be meant to (a `latest` link the job fills in); SkyPilot #755 broke on
  them.
- FIFOs, sockets and devices are left out with the reason, never opened.
- Unreadable files or folders: WorkdirError naming each one.
- Size: a warning above `warn_bytes` naming the largest files, WorkdirError above
  `limit_bytes`, checked before anything is read.
- Files that look like credentials are listed in `secrets` (see SECRET_NAMES and the private
  key check), not left out: launch says so before they leave this machine.

Content, never modification times, says what changed (SkyPilot #2303: rsync's mtime check
skipped files changed by a branch switch). Hashing is cached in $LAUNCH_HOME/workdir-hashes,
keyed by what git's index keys a file's stat data on: device, inode, size, mtime and ctime in
nanoseconds. Safe because any write to a file changes its mtime and ctime (ctime cannot be set
from user space), and a replacement (an editor's save by rename) changes the inode; the one
gap is a write within the clock tick of the hashing itself, so, like git with its "racy"
entries, a file changed less than two seconds before it was hashed is not cached. This assumes
the file server's clock agrees with this machine's to within that margin, as git does.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError
from launcher.core.home import keeps_nothing, launch_home
from launcher.workdir import gitignore
from launcher.workdir.node import link_cycles, reserved, resolve_link, stat_key

GIT_REASON = "`.git/` is never shipped"
NODE_COPY_REASON = "launch's bookkeeping in a node's copy"
IGNORE_FILES = (".gitignore", ".launchignore")   # a folder's rules, in this order
SECRET_NAMES = (
    # (patterns on the file's name, lower-cased; what it usually is)
    ((".env", ".env.*"), "a dotenv file"),
    ((".envrc",), "a direnv file"),
    (("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
      "id_xmss"), "an SSH private key's name"),
    (("*.pem", "*.key"), "a PEM key or certificate"),
    (("*.p12", "*.pfx", "*.jks", "*.keystore"), "a key store"),
    (("*.ppk",), "a PuTTY private key"),
    (("*.kdbx",), "a KeePass database"),
    (("credentials*", "client_secret*.json"), "named credentials"),
    (("secrets.*",), "named secrets"),
    ((".netrc", "_netrc", ".pgpass", ".git-credentials", ".pypirc", ".npmrc", ".htpasswd",
      ".boto", ".s3cfg"), "a tool's credentials file"),
)
# Templates meant to be committed: `.env.example` is not a secret.
_TEMPLATE_SUFFIXES = (".example", ".sample", ".template", ".dist", ".defaults")
_KEY_HEADERS = (b"-----BEGIN ", b"PuTTY-User-Key-File-")
_SMALL = 1 << 20            # read whole (and checked for a private key) below this size
_RACY_NS = 2 * 10**9


class WorkdirError(LauncherError):
    """The folder cannot be shipped; the message names the path and what to do."""


@dataclass(frozen=True)
class Entry:
    path: str                 # relative, `/`-separated
    kind: str                 # file | link | dir
    mode: int                 # permission bits (0o777 for links)
    size: int = 0
    sha256: str | None = None
    target: str | None = None
    mtime_ns: int = 0         # files: given back on the node (not part of the digest)


@dataclass(frozen=True)
class Excluded:
    path: str                 # folders end with `/`
    reason: str
    size: int | None = None   # a file's bytes (a left-out folder is not looked into)
    rule: bool = False        # left out by an ignore rule (.gitignore, .launchignore)


@dataclass(frozen=True)
class Secret:
    path: str
    why: str


@dataclass(frozen=True)
class Manifest:
    root: Path
    entries: tuple[Entry, ...]
    excluded: tuple[Excluded, ...] = ()
    secrets: tuple[Secret, ...] = ()
    warnings: tuple[str, ...] = ()
    total_bytes: int = 0
    files: int = 0
    digest: str = field(default="")   # the content's identity: see manifest_digest()
    # path -> [dev, inode, size, mtime_ns, ctime_ns] when scanned, for the files whose stat
    # data proves their content (last changed over 2 s before they were read, the hash
    # cache's rule): a ship that finds a file still so need not hash it again.
    proven: dict[str, list[int]] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root), "digest": self.digest, "files": self.files,
            "total_bytes": self.total_bytes,
            "entries": [{k: v for k, v in vars(e).items() if v is not None}
                        for e in self.entries],
            "excluded": [{k: v for k, v in vars(x).items() if v is not None}
                         for x in self.excluded],
            "secrets": [vars(s) for s in self.secrets],
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """A manifest to_json wrote (a detached run's request: its controller ships nothing
        and plans from it)."""
        return cls(root=Path(data["root"]), entries=tuple(Entry(**e) for e in data["entries"]),
                   excluded=tuple(Excluded(**x) for x in data.get("excluded", ())),
                   secrets=tuple(Secret(**x) for x in data.get("secrets", ())),
                   warnings=tuple(data.get("warnings", ())),
                   total_bytes=int(data.get("total_bytes", 0)), files=int(data.get("files", 0)),
                   digest=data.get("digest", ""))

    def render(self, shown: int = 3) -> list[str]:
        """Lines for --dry-run: what goes, what is left out (per reason, the first few), the
        secrets and warnings."""
        links = sum(e.kind == "link" for e in self.entries)
        folders = sum(e.kind == "dir" for e in self.entries)
        lines = [f"workdir {self.root}: {self.files} files, {human_bytes(self.total_bytes)}"
                 + (f", {links} links" if links else "")
                 + (f", {folders} folders" if folders else "")
                 + f" (content {self.digest[:12]})"]
        by_reason: dict[str, list[str]] = {}
        for item in self.excluded:
            by_reason.setdefault(item.reason, []).append(item.path)
        if by_reason:
            lines.append(f"  left out ({len(self.excluded)}):")
        for reason, paths in by_reason.items():
            more = f", and {len(paths) - shown} more" if len(paths) > shown else ""
            lines.append(f"    {reason}: {', '.join(paths[:shown])}{more}")
        if self.secrets:
            lines.append(f"  shipped, but they look like secrets ({len(self.secrets)}; add them "
                         "to .launchignore if the job does not need them):")
            lines += [f"    {s.path} ({s.why})" for s in self.secrets]
        lines += [f"  warning: {w}" for w in self.warnings]
        return lines

    def wire_entries(self) -> list[list[Any]]:
        """The entries as launcher/workdir/node.py receives them."""
        return [[e.path, e.kind, e.mode, e.size, e.sha256 or "", e.target or "", e.mtime_ns]
                for e in self.entries]


def human_bytes(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def manifest_digest(entries: tuple[Entry, ...]) -> str:
    """sha256 over every entry's path, kind, mode, content hash and link target: equal for
    two folders exactly when the node would get the same tree (times do not count)."""
    digest = hashlib.sha256()
    for e in entries:
        digest.update(os.fsencode(e.path) + b"\0" + e.kind.encode() + b"\0"
                      + f"{e.mode:o}".encode() + b"\0" + (e.sha256 or "").encode() + b"\0"
                      + os.fsencode(e.target or "") + b"\n")
    return digest.hexdigest()


# ---- ignore rules ----------------------------------------------------------------------------

def _read_rules(folder: Path, base: bytes, shown: str, warnings: list[str],
                problems: list[tuple[str, str]]) -> list[gitignore.Rule]:
    rules: list[gitignore.Rule] = []
    for name in IGNORE_FILES:
        path = folder / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            problems.append((f"{shown}{name}", f"cannot read it ({err.strerror})"))
            continue
        if stat.S_ISLNK(st.st_mode):
            warnings.append(f"{shown}{name} is a symbolic link: its rules are not read "
                            "(git does not follow it either)")
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            data = path.read_bytes()
        except OSError as err:
            problems.append((f"{shown}{name}", f"cannot read it ({err.strerror})"))
            continue
        rules += gitignore.parse(data, f"{shown}{name}", base)
    return rules


def _git_dir(top: Path) -> Path | None:
    dot = top / ".git"
    if dot.is_dir():
        return dot
    try:
        text = dot.read_text()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = (top / text[len("gitdir:"):].strip()).resolve()
    try:
        return (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    except OSError:
        return gitdir


def _outer_rules(root: Path, warnings: list[str], problems: list[tuple[str, str]]
                 ) -> tuple[bytes, list[list[gitignore.Rule]]]:
    """When `root` is inside a git repository: its path from the repository's top (what rule
    paths are matched against) and the rules that apply from outside `root`, least specific
    first (.git/info/exclude, then each .gitignore from the top down to root's parent)."""
    top = next((p for p in [root, *root.parents] if (p / ".git").exists()), None)
    if top is None:
        return b"", []
    lists = []
    git_dir = _git_dir(top)
    if git_dir is not None:
        exclude = git_dir / "info" / "exclude"
        try:
            data = exclude.read_bytes()
            lists.append(gitignore.parse(data, os.path.relpath(exclude, root), b""))
        except OSError:
            pass
    if top == root:
        return b"", lists
    prefix = os.fsencode(root.relative_to(top).as_posix())
    folder = top
    for part in root.relative_to(top).parts:
        shown = os.path.relpath(folder, root) + "/"
        base = os.fsencode(folder.relative_to(top).as_posix()) if folder != top else b""
        lists.append(_read_rules(folder, base, shown, warnings, problems))
        folder = folder / part
    return prefix, lists


# ---- the walk --------------------------------------------------------------------------------

_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


@dataclass
class _Walk:
    files: list[tuple[bytes, os.stat_result]] = field(default_factory=list)
    links: list[tuple[bytes, bytes]] = field(default_factory=list)
    dirs: list[tuple[bytes, os.stat_result]] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)   # (path, why)


def _walk(root: Path, leave_out: dict[bytes, str]) -> _Walk:
    walk = _Walk()
    prefix, outer = _outer_rules(root, walk.warnings, walk.problems)
    top = os.fsencode(root)
    stack: list[tuple[bytes, list[list[gitignore.Rule]]]] = [(b"", outer)]
    while stack:
        rel, lists = stack.pop()
        shown = os.fsdecode(rel) + "/" if rel else ""
        folder = os.path.join(top, rel) if rel else top
        try:
            with os.scandir(folder) as listing:
                items = sorted(listing, key=lambda e: e.name)
        except OSError as err:
            walk.problems.append((shown, f"cannot list it ({err.strerror})"))
            continue
        base = prefix + b"/" + rel if prefix and rel else prefix or rel
        own = _read_rules(Path(os.fsdecode(folder)), base, shown, walk.warnings, walk.problems)
        if own:
            lists = [*lists, own]
        for item in items:
            path = rel + b"/" + item.name if rel else item.name
            name = os.fsdecode(path)
            why = GIT_REASON if item.name == b".git" else leave_out.get(path) or (
                NODE_COPY_REASON if reserved(name) else None)
            if why:
                walk.excluded.append(Excluded(name + ("/" if item.is_dir() else ""), why))
                continue
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue   # gone since the listing
            except OSError as err:
                walk.problems.append((name, f"cannot read it ({err.strerror})"))
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            rule = gitignore.decide(lists, prefix + b"/" + path if prefix else path, is_dir)
            if rule is not None and not rule.negative:
                walk.excluded.append(Excluded(name + ("/" if is_dir else ""), rule.describe(),
                                              None if is_dir else st.st_size, rule=True))
            elif is_dir:
                walk.dirs.append((path, st))
                stack.append((path, lists))
            elif stat.S_ISREG(st.st_mode):
                walk.files.append((path, st))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    walk.links.append((path, os.readlink(item.path)))
                except OSError as err:
                    walk.problems.append((name, f"cannot read the link ({err.strerror})"))
            else:
                walk.excluded.append(Excluded(name, next(
                    (w for test, w in _SPECIAL if test(st.st_mode)), "not a regular file")))
    return walk


# ---- content ---------------------------------------------------------------------------------

def _hash_file(path: bytes, st: os.stat_result) -> tuple[str, bool]:
    """(sha256, holds a private key) of the file lstat said is regular. Opened without
    following links and without blocking, and checked to be the same file (a swap for a FIFO
    or a link since the walk must not hang or mislead)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(0, "it changed while launch read it; run again")
        if st.st_size < _SMALL:
            data = f.read()
            if len(data) != st.st_size:
                raise OSError(0, "it changed while launch read it; run again")
            head = data[:4096].lstrip()
            return (hashlib.sha256(data).hexdigest(),
                    head.startswith(_KEY_HEADERS) and (b"PRIVATE KEY" in head[:100]
                                                       or head.startswith(_KEY_HEADERS[1])))
        if hasattr(hashlib, "file_digest"):
            digest = hashlib.file_digest(f, "sha256")
        else:
            digest = hashlib.sha256()   # Python 3.10
            while chunk := f.read(_SMALL):
                digest.update(chunk)
        if f.tell() != st.st_size:
            raise OSError(0, "it changed while launch read it; run again")
        return digest.hexdigest(), False


def _hash_or_error(path: bytes, st: os.stat_result) -> tuple[str, bool, int] | OSError:
    """(sha256, holds a private key, when the reading began) or the error."""
    began = time.time_ns()
    try:
        return (*_hash_file(path, st), began)
    except OSError as err:
        return err


class _HashCache:
    """path -> [dev, ino, size, mtime_ns, ctime_ns, sha256, holds a key] of one folder, in
    $LAUNCH_HOME/workdir-hashes/<hash of the folder's path>.json (see the module's doc)."""

    def __init__(self, root: Path):
        name = hashlib.sha256(os.fsencode(root)).hexdigest()[:32]
        self.path = launch_home() / "workdir-hashes" / f"{name}.json"
        try:
            self.old = json.loads(self.path.read_text())
            if not isinstance(self.old, dict):
                self.old = {}
        except (OSError, ValueError):
            self.old = {}
        self.new: dict[str, list] = {}

    def get(self, path: str, st: os.stat_result) -> tuple[str, bool] | None:
        record = self.old.get(path)
        if isinstance(record, list) and len(record) == 7 and record[:5] == stat_key(st):
            self.new[path] = record
            return record[5], bool(record[6])
        return None

    def put(self, path: str, st: os.stat_result, sha: str, key: bool, read_ns: int) -> bool:
        """Remember the hash unless the file changed too shortly before it was read; True if
        remembered (its stat data then proves its content)."""
        if max(st.st_mtime_ns, st.st_ctime_ns) < read_ns - _RACY_NS:
            self.new[path] = [*stat_key(st), sha, key]
            return True
        return False

    def save(self) -> None:
        if self.new == self.old or keeps_nothing():   # a dry run keeps nothing
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.new))
            os.replace(tmp, self.path)
        except OSError:
            pass   # a cache: the next scan hashes again


# SECRET_NAMES as one expression, a named group per reason (a scan asks it of every file).
_SECRET_RE = re.compile("|".join(
    f"(?P<g{i}>{'|'.join(fnmatch.translate(p) for p in patterns)})"
    for i, (patterns, _why) in enumerate(SECRET_NAMES)))


def secret_reason(path: str) -> str | None:
    """Why a file's path suggests it holds credentials, or None (SECRET_NAMES)."""
    name = path.rpartition("/")[2].lower()
    if name.endswith(_TEMPLATE_SUFFIXES):
        return None
    found = _SECRET_RE.match(name)
    if found:
        return SECRET_NAMES[int(found.lastgroup[1:])][1]
    if name.startswith("id_") and "." not in name:
        return "an SSH private key's name"
    if path.lower().endswith((".docker/config.json", ".kube/config")):
        return "a tool's credentials file"
    return None


# ---- links -----------------------------------------------------------------------------------

def _check_links(entries: dict[str, Entry], excluded: list[Excluded],
                 problems: list[tuple[str, str]], warnings: list[str]) -> None:
    kinds = {"": "dir", **{p: e.kind for p, e in entries.items()}}
    targets = {p: e.target or "" for p, e in entries.items() if e.kind == "link"}
    left_out = {x.path.rstrip("/"): x.reason for x in excluded}
    to_folders = {}
    for link, target in targets.items():
        state, where = resolve_link(kinds, targets, link)
        if state == "escapes":
            problems.append((link, f"a link to {target}, which is outside the folder"
                             + (" (an absolute target)" if target.startswith("/") else "")
                             + ": make it relative and inside, ship the file itself, or list "
                               "the link in .launchignore"))
        elif state == "loop":
            problems.append((link, f"a link to {target}, a loop of links (through {where}): "
                                   "fix or remove it, or list it in .launchignore"))
        elif state == "dangling":
            parts = where.split("/")
            gone = next((("/".join(parts[:i]), left_out["/".join(parts[:i])])
                         for i in range(1, len(parts) + 1) if "/".join(parts[:i]) in left_out),
                        None)
            warnings.append(f"link {link} -> {target} points to {where}, which is left out "
                            f"({gone[1]}): it dangles on the nodes" if gone else
                            f"link {link} -> {target} points to nothing in the folder: it is "
                            "shipped dangling")
        elif kinds.get(where) == "dir":
            to_folders[link] = where
    for link in link_cycles(kinds, to_folders):
        problems.append((link, f"a link to {targets[link]}, which leads back into a folder "
                               "holding it (endless for anyone following links): remove it or "
                               "list it in .launchignore"))


# ---- the scan --------------------------------------------------------------------------------

def _largest(files: list[tuple[bytes, os.stat_result]], count: int = 5) -> str:
    biggest = sorted(files, key=lambda f: f[1].st_size, reverse=True)[:count]
    return ", ".join(f"{os.fsdecode(p)} ({human_bytes(st.st_size)})" for p, st in biggest)


def scan_workdir(root: Path, *, limit_bytes: int = 1 << 30, warn_bytes: int = 100 * 10**6,
                 limit_hint: str = "the workdir size limit",
                 leave_out: Mapping[Path, str] | None = None) -> Manifest:
    """The manifest of `root` (see the module's doc). WorkdirError when it cannot be shipped:
    not a folder, unreadable parts, links that leave it or loop, more than `limit_bytes`
    (`limit_hint` names the setting that raises the limit, in the message). `leave_out`:
    absolute paths of files or folders never shipped whatever the rules say (the runs folder
    when it lies inside the workdir), each with the reason `excluded` gives."""
    given = Path(root)
    try:
        root = given.resolve(strict=True)
    except (OSError, RuntimeError) as err:
        raise WorkdirError(f"workdir {given}: {getattr(err, 'strerror', None) or err}") \
            from None
    if not root.is_dir():
        raise WorkdirError(f"workdir {given} is not a folder: give the folder that holds the "
                           "code to ship")
    inside = {}
    for path, why in (leave_out or {}).items():
        try:
            inside[os.fsencode(Path(path).resolve().relative_to(root).as_posix())] = why
        except ValueError:
            pass   # not in the folder
    walk = _walk(root, inside)
    total = sum(st.st_size for _, st in walk.files)
    if total > limit_bytes:
        raise WorkdirError(
            f"workdir {root} holds {human_bytes(total)} to ship, more than the limit of "
            f"{human_bytes(limit_bytes)}; the largest files: {_largest(walk.files)}. List what "
            f"the job does not need in {root}/.launchignore (gitignore syntax), or raise "
            f"{limit_hint}")
    if total > warn_bytes:
        walk.warnings.append(f"{human_bytes(total)} to ship (over {human_bytes(warn_bytes)}); "
                             f"the largest files: {_largest(walk.files)}")

    cache = _HashCache(root)
    proven: dict[str, list[int]] = {}
    entries: dict[str, Entry] = {}
    secrets = []
    top = os.fsencode(root)
    known = {path: cache.get(os.fsdecode(path), st) for path, st in walk.files}
    unknown = [(path, st) for path, st in walk.files if known[path] is None]
    # Hashing releases the GIL: a few threads, each with a share of the files, keep the
    # cores and the disk busy at once.
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        shares = pool.map(lambda share: [(path, _hash_or_error(os.path.join(top, path), st))
                                         for path, st in share],
                          [unknown[i::workers] for i in range(workers)])
        hashed = dict(pair for share in shares for pair in share)
    for path, st in walk.files:
        name = os.fsdecode(path)
        found = known[path]
        if found is None:
            found = hashed[path]
            if isinstance(found, FileNotFoundError):
                continue
            if isinstance(found, OSError):
                walk.problems.append((name, f"cannot read it ({found.strerror})"))
                continue
            if cache.put(name, st, *found):
                proven[name] = stat_key(st)
        else:
            proven[name] = stat_key(st)
        sha, holds_key = found[:2]
        entries[name] = Entry(name, "file", st.st_mode & 0o777, st.st_size, sha,
                              mtime_ns=st.st_mtime_ns)
        why = "holds a private key" if holds_key else secret_reason(name)
        if why:
            secrets.append(Secret(name, why))
    cache.save()
    for path, st in walk.dirs:
        entries[os.fsdecode(path)] = Entry(os.fsdecode(path), "dir", st.st_mode & 0o777)
    for path, target in walk.links:
        entries[os.fsdecode(path)] = Entry(os.fsdecode(path), "link", 0o777,
                                           target=os.fsdecode(target))
    _check_links(entries, walk.excluded, walk.problems, walk.warnings)
    if walk.problems:
        listed = "\n".join(f"  {root / path if path else root}: {why}"
                           for path, why in walk.problems)
        raise WorkdirError(f"workdir {root} cannot be shipped:\n{listed}")
    ordered = tuple(entries[p] for p in sorted(entries, key=os.fsencode))
    return Manifest(
        root=root, entries=ordered,
        excluded=tuple(sorted(walk.excluded, key=lambda x: os.fsencode(x.path))),
        secrets=tuple(sorted(secrets, key=lambda s: os.fsencode(s.path))),
        warnings=tuple(walk.warnings), total_bytes=sum(e.size for e in ordered),
        files=sum(e.kind == "file" for e in ordered), digest=manifest_digest(ordered),
        proven=proven)
