"""Broken and hostile input, table-driven: every case is a clear error naming the file, flag,
key or host (or, where marked, a warning), never a traceback, and nothing is written outside
the case's own folder. The cases are the ones a tester found in issue 11: each crashed launch
with a traceback, hung it, or escaped the run folder."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch_cmd

GOOD_RECIPE = {"name": "t", "train": {"dataset": "digits", "image_size": 8, "patch_size": 4,
                                      "steps": 2}}
GOOD_INVENTORY = {"all": {"vars": {"gpus": 0}, "hosts": {
    "h0": {"ansible_host": "10.9.9.1"}, "h1": {"ansible_host": "10.9.9.2"}}}}


def recipe(**changes) -> str:
    data = yaml.safe_load(yaml.safe_dump(GOOD_RECIPE))
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(data)


def inventory(hosts=None, **all_changes) -> str:
    data = yaml.safe_load(yaml.safe_dump(GOOD_INVENTORY))
    if hosts is not None:
        data["all"]["hosts"] = hosts
    data["all"].update(all_changes)
    return yaml.safe_dump(data)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}]\n" for i in range(20))


@dataclass
class Case:
    id: str
    argv: list[str]
    code: int
    says: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    stream: str = "stderr"


R = ["run", "recipe.yml", "--dry-run"]
RI = ["run", "recipe.yml", "-i", "inv.yml", "--dry-run"]
CASES = [
    # ---- recipe files that are not recipes
    Case("binary-recipe", R, 2, "recipe.yml: holds NUL bytes", {"recipe.yml": b"\x7fELF\x00\x01"}),
    Case("latin1-recipe", R, 2, "recipe.yml: is not UTF-8 text",
         {"recipe.yml": "name: caf\u00e9\n".encode("latin-1")}),
    Case("nested-recipe", R, 2, "recipe.yml: not valid YAML: nested", {"recipe.yml": "[" * 5000}),
    Case("alias-bomb", R, 2, "more than 100 aliases", {"recipe.yml": BOMB}),
    Case("huge-recipe", R, 2, "a recipe is at most 1048576 bytes",
         {"recipe.yml": "# " + "x" * (2 << 20)}),
    Case("duplicate-key", R, 2, "duplicate key 'name' (first on line 1)",
         {"recipe.yml": "name: a\nname: b\ntrain: {steps: 1}\n"}),
    Case("yaml-syntax-names-file", R, 2, "recipe.yml: not valid YAML: line 3",
         {"recipe.yml": "name: a\ntrain: [unclosed\n"}),
    Case("device-recipe", ["run", "/dev/zero", "--dry-run"], 2,
         "/dev/zero: is not a regular file"),
    Case("folder-recipe", ["run", ".", "--dry-run"], 2, "is a folder"),
    # ---- values that passed validation and crashed at start
    Case("epochs-inf", R, 2, "train.epochs",
         {"recipe.yml": recipe(train__steps=None, train__epochs=float("inf"))}),
    Case("bucket-nan", R, 2, "ddp.bucket_cap_mb", {"recipe.yml": recipe(ddp__bucket_cap_mb=float("nan"))}),
    Case("timeout-1e30", R, 2, "rendezvous.timeout", {"recipe.yml": recipe(rendezvous__timeout=1e30)}),
    Case("seed-2-70", R, 2, "train.seed", {"recipe.yml": recipe(train__seed=2**70)}),
    Case("lr-inf", R, 2, "train.lr", {"recipe.yml": recipe(train__lr=float("inf"))}),
    Case("nproc-1e6", R, 2, "nproc_per_node", {"recipe.yml": recipe(nproc_per_node=10**6)}),
    Case("huge-batch", R, 2, "train.batch_size", {"recipe.yml": recipe(train__batch_size=10**12)}),
    Case("huge-width", R, 2, "train.width", {"recipe.yml": recipe(train__width=10**9)}),
    Case("huge-image", R, 2, "train.image_size", {"recipe.yml": recipe(train__image_size=10**7)}),
    Case("nodes-true", R, 2, "nodes", {"recipe.yml": recipe(nodes=True)}),
    Case("nodes-1e30", R, 2, "nodes", {"recipe.yml": recipe(nodes=1e30)}),
    Case("long-name", R, 2, "name", {"recipe.yml": recipe(name="n" * 300)}),
    Case("env-run-id", R, 2, "LAUNCH_RUN_ID is set by launch",
         {"recipe.yml": recipe(env={"LAUNCH_RUN_ID": "other-run"})}),
    Case("env-ld-preload", R, 2, "LD_PRELOAD is set by launch",
         {"recipe.yml": recipe(env={"LD_PRELOAD": "/tmp/x.so"})}),
    Case("env-nul", R, 2, "env: NOTE: the value holds a NUL byte",
         {"recipe.yml": recipe(env={"NOTE": "a\0b"})}),
    # ---- flags
    Case("rdzv-port-0", R + ["--rdzv-port", "0"], 2, "--rdzv-port", {"recipe.yml": recipe()}),
    Case("rdzv-port-70000", R + ["--rdzv-port", "70000"], 2, "--rdzv-port",
         {"recipe.yml": recipe()}),
    Case("rdzv-port-negative", R + ["--rdzv-port=-1"], 2, "--rdzv-port", {"recipe.yml": recipe()}),
    Case("grace-nan", R + ["--grace", "nan"], 2, "--grace", {"recipe.yml": recipe()}),
    Case("grace-negative", R + ["--grace=-5"], 2, "--grace", {"recipe.yml": recipe()}),
    Case("nodes-100000-local", R + ["--local", "--nodes", "100000"], 2, "1 to 64",
         {"recipe.yml": recipe()}),
    Case("run-id-slash", R + ["--run-id", "../x"], 2, "--run-id", {"recipe.yml": recipe()}),
    Case("runs-dir-is-file", ["run", "recipe.yml", "--local", "--runs-dir", "afile"], 2,
         "afile is a file, not a folder", {"recipe.yml": recipe(), "afile": "x"}),
    Case("runs-dir-unwritable", ["run", "recipe.yml", "--local", "--runs-dir",
                                 "/proc/launch-runs"], 2, "cannot create the run folder",
         {"recipe.yml": recipe()}),
    # ---- inventories
    Case("binary-inventory", RI, 2, "inv.yml: holds NUL bytes",
         {"recipe.yml": recipe(), "inv.yml": b"\x00\x01\x02"}),
    Case("escaping-host", RI, 2, "host '../../escape-node': the host name cannot be used",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"../../escape-node": {"ansible_host": "10.9.9.1"}})}),
    Case("absolute-host", RI, 2, "the host name cannot be used",
         {"recipe.yml": recipe(), "inv.yml": inventory({"/tmp/abs": {"ansible_host": "10.9.9.1"}})}),
    Case("vars-not-mapping", RI, 2, "inv.yml: all.vars must be a mapping",
         {"recipe.yml": recipe(), "inv.yml": inventory(vars=["a", "b"])}),
    Case("children-not-mapping", RI, 2, "inv.yml: all.children must be a mapping",
         {"recipe.yml": recipe(), "inv.yml": inventory(children="x")}),
    Case("port-70000", RI, 2, "host h0: ansible_port must be from 1 to 65535, got 70000",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"h0": {"ansible_host": "10.9.9.1", "ansible_port": 70000}})}),
    Case("port-0", RI, 2, "host h0: ansible_port must be from 1 to 65535, got 0",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"h0": {"ansible_host": "10.9.9.1", "ansible_port": 0}})}),
    Case("private-ip-list", RI, 2, "host h0: private_ip must be text",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"h0": {"ansible_host": "10.9.9.1", "private_ip": ["x"]}})}),
    Case("inventory-duplicate-host", RI, 2, "duplicate key 'h0'",
         {"recipe.yml": recipe(),
          "inv.yml": "all:\n  hosts:\n    h0: {ansible_host: 10.9.9.1}\n"
                     "    h0: {ansible_host: 10.9.9.2}\n"}),
    Case("misspelled-key-warns", RI, 0, "unknown key privat_ip (did you mean private_ip?)",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"h0": {"ansible_host": "10.9.9.1", "privat_ip": "10.0.0.1"}})}),
    Case("same-machine-twice-warns", RI, 0, "hosts h0 and h1 are the same machine",
         {"recipe.yml": recipe(),
          "inv.yml": inventory({"h0": {"ansible_host": "10.9.9.1"},
                                "h1": {"ansible_host": "10.9.9.1"}})}),
    Case("known-hosts-folder", ["run", "recipe.yml", "-i", "inv.yml", "--known-hosts", "/tmp"],
         2, "--known-hosts /tmp", {"recipe.yml": recipe(), "inv.yml": inventory()}),
    # ---- reports, setup, inspect
    Case("report-bad-plan", ["report", "runs/r1"], 2, "plan.json: not valid JSON",
         {"runs/r1/plan.json": "{not json", "runs/r1/summary.json": "{}"}),
    Case("report-unknown-id", ["report", "nope"], 2, "no run folder nope here or in runs/"),
    Case("report-by-run-id", ["report", "r2"], 0, "# Run report",
         {"runs/r2/plan.json": '{"run_id": "r2", "nodes": []}', "runs/r2/summary.json": "{}"},
         stream="stdout"),
    Case("report-foreign-plan", ["report", "runs/r3"], 2, "is not what launch writes",
         {"runs/r3/plan.json": '{"nodes": [{"no": "name"}]}'}),
    Case("setup-e-binary", ["setup", "-i", "inv.yml", "-e", "@vars.bin", "--check"], 2,
         "-e @vars.bin", {"inv.yml": inventory(), "vars.bin": b"\x00\xff\xfe"}),
    Case("inspect-dev-zero", ["inspect", "/dev/zero"], 2, "/dev/zero", stream="stderr"),
    Case("inspect-long-line", ["inspect", "long.log"], 2, "long.log",
         {"long.log": "# nThread 1 " + "x" * 200_000 + "\n"}),
    # ---- AWS inputs (nothing reaches AWS: the values are refused first)
    *[Case(f"ttl-{ttl}", ["provision", "--instance", "p4d.24xlarge", f"--ttl={ttl}",
                          "--dry-run"], 2, f"--ttl '{ttl}' is not a duration")
      for ttl in ("nan", "inf", "1e12")],
    # Digits a float holds as infinity, and a finite TTL past any expiry date launch writes.
    *[Case(f"ttl-{name}", ["provision", "--instance", "p4d.24xlarge", f"--ttl={ttl}",
                           "--dry-run"], 2, "is longer than launch sets an expiry")
      for name, ttl in (("400-digits", "9" * 400), ("a-million-days", "1000000d"))],
    Case("ledger-is-a-list", ["teardown", "--cluster", "x"], 2, "not a ledger launch wrote",
         {"home/clusters/x/ledger.json": "[1, 2]"}),
]


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(tmp_path, case):
    # The case runs deep inside tmp_path: a write that escapes its folder lands beside it.
    case_dir = tmp_path / "a" / "b" / "case"
    case_dir.mkdir(parents=True)
    for name, content in case.files.items():
        path = case_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    before = _snapshot(tmp_path)
    env = {**os.environ, "LAUNCH_HOME": str(case_dir / "home")}
    proc = subprocess.run(launch_cmd(*case.argv), cwd=case_dir, env=env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                          errors="replace")
    out = proc.stderr if case.stream == "stderr" else proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == case.code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert case.says in out, out[-2000:]
    assert len(out) < 20_000  # a message quotes values shortened, never a 110 MB bomb
    after = _snapshot(tmp_path)
    outside = {p for p in after - before if not p.startswith("a/b/case")}
    assert not outside, outside
    assert not any("escape-node" in p for p in after)


def test_fifo_recipe_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "recipe.yml"
    os.mkfifo(fifo)
    proc = subprocess.run(launch_cmd("run", str(fifo), "--dry-run"), cwd=tmp_path, text=True,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "is not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "recipe.yml").write_text(recipe(train__lr=float("inf")))
    proc = subprocess.run(launch_cmd("--debug", "run", "recipe.yml", "--dry-run"), cwd=tmp_path,
                          text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
