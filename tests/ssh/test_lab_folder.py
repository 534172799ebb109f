"""`launch lab up --dir DIR` with the folder names users pick: a space works (sshd_config's
paths are quoted), what sshd_config cannot say is refused before anything is made."""

from __future__ import annotations

import subprocess

import pytest

from launcher.lab.hosts import Lab, lab_unavailable_reason
from launcher.lab import netns
from launcher.lab.netns import LabError

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_a_lab():
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)


def test_a_lab_folder_with_a_space_comes_up_and_answers_ssh(tmp_path):
    lab = Lab.create(tmp_path / "my lab", hosts=1)
    try:
        host = lab.hosts[0]
        # Quoted for ssh too: it splits UserKnownHostsFile's value on spaces.
        proc = subprocess.run(
            ["ssh", "-i", str(lab.key), "-o", f'UserKnownHostsFile="{lab.known_hosts}"',
             "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{host.address}",
             "echo", "up"], capture_output=True, text=True, timeout=30)
        assert proc.stdout.strip() == "up", proc.stderr
    finally:
        lab.destroy()


@pytest.mark.parametrize("name", ['say "hi"', "100%", "two\nlines"])
def test_what_sshd_config_cannot_say_is_refused_before_anything_is_made(tmp_path, name,
                                                                        monkeypatch):
    # What Lab.create makes, recorded as it is made (and made: the calls go through). Not a
    # before/after listing of `ip netns`: another test process's lab, or its availability
    # probe's namespace, may come or go meanwhile.
    made = []
    for maker in ("add_bridge", "add_namespace", "add_link"):
        real = getattr(netns, maker)
        monkeypatch.setattr(netns, maker,
                            lambda *a, _real=real, _name=maker: (made.append(_name), _real(*a)))
    with pytest.raises(LabError, match="a lab folder cannot hold"):
        Lab.create(tmp_path / name, hosts=1)
    assert not (tmp_path / name).exists()
    assert made == []
