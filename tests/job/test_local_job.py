"""The user's own job on this machine (`--local`): real torchrun agents, the project shipped,
setup, failures, restarts, resume, hangs and misbehaving jobs (tests/job/project.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.runs.logs import failure_excerpt
from tests.job.project import HOSTILE_ARGS, SETUP, command_recipe, results, write_project
from tests.run.conftest import LaunchProcess, run_pids, wait_for
from tests.run.timeline_check import check_timeline

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path):
    return write_project(tmp_path / "project")


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_script_with_its_package_data_args_and_setup(run_launch, project):
    """`launch run train... -- ARGS` from the project folder: the folder is shipped without
    its ignored files, and the run says so; setup runs first, with the node's interpreter
    first on PATH; the user's own `train` and `launch_node` packages win over launch's,
    arguments arrive verbatim, and every LAUNCH_* variable is there; the ranks get --env's
    values and a login's variables, not the rest of launch's environment."""
    proc = run_launch("--debug", "run", "--local", "--nodes", "2", "main.py", "--setup", SETUP,
                      "--run-id", "own", "--env", "JOB_TOKEN=s3cr3t value", "--env",
                      "FROM_SHELL", "--", *HOSTILE_ARGS, cwd=project, timeout=240,
                      env={"FROM_SHELL": "from the shell", "NOT_PASSED": "launch's own"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # What the ignore rules kept here, said before anything runs (with the rule).
    assert (f"launch: workdir {project}: the ignore rules left out 2 file(s) of 20 B and 1 "
            "folder(s), not shipped: scratch.txt (12 B, .launchignore:1 `scratch.txt`), "
            "token.secret (8 B, .gitignore:2 `*.secret`), outputs/ (.gitignore:1 `outputs/`). "
            "To ship one, add `!NAME` to .launchignore") in proc.stderr
    seen = results(proc.stdout)
    assert sorted(seen) == [0, 1]
    for rank, got in seen.items():
        assert got["argv"] == HOSTILE_ARGS
        assert got["package"] == "the user's own train package"
        assert got["node_package"] == "the user's own launch_node package"
        assert got["data"] == ["cat", "dog", "bird"]
        # Only setup's output: the ignored files stayed on this side.
        assert got["sees"] == ["setup-ran.txt"]
        python = Path(sys.executable)
        assert got["setup"].startswith("setup on node")
        assert got["setup"].endswith(f" python={python} pip={python.parent / 'pip'}")
        env = got["env"]
        assert env["JOB_TOKEN"] == "s3cr3t value" and env["FROM_SHELL"] == "from the shell"
        assert "NOT_PASSED" not in env and env["HOME"] == os.environ["HOME"]
        assert env["PATH"].split(":")[0] == str(python.parent)
        assert env["LAUNCH_RUN_ID"] == "own" and env["LAUNCH_ATTEMPT"] == "0"
        assert env["LAUNCH_NUM_NODES"] == "2" and env["LAUNCH_NODE_ADDRS"] == "127.0.0.1,127.0.0.1"
        assert env["LAUNCH_HEAD_ADDR"] == "127.0.0.1" and env["LAUNCH_GPUS_PER_NODE"] == "0"
        assert env["LAUNCH_CHECKPOINT_DIR"] == str(project / "runs" / "own" / "checkpoints")
        # Each node runs in a folder of its own for this run, made from the node's copy ...
        node = env["LAUNCH_NODE"]
        folder = Path(got["cwd"])
        assert got["cwd"] == env["LAUNCH_WORKDIR"] and folder.name == node
        assert folder.parent.name.startswith("own.") and \
            str(folder.parent.parent) == env["LAUNCH_WORKDIR_COPY"] + ".runs"
        assert env["PYTHONPATH"].split(":")[0] == got["cwd"]
        # ... so the two nodes sharing this machine do not see each other's snapshot.
        assert got["snapshot"] is None
        assert Path(got["cwd"], "snapshot.pt").read_text() == f"own {node}"
        # The run says where each node's job folder is.
        assert f"launch: job folder of {node}: {got['cwd']}" in proc.stdout + proc.stderr
    assert {got["env"]["LAUNCH_NODE_RANK"] for got in seen.values()} == {"0", "1"}
    assert not (project / "pwned").exists() and not (project / "pwned2").exists()
    run = project / "runs" / "own"
    summary = summary_of(run)
    assert summary["status"] == "succeeded" and summary["job"]["kind"] == "script"
    # Nothing of the trainer's is invented for a job of the user's own ...
    assert "eval_accuracy" not in summary and "images_per_sec" not in summary
    # ... and what it reported is kept.
    assert summary["progress"]["step"] == 4 and summary["progress"]["loss"] is not None
    assert "setup on node" in (run / "node0" / "setup.log").read_text()
    report = (run / "report.md").read_text()
    assert "## Job" in report and "reaching step 4" in report and "images/s" not in report
    recipe = yaml.safe_load((run / "recipe.yml").read_text())
    assert recipe["job"] == {"script": "main.py", "args": HOSTILE_ARGS}
    # --env's values are kept nowhere but where the ranks read them.
    assert "s3cr3t" not in (run / "plan.json").read_text() + (run / "recipe.yml").read_text()
    assert not run_pids("own")
    # What each node's job wrote comes back with `launch fetch --workdir`, and only that.
    fetched = run_launch("fetch", "own", "--workdir", cwd=project, timeout=120)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "its folder is here already" in fetched.stdout
    for node in ("node0", "node1"):
        assert f"  {node}: 1 file(s), {len('own ' + node)} B written by the run in " \
            in fetched.stdout
    assert sorted(str(p.relative_to(run / "workdir")) for p in (run / "workdir").rglob("*")) \
        == ["node0", "node0/snapshot.pt", "node1", "node1/snapshot.pt"]
    assert (run / "workdir" / "node1" / "snapshot.pt").read_text() == "own node1"


def test_setup_runs_again_only_when_the_workdir_changes(run_launch, project):
    # A job that imports nothing: setup's skip depends on the workdir and the commands, not on
    # what the job does, and main.py's torch and gloo cost ~2 s of CPU in each of the 3 runs.
    # It resumes from a snapshot in its working folder, as the DDP tutorial does: a later run
    # must not find the one an earlier run wrote (it starts from what was shipped), and the
    # earlier run's file stays in that run's own folder.
    (project / "hello.py").write_text(
        "import os\n"
        "found = open('snapshot.pt').read() if os.path.exists('snapshot.pt') else 'nothing'\n"
        "open('snapshot.pt', 'w').write(os.environ['LAUNCH_RUN_ID'])\n"
        "print('hello, found', found, 'in', os.getcwd(), flush=True)\n")

    def go(run_id):
        proc = run_launch("run", "--local", "--nodes", "1", "hello.py", "--setup", SETUP,
                          "--run-id", run_id, cwd=project, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        said = [line for line in proc.stdout.splitlines() if "node0/0: hello" in line]
        assert said and said[0].split("node0/0: ")[1].startswith("hello, found nothing in ")
        folder = Path(said[0].split(" in ")[-1])
        assert folder.name == "node0" and folder.parent.name.startswith(run_id + ".")
        return (project / "runs" / run_id / "node0" / "setup.log").read_text(), folder

    log, first = go("first")
    assert "launch: setup done" in log
    log, _ = go("unchanged")
    assert "launch: setup skipped" in log
    (project / "data" / "labels.txt").write_text("cat dog bird fish\n")
    assert "launch: setup done" in go("changed")[0]
    assert (first / "snapshot.pt").read_text() == "first"


def test_a_failing_setup_names_the_node_and_starts_no_job(run_launch, project):
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--setup",
                      "echo compiling; echo 'error: missing header' >&2; exit 3",
                      "--run-id", "badsetup", cwd=project, timeout=240)
    assert proc.returncode == 1
    assert "setup on node node0 failed with exit code 3" in proc.stderr
    assert "error: missing header" in proc.stderr
    assert "RESULT" not in proc.stdout
    summary = summary_of(project / "runs" / "badsetup")
    assert summary["status"] == "failed" and summary["failure"]["first_failed_node"] == "node0"
    assert all(n["status"] == "not started" for n in summary["nodes"])


def test_a_rank_that_raises_is_blamed_with_its_own_traceback(run_launch, project):
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "raises",
                      "--", "--mode", "raise", cwd=project, timeout=240)
    assert proc.returncode == 1
    assert "run raises failed: node node1 exited with code 1" in proc.stderr
    assert "ValueError: user code failed on purpose at step 2" in proc.stderr
    assert "main.py" in proc.stderr
    # What it did not find was left out by the ignore rules: said, with the way to ship it.
    assert ("token.secret was not shipped: the workdir scan left out token.secret (.gitignore:2 "
            "`*.secret`); `!token.secret` in .launchignore ships it") in proc.stderr
    # The report leads with the failure and says what to do.
    report = (project / "runs" / "raises" / "report.md").read_text()
    assert report.index("## Failure") < report.index("## Nodes")
    assert "Node node1: node node1 exited with code 1." in report
    assert "ValueError: user code failed on purpose at step 2" in report
    assert "- nothing" not in report and "launch run --resume raises" in report
    summary = summary_of(project / "runs" / "raises")
    assert summary["failure"]["first_failed_node"] == "node1"
    assert not run_pids("raises")


def test_the_exception_leads_the_failure_message_however_much_the_rank_printed(run_launch,
                                                                               project):
    """A rank prints 30 lines, then fails an assert; torchrun starts it again, 20 times in all
    (no torch in it: each costs a Python start). torchrun tails a rank's stdout and stderr
    apart, and the traceback came out before the 30 lines in 2 runs of 8
    (tests/run/data/torchrun/SOURCES.md): the failure message then showed the 30 lines
    without the AssertionError. Every attempt's lines must keep the order printed, on screen
    and in the log, and the excerpt launch takes must lead with the exception, each time."""
    proc = run_launch("run", "--local", "--nodes", "1", "main.py", "--run-id", "shout",
                      "--max-restarts", "19", "--", "--mode", "shout", cwd=project,
                      timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = "AssertionError: the rank gave up after shouting, attempt 19"
    assert ("run shout failed: node node0: worker local_rank 0 " in proc.stderr
            and "exited with code 1; the run had used its 19 restart(s)" in proc.stderr)
    run = project / "runs" / "shout"
    summary = summary_of(run)
    excerpt = summary["failure"]["last_lines"]
    assert excerpt[0] == "node0/0: Traceback (most recent call last):"
    assert f"node0/0: {last}" in excerpt and f"  node0/0: {last}" in proc.stderr
    log = (run / "node0" / "node.log").read_text().splitlines()
    starts = [i for i, line in enumerate(log) if "launch: worker rank 0/1" in line]
    assert len(starts) == 20
    for attempt, (begin, end) in enumerate(zip(starts, [*starts[1:], len(log)])):
        said = log[begin:end]
        error = f"node0/0: AssertionError: the rank gave up after shouting, attempt {attempt}"
        assert said.index(error) > said.index(f"node0/0: shout 29 of attempt {attempt}")
        assert error in failure_excerpt(said), said
        on_screen = proc.stdout.index(error)
        assert proc.stdout.rindex(f"shout 29 of attempt {attempt}", 0, on_screen) > \
            proc.stdout.rfind("launch: worker rank 0/1", 0, on_screen)
        if attempt < 19:   # each restart said as it begins
            assert (f"launch: restart {attempt + 1} of 19: node node0, worker local_rank 0 "
                    in proc.stdout)
    # torchrun's ChildFailedError report: in the log, not on screen.
    assert "ChildFailedError" not in proc.stdout and any("ChildFailedError" in line
                                                         for line in log)
    # One account of the restarts, and the attempt the job saw last.
    assert [r["restarted"] for r in summary["restarts"]] == [True] * 19 + [False]
    assert summary["nodes"][0]["restarts"] == 19 and summary["attempt"] == 19
    assert not run_pids("shout")


def test_a_crash_then_resume_continues_from_the_checkpoint_dir(run_launch, project):
    began = time.time()
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "again",
                      "--", "--mode", "crash-once", cwd=project, timeout=240)
    assert proc.returncode == 1
    # The exception first, though the rank printed 40 lines just before it.
    excerpt = proc.stderr.split("last lines of node node1")[1].splitlines()[1:]
    assert excerpt[0] == "  node1/0: [rank1]: Traceback (most recent call last):"
    assert "  node1/0: [rank1]: AssertionError: rank 1 crashes once, at step 3" in excerpt
    resumed = time.time()
    proc = run_launch("run", "--local", "--resume", "again", cwd=project, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step 3 in attempt 1" in proc.stdout
    seen = results(proc.stdout)
    assert {got["env"]["LAUNCH_ATTEMPT"] for got in seen.values()} == {"1"}
    assert summary_of(project / "runs" / "again")["progress"]["step"] == 6
    # Every second of both accounted for (issue 39); the resumed run's from its own start.
    run = project / "runs" / "again"
    check_timeline(*(run / "attempts").glob("*/summary.json"), began)
    check_timeline(run / "summary.json", resumed)


def test_a_jobs_checkpoint_dir_is_mirrored_and_comes_back_on_resume(run_launch, project,
                                                                     tmp_path):
    """`checkpoint: {mirror: ...}` beside `job:`: LAUNCH_CHECKPOINT_DIR goes to the mirror as
    the job writes it; the folder deleted, `--resume` brings its checkpoint back."""
    mirror_root = tmp_path / "shared" / "mirror"
    (project / "recipe.yml").write_text(yaml.safe_dump({
        "name": "mirrored", "nodes": 2, "workdir": ".",
        "job": {"script": "main.py", "args": ["--mode", "crash-once"]},
        "checkpoint": {"mirror": str(mirror_root)}}))
    proc = run_launch("run", "--local", "recipe.yml", "--run-id", "mirrored", cwd=project,
                      timeout=240)
    assert proc.returncode == 1 and "rank 1 crashes once" in proc.stderr
    run = project / "runs" / "mirrored"
    first = summary_of(run)["mirror"]
    assert first["layout"] == "job" and first["units"] >= 1 and first["failures"] == []
    assert first["last"]["unit"] == "state.pt"
    shutil.rmtree(run / "checkpoints")
    proc = run_launch("run", "--local", "--resume", "mirrored", cwd=project, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mirror: restored state.pt" in proc.stdout
    assert "resumed from step 3 in attempt 1" in proc.stdout
    assert summary_of(run)["progress"]["step"] == 6


def test_max_restarts_restarts_and_counts_the_attempt(run_launch, project):
    began = time.time()
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "restarts",
                      "--max-restarts", "1", "--", "--mode", "crash-once", cwd=project,
                      timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from step 3 in attempt 1" in proc.stdout
    # Said as it began, in one line; torchrun's ChildFailedError report in the logs only.
    assert "launch: restart 1 of 1: node node1, worker local_rank 0 (pid " in proc.stdout
    assert "ChildFailedError" not in proc.stdout
    summary = summary_of(project / "runs" / "restarts")
    assert len(summary["restarts"]) == 1 and summary["restarts"][0]["node"] == "node1"
    assert [n["restarts"] for n in summary["nodes"]] == [0, 1] and summary["attempt"] == 1
    # The script resumed from a checkpoint of its own: its step lines say so, and the report.
    restart = summary["restarts"][0]
    assert (restart["reached_step"], restart["next_step"]) == (3, 4)
    assert ("its next LAUNCH_STEP was step 4 (it had reported step 3): it went on from a "
            "checkpoint of its own") in (project / "runs" / "restarts" / "report.md").read_text()
    # Only the head's rank 0's step lines on screen; every rank's in the logs.
    assert "node1/0: LAUNCH_STEP" not in proc.stdout and "node0/0: LAUNCH_STEP" in proc.stdout
    assert "node1/0: LAUNCH_STEP" in (project / "runs" / "restarts" / "node1" /
                                      "node.log").read_text()
    # Every second accounted for (issue 39): the restart is a named loss, among the largest.
    timeline = check_timeline(project / "runs" / "restarts" / "summary.json", began,
                              restarts=1)
    restart = next(loss for loss in timeline["training_losses"] if loss["kind"] == "restart")
    assert restart["node"] == "node1" and restart in timeline["largest_losses"]
    # The page's "seconds since the run started" plot starts with the run: what came before
    # the first step is drawn there, each part named.
    page = (project / "runs" / "restarts" / "report.html").read_text()
    loss = page.split('<figure id="plot-loss">')[1].split("</figure>")[0]
    for phase in ("preflight", "preparation", "to first step"):
        assert f">{phase}</text>" in loss


def test_every_rank_of_a_round_says_the_same_attempt(run_launch, project):
    """Rank 0 quits before the process group forms: only its agent counts a restart; the
    other node's agent restarts its healthy, waiting rank for the new round without one.
    LAUNCH_ATTEMPT is still 1 on both nodes in that round (it was 1 and 0)."""
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "rounds",
                      "--max-restarts", "1", "--", "--mode", "quit-before-init-once",
                      cwd=project, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = project / "runs" / "rounds"
    said = {}
    for node in ("node0", "node1"):
        log = (run / node / "node.log").read_text()
        said[node] = re.findall(r"launch: worker rank (\d)/2 .* attempt (\d+) on", log)
    # Each node's rank said attempt 0, then attempt 1 in the round after the restart (which
    # node holds rank 0 is c10d's choice).
    assert {node: [a for _, a in lines] for node, lines in said.items()} == {
        "node0": ["0", "1"], "node1": ["0", "1"]}, said
    assert sorted(lines[-1][0] for lines in said.values()) == ["0", "1"], said
    seen = results(proc.stdout + "".join((run / n / "node.log").read_text()
                                         for n in ("node0", "node1")))
    assert {r["env"]["LAUNCH_ATTEMPT"] for r in seen.values()} == {"1"}
    assert summary_of(run)["attempt"] == 1


def test_a_hung_rank_is_found_with_its_own_stack(run_launch, project):
    """Rank 1 loops in the user's own function while rank 0 waits in a collective: no output,
    no CPU, no step: stopped after the hang timeout, each rank's stack kept."""
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--run-id", "hung",
                      "--hang-timeout", "6", "--", "--mode", "hang", cwd=project, timeout=240)
    assert proc.returncode == 1
    assert "stuck: rank 1 on node node1" in proc.stderr
    dumps = project / "runs" / "hung" / "hang"
    assert "stuck_in_user_code" in (dumps / "node1.rank1.txt").read_text()
    # Rank 0 waits for it in DDP's gradient all-reduce.
    assert "verdict: in collective" in (dumps / "node0.rank0.txt").read_text()
    assert not run_pids("hung")


