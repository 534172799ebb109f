"""The playbooks pass ansible-lint's production profile and Ansible's syntax check, offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLAYBOOKS = Path(__file__).resolve().parents[2] / "launcher" / "playbooks"
VENV_BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    # The venv's bin first: ansible-lint runs ansible-playbook/ansible-galaxy from PATH.
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), **extra}


def test_site_playbook_passes_the_syntax_check(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    node0:\n      ansible_host: 192.0.2.10\n")
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "--syntax-check", "-i", str(inventory), "site.yml"],
        cwd=PLAYBOOKS, env=_env(), capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_playbooks_pass_ansible_lint_production_profile(tmp_path):
    if not (VENV_BIN / "ansible-lint").exists():
        pytest.fail("ansible-lint is missing: install the test extra (pip install -e .[test])")
    # A copy: ansible-lint writes its cache (.ansible/) into the project it checks.
    project = tmp_path / "playbooks"
    shutil.copytree(PLAYBOOKS, project)
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
        cwd=project, env=_env(ANSIBLE_HOME=str(tmp_path / "ansible-home"),
                              XDG_CACHE_HOME=str(tmp_path / "cache")),
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr
