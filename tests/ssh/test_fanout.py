"""The SSH backend's fan-out window (issue 37): preflight connects to and checks at most
`--fanout` hosts at a time, on that many threads, and each host's problem still names it.

The hosts here are a real TCP server on 127.0.0.1 that counts the connections it holds at once:
it holds each until a full window (N) of them is open (a barrier), then closes it before the
SSH banner, so every host's preflight fails with its own error. A launcher with a window of N
reaches exactly N at a time (a narrower one never fills the barrier); when a window is full the
launcher's pool threads are counted: a pool wider than the window has one per host by then."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
import yaml

from launcher.cli import build_parser
from launcher.backends.ssh.preflight import PreflightFailed, preflight
from launcher.cluster.inventory import load_inventory
from launcher.cluster.ssh_options import SshOptions
from launcher.execute.backend import in_parallel
from launcher.job.recipe import load_recipe

pytestmark = pytest.mark.timeout(120)


def pool_threads() -> int:
    return sum(t.name.startswith("ThreadPoolExecutor") for t in threading.enumerate())


class CountingHosts:
    """Accepts connections; holds each until `window` are open together, then closes it."""

    def __init__(self, window: int):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.barrier = threading.Barrier(window, action=self._window_full)
        self.lock = threading.Lock()
        self.open = self.most = self.served = 0
        self.pool_threads: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.served += 1
                self.most = max(self.most, self.open)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _window_full(self) -> None:
        # The launcher's pool threads (this process's: the launcher runs in the test) while
        # a window is held open: every host's task was submitted by now, and a pool wider than
        # the window has a thread for each.
        self.pool_threads.append(pool_threads())

    def _hold(self, conn: socket.socket) -> None:
        try:
            self.barrier.wait(timeout=20)   # a window that never fills: fails the count below
        except threading.BrokenBarrierError:
            pass
        with self.lock:
            self.open -= 1   # before the close: the host's connect ends only after it
        conn.close()

    def close(self) -> None:
        self.sock.close()


def _inventory(tmp_path, port: int, hosts: int):
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {
        f"h{i:02d}": {"ansible_host": "127.0.0.1", "ansible_port": port}
        for i in range(hosts)}}}))
    return path


@pytest.mark.parametrize("window", [1, 4])
def test_preflight_connects_to_at_most_the_window_at_a_time_and_names_every_host(tmp_path,
                                                                                 window):
    hosts = CountingHosts(window)
    try:
        nodes = load_inventory(str(_inventory(tmp_path, hosts.port, 12)))
        with pytest.raises(PreflightFailed) as failed:
            preflight(nodes, load_recipe("vit-tiny-local"),
                      SshOptions(known_hosts=str(tmp_path / "known_hosts")), 29500,
                      fanout=window)
    finally:
        hosts.close()
    assert hosts.served == 12 and hosts.most == window
    # The threads: as many as the window, not as the hosts.
    assert hosts.pool_threads and max(hosts.pool_threads) <= window
    # Every host's problem, each named.
    assert sorted(p.host for p in failed.value.problems) == [f"h{i:02d}" for i in range(12)]
    assert all("127.0.0.1" in p.why for p in failed.value.problems)


def test_a_window_counts_its_tasks_in_flight_with_a_real_pool():
    """in_parallel, the window every SSH fan-out goes through: 18 tasks, 3 at a time, each
    held until 3 are in flight; a failing one is its item's answer."""
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    seen_threads = []
    barrier = threading.Barrier(3, action=lambda: seen_threads.append(pool_threads()))

    def task(item: int) -> int:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            barrier.wait(timeout=20)   # a window that never fills: fails the count below
        except threading.BrokenBarrierError:
            pass
        with lock:
            state["now"] -= 1
        if item == 7:
            raise RuntimeError("host 7 failed")
        return item * 2

    answers = in_parallel(task, range(18), max_workers=3)
    assert state["most"] == 3 and max(seen_threads) == 3
    assert [answers[i] for i in range(18) if i != 7] == [i * 2 for i in range(18) if i != 7]
    assert str(answers[7]) == "host 7 failed"


def test_fanout_reaches_the_backend(tmp_path, capsys):
    """`launch run -i INV --fanout 4 --dry-run` says the window; 0 is refused."""
    inventory = _inventory(tmp_path, 22, 6)
    run = [sys.executable, "-m", "launcher", "run", "vit-tiny-local", "-i", str(inventory),
           "--nodes", "6", "--dry-run"]
    env = {**os.environ, "LAUNCH_HOME": str(tmp_path / "home")}
    out = subprocess.run([*run, "--fanout", "4"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "preflight connects to and checks at most 4 host(s) at a time (--fanout)" in out.stdout
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "-i", str(inventory), "--fanout", "0"])
    assert refused.value.code == 2
    assert "--fanout must be at least 1 host at a time, got 0" in capsys.readouterr().err
