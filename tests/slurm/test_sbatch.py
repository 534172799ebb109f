"""The Slurm batch job as a value: the whole script, the sbatch command line, the settings from
recipe and flags, and the parsers of Slurm's answers. Pure: no Slurm needed."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.backends.slurm.backend import SlurmBackend, slurm_settings
from launcher.backends.slurm.sbatch import shell_word
from launcher.backends.slurm.steps import parse_facts
from launcher.runs.console import follow_file
from launcher.backends.slurm.slurmctl import gres_gpus, node_usable, parse_job, parse_sinfo
from launcher.core.errors import LauncherError, RecipeError
from launcher.job.recipe import recipe_from_mapping
from tests.run.conftest import write_recipe

GOLDEN_RECIPE = {
    "name": "golden", "nodes": 2, "rendezvous": {"port": 29400, "timeout": 300},
    "env": {"NOTE": "it's $(here)"}, "train": {"steps": 1},
    "slurm": {"partition": "gpu", "time": "01:00:00", "python": "/shared/venv/bin/python",
              "gpus_per_node": 8, "sbatch_args": ["--qos=high"]},
}


def golden_job():
    from launcher.job.request import RunRequest
    from launcher.job.spec import workload

    recipe = recipe_from_mapping(GOLDEN_RECIPE, "/shared/home/ada/golden.yml")
    backend = SlurmBackend({"account": "ml-team", "sbatch_args": ["--constraint=a100&ib"]},
                           cwd="/shared/home/ada")
    request = RunRequest(recipe, "golden-1", 2,
                         job=workload("launch_bench/bench.py", "--op", "all_reduce"))
    return backend.plan(request, backend.nodes(2))


EXPECTED_SCRIPT = r"""#!/bin/bash
# launch run golden-1: recipe golden (/shared/home/ada/golden.yml), 2 node(s)
# Submitted by launch: sbatch --parsable --qos=high '--constraint=a100&ib' --job-name=golden-1 --nodes=2 --ntasks-per-node=1 --no-requeue --chdir=/shared/home/ada/runs/golden-1 --output=/shared/home/ada/runs/golden-1/slurm-%j.out --exclusive --partition=gpu --account=ml-team --time=01:00:00 --gpus-per-node=8 /shared/home/ada/runs/golden-1/job.sbatch
# The run's pipeline (launch itself, from the run's own copy of it in code/) on the
# allocation's first node: it starts every node's processes as job steps (srun), restarts
# them, watches for hangs and writes the run's summary and report; its console is
# console.jsonl here (`launch attach golden-1`).
PYTHONPATH=/shared/home/ada/runs/golden-1/code${PYTHONPATH:+:$PYTHONPATH} exec {python} -m launcher.commands.controller /shared/home/ada/runs/golden-1
"""


def expected_script() -> str:
    # launch's own interpreter runs the controller (on the shared filesystem, as launch is).
    return EXPECTED_SCRIPT.replace("{python}", shlex.quote(sys.executable))


def test_the_whole_batch_script():
    """Bash keeps only what sbatch needs: the run's policy (restarts, the hang watch) is the
    pipeline's Python, the same as every backend's."""
    assert golden_job().script() == expected_script()


def test_sbatch_command_line_recipe_and_flags():
    # The recipe's partition, time, GPUs and qos; the flags' account and constraint, added
    # after the recipe's sbatch arguments (sbatch takes the last of a repeated option).
    assert golden_job().sbatch_argv() == [
        "sbatch", "--parsable", "--qos=high", "--constraint=a100&ib", "--job-name=golden-1",
        "--nodes=2", "--ntasks-per-node=1", "--no-requeue",
        "--chdir=/shared/home/ada/runs/golden-1",
        "--output=/shared/home/ada/runs/golden-1/slurm-%j.out", "--exclusive",
        "--partition=gpu", "--account=ml-team", "--time=01:00:00", "--gpus-per-node=8",
        "/shared/home/ada/runs/golden-1/job.sbatch"]


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n"], input=golden_job().script(), text=True,
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_the_plan_in_the_job_names_the_allocated_nodes():
    """Inside the job the same backend plans with the allocation's nodes and what each node
    said of itself."""
    from launcher.cluster.inventory import Node
    from launcher.job.request import RunRequest

    recipe = recipe_from_mapping(GOLDEN_RECIPE, "/shared/home/ada/golden.yml")
    backend = SlurmBackend({}, cwd="/shared/home/ada", allocation=True)
    backend.facts = {"gpu-st-1": {"cpus": 96}, "gpu-st-2": {"cpus": 96}}
    nodes = [Node("gpu-st-1", "10.1.0.5", "10.1.0.5", gpus=8, interface="ens5"),
             Node("gpu-st-2", "10.1.0.6", "10.1.0.6", gpus=8, interface="ens5")]
    plan = backend.run_plan(RunRequest(recipe, "golden-1", 2), nodes)
    assert plan.rdzv_endpoint == "10.1.0.5:29400"
    head, other = plan.nodes
    assert (head.name, head.is_head, other.name, other.is_head) == \
        ("gpu-st-1", True, "gpu-st-2", False)
    assert other.argv[other.argv.index("--local-addr") + 1] == "10.1.0.6"
    assert other.argv[other.argv.index("--rdzv-endpoint") + 1] == "10.1.0.5:29400"
    assert other.env["GLOO_SOCKET_IFNAME"] == "ens5" and other.env["OMP_NUM_THREADS"] == "12"
    assert other.env["LAUNCH_NODE"] == "gpu-st-2" and other.env["LAUNCH_NODE_RANK"] == "1"
    assert other.run_dir == "/shared/home/ada/runs/golden-1/gpu-st-2"
    assert plan.store.name == "gpu-st-1"
    assert plan.store.argv[-4:] == ("--host", "10.1.0.5", "--port", "29400")


def test_dry_run_json_has_the_job_and_what_its_pipeline_starts():
    doc = golden_job().to_json()
    assert doc["backend"] == "slurm" and doc["nnodes"] == 2
    assert doc["sbatch"]["argv"][-1] == "/shared/home/ada/runs/golden-1/job.sbatch"
    assert doc["script"] == expected_script()
    plan = doc["plan"]
    assert plan["world_size"] == 16 and [n["name"] for n in plan["nodes"]] == \
        ["allocated0", "allocated1"]
    assert plan["nodes"][0]["argv"][-4:] == ["--op", "all_reduce", "--out-dir",
                                              "/shared/home/ada/runs/golden-1/allocated0"]


@pytest.mark.parametrize("value", ["$(touch canary)", "a; rm -rf ~", "`touch canary`",
                                   "x' \"y\" && touch canary", "new\nline", ""])
def test_shell_word_keeps_any_value_one_word(value):
    assert shlex.split(shell_word(value)) == [value]
    # ... also in bash itself, the shell the job runs.
    out = subprocess.run(["bash", "-c", f"printf '%s' {shell_word(value)}"], text=True,
                         capture_output=True, cwd="/tmp")
    assert out.stdout == value


def test_node_facts_line():
    lines = ("@launch-facts gpu-st-2 10.1.0.6 ens5 12 8\nnoise\n"
             "@launch-facts gpu-st-1 10.1.0.5 ens5 12 8\n")
    assert parse_facts(lines) == {
        "gpu-st-2": {"addr": "10.1.0.6", "iface": "ens5", "cpus": 12, "gpus": 8},
        "gpu-st-1": {"addr": "10.1.0.5", "iface": "ens5", "cpus": 12, "gpus": 8}}
    assert parse_facts("[default0]:rank 0/2") == {}


# ---- settings: recipe block and flags -----------------------------------------------------

def test_flags_win_over_the_recipe_block():
    recipe = recipe_from_mapping(GOLDEN_RECIPE, "r.yml")
    s = slurm_settings(recipe.slurm, {"partition": "debug", "time": None, "sbatch_args": None,
                                      "python": "python3.11"})
    assert (s.partition, s.time, s.python, s.gpus_per_node) == \
        ("debug", "01:00:00", "python3.11", 8)


@pytest.mark.parametrize("flags, message", [
    ({"time": "10h"}, "--time: '10h' is not a Slurm time limit"),
    ({"partition": "gpu;reboot"}, "--partition: 'gpu;reboot' is not a Slurm partition name"),
    ({"sbatch_args": ["--nodes=3"]}, "--sbatch-arg: --nodes is set by launch"),
    ({"sbatch_args": ["-N3"]}, "--sbatch-arg: -N3 (sbatch reads --nodes) is set by launch"),
    ({"sbatch_args": ["--qos", "high", "x"]}, "--sbatch-arg: 'x' is not an sbatch option"),
    ({"sbatch_args": ["--output=/tmp/x"]}, "--sbatch-arg: --output is set by launch"),
])
def test_bad_flags_name_the_flag(flags, message):
    with pytest.raises(LauncherError, match=re.escape(message)):
        SlurmBackend(flags)


def test_bad_recipe_block_names_the_key(tmp_path):
    path = write_recipe(tmp_path, slurm={"sbatch_args": ["--ntasks=4"]})
    from launcher.job.recipe import load_recipe

    with pytest.raises(RecipeError, match=r"slurm.sbatch_args: --ntasks is set by launch"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"slurm.time: '1 day' is not a Slurm time limit"):
        load_recipe(write_recipe(tmp_path, name="t.yml", slurm={"time": "1 day"}))
    good = load_recipe(write_recipe(tmp_path, name="good.yml",
                                    slurm={"time": "2-00:00:00", "sbatch_args": ["--qos=high"]}))
    assert good.slurm.time == "2-00:00:00" and good.slurm.exclusive is True


def test_time_forms_sbatch_takes():
    for ok in ("30", "30:00", "01:30:00", "2-0", "2-12:00", "2-12:00:00", "UNLIMITED"):
        assert slurm_settings(None, {"time": ok}).time == ok
    for bad in ("1h", "01:30:00:00", "-5", ""):
        with pytest.raises(LauncherError):
            slurm_settings(None, {"time": bad})


# ---- Slurm's answers ----------------------------------------------------------------------

# Captured from the Slurm lab (`sinfo --noheader --Node --format=%P|%N|%T|%c|%G|%a`, Slurm
# 22.05.8), then a cluster written by hand with the states sinfo(1) lists.
SINFO_LAB = "lab*|slmd232n0|idle|1|(null)|up\nlab*|slmd232n1|idle|1|(null)|up\n"
SINFO_GPU = """\
gpu*|gpu-st-1|mixed|96|gpu:8(S:0-1)|up
gpu*|gpu-st-2|idle~|96|gpu:8(S:0-1)|up
gpu*|gpu-st-3|drained|96|gpu:8(S:0-1)|up
gpu*|gpu-st-4|idle*|96|gpu:8(S:0-1)|up
gpu*|gpu-st-5|allocated+|96|gpu:8(S:0-1)|up
cpu|cpu-1|down*|64|(null)|up
cpu|cpu-2|idle$|64|(null)|up
maint|cpu-3|idle|64|(null)|down
"""


def test_parse_sinfo_lab():
    parts = parse_sinfo(SINFO_LAB)
    assert list(parts) == ["lab"]
    assert parts["lab"].default and parts["lab"].up
    assert parts["lab"].usable == ["slmd232n0", "slmd232n1"]
    assert parts["lab"].gpus == {"slmd232n0": 0, "slmd232n1": 0}


def test_parse_sinfo_usable_nodes_by_state():
    parts = parse_sinfo(SINFO_GPU)
    assert parts["gpu"].default and not parts["cpu"].default
    # mixed, powered down (boots on demand), allocated with jobs completing: yes;
    # drained, not responding: no.
    assert parts["gpu"].usable == ["gpu-st-1", "gpu-st-2", "gpu-st-5"]
    assert parts["cpu"].usable == []          # down, and in a maintenance reservation
    assert parts["gpu"].gpus["gpu-st-1"] == 8 and parts["gpu"].cpus["gpu-st-1"] == 96
    assert not parts["maint"].up
    assert parts["gpu"].describe() == \
        "gpu (default): 5 node(s): 1 allocated+, 1 drained, 1 idle*, 1 idle~, 1 mixed"


def test_node_states_and_gres():
    assert node_usable("idle") and node_usable("planned") and node_usable("completing")
    assert not node_usable("down") and not node_usable("future") and not node_usable("fail")
    assert gres_gpus("gpu:a100:4(S:0),gpu:h100:4(S:1)") == 8
    assert gres_gpus("gpu:4,nic:1") == 4 and gres_gpus("(null)") == 0


# `scontrol show job --oneliner 1` on the Slurm lab (22.05.8), verbatim.
SCONTROL_JOB = (
    "JobId=1 JobName=t.sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 "
    "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-12-01T02:51:55 "
    "EligibleTime=2026-12-01T02:51:55 AccrueTime=2026-12-01T02:51:55 "
    "StartTime=2026-12-01T02:51:55 EndTime=2026-12-01T02:51:56 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-01T02:51:55 Scheduler=Main Partition=lab "
    "AllocNode:Sid=localhost:12730 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=slmd23dn[0-1] BatchHost=slmd23dn0 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
    "DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/tmp/sj/t.sbatch WorkDir=/tmp/sj StdErr=/tmp/sj/slurm-1.out StdIn=/dev/null "
    "StdOut=/tmp/sj/slurm-1.out Power= \n")


def test_parse_job():
    info = parse_job("1", SCONTROL_JOB)
    assert (info.state, info.exit_code, info.nodelist, info.partition, info.final) == \
        ("COMPLETED", "0:0", "slmd23dn[0-1]", "lab", True)
    assert info.describe() == "job 1 COMPLETED, exit code 0:0"
    pending = parse_job("7", "JobId=7 JobName=x JobState=PENDING Reason=Resources "
                             "NodeList=(null) Partition=gpu\n")
    assert (pending.state, pending.nodelist, pending.running) == ("PENDING", "", False)
    assert pending.describe() == "job 7 PENDING (Resources)"
    assert parse_job("9", "").state == "GONE"


def test_follow_reads_a_growing_file_to_the_end(tmp_path):
    """A detached run's console is followed as it grows; b"" between looks that found
    nothing, and everything written before `done` is read."""
    path = tmp_path / "console.jsonl"
    path.write_bytes(b"one\ntw")
    done = {"now": False}
    chunks = follow_file(path, 0, lambda: done["now"], poll=0.01)
    assert next(chunks) == b"one\ntw"
    assert next(chunks) == b""
    with open(path, "ab") as f:
        f.write(b"o\nthree")
    done["now"] = True
    assert b"".join(chunks) == b"o\nthree"


# ---- the CLI, contacting nothing ------------------------------------------------------------

SLURM_TOOLS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun", "salloc")


@pytest.fixture
def recording_path(tmp_path):
    """A PATH whose Slurm commands only record that they were called."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for tool in SLURM_TOOLS:
        script = bindir / tool
        script.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {calls}\nexit 1\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir, calls


