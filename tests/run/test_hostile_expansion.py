"""YAML expansion bombs under the alias cap (issue 38, class 6), as a table with round 2's
checks (tests/run/hostile.py). Round 2 capped aliases at 100, but 90 aliases of 9 stand for
9**10 values once anything walks the document (pydantic validating a recipe's typed values,
a message quoting one, Ansible merging host variables). launch's YAML loader
(launcher/core/yamlfile.py) now counts a document's size with its aliases expanded, before
anything constructs it, and refuses it past the plain-text cap, naming the file; recipes,
inventories, group_vars/host_vars and -e @FILE all go through it. The bound in seconds is
the test's timeout (20 s; a case that reached a loader ran for minutes)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from tests.run.hostile import Guard, check, run_cli
from tests.run.test_hostile_input import GOOD_RECIPE

pytestmark = pytest.mark.timeout(20)

SAYS = "more than 100000 values once its aliases (*name) are expanded"


def laughs(levels: int = 10, width: int = 9, indent: str = "") -> tuple[str, str]:
    """Anchors a (width plain values), b (width *a), ... : the YAML lines and the last name;
    (levels - 1) * width aliases, width**levels values."""
    names = [chr(97 + i) for i in range(levels)]
    lines = [f"{indent}{names[0]}: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
    lines += [f"{indent}{c}: &{c} [" + ", ".join([f"*{p}"] * width) + "]"
              for p, c in zip(names, names[1:])]
    return "\n".join(lines) + "\n", names[-1]


def recipe_with(value_yaml: str) -> str:
    """A good recipe with the bomb's anchors under an unused key, and `value_yaml` (lines
    holding *LAST) after it."""
    defs, last = laughs(indent="  ")
    return ("x-defs:\n" + defs + yaml.safe_dump(GOOD_RECIPE)
            + value_yaml.replace("LAST", last))


JOB_RECIPE = {"name": "t", "job": {"script": "run.py"}, "workdir": "."}


def job_recipe_with(value_yaml: str) -> str:
    defs, last = laughs(indent="  ")
    return "x-defs:\n" + defs + yaml.safe_dump(JOB_RECIPE).replace(
        "job:\n", "job:\n" + value_yaml.replace("LAST", last))


def inventory_with(host_vars_yaml: str) -> str:
    defs, last = laughs(indent="    ")
    return ("all:\n  vars:\n" + defs + "  hosts:\n    h0:\n      ansible_host: 10.9.9.1\n"
            + host_vars_yaml.replace("LAST", last))


GOOD_INV = "all:\n  vars: {gpus: 0}\n  hosts:\n    h0: {ansible_host: 10.9.9.1}\n"
HOST_VARS = laughs()[0] + f"gpus: *{laughs()[1]}\n"
R = ["run", "recipe.yml", "--dry-run"]
RI = ["run", "recipe.yml", "-i", "inv.yml", "--dry-run"]


@dataclass
class Case:
    id: str
    argv: list[str]
    files: dict[str, str]
    code: int = 2
    says: str | list[str] = SAYS


CASES = [
    Case("recipe-env-value", R, {"recipe.yml": recipe_with("env: {X: *LAST}\n")},
         says=f"recipe.yml: not valid YAML: {SAYS}"),
    Case("recipe-typed-int", R, {"recipe.yml": recipe_with("nodes: *LAST\n")},
         says=f"recipe.yml: not valid YAML: {SAYS}"),
    Case("recipe-unused-anchor", R, {"recipe.yml": recipe_with("")},
         says=f"recipe.yml: not valid YAML: {SAYS}"),
    Case("recipe-job-args", R, {"recipe.yml": job_recipe_with("  args: *LAST\n"),
                                "run.py": ""}, says=f"recipe.yml: not valid YAML: {SAYS}"),
    Case("recipe-merge-key", R, {"recipe.yml": recipe_with("ddp: {<<: {k: *LAST}}\n")},
         says=f"recipe.yml: not valid YAML: {SAYS}"),
    Case("recipe-holds-itself", R, {"recipe.yml": "x-loop: &l [1, *l]\n"
                                    + yaml.safe_dump(GOOD_RECIPE)},
         says="recipe.yml: not valid YAML: a value holds itself"),
    Case("inventory-host-gpus", RI, {"inv.yml": inventory_with("      gpus: *LAST\n")},
         says=f"inv.yml: not valid YAML: {SAYS}"),
    Case("inventory-extra-var", RI, {"inv.yml": inventory_with("      my_var: {k: *LAST}\n")},
         says=f"inv.yml: not valid YAML: {SAYS}"),
    Case("host-vars-file", RI, {"inv.yml": GOOD_INV, "host_vars/h0.yml": HOST_VARS},
         says=f"host_vars/h0.yml: not valid YAML: {SAYS}"),
    Case("group-vars-file", RI, {"inv.yml": GOOD_INV, "group_vars/all.yml": HOST_VARS},
         says=f"group_vars/all.yml: not valid YAML: {SAYS}"),
    Case("setup-extra-vars-file", ["setup", "-i", "inv.yml", "-e", "@vars.yml",
                                   "--dry-run"],
         {"inv.yml": GOOD_INV, "vars.yml": HOST_VARS}, says=f"vars.yml: not valid YAML: {SAYS}"),
    # Aliases that expand to little are what YAML users write: still accepted.
    Case("small-aliases-accepted", R, {"recipe.yml": yaml.safe_dump(GOOD_RECIPE)
                                       + "env: {A: &one 'same-value', B: *one}\n"},
         code=0, says=["A=same-value", "B=same-value"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_expansion_bombs_are_refused_before_any_loader(tmp_path, monkeypatch, capsys, case):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "recipe.yml").write_text(yaml.safe_dump(GOOD_RECIPE))
    for name, text in case.files.items():
        (case_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (case_dir / name).write_text(text)
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    check(outcome, case.code, case.says)
    guard.verify()
