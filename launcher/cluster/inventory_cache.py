"""Ansible's answer for an inventory, kept between commands while nothing it depends on changed.

Every `launch run/check/bench/setup/attach -i` reads the inventory with Ansible's own loader in
a child process (launcher/cluster/inventory.py): starting Python, importing Ansible and
computing every host's variables cost 0.6 s for 4 hosts and 1.2 s for 256 on the development
machine (benchmarks/inventory_load.py), for the same answer each time when nobody edited the
files. The answer is kept in $LAUNCH_HOME/inventory-cache/, one file per inventory path and
--limit pattern, and used again only while its key is the same: a sha256 over

- what Ansible reads: the inventory file, or every entry of an inventory folder, and the
  group_vars/ and host_vars/ trees beside the file: every name in them (a new group_vars file
  changes the key), every file's bytes and whether it is executable (a file made executable
  turns into a script inventory); dot-files are left out, as Ansible leaves them out;
- what decides how Ansible reads them: the ansible.cfg files it may pick (ANSIBLE_CONFIG,
  ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg), the folders of legacy vars plugins,
  every ANSIBLE_* variable, the Ansible release, the interpreter, and launch's own code that
  decides the answer or checks the files before Ansible reads them (ansible_inventory.py,
  inventory_files.py and the limits and YAML bounds it uses: a kept answer skips that check,
  its files being byte for byte those that passed it);
- the --limit pattern.

Contents rather than (size, mtime, inode): a file rewritten within the filesystem's clock tick
keeps its stat data (git's "racy" entries), and a server's clock may disagree with this one;
hashing the few kilobytes of an inventory costs milliseconds, like the bounds check that reads
the same files (inventory_files.py). The key is computed before the loader runs and again after:
a file that changed while Ansible read it keeps the answer out.

An answer is kept only when it came from files alone: every source parsed by the ini, yaml or
toml plugin (a script or an inventory plugin such as aws_ec2 answers anew each run: never
kept), host_group_vars the only vars plugin that ran, no vault-encrypted text (its decrypted
values are never written to disk), and no error. An entry that cannot be read, is not what
launch writes, or has another key is a miss, never an error: the loader runs and the entry is
written anew. Bounded: MAX_ENTRIES files (the least recently used go first), MAX_ENTRY_BYTES
each, and an inventory whose trees hold more than MAX_TREE_ENTRIES entries or MAX_TREE_BYTES
is read by Ansible every time. LAUNCH_INVENTORY_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError
from launcher.core.home import keeps_nothing, launch_home
from launcher.core.safefile import MIB, UnsafeFile, read_json, read_bytes, write_text

CACHE_ENV = "LAUNCH_INVENTORY_CACHE"
FOLDER = "inventory-cache"
FORMAT = 1
MAX_ENTRIES = 64
MAX_ENTRY_BYTES = 32 * MIB
MAX_TREE_ENTRIES = 2000
MAX_TREE_BYTES = 64 * MIB
MAX_TREE_DEPTH = 32
# Inventory plugins whose answer is a function of the file they parse.
FILE_PLUGINS = {"ini", "yaml", "toml"}
# Vars plugins whose answer is a function of the group_vars/ and host_vars/ files.
FILE_VARS_PLUGINS = {"host_group_vars"}
_VAULT = b"$ANSIBLE_VAULT"
_CONFIGS = ("ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg")
_VARS_PLUGIN_DIRS = ("~/.ansible/plugins/vars", "/usr/share/ansible/plugins/vars")
# launch's own code that decides the answer or whether the files may reach Ansible at all (a
# kept answer skips the bounds check: its files passed it).
_LAUNCH_CODE = (("cluster", "ansible_inventory.py"), ("cluster", "inventory_files.py"),
                ("core", "limits.py"), ("core", "yamlfile.py"))


class _NotKept(Exception):
    """This inventory's answer cannot be kept (why in the message)."""


def enabled() -> bool:
    value = os.environ.get(CACHE_ENV, "").strip().lower()
    if value in ("", "1", "on"):
        return True
    if value in ("0", "off"):
        return False
    raise LauncherError(f"{CACHE_ENV}={os.environ[CACHE_ENV]!r}: use 0 to read every "
                        "inventory with Ansible's loader each time, 1 (the default) to keep "
                        "its answers")


def _plain_name(plugin: str) -> str:
    return plugin.removeprefix("ansible.builtin.")


def _feed(digest: Any, *parts: Any) -> None:
    digest.update(repr(parts).encode() + b"\n")


class _Tree:
    """Feeds files and folders into a digest, within the bounds."""

    def __init__(self, digest: Any):
        self.digest, self.entries, self.bytes = digest, 0, 0

    def add(self, path: Path, visiting: tuple = ()) -> None:
        self.entries += 1
        if self.entries > MAX_TREE_ENTRIES:
            raise _NotKept(f"more than {MAX_TREE_ENTRIES} files")
        if len(visiting) > MAX_TREE_DEPTH:
            raise _NotKept(f"{path}: folders nested more than {MAX_TREE_DEPTH} deep")
        try:
            info = os.stat(path)    # links followed, as Ansible follows them
        except (FileNotFoundError, NotADirectoryError):
            _feed(self.digest, str(path), "absent")
            return
        except OSError as err:
            raise _NotKept(f"{path}: {err.strerror or err}") from None
        if stat.S_ISDIR(info.st_mode):
            here = (info.st_dev, info.st_ino)
            if here in visiting:
                raise _NotKept(f"{path}: a loop of links")
            try:
                names = sorted(n for n in os.listdir(path) if not n.startswith("."))
            except OSError as err:
                raise _NotKept(f"{path}: {err.strerror or err}") from None
            _feed(self.digest, str(path), "folder", names)
            for name in names:
                self.add(path / name, (*visiting, here))
        elif stat.S_ISREG(info.st_mode):
            self.bytes += info.st_size
            if self.bytes > MAX_TREE_BYTES:
                raise _NotKept(f"more than {MAX_TREE_BYTES >> 20} MiB")
            try:
                data = read_bytes(path, "inventory file", max_bytes=MAX_TREE_BYTES)
            except UnsafeFile as err:
                raise _NotKept(str(err)) from None
            if _VAULT in data:
                raise _NotKept(f"{path}: vault-encrypted")
            _feed(self.digest, str(path), "file", bool(info.st_mode & 0o111),
                  hashlib.sha256(data).hexdigest())
        else:
            raise _NotKept(f"{path}: not a file or folder")


