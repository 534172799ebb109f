"""launch killed outright during an SSH run: the nodes notice the dropped session."""

from __future__ import annotations

import signal

import pytest

from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.ssh.conftest import lab_worker_pid, only_sshd_left

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def test_sigkill_of_launch_stops_every_lab_host(lab, tmp_path):
    recipe = write_recipe(tmp_path, train={"steps": 5000})
    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                         "--run-id", "ssh-orphan", "--rdzv-port", "29615"], tmp_path)
    try:
        wait_for(lambda: lab_worker_pid(lab, "host0", "ssh-orphan")
                 and lab_worker_pid(lab, "host1", "ssh-orphan"), 180, "training on both hosts")
        run.proc.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        # Each node's watchdog holds its SSH session's stdin: the session ended, so it
        # stopped the node agent's process group.
        wait_for(lambda: only_sshd_left(lab) == {}, 5, "the lab hosts to be empty")
    finally:
        run.kill()
