"""`--recover`, the parts that need no lab: where it is refused, which fleet an inventory
names, and how recoveries reach the run's summary."""

from __future__ import annotations

import json

import pytest

from launcher.job.request import Recover
from launcher.pipeline.recover import RecoveryBook, Replacements, fleet_of
from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError
from tests.run.conftest import write_recipe


def test_recover_is_refused_where_no_machine_can_be_replaced(run_launch, tmp_path):
    recipe = write_recipe(tmp_path)
    proc = run_launch("run", "--local", str(recipe), "--recover")
    assert proc.returncode == 2
    assert "--recover: machine recovery is not available on this backend" in proc.stderr
    assert "the nodes are processes of this machine" in proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = run_launch("run", "--local", str(recipe), "--recover", "0")
    assert proc.returncode == 2 and "number of replacements (1 to 100)" in proc.stderr


def test_an_inventory_names_where_its_machines_come_from(monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "launch-home"))
    plain = [Node("a", "10.0.0.1", "10.0.0.1")]
    with pytest.raises(LauncherError, match="a cluster `launch provision` made"):
        fleet_of(plain)
    unknown = [Node("a", "10.0.0.1", "10.0.0.1", extra={"launch_cluster": "nowhere"})]
    with pytest.raises(LauncherError, match="cluster nowhere has no record here"):
        fleet_of(unknown)


def test_recoveries_are_kept_across_attempts_and_reach_the_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "succeeded"}))
    book = RecoveryBook(tmp_path)
    book.entries.append({"node": "host0", "replacement": "host2"})
    book.save()
    again = RecoveryBook(tmp_path)   # the next attempt reads what the first kept
    assert again.entries == [{"node": "host0", "replacement": "host2"}]
    again.into_summary()
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "status": "succeeded", "recoveries": [{"node": "host0", "replacement": "host2"}]}


def test_a_loss_beyond_the_runs_recoveries_begins_no_replacement(tmp_path):
    """`--recover 1` spent by an earlier attempt: a machine lost now starts no replacement
    while the attempt ends (on EC2 that would be an instance launched for nothing); the run
    stops with the recovery budget's error instead (run_recovering). Nothing is asked of the
    fleet, so none is given."""
    book = RecoveryBook(tmp_path)
    book.entries.append({"node": "host0", "replacement": "host2"})
    replacements = Replacements(None, None, Recover(1, 60), book, "r")
    replacements.begin(Node("host1", "10.0.0.2", "10.0.0.2"), "its instance is terminated")
    assert replacements.why("host1") is None and replacements.first_at() is None
    assert replacements.unused() == [] and len(book.entries) == 1
