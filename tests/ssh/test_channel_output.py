"""A node's output over SSH as one pump thread reads it (launcher/backends/ssh/pump.py): a
character split between two writes arrives whole, a last line without its newline is kept,
stdout and stderr both reach the node's log, and the exit status is the command's own."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import launch_cmd
from tests.ssh.conftest import only_sshd_left

pytestmark = [pytest.mark.slow, pytest.mark.lab]

# "é" is b"\xc3\xa9": each time its first byte is flushed alone, then the rest with the
# newline, 0.1 s apart, so that the two halves come in separate SSH packets.
JOB = r"""
import os, sys, time
out = sys.stdout.buffer
for n in range(3):
    out.write(b"caf\xc3"); out.flush(); time.sleep(0.1)
    out.write(b"\xa9 %d\n" % n); out.flush()
print("to stderr on node", os.environ["LAUNCH_NODE_RANK"], file=sys.stderr, flush=True)
out.write(b"no newline at the end"); out.flush()
# host1 fails, but only once host0 has written all of its output (the lab's hosts share one
# filesystem): the stop a failure brings then cuts nothing short, however busy the machine.
done = sys.argv[1]
if os.environ["LAUNCH_NODE_RANK"] == "0":
    open(done, "w").close()
else:
    for _ in range(1200):
        if os.path.exists(done):
            break
        time.sleep(0.1)
    sys.exit(3)
"""


def test_split_characters_last_lines_and_the_exit_status_arrive_whole(lab, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "r.yml").write_text(json.dumps({
        "name": "pumped", "nodes": 2, "workdir": ".",
        "job": {"command": [lab.python, "job.py", str(tmp_path / "host0-done")]}}))
    proc = subprocess.run(launch_cmd("run", "-i", str(lab.inventory), "r.yml", "--run-id",
                                     "pumped"), cwd=tmp_path, text=True, capture_output=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    # host1 exits 3: the run fails with that node and that code.
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "runs" / "pumped" / "summary.json").read_text())
    assert {n["name"]: n["exit_code"] for n in summary["nodes"]} == {"host0": 0, "host1": 3}
    for rank, host in enumerate(("host0", "host1")):
        log = (tmp_path / "runs" / "pumped" / host / "node.log").read_text()
        lines = [line.split(": ", 1)[1] for line in log.splitlines() if ": " in line]
        assert lines[:3] == ["café 0", "café 1", "café 2"], log
        assert f"to stderr on node {rank}" in lines
        assert lines[-1] == "no newline at the end"
    assert "\ufffd" not in proc.stdout
    assert only_sshd_left(lab) == {}
