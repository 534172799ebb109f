"""One grammar for every command, checked by walking the argparse tree (launcher/cli.py):

- every command that changes anything has --dry-run, and with it changes nothing;
- every command that takes -i also takes --cluster NAME, and both name the same hosts;
- --debug adds the traceback and changes nothing else (the message, the exit code).

Each rule is checked for every command the parser has, so a new command cannot forget one:
its case must be added to the tables below or the walk fails, naming it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from launcher.cli import build_parser, main
from launcher.core import bundled
from tests.aws.conftest import moto_url  # noqa: F401 (a fixture: AWS as moto's server)

# Commands that change nothing anywhere, and why; every other command needs --dry-run.
READ_ONLY = {
    ("recipes",): "lists the bundled recipes",
    ("inspect",): "parses the files it is given",
    ("catalog",): "reads the catalog (and EC2's describe calls with --region)",
    ("status",): "reads the ledgers (and EC2's describe calls)",
    ("compare",): "reads run folders; --html writes only the page it is told to write",
    ("attach",): "follows a run's console; Ctrl-C only detaches",
    ("logs",): "prints a run's node logs",
}

RECIPE = "vit-tiny-local"


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for every command that runs (`lab up`, not `lab`)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from leaves(child, path + (name,))


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


COMMANDS = dict(leaves(build_parser()))


@pytest.fixture
def place(tmp_path, monkeypatch, moto_url):
    """An empty folder to run in, with its own LAUNCH_HOME holding one cluster `c1` (the
    bundled example inventory, and a ledger for it), one abandoned run, one finished run and
    one lab; AWS is moto's server, whatever the caller's AWS settings."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.chdir(work)
    cluster = home / "clusters" / "c1"
    cluster.mkdir(parents=True)
    shutil.copy(bundled.example_inventory(), cluster / "inventory.yml")
    from launcher.provision.ledger import Ledger

    ledger = Ledger.open("c1", "us-east-1")
    ledger.update(status="ready", inventory=str(cluster / "inventory.yml"),
                  expires_at="2025-06-02T12:00:00Z", instance_type="p4d.24xlarge")
    old = work / "runs" / "old"
    old.mkdir(parents=True)
    (old / "launch.json").write_text(json.dumps({"run_id": "old", "pid": 2**22 + 7,
                                                 "stamp": "no-such-stamp"}))
    lab = work / "lab"
    lab.mkdir()
    (lab / "lab.json").write_text(json.dumps({
        "directory": str(lab), "lab_id": "zz00", "subnet": "10.250.250.0/24",
        "bridge": "labzz00br", "hosts": [{"name": "host0", "netns": "labzz00h0",
                                          "address": "10.250.250.10", "veth": "labzz00v0"}]}))
    (work / "runs" / "done").mkdir()
    (work / "runs" / "done" / "plan.json").write_text(json.dumps(
        {"run_id": "done", "world_size": 1, "nodes": [{"name": "node0", "argv": []}]}))
    return work, home, cluster / "inventory.yml"


@pytest.fixture
def ubuntu_ami(place):
    """An Ubuntu image of moto's catalogue (moto serves no Canonical SSM parameters)."""
    import boto3

    images = boto3.client("ec2").describe_images(
        Filters=[{"Name": "name", "Values": ["ubuntu/images/*"]}])["Images"]
    return sorted(i["ImageId"] for i in images)[0]


# --dry-run of every command that has one: arguments that would act for real.
DRY_RUNS = {
    ("run",): ["run", RECIPE, "--local", "--run-id", "r1"],
    ("init",): ["init", "proj"],
    ("lab", "up"): ["lab", "up", "--hosts", "2", "--dir", "newlab", "--cap", "20mbit"],
    ("lab", "down"): ["lab", "down", "--dir", "lab"],
    ("bench",): ["bench", "--local", "--max-bytes", "1M", "--run-id", "b1"],
    ("topo",): ["topo", "--local"],
    ("check",): ["check", "--local", "--collective"],
    ("report",): ["report", "runs/done"],
    ("provision",): ["provision", "--instance", "g6e.xlarge", "--cluster", "p1", "--ami",
                     "{ami}"],
    ("setup",): ["setup", "--cluster", "c1"],
    ("teardown",): ["teardown", "--cluster", "c1"],
    ("extend",): ["extend", "--cluster", "c1", "--ttl", "4h"],
    ("runs",): ["runs", "--stop", "old"],
    ("stop",): ["stop", "old"],
    ("fetch",): ["fetch", "old"],
}

# Commands whose -i and --cluster are two ways to name the hosts: the same plan either way.
WHERE = {
    ("run",): ["run", RECIPE, "--run-id", "r1"],
    ("bench",): ["bench", "--run-id", "b1", "--max-bytes", "1M"],
    ("topo",): ["topo"],
    ("check",): ["check"],
    ("setup",): ["setup"],
    ("stop",): ["stop", "elsewhere"],
    ("fetch",): ["fetch", "elsewhere"],
}
# -i beside a --cluster the command needs anyway: the inventory of that cluster's nodes.
CLUSTER_REQUIRED = {("extend",)}
# Read-only commands that find a detached run where -i / --cluster say it runs (they connect
# to its controller host: no dry run to compare; `stop` and `fetch` above locate it the same).
WHERE_READ_ONLY = {("attach",), ("logs",)}

