"""A whole run, written once for every backend: where the pipeline runs (here in the terminal,
or handed over to where the run lives), then the gate, the bandwidth sweep, and attempts
(launcher/execute/attempt.py), a lost machine replaced between them.

    run(backend, request)          `launch run`: here, or handed over (detached; and always on
                                   a backend whose nodes only a job of its own can reach: Slurm)
    run_here(backend, request)     the pipeline itself, in this process: `launch run` attached,
                                   and the controller of a detached run (launcher/pipeline/
                                   controller.py), which runs exactly this
"""

from __future__ import annotations

import sys
from typing import Any

from launcher.core.errors import LauncherError
from launcher.execute.attempt import run_attempt
from launcher.job.request import RunRequest
from launcher.runs.timeline import Timeline


def check_supported(backend, request: RunRequest, detached: bool) -> None:
    """What the request asks of the backend, refused before anything starts when it cannot
    (the reason is the backend's own: docs/backends.md's table)."""
    wanted = [("machine recovery", request.recover is not None, "--recover"),
              ("gate", request.gate, "--gate"),
              ("resume", request.resume, "--resume"),
              ("checkpoint mirror", request.recipe.checkpoint is not None
               and request.recipe.checkpoint.mirror is not None, "checkpoint.mirror")]
    for feature, asked, flag in wanted:
        support = backend.capabilities.support(feature, detached)
        if asked and not support.ok:
            how = "a detached run" if detached else "this backend"
            raise LauncherError(f"{flag}: {feature} is not available on {how} "
                                f"({backend.describe(request.count)}): {support.why}")


def run_here(backend, request: RunRequest, *, display=None, folder=None,
             stream=None, timeline: Timeline | None = None) -> dict[str, Any]:
    """Gate, bench, then the run's attempts, in this process. `folder`: the run folder the
    client made (a handed-over run); `stream`: where the gate and the sweep speak;
    `timeline`: the run's phases so far (launch's process start: launcher/runs/timeline.py),
    else it starts now."""
    stream = stream or sys.stdout
    timeline = timeline or Timeline()
    nodes = backend.nodes(request.count)
    if request.gate:
        from launcher.pipeline.gate import gate_before_run

        timeline.begin("gate")
        nodes = gate_before_run(backend, request, nodes, stream=stream)
    if request.bench:
        from launcher.pipeline.bench import bench_before_run

        timeline.begin("bandwidth sweep")
        bench_before_run(backend, request, nodes)
    if request.recover is not None:
        from launcher.pipeline.recover import run_recovering

        return run_recovering(backend, request, nodes, display=display, folder=folder,
                              timeline=timeline)
    return run_attempt(backend, request, nodes, display=display, folder=folder,
                       timeline=timeline)


def run(backend, request: RunRequest, *, display=None,
        timeline: Timeline | None = None) -> dict[str, Any] | None:
    """`launch run`'s pipeline where the request asks: here when attached (and the backend
    can), else handed over to a controller where the run lives, and followed unless detached.
    Returns the summary (None for a detached run)."""
    detached = request.detach or not backend.capabilities.attached_here
    check_supported(backend, request, request.detach)
    if not detached:
        return run_here(backend, request, display=display, timeline=timeline)
    from launcher.pipeline.handover import follow_handed_over, hand_over

    if timeline is not None:
        timeline.begin("hand-over")
    handle = hand_over(backend, request)
    if request.detach:
        return None
    return follow_handed_over(backend, handle, display=display, timeline=timeline)


def start_anywhere(backend):
    """A request carried out where this backend runs one: here (run_attempt on the given
    nodes), or handed over and followed (a Slurm job: its allocation's nodes)."""
    def start(request: RunRequest, nodes: list, display) -> dict[str, Any]:
        if backend.capabilities.attached_here:
            return run_attempt(backend, request, nodes, display=display)
        from launcher.pipeline.handover import follow_handed_over, hand_over

        return follow_handed_over(backend, hand_over(backend, request), display=display)

    return start
