"""What a node sends back is bounded and checked: a node flooding its answer, or printing a
probe line that is not JSON, is named, never a traceback or launch's memory grown without
bound."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.backends.ssh.preflight import NodeProbe
from launcher.cluster.inventory import load_inventory
from launcher.cluster.ssh import HostProblem, connect, remote, run_with_input
from launcher.cluster.ssh_options import SshOptions


def test_a_flood_of_output_is_cut_and_the_command_ended(lab):
    node = load_inventory(lab.inventory)[0]
    conn = connect(node, SshOptions())
    try:
        status, text = run_with_input(conn, remote("yes", "flood"), b"", timeout=30,
                                      limit=1 << 20)
        assert status == -1 and text.endswith("(output over 1 MB: cut, command ended)")
        assert len(text) < (1 << 20) + 100
        # The connection is still good for the next command.
        assert run_with_input(conn, remote("cat"), b"intact", timeout=30) == (0, "intact")
    finally:
        conn.close()


def test_a_probe_line_that_is_not_a_json_object_names_the_host(lab, tmp_path):
    """A node whose python prints a forged probe line (a sitecustomize, a wrapper script)."""
    node = load_inventory(lab.inventory)[0]
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'LAUNCH-PROBE [1, 2'\n")
    fake.chmod(0o755)
    conn = connect(node, SshOptions())
    try:
        with pytest.raises(HostProblem, match="not a JSON object") as err:
            NodeProbe(conn, dataclasses.replace(node, python=str(fake)), 0).facts()
        assert err.value.host == node.name
    finally:
        conn.close()
