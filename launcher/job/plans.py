"""A run's whole plan from its request, the same for every backend: one command per node
(launcher/job/runplan.py), then the checkpoint mirror's watcher and restores (launcher/job/
mirror.py) and a spot watcher on each spot node (launcher/job/spot.py). A backend supplies only
where things are on its nodes (the placements) and how the head is addressed."""

from __future__ import annotations

from typing import Any

from launcher.cluster.inventory import Node
from launcher.job.mirror import with_mirror
from launcher.job.runplan import Placement, RunPlan, plan_run
from launcher.job.spot import with_spot_watch


def plan_request(request: Any, nodes: list[Node], placements: dict[str, Placement], *,
                 rdzv_port: int, uid: str = "UID", attempt: int | str = 0,
                 notes: tuple[str, ...] = (), rdzv_host: str | None = None,
                 node_cluster_env: dict[str, str] | None = None) -> RunPlan:
    """`request`: launcher/execute/request.py RunRequest (its recipe, job, workdir, run id)."""
    plan = plan_run(request.recipe, nodes, request.run_id, placements, rdzv_port=rdzv_port,
                    notes=notes, job=request.job, workdir=request.workdir, attempt=attempt,
                    rdzv_host=rdzv_host, node_cluster_env=node_cluster_env, uid=uid)
    plan = with_mirror(plan, request.recipe, placements, uid)
    return with_spot_watch(plan, nodes, placements)
