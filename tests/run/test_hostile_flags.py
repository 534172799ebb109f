"""Flags that do nothing say so (issue 38, class 7), as a table with round 2's checks
(tests/run/hostile.py): exit code, a message naming what is wrong, no traceback, nothing
written or moved outside the case's folder, no process left.

- `--recover` where the inventory names no fleet (a hand-written one): a dry run refuses it
  exactly as the run does, with the run's own check (launcher/pipeline/recover.py
  fleet_source), before anything starts;
- `--recover-timeout` without `--recover`: an error naming both flags;
- a `launch_market` value launch does not know: an error naming the inventory, the host, the
  value and the values allowed (launcher/cluster/inventory.py, where hosts are read)."""

from __future__ import annotations


import pytest
import yaml

from tests.run.hostile import CliCase, Guard, check, run_cli
from tests.run.test_hostile_input import GOOD_INVENTORY, recipe

pytestmark = pytest.mark.timeout(120)


def inventory(host_vars=None, all_vars=None) -> str:
    data = yaml.safe_load(yaml.safe_dump(GOOD_INVENTORY))
    data["all"]["hosts"]["h0"].update(host_vars or {})
    data["all"]["vars"].update(all_vars or {})
    return yaml.safe_dump(data)


def Case(id: str, argv: list[str], code: int, says, files=None) -> CliCase:  # noqa: A002
    return CliCase(id, argv, code, says, files=files or {})


RI = ["run", "recipe.yml", "-i", "inv.yml", "--nodes", "2"]
RL = ["run", "recipe.yml", "--local", "--nodes", "1"]
NO_FLEET = "--recover replaces a lost machine, which launch can do only where it knows where"
BOTH = ["--recover-timeout 600", "it goes with --recover"]
MARKET = "launch_market 'preemptible' is not one of on-demand, spot, capacity-block"

CASES = [
    # --recover: the dry run refuses what the run refuses, and both before anything starts
    # (the hosts 10.9.9.x answer nothing: a run that went on would fail at preflight instead).
    Case("recover-dry-run-hand-written", RI + ["--recover", "--dry-run"], 2, NO_FLEET,
         {"inv.yml": inventory()}),
    Case("recover-run-hand-written", RI + ["--recover"], 2, NO_FLEET, {"inv.yml": inventory()}),
    Case("recover-n-dry-run-hand-written", RI + ["--recover", "3", "--dry-run"], 2, NO_FLEET,
         {"inv.yml": inventory()}),
    Case("recover-dry-run-cluster-inventory", RI + ["--recover", "--dry-run"], 0,
         "10.9.9.1", {"inv.yml": inventory(all_vars={"launch_cluster": "demo"})}),
    Case("recover-dry-run-lab-inventory", RI + ["--recover", "--dry-run",
                                                "--recover-timeout", "600"], 0,
         "10.9.9.1", {"inv.yml": inventory(all_vars={"launch_lab": "demo"})}),
    Case("recover-local", RL + ["--recover", "--dry-run"], 2,
         "--recover: machine recovery is not available on this backend"),
    # --recover-timeout alone would do nothing
    Case("recover-timeout-alone-dry-run", RL + ["--recover-timeout", "600", "--dry-run"], 2,
         BOTH),
    Case("recover-timeout-alone-run", RL + ["--recover-timeout", "600"], 2, BOTH),
    Case("recover-timeout-alone-inventory", RI + ["--recover-timeout=600", "--dry-run"], 2,
         BOTH, {"inv.yml": inventory(all_vars={"launch_cluster": "demo"})}),
    # launch_market: only the values launch acts on
    Case("market-unknown-host", RI + ["--dry-run"], 2, ["inv.yml: host h0: ", MARKET],
         {"inv.yml": inventory({"launch_market": "preemptible"})}),
    Case("market-unknown-all-vars", RI + ["--dry-run"], 2, ["inv.yml: host h0: ", MARKET],
         {"inv.yml": inventory(all_vars={"launch_market": "preemptible"})}),
    Case("market-unknown-run", RI, 2, ["inv.yml: host h0: ", MARKET],
         {"inv.yml": inventory({"launch_market": "preemptible"})}),
    Case("market-case", RI + ["--dry-run"], 2, "launch_market 'Spot' is not one of",
         {"inv.yml": inventory({"launch_market": "Spot"})}),
    Case("market-list", RI + ["--dry-run"], 2, "launch_market ['spot'] is not one of",
         {"inv.yml": inventory({"launch_market": ["spot"]})}),
    Case("market-spot", RI + ["--dry-run"], 0, "LAUNCH_INTERRUPTIBLE",
         {"inv.yml": inventory({"launch_market": "spot"})}),
    Case("market-on-demand", RI + ["--dry-run"], 0, "10.9.9.1",
         {"inv.yml": inventory(all_vars={"launch_market": "on-demand"})}),
    # `launch setup --syntax-check` reads -e as a real setup does (it used to drop it).
    Case("syntax-check-reads-extra-vars", ["setup", "-i", "inv.yml", "--syntax-check", "-e",
                                           "@missing.yml"], 2, "-e @missing.yml:",
         {"inv.yml": inventory()}),
    Case("syntax-check-malformed-extra-var", ["setup", "-i", "inv.yml", "--syntax-check",
                                              "-e", "not a var"], 2,
         "-e 'not a var': expected KEY=VALUE or @FILE", {"inv.yml": inventory()}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_flags_that_do_nothing_say_so(tmp_path, monkeypatch, capsys, case):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "recipe.yml").write_text(recipe())
    for name, text in case.files.items():
        (case_dir / name).write_text(text)
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    check(outcome, case.code, case.says)
    guard.verify()
    if case.code:   # refused before anything starts: no run folder
        assert not (case_dir / "runs").exists()
