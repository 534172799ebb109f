"""A node's folder sent in its guard's last line (launch_node/node_probe.py folder_files) and
written here (launcher/backends/ssh/agent.py write_files): only when small, only regular
files, never the shipped code, and nothing written outside the node's run folder whatever
names a node sends."""

from __future__ import annotations

import base64
import os

import pytest

from launch_node import node_probe
from launcher.backends.ssh.agent import write_files
from launcher.core.errors import LauncherError


def test_a_small_folder_is_sent_whole_but_its_code_links_and_fifos(tmp_path):
    node = tmp_path / "node"
    (node / "code" / "launch_node").mkdir(parents=True)
    (node / "code" / "launch_node" / "worker.py").write_text("shipped")
    (node / "logs").mkdir()
    (node / "logs" / "rank0.log").write_bytes(b"\x00binary\xff")
    (node / "result.json").write_text("{}")
    (node / "elsewhere").symlink_to("/etc/hostname")
    os.mkfifo(node / "pipe")
    files = node_probe.folder_files(node)
    assert {k: base64.b64decode(v) for k, v in files.items()} == {
        "logs/rank0.log": b"\x00binary\xff", "result.json": b"{}"}


def test_a_large_folder_is_left_to_sftp(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * (node_probe.INLINE_BYTES + 1))
    assert node_probe.folder_files(tmp_path) is None
    for i in range(node_probe.INLINE_FILES + 1):
        (tmp_path / f"f{i}").write_text("")
    (tmp_path / "big.bin").unlink()
    assert node_probe.folder_files(tmp_path) is None


def test_what_a_node_sends_is_written_in_its_folder_and_nowhere_else(tmp_path):
    (tmp_path / "runs").mkdir()   # a run folder is made before its nodes' files come
    local = tmp_path / "runs" / "r1" / "host0"
    written = write_files({"logs/rank0.log": base64.b64encode(b"line\n").decode()}, local,
                          "node host0")
    assert written == [local / "logs" / "rank0.log"]
    assert (local / "logs" / "rank0.log").read_bytes() == b"line\n"
    for bad in ("../host1/x", "/etc/x", "logs//x", "./x", ""):
        with pytest.raises(LauncherError, match="node host0 sent its folder"):
            write_files({bad: ""}, local, "node host0")
    with pytest.raises(LauncherError, match="not base64"):
        write_files({"x": "***"}, local, "node host0")
    assert sorted(p.name for p in (tmp_path / "runs" / "r1").iterdir()) == ["host0"]