def test_dry_run_prints_script_and_command_and_contacts_nothing(run_launch, tmp_path,
                                                                recording_path):
    bindir, calls = recording_path
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "nope.conf")}
    proc = run_launch("run", "vit-tiny-local", "--slurm", "--nodes", "2", "--dry-run",
                      "--run-id", "dry", "--partition", "gpu", env=env, check=True)
    out = proc.stdout
    assert "submit:\n  sbatch --parsable --job-name=dry --nodes=2" in out
    assert f"{tmp_path}/runs/dry/job.sbatch:\n#!/bin/bash\n" in out
    assert "-m launcher.commands.controller" in out
    assert "node allocated1 (<allocated1's NodeAddr>, worker" in out   # what it starts there
    assert not calls.exists(), calls.read_text()
    assert not (tmp_path / "runs").exists()
    doc = json.loads(run_launch("run", "vit-tiny-local", "--slurm", "--dry-run", "--json",
                                "--run-id", "dry", env=env, check=True).stdout)
    assert doc["backend"] == "slurm" and doc["nnodes"] == 2
    assert doc["script"].startswith("#!/bin/bash\n")
    assert not calls.exists()


HOSTILE = ["$(touch {canary})", "a; rm -rf ~", "`touch {canary}`", "x' \"y\" && touch {canary}"]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_values_reach_the_program_as_one_word(run_launch, tmp_path, template):
    """tests/run/test_injection.py, for the job steps: the node's command as the pipeline in
    the job starts it (launcher/backends/slurm/steps.py: its wrapper, then `env`, then the
    program), run through bash with a program that prints its arguments instead of torchrun."""
    from launcher.backends.slurm.steps import step_argv
    from launcher.job.runplan import NodeCommand

    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    recipe = write_recipe(tmp_path, train={"dataset": value}, env={"NOTE": value})
    doc = json.loads(run_launch("run", str(recipe), "--slurm", "--dry-run", "--json",
                                check=True).stdout)
    assert not Path(tmp_path / "runs").exists()   # the dry run wrote nothing
    node = doc["plan"]["nodes"][1]
    argv = node["argv"]
    assert argv[argv.index("--dataset") + 1] == value and node["env"]["NOTE"] == value
    printer = tmp_path / "printargs"
    printer.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n"
                       "printf 'NOTE=%s\\0' \"$NOTE\"\n")
    printer.chmod(0o755)
    command = NodeCommand(name="n1", address="a", private_address="a", is_head=False, gpus=0,
                          argv=(str(printer), *argv[1:]), env=node["env"],
                          run_dir=str(tmp_path / "n1"), cwd=str(tmp_path))
    out = subprocess.run(step_argv(command, "stamp"), capture_output=True, cwd=tmp_path)
    words = out.stdout.split(b"\0")
    assert value.encode() in words and f"NOTE={value}".encode() in words
    assert words[words.index(b"--dataset") + 1] == value.encode()
    assert not canary.exists()