# A mistake each command reports as an error (exit 2), for the --debug rule.
MISTAKES = {
    ("run",): ["run", "no-such-recipe", "--local", "--dry-run"],
    ("runs",): ["runs", "--stop", "no-such-run"],
    ("init",): ["init", "x", "--recipe", "no-such-recipe"],
    ("lab", "up"): ["lab", "up", "--slurm", "--cap", "1mbit", "--dir", "x"],
    ("lab", "down"): ["lab", "down", "--dir", "no-such-lab"],
    ("inspect",): ["inspect", "no-such-file.log"],
    ("bench",): ["bench", "--local", "--min-bytes", "lots", "--dry-run"],
    ("topo",): ["topo", "--cluster", "no-such-cluster", "--dry-run"],
    ("check",): ["check", "--cluster", "no-such-cluster", "--dry-run"],
    ("report",): ["report", "no-such-run"],
    ("compare",): ["compare", "no-such-run"],
    ("catalog",): ["catalog", "--offline", "no.such-type"],
    ("provision",): ["provision", "--instance", "g6e.xlarge", "--cluster", "bad/name",
                     "--dry-run"],
    ("setup",): ["setup", "--cluster", "no-such-cluster", "--dry-run"],
    ("teardown",): ["teardown", "--cluster", "bad/name", "--dry-run"],
    ("status",): ["status", "--region", "no-such-region-1", "--json"],
    ("extend",): ["extend", "--cluster", "c1", "--ttl", "0", "--dry-run"],
    ("attach",): ["attach", "no-such-run"],
    ("logs",): ["logs", "no-such-run"],
    ("stop",): ["stop", "no-such-run"],
    ("fetch",): ["fetch", "no-such-run", "--dry-run"],
}
NO_MISTAKE = {("recipes",): "takes no input that can be wrong"}


def test_every_command_is_in_the_tables():
    """A new command must say how it keeps each rule (or the rule cannot apply)."""
    names = set(COMMANDS)
    with_dry_run = {path for path, p in COMMANDS.items() if "--dry-run" in options(p)}
    forgot = names - with_dry_run - set(READ_ONLY)
    assert not forgot, f"commands that change something but have no --dry-run: {forgot}"
    assert not with_dry_run & set(READ_ONLY), "a read-only command needs no --dry-run"
    assert set(DRY_RUNS) == with_dry_run
    takes_i = {path for path, p in COMMANDS.items() if "-i" in options(p)}
    assert set(WHERE) | CLUSTER_REQUIRED | WHERE_READ_ONLY == takes_i
    assert set(MISTAKES) | set(NO_MISTAKE) == names


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_command_taking_i_takes_cluster_and_none_shadows_debug(path):
    flags = options(COMMANDS[path])
    if "-i" in flags:
        assert "--cluster" in flags, f"launch {' '.join(path)} takes -i but not --cluster NAME"
    assert "--debug" not in flags, "--debug is launch's own flag (before the command)"


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                info = path.lstat()
                out[str(path)] = (info.st_size, info.st_mtime_ns)
    return out


@pytest.mark.parametrize("path", sorted(DRY_RUNS), ids=" ".join)
def test_dry_run_changes_nothing(path, place, ubuntu_ami, capsys):
    work, home, _ = place
    before = _snapshot(work, home)
    argv = [arg.format(ami=ubuntu_ami) for arg in DRY_RUNS[path]]
    assert main([*argv, "--dry-run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.strip(), "a dry run says what it would do"
    assert _snapshot(work, home) == before


@pytest.mark.parametrize("path", sorted(WHERE), ids=" ".join)
def test_cluster_names_the_hosts_that_dash_i_names(path, place, capsys):
    _, _, inventory = place
    assert main([*WHERE[path], "-i", str(inventory), "--dry-run"]) == 0
    by_inventory = capsys.readouterr()
    assert main([*WHERE[path], "--cluster", "c1", "--dry-run"]) == 0
    by_cluster = capsys.readouterr()
    assert by_cluster.out == by_inventory.out
    assert "gpu-a" in by_cluster.out   # the example inventory's head


def test_extend_takes_dash_i_for_the_clusters_nodes(place, capsys, tmp_path):
    _, _, inventory = place
    other = tmp_path / "other.yml"
    data = yaml.safe_load(inventory.read_text())
    text = yaml.safe_dump(data).replace("gpu-a", "gpu-x")
    other.write_text(text)
    assert main(["extend", "--cluster", "c1", "--ttl", "4h", "-i", str(other), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gpu-x (" in out and "gpu-a (" not in out


@pytest.mark.parametrize("path", sorted(MISTAKES), ids=" ".join)
def test_debug_adds_the_traceback_and_changes_nothing_else(path, place, capsys):
    plain = main(MISTAKES[path])
    quiet = capsys.readouterr()
    assert plain == 2, quiet.err
    assert quiet.err.startswith("launch: error: ") and "Traceback" not in quiet.err
    assert main(["--debug", *MISTAKES[path]]) == plain
    loud = capsys.readouterr()
    assert "Traceback (most recent call last)" in loud.err
    # The same message, after the traceback; the same output before it.
    assert loud.err.endswith(quiet.err) and loud.out == quiet.out


def test_arguments_for_the_script_without_dash_dash_are_refused_with_the_hint(capsys):
    """`launch run train.py --epochs 3`: argparse once said only `unrecognized arguments`."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--local", "train.py", "--epochs", "3", "--dry-run"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "launch: error: unrecognized arguments: --epochs 3 (arguments for your script go "
        "after --: launch run ... SCRIPT.py -- --epochs 3)")
