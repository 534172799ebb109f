"""`launch setup` errors a user can cause, through the real CLI (no node needed)."""

from __future__ import annotations

import socket

import pytest


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.yml"
    path.write_text(
        "all:\n  hosts:\n    node7:\n      ansible_host: 127.0.0.1\n"
        f"      ansible_port: {_closed_port()}\n      ansible_user: root\n")
    return path


def test_an_unknown_tag_is_refused_before_anything_runs(run_launch, inventory):
    proc = run_launch("setup", "-i", str(inventory), "--tags", "nccl,drivers")
    assert proc.returncode == 2
    assert "unknown tag(s) drivers: --tags takes cuda_keyring, nvidia_driver, nccl" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_inventory_is_named(run_launch, tmp_path):
    proc = run_launch("setup", "-i", str(tmp_path / "nope.yml"))
    assert proc.returncode == 2
    assert f"{tmp_path / 'nope.yml'}: cannot read the inventory" in proc.stderr


@pytest.mark.slow
def test_an_unreachable_host_is_named_with_the_reason(run_launch, inventory, tmp_path):
    proc = run_launch("setup", "-i", str(inventory), timeout=300)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "node7  UNREACHABLE" in proc.stdout
    assert "node7 unreachable at 'Gathering Facts':" in proc.stdout
    assert "Connection refused" in proc.stdout
    summary = proc.stdout.split("\nsummary:\n", 1)[1].splitlines()
    assert summary[1].split() == ["node7", "0", "0", "0", "1", "0"]
    logs = list((tmp_path / "launch-home" / "setup").glob("*/artifacts/ansible/stdout"))
    assert len(logs) == 1 and f"full log: {logs[0]}" in proc.stdout


@pytest.mark.slow
def test_a_limit_that_matches_no_host_fails(run_launch, inventory):
    proc = run_launch("setup", "-i", str(inventory), "--limit", "node9", timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Could not match supplied host pattern, ignoring: node9" in proc.stdout
    assert "summary:" not in proc.stdout and "node facts:" not in proc.stdout


def test_extra_vars_must_be_key_value_or_a_file_of_a_mapping(run_launch, inventory, tmp_path):
    proc = run_launch("setup", "-i", str(inventory), "-e", "not a pair")
    assert proc.returncode == 2
    assert "-e 'not a pair': expected KEY=VALUE or @FILE" in proc.stderr
    listing = tmp_path / "list.yml"
    listing.write_text("- a\n- b\n")
    proc = run_launch("setup", "-i", str(inventory), "-e", f"@{listing}")
    assert proc.returncode == 2
    assert f"{listing} must hold a mapping of variables" in proc.stderr


def test_a_gpu_instance_type_without_gpus_is_refused_naming_host_and_key(run_launch, tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu0:\n      ansible_host: 192.0.2.10\n"
        "      instance_type: p4d.24xlarge\n      gpus: 8\n"
        "    gpu1:\n      ansible_host: 192.0.2.11\n      instance_type: p4d.24xlarge\n")
    for args in ([], ["--verify"]):
        proc = run_launch("setup", "-i", str(inventory), *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert (f"{inventory}: gpu1 is a p4d.24xlarge with 8 GPUs but has no `gpus`: set gpus: 8 "
                "in its host variables. Nothing was changed.") in proc.stderr
        assert "gpu0" not in proc.stderr and "Traceback" not in proc.stderr


def test_verify_takes_no_tags(run_launch, inventory):
    proc = run_launch("setup", "-i", str(inventory), "--verify", "--tags", "nccl")
    assert proc.returncode == 2
    assert "--verify runs the node checks only: drop --tags" in proc.stderr


@pytest.mark.slow
def test_verify_names_an_unreachable_host_in_its_table(run_launch, inventory):
    proc = run_launch("setup", "-i", str(inventory), "--verify", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("host "))
    assert lines[header].split() == ["host", "driver", "gpus", "dkms", "fabric_manager",
                                     "persistence", "efa", "nccl", "torch"]
    assert lines[header + 1].split() == ["node7", "UNREACHABLE"]
    assert "node7 unreachable at 'Gathering Facts':" in proc.stdout
    assert "Connection refused" in proc.stdout
