"""What Ansible's inventory loader will read, checked before it reads it.

Ansible expands host ranges (`gpu-[01:16]`) into every host and loads YAML without bounds: a
57-byte inventory `h[0:999999]` kept its loader busy for 120 s and ~1 GB before launch gave up,
and an alias bomb in a group_vars file reaches a loader that lacks launch's alias and size
bounds. So every file the loader reads (the inventory file, or every file of an inventory
folder as Ansible walks it; the group_vars/ and host_vars/ beside it) is read here first as a
small text file, its YAML through launch's bounded loader (launcher/core/yamlfile.py), and its host
patterns counted as Ansible would expand them, against the most nodes a recipe may ask for.
Everything here is linear in the files' sizes, which are capped: it answers in well under a
second whatever the files hold.
"""

from __future__ import annotations

import os
import re
import shlex
import string
from pathlib import Path
from typing import Any

from launcher.core.errors import InventoryError
from launcher.core.limits import MAX_NODES
from launcher.core.yamlfile import YamlFileError, load_yaml_text, read_text_file, shorten

MAX_FILES = 1000
MAX_TOTAL_BYTES = 64 << 20
# Ansible's own lists (ansible/inventory/manager.py IGNORED_ALWAYS, constants REJECT_EXTS and
# INVENTORY_IGNORE_EXTS' default; parsing/dataloader.py find_vars_files).
_IGNORED = re.compile(r"^\.|^host_vars$|^group_vars$|^vars_plugins$|(\.pyc|\.pyo|\.swp|\.bak|~|"
                      r"\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|\.retry)$")
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
_INI_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?")


def range_size(pattern: str, cap: int) -> int:
    """How many hosts Ansible expands `pattern` into (ansible/plugins/inventory/__init__.py
    expand_hostname_range: each [begin:end(:step)] in turn, numeric or letters), counted
    without expanding; stops counting past `cap`. A range Ansible would refuse counts 1 (its
    loader then says why)."""
    total = 1
    text = pattern
    while "[" in text and total <= cap:
        parts = text.replace("[", "|", 1).replace("]", "|", 1).split("|")
        if len(parts) != 3:
            return total
        head, nrange, tail = parts
        size = _group_size(nrange)
        if size is None:
            return total
        total *= size
        text = head + "0" + tail
    return total


