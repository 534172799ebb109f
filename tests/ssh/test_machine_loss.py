"""Losing a machine, not only a process, on the SSH lab: a lab host taken away as a machine
goes (its link first, then everything on it, then its namespace), and a fresh lab host brought
in as its replacement through the path an EC2 replacement takes (the lab stands in for EC2's
part: whether the machine is gone, and a new one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.cluster.inventory import load_inventory
from launcher.cluster.ssh import SshOptions
from launcher.job.recipe import load_recipe
from launcher.job.request import Recover, RunRequest
from launcher.lab.hosts import LabFleet
from launcher.pipeline.recover import (RecoveryBook, Replacements, gate_and_record,
                                       recover_one)
from tests.labs import _ssh_lab
from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from tests.ssh.conftest import newest_step, only_sshd_left
from launch_node import checkpoint_files as files

pytestmark = [pytest.mark.slow, pytest.mark.lab]


@pytest.fixture
def lab(tmp_path_factory):
    """A lab of two hosts for each test: each loses a host for good (and the first removes the
    lab to see its replacement go with it)."""
    yield from _ssh_lab(tmp_path_factory, hosts=2)


def test_a_lost_head_is_replaced_and_the_run_ends_as_an_uninterrupted_one(lab, tmp_path):
    dest = lab.dir / "mirror"
    recipe = write_recipe(tmp_path, train={"steps": 120, "log_every": 20},
                          checkpoint={"every_steps": 20, "keep": 2, "mirror": str(dest)})
    reference = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                               "--run-id", "whole", "--rdzv-port", "29652"], tmp_path)
    assert reference.wait(timeout=400) == 0, reference.output()[-3000:]
    whole = json.loads((tmp_path / "runs" / "whole" / "summary.json").read_text())

    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                         "--run-id", "lost", "--rdzv-port", "29653", "--recover", "1"],
                        tmp_path)
    try:
        wait_for(lambda: newest_step(dest, "lost") >= 40, 300, "step 40 in the mirror")
        lab.lose("host0")
        saved = newest_step(dest, "lost")
        # Its disk went with it: the head's checkpoints are only in the mirror now.
        for folder in (lab.dir / "node-runs").glob("lost.*/host0"):
            shutil.rmtree(folder)
        code = run.wait(timeout=600)
    finally:
        run.kill()
    out = run.output()
    assert code == 0, out[-5000:]
    run_dir = tmp_path / "runs" / "lost"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 120
    (recovery,) = summary["recoveries"]
    assert (recovery["node"], recovery["replacement"]) == ("host0", "host2")
    assert recovery["why"] == "lab host host0: its network namespace is gone"
    assert recovery["resumed_from_step"] == saved
    for step in ("replace_s", "setup_s", "checked_s", "recovered_in_s"):
        assert recovery[step] >= 0
    # The run did not gate at its start (no --gate), so neither does its replacement.
    assert recovery["gate_s"] is None
    assert "no gate: the run does not gate (--gate)" in out and "launch: gate:" not in out
    # The lost head took the rendezvous store with it: the other node's torchrun, whose calls
    # to it wait, is killed at once rather than after the grace period.
    assert "the rendezvous store on host0 has ended" in out
    # The replacement began as the loss was known, not once the first attempt had stopped
    # host1, fetched its files and written its report.
    assert out.index("launch: recover: node host0 is lost") < out.index("launch: report in")
    # The first attempt's advice names the lost machine, not a log to fix.
    assert ("launch: advice: the run failed: a machine is gone (host0: lab host host0: its "
            "network namespace is gone); `launch run --resume lost --recover` replaces it") in out
    first = json.loads((run_dir / "attempts" / "1" / "summary.json").read_text())
    assert first["lost"] == {"host0": recovery["why"]}
    assert "node host0 was lost" in first["failure"]["reason"]
    assert [n["name"] for n in summary["nodes"]] == ["host2", "host1"]
    assert f"mirror: restored {files.stem(saved)}" in out
    # Nothing lost past the last mirrored checkpoint, and the same model as without the loss.
    assert summary["final_loss"] == whole["final_loss"]
    assert summary["eval_accuracy"] == whole["eval_accuracy"]
    assert only_sshd_left(lab) == {}
    # The replacement is the lab's now: removing the lab removes it too.
    lab.destroy()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"lab{lab.lab_id}h" not in listed


def test_the_replacement_in_a_run_that_gates_is_gated_with_the_other_nodes(lab, tmp_path,
                                                                             capsys):
    """A run started with `--gate` holds its replacement to the same rule: after `launch check`
    on the new machine, the collective gate runs over the run's nodes, the new one among them,
    before the run goes on; recoveries.json keeps how long it took. (The recovery between
    the attempts, on the lab: host0 lost, host2 in its place, the gate a real torchrun on
    host2 and host1.)"""
    nodes = load_inventory(lab.inventory)
    recipe = load_recipe(write_recipe(tmp_path))
    request = RunRequest(recipe, "gated", 2, runs_dir=str(tmp_path / "runs"), rdzv_port=29655,
                         recover=Recover(1, 600), gate=True)
    book = RecoveryBook(tmp_path / "runs" / "gated")
    fleet = LabFleet(lab.dir)
    lab.lose("host0")
    why = fleet.gone(nodes[0])
    assert why == "lab host host0: its network namespace is gone"
    detected = time.monotonic()
    backend = SshBackend(lab.inventory, SshOptions())
    new = recover_one(fleet, nodes[0], why, request.recover, book, "gated", detected, backend)
    assert new.name == "host2" and book.entries[0]["checked_s"] > 0
    gate_and_record(fleet, backend, request, [new, nodes[1]], book, book.entries, detected,
                    request.recover)
    err = capsys.readouterr().err
    (entry,) = book.entries
    assert (entry["node"], entry["replacement"]) == ("host0", "host2")
    assert entry["checked_s"] > 0 and entry["gate_s"] > 0
    assert entry["recovered_in_s"] >= entry["checked_s"] + entry["gate_s"]
    # The gate's own lines, with both nodes, and the recovery's sentence naming its time.
    assert "launch: gate:" in err and "host2" in err and "host1" in err
    assert f"gate {entry['gate_s']}s)" in err and "the run does not gate" not in err
    # The gate's SSH sessions are closed as it returns; sshd's own session process on a host
    # leaves a moment later (0.2 s here), as the connection's end reaches it.
    wait_for(lambda: only_sshd_left(lab) == {}, 10, "nothing but sshd on the hosts")


def test_a_machine_gone_before_the_run_begins_is_replaced_and_the_run_starts_there(
        lab, tmp_path, run_launch):
    """`--recover` covers a machine that went while nobody watched (a spot instance reclaimed
    overnight, before `launch run --resume`): preflight cannot reach host0, its fleet says it
    is gone, host2 replaces it and the run starts on host2 and host1, recorded as any
    recovery."""
    recipe = write_recipe(tmp_path)
    lab.lose("host0")
    proc = run_launch("run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                      "--run-id", "late", "--rdzv-port", "29656", "--recover", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "launch: recover: node host0 is lost (lab host host0: its network namespace is " \
           "gone); replacing it" in proc.stderr
    assert "launch: recover: starting run late on host2, host1" in proc.stderr
    summary = json.loads((tmp_path / "runs" / "late" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 20
    assert [n["name"] for n in summary["nodes"]] == ["host2", "host1"]
    (recovery,) = summary["recoveries"]
    assert (recovery["node"], recovery["replacement"]) == ("host0", "host2")
    assert recovery["resumed_from_step"] is None   # it started, nothing to resume
    kept = json.loads((tmp_path / "runs" / "late" / "recoveries.json").read_text())
    assert kept == summary["recoveries"]
    assert only_sshd_left(lab) == {}


def test_ctrl_c_while_a_replacement_comes_up_says_what_it_leaves(lab, tmp_path, capsys):
    """A run stopped while a lost machine's replacement is under way waits for it, to name it
    (on EC2 an instance that bills), and says so; a Ctrl-C then ends the wait at once, saying
    the replacement is left where `launch status` and `launch teardown` find it. (The wait
    used to be silent, and to go on after the Ctrl-C: Python joins a thread pool's threads at
    exit.)"""
    nodes = load_inventory(lab.inventory)
    booted = threading.Event()

    class SlowBootFleet(LabFleet):
        """The lab's fleet, its new machine up only once the test says so: an EC2 boot,
        minutes long, rather than the lab's second (the outcome depends on no timing)."""

        def replace(self, node):
            booted.wait(300)
            return super().replace(node)

    fleet = SlowBootFleet(lab.dir)
    lab.lose("host0")
    replacements = Replacements(fleet, SshBackend(lab.inventory, SshOptions()),
                                Recover(1, 600), RecoveryBook(tmp_path / "runs" / "r"), "r")
    replacements.begin(nodes[0], fleet.gone(nodes[0]))
    (_, _, work), = replacements.begun.values()
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            replacements.unused()
        assert not work.done()
    finally:
        booted.set()
        work.exception(timeout=300)   # its lines stay in this test's output
    err = capsys.readouterr().err
    assert ("launch: recover: waiting for the replacement of host0 to come up, to name it "
            "(Ctrl-C again stops waiting)") in err
    assert (f"launch: recover: stopped waiting for the replacement of host0: launch stops "
            f"bringing it in; what it made so far stays in {fleet.what} (`launch status`, "
            "`launch teardown`)") in err