def test_run_on_all_gives_srun_only_the_sbatch_arguments_srun_takes():
    """`launch check/topo --slurm` run one srun: a recipe's --mail-type (sbatch's only) would
    make it fail, a --constraint must still place it. What srun takes is asked of srun."""
    from launcher.backends.slurm.backend import slurm_settings, srun_argv

    settings = slurm_settings(None, {"sbatch_args": ["--mail-type=END", "--constraint=a100",
                                                     "--qos=high"]})
    argv = srun_argv(settings, 2, ["nvidia-smi"], 30, takes={"constraint", "qos", "nodes"})
    assert "--constraint=a100" in argv and "--qos=high" in argv
    assert not any(a.startswith("--mail-type") for a in argv)
    assert argv[-1] == "nvidia-smi"


def test_env_values_are_masked_where_shown_and_the_steps_keep_only_a_logins_variables(
        tmp_path):
    """`--env` values: in what the pipeline in the job starts, masked in what --dry-run prints;
    a job step starts from the login variables of the step's environment (env -i), Slurm's own
    and the names --export gave."""
    from launcher.backends.slurm.steps import kept_names, step_argv
    from launcher.job.request import RunRequest
    from launcher.job.runplan import NodeCommand

    recipe = recipe_from_mapping(GOLDEN_RECIPE, "/shared/home/ada/golden.yml")
    recipe = recipe.model_copy(update={"env": {**recipe.env, "WANDB_API_KEY": "k3y"},
                                       "command_line_env": ("WANDB_API_KEY",)})
    backend = SlurmBackend({}, cwd="/shared/home/ada")
    job = backend.plan(RunRequest(recipe, "golden-1", 2), backend.nodes(2))
    assert "k3y" not in job.render() and "k3y" not in json.dumps(job.to_json())
    assert "WANDB_API_KEY='<--env value, 3 characters>'" in job.render()
    assert job.plan.nodes[0].env["WANDB_API_KEY"] == "k3y"
    keep = kept_names(["--export=ALL,MODULE_HOME=/opt/m"])
    command = NodeCommand(name="n1", address="a", private_address="a", is_head=False, gpus=0,
                          argv=("sh", "-c", "env | sort"), env={"OWN": "1"},
                          run_dir=str(tmp_path / "n1"), cwd=str(tmp_path))
    out = subprocess.run(step_argv(command, "st", keep=keep), capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "HOME": "/h", "MODULE_HOME": "/opt/m",
                              "SLURM_NODEID": "1", "LEAK": "x", "LC_ALL": "C"})
    names = {line.split("=", 1)[0] for line in out.stdout.splitlines()}
    assert {"PATH", "HOME", "MODULE_HOME", "SLURM_NODEID", "LC_ALL", "OWN",
            "LAUNCH_RUN_STAMP"} <= names
    assert "LEAK" not in names
