"""What runs on a node to ask the same thing asks it the same way. The playbooks' scripts are
shipped one file each by ansible.builtin.script (standard library only), so what they share is
written in each: the copies must be the same text. launch's own node programs (`launch check`'s
ask_node.py, preflight's probe) share one torch_facts; all the torch probes must agree."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from launcher.backends.ssh.preflight import PROBE
from launcher.check.probe import PROBE_SOURCE
from launcher.core.bundled import playbooks_dir

ROLES = playbooks_dir() / "roles"
FACTS = ROLES / "node_facts/files/collect_node_facts.py"
CHECKS = ROLES / "node_checks/files/check_node.py"


def definition(path, name: str) -> str:
    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
            return node.value.value
    raise AssertionError(f"{path.name} defines no {name}")


def test_the_playbook_scripts_read_nccl_tests_linkage_with_one_text():
    assert definition(FACTS, "linked_nccl") == definition(CHECKS, "linked_nccl")


def _run(*argv: str) -> str:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120,
                          check=True, stdin=subprocess.DEVNULL).stdout


@pytest.mark.slow
def test_every_torch_probe_says_what_this_interpreter_has(tmp_path):
    import torch

    expected = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    facts = json.loads(_run("-c", definition(FACTS, "TORCH_PROBE")))
    checks = json.loads(_run("-c", definition(CHECKS, "TORCH_PROBE")))
    asked = json.loads(_run("-c", PROBE_SOURCE.read_text(), str(tmp_path)).split(
        "LAUNCH-CHECK ", 1)[1])["torch"]
    preflight = json.loads(_run("-c", PROBE, json.dumps(
        {"addr": "127.0.0.1", "port": 0, "env_file": str(tmp_path / "none")})).split(
        "LAUNCH-PROBE ", 1)[1])
    assert {k: asked[k] for k in expected} == expected
    assert {k: preflight[k] for k in expected} == expected
    assert (facts["version"], facts["cuda"]) == (expected["torch"], expected["cuda"])
    assert (checks["version"], checks["cuda"]) == (expected["torch"], expected["cuda"])
    assert facts["nccl"] == checks["nccl"] == asked["nccl"]
    if expected["cuda"]:
        assert checks["devices"] == expected["gpus"]
