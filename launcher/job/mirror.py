"""Checkpoints mirrored off the head (recipe `checkpoint.mirror`): where, by which process, and
what the run's summary says of it. The node side is launch_node/mirror.py; this is the plan.

    checkpoint:
      every_steps: 100
      mirror: s3://my-bucket/checkpoints       # or /fsx/checkpoints (every node mounts it)

Each run mirrors into a folder of its own, `<mirror>/<run_id>.<uid>` (the uid of
launcher/runs/folder.py: a new run that reuses an id never sees an earlier run's checkpoints,
a restart or `--resume` of the same run does). What is mirrored is the head's checkpoint
folder: the bundled trainer's (its keeper is the head's local rank 0), or a job's
LAUNCH_CHECKPOINT_DIR as the head sees it. One process on the head (`watch`) uploads while the
job trains; before the job starts, `restore` brings back what the node's folder lacks (the
trainer's newest checkpoint on the head; every checkpoint of a job on every node), and checks
that the mirror can be written before anything trains.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.job.runplan import NodeCommand
from launch_node.checkpoint_files import CHECKPOINT_DIR as CHECKPOINTS
from launch_node.mirror import STATUS_FILE

# How long the end of a run waits for the watcher's last uploads (it exits as soon as they
# are in); a checkpoint still uploading after that is not in the mirror (no manifest).
DRAIN_S = 600.0
LABEL = "mirror"


def mirror_dest(mirror: str, run_id: str, uid: str) -> str:
    return f"{mirror.rstrip('/')}/{run_id}.{uid}"


@dataclass(frozen=True)
class MirrorPlan:
    """The watcher on the head (a service of the run, started before the job and stopped
    after it) and the restores run on the nodes before the job."""

    dest: str
    layout: str                       # trainer | job
    folder: str                       # the head's checkpoint folder
    watch: NodeCommand
    restore: tuple[NodeCommand, ...]  # one per node whose folder may need it

    def to_json(self) -> dict[str, Any]:
        return {"dest": self.dest, "layout": self.layout, "folder": self.folder,
                "watch": self.watch.to_json(), "restore": [r.to_json() for r in self.restore]}

    def render(self) -> list[str]:
        what = ("the trainer's checkpoints" if self.layout == "trainer"
                else "LAUNCH_CHECKPOINT_DIR")
        lines = ["", f"checkpoint mirror: {what} on {self.watch.name} ({self.folder}) -> "
                     f"{self.dest}",
                 f"  before the job, on {', '.join(r.name for r in self.restore)}: what the "
                 "mirror has and the folder lacks is brought back",
                 f"  beside the job on {self.watch.name}: " + shlex.join(self.watch.argv)]
        return lines


def with_mirror(plan: Any, recipe: Any, placements: dict[str, Any], uid: str) -> Any:
    """The RunPlan with its checkpoint mirror (recipe `checkpoint.mirror`), or as it was.
    The watcher runs on the head; restores run where a checkpoint folder is: the head's for
    the trainer, every node's for a job (nodes with disks of their own), once per folder of a
    machine (local nodes share one)."""
    mirror = recipe.checkpoint.mirror if recipe.checkpoint is not None else None
    if mirror is None:
        return plan
    head = plan.nodes[0]
    if plan.job.is_trainer:
        layout, folders = "trainer", {head.name: posixpath.join(head.run_dir, CHECKPOINTS)}
    else:
        layout, folders, seen = "job", {}, set()
        for node in plan.nodes:
            folder = placements[node.name].checkpoint_dir
            if folder and (node.address, folder) not in seen:
                seen.add((node.address, folder))
                folders[node.name] = folder
    dest = mirror_dest(mirror, plan.run_id, uid)
    base = {"LAUNCH_RUN_ID": plan.run_id, "PYTHONUNBUFFERED": "1", **recipe.env_strings()}
    by_name = {n.name: n for n in plan.nodes}

    def command(name: str, argv: list[str], **where: Any) -> NodeCommand:
        node, place = by_name[name], placements[name]
        return NodeCommand(name=name, address=node.address,
                           private_address=node.private_address, is_head=node.is_head, gpus=0,
                           argv=(place.python, posixpath.join(place.code_dir, "launch_node",
                                                              "mirror.py"), *argv),
                           env={**base, "LAUNCH_NODE": name}, run_dir=node.run_dir,
                           cwd=node.cwd, instance_type=node.instance_type, service=True,
                           **where)

    watch = command(head.name, ["watch", folders[head.name], dest, "--layout", layout,
                                "--status", posixpath.join(head.run_dir, STATUS_FILE)])
    run = json.dumps({"run_id": plan.run_id, "uid": uid, "layout": layout})
    restore = tuple(command(name, ["restore", folder, dest, "--layout", layout,
                                   "--run-json", run]) for name, folder in folders.items())
    return replace(plan, mirror=MirrorPlan(dest, layout, folders[head.name], watch, restore))


def mirror_summary(run_dir: Path, head: str) -> dict[str, Any] | None:
    """The watcher's account (mirror.json in the head's folder, fetched with it)."""
    try:
        return json.loads((run_dir / head / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None



@dataclass(frozen=True)
class MirroredCheckpoint:
    """The newest complete checkpoint of a run's mirror, as launch checks it before a resume
    (the trainer's .json is in its manifest)."""

    step: int
    meta: dict[str, Any]
    state: str        # where it is, for messages
    name: str


def newest_mirrored(mirror: str, run_id: str, uid: str | None, *,
                    required: bool) -> MirroredCheckpoint | None:
    """The mirror's newest trainer checkpoint, asked from this machine. Unreachable from here
    (no credentials, no mount): an error when `required` (this machine is the head, whose
    restore would fail alike), else None (the head asks when the run starts)."""
    from launcher.core.errors import LauncherError
    from launch_node.mirror import newest, object_key, store_for

    if uid is None:
        return None
    dest = mirror_dest(mirror, run_id, uid)
    try:
        found = newest(store_for(dest))
    except Exception as err:  # noqa: BLE001 (MirrorError, or boto3's own: credentials)
        if required:
            raise LauncherError(f"--resume {run_id}: the checkpoint mirror {dest} cannot be "
                                f"read from here: {err}") from None
        return None
    if found is None or not isinstance(found.get("meta"), dict):
        return None
    name = f"{found['unit']}.pt"
    return MirroredCheckpoint(int(found["order"]), found["meta"],
                              f"{dest}/{object_key(found['unit'], found['version'], name)}",
                              name)
