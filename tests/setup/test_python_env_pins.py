"""The python_env role's requirement sets resolve, wheels only, for every target node's Python.

Each supported distribution has its own python3 (Ubuntu 22.04: 3.10, Debian 12: 3.11, Ubuntu
24.04: 3.12) and glibc; the role picks the pins for the node's Python. pip's resolver answers
for the target (--python-version, --platform for each manylinux level up to the target's glibc,
--only-binary) against PyPI, from the packages' metadata (a dry run: nothing is installed), so
a pin without a wheel for a target fails here, not on a node. The per-Python packages resolve
with their dependencies; torch on its own (its dependencies are the CUDA libraries its metadata
pins, which the test reads instead), because resolving those thirty packages for six targets
costs minutes of a 2-core machine.

torch's metadata is read from its wheel through HTTP range requests (pip's fast-deps: the
zip's directory and its METADATA), not by downloading the wheel: PyPI (or an index standing in
for it) need not serve PEP 658 .metadata files, and then the dry run downloaded six torch wheels
of 0.4-0.9 GB (most of the test's 150 s in the suite on 2 cores: TLS, hashing, unzipping). The
other packages' wheels are small enough that downloading them beats many range requests. The
pip a venv is made with (23.2) downloads the wheel at the end anyway; pyproject.toml's test
extra asks for one that does not (26). The resolver and its answer are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROLES = Path(__file__).resolve().parents[2] / "launcher" / "playbooks" / "roles"
INDEX = "https://pypi.org/simple"
# Target -> (Python, glibc minor): the distributions launch_platform supports.
TARGETS = {"ubuntu2204": ("3.10", 35), "debian12": ("3.11", 36), "ubuntu2404": ("3.12", 39)}
ARCHES = ("x86_64", "aarch64")


def role_defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def requirement_set(python: str) -> list[str]:
    """Exactly what the role installs on a node with this Python: torch, then its packages
    and launch's tools."""
    defaults = role_defaults("python_env")
    return [f"torch=={defaults['python_env_torch_version']}",
            *defaults["python_env_packages_by_python"][python], *defaults["python_env_tools"],
            *defaults["python_env_controller_packages"]]


