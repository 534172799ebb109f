"""The hang watch's looks at an SSH node (launcher/backends/ssh/watcher.py): one watcher on
the node answers every look of the run, a watcher that died is replaced at the next look, and
nothing of it is left on the node once launch is done with the node."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from launch_node.heartbeat import heartbeat_path
from launcher.backends.ssh.agent import SshNodeProcess
from launcher.cluster.inventory import load_inventory
from launcher.cluster.ssh import connect
from launcher.cluster.ssh_options import SshOptions
from launcher.core.errors import LauncherError
from launcher.job.runplan import NodeCommand
from launcher.lab import netns

pytestmark = [pytest.mark.slow, pytest.mark.lab]

NODE_PROBE = Path(__file__).resolve().parents[2] / "launch_node" / "node_probe.py"


def watchers(lab, host: str) -> list[int]:
    """The node_probe.py watch processes on a lab host."""
    found = []
    for pid in lab.pids(host):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(a.endswith(b"node_probe.py") for a in argv) and b"watch" in argv:
                found.append(pid)
    return found


def beat(run_dir: Path, step: int) -> None:
    path = heartbeat_path(run_dir, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"node": "host0", "rank": 0, "local_rank": 0, "pid": 1,
                                "step": step, "phase": "train"}))


def test_one_watcher_answers_every_look_is_replaced_when_it_dies_and_leaves_when_closed(
        lab, tmp_path):
    node = load_inventory(lab.inventory)[0]
    run_dir = tmp_path / "node"   # the lab hosts share this machine's files
    run_dir.mkdir()
    command = NodeCommand(name=node.name, address=node.address,
                          private_address=node.private_address, is_head=True, gpus=0,
                          argv=("true",), env={}, run_dir=str(run_dir), cwd=str(run_dir),
                          probe=(node.python, str(NODE_PROBE)))
    conn = connect(node, SshOptions())
    proc = SshNodeProcess(command, node, conn, SshOptions(), stamp="watcher-test")
    try:
        beat(run_dir, 3)
        assert [b["step"] for b in proc.heartbeats()] == [3]
        beat(run_dir, 4)
        assert [b["step"] for b in proc.heartbeats()] == [4]
        # A user's job: the run's processes too (none carry this stamp).
        assert proc.activity()["procs"] == []
        first = watchers(lab, node.name)
        assert len(first) == 1

        netns.kill(first[0])
        # The look that finds it dead may fail (the hang watch takes that as no answer);
        # the next one has a new watcher.
        with contextlib.suppress(LauncherError):
            proc.heartbeats()
        assert [b["step"] for b in proc.heartbeats()] == [4]
        second = watchers(lab, node.name)
        assert len(second) == 1 and second != first
    finally:
        proc.close()
        # Gone when close() returns: launch waits for the watcher's exit.
        assert watchers(lab, node.name) == []
        conn.close()
