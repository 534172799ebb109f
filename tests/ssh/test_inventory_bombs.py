"""Expansion bombs (issue 25, class 6): host ranges and YAML aliases are checked before an
inventory reaches Ansible's loader, which would expand `h[0:999999]` for two minutes and a
gigabyte, and load an alias bomb in group_vars without bounds. Each case is refused within a
subprocess timeout far below the minutes Ansible would take, naming the file; ranges launch
accepts are counted as Ansible's own expand_hostname_range counts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import yaml

from launcher.cluster.inventory_files import range_size
from launcher.core.limits import MAX_NODES
from tests.conftest import launch_cmd
from tests.run.hostile import Guard, check, run_cli

pytestmark = pytest.mark.timeout(120)

RECIPE = yaml.safe_dump({"name": "t", "train": {"dataset": "digits", "image_size": 8,
                                                "patch_size": 4, "steps": 2}})
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n"
    for i in range(20))
GOOD_HOSTS = "all:\n  hosts:\n    h0: {ansible_host: 10.9.9.1}\n"
ARGV = ["run", "recipe.yml", "-i", "inv", "--dry-run"]


@dataclass
class Case:
    id: str
    files: dict[str, str]
    says: list[str]
    argv: list[str] = field(default_factory=lambda: list(ARGV))


def yaml_hosts(*patterns: str) -> str:
    return yaml.safe_dump({"all": {"hosts": {p: {"ansible_host": "10.9.9.1"} for p in patterns}}})


CASES = [
    Case("ini-range", {"inv": "[all]\nh[0:999999]\n"},
         ["inv: host pattern 'h[0:999999]' expands to more than 4096 hosts"]),
    Case("ini-range-with-vars", {"inv": "[gpu]\ngpu-[000001:999999] ansible_user=x\n"},
         ["host pattern 'gpu-[000001:999999]'"]),
    Case("yaml-range", {"inv": yaml_hosts("h[0:999999]")}, ["more than 4096 hosts"]),
    Case("yaml-range-by-extension", {"inv.yml": yaml_hosts("node-[a:z][0:9999]")},
         ["inv.yml: host pattern 'node-[a:z][0:9999]'"],
         argv=["run", "recipe.yml", "-i", "inv.yml", "--dry-run"]),
    Case("product-of-small-ranges", {"inv": "[all]\nh[0:99][0:99]\n"},
         ["'h[0:99][0:99]' expands to more than 4096"]),
    Case("alpha-and-step", {"inv": "[all]\nh[a:Z][0:999:1]\n"}, ["expands to more than 4096"]),
    Case("many-patterns-add-up", {"inv": "[a]\nh[0:3000]\n[b]\ng[0:3000]\n"},
         ["'g[0:3000]' expands to 3001 hosts, more than 4096 in all"]),
    Case("range-in-a-child-group", {"inv": yaml.safe_dump({"all": {"children": {"gpu": {
        "hosts": {"g[0:99999]": None}}}}})}, ["'g[0:99999]'"]),
    Case("folder-inventory", {"inv/10-good.yml": GOOD_HOSTS, "inv/20-bomb": "[x]\nb[1:100000]\n"},
         ["inv/20-bomb: host pattern 'b[1:100000]'"]),
    Case("folder-in-folder", {"inv/sub/hosts.ini": "[x]\nb[1:100000]\n"},
         ["inv/sub/hosts.ini"]),
    Case("alias-bomb-inventory", {"inv": BOMB}, ["inv: not valid YAML: more than 100 aliases"]),
    Case("alias-bomb-group-vars", {"inv": GOOD_HOSTS, "group_vars/all.yml": BOMB},
         ["group_vars/all.yml: not valid YAML: more than 100 aliases"]),
    Case("alias-bomb-group-vars-folder", {"inv": GOOD_HOSTS,
                                          "group_vars/all/10.yaml": BOMB},
         ["group_vars/all/10.yaml: not valid YAML: more than 100 aliases"]),
    Case("alias-bomb-host-vars", {"inv": GOOD_HOSTS, "host_vars/h0": BOMB},
         ["host_vars/h0: not valid YAML: more than 100 aliases"]),
    Case("deep-group-vars", {"inv": GOOD_HOSTS, "group_vars/all.json": "[" * 5000},
         ["group_vars/all.json: not valid YAML: nested"]),
    Case("huge-group-vars", {"inv": GOOD_HOSTS, "group_vars/all.yml": "# " + "x" * (2 << 20)},
         ["group_vars/all.yml", "at most 1048576 bytes"]),
    Case("setup-too", {"inv": "[all]\nh[0:999999]\n"}, ["more than 4096 hosts"],
         argv=["setup", "-i", "inv", "--syntax-check"]),
    Case("check-too", {"inv": "[all]\nh[0:999999]\n"}, ["more than 4096 hosts"],
         argv=["check", "-i", "inv"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bombs_are_refused_before_ansible_reads_them(case, tmp_path, monkeypatch, capsys):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "recipe.yml").write_text(RECIPE)
    for name, text in case.files.items():
        (case_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (case_dir / name).write_text(text)
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    guard.verify()
    check(outcome, 2, case.says, stream="err")


def test_the_57_byte_bomb_as_a_user_types_it(tmp_path):
    """As a separate process: refused long before Ansible's two minutes (the timeout)."""
    (tmp_path / "recipe.yml").write_text(RECIPE)
    (tmp_path / "hosts").write_text("[all]\nh[0:999999] ansible_host=10.0.0.1 gpus=0\n")
    proc = subprocess.run(launch_cmd("run", "recipe.yml", "-i", "hosts", "--dry-run"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL,
                          env={**os.environ, "LAUNCH_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2 and "expands to more than 4096 hosts" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ranges_within_the_cap_still_reach_ansible(tmp_path, monkeypatch, capsys):
    (tmp_path / "recipe.yml").write_text(RECIPE)
    (tmp_path / "inv").write_text("[all]\nh[01:04] gpus=0\n[all:vars]\nansible_host=10.0.0.1\n")
    outcome = run_cli(["run", "recipe.yml", "-i", "inv", "--nodes", "4", "--dry-run"],
                      tmp_path, monkeypatch, capsys)
    check(outcome, 0, ["node h01", "node h04"], stream="out")


PATTERNS = ["h[0:9]", "h[01:10]", "h[0:10:3]", "h[a:f]", "h[a:Z]", "h[1:3]x[1:2]", "h[5:0]",
            "h[5:0:-1]", "h[0:5:-2]", "h[:4]", "h[1:3][a:b][0:2:2]", "h[1_0:1_2]", "h[ 1: 3]",
            "plain", "h[0:99][0:40]", "n-[a:Z:3]"]


def test_counting_agrees_with_ansibles_expansion():
    """Ansible's own expand_hostname_range, in a process of its own (importing Ansible
    patches the interpreter), on patterns it accepts."""
    code = ("import json, sys\nfrom ansible.plugins.inventory import expand_hostname_range\n"
            "out = {}\nfor p in json.loads(sys.argv[1]):\n"
            "    out[p] = len(expand_hostname_range(p)) if '[' in p else 1\n"
            "print(json.dumps(out))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(PATTERNS)],
                          capture_output=True, text=True, timeout=60, check=True)
    expected = json.loads(proc.stdout)
    assert {p: range_size(p, 10**9) for p in PATTERNS} == expected
    assert range_size("h[0:999999999999]", MAX_NODES) > MAX_NODES   # counted, not expanded
