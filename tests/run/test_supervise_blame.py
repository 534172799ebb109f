"""Which node supervise() blames when a node's exit status arrives before its last lines.

Over SSH a node's exit status and its output travel apart, and the line that names the killed
worker (`exitcode : -9 ... (SIGKILL)`, torchrun's agent's last words) can come after the
status. These nodes are real child processes (LocalNodeProcess, real pipes): the shell exits at
once and a background child, still holding its stdout, prints that line half a second later.
"""

from __future__ import annotations

import os
import signal
import time

from launcher.display import PlainDisplay
from launcher.execute.local_agent import LocalNodeProcess
from launcher.execute.supervisor import supervise
from launcher.logs import LineRouter
from launcher.plan import NodeCommand

# Verbatim agent lines from a lab run (tests/run/test_recovery_units.py, ABORTED_PEER and
# KILLED_WORKER come from the same run): host1's worker was killed, host0's lost its peer.
SURVIVOR_LINE = "  exitcode  : 1 (pid: 6033)"
KILLED_LINE = "  exitcode  : -9 (pid: 32638)  (SIGKILL)"


def node(tmp_path, name: str, script: str) -> LocalNodeProcess:
    command = NodeCommand(name=name, address="127.0.0.1", private_address="127.0.0.1",
                          is_head=name == "host0", gpus=0, argv=("sh", "-c", script), env={},
                          run_dir=str(tmp_path / name), cwd=str(tmp_path))
    return LocalNodeProcess(command, stamp="blame-test")


def run(tmp_path, procs, settle_s):
    with open(os.devnull, "w") as quiet:
        router = LineRouter({p.name: tmp_path / f"{p.name}.log" for p in procs},
                            PlainDisplay(quiet))
        try:
            return supervise(procs, router, settle_s=settle_s, grace_s=2.0)
        finally:
            router.close()
            for p in procs:   # the background children, by their process group
                p.signal(signal.SIGKILL)


def test_the_killed_node_is_blamed_though_its_last_line_comes_after_its_exit(tmp_path):
    survivor = node(tmp_path, "host0", f"echo '{SURVIVOR_LINE}'; exit 1")
    # Exits after the survivor (both have exited before its line comes).
    killed = node(tmp_path, "host1",
                  f"sleep 0.3; (sleep 0.5; echo '{KILLED_LINE}') & exit 1")
    outcome = run(tmp_path, [survivor, killed], settle_s=10.0)
    assert outcome.status == "failed"
    assert outcome.first_failure == "host1", outcome.reason
    assert KILLED_LINE.strip() in (tmp_path / "host1.log").read_text()


def test_output_that_never_ends_delays_the_verdict_no_longer_than_the_settle_window(tmp_path):
    survivor = node(tmp_path, "host0", f"echo '{SURVIVOR_LINE}'; exit 1")
    # A child keeps the node's output open for a minute after the node exited.
    stuck = node(tmp_path, "host1", "sleep 0.3; (sleep 60; echo late) & exit 1")
    began = time.monotonic()
    outcome = run(tmp_path, [survivor, stuck], settle_s=1.0)
    assert outcome.status == "failed" and outcome.first_failure == "host0"
    # Not a timing measurement: the verdict must not wait for the minute-long child.
    assert time.monotonic() - began < 30