def test_ctrl_c_after_a_machine_is_lost_stops_the_run_and_names_its_replacement(lab, tmp_path):
    """Ctrl-C the moment launch says a machine is lost: the run stops as asked, is not
    resumed, and the replacement already begun is named as unused, where it stays."""
    recipe = write_recipe(tmp_path, train={"steps": 400, "log_every": 20})
    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                         "--run-id", "stopped", "--rdzv-port", "29657", "--recover", "1"],
                        tmp_path)
    try:
        wait_for(lambda: "step 20/400" in run.output(), 300, "step 20")
        lab.lose("host1")
        wait_for(lambda: "launch: recover: node host1 is lost" in run.output(), 120,
                 "the loss noticed")
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(timeout=300)
    finally:
        run.kill()
    out = run.output()
    summary = json.loads((tmp_path / "runs" / "stopped" / "summary.json").read_text())
    # Which came first decides how the attempt ended: the Ctrl-C (launch stops every node:
    # interrupted, 130) or the loss (launch was stopping the nodes already: failed, 1). Either
    # way it is the run's end: it once went on to resume on the replacement, the Ctrl-C
    # unheard, when the loss had come first.
    assert (code, summary["status"]) in ((130, "interrupted"), (1, "failed")), out[-5000:]
    if code == 1:
        assert "launch: Ctrl-C (SIGINT): the nodes are already stopping" in out
        assert ("launch: recover: Ctrl-C (SIGINT) came as the attempt ended: the run is not "
                "recovered") in out
    assert "host2, brought in before the run stopped, stay(s) in" in out, out[-5000:]
    assert "resuming run stopped" not in out and "Traceback" not in out
    (recovery,) = summary["recoveries"]
    assert (recovery["node"], recovery["replacement"]) == ("host1", "host2")
    assert only_sshd_left(lab) == {}