def _group_size(nrange: str) -> int | None:
    bounds = nrange.split(":")
    if len(bounds) not in (2, 3) or not bounds[1]:
        return None
    beg, end = bounds[0] or "0", bounds[1]
    try:
        step = int(bounds[2]) if len(bounds) == 3 else 1
    except ValueError:
        return None
    letters = string.ascii_letters
    if beg in letters and end in letters and len(beg) == len(end) == 1:
        if step == 0:
            return None
        return len(letters[letters.index(beg):letters.index(end) + 1:step])
    try:
        first, last = int(beg), int(end)
    except ValueError:
        return None
    if step > 0:
        return max(0, (last - first) // step + 1)
    if step < 0:
        return max(0, (first - last - 2) // -step + 1)
    return None


def files_ansible_reads(path: Path) -> list[tuple[Path, str]]:
    """(file, "inventory" | "variables") for every file Ansible's loader and its
    host_group_vars plugin may read for this inventory source, in Ansible's order."""
    out: list[tuple[Path, str]] = []

    def walk(source: Path) -> None:
        if source.is_dir():
            for name in sorted(os.listdir(source)):
                if not _IGNORED.search(name):
                    walk(source / name)
        elif source.exists():
            out.append((source, "inventory"))
        _limit(out, path)

    walk(path)
    base = path if path.is_dir() else path.parent
    for sub in ("group_vars", "host_vars"):
        for root, dirs, names in os.walk(base / sub):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                if name.startswith(".") or name.endswith("~"):
                    continue
                if os.path.splitext(name)[1] in ("", *YAML_EXTENSIONS):
                    out.append((Path(root) / name, "variables"))
            _limit(out, path)
    return out


def _limit(found: list, path: Path) -> None:
    if len(found) > MAX_FILES:
        raise InventoryError(str(path), None, f"Ansible would read more than {MAX_FILES} files "
                                              "for this inventory: give the inventory file "
                                              "itself, or a folder of a few")


def ini_host_patterns(text: str) -> list[str]:
    """The host patterns of an INI inventory: the first word of each line in a host section
    (ansible/plugins/inventory/ini.py: sections [group], [group:vars], [group:children])."""
    patterns, kind = [], "hosts"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        section = _INI_SECTION.fullmatch(line)
        if section:
            kind = section[2] or "hosts"
            continue
        if kind != "hosts":
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        if words:
            patterns.append(words[0])
    return patterns


def yaml_host_patterns(path: str, data: dict) -> list[str]:
    """The host patterns of a YAML inventory, its groups' shape checked on the way."""
    patterns: list[str] = []
    for name, group in data.items():
        _check_group(path, str(name), group, patterns)
    return patterns


def _check_group(path: str, where: str, group: Any, patterns: list[str]) -> None:
    """The shape of one YAML inventory group: Ansible accepts some wrong shapes silently
    (children: x) and crashes on others."""
    if group is None:
        return
    if not isinstance(group, dict):
        raise InventoryError(path, None, f"{where} must be a mapping with hosts, vars or "
                                         f"children, got {shorten(group)}")
    for key, value in group.items():
        if key not in ("hosts", "vars", "children"):
            raise InventoryError(path, None, f"{where}.{key}: unknown key (a group holds "
                                             "hosts, vars and children)")
        if value is not None and not isinstance(value, dict):
            raise InventoryError(path, None, f"{where}.{key} must be a mapping, got "
                                             f"{shorten(value)}")
    for host, hostvars in (group.get("hosts") or {}).items():
        if hostvars is not None and not isinstance(hostvars, dict):
            raise InventoryError(path, str(host), "host variables must be a mapping, got "
                                                  f"{shorten(hostvars)}")
        patterns.append(str(host))
    for child, sub in (group.get("children") or {}).items():
        _check_group(path, f"{where}.children.{child}", sub, patterns)


def _inventory_patterns(name: str, text: str) -> list[str]:
    """A file of the inventory, read as Ansible's plugins would try it: YAML for YAML
    extensions and files without one (INI when that fails), INI otherwise."""
    ext = os.path.splitext(name)[1]
    data: Any = None
    if ext in YAML_EXTENSIONS or not ext:
        try:
            data = load_yaml_text(text, name)
        except YamlFileError as err:
            if err.bounds or ext:
                raise InventoryError(name, None, err.why) from None
    if isinstance(data, dict):
        if "plugin" in data:
            return []   # an inventory plugin's settings (aws_ec2...): its hosts come from AWS
        return yaml_host_patterns(name, data)
    if ext in YAML_EXTENSIONS:
        raise InventoryError(name, None, "a YAML inventory is a mapping of groups (all: hosts: "
                                         "...); see `launch init` for an example")
    return ini_host_patterns(text)


def check_inventory_files(path: str | Path) -> None:
    """Every file Ansible would read for this inventory: small text, bounded YAML, groups of
    the right shape, and at most MAX_NODES hosts once its ranges are expanded. Raises
    InventoryError naming the file (and the pattern)."""
    source = Path(path)
    total_bytes, hosts = 0, 0
    seen: set[str] = set()
    for file, kind in files_ansible_reads(source):
        what = "inventory" if kind == "inventory" else "inventory variables file"
        try:
            text = read_text_file(file, what)
        except YamlFileError as err:
            raise InventoryError(str(file), None, err.why) from None
        total_bytes += len(text)
        if total_bytes > MAX_TOTAL_BYTES:
            raise InventoryError(str(source), None, f"its files hold more than "
                                                    f"{MAX_TOTAL_BYTES >> 20} MiB")
        if kind == "variables":
            try:
                load_yaml_text(text, str(file))
            except YamlFileError as err:
                if err.bounds:
                    raise InventoryError(str(file), None, err.why) from None
            continue   # other problems: Ansible's own message says them
        for pattern in _inventory_patterns(str(file), text):
            if pattern in seen:
                continue
            seen.add(pattern)
            count = range_size(pattern, MAX_NODES)
            hosts += count
            if count > MAX_NODES or hosts > MAX_NODES:
                raise InventoryError(
                    str(file), None,
                    f"host pattern {shorten(pattern)} expands to "
                    + (f"more than {MAX_NODES} hosts" if count > MAX_NODES else
                       f"{count} hosts, more than {MAX_NODES} in all")
                    + f": launch runs at most {MAX_NODES} nodes; narrow the range")
