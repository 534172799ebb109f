"""The pure parts of running a user's own job, by exact expected values: the recipe's job
section, the Job value and its plan, LAUNCH_STEP lines, stragglers, the hang rule without a
heartbeat, and where blame goes when a rank only lost its peer."""

from __future__ import annotations

import pytest

from launcher.cluster.inventory import Node
from launcher.core.errors import RecipeError
from launcher.execute.recovery import RestartBook
from launcher.execute.supervisor import failure_evidence
from launcher.execute.watch import USER_HANG_FLOOR_S, ActivityClock
from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import Placement, plan_run
from launcher.job.spec import Job, job_of, script_recipe, workdir_folder_name
from launcher.runs.progress import StepLines, parse_step

# Seen here (torch 2.13.0, gloo) when the peer rank of a 2-rank job raised: the survivor's
# error, verbatim (node1's log of tests/job/test_local_job.py's crash).
GLOO_PEER_GONE = ("[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                  "tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:46474. This is "
                  "typically caused by a remote worker crashing. Check the logs of the remote "
                  "worker before reporting an error. GLHF! 🏖️")
# torchrun's agent on a worker that exited by itself (torch/distributed/elastic/.../api.py).
AGENT_FAILED = ("E1201 15:19:10.000000 123 torch/distributed/elastic/multiprocessing/api.py:"
                "882] failed (exitcode: 1) local_rank: 0 (pid: {pid}) of binary: /usr/bin/python")


def recipe(**job):
    return recipe_from_mapping({"name": "mine", "workdir": ".", "job": job}, "/p/recipe.yml",
                               "/p")


# ---- the recipe and the Job ---------------------------------------------------------------

def test_a_recipe_job_becomes_a_job_with_its_workdir_absolute():
    assert job_of(recipe(script="train.py", args=["--lr", 0.001, 3])) == Job(
        "script", "train.py", ("--lr", "0.001", "3"), "/p")
    assert job_of(recipe(module="pkg.train")).describe() == \
        "module pkg.train (python -m) in /p (shipped to every node)"
    command = job_of(recipe(command=["deepspeed", "x.py"], args=["--a"]))
    assert command.args == ("deepspeed", "x.py", "--a") and not command.uses_torchrun


@pytest.mark.parametrize("data, says", [
    ({"name": "x"}, "set exactly one of job"),
    ({"name": "x", "job": {"script": "a.py"}, "train": {"steps": 1}}, "set exactly one of job"),
    ({"name": "x", "job": {"script": "a.py"}}, "is relative to the workdir: set workdir"),
    ({"name": "x", "workdir": ".", "job": {"script": "../a.py"}}, "leaves the workdir"),
    ({"name": "x", "workdir": ".", "job": {"script": "a.py\n"}}, "without control characters"),
    ({"name": "x", "job": {"module": "a b"}}, "is not a Python module name"),
    ({"name": "x", "job": {"module": "pkg\n"}}, "is not a Python module name"),
    ({"name": "x", "job": {"command": []}}, "expected the program and its arguments"),
    ({"name": "x", "job": {"command": ["a"], "args": [True]}}, "is not an argument"),
    ({"name": "x", "job": {"script": "/a.py", "module": "b"}}, "(got script, module)"),
    ({"name": "x", "job": {"command": ["a"]}, "ddp": {}}, "ddp: configures the bundled"),
    ({"name": "x", "job": {"command": ["a"]}, "checkpoint": {"every_steps": 1}},
     "saves into $LAUNCH_CHECKPOINT_DIR"),
    ({"name": "x", "job": {"command": ["a"]}, "setup": [""]}, "each setup command"),
    ({"name": "x", "job": {"comand": ["a"]}}, "did you mean `command`?"),
])
def test_a_job_that_cannot_run_is_refused_naming_the_key(data, says):
    with pytest.raises(RecipeError) as err:
        recipe_from_mapping(data, "r.yml")
    assert says in str(err.value) and str(err.value).startswith("r.yml: ")


