"""Any Ansible inventory: an INI file with a host range, group_vars and host_vars drives a real
run on the lab, read by Ansible's own loader, as `launch setup` reads it."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.run.conftest import write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.lab]


def ini_inventory(lab, folder):
    """The lab's inventory rewritten the way a cluster admin writes one."""
    common = yaml.safe_load(lab.inventory.read_text())["all"]["vars"]
    folder.mkdir()
    (folder / "hosts.ini").write_text("[trainers]\nhost[0:1]\n\n[trainers:vars]\ngpus=0\n")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "trainers.yml").write_text(
        yaml.safe_dump({k: v for k, v in common.items() if k != "gpus"}))
    (folder / "host_vars").mkdir()
    for host in lab.hosts:
        (folder / "host_vars" / f"{host.name}.yml").write_text(
            yaml.safe_dump({"ansible_host": host.address}))
    return folder / "hosts.ini"


def test_ini_inventory_with_range_and_group_vars_runs_on_the_lab(lab, run_launch, tmp_path):
    inventory = ini_inventory(lab, tmp_path / "inv")
    recipe = write_recipe(tmp_path, train={"steps": 4, "log_every": 2})
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(inventory), "--run-id",
                      "ini", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads((tmp_path / "runs/ini/plan.json").read_text())
    assert [(n["name"], n["address"]) for n in plan["nodes"]] == [
        (h.name, h.address) for h in lab.hosts]
    summary = json.loads((tmp_path / "runs/ini/summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 4
    # --limit selects with an Ansible pattern; the first selected host is the head.
    dry = run_launch("run", "--nodes", "1", str(recipe), "-i", str(inventory), "--limit",
                     "host1", "--dry-run", "--json", check=True)
    [node] = json.loads(dry.stdout)["nodes"]
    assert (node["name"], node["address"], node["is_head"]) == ("host1", lab.hosts[1].address,
                                                               True)
