"""launch as a tool: the wheel, installed into a fresh virtual environment outside the checkout,
run from an empty folder, finds its playbooks, recipes, example inventory and trainer.

The venv gets the wheel and its dependencies from the package index, with the CPU torch pin
(torch==2.13.0, or $LAUNCH_TORCH / $LAUNCH_TORCH_INDEX as scripts/bootstrap.sh takes them), and
nothing from the test's own environment: no --system-site-packages (it would hide a missing
dependency), no PYTHONPATH (it would put the checkout's launcher first).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launcher.core.node_code import PACKAGES
from tests.conftest import remove_later

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# A system PATH: a pipx install puts only `launch` on PATH, so ansible-playbook must be found
# beside launch's own interpreter, not in whatever venv runs the tests.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Installed:
    wheel: Path
    venv: Path
    site_packages: Path
    env: dict[str, str]
    install_s: float

    @property
    def launch(self) -> Path:
        return self.venv / "bin" / "launch"

    def run(self, *args: str, cwd: Path, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.launch), *args], cwd=cwd, env=self.env, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"launch {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
        return proc


def _outside_env() -> dict[str, str]:
    """The caller's environment without what would make the venv see the checkout or the
    caller's own launch settings; pip's settings (index, find-links, cache) stay."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "LAUNCH_", "VIRTUAL_ENV", "CONDA"))}


def _step(argv: list[str], env: dict[str, str], timeout: float) -> None:
    proc = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stdout[-3000:]}" \
                                 f"\n{proc.stderr[-3000:]}"


# What a checkout holds besides its source: at its top only (launcher/runs/ is source), and
# caches anywhere.
_CHECKOUT_ONLY = {".git", ".venv", "runs", "build", ".pytest_cache", ".cache"}
_CACHES = shutil.ignore_patterns("*.egg-info", "__pycache__")


def _not_source(folder: str, names: list[str]) -> set[str]:
    top = _CHECKOUT_ONLY if Path(folder) == REPO else set()
    return top & set(names) | set(_CACHES(folder, names))


