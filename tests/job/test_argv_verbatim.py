"""The job's argv verbatim, whatever it looks like (issue 38, class 1): torchrun's parser reads
every item of its own command line and took an argument that spells, or begins, one of its
options (`--nn`, an ambiguous `--max`) for its own, or ended the run. A script's or module's
arguments now reach the worker entry in LAUNCH_JOB_ARGV, never torchrun's argv.

Table-driven: each case is planned and handed to torchrun's own parser (torch.distributed.run),
which must see launch's worker entry and nothing of the job's; then one real
`launch run --local --nodes 1` per source (the command line, a recipe's `job.args`) runs a
script that prints its sys.argv with every case in one argv: it arrives as given, the run
succeeds, nothing is written outside the case's folder and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from launcher.cluster.inventory import Node
from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import Placement, plan_run
from launcher.job.spec import JOB_ARGV_ENV, job_of
from tests.conftest import launch_cmd
from tests.run.hostile import processes_naming, snapshot

pytestmark = pytest.mark.timeout(300)

# (id, the job's arguments)
CASES = [
    ("torchrun-flag", ["--nnodes", "3"]),
    ("torchrun-flag-equals", ["--rdzv-endpoint=evil:1"]),
    ("unambiguous-prefix", ["--nn", "2"]),
    ("ambiguous-prefix-max", ["--max", "1"]),
    ("ambiguous-prefix-rdzv", ["--rdzv", "x"]),
    ("ambiguous-prefix-n", ["--n"]),
    ("help-short", ["-h"]),
    ("help-long", ["--help"]),
    ("double-dash", ["--"]),
    ("double-dash-then-flag", ["--", "--nnodes", "9"]),
    ("module-flag", ["-m", "os"]),
    ("no-python", ["--no-python"]),
    ("standalone", ["--standalone"]),
    ("empty", [""]),
    ("spaces-and-shell", ["two words", "$(touch pwned)", "a;b"]),
    ("non-ascii", ["caf\u00e9", "\u65e5\u672c"]),
]
ALL_ARGS = [arg for _, args in CASES for arg in args]
SHOW = 'import json, sys\nprint("ARGV " + json.dumps(sys.argv[1:]), flush=True)\n'


def planned(args: list[str], script: str = "show.py"):
    recipe = recipe_from_mapping({"name": "t", "workdir": ".",
                                  "job": {"script": script, "args": args}}, "/p/r.yml", "/p")
    nodes = [Node(name="n0", address="10.0.0.1", private_address="10.0.0.1", gpus=0)]
    place = {"n0": Placement(python="/v/bin/python", code_dir="/c", run_dir="/r/n0",
                             workdir="/w", checkpoint_dir="/r/checkpoints")}
    return plan_run(recipe, nodes, "run", place, job=job_of(recipe)).nodes[0]


@pytest.mark.parametrize("args", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_torchrun_parser_never_sees_the_jobs_arguments(args):
    from torch.distributed.run import get_args_parser

    command = planned(args)
    argv = list(command.argv)
    ours = argv[argv.index("torch.distributed.run") + 1:]
    parsed = get_args_parser().parse_args(ours)   # exits (SystemExit) where it is confused
    assert parsed.training_script == "/c/launch_node/worker.py"
    assert parsed.training_script_args == ["script", "show.py"]
    assert parsed.nnodes == "1" and parsed.max_restarts == 0
    assert json.loads(command.env[JOB_ARGV_ENV]) == args


def test_a_script_named_like_a_flag_is_given_as_a_path():
    from torch.distributed.run import get_args_parser

    argv = list(planned([], script="--max.py").argv)
    parsed = get_args_parser().parse_args(argv[argv.index("torch.distributed.run") + 1:])
    assert parsed.training_script_args == ["script", "./--max.py"]


@pytest.mark.slow   # real torchrun runs: the fast tier keeps the parser-level cases above
@pytest.mark.parametrize("source", ["command-line", "recipe"])
def test_a_real_run_gives_the_script_every_argument_as_written(tmp_path, source):
    project = tmp_path / "a" / "b" / "project"
    project.mkdir(parents=True)
    (project / "show.py").write_text(SHOW)
    if source == "recipe":
        (project / "job.yml").write_text(yaml.safe_dump(
            {"name": "argv", "workdir": ".", "job": {"script": "show.py", "args": ALL_ARGS}}))
        argv = ["run", "job.yml", "--local", "--nodes", "1"]
    else:
        argv = ["run", "show.py", "--local", "--nodes", "1", "--", *ALL_ARGS]
    before = snapshot(tmp_path, skip=project)
    env = {**os.environ, "LAUNCH_HOME": str(project / "home")}
    proc = subprocess.run(launch_cmd(*argv), cwd=project, env=env, text=True,
                          capture_output=True, timeout=240, stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    assert proc.returncode == 0, text[-3000:]
    lines = [line.split("ARGV ", 1)[1] for line in proc.stdout.splitlines() if "ARGV " in line]
    assert len(lines) == 1, text[-3000:]
    got = json.loads(lines[0])
    at = 0
    for case_id, args in CASES:
        assert got[at:at + len(args)] == args, (case_id, got)
        at += len(args)
    assert at == len(got)
    assert snapshot(tmp_path, skip=project) == before
    assert not (project / "pwned").exists()
    assert processes_naming(str(project)) == []
