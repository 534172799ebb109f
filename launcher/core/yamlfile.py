"""Reading the YAML files users hand to launch (recipes, inventories, -e @FILE), defensively.

A recipe is a few hundred bytes; what arrives can be anything: a binary file, a FIFO, a
device, a deeply nested or alias-bombed document (a 400-byte file once expanded to gigabytes
and hung launch for a minute). Every problem becomes one LauncherError naming the file and the
line, never a traceback: size and node counts are capped, duplicate keys are refused (YAML
keeps the last one silently, which hides typos), and values quoted in messages are shortened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from launcher.core import safefile
from launcher.core.errors import LauncherError

MAX_BYTES = 1 << 20          # 1 MiB: a recipe or inventory is a few KB
MAX_NODES = 100_000          # scalars, sequences and mappings in one document
MAX_ALIASES = 100            # *references; a "billion laughs" needs many
MAX_DEPTH = 64               # nesting; PyYAML's recursive composer dies near Python's limit


class YamlFileError(LauncherError):
    def __init__(self, path: str, why: str, bounds: bool = False):
        # bounds: refused for its size or shape (aliases, values, nesting), whatever reads it
        self.path, self.why, self.bounds = path, why, bounds
        super().__init__(f"{path}: {why}")


class _Bounds(yaml.YAMLError):
    pass


def shorten(value: Any, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters, for messages about user values."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 15] + f"... ({len(text)} chars)"


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader with caps on nodes, aliases and depth, and duplicate keys refused."""

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = self._aliases = self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Bounds(f"more than {MAX_ALIASES} aliases (*name): refused, "
                              "a recipe or inventory needs few or none")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Bounds(f"more than {MAX_NODES} values: refused as too large")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Bounds(f"nested more than {MAX_DEPTH} levels deep: refused")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        # The composed document is a graph: an alias is the anchored node itself, so 90
        # aliases of 9 make 9**10 values once anything walks it (pydantic, repr, Ansible's
        # variable merging). Its expanded size is counted here, before anything constructs
        # it: aliases may not make a document larger than plain text could (MAX_NODES).
        node = super().compose_document()
        if self._aliases:
            _expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys with their position
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shorten(key)} (first on line {seen[key]}): "
                    "YAML would keep only the last one", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node) -> int:
    """The values `root` stands for with every alias expanded, refused past MAX_NODES (and a
    node that holds itself, which expands without end); each node is counted once, so the
    work is linear in the composed document."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise _Bounds("a value holds itself through an alias (*name): refused")
        open_.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        if total > MAX_NODES:
            raise _Bounds(f"more than {MAX_NODES} values once its aliases (*name) are "
                          "expanded: refused as an expansion bomb")
        open_.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _describe(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"not valid YAML: {where}{problem}" + (f" ({context})" if context else "")


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> str:
    """A small UTF-8 text file, or YamlFileError saying why it is not one."""
    name = str(path)
    try:
        raw = safefile.read_bytes(name, what, max_bytes=max_bytes)
    except safefile.UnsafeFile as err:
        why = f"cannot read the {what}: No such file or directory" if err.missing else err.why
        raise YamlFileError(name, why) from None
    if b"\0" in raw:
        raise YamlFileError(name, f"holds NUL bytes: a binary file, not a {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlFileError(name, f"is not UTF-8 text (byte {err.start}): save the {what} as "
                                  "UTF-8") from None


def load_yaml_text(text: str, name: str) -> Any:
    try:
        return yaml.load(text, Loader=_GuardedLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Bounds as err:
        raise YamlFileError(name, f"not valid YAML: {err}", bounds=True) from None
    except yaml.YAMLError as err:
        raise YamlFileError(name, _describe(err)) from None
    except RecursionError:
        raise YamlFileError(name, "not valid YAML: nested too deeply", bounds=True) from None


def load_yaml_file(path: str | Path, what: str) -> Any:
    """Parse a user's YAML file (`what` names it in messages: "recipe", "inventory")."""
    return load_yaml_text(read_text_file(path, what), str(path))
