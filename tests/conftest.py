"""Fixtures every test area uses. Each area keeps its own in tests/<area>/conftest.py."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests import labs
from tests.labs import (capped_lab, lab, lab3, module_capped_lab,  # noqa: F401 (fixtures)
                        module_lab, module_lab3, module_private_lab, private_lab, slurm_lab,
                        slurm_lab_left_ready)

REPO = Path(__file__).resolve().parent.parent

# A suite started in the background by a shell without job control (`./scripts/test &` in a
# script, nohup) inherits SIGINT ignored, and every launch it starts would inherit that too:
# the Ctrl-C tests then wait forever for a process that cannot hear them (seen: `launch
# provision` interrupted while waiting for SSH ran into its 120 s timeout). A handler, unlike
# SIG_IGN, is reset to the default in a child at exec, so children can be interrupted again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The test tiers. `./scripts/test --fast` runs `-m "not slow"`: unit tests and in-process CLI
# tests, in under two minutes on 2 cores. What makes a test slow is derived from what it uses,
# so that a new test cannot land in the fast tier by forgetting a marker: a lab (root, network
# namespaces, sshd or Slurm: also `lab`), a real run or a subprocess of launch, moto's server,
# Ansible, a browser, the wheel.
LAB_FIXTURES = labs.LAB_FIXTURES | {"lab_ready"}   # lab_ready: tests/setup's node
SLOW_FIXTURES = LAB_FIXTURES | {
    "run_launch", "background_launch", "demo_local_run", "installed", "browser", "ddp_tuning",
    "moto_url", "launch_setup", "root_tarball", "wheelhouse", "vendor_site", "world_of_one",
    "short_demo"}


# Where a test runs when the suite is spread over processes (pytest-xdist, `--dist loadgroup`,
# as scripts/test runs it): a slow test that shares a fixture with the rest of its module (a
# lab, a run its tests read) stays with them, so that the fixture is made once; the tests of one
# shared stand-in stay in one process: the Slurm lab (one slurmctld serves them all) and the
# setup tests' Debian root and package site. Other tests go wherever a process is free: a
# module of slow tests that share nothing was one unit of work, and tests/job/test_local_job.py
# (18 runs, 7 minutes on a busy machine) held one process while the other ran out of work.
SHARED_GROUPS = {"slurm_lab": "slurm", "lab_ready": "setup"}
# Session fixtures that do not tie a module's tests to one process: read-only, cheap in each
# process, or made once for every process (tests/conftest.py _local_run_once). Any other
# fixture wider than a test keeps the module together (moto's server: its tests see each
# other's resources).
PER_PROCESS_OK = {"repo_root", "browser", "ddp_tuning", "data_dir", "demo_local_run",
                  "short_demo", "tmp_path_factory", "worker_id", "testrun_uid"}


def _shares_a_fixture(item) -> bool:
    """Whether the test uses a fixture wider than itself that its module's tests share."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope != "function" and name not in PER_PROCESS_OK:
            return True
    return False


def _group(item, used: set[str]) -> str | None:
    for fixture, group in SHARED_GROUPS.items():
        if fixture in used:
            return group
    if item.get_closest_marker("slow") and _shares_a_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)   # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & LAB_FIXTURES:
            item.add_marker(pytest.mark.lab)
        if used & SLOW_FIXTURES or item.get_closest_marker("lab"):
            item.add_marker(pytest.mark.slow)
        group = _group(item, used)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    # The fast tests last, in small pieces, where they even out the processes' ends. xdist hands
    # out its units (a group, or one ungrouped test) largest first and in this order among
    # equals, so a one-test group (a lost machine, a spot notice: a minute or more each) came
    # among the fast tests at the end of the collection and ran alone while the other process
    # sat idle (measured: ~100 s of one idle core at the suite's end). Slow tests of no group
    # (10-70 s each) come between. The sort is stable: a module's tests keep their order.
    items.sort(key=lambda item: 0 if item.get_closest_marker("xdist_group") else
               1 if item.get_closest_marker("slow") else 2)


# Set in a test process where pytest-xdist lost the groups (below).
_LOST_GROUPS = pytest.StashKey[str]()


def pytest_collection_finish(session):
    """Fail every grouped test at once where pytest-xdist lost the groups. xdist marks a grouped
    test by its node id, and a pytest that changed node ids (9.2 with xdist 3.8:
    pytest-dev/pytest-xdist#1386) spread every group over both processes without a word: each
    built every module's lab and the setup node again, the suite took minutes longer and raced
    itself. (A worker cannot stop the session with a message of its own: xdist only says that
    its workers went away.)"""
    if not getattr(session.config.option, "loadgroup", False):   # set in xdist's workers only
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rsplit("]", 1)[-1]]
    if lost:
        session.config.stash[_LOST_GROUPS] = (
            f"pytest-xdist's --dist loadgroup is not grouping tests under pytest "
            f"{pytest.__version__} ({len(lost)} grouped tests without their group): install the "
            f"versions pyproject.toml's test extra pins (./scripts/test does), or run with -n 0")


