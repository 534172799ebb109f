"""The shape the architecture promises, checked: no import cycles between launch's modules, every
module importable on its own in any order, and commands that only adapt arguments to backends
(placement and execution live in launcher/backends and launcher/execute)."""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "launcher"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "playbooks" in path.parts or path.name == "__main__.py":  # __main__ runs the CLI
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def launcher_imports(path: Path, known: set[str]) -> set[str]:
    """launcher.* modules imported anywhere in the file. An import inside a function cannot
    form an import-time cycle, but it is the same dependency: two modules that need each other
    are one module in two files, so those count too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found |= {n for n in names if n in known}
    return found


def test_no_import_cycles():
    mods = modules()
    graph = {name: launcher_imports(path, set(mods)) - {name} for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_module_imports_in_any_order(seed):
    names = sorted(modules())
    random.Random(seed).shuffle(names)
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# What placing and running processes needs; commands reach it only through a backend.
EXECUTION = ("subprocess", "fabric", "paramiko", "launcher.execute", "launcher.preflight",
             "launcher.plan", "launcher.ssh")


def imports_anywhere(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "commands").glob("*.py")),
                         ids=lambda p: p.name)
def test_commands_hold_no_placement_or_execution(path):
    used = {m for m in imports_anywhere(path)
            if any(m == e or m.startswith(e + ".") for e in EXECUTION)}
    assert not used, f"{path.name} imports {sorted(used)}: go through launcher.backends"
