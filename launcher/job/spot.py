"""Spot nodes in a run: EC2 may take one back with two minutes' notice.

A node whose inventory says `launch_market: spot` (what `launch provision --market spot`
writes) gets a watcher beside the job (launch_node/spot.py: instance metadata's
`spot/instance-action`, read with IMDSv2). On a notice it sends the node's ranks the
last-chance signal (SIGUSR1), and the run that then fails is "preempted" (exit 75), not
"failed". Every rank of such a run gets LAUNCH_INTERRUPTIBLE=1: the bundled trainer's ranks
then agree each step whether one of them got the signal (a one-number all-reduce), so the
checkpoint it takes is a collective at the same step everywhere.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from typing import Any

from launcher.cluster.inventory import MARKET_VAR, Node
from launcher.job.runplan import NodeCommand, RunPlan
from launch_node.spot import INTERRUPTIBLE_ENV

LABEL = "spot"


def interruptible(node: Node) -> bool:
    return node.extra.get(MARKET_VAR) == "spot"


def with_spot_watch(plan: RunPlan, nodes: list[Node], placements: dict[str, Any]) -> RunPlan:
    """The plan with a watcher on each spot node, and every rank told the run can be
    interrupted; as it was when no node is spot."""
    spot = [n for n in nodes if interruptible(n)]
    if not spot:
        return plan
    commands = tuple(replace(c, env={**c.env, INTERRUPTIBLE_ENV: "1"}) for c in plan.nodes)
    by_name = {c.name: c for c in commands}
    watchers = []
    for node in spot:
        command, place = by_name[node.name], placements[node.name]
        watchers.append(NodeCommand(
            name=node.name, address=command.address, private_address=command.private_address,
            is_head=command.is_head, gpus=0,
            argv=(place.python, posixpath.join(place.code_dir, "launch_node", "spot.py"), "watch",
                  command.run_dir),
            env={"LAUNCH_RUN_ID": plan.run_id, "LAUNCH_NODE": node.name,
                 "PYTHONUNBUFFERED": "1"},
            run_dir=command.run_dir, cwd=command.cwd, instance_type=command.instance_type))
    return replace(plan, nodes=commands, spot=tuple(watchers))
