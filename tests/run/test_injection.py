"""Recipe values never pass through a shell: each stays one literal argument."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.run.conftest import write_recipe

HOSTILE = ["$(touch {canary})", "a; rm -rf ~", "`touch {canary}`", "x' \"y\" && touch {canary}"]


@pytest.mark.parametrize("template", HOSTILE)
def test_dry_run_keeps_hostile_values_literal(run_launch, tmp_path, template):
    value = template.format(canary=tmp_path / "canary")
    recipe = write_recipe(tmp_path, train={"dataset": value}, env={"NOTE": value})
    proc = run_launch("run", "--local", "--nodes", "2", str(recipe), "--dry-run", "--json",
                      check=True)
    for node in json.loads(proc.stdout)["nodes"]:
        argv = node["argv"]
        assert argv[argv.index("--dataset") + 1] == value
        assert node["env"]["NOTE"] == value
    human = run_launch("run", "--local", str(recipe), "--dry-run", check=True).stdout
    command_line = next(line for line in human.splitlines() if "torch.distributed.run" in line)
    words = shlex.split(command_line)
    assert words[words.index("--dataset") + 1] == value
    assert not (tmp_path / "canary").exists()


@pytest.mark.slow
def test_real_run_passes_hostile_dataset_as_one_argument(run_launch, tmp_path):
    canary = tmp_path / "canary"
    value = f"$(touch {canary}); touch {canary}"
    recipe = write_recipe(tmp_path, nodes=1, train={"dataset": value})
    proc = run_launch("run", "--local", str(recipe), "--run-id", "hostile", timeout=120)
    assert proc.returncode == 1
    # The trainer looked for a folder literally named by the whole value, and nothing ran it.
    assert f"dataset folder not found: {value}" in proc.stdout + proc.stderr
    assert not canary.exists()
    summary = json.loads((tmp_path / "runs/hostile/summary.json").read_text())
    assert summary["status"] == "failed"
