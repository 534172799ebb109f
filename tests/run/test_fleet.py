"""The launcher's pipeline against a fleet of 200 stand-in nodes (benchmarks/standin.py, the
simulated fleet of benchmarks/scale.py, issue 37): it ends, names every node, blames the one
that failed, and holds a fixed number of threads per node. Not a timing: what must stay true
of a run of hundreds of nodes whatever the machine's speed."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from launcher.core.errors import RunFailed
from launcher.job.recipe import recipe_from_mapping
from launcher.job.request import RunRequest
from launcher.pipeline.run import run_here
from launcher.report.display import PlainDisplay

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from standin import Script, StandinBackend  # noqa: E402

pytestmark = pytest.mark.slow   # ~10-16 s here: the report's plots are most of it

NODES = 200
# What the pipeline may hold per node: its reader (launcher/execute/supervisor.py). The hang
# watch's pool, the display and the supervisor are a fixed few on top.
THREADS_PER_NODE = 1
THREADS_FIXED = 40


def test_two_hundred_nodes_end_named_with_the_failing_one_blamed(tmp_path, capsys):
    script = Script(ranks=2, steps=4, step_s=0.3, fail="node0137", fail_step=2)
    backend = StandinBackend(NODES, script)
    recipe = recipe_from_mapping({"name": "fleet", "nodes": NODES,
                                  "job": {"command": ["torchrun", "train.py"]}}, "fleet.yml")
    peak, done = [threading.active_count()], threading.Event()
    before = threading.active_count()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], threading.active_count())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    terminal = tmp_path / "terminal.txt"
    # A file of the user's beside the run folders: the report looks there for a bench of the
    # same nodes, and once failed on it ("is not a folder").
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine\n")
    try:
        with open(terminal, "w") as shown, pytest.raises(RunFailed) as failed:
            run_here(backend, RunRequest(recipe, "fleet", NODES,
                                         runs_dir=str(tmp_path / "runs")),
                     display=PlainDisplay(shown))
    finally:
        done.set()
        sampler.join()

    run = tmp_path / "runs" / "fleet"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failure"]["first_failed_node"] == "node0137"
    assert "node0137" in str(failed.value)
    assert [n["name"] for n in summary["nodes"]] == [f"node{i:04d}" for i in range(NODES)]
    assert [n["name"] for n in summary["nodes"] if n["exit_code"] == 1] == ["node0137"]
    # Every node started and printed; its log holds every line it printed.
    assert len(script.first_seen) == NODES
    assert "RuntimeError: stand-in failure on node0137 at step 2" in \
        (run / "node0137" / "node.log").read_text()
    report = (run / "report.md").read_text()
    assert "node0137" in report
    # The many-node screen: the failing node's traceback reached the terminal, the other
    # nodes' chatter did not.
    text = terminal.read_text()
    assert "node0137/1: RuntimeError: stand-in failure on node0137 at step 2" in text
    assert "node0199/0: rank" not in text
    assert peak[0] - before <= THREADS_PER_NODE * NODES + THREADS_FIXED, peak[0] - before