def test_pythonpath_may_come_from_a_recipe_and_stays_after_the_workdir():
    r = recipe_from_mapping({"name": "x", "workdir": ".", "job": {"script": "a.py"},
                             "env": {"PYTHONPATH": "src"}}, "/p/r.yml", "/p")
    nodes = [Node(name="n0", address="10.0.0.1", private_address="10.0.0.1", gpus=0)]
    place = {"n0": Placement(python="/v/bin/python", code_dir="/c", run_dir="/r/n0",
                             workdir="/w", checkpoint_dir="/r/checkpoints")}
    command = plan_run(r, nodes, "run", place, uid="u1").nodes[0]
    # The job's own folder for the run and node first (made from the copy /w on the node).
    assert command.job_dir == "/w.runs/run.u1/n0" == command.env["LAUNCH_WORKDIR"]
    assert command.env["PYTHONPATH"] == "/w.runs/run.u1/n0:src" and command.cwd == "/w"
    assert command.env["LAUNCH_WORKDIR_COPY"] == "/w"
    assert command.argv[-3:] == ("/c/launch_node/worker.py", "script", "a.py")


def test_a_command_has_no_torchrun_and_no_store_and_knows_its_nodes():
    r = recipe(command=["deepspeed", "t.py"])
    nodes = [Node(name=f"n{i}", address=f"1.0.0.{i}", private_address=f"10.0.0.{i}", gpus=8)
             for i in range(3)]
    place = {n.name: Placement(python="/v/bin/python", code_dir="/c", run_dir=f"/r/{n.name}",
                               workdir="/w") for n in nodes}
    plan = plan_run(r, nodes, "run", place, rdzv_port=29511)
    assert plan.store is None
    # The command holds its workdir copy while it runs (launch_node/worker.py exec).
    assert [c.argv for c in plan.nodes] == \
        [("/v/bin/python", "-S", "/c/launch_node/worker.py", "exec", "deepspeed", "t.py")] * 3
    env = plan.nodes[2].env
    assert (env["LAUNCH_NODE_RANK"], env["LAUNCH_NUM_NODES"], env["LAUNCH_NODE_ADDRS"],
            env["LAUNCH_HEAD_ADDR"], env["LAUNCH_RDZV_PORT"], env["LAUNCH_GPUS_PER_NODE"]) == \
        ("2", "3", "10.0.0.0,10.0.0.1,10.0.0.2", "10.0.0.0", "29511", "8")


def test_the_command_line_recipe_is_what_init_script_writes():
    assert script_recipe(script="t.py", module=None, args=["--x", "a b"], workdir=".",
                         nproc_per_node=2, setup=["make"]) == {
        "name": "t", "nproc_per_node": 2, "job": {"script": "t.py", "args": ["--x", "a b"]},
        "workdir": ".", "setup": ["make"]}
    assert script_recipe(script=None, module="pkg.train_vit", workdir="src")["name"] == \
        "train_vit"


def test_a_workdir_copy_is_named_by_its_folder_and_its_whole_path():
    a, b = workdir_folder_name("/home/ada/src"), workdir_folder_name("/home/bob/src")
    assert a.startswith("src-") and b.startswith("src-") and a != b
    assert workdir_folder_name("/x/.hidden $dir") .startswith("hidden__dir-")


# ---- LAUNCH_STEP lines and stragglers -------------------------------------------------------

def test_step_lines_are_read_and_others_are_not():
    assert parse_step("LAUNCH_STEP step=12 loss=0.5 busy_s=0.25 samples=64").step == 12
    assert parse_step("LAUNCH_STEP step=3").loss is None
    for other in ("step=3", "LAUNCH_STEP loss=1", "LAUNCH_STEP step=x", "LAUNCH_STEP step=-1",
                  "LAUNCH_STEP step=1 busy_s=nan"):
        assert parse_step(other) is None


def test_a_rank_slower_in_its_own_work_for_three_blocks_is_a_straggler():
    steps = StepLines(clock=lambda: 0.0)
    for step in range(1, 51):
        for node, busy in (("n0", 0.10), ("n1", 0.10), ("n2", 0.20 if step > 10 else 0.10)):
            steps.line(node, "0", f"LAUNCH_STEP step={step} loss=1.0 busy_s={busy}")
    summary = steps.summary()
    assert summary["step"] == 50
    # Blocks of 10 steps (block 1 holds steps 10-19); judged once every rank has left one:
    # blocks 0-4. n2 is slow from step 11: blocks 1 (1.9x), 2, 3, 4 (2x) in a row.
    assert summary["stragglers"] == [{"node": "n2", "local_rank": "0", "ratio": 2.0,
                                      "intervals": 4, "block_steps": 10}]


def test_no_step_line_means_no_progress_is_invented():
    steps = StepLines()
    steps.line("n0", "0", "epoch 1 done")
    assert steps.summary() is None and steps.last_output is not None


