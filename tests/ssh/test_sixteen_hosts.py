"""Sixteen SSH hosts (issue 37): what 2-host runs prove must hold at a size where launch's cost
per host shows, so that scale does not regress silently: a failing host stops all sixteen and
is blamed with its own lines, a silent one is found hung and named with its own stack, and
nothing is left running on any host. The job is a `command:` of the standard library only (no
torch: sixteen interpreters importing it would cost a minute of this machine's CPU for nothing
these tests look at)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import launch_cmd
from tests.labs import _quiet, _ssh_lab
from tests.ssh.conftest import only_sshd_left

pytestmark = [pytest.mark.slow, pytest.mark.lab]

HOSTS = 16

# Every host's command: host 11 fails with a traceback (mode `fail`), host 13 waits in a
# function of its own and never returns (mode `hang`); the others wait (fail) or end (hang).
JOB = """\
import os, sys, time
rank, mode = int(os.environ["LAUNCH_NODE_RANK"]), sys.argv[1]
print(f"host rank {rank} of {os.environ['LAUNCH_NUM_NODES']} up", flush=True)

def wait_for_the_peer_that_never_answers():
    while True:
        time.sleep(3600)

marks = sys.argv[2]   # a folder of the lab's shared filesystem: one file per host that is up
open(os.path.join(marks, f"up{rank}"), "w").close()
if mode == "fail" and rank == 11:
    # Fails once every host has said it is up (not after a sleep a busy machine outlasts:
    # a host started late would be stopped before its first line).
    while len(os.listdir(marks)) < int(os.environ["LAUNCH_NUM_NODES"]):
        time.sleep(0.1)
    raise RuntimeError("host 11 lost its data shard")
if mode == "hang" and rank == 13:
    wait_for_the_peer_that_never_answers()
if mode == "fail":
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def module_lab16(tmp_path_factory):
    yield from _ssh_lab(tmp_path_factory, hosts=HOSTS)


@pytest.fixture
def lab16(module_lab16):
    yield from _quiet(module_lab16)


def _run(lab, tmp_path, run_id: str, mode: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "up").mkdir()
    recipe = tmp_path / f"{run_id}.yml"
    recipe.write_text(json.dumps({"name": run_id, "nodes": HOSTS, "workdir": ".",
                                  # The lab's interpreter: py-spy, which dumps the hung
                                  # host's stack, is installed beside it.
                                  "job": {"command": [lab.python, "job.py", mode,
                                                      str(tmp_path / "up")]}}))
    return subprocess.run(
        launch_cmd("run", "-i", str(lab.inventory), str(recipe), "--run-id", run_id, *extra),
        cwd=tmp_path, text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


def sessions(lab) -> dict[str, int]:
    """SSH sessions each lab host's sshd has started so far (its log, LogLevel VERBOSE)."""
    return {host.name: (lab.dir / host.name / "sshd.log").read_text(errors="replace")
            .count("Starting session:") for host in lab.hosts}


def test_a_failing_host_of_sixteen_stops_them_all_and_is_blamed(lab16, tmp_path):
    before = sessions(lab16)
    proc = _run(lab16, tmp_path, "sixteen-fail", "fail")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The headline names host11 and its own exception, not a host stopped because of it.
    assert "host11" in proc.stderr and "RuntimeError: host 11 lost its data shard" in proc.stderr
    summary = json.loads((tmp_path / "runs" / "sixteen-fail" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failure"]["first_failed_node"] == "host11"
    assert len(summary["nodes"]) == HOSTS
    # Every host started (the others were waiting 600 s when the run was stopped), and every
    # host's log is kept.
    for n in range(HOSTS):
        log = tmp_path / "runs" / "sixteen-fail" / f"host{n}" / "node.log"
        assert f"host rank {n} of {HOSTS} up" in log.read_text()
    assert only_sshd_left(lab16) == {}
    # Each host's login shells (a session each; a conda or pyenv init in ~/.bashrc makes
    # each costly): the workdir's ship, and preflight's probe that became the node's agent,
    # whose session also carried the hang watch's looks, the stop's signal and the node's
    # files. Not one per look, stop or fetch.
    after = sessions(lab16)
    assert {name: after[name] - before[name] for name in after} == \
        {host.name: 2 for host in lab16.hosts}


def test_a_silent_host_of_sixteen_is_found_hung_and_named(lab16, tmp_path):
    proc = _run(lab16, tmp_path, "sixteen-hang", "hang", "--hang-timeout", "6")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "hang: no rank showed progress" in proc.stderr
    assert "stuck: a process on node host13 (sleeping (S))" in proc.stderr
    dumps = tmp_path / "runs" / "sixteen-hang" / "hang"
    stacks = {p.name: p.read_text() for p in dumps.glob("*.txt")}
    # host13's own stack is kept, in its own function; the hosts that had ended have none.
    [mine] = [text for name, text in stacks.items() if name.startswith("host13")]
    assert "wait_for_the_peer_that_never_answers" in mine
    assert not any(name.startswith(("host0.", "host12.", "host14.")) for name in stacks)
    summary = json.loads((tmp_path / "runs" / "sixteen-hang" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"]["first_failed_node"] == "host13"
    assert summary["hang"]["stuck"][0]["frame"].startswith(
        "wait_for_the_peer_that_never_answers (job.py:")
    # The excerpt ends with the job's own lines, not setsid's note on the node it stopped.
    assert summary["failure"]["last_lines"][-1] == "host13/agent: host rank 13 of 16 up"
    assert only_sshd_left(lab16) == {}