def _build_isolation() -> list[str]:
    """pip's flag to build with this environment's build backend where it has what
    pyproject.toml's build-system requires (torch's metadata brings setuptools): an isolated
    build first installs setuptools into an environment of its own, 10 s of the fixture and 4 s
    of a core for the same backend. (scripts/bootstrap.sh's editable install is an isolated
    build.)"""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, requires):
        try:
            if not requirement.specifier.contains(version(requirement.name)):
                return []
        except PackageNotFoundError:
            return []
    return ["--no-build-isolation"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    # Built from a clean copy: setuptools reuses a stale build/ in the source folder, which
    # could put files the checkout no longer has into the wheel (or hide a missing one).
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_not_source)
    env = _outside_env()
    wheels = root / "dist"
    _step([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "--quiet",
           "-w", str(wheels), str(source)], env, timeout=300)
    (wheel,) = wheels.glob("launch-*.whl")

    venv = root / "venv"
    python = venv / "bin" / "python"
    # Without pip of its own (ensurepip: 3.5 s of a core): this pip installs into it
    # (--python), the same packages into the same site-packages.
    _step([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, timeout=120)
    torch = os.environ.get("LAUNCH_TORCH", "torch==2.13.0")
    index = os.environ.get("LAUNCH_TORCH_INDEX")
    started = time.monotonic()
    # --no-compile: byte-compiling all of torch's modules is 3/4 of the install time (70 of 95
    # s on 2 cores); Python compiles what launch imports when it first imports it.
    _step([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
           "--no-compile", "--disable-pip-version-check",
           *(["--extra-index-url", index] if index else []), str(wheel), torch], env,
          timeout=600)
    install_s = time.monotonic() - started
    print(f"\nwheel install into a fresh venv (launch + dependencies + {torch}): "
          f"{install_s:.0f} s")

    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    home = root / "home"
    home.mkdir()
    run_env = {**env, "PATH": SYSTEM_PATH, "HOME": str(home),
               "LAUNCH_HOME": str(home / ".launch")}
    # What every process of a run imports (the store's and the agents' torch, the ranks'
    # trainer, DDP and AdamW's torch._dynamo), imported once here so that Python compiles it
    # once, not in the run's five processes at once (torch alone: ~2 s of a core each).
    # Not checked: a module missing from the wheel is for the tests to find and name.
    subprocess.run([str(python), "-c", "import torch.distributed.run, torch._dynamo, train.main"],
                   cwd=home, env=run_env, capture_output=True, timeout=300,
                   stdin=subprocess.DEVNULL)
    yield Installed(wheel, venv, site_packages, run_env, install_s)
    remove_later(venv)   # 1.4 GB, mostly torch


@pytest.fixture
def empty_dir(tmp_path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_the_wheel_ships_playbooks_recipes_and_the_example_inventory(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for must in ("launcher/playbooks/site.yml", "launcher/playbooks/ansible.cfg",
                 "launcher/playbooks/roles/node_facts/files/collect_node_facts.py",
                 "launcher/playbooks/roles/efa/templates/nccl.env.j2",
                 "launcher/recipes/vit-tiny-local.yml", "launcher/recipes/vit-b16-p4d.yml",
                 "launcher/recipes/vit-b16-g6e.yml", "launcher/examples/inventory.example.yml",
                 "train/main.py", "launch_node/worker.py", "launch_bench/bench.py"):
        assert must in names, must
    # Every file of launcher and the node code, data files included: a file or package added
    # later and forgotten in pyproject's packages or package-data fails here.
    source = {p.relative_to(REPO).as_posix()
              for top in ("launcher", *PACKAGES) for p in (REPO / top).rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(source - names) == []


def test_version_and_recipes_from_an_empty_folder(installed, empty_dir):
    # The venv's launch is the wheel's, not the checkout's.
    where = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import importlib.metadata, launcher, train\n"
         "print(launcher.__file__, train.__file__, importlib.metadata.version('launch'))"],
        cwd=empty_dir, env=installed.env, text=True, capture_output=True, check=True,
    ).stdout.split()
    assert where[:2] == [str(installed.site_packages / "launcher" / "__init__.py"),
                         str(installed.site_packages / "train" / "__init__.py")]
    # --version says what pip installed (pyproject's version, not a stale __version__).
    assert installed.run("--version", cwd=empty_dir).stdout.strip() == f"launch {where[2]}"

    listing = installed.run("recipes", cwd=empty_dir).stdout
    names = [line.split()[0] for line in listing.splitlines()[1:4]]
    assert names == ["vit-b16-g6e", "vit-b16-p4d", "vit-tiny-local"]
    assert f"in {installed.site_packages / 'launcher' / 'recipes'}" in listing
    assert list(empty_dir.iterdir()) == []


def test_dry_run_plans_the_installed_recipe_and_trainer(installed, empty_dir):
    proc = installed.run("run", "vit-tiny-local", "--local", "--nodes", "2", "--dry-run",
                         "--json", cwd=empty_dir)
    plan = json.loads(proc.stdout)
    assert plan["recipe"]["source"] == str(installed.site_packages /
                                           "launcher/recipes/vit-tiny-local.yml")
    assert plan["world_size"] == 2 and [n["name"] for n in plan["nodes"]] == ["node0", "node1"]
    trainer = str(installed.site_packages / "train" / "main.py")
    for node in plan["nodes"]:
        assert Path(node["argv"][0]).parent == installed.venv / "bin"
        assert node["argv"][1:3] == ["-m", "torch.distributed.run"]
        assert trainer in node["argv"]
    # A dry run writes nothing.
    assert list(empty_dir.iterdir()) == []


def test_init_then_a_short_real_local_run(installed, empty_dir):
    installed.run("init", cwd=empty_dir)
    recipe = empty_dir / "recipe.yml"
    data = yaml.safe_load(recipe.read_text())
    # Named after the folder it was written into, so that runs can be told apart.
    assert data["name"] == empty_dir.name
    # The copy is ours to edit: 2 blocks and 20 steps instead of 12 blocks and 15 epochs.
    data["train"].pop("epochs")
    data["train"].update(depth=2, steps=20, log_every=5)
    recipe.write_text(yaml.safe_dump(data))

    proc = installed.run("run", "recipe.yml", "--local", "--nodes", "2", "--run-id", "wheel",
                         cwd=empty_dir, timeout=300)
    run = empty_dir / "runs" / "wheel"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded", proc.stdout[-3000:]
    assert summary["world_size"] == 2 and summary["steps"] == 20
    assert [n["status"] for n in summary["nodes"]] == ["succeeded", "succeeded"]
    assert "node0/0: rank " in proc.stdout and "node1/0: rank " in proc.stdout
    plan = json.loads((run / "plan.json").read_text())
    assert str(installed.site_packages / "train" / "main.py") in plan["nodes"][0]["argv"]


def test_setup_syntax_check_finds_the_bundled_playbooks(installed, empty_dir):
    installed.run("init", cwd=empty_dir)
    proc = installed.run("setup", "-i", "inventory.yml", "--syntax-check", cwd=empty_dir)
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"launch setup --syntax-check: "
                        f"{installed.site_packages / 'launcher/playbooks/site.yml'} with "
                        f"{empty_dir / 'inventory.yml'}")
    # Without one on the system PATH, the one beside the venv's python: the only
    # ansible-playbook a pipx install has.
    ansible = shutil.which("ansible-playbook", path=SYSTEM_PATH) or \
        installed.venv / "bin" / "ansible-playbook"
    assert lines[1] == f"  (by {ansible})"
    assert "  playbook: site.yml" in lines and lines[-1] == "syntax check passed"