def _ansible_release() -> str:
    """Ansible's release file as this interpreter would import it (not imported here:
    importing Ansible is what the child process is for)."""
    try:
        spec = importlib.util.find_spec("ansible")
    except (ImportError, ValueError):
        return "no ansible"
    if spec is None or not spec.origin:
        return "no ansible"
    try:
        release = Path(spec.origin).with_name("release.py").read_bytes()
    except OSError:
        return f"ansible at {spec.origin}"
    return hashlib.sha256(release).hexdigest()


def _launch_code() -> list[str]:
    found = []
    for folder, name in _LAUNCH_CODE:
        try:
            found.append(hashlib.sha256((resources.files("launcher") / folder / name)
                                        .read_bytes()).hexdigest())
        except OSError:
            found.append(f"no {folder}/{name}")
    return found


def inventory_key(path: str, limit: str) -> str:
    """The key of Ansible's answer for `path` and `limit` (see the module's doc). Raises
    _NotKept when the answer cannot be kept."""
    digest = hashlib.sha256()
    _feed(digest, FORMAT, limit, sys.executable, _ansible_release(),
          sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_")))
    tree = _Tree(digest)
    source = Path(os.path.abspath(path))
    tree.add(source)
    if not source.is_dir():
        for sub in ("group_vars", "host_vars"):
            tree.add(source.parent / sub)
    configs = [os.environ.get("ANSIBLE_CONFIG") or "", *_CONFIGS, *_VARS_PLUGIN_DIRS]
    for where in configs:
        if where:
            tree.add(Path(os.path.abspath(os.path.expanduser(where))))
    _feed(digest, _launch_code())
    return digest.hexdigest()


def _valid(answer: Any) -> bool:
    if not isinstance(answer, dict) or not isinstance(answer.get("hosts"), list):
        return False
    if not all(isinstance(w, str) for w in answer.get("warnings") or []):
        return False
    return all(isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
               and isinstance(entry[1], dict) for entry in answer["hosts"])


def _from_files(answer: dict[str, Any]) -> bool:
    """Whether the loader's answer came from the files alone (see the module's doc)."""
    parsed = {_plain_name(p) for p in answer.get("parsed_by") or []}
    used = {_plain_name(p) for p in answer.get("vars_plugins") or []}
    if answer.get("error") or not parsed or not parsed <= FILE_PLUGINS:
        return False
    # With hosts, host_group_vars always runs: none seen means launch's loader no longer
    # sees which plugins ran (another Ansible), so nothing is known of them.
    return used <= FILE_VARS_PLUGINS and bool(used or not answer.get("hosts"))


class InventoryCache:
    """The kept answer for one inventory and --limit pattern: `answer()` before asking Ansible,
    `keep(answer)` after."""

    def __init__(self, path: str, limit: str):
        self.path, self.limit = path, limit
        self.home = launch_home()
        name = hashlib.sha256(f"{os.path.abspath(path)}\0{limit}".encode()).hexdigest()[:32]
        self.entry = self.home / FOLDER / f"{name}.json"
        self.key: str | None = None
        if enabled():
            try:
                self.key = inventory_key(path, limit)
            except _NotKept:
                pass

    def answer(self) -> dict[str, Any] | None:
        """The kept answer when its key is this inventory's, else None."""
        if self.key is None:
            return None
        try:
            kept = read_json(self.entry, "inventory cache entry", max_bytes=MAX_ENTRY_BYTES,
                             within=self.home, follow=False)
        except (UnsafeFile, OSError):
            return None
        if not (isinstance(kept, dict) and kept.get("format") == FORMAT
                and kept.get("key") == self.key and _valid(kept.get("answer"))):
            return None
        if not keeps_nothing():   # a dry run touches nothing
            try:
                os.utime(self.entry)   # recently used: pruned last
            except OSError:
                pass
        return kept["answer"]

    def keep(self, answer: dict[str, Any]) -> None:
        """Keep the loader's answer, when it came from files alone and none of them changed
        while Ansible read them."""
        if self.key is None or keeps_nothing() or not _valid(answer) or \
                not _from_files(answer):
            return
        try:
            if inventory_key(self.path, self.limit) != self.key:
                return
        except _NotKept:
            return
        text = json.dumps({"format": FORMAT, "key": self.key, "answer": answer})
        if len(text) > MAX_ENTRY_BYTES:
            return
        try:
            os.makedirs(self.home, exist_ok=True)
            write_text(self.entry, text, within=self.home, mode=0o600)
        except (UnsafeFile, OSError):
            return   # a cache: the next command asks Ansible again
        _prune(self.entry.parent)


def _prune(folder: Path) -> None:
    """The least recently used entries beyond MAX_ENTRIES removed."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".json") and e.is_file(
            follow_symlinks=False)]
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns, reverse=True)
        for old in entries[MAX_ENTRIES:]:
            os.unlink(old.path)
    except OSError:
        pass
