"""The Slurm batch job as a value: the whole script, the sbatch command line, the settings from
recipe and flags, and the parsers of Slurm's answers. Pure: no Slurm needed."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from launcher.backends.slurm.backend import SlurmBackend, slurm_settings
from launcher.backends.slurm.job import exit_status, follow
from launcher.backends.slurm.sbatch import HEAD_ADDR, NODE, fill, node_facts, shell_word
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


def bench_program(place):
    return [f"{place.code_dir}/launch_bench/bench.py", "--op", "all_reduce", "--out-dir",
            place.run_dir]


def golden_job():
    recipe = recipe_from_mapping(GOLDEN_RECIPE, "/shared/home/ada/golden.yml")
    backend = SlurmBackend({"account": "ml-team", "sbatch_args": ["--constraint=a100&ib"]},
                           cwd="/shared/home/ada")
    return backend.plan(recipe, backend.nodes(2), "golden-1", program=bench_program)


EXPECTED_SCRIPT = r"""#!/bin/bash
# launch run golden-1: recipe golden (/shared/home/ada/golden.yml), 2 node(s) x 8 process(es)
# Submitted by launch: sbatch --parsable --qos=high '--constraint=a100&ib' --job-name=golden-1 --nodes=2 --ntasks-per-node=1 --no-requeue --chdir=/shared/home/ada/runs/golden-1 --output=/shared/home/ada/runs/golden-1/slurm-%j.out --exclusive --partition=gpu --account=ml-team --time=01:00:00 --gpus-per-node=8 /shared/home/ada/runs/golden-1/job.sbatch
# Runs on the allocation's first node, the head: starts the rendezvous store there, then one
# torchrun agent per node (srun), and stops the store when srun ends.
set -u

# One node: its address is the source address of its route to the head, its interface the one
# holding that address (GLOO/NCCL_SOCKET_IFNAME); its files go to the node's own folder, its
# job runs in that folder. $2: the step's attempt (0, then one more per restart); $3: 1 when no
# restart may follow it.
run_node() {
  local node=$SLURMD_NODENAME head_addr=$1 attempt=$2 final=$3 addr iface omp_threads agent
  local code stopped= dir node_rank=$SLURM_NODEID launch_attempt=$(( 0 + $2 ))
  dir=/shared/home/ada/runs/golden-1/"$node"
  mkdir -p "$dir" /shared/home/ada/runs/golden-1/checkpoints && cd "$dir" || exit 1
  exec >>"$dir"/agent.out 2>&1
  addr=$(ip -4 -o route get "$head_addr" | sed -n 's/.* src \([^ ]*\).*/\1/p')
  iface=$(ip -4 -o addr show to "$addr/32" | awk '{sub(/@.*/, "", $2); print $2; exit}')
  if [ -z "$addr" ] || [ -z "$iface" ]; then
    echo "launch: node $node found no address on its route to the head $head_addr (iproute2's ip)"
    finish 1
  fi
  # The node's CPUs in this job, shared by its ranks: one OpenMP thread per CPU, no more.
  omp_threads=$(( ${SLURM_CPUS_ON_NODE:-1} / 8 ))
  [ "$omp_threads" -ge 1 ] || omp_threads=1
  echo "launch: node $node: address $addr, interface $iface, $omp_threads thread(s) per rank"
  PATH=/shared/venv/bin:$PATH; export PATH
  # What the ranks and setup get of this shell's environment (docs/jobs.md): a login's
  # variables, Slurm's, and what --export named; the recipe's env, --env and launch's follow.
  local -a login=()
  for name in $(compgen -e); do
    case $name in
      PATH|HOME|USER|LOGNAME|SHELL|LANG|LANGUAGE|TZ|TMPDIR|TERM|LC_*|SLURM*|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES|ZE_AFFINITY_MASK) login+=("$name=${!name}") ;;
    esac
  done
  # Slurm stops a job by signalling its processes: this shell waits for the agent to stop its
  # workers, or Slurm would count the node done while they still run; a node stopped so
  # records -15 (SIGTERM), one that ended by itself its agent's exit code.
  trap 'stopped=1; kill -TERM "$agent" 2>/dev/null' TERM
  env -i ${login[@]+"${login[@]}"} \
    LAUNCH_RUN_ID=golden-1 \
    LAUNCH_NODE="${node}" \
    PYTHONUNBUFFERED=1 \
    LAUNCH_PYTHON=/shared/venv/bin/python \
    NCCL_DEBUG=INFO \
    NCCL_DEBUG_FILE=/shared/home/ada/runs/golden-1/"${node}"/nccl-debug.%h.%p.log \
    GLOO_SOCKET_IFNAME="${iface}" \
    NCCL_SOCKET_IFNAME="${iface}" \
    TORCH_NCCL_TRACE_BUFFER_SIZE=2000 \
    TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/shared/home/ada/runs/golden-1/"${node}"/hang/nccl-trace.rank \
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/shared/home/ada/runs/golden-1/"${node}"/hang/nccl-trace.rank \
    LAUNCH_CHECKPOINT_DIR=/shared/home/ada/runs/golden-1/checkpoints \
    OMP_NUM_THREADS="${omp_threads}" \
    'NOTE=it'"'"'s $(here)' \
    LAUNCH_NODE_RANK="${node_rank}" \
    LAUNCH_NUM_NODES=2 \
    LAUNCH_NODE_ADDRS="${node_addrs}" \
    LAUNCH_HEAD_ADDR="${head_addr}" \
    LAUNCH_RDZV_PORT=29400 \
    LAUNCH_GPUS_PER_NODE=8 \
    LAUNCH_ATTEMPT="${launch_attempt}" \
    /shared/venv/bin/python -m torch.distributed.run \
    --nnodes 2 \
    --nproc-per-node 8 \
    --rdzv-backend c10d \
    --rdzv-endpoint "${head_addr}":29400 \
    --rdzv-id golden-1 \
    --rdzv-conf is_host=0,join_timeout=300 \
    --local-addr "${addr}" \
    --max-restarts 0 \
    --tee 3 \
    --log-dir /shared/home/ada/runs/golden-1/"${node}"/torchrun \
    /shared/home/ada/runs/golden-1/code/launch_bench/bench.py \
    --op all_reduce \
    --out-dir /shared/home/ada/runs/golden-1/"${node}" &
  agent=$!
  while :; do
    wait "$agent"
    code=$?
    kill -0 "$agent" 2>/dev/null || break
  done
  [ -z "$stopped" ] || code=-15
  finish "$code"
}
# The node's end: its exit_code, which launch follows; a step that may be restarted writes the
# attempt's own (exit_code.<attempt>) and the batch script decides which one ends the run.
finish() {
  if [ "$final" = 1 ]; then echo "$1" >"$dir"/exit_code; else echo "$1" >"$dir"/exit_code.$attempt; fi
  exit "$1"
}
export -f run_node finish

