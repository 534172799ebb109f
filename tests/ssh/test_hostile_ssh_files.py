"""Files an inventory names for SSH (issue 25, class 2): a known_hosts file
(`UserKnownHostsFile=`, `--known-hosts`) or a private key that is a FIFO, a device or huge is
refused for that host before paramiko opens it (a FIFO hung preflight; /dev/zero grew launch to
3 GB). As a process under a timeout: nothing is connected to, the answer comes by itself."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch_cmd

pytestmark = pytest.mark.timeout(120)

RECIPE = yaml.safe_dump({"name": "t", "train": {"dataset": "digits", "image_size": 8,
                                                "patch_size": 4, "steps": 2}})


def fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def sparse(path: Path) -> str:
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    return str(path)


@dataclass
class Case:
    id: str
    make: object            # (folder) -> path of the file, or a fixed path
    key: str                # which inventory setting names it
    says: str


CASES = [
    Case("known-hosts-dev-zero", lambda d: "/dev/zero", "known_hosts",
         "known_hosts /dev/zero: is not a regular file (a device)"),
    Case("known-hosts-fifo", lambda d: fifo(d / "kh"), "known_hosts",
         "is not a regular file (a FIFO)"),
    Case("known-hosts-huge", lambda d: sparse(d / "kh"), "known_hosts",
         "is 4294967296 bytes; a known_hosts is at most"),
    Case("known-hosts-flag-fifo", lambda d: fifo(d / "kh"), "--known-hosts",
         "is not a regular file (a FIFO)"),
    Case("key-fifo", lambda d: fifo(d / "id"), "key", "ansible_ssh_private_key_file"),
    Case("key-dev-zero", lambda d: "/dev/zero", "key", "is not a regular file (a device)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_ssh_files_that_are_not_files_are_refused_for_their_host(case, tmp_path):
    path = case.make(tmp_path)
    host = {"ansible_host": "127.0.0.1", "ansible_port": 9, "gpus": 0}
    argv = ["run", "recipe.yml", "-i", "inv.yml"]
    if case.key == "known_hosts":
        host["ansible_ssh_common_args"] = f"-o UserKnownHostsFile={path}"
    elif case.key == "--known-hosts":
        argv += ["--known-hosts", path]
    else:
        host["ansible_ssh_private_key_file"] = path
    (tmp_path / "recipe.yml").write_text(RECIPE)
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {"h0": host}}}))
    proc = subprocess.run(launch_cmd(*argv), cwd=tmp_path, capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL,
                          env={**os.environ, "LAUNCH_HOME": str(tmp_path / "home")})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert "h0" in proc.stderr and case.says in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
