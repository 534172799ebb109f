"""`launch run --resume RUN_ID`: continue a stopped run from its last checkpoint.

The run continues in its own folder as a new attempt (the earlier attempt's plan, summary and
report move to attempts/<n>/; node logs are appended to), on the same nodes, with the recipe
the run started with (its copy, runs/<id>/recipe.yml) or one given on the command line. Before
anything is moved or started, the checkpoint's settings (train/checkpoint_files.py .json) are
compared with the recipe's: a change that would load weights of another shape, another data
order, another world size or another compression state is refused, key by key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import LauncherError
from launcher.recipe import Recipe, load_recipe
from launcher.runfolder import RECIPE_COPY, RunFolder
from train import checkpoint_files
from train.options import resume_signature


class ResumeError(LauncherError):
    pass


@dataclass
class ResumePoint:
    folder: RunFolder
    previous_plan: dict[str, Any]
    recipe: Recipe
    checkpoint: checkpoint_files.CheckpointFile | None

    @property
    def node_names(self) -> list[str]:
        return [n["name"] for n in self.previous_plan.get("nodes", [])]

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder.node_dir(self.node_names[0]) / checkpoint_files.CHECKPOINT_DIR


def find_resume_point(runs_dir: str, run_id: str, recipe_arg: str | None) -> ResumePoint:
    folder = RunFolder.existing(runs_dir, run_id)
    try:
        previous = json.loads((folder.root / "plan.json").read_text())
    except (OSError, ValueError) as err:
        raise ResumeError(f"--resume {run_id}: cannot read {folder.root / 'plan.json'}: {err}"
                          ) from None
    if recipe_arg is None:
        copy = folder.root / RECIPE_COPY
        if not copy.is_file():
            raise ResumeError(f"--resume {run_id}: the run folder keeps no copy of its recipe "
                              f"({copy}); give the recipe: launch run RECIPE --resume {run_id}")
        # Its relative paths (workdir) start where the original recipe was.
        base = (previous.get("recipe") or {}).get("base_dir") if isinstance(previous, dict) \
            else None
        recipe = load_recipe(copy, base_dir=base if isinstance(base, str) else None)
    else:
        recipe = load_recipe(recipe_arg)
    point = ResumePoint(folder, previous, recipe, None)
    if not point.node_names:
        raise ResumeError(f"--resume {run_id}: {folder.root / 'plan.json'} names no nodes")
    point.checkpoint = checkpoint_files.latest(point.checkpoint_dir)
    return point


def check_resume(point: ResumePoint, recipe: Recipe, nodes: list[str], world_size: int,
                 checkpoint_must_be_here: bool) -> list[str]:
    """Refuses (ResumeError, exit 2) what would break the checkpoint; returns notes for
    people. `checkpoint_must_be_here`: the head's folder is on this machine (local runs);
    over SSH the head's own disk may hold checkpoints that were never fetched."""
    run_id = point.folder.root.name
    if nodes != point.node_names:
        raise ResumeError(
            f"--resume {run_id}: the run ran on {', '.join(point.node_names)} (head "
            f"{point.node_names[0]}, which holds the checkpoints) and would now run on "
            f"{', '.join(nodes)}; resume on the same nodes (--nodes, -i/--cluster, --limit)")
    if not recipe.is_trainer:
        # A job of the user's own gets its LAUNCH_CHECKPOINT_DIR back and decides itself what
        # to continue from.
        return [f"resuming run {run_id}: LAUNCH_CHECKPOINT_DIR is the run's own again, "
                f"LAUNCH_ATTEMPT continues from the earlier attempts"]
    if recipe.checkpoint is None:
        raise ResumeError(f"--resume {run_id}: {recipe.source} has no `checkpoint:` block, so "
                          "the trainer would neither load nor write checkpoints; resume with "
                          "the recipe the run started with")
    found = point.checkpoint
    if found is None and recipe.checkpoint.mirror is not None:
        from launcher.mirror import newest_mirrored

        found = newest_mirrored(recipe.checkpoint.mirror, run_id, point.folder.uid,
                                required=checkpoint_must_be_here)
    if found is None:
        where = point.checkpoint_dir
        if checkpoint_must_be_here:
            raise ResumeError(f"--resume {run_id}: no complete checkpoint in {where}: the run "
                              "stopped before its first one. Start a new run instead")
        return [f"no checkpoint fetched into {where}; the head's own folder is checked when "
                "the trainer starts"]
    saved = found.meta.get("signature") or {}
    now = resume_signature(recipe.model_dump(), world_size)
    problems = [f"{key}: the checkpoint has {saved.get(key)!r}, this run {value!r}"
                for key, value in now.items() if saved.get(key) != value]
    if problems:
        raise ResumeError(
            f"--resume {run_id}: checkpoint {found.state} was written under other settings "
            f"than {recipe.source}, and cannot be continued:\n  " + "\n  ".join(problems)
            + "\nResume with the recipe the run started with, or start a new run")
    return [f"resuming run {run_id} from checkpoint step {found.step} ({found.state})"
            + (": the head's copy is gone; the mirror's is brought back before the trainer "
               "starts" if found.state != point.checkpoint_dir / found.name else "")]