head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# NodeAddr may be a name: the store and the agents want the address.
node_address() {
  local addr
  addr=$(scontrol show node -o "$1" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
  getent ahostsv4 "$addr" | awk 'NR == 1 {print $1}'
}
head_addr=$(node_address "$head")
if [ -z "$head_addr" ]; then
  echo "launch: no IPv4 address for the head node $head (its NodeAddr in scontrol show node)"
  exit 1
fi
# Every node's address, head first (LAUNCH_NODE_ADDRS).
node_addrs=
for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  node_addrs=${node_addrs:+$node_addrs,}$(node_address "$name")
done
export node_addrs
echo "launch: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, head $head ($head_addr)"

restarts=0
attempt=0
while :; do
  final=$(( attempt >= restarts ? 1 : 0 ))
  # The rendezvous store, a process of its own on the head: no agent's exit can take the
  # rendezvous down with it. A fresh one each attempt: the last one's rendezvous is closed.
  mkdir -p /shared/home/ada/runs/golden-1/"$head" || exit 1
  (
    node=$head
    cd /shared/home/ada/runs/golden-1/"$node" || exit 1
    exec env \
      LAUNCH_RUN_ID=golden-1 \
      LAUNCH_NODE="${node}" \
      PYTHONUNBUFFERED=1 \
      /shared/venv/bin/python \
      /shared/home/ada/runs/golden-1/code/launch_node/rdzv_store.py \
      --host "${head_addr}" \
      --port 29400
  ) >>/shared/home/ada/runs/golden-1/"$head"/store.out 2>&1 &
  store=$!
  srun --export=ALL --kill-on-bad-exit=1 --nodes=2 --ntasks=2 \
    --ntasks-per-node=1 bash -c 'run_node "$@"' run_node "$head_addr" "$attempt" "$final" &
  agents=$!
  # Whichever ends first: srun (the step is over) or the store (the step cannot go on).
  wait -n
  if kill -0 "$agents" 2>/dev/null; then
    wait "$store"
    code=$?
    [ "$final" = 1 ] && echo "$code" >/shared/home/ada/runs/golden-1/"$head"/store_exit_code
    echo "launch: the rendezvous store on $head exited with code $code; stopping the nodes"
    kill -TERM "$agents"
    wait "$agents"
    status=1
  else
    wait "$agents"
    status=$?
    kill -TERM "$store" 2>/dev/null
    wait "$store"
  fi
  if [ "$status" -eq 0 ] || [ "$final" = 1 ]; then
    break
  fi
  attempt=$(( attempt + 1 ))
  echo "launch: the step ended with exit code $status; starting every node again (restart $attempt of $restarts)"
done
# A step that could have been restarted left exit_code.<attempt>: the run ends with it.
if [ "$final" != 1 ]; then
  for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    if [ -f /shared/home/ada/runs/golden-1/"$name"/exit_code.$attempt ]; then
      cp /shared/home/ada/runs/golden-1/"$name"/exit_code.$attempt /shared/home/ada/runs/golden-1/"$name"/exit_code
    fi
  done
fi
exit "$status"
"""


def test_the_whole_batch_script():
    assert golden_job().script() == EXPECTED_SCRIPT


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


def test_plan_once_placed_names_the_allocated_nodes():
    job = golden_job()
    plan = job.run_plan([("gpu-st-1", "10.1.0.5"), ("gpu-st-2", "10.1.0.6")],
                        {"gpu-st-2": {"addr": "10.1.0.6", "iface": "ens5", "omp_threads": "12"}})
    assert plan.rdzv_endpoint == "10.1.0.5:29400"
    head, other = plan.nodes
    assert (head.name, head.is_head, other.name, other.is_head) == \
        ("gpu-st-1", True, "gpu-st-2", False)
    assert other.argv[other.argv.index("--local-addr") + 1] == "10.1.0.6"
    assert other.argv[other.argv.index("--rdzv-endpoint") + 1] == "10.1.0.5:29400"
    assert other.env["GLOO_SOCKET_IFNAME"] == "ens5" and other.env["OMP_NUM_THREADS"] == "12"
    assert other.env["LAUNCH_NODE"] == "gpu-st-2"
    assert other.cwd == "/shared/home/ada/runs/golden-1/gpu-st-2"
    # What the head did not report stays as the script names it.
    assert head.env["GLOO_SOCKET_IFNAME"] == "${iface}"
    assert plan.store.name == "gpu-st-1"
    assert plan.store.argv[-4:] == ("--host", "10.1.0.5", "--port", "29400")


def test_dry_run_json_names_the_markers_as_shell_variables():
    doc = golden_job().to_json()
    assert doc["backend"] == "slurm" and doc["world_size"] == 16
    assert doc["rendezvous"]["endpoint"] == "${head_addr}:29400"
    assert doc["node"]["env"]["GLOO_SOCKET_IFNAME"] == "${iface}"
    assert doc["sbatch"]["argv"][-1] == "/shared/home/ada/runs/golden-1/job.sbatch"
    assert doc["script"] == EXPECTED_SCRIPT


@pytest.mark.parametrize("value", ["$(touch canary)", "a; rm -rf ~", "`touch canary`",
                                   "x' \"y\" && touch canary", "new\nline"])
def test_shell_word_keeps_any_value_one_word(value):
    assert shlex.split(shell_word(value)) == [value]
    # ... also in bash itself, the shell the job runs.
    out = subprocess.run(["bash", "-c", f"printf '%s' {shell_word(value)}"], text=True,
                         capture_output=True, cwd="/tmp")
    assert out.stdout == value


def test_markers_become_the_script_variables():
    assert shell_word(f"{HEAD_ADDR}:29500") == '"${head_addr}":29500'
    assert shell_word(f"/runs/a b/{NODE}/x") == "'/runs/a b/'\"${node}\"/x"
    assert fill(f"{HEAD_ADDR}:29500", {"head_addr": "10.0.0.1"}) == "10.0.0.1:29500"
    out = subprocess.run(["bash", "-c", f"node=n1; printf '%s' {shell_word(f'/r/{NODE}/x')}"],
                         text=True, capture_output=True)
    assert out.stdout == "/r/n1/x"


def test_node_facts_line():
    assert node_facts("launch: node gpu-st-2: address 10.1.0.6, interface ens5, 12 thread(s) "
                      "per rank\n") == {"addr": "10.1.0.6", "iface": "ens5", "omp_threads": "12"}
    assert node_facts("[default0]:rank 0/2") is None


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


def test_exit_status():
    assert (exit_status("0:0"), exit_status("1:0"), exit_status("0:15")) == (0, 1, -15)


def test_follow_reads_a_growing_file_to_the_end(tmp_path):
    path = tmp_path / "agent.out"
    path.write_text("one\ntw")
    done = {"now": False}
    lines = follow(path, lambda: done["now"], poll=0.01)
    assert next(lines) == "one"
    with open(path, "a") as f:
        f.write("o\nthree")
    assert next(lines) == "two"
    done["now"] = True
    assert list(lines) == ["three"]   # the last, unterminated line too


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
    assert "srun --export=ALL --kill-on-bad-exit=1 --nodes=2" in out
    assert not calls.exists(), calls.read_text()
    assert not (tmp_path / "runs").exists()
    doc = json.loads(run_launch("run", "vit-tiny-local", "--slurm", "--dry-run", "--json",
                                "--run-id", "dry", env=env, check=True).stdout)
    assert doc["backend"] == "slurm" and doc["nnodes"] == 2
    assert doc["script"].startswith("#!/bin/bash\n")
    assert not calls.exists()


HOSTILE = ["$(touch {canary})", "a; rm -rf ~", "`touch {canary}`", "x' \"y\" && touch {canary}"]


@pytest.mark.parametrize("template", HOSTILE)
def test_dry_run_script_keeps_hostile_values_literal(run_launch, tmp_path, template):
    """tests/run/test_injection.py, for the batch script: run the node's command line from the
    script through bash, with `env` printing what the program would receive."""
    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    recipe = write_recipe(tmp_path, train={"dataset": value}, env={"NOTE": value})
    doc = json.loads(run_launch("run", str(recipe), "--slurm", "--dry-run", "--json",
                                check=True).stdout)
    argv = doc["node"]["argv"]
    assert argv[argv.index("--dataset") + 1] == value and doc["node"]["env"]["NOTE"] == value
    script = doc["script"]
    start = script.index("  env -i ")
    command = script[start:script.index(" &\n", start)]
    # The same words, handed to a program that prints its arguments instead of torchrun.
    probe = command
    printer = tmp_path / "printargs"
    printer.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n"
                       "printf 'NOTE=%s\\0' \"$NOTE\"\n")
    printer.chmod(0o755)
    # The program, not the same word in a value (LAUNCH_PYTHON names the interpreter too).
    probe = probe.replace(f"    {doc['node']['argv'][0]} -m", f"    {printer} -m", 1)
    out = subprocess.run(["bash", "-c", f"node=n0 iface=eth0 addr=10.0.0.2 head_addr=10.0.0.1 "
                                        f"omp_threads=1 login=()\n{probe}"],
                         capture_output=True, cwd=tmp_path)
    words = out.stdout.split(b"\0")
    assert value.encode() in words and f"NOTE={value}".encode() in words
    assert words[words.index(b"--dataset") + 1] == value.encode()
    assert not canary.exists()
    assert not Path(tmp_path / "runs").exists()


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


def test_env_values_are_in_the_job_and_masked_where_shown():
    """`--env` values: in the script the job runs (its ranks read them there), masked in what
    --dry-run prints and plan.json keeps; the ranks start from the login variables only
    (env -i with run_node's `login`)."""
    recipe = recipe_from_mapping(GOLDEN_RECIPE, "/shared/home/ada/golden.yml")
    recipe = recipe.model_copy(update={"env": {**recipe.env, "WANDB_API_KEY": "k3y"},
                                       "command_line_env": ("WANDB_API_KEY",)})
    backend = SlurmBackend({"sbatch_args": ["--export=ALL,MODULE_HOME=/opt/m"]},
                           cwd="/shared/home/ada")
    job = backend.plan(recipe, backend.nodes(2), "golden-1", program=bench_program)
    assert "    WANDB_API_KEY=k3y \\\n" in job.script()
    assert "k3y" not in job.render() and "k3y" not in json.dumps(job.to_json())
    assert "'WANDB_API_KEY=<--env value, 3 characters>'" in job.render()
    assert "|MODULE_HOME) login+=" in job.script()
    plan = job.run_plan([("n1", "10.0.0.1"), ("n2", "10.0.0.2")])
    assert "k3y" not in json.dumps(plan.to_json())
    assert plan.nodes[0].env["WANDB_API_KEY"] == "k3y"
