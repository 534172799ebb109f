"""Names without hidden newlines (issue 25, class 5): Python's `$` matches before a final
newline, so a check written `re.match(r"^...$")` let `lo\\n` reach NCCL_SOCKET_IFNAME. Every
rule of launcher/core/names.py, and every place a user's name enters launch, is walked with
"name\\n" (and the other characters a terminal or a shell line would act on); and no module
defines a `$`-anchored pattern of its own outside the parsers of tools' output lines."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launcher.core.names import RULES, name_problem
from tests.run.hostile import Guard, check, run_cli

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
HIDDEN = ["\n", "\r", "\r\n", "\x00", "\x1b[2J", "\t", "\x85", "\u2028"]


@pytest.mark.parametrize("kind", sorted(RULES))
def test_every_rule_takes_its_example_and_refuses_it_with_a_hidden_character(kind):
    rule = RULES[kind]
    assert name_problem(kind, rule.example) is None
    for hidden in HIDDEN:
        for value in (rule.example + hidden, hidden + rule.example,
                      rule.example[:1] + hidden + rule.example[1:]):
            assert name_problem(kind, value) is not None, (kind, value)
    assert name_problem(kind, "") is not None
    assert name_problem(kind, rule.example[:1] * (rule.max_len + 1)) is not None


def test_digits_of_other_scripts_are_not_digits():
    assert name_problem("Slurm time limit", "04:00:00") is None
    assert name_problem("Slurm time limit", "\u0664:00:00") is not None   # Arabic-Indic four


# ---- every way a name comes in ------------------------------------------------------------

RECIPE = {"name": "t", "train": {"dataset": "digits", "image_size": 8, "patch_size": 4,
                                 "steps": 2}}


def recipe(**changes) -> str:
    data = json.loads(json.dumps(RECIPE))
    data.update(changes)
    return yaml.safe_dump(data)


def inventory(host: str = "h0", **hostvars) -> str:
    return yaml.safe_dump({"all": {"vars": {"gpus": 0}, "hosts": {
        host: {"ansible_host": "10.9.9.1", **hostvars}}}})


@dataclass
class Case:
    id: str
    argv: list[str]
    says: str | list[str]
    files: dict[str, str]


R = ["run", "recipe.yml", "--dry-run"]
CASES = [
    Case("run-id", [*R, "--run-id", "demo\n"], ["--run-id 'demo\\n'", "control character"],
         {"recipe.yml": recipe()}),
    Case("resume-id", ["run", "--resume", "r1\n", "--dry-run"], "--resume 'r1\\n'", {}),
    Case("runs-stop", ["runs", "--stop", "r1\n"], "--stop r1\\n: no run of that id", {}),
    Case("recipe-name", R, ["recipe.yml: name", "control character"],
         {"recipe.yml": recipe(name="t\n")}),
    Case("env-name", R, ["recipe.yml: env", "'A\\n' is not a valid environment variable"],
         {"recipe.yml": recipe(env={"A\n": "1"})}),
    Case("slurm-partition-flag", [*R, "--slurm", "--partition", "gpu\n"],
         ["--partition: 'gpu\\n' is not a Slurm partition name"], {"recipe.yml": recipe()}),
    Case("slurm-account-flag", [*R, "--slurm", "--account", "acct\n"],
         "--account: 'acct\\n' is not a Slurm account name", {"recipe.yml": recipe()}),
    Case("slurm-time-flag", [*R, "--slurm", "--time", "04:00:00\n"],
         "--time: '04:00:00\\n' is not a Slurm time limit", {"recipe.yml": recipe()}),
    Case("slurm-time-recipe", [*R, "--slurm"], "slurm.time: '01:00:00\\n' is not a Slurm time",
         {"recipe.yml": recipe(slurm={"time": "01:00:00\n"})}),
    Case("slurm-partition-recipe-cr", [*R, "--slurm"], "slurm.partition",
         {"recipe.yml": recipe(slurm={"partition": "gpu\r"})}),
    Case("sbatch-arg", [*R, "--slurm", "--sbatch-arg=--qos=high\n"],
         ["--sbatch-arg", "control character"], {"recipe.yml": recipe()}),
    Case("cluster-for-run", [*R, "--cluster", "demo\n"],
         "--cluster 'demo\\n' cannot be used", {"recipe.yml": recipe()}),
    Case("cluster-for-provision", ["provision", "--instance", "p4d.24xlarge", "--cluster",
                                   "demo\n", "--dry-run"], "cluster name 'demo\\n'", {}),
    Case("cluster-for-extend", ["extend", "--cluster", "demo\n", "--ttl", "1h"],
         "cluster name 'demo\\n'", {}),
    Case("inventory-host", [*R, "-i", "inv.yml"], ["host", "the host name cannot be used"],
         {"recipe.yml": recipe(), "inv.yml": inventory("h0\n")}),
    Case("inventory-interface", [*R, "-i", "inv.yml"],
         ["launch_interface 'lo\\n' is not a network interface name", "control character"],
         {"recipe.yml": recipe(), "inv.yml": inventory(launch_interface="lo\n")}),
    Case("inventory-interface-escape", [*R, "-i", "inv.yml"],
         "launch_interface", {"recipe.yml": recipe(),
                              "inv.yml": inventory(launch_interface="eth0\x1b")}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hidden_newline_is_refused_wherever_a_name_comes_in(case, tmp_path, monkeypatch,
                                                             capsys):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    for name, text in case.files.items():
        (case_dir / name).write_text(text)
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    guard.verify()
    check(outcome, 2, case.says, stream="err")
    assert not (case_dir / "runs").exists()


def test_checkpoint_and_tag_names_are_matched_whole(tmp_path):
    from launcher.provision import ttl
    from launch_node import checkpoint_files as files

    (tmp_path / "step-00000010.json\n").write_text("{}")
    (tmp_path / "step-00000010.pt\n").write_bytes(b"x")
    assert files.complete(tmp_path) == []
    with pytest.raises(ValueError):
        ttl.check_iso("2026-01-01T00:00:00Z\n")
    assert ttl.check_iso("2026-01-01T00:00:00Z") == "2026-01-01T00:00:00Z"


# ---- no other module defines a name pattern of its own --------------------------------------

# Parsers of one line of a tool's output (already split into lines): their `$` meets no
# newline. launcher/cluster/inventory_files.py mirrors Ansible's own file-name pattern, `$` and all.
LINE_PARSERS = ("launcher/nccl/", "launcher/check/", "launcher/execute/forensics.py",
                "launcher/runs/logs.py", "launcher/backends/slurm/backend.py", "launcher/backends/slurm/sbatch.py",
                "launcher/cluster/inventory_files.py", "launcher/report/live.py", "launcher/runs/progress.py")


def _dollar_patterns():
    for base in ("launcher", "launch_node", "launch_bench", "train"):
        for path in sorted((REPO / base).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if "playbooks" in path.parts or rel.startswith(LINE_PARSERS):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    pattern = node.args[0].value
                    if pattern.endswith("$") and not pattern.endswith("\\$"):
                        yield f"{rel}:{node.lineno}: {pattern!r}"


def test_no_module_checks_a_name_with_a_dollar_anchored_pattern():
    found = list(_dollar_patterns())
    assert not found, ("a `$`-anchored pattern lets 'name\\n' through: add the rule to "
                       "launcher/core/names.py (or use fullmatch):\n" + "\n".join(found))
