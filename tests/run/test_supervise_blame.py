"""Which node supervise() blames when a node's exit status arrives before its last lines.

Over SSH a node's exit status and its output travel apart, and the line that names the killed
worker (`exitcode : -9 ... (SIGKILL)`, torchrun's agent's last words) can come after the
status. These nodes are real child processes (LocalNodeProcess, real pipes): the shell exits at
once and a background child, still holding its stdout, prints that line half a second later.
"""

from __future__ import annotations

import os
import signal

from launcher.backends.local.agent import LocalNodeProcess
from launcher.execute.supervisor import supervise
from launcher.job.runplan import NodeCommand
from launcher.report.display import PlainDisplay
from launcher.runs.logs import LineRouter
from tests.run.test_recovery_units import KILLED_WORKER

# What host1's agent printed (the verbatim lab line, less the "host1/agent: " launch added),
# and a surviving peer's agent reporting its worker's plain failure.
KILLED_LINE = KILLED_WORKER[0].split(": ", 1)[1]
SURVIVOR_LINE = "  exitcode  : 1 (pid: 6033)"


def node(tmp_path, name: str, script: str) -> LocalNodeProcess:
    command = NodeCommand(name=name, address="127.0.0.1", private_address="127.0.0.1",
                          is_head=name == "host0", gpus=0, argv=("sh", "-c", script), env={},
                          run_dir=str(tmp_path / name), cwd=str(tmp_path))
    return LocalNodeProcess(command, stamp="blame-test")


def run(tmp_path, procs, settle_s):
    """supervise() the nodes: its outcome, and the nodes whose process group (a child left
    behind) was still alive when it returned."""
    with open(os.devnull, "w") as quiet:
        router = LineRouter({p.name: tmp_path / f"{p.name}.log" for p in procs},
                            PlainDisplay(quiet))
        try:
            outcome = supervise(procs, router, settle_s=settle_s, grace_s=2.0)
            alive = []
            for p in [p for p in procs if p.proc is not None]:   # the started ones
                try:
                    os.killpg(p.pgid, 0)
                    alive.append(p.name)
                except ProcessLookupError:
                    pass
            return outcome, alive
        finally:
            router.close()
            for p in procs:   # the background children, by their process group
                if p.proc is not None:
                    p.signal(signal.SIGKILL)


def test_the_killed_node_is_blamed_though_its_last_line_comes_after_its_exit(tmp_path):
    survivor = node(tmp_path, "host0", f"echo '{SURVIVOR_LINE}'; exit 1")
    # Exits after the survivor (both have exited before its line comes).
    killed = node(tmp_path, "host1",
                  f"sleep 0.3; (sleep 0.5; echo '{KILLED_LINE}') & exit 1")
    outcome, _ = run(tmp_path, [survivor, killed], settle_s=10.0)
    assert outcome.status == "failed"
    assert outcome.first_failure == "host1", outcome.reason
    assert KILLED_LINE.strip() in (tmp_path / "host1.log").read_text()
    # Said as what happened: torchrun's own exit code 1 said nothing of the SIGKILL.
    assert outcome.reason == ("node host1: its worker (pid 32638) was killed by SIGKILL "
                              "(torchrun exited with code 1)")


def test_output_that_never_ends_does_not_hold_up_the_verdict(tmp_path):
    survivor = node(tmp_path, "host0", f"echo '{SURVIVOR_LINE}'; exit 1")
    # A child keeps the node's output open for ten minutes after the node exited.
    stuck = node(tmp_path, "host1", "sleep 0.3; (sleep 600; echo late) & exit 1")
    outcome, alive = run(tmp_path, [survivor, stuck], settle_s=1.0)
    assert outcome.status == "failed" and outcome.first_failure == "host0"
    # The verdict came while the child still held the output: launch did not wait for it.
    assert alive == ["host1"]


def test_a_worker_killed_earlier_and_restarted_is_not_the_run_s_end():
    from launcher.execute.supervisor import worker_death

    killed = ("E1202 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
              "local_rank: 0 (pid: 12) of binary: /usr/bin/python")
    raised = killed.replace("-9", "1").replace("12", "13")
    assert worker_death([killed, "  exitcode  : -9 (pid: 12)  (SIGKILL)"]) == \
        "its worker local_rank 0 (pid 12) was killed by SIGKILL"
    # Killed, restarted, then the new worker raised: its plain exit ended the run.
    assert worker_death([killed, raised, "  exitcode  : 1 (pid: 13) "]) is None


def test_a_node_that_cannot_be_started_is_named_and_the_started_ones_are_stopped(tmp_path):
    """The nodes start at once (supervisor.AT_ONCE at a time): one whose agent cannot start
    (here its folder is missing) is the run's failure, named, never counted as started, and
    the nodes that did start are stopped, not left running."""
    running = [node(tmp_path, f"host{i}", "sleep 600") for i in (0, 2)]
    broken = node(tmp_path, "host1", "sleep 600")
    broken.command = NodeCommand(**{**vars(broken.command), "cwd": str(tmp_path / "missing")})
    procs = [running[0], broken, running[1]]
    outcome, alive = run(tmp_path, procs, settle_s=1.0)
    assert outcome.status == "failed" and outcome.first_failure == "host1"
    assert outcome.reason.startswith("node host1 could not be started: ")
    exits = {e.name: e for e in outcome.nodes}
    assert exits["host1"].started is False
    assert alive == []
