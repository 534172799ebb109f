"""The hang watch's looks at an SSH node (launcher/backends/ssh/watcher.py): one watcher on
the node answers every look of the run, a watcher that died is replaced at the next look, and
nothing of it is left on the node once launch is done with the node."""

from __future__ import annotations

import base64
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


def test_the_watcher_in_the_agents_own_session_looks_signals_and_reaps_what_escaped(
        lab, tmp_path):
    """The node's one SSH session: the agent's start also starts its watcher (no second
    session for looks), a stop's signal goes through it, and when the agent ends it kills what
    of this start escaped the agent's process group (a child in a session of its own) and says
    so."""
    import signal
    import time

    node = load_inventory(lab.inventory)[0]
    run_dir = tmp_path / "node"
    run_dir.mkdir()
    escaped = run_dir / "escaped.pid"
    job = f'setsid sleep 301 & echo $! > {escaped}; echo started; exec sleep 302'
    command = NodeCommand(name=node.name, address=node.address,
                          private_address=node.private_address, is_head=True, gpus=0,
                          argv=("sh", "-c", job), env={"LAUNCH_NODE": node.name},
                          run_dir=str(run_dir), cwd=str(run_dir),
                          probe=(node.python, "-S", str(NODE_PROBE)))
    conn = connect(node, SshOptions())
    proc = SshNodeProcess(command, node, conn, SshOptions(), stamp="session-watcher-test")
    try:
        proc.start()
        lines = proc.lines()
        assert next(lines) == "started"
        # Answered: the watcher has started. (`setsid` may not have exec'd its sleep yet at
        # the first look.)
        deadline = time.monotonic() + 20
        while {p["cmd"] for p in proc.activity()["procs"]} != {"sleep 301", "sleep 302"}:
            assert time.monotonic() < deadline, proc.activity()["procs"]
            time.sleep(0.5)
        found = watchers(lab, node.name)
        assert len(found) == 1
        assert b"--guard" in Path(f"/proc/{found[0]}/cmdline").read_bytes().split(b"\0")
        beat(run_dir, 7)
        assert [b["step"] for b in proc.heartbeats()] == [7]
        assert watchers(lab, node.name) == found   # no watcher of its own session opened

        proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is not None
        pid = int(escaped.read_text())
        # Killed by the guard at the agent's end, and said in the session's last line.
        assert proc.reap()["killed"] == [pid]
        # The node's folder came with it (small): launch opens no SFTP session to fetch it.
        files = proc.folder_files()
        assert base64.b64decode(files["escaped.pid"]).decode().strip() == str(pid)
        assert json.loads(base64.b64decode(files["heartbeat/local0.json"]))["step"] == 7
        assert proc.folder_files() is None   # handed over once
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        assert watchers(lab, node.name) == []
    finally:
        proc.close()
        conn.close()


def test_a_late_answer_keeps_the_sessions_watcher_and_its_end_is_said_at_once(lab, tmp_path):
    """A loaded node answers a look late: the look fails, the next is asked of the same
    watcher (no session of its own opened, the late answer never taken for the next look's).
    A watcher that ended fails the next look at once, not after the look's timeout, and the
    look after that has a watcher of its own."""
    import signal
    import time

    node = load_inventory(lab.inventory)[0]
    run_dir = tmp_path / "node"
    run_dir.mkdir()
    command = NodeCommand(name=node.name, address=node.address,
                          private_address=node.private_address, is_head=True, gpus=0,
                          argv=("sh", "-c", "echo started; exec sleep 303"),
                          env={"LAUNCH_NODE": node.name}, run_dir=str(run_dir),
                          cwd=str(run_dir), probe=(node.python, "-S", str(NODE_PROBE)))
    conn = connect(node, SshOptions())
    proc = SshNodeProcess(command, node, conn, SshOptions(), stamp="late-watcher-test")
    try:
        proc.start()
        assert next(proc.lines()) == "started"
        beat(run_dir, 5)
        assert [b["step"] for b in proc.heartbeats()] == [5]
        (watcher,) = watchers(lab, node.name)

        import os
        os.kill(watcher, signal.SIGSTOP)
        try:
            with pytest.raises(LauncherError, match="did not answer in 1 s"):
                proc._watcher.ask("heartbeats", timeout=1)
        finally:
            os.kill(watcher, signal.SIGCONT)
        beat(run_dir, 6)
        assert [b["step"] for b in proc.heartbeats()] == [6]
        assert watchers(lab, node.name) == [watcher]

        # Killed while a look waits on it (stopped first: the look cannot be answered).
        import threading

        os.kill(watcher, signal.SIGSTOP)
        failed: list[Exception] = []

        def look():
            try:
                proc._session.ask("heartbeats", timeout=60)
            except LauncherError as err:
                failed.append(err)

        asking = threading.Thread(target=look)
        asking.start()
        time.sleep(0.5)
        os.kill(watcher, signal.SIGKILL)
        asking.join(timeout=30)   # said, not waited out (60 s)
        assert not asking.is_alive()
        assert len(failed) == 1 and "ended (exit status 137)" in str(failed[0]), failed
        assert [b["step"] for b in proc.heartbeats()] == [6]
        (replacement,) = watchers(lab, node.name)
        assert replacement != watcher
        assert b"--guard" not in Path(f"/proc/{replacement}/cmdline").read_bytes().split(b"\0")
        assert proc.poll() is None   # the job goes on without its session's watcher
    finally:
        proc.signal(signal.SIGKILL)
        proc.close()
        conn.close()
