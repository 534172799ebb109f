"""The shape the architecture promises, checked: folders in layers that import only downwards, no
import cycles between launch's modules, every module importable on its own in any order, the
code shipped to nodes apart from launcher, and commands that only adapt arguments to backends
(placement and execution live in launcher/backends and launcher/execute). docs/architecture.md
draws the layers."""

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


# launcher/'s folders from the bottom up: a module imports only from its own folder or one
# listed before it (docs/architecture.md says what each holds).
LAYERS = ("core", "cluster", "job", "runs", "nccl", "report", "workdir", "setup", "provision",
          "lab", "execute", "check", "pipeline", "backends", "commands", "cli")


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:            # launcher/__init__.py: the version only
        return 0
    assert parts[1] in LAYERS, f"{module}: launcher/{parts[1]} is in no layer: add it to LAYERS"
    return LAYERS.index(parts[1])


def test_every_folder_imports_only_from_below():
    mods = modules()
    upward = [f"{name} imports {dep}"
              for name, path in sorted(mods.items())
              for dep in sorted(launcher_imports(path, set(mods)))
              if layer(dep) > layer(name)]
    assert not upward, "an import upwards (move the shared piece down):\n" + "\n".join(upward)


def test_no_module_imports_another_ones_private_names():
    """A name another module needs is part of its interface: public, documented there."""
    private = [f"{path.relative_to(REPO)}:{node.lineno} imports {node.module}.{alias.name}"
               for path in modules().values()
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.split(".")[0] in ("launcher", "train")
               for alias in node.names
               if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_launcher_top_level_holds_only_the_entry_points():
    """A newcomer finds each module by its folder: nothing else sits at launcher/'s top."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_module_imports_in_any_order(seed):
    names = sorted(modules())
    random.Random(seed).shuffle(names)
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# What a command that never connects to a host loads: launch starts in every test's runs and
# in every step of a user's loop, and paramiko with fabric cost ~0.13 s of CPU at each start,
# boto3 and matplotlib more; each is imported where its command needs it.
HEAVY_LIBRARIES = ("paramiko", "fabric", "boto3", "matplotlib", "torch")


def test_a_local_dry_run_loads_no_ssh_aws_plotting_or_torch_library(tmp_path):
    (tmp_path / "hello.py").write_text("print('hello')\n")
    code = ("import sys\nfrom launcher.cli import main\n"
            "code = main(['run', '--local', '--nodes', '2', '--dry-run', 'hello.py'])\n"
            f"print(sorted(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules))\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                               "LAUNCH_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-2000:]


# The packages shipped to every node (launcher/core/node_code.py), each with the packages of
# launch's it may import: the node runtime serves any job, so it knows neither the trainer nor
# launcher; nothing on a node imports launcher (the node runs its own interpreter, launch's
# dependencies not installed); launcher never imports the measuring workloads (it names them).
SHIPPED = {"launch_node": {"launch_node"},
           "train": {"train", "launch_node"},
           "launch_bench": {"launch_bench", "launch_node", "train"},
           "launcher": {"launcher", "launch_node", "train"}}
# What a node's interpreter has besides the standard library: torch for the rendezvous store,
# the trainer and the workloads; boto3 for a mirror to s3://; numpy and scikit-learn for the
# trainer (pyproject.toml).
NODE_LIBRARIES = {"torch", "boto3", "botocore", "numpy", "sklearn", "PIL"}


def top_level_imports(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imports_anywhere(path) if not m.startswith("__future__")}


@pytest.mark.parametrize("package", sorted(SHIPPED))
def test_shipped_packages_import_only_what_a_node_has(package):
    wrong = []
    for path in sorted((REPO / package).rglob("*.py")):
        if "playbooks" in path.parts:   # Ansible's modules run on the node under Ansible
            continue
        for top in sorted(top_level_imports(path)):
            if top in SHIPPED and top not in SHIPPED[package]:
                wrong.append(f"{path.relative_to(REPO)} imports {top}")
            elif package != "launcher" and top not in SHIPPED and \
                    top not in sys.stdlib_module_names and top not in NODE_LIBRARIES:
                wrong.append(f"{path.relative_to(REPO)} imports {top}, which a node may lack")
    assert not wrong, "\n".join(wrong)


# What placing and running processes needs; commands reach it only through a backend.
EXECUTION = ("subprocess", "fabric", "paramiko", "launcher.execute", "launcher.backends.ssh.preflight",
             "launcher.job.runplan", "launcher.cluster.ssh")


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


BACKEND_NAMES = {"local", "ssh", "slurm"}


def test_no_code_outside_backends_asks_which_backend_it_has():
    """A feature lands on every backend at once: outside launcher/backends/ no comparison
    names a backend, no module imports one backend's code (the table in launcher/backends/
    makes them), and what differs is asked of the backend's capabilities."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "backends" or "playbooks" in rel.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                names = {s.value for s in sides if isinstance(s, ast.Constant)} & BACKEND_NAMES
                attrs = {s.attr for s in sides if isinstance(s, ast.Attribute)}
                if names and attrs & {"kind", "name", "backend", "NAME"}:
                    found.append(f"{rel}:{node.lineno} compares with {sorted(names)}")
            if isinstance(node, ast.Attribute) and node.attr == "kind" and \
                    isinstance(node.value, ast.Name) and node.value.id == "backend":
                found.append(f"{rel}:{node.lineno} asks backend.kind")
            if isinstance(node, ast.ImportFrom) and node.module and \
                    any(node.module.startswith(f"launcher.backends.{n}") for n in BACKEND_NAMES) \
                    and rel.parts[0] != "commands":
                found.append(f"{rel}:{node.lineno} imports {node.module}")
    assert not found, "\n".join(found)


def test_the_capabilities_table_in_the_docs_is_the_backends_own():
    from launcher.backends import capabilities_table

    text = (REPO / "docs" / "backends.md").read_text()
    start = text.index("<!-- capabilities")
    start = text.index("\n", start) + 1
    end = text.index("<!-- /capabilities -->")
    assert text[start:end] == capabilities_table(), \
        "docs/backends.md's table differs from the backends' declarations; it should be:\n" \
        + capabilities_table()
