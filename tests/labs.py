"""The labs the tests build, written once (tests/conftest.py makes them every area's fixtures).

An SSH lab is built once per test module and removed after it, even when a test fails: its
hosts outlive each test as real hosts do between runs, so each test keeps to its own run id and
folders. What a test leaves running on the hosts it fails on by itself (only_sshd_left); then
it is ended, so the module's next test starts on quiet hosts. The Slurm lab is shared the same
way; each test ends its own jobs, and after each the lab's nodes must be idle again
(slurm_lab_left_ready).
"""

from __future__ import annotations

import warnings

import pytest

from launcher.lab import netns
from launcher.lab.hosts import Lab, lab_unavailable_reason
from launcher.lab.slurm import SlurmLab, slurm_lab_unavailable_reason


def _ssh_lab(tmp_path_factory, hosts: int, **options):
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    built = Lab.create(tmp_path_factory.mktemp("lab") / "lab", hosts=hosts, **options)
    yield built
    built.destroy()


def _quiet(lab: Lab):
    """The module's lab for one test; afterwards nothing but each host's sshd runs on it."""
    yield lab
    for host in lab.hosts:
        for pid in lab.pids(host.name):
            if pid != host.sshd_pid:
                netns.kill(pid)


@pytest.fixture(scope="module")
def module_lab(tmp_path_factory):
    yield from _ssh_lab(tmp_path_factory, hosts=2)


@pytest.fixture
def lab(module_lab):
    """Two SSH hosts in network namespaces."""
    yield from _quiet(module_lab)


@pytest.fixture(scope="module")
def module_lab3(tmp_path_factory):
    yield from _ssh_lab(tmp_path_factory, hosts=3)


@pytest.fixture
def lab3(module_lab3):
    """Three SSH hosts; each test sets the caps it needs."""
    yield from _quiet(module_lab3)


@pytest.fixture(scope="module")
def module_capped_lab(tmp_path_factory):
    yield from _ssh_lab(tmp_path_factory, hosts=2, cap="100mbit")


@pytest.fixture
def capped_lab(module_capped_lab):
    """Two SSH hosts whose links are capped at 100 Mbit/s each way: communication dominates a
    step of the demo model (PowerSGD measured 3x faster at 500 Mbit/s) at a fifth of 20 Mbit/s's
    test time."""
    yield from _quiet(module_capped_lab)


@pytest.fixture(scope="module")
def module_private_lab(tmp_path_factory):
    yield from _ssh_lab(tmp_path_factory, hosts=2, private_workers=True)


@pytest.fixture
def private_lab(module_private_lab):
    """As `launch provision --public-ip head` makes: only host0 is reachable from here; host1
    is reached through it, and the ranks talk over the private network."""
    yield from _quiet(module_private_lab)


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory):
    """A two-host Slurm cluster (slurmctld, a slurmd per network namespace)."""
    reason = slurm_lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    built = SlurmLab.create(tmp_path_factory.mktemp("slurmlab") / "lab", hosts=2)
    yield built
    built.destroy()


class SlurmLabFault(UserWarning):
    """The Slurm lab's own machinery failed, not what a test ran on it."""


@pytest.fixture(autouse=True)
def slurm_lab_left_ready(request):
    """After each test on the Slurm lab, every node idle again (its jobs ended within
    KillWait), and the lab brought back where not, so that the module's next tests find idle
    nodes (in CI, one node left completing and unreachable failed the six tests after it).

    What is wrong is said with the daemons' logs, which the lab's removal would otherwise take
    with it. The test fails where launch may be to blame: a daemon gone (killed?), a job's
    process left on a node. A node slurmctld cannot reach while its slurmd runs and nothing of
    a job is left is the lab's fault (network namespaces on a shared machine): a warning
    (SlurmLabFault, in the summary of a passing suite too)."""
    if "slurm_lab" not in request.fixturenames:
        yield
        return
    slurm = request.getfixturevalue("slurm_lab")
    yield
    problems = slurm.problems()
    if not problems:
        return
    blame = slurm.gone_daemons() + [f"a job's process left on {h.name}" for h in slurm.hosts
                                     if slurm.job_pids(h.name)]
    try:
        problems += ["the lab, brought back:", *slurm.heal()]
    except Exception as err:  # noqa: BLE001 (said with the problems it follows)
        problems.append(f"the lab could not be brought back: {err}")
    said = "the Slurm lab was not ready for the next test:\n" + "\n".join(problems)
    if blame:
        pytest.fail(f"{', '.join(blame)}; {said}", pytrace=False)
    warnings.warn(SlurmLabFault(said), stacklevel=1)   # pytest's summary shows it whole


# Every fixture above builds or hands out a lab: tests/conftest.py marks their users `lab`
# and `slow`.
LAB_FIXTURES = {"module_lab", "lab", "module_lab3", "lab3", "module_capped_lab", "capped_lab",
                "module_private_lab", "private_lab", "slurm_lab"}