def test_ctrl_c_during_the_recoverys_gate_stops_the_run_and_names_its_replacement(lab,
                                                                                    tmp_path):
    """Ctrl-C between attempts, as the replacement's gate begins: the run ends there, never
    resumed, and the replacement is named. (Landing before the gate's own torchrun is under
    way, it is Python's KeyboardInterrupt in run_recovering: 130, the replacement named as
    unused; landing in it, the gate fails, and the error names the replacement it was for.)"""
    recipe = write_recipe(tmp_path, train={"steps": 400, "log_every": 20})
    run = LaunchProcess(["run", "--nodes", "2", str(recipe), "-i", str(lab.inventory),
                         "--run-id", "gated", "--rdzv-port", "29658", "--recover", "1",
                         "--gate"], tmp_path)

    def gating() -> bool:
        out = run.output()
        lost = out.find("launch: recover: node host1 is lost")
        return lost >= 0 and "launch: gate: measuring 2 node(s)" in out[lost:]

    try:
        wait_for(lambda: "step 20/400" in run.output(), 300, "step 20")
        lab.lose("host1")
        wait_for(gating, 120, "the recovery's gate")
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(timeout=300)
    finally:
        run.kill()
    out = run.output()
    if code == 130:
        assert "launch: recover: host2, brought in before the run was interrupted, stay(s) in" \
            in out, out[-5000:]
        assert out.rstrip().endswith("launch: interrupted"), out[-3000:]
    else:
        assert code == 1 and "launch: error: after replacing host2: the collective gate" in out, \
            out[-5000:]
    assert "resuming run gated" not in out and "Traceback" not in out
    assert only_sshd_left(lab) == {}