# ---- the hang rule without a heartbeat ------------------------------------------------------

def proc(pid, ticks, rank=0, agent=False):
    return {"pid": pid, "cpu_ticks": ticks, "rank": rank, "agent": agent}


def test_silence_without_cpu_is_a_hang_and_cpu_alone_is_progress():
    steps = StepLines(clock=lambda: 0.0)
    clock = ActivityClock(timeout_s=10.0, now=0.0, steps=steps)
    look = lambda t, a, b: clock.observe(  # noqa: E731
        {"n0": {"ticks_per_s": 100, "procs": [proc(1, 0, agent=True), proc(2, a)]},
         "n1": {"ticks_per_s": 100, "procs": [proc(3, b, rank=1)]}}, t)
    look(0.0, 100, 100)
    assert clock.armed
    look(5.0, 100, 300)        # 2 s of CPU in 5 s: computing silently
    assert clock.last_change == 5.0
    look(10.0, 101, 301)       # 0.01 s in 5 s: asleep, or waiting in a collective
    assert not clock.stalled(14.9) and clock.stalled(15.0)


def test_output_is_progress_and_the_default_timeout_is_long_without_steps():
    now = [0.0]
    steps = StepLines(clock=lambda: now[0])
    clock = ActivityClock(timeout_s=None, now=0.0, steps=steps)
    assert clock.threshold() == USER_HANG_FLOOR_S
    now[0] = 7.0
    steps.line("n0", "0", "still loading data")
    clock.observe({}, 8.0)
    assert clock.last_change == 8.0
    for step in range(1, 6):
        now[0] = 10.0 + step * 30
        steps.line("n0", "0", f"LAUNCH_STEP step={step}")
    assert clock.threshold() == 600.0   # 20x the 30 s steps


def test_a_torchrun_job_is_armed_only_once_its_workers_run():
    clock = ActivityClock(timeout_s=5.0, now=0.0, steps=StepLines())
    clock.observe({"n0": {"procs": [proc(1, 0, rank=None, agent=True),
                                    proc(2, 0, rank=None)]}}, 1.0)   # the agent and the store
    assert not clock.armed
    clock.observe({"n0": {"procs": [proc(1, 0, rank=None, agent=True), proc(5, 0, rank=0)]}},
                  2.0)
    assert clock.armed


# ---- blame: a rank that only lost its peer ------------------------------------------------

def test_a_node_whose_rank_only_lost_its_peer_is_not_where_it_began():
    assert failure_evidence(["n0/0: " + GLOO_PEER_GONE]) == -1
    assert failure_evidence(["n1/0: ValueError: user code failed"]) == 0
    assert failure_evidence(["n1/agent:   exitcode  : -9 (pid: 7)", GLOO_PEER_GONE]) == 2
    # gloo aborts a rank whose peer went away (SIGABRT): still a victim.
    assert failure_evidence([GLOO_PEER_GONE, "n0/agent:   exitcode  : -6 (pid: 8)"]) == -1


def test_a_restart_incident_moves_to_the_node_that_did_not_lose_a_peer():
    book = RestartBook(budget=2)
    # The victim's agent reports first; its worker's lines come later (torchrun's tee).
    book.line("n0", "agent", AGENT_FAILED.format(pid=11), 1.0)
    book.line("n1", "agent", AGENT_FAILED.format(pid=12), 1.1)
    assert book.incidents[0].node == "n0"
    book.line("n0", "0", GLOO_PEER_GONE, 1.2)
    assert len(book.incidents) == 1 and book.incidents[0].node == "n1"
    assert "pid 12" in book.incidents[0].reason


# ---- launch init --script -----------------------------------------------------------------

def test_init_script_writes_the_recipe_launch_run_script_stands_for(tmp_path, monkeypatch,
                                                                       capsys):
    from launcher.cli import main
    from launcher.job.recipe import load_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert main(["init", "myjob", "--script", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "launch run myjob/recipe.yml --local" in out
    recipe = load_recipe(tmp_path / "myjob" / "recipe.yml")
    # The same job `launch run train.py` runs: the current folder shipped, the script in it.
    assert job_of(recipe) == Job("script", "train.py", (), str(tmp_path))
    assert recipe.name == "myjob" and recipe.nodes == 2
    assert main(["init", "other", "--script", "missing.py"]) == 2
    assert "--script missing.py: no such file here" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