@pytest.hookimpl(tryfirst=True)   # before the test's fixtures (a lab) are set up
def pytest_runtest_setup(item):
    lost = item.config.stash.get(_LOST_GROUPS, None)
    if lost and item.get_closest_marker("xdist_group"):
        pytest.fail(lost, pytrace=False)


_HOME = pytest.StashKey[Path]()


def pytest_configure(config):
    """The suite's own launch home, fresh for each test process: nothing a test does in
    process (the inventory cache, the workdir hash cache, clusters' ledgers) reads or writes
    the caller's ~/.launch or $LAUNCH_HOME, and nothing there changes what a test sees. Tests
    that need a home of their own still set LAUNCH_HOME for what they start."""
    home = Path(tempfile.mkdtemp(prefix="launch-home-tests-"))
    os.environ["LAUNCH_HOME"] = str(home)
    config.stash[_HOME] = home


def pytest_unconfigure(config):
    """The last line: how many tests were skipped and why, so that a run as non-root (whose lab
    tests skip by design) or without a tool says so instead of passing quietly."""
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if terminalreporter is None:
        return
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        why = "; ".join(f"{count}: {reason}" for reason, count in
                        sorted(reasons.items(), key=lambda item: -item[1]))
        terminalreporter.write_line(f"{sum(reasons.values())} test(s) skipped ({why})",
                                    yellow=True)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def ddp_tuning():
    """benchmarks/ddp_tuning.py as a module: its variants and its table are what tests check."""
    spec = importlib.util.spec_from_file_location("ddp_tuning", REPO / "benchmarks/ddp_tuning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def remove_later(path: Path) -> None:
    """Removes a large folder (a venv with torch, a node's root) in a process of its own, not
    waited for: on an ext4 mounted with `discard`, as the 2-core test machine's is, removing a
    torch install held the test process 43 s, waiting on the disk instead of running tests.
    (pytest keeps the last runs' temporary folders: a gigabyte each must not stay there.)"""
    subprocess.Popen(["rm", "-rf", "--", str(path)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def launch_cmd(*args: str) -> list[str]:
    """argv that runs the `launch` CLI from this checkout with this interpreter."""
    return [sys.executable, "-m", "launcher", *args]


def _local_run_once(tmp_path_factory, name: str, argv: list[str],
                    recipe: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """`launch run ARGV --run-id NAME` on this machine once per suite, even when the suite is
    spread over processes: the first that needs it runs it, the others wait for it and read
    its answer. `recipe`: written to NAME.yml in its folder first. (CompletedProcess, run
    folder); the wall clock when the run began is in the folder's `began` file (the
    timeline's proof reads it: tests/run/timeline_check.py)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent   # the folder every worker's own temporary folder is in
    cwd, answer = shared / f"{name}-local", shared / f"{name}-local.json"
    with open(shared / f"{name}-local.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not answer.exists():
            cwd.mkdir(exist_ok=True)
            if recipe is not None:
                (cwd / f"{name}.yml").write_text(yaml.safe_dump(recipe))
            (cwd / "began").write_text(repr(time.time()))
            proc = subprocess.run(
                launch_cmd("run", *argv, "--run-id", name),
                cwd=cwd, text=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL,
            )
            answer.write_text(json.dumps([proc.args, proc.returncode, proc.stdout, proc.stderr]))
        args, code, out, err = json.loads(answer.read_text())
    return subprocess.CompletedProcess(args, code, out, err), cwd / "runs" / name


@pytest.fixture(scope="session")
def demo_local_run(tmp_path_factory):
    """The README's demo, run once on this machine: (CompletedProcess, run folder). Shared by
    the tests that read it (the local run's, the report page's, the live view's)."""
    # As the README types it: no --local (the default without an inventory), a bundled name.
    return _local_run_once(tmp_path_factory, "demo", ["--nodes", "2", "vit-tiny-local"])


@pytest.fixture(scope="session")
def short_demo(tmp_path_factory):
    """The demo's recipe trained for 2 epochs (44 steps) instead of 15, run once on this
    machine: (recipe file, CompletedProcess, run folder). The SSH and Slurm tests run the same
    file on their nodes and must end with the same model: the transport changes nothing the
    trainer computes. (The 15 epochs' accuracy is the local demo test's to check; run over a
    lab, they cost a minute and a half of both cores each.)"""
    recipe = yaml.safe_load((REPO / "recipes" / "vit-tiny-local.yml").read_text())
    recipe["train"]["epochs"] = 2
    proc, run = _local_run_once(tmp_path_factory, "short-demo",
                                ["--nodes", "2", "short-demo.yml"], recipe)
    return run.parent.parent / "short-demo.yml", proc, run


@pytest.fixture
def run_launch(tmp_path):
    """Run the real CLI in a subprocess; returns CompletedProcess with text output."""

    def run(*args: str, timeout: float = 300, env: dict | None = None, cwd: Path | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        # The test's own launch home unless it names one: never the process's (the suite's,
        # or a caller's exported LAUNCH_HOME, which setdefault once let through).
        full_env = {**os.environ, "LAUNCH_HOME": str(tmp_path / "launch-home"), **(env or {})}
        proc = subprocess.run(
            launch_cmd(*args), cwd=cwd or tmp_path, env=full_env, text=True,
            capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"launch {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    return run
