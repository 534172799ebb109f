"""The collective gate, run: its job (launcher/check/collective_gate.py) started through the
pipeline like any run, on the nodes of the run it guards (inside a Slurm job: on that job's
allocation, the very nodes the run gets), and its verdict read back.

    run_gate(backend, nodes, ...)          -> GateResult    `launch check --collective`
    gate_before_run(backend, request, nodes) -> nodes       `launch run --gate`: the nodes the
                                                            run may use, or GateRefused
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from launcher.check.collective_gate import (FAIL, GATE_BYTES_CPU, GATE_BYTES_GPU, RESULTS_FILE,
                                            GateDisplay, GateRefused, GateResult, gate_job,
                                            gate_recipe, transport_checks)
from launcher.cluster.inventory import Node
from launcher.core.errors import RunFailed
from launcher.execute.attempt import run_attempt
from launcher.job.request import RunRequest
from launcher.job.recipe import Recipe

# How a request is carried out: run_attempt here (the pipeline is where the nodes are), or
# launcher/pipeline/run.py's run (which hands a Slurm job over) from a command.
Start = Callable[[RunRequest, list[Node], Any], dict]


def gate_request(backend, nodes: list[Node], *, run_id: str, runs_dir: str,
                 floor_gbs: float | None, base: Recipe | None = None, grace_s: float = 5.0,
                 rdzv_port: int | None = None) -> RunRequest:
    """The gate's job as a run of its own."""
    size = GATE_BYTES_GPU if any(backend.gpus(nodes)) else GATE_BYTES_CPU
    recipe = gate_recipe(len(nodes), base, local=backend.capabilities.one_machine)
    return RunRequest(recipe, run_id, len(nodes), job=gate_job(size, floor_gbs),
                      runs_dir=runs_dir, grace_s=grace_s, rdzv_port=rdzv_port)


def plan_gate(backend, nodes: list[Node], *, run_id: str, runs_dir: str,
              floor_gbs: float | None, rdzv_port: int | None = None):
    """The gate job's plan, as `run_gate` would start it (for --dry-run; starts nothing)."""
    return backend.plan(gate_request(backend, nodes, run_id=run_id, runs_dir=runs_dir,
                                     floor_gbs=floor_gbs, rdzv_port=rdzv_port), nodes)


def run_gate(backend, nodes: list[Node], *, run_id: str, runs_dir: str,
             floor_gbs: float | None, base: Recipe | None = None, grace_s: float = 5.0,
             rdzv_port: int | None = None, stream: TextIO | None = None,
             start: Start | None = None) -> GateResult:
    """Start the gate job on `nodes` and read its verdict. A job that fails is a failed gate
    (the reason kept), never an exception, unless the gate could not even be planned."""
    stream = stream or sys.stdout
    request = gate_request(backend, nodes, run_id=run_id, runs_dir=runs_dir,
                           floor_gbs=floor_gbs, base=base, grace_s=grace_s, rdzv_port=rdzv_port)
    start = start or (lambda req, on, display: run_attempt(backend, req, on, display=display))
    run_dir = Path(runs_dir).resolve() / run_id
    failure, names = None, [n.name for n in nodes]
    # The job's own report and messages go to its run folder, not between the table's lines.
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            summary = start(request, nodes, GateDisplay(stream))
            # The nodes as the run names them (a Slurm allocation's, once it has them).
            names = [n["name"] for n in summary["nodes"]]
        except RunFailed as err:
            failure = str(err).splitlines()[0]
    result = GateResult(run_dir, names, failure=failure)
    if failure is None:
        for name in names:
            path = run_dir / name / RESULTS_FILE
            if path.exists():
                result.results = json.loads(path.read_text())
                break
        if result.results is None:
            result.failure = f"no node folder in {run_dir} holds {RESULTS_FILE}"
    if run_dir.exists():
        result.transports = transport_checks(run_dir, names)
        (run_dir / "gate.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def gate_before_run(backend, request: RunRequest, nodes: list[Node], *,
                    stream: TextIO | None = None, start: Start | None = None,
                    run_id: str | None = None) -> list[Node]:
    """`launch run --gate`: the nodes the run may use, or GateRefused naming the bad ones.
    With `request.exclude_bad` the gate measures every host the backend has (spares included)
    and the run takes the first healthy ones."""
    stream = stream or sys.stdout
    recipe = request.recipe
    count = len(nodes)
    candidates = nodes
    if request.exclude_bad and not backend.capabilities.one_machine:
        candidates = backend.nodes(None)
    floor = recipe.gate.min_busbw_gbs
    say = (lambda text: print(f"launch: {text}", file=stream, flush=True))
    say(f"gate: measuring {len(candidates)} node(s) before the run "
        + (f"(floor {floor:g} GB/s, recipe gate.min_busbw_gbs)" if floor is not None
           else "(no gate.min_busbw_gbs: each node against the others)"))
    result = run_gate(backend, candidates, run_id=run_id or f"{request.run_id}-gate",
                      runs_dir=request.runs_dir, floor_gbs=floor, base=recipe,
                      grace_s=request.grace_s, rdzv_port=request.rdzv_port, stream=stream,
                      start=start)
    if result.failure is not None:
        raise GateRefused(f"the collective gate could not run: {result.failure}; nothing was "
                          f"started (gate logs in {result.run_dir})")
    checks = {**result.busbw_checks()}
    if result.passed:
        say(f"gate: passed on {', '.join(result.nodes)}")
        return nodes
    evidence = []
    for name in result.bad:
        for check in (checks.get(name), result.transports.get(name)):
            if check is not None and check.status == FAIL:
                evidence.append(f"  {name}: {check.name}: {check.evidence}")
    named = ", ".join(result.bad)
    if not request.exclude_bad:
        raise GateRefused(f"the collective gate names {named}; nothing was started:\n"
                          + "\n".join(evidence) + "\nfix the node, leave it out (--limit), or "
                          "pass --exclude-bad with spare hosts in the inventory "
                          f"(gate logs in {result.run_dir})")
    good = [n for n in candidates if n.name not in result.bad]
    if len(good) < count:
        raise GateRefused(f"the collective gate names {named} and leaves {len(good)} healthy "
                          f"host(s) ({', '.join(n.name for n in good) or 'none'}); the run needs "
                          f"{count}: nothing was started\n" + "\n".join(evidence))
    chosen = good[:count]
    say(f"gate: leaving out {named}; the run uses {', '.join(n.name for n in chosen)}")
    for line in evidence:
        say(f"gate: {line.strip()}")
    return chosen