def resolve(python: str, glibc_minor: int, arch: str, requirements: list[str],
            tmp: Path, deps: bool = True, cache: Path | None = None,
            lazy: bool = False) -> subprocess.CompletedProcess:
    """pip's dry run for the target. `lazy`: the chosen wheel's metadata read through HTTP range
    requests (pip's fast-deps) instead of the wheel downloaded: for torch's (0.4-0.9 GB)."""
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(17, glibc_minor + 1)]
    platforms.append(f"manylinux2014_{arch}")
    tag = "cp" + python.replace(".", "")
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--disable-pip-version-check",
            *(["--cache-dir", str(cache)] if cache else ["--no-cache-dir"]),
            *([] if deps else ["--no-deps"]),
            "--report", str(tmp / "report.json"), "--target", str(tmp / "target"),
            *(["--use-feature=fast-deps"] if lazy else []),
            "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", tag, "--index-url", INDEX,
            *[arg for p in platforms for arg in ("--platform", p)], *requirements]
    # No configuration file: this machine's pip settings (local wheel folders, constraints)
    # must not answer for PyPI.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """(target, arch) -> (CompletedProcess, report or None), torch's and the packages' reports
    merged; all six at once (waiting on the index's answers, each a few seconds of a core),
    sharing pip's HTTP cache."""
    cache = tmp_path_factory.mktemp("pip-cache")
    jobs = {(t, a): (TARGETS[t], tmp_path_factory.mktemp(f"{t}-{a}")) for t in TARGETS
            for a in ARCHES}

    def one(key):
        (python, glibc), tmp = jobs[key]
        torch, *packages = requirement_set(python)
        (tmp / "torch").mkdir()
        first = resolve(python, glibc, key[1], [torch], tmp / "torch", deps=False, cache=cache,
                        lazy=True)
        if first.returncode != 0:
            return key, (first, None)
        proc = resolve(python, glibc, key[1], packages, tmp, cache=cache)
        if proc.returncode != 0:
            return key, (proc, None)
        report = json.loads((tmp / "report.json").read_text())
        report["install"] += json.loads((tmp / "torch" / "report.json").read_text())["install"]
        return key, (proc, report)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return dict(pool.map(one, jobs))


def test_every_supported_python_has_pins():
    platform = role_defaults("launch_platform")
    pins = role_defaults("python_env")["python_env_packages_by_python"]
    assert sorted(pins) == sorted(platform["launch_platform_supported_pythons"])
    assert sorted(py for py, _ in TARGETS.values()) == sorted(pins)


def test_the_nodes_tools_are_the_versions_launch_itself_pins():
    # py-spy is pinned twice, for launch (pyproject.toml) and for the nodes (the role, which
    # cannot read launch's metadata on a node): the two must not drift apart.
    import tomllib

    project = tomllib.loads((ROLES.parents[2] / "pyproject.toml").read_text())["project"]
    for tool in role_defaults("python_env")["python_env_tools"]:
        assert tool in project["dependencies"], (tool, project["dependencies"])


def test_the_controllers_packages_are_within_launchs_own_ranges():
    # A detached run's controller is launch itself on the head: each package it imports is
    # installed at a version launch's pyproject.toml accepts, and none it needs is missing.
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROLES.parents[2] / "pyproject.toml").read_text())["project"]
    ranges = {(r := Requirement(d)).name.lower(): r.specifier for d in project["dependencies"]}
    pins = role_defaults("python_env")["python_env_controller_packages"]
    for pin in pins:
        name, _, version = pin.partition("==")
        assert name.lower() in ranges, (pin, sorted(ranges))
        assert ranges[name.lower()].contains(version), (pin, ranges[name.lower()])
    assert {p.partition("==")[0].lower() for p in pins} == {"fabric", "pydantic", "pyyaml"}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_pins_resolve_with_wheels_for_the_target(resolutions, target, arch):
    proc, report = resolutions[(target, arch)]
    python = TARGETS[target][0]
    assert proc.returncode == 0, f"{target} (Python {python}, {arch}):\n{proc.stderr[-3000:]}"
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    for requirement in requirement_set(python):
        name, _, version = requirement.partition("==")
        assert got[name.lower()] == version
    wheels = [i["download_info"]["url"].rsplit("/", 1)[1] for i in report["install"]]
    assert all(w.endswith(".whl") for w in wheels), wheels
    tag = "cp" + python.replace(".", "")
    for name in ("torch", "numpy", "scikit_learn"):
        wheel = next(w for w in wheels if w.startswith(f"{name}-"))
        assert f"-{tag}-" in wheel and arch in wheel, wheel


def test_torch_is_the_cuda_build_of_the_driver_branch(resolutions):
    # The role's torch (PyPI's 2.13.0) is built for the CUDA launch_platform pins, which the
    # R580 driver branch runs; and it bundles the NCCL the nccl role installs system-wide.
    cuda = role_defaults("launch_platform")["launch_platform_cuda_version"]
    nccl = role_defaults("nccl")["nccl_version"].split("-")[0]
    for key, (_, report) in resolutions.items():
        torch = next(i for i in report["install"] if i["metadata"]["name"] == "torch")
        requires = [r.split(";")[0].strip() for r in torch["metadata"]["requires_dist"]]
        toolkit = next(r for r in requires if r.startswith("cuda-toolkit["))
        assert toolkit.split("==")[1].startswith(f"{cuda}."), (key, toolkit)
        assert f"nvidia-nccl-cu13=={nccl}" in requires, (key, requires)
    assert role_defaults("nvidia_driver")["nvidia_driver_branch"] == "580"


# numpy 2.4 and scikit-learn 1.9 publish no wheels for Python 3.10: the pins of 3.11 on Ubuntu
# 22.04 are what broke setup on every such node. The check must catch that.
@pytest.mark.parametrize("bad_pin", ["numpy==2.4.6", "scikit-learn==1.9.1"])
def test_a_pin_without_a_wheel_for_the_target_fails(tmp_path, bad_pin):
    proc = resolve("3.10", 35, "x86_64", [bad_pin], tmp_path)
    assert proc.returncode != 0
    assert f"No matching distribution found for {bad_pin}" in proc.stderr
