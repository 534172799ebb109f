"""The user's own job over SSH on the lab (hosts in network namespaces, each with its sshd): the
project shipped to every host, setup, failure, resume and a command with its own launcher.
One lab for the module: its hosts outlive each test, as real hosts do between runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch_cmd
from tests.job.project import HOSTILE_ARGS, SETUP, command_recipe, results, write_project
from tests.run.timeline_check import check_timeline
from tests.ssh.conftest import only_sshd_left

pytestmark = [pytest.mark.slow, pytest.mark.lab]


@pytest.fixture
def project(tmp_path):
    return write_project(tmp_path / "project")


@pytest.fixture(scope="module")
def same_id_runs(module_lab, tmp_path_factory):
    """One project, three runs under one run id on the lab: the first crashes once, `--resume`
    finishes it, then a new run reuses the id (another runs folder) with a setup command and
    arguments a shell would mangle. The crash test reads all three; the shipping test reads
    the third (one run fewer than a run of its own: ~15 s of CPU on the lab).
    ({"crashed", "resumed", "fresh": CompletedProcess}, the project, what was left running,
    {the same names: the wall clock when each began})."""
    lab, project = module_lab, write_project(tmp_path_factory.mktemp("job") / "project")
    env = {**os.environ, "LAUNCH_HOME": str(project.parent / "launch-home"),
           "FROM_SHELL": "from the shell", "NOT_PASSED": "launch's own"}
    inventory = str(lab.inventory)

    began: dict[str, float] = {}

    def launch(*args: str) -> subprocess.CompletedProcess:
        began[args[-1] if args[-2:-1] == ("--resume",) else
              "crashed" if "crash-once" in args else "fresh"] = time.time()
        return subprocess.run(launch_cmd(*args), cwd=project, env=env, text=True,
                              capture_output=True, timeout=300, stdin=subprocess.DEVNULL)

    runs = {"crashed": launch("run", "-i", inventory, "--nodes", "2", "main.py", "--run-id",
                              "again", "--", "--mode", "crash-once")}
    runs["resumed"] = launch("run", "-i", inventory, "--resume", "again")
    runs["fresh"] = launch("run", "-i", inventory, "--nodes", "2", "main.py", "--setup", SETUP,
                           "--run-id", "again", "--runs-dir", "other-runs", "--env",
                           "JOB_TOKEN=s3cr3t value", "--env", "FROM_SHELL", "--",
                           *HOSTILE_ARGS)
    return runs, project, only_sshd_left(lab), began


def test_script_ships_with_its_package_and_data_and_runs_setup(lab, same_id_runs):
    """The project shipped without its ignored files (said at the start), setup with the
    node's interpreter first on PATH (~/.bashrc's pyenv shims came first once), --env's values
    on every rank and nothing else of launch's environment."""
    runs, project, left, _ = same_id_runs
    proc = runs["fresh"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("the ignore rules left out 2 file(s) of 20 B and 1 folder(s), not shipped: "
            "scratch.txt (12 B") in proc.stderr
    seen = results(proc.stdout)
    assert sorted(seen) == [0, 1]
    python = lab.python
    for got in seen.values():
        assert got["setup"].endswith(f" python={python} pip={Path(python).parent / 'pip'}")
        assert got["env"]["LAUNCH_PYTHON"] == python
        assert got["env"]["JOB_TOKEN"] == "s3cr3t value"
        assert got["env"]["FROM_SHELL"] == "from the shell" and "NOT_PASSED" not in got["env"]
        assert got["argv"] == HOSTILE_ARGS
        assert got["package"] == "the user's own train package"
        assert got["node_package"] == "the user's own launch_node package"
        assert got["data"] == ["cat", "dog", "bird"]
        assert got["sees"] == ["setup-ran.txt"]
        assert got["cwd"].startswith(str(lab.dir)) and got["cwd"] == got["env"]["LAUNCH_WORKDIR"]
        # Each host runs in a folder of its own for this run, made from the shared copy: it
        # sees neither the other host's snapshot nor the one the earlier run of the same id
        # wrote; the run names the folder.
        folder, node = Path(got["cwd"]), got["env"]["LAUNCH_NODE"]
        assert folder.name == node and folder.parent.name.startswith("again.")
        assert str(folder.parent.parent) == got["env"]["LAUNCH_WORKDIR_COPY"] + ".runs"
        assert got["snapshot"] is None
        assert f"launch: job folder of {node}: {folder}" in proc.stdout + proc.stderr
    # The earlier run's snapshot stayed in its own folders, and its --resume found it there.
    earlier = results(runs["crashed"].stdout)
    assert {r: got["snapshot"] for r, got in results(runs["resumed"].stdout).items()} == \
        {r: f"again {got['env']['LAUNCH_NODE']}" for r, got in earlier.items()}
    for got in earlier.values():
        assert got["cwd"] not in {s["cwd"] for s in seen.values()}
        addrs = got["env"]["LAUNCH_NODE_ADDRS"].split(",")
        assert addrs == [h.rank_address for h in lab.hosts]
        assert got["env"]["LAUNCH_HEAD_ADDR"] == addrs[0]
    # The lab's hosts share one filesystem, so they share the shipped folder: setup ran once.
    logs = [(project / "other-runs" / "again" / h.name / "setup.log").read_text()
            for h in lab.hosts]
    assert sum("launch: setup done" in log for log in logs) == 1
    assert sum("launch: setup skipped" in log for log in logs) == 1
    assert not (project / "pwned").exists()
    assert left == {}


def test_what_the_run_wrote_on_each_host_is_fetched_back(lab, same_id_runs):
    """`launch fetch RUN --workdir` after an attached SSH run: each host's job folder listed
    by the host's own interpreter and copied over SFTP, reached as the run reached it (its
    plan.json: no -i given): the snapshot each host wrote comes back under the host's name,
    the shipped files, setup's output and Python's byte-code cache do not."""
    runs, project, _, _ = same_id_runs
    assert runs["fresh"].returncode == 0
    env = {**os.environ, "LAUNCH_HOME": str(project.parent / "launch-home")}

    def fetch(*extra):
        return subprocess.run(launch_cmd("fetch", "again", "--runs-dir", "other-runs",
                                         "--workdir", *extra),
                              cwd=project, env=env, text=True, capture_output=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    dest = project / "other-runs" / "again" / "workdir"
    dry = fetch("--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "(snapshot.pt)" in dry.stdout and "nothing copied (--dry-run)" in dry.stdout
    assert not dest.exists()
    proc = fetch()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in lab.hosts:
        said = f"{host.name}: 1 file(s), {len('again ' + host.name)} B written by the run in "
        assert said in proc.stdout, proc.stdout
        assert (dest / host.name / "snapshot.pt").read_text() == f"again {host.name}"
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == sorted(
        [h.name for h in lab.hosts] + [f"{h.name}/snapshot.pt" for h in lab.hosts])


def test_a_crash_then_resume_on_the_same_hosts(lab, same_id_runs):
    runs, project, left, began = same_id_runs
    proc = runs["crashed"]
    assert proc.returncode == 1
    # The exception first, though the rank printed 40 lines just before it.
    excerpt = proc.stderr.split(f"last lines of node {lab.hosts[1].name}")[1].splitlines()[1:]
    assert excerpt[0] == f"  {lab.hosts[1].name}/0: [rank1]: Traceback (most recent call last):"
    assert (f"  {lab.hosts[1].name}/0: [rank1]: AssertionError: rank 1 crashes once, at step 3"
            in excerpt)
    proc = runs["resumed"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step 3 in attempt 1" in proc.stdout
    # A new run that reuses the id starts afresh: the earlier run's state is not its own.
    proc = runs["fresh"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step" not in proc.stdout
    # Every second of each accounted for (issue 39), the failed run's in its attempt's folder.
    run = project / "runs" / "again"
    check_timeline(*(run / "attempts").glob("*/summary.json"), began["crashed"])
    check_timeline(run / "summary.json", began["again"])
    check_timeline(project / "other-runs" / "again" / "summary.json", began["fresh"])
    assert left == {}


def test_a_command_with_its_own_torchrun(run_launch, lab, project):
    recipe = command_recipe(project, "cmd", ["--label", "a b"])
    proc = run_launch("run", "-i", str(lab.inventory), str(recipe), "--run-id", "cmd",
                      cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = results(proc.stdout)
    assert sorted(seen) == [0, 1] and all(g["argv"][-2:] == ["--label", "a b"]
                                          for g in seen.values())
    summary = json.loads((project / "runs" / "cmd" / "summary.json").read_text())
    assert summary["job"]["kind"] == "command" and summary["progress"]["step"] == 6
    assert only_sshd_left(lab) == {}


def test_a_command_missing_on_the_hosts_is_named_before_anything_starts(run_launch, lab,
                                                                           project):
    recipe = project / "missing.yml"
    recipe.write_text(yaml.safe_dump({"name": "missing", "nodes": 2, "workdir": ".",
                                      "job": {"command": ["no-such-launcher", "main.py"]}}))
    proc = run_launch("run", "-i", str(lab.inventory), str(recipe), cwd=project, timeout=120)
    assert proc.returncode == 2
    assert "job.command no-such-launcher: not found on the node" in proc.stderr
    assert all(h.name in proc.stderr for h in lab.hosts)
    assert "Traceback" not in proc.stderr