def test_a_job_computing_silently_is_not_hung(run_launch, project, tmp_path):
    # Silent for twice the hang timeout: a watch blind to CPU use would stop it at ~4.5 s
    # (the timeout, then a look every 0.5 s), 3.5 s before it ends; each second spun is a
    # second of a core.
    script = project / "silent.py"
    script.write_text("import time\nend = time.time() + 8\nx = 0\n"
                      "while time.time() < end:\n    x += 1\nprint('computed', flush=True)\n")
    proc = run_launch("run", "--local", "--nodes", "1", "silent.py", "--hang-timeout", "4",
                      "--run-id", "silent", cwd=project, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "node0/0: computed" in proc.stdout


def test_a_command_starts_its_own_torchrun_from_the_launch_variables(run_launch, project):
    recipe = command_recipe(project, "cmd", ["--mode", "crash-once", "--label", "a b"],
                            restarts=1)
    proc = run_launch("run", "--local", str(recipe), "--run-id", "cmd", cwd=project,
                      timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The whole command started again on every node, with the next attempt.
    assert "restarting every node" in proc.stdout
    assert "torchrun starts the node's workers again" not in proc.stdout
    assert "resumed from step 3 in attempt 1" in proc.stdout
    plan = json.loads((project / "runs" / "cmd" / "plan.json").read_text())
    # Launch's worker entry holds the shipped copy, then becomes the command: no torchrun.
    argv = plan["nodes"][0]["argv"]
    # -S: the entry needs no site-packages (the command's own Python starts afresh).
    assert plan["store"] is None and argv[1] == "-S"
    assert argv[2].endswith("launch_node/worker.py") and argv[3:5] == ["exec", "bash"]
    assert not run_pids("cmd")


def test_dry_run_shows_argv_env_manifest_and_setup(run_launch, project):
    proc = run_launch("run", "--local", "--nodes", "2", "main.py", "--setup", SETUP,
                      "--env", "JOB_TOKEN=s3cr3t", "--dry-run", "--", "--lr", "0.1",
                      cwd=project, env={"NOT_PASSED": "launch's own"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "job: script main.py with arguments --lr 0.1 in " in out
    assert "workdir (shipped to every node" in out and f"$ {SETUP}" in out
    # Where each node's job will run: a folder of its own for this run, beside the copy.
    assert re.search(r"\n  job folder: /\S+\.runs/\S+\.UID/node1\n", out), out
    # The job's arguments in the worker's variable, out of torchrun's parser's reach.
    assert "launch_node/worker.py script main.py\n" in out
    assert """    LAUNCH_JOB_ARGV='["--lr", "0.1"]'""" in out
    assert "LAUNCH_NODE_RANK=1" in out
    # What each rank gets and where it comes from; --env's value masked.
    assert "environment of every rank (docs/jobs.md#the-environment)" in out
    assert f"    HOME={os.environ['HOME']}    # login" in out
    assert "    JOB_TOKEN='<--env value, 6 characters>'    # --env" in out
    assert "s3cr3t" not in out and "NOT_PASSED" not in out
    assert not (project / "runs").exists()


@pytest.mark.parametrize("argv, says", [
    (["missing.py"], "missing.py"),
    (["-m", "nosuchpkg.train"], "nosuchpkg"),
])
def test_a_missing_script_or_module_is_named(run_launch, project, argv, says):
    proc = run_launch("run", "--local", "--nodes", "1", *argv, cwd=project, timeout=120)
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (project / "runs").exists()


def _interrupt_when(lp: LaunchProcess, line: str) -> int:
    """Ctrl-C once `line` was printed; launch's exit code."""
    try:
        wait_for(lambda: line in lp.output(), 120, line)
        lp.proc.send_signal(signal.SIGINT)
        return lp.wait(timeout=60)
    finally:
        lp.kill()


def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(project, tmp_path):
    lp = LaunchProcess(["run", "--local", "--nodes", "2", "main.py", "--run-id", "stubborn",
                        "--grace", "2", "--", "--mode", "term-ignore"], project,
                       env={"LAUNCH_HOME": str(tmp_path / "home")})
    assert _interrupt_when(lp, "LAUNCH_STEP step=6") == 130
    assert wait_for(lambda: not run_pids("stubborn"), 10, "every process of the run gone")
    assert summary_of(project / "runs" / "stubborn")["status"] == "interrupted"


def test_a_job_that_forks_is_stopped_whole(project, tmp_path):
    lp = LaunchProcess(["run", "--local", "--nodes", "2", "main.py", "--run-id", "forks",
                        "--grace", "2", "--", "--mode", "fork"], project,
                       env={"LAUNCH_HOME": str(tmp_path / "home")})
    assert _interrupt_when(lp, "LAUNCH_STEP step=6") == 130
    assert "forked child" in lp.output()
    assert wait_for(lambda: not run_pids("forks"), 10, "every process of the run gone")


def test_a_flood_of_output_loses_no_line_of_the_log(run_launch, project):
    lines = 400_000   # ~36 MB
    proc = run_launch("run", "--local", "--nodes", "1", "main.py", "--run-id", "flood",
                      "--", "--mode", "flood", "--lines", str(lines), cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (project / "runs" / "flood" / "node0" / "node.log").read_text()
    numbered = [line for line in log.splitlines() if line.startswith("node0/0: flood 0")]
    assert len(numbered) == lines and numbered[-1].startswith(f"node0/0: flood {lines - 1:08d} ")
    assert "node0/0: flood done" in log


def test_output_that_is_not_utf8_is_kept(run_launch, project):
    proc = run_launch("run", "--local", "--nodes", "1", "main.py", "--run-id", "bytes",
                      "--", "--mode", "binary", cwd=project, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (project / "runs" / "bytes" / "node0" / "node.log").read_text()
    assert "bytes" in log and "not utf-8" in log and "binary done" in log
