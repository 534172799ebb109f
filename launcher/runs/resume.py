"""`launch run --resume RUN_ID`: continue a stopped run from its last checkpoint.

The run continues in its own folder as a new attempt (the earlier attempt's plan, summary and
report move to attempts/<n>/; node logs are appended to), on the same nodes, with the recipe
the run started with (its copy, runs/<id>/recipe.yml) or one given on the command line. Before
anything is moved or started, the checkpoint's settings (launch_node/checkpoint_files.py .json) are
compared with the recipe's: a change that would load weights of another shape, another data
order, another world size or another compression state is refused, key by key. Every file is
read through the run folder's schemas (launcher/runs/schema.py), and a checkpoint counts only
when the trainer could load it too: its .json whole, its .pt a plain file of the size the
.json records that starts as torch.save's archive does. Otherwise launch would say "resuming
from step N" while the trainer skipped the file and started over from step 0.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.yamlfile import MAX_BYTES as MAX_RECIPE
from launcher.core.yamlfile import YamlFileError, load_yaml_text
from launcher.job.recipe import Recipe, load_recipe, recipe_from_mapping
from launcher.runs.folder import RECIPE_COPY, RunFolder
from launcher.runs.schema import MAX_SMALL, CheckpointMeta, PlanRecord, read_record
from launch_node import checkpoint_files
from train.options import resume_signature


class ResumeError(LauncherError):
    pass


@dataclass
class ResumePoint:
    folder: RunFolder
    previous_plan: PlanRecord
    recipe: Recipe
    checkpoint: checkpoint_files.CheckpointFile | None
    # Checkpoints newer than `checkpoint` that the trainer could not load, and why.
    skipped: list[str] = field(default_factory=list)

    @property
    def node_names(self) -> list[str]:
        return self.previous_plan.node_names

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder.node_dir(self.node_names[0]) / checkpoint_files.CHECKPOINT_DIR


_CHECKPOINT_JSON = re.compile(r"step-([0-9]{8,18})\.json")


def _archive_problem(path: Path, meta: CheckpointMeta, within: Path) -> str | None:
    """Why the trainer could not load the .pt, as far as launch can tell without unpickling
    it: a plain file of the recorded size whose first member is torch.save's data.pkl."""
    info = safefile.lstat(path, within=within)
    if info is None:
        return f"{path.name} is missing"
    if not stat.S_ISREG(info.st_mode):
        return f"{path.name} is not a plain file"
    if info.st_size != meta.bytes:
        return f"{path.name} is {info.st_size} bytes, its .json says {meta.bytes}"
    head = safefile.read_head(path, "checkpoint", 4096, within=within)
    name_len = int.from_bytes(head[26:28], "little") if len(head) >= 30 else 0
    name = head[30:30 + name_len]
    if head[:4] != b"PK\x03\x04" or not (name == b"data.pkl" or name.endswith(b"/data.pkl")):
        return f"{path.name} is not a torch.save archive"
    return None


def resumable_checkpoint(folder: RunFolder, ckpt_dir: Path
                         ) -> tuple[checkpoint_files.CheckpointFile | None, list[str]]:
    """The newest checkpoint in `ckpt_dir` the trainer could load, and why each newer one
    could not be."""
    skipped = []
    names = [n for n in safefile.listdir(ckpt_dir, within=folder.runs)
             if _CHECKPOINT_JSON.fullmatch(n)]
    for name in sorted(names, reverse=True):
        step = int(_CHECKPOINT_JSON.fullmatch(name)[1])
        try:
            meta = read_record(CheckpointMeta, ckpt_dir / name, within=folder.runs,
                               max_bytes=MAX_SMALL)
        except LauncherError as err:
            skipped.append(f"step {step}: {err}")
            continue
        state = ckpt_dir / f"{name.removesuffix('.json')}.pt"
        problem = (f"its .json says step {meta.step}" if meta.step != step else
                   f"its .json names {meta.file!r}" if meta.file != state.name else
                   _archive_problem(state, meta, folder.runs))
        if problem:
            skipped.append(f"step {step}: {problem}")
            continue
        return checkpoint_files.CheckpointFile(step, state, meta.model_dump()), skipped
    return None, skipped


def find_resume_point(runs_dir: str, run_id: str, recipe_arg: str | None) -> ResumePoint:
    folder = RunFolder.existing(runs_dir, run_id)
    previous = folder.read(PlanRecord, "plan.json")
    if recipe_arg is None:
        copy = folder.root / RECIPE_COPY
        if safefile.lstat(copy, within=folder.runs) is None:
            raise ResumeError(f"--resume {run_id}: the run folder keeps no copy of its recipe "
                              f"({copy}); give the recipe: launch run RECIPE --resume {run_id}")
        text = safefile.read_text(copy, "recipe", max_bytes=MAX_RECIPE, within=folder.runs)
        # Its relative paths (workdir) start where the original recipe was.
        base = previous.recipe.base_dir if previous.recipe is not None else None
        try:
            recipe = recipe_from_mapping(load_yaml_text(text, str(copy)), str(copy),
                                         base or copy.parent)
        except YamlFileError as err:
            raise ResumeError(f"--resume {run_id}: {err}") from None
    else:
        recipe = load_recipe(recipe_arg)
    point = ResumePoint(folder, previous, recipe, None)
    if not point.node_names:
        raise ResumeError(f"--resume {run_id}: {folder.root / 'plan.json'} names no nodes")
    folder.launch_record()   # a launch.json that is not launch's is refused before anything
    point.checkpoint, point.skipped = resumable_checkpoint(folder, point.checkpoint_dir)
    return point


def check_resume(point: ResumePoint, recipe: Recipe, nodes: list[str], world_size: int,
                 checkpoint_must_be_here: bool, placed_later: bool = False) -> list[str]:
    """Refuses (ResumeError, exit 2) what would break the checkpoint; returns notes for
    people. `checkpoint_must_be_here`: the head's folder is on this machine (local runs);
    over SSH the head's own disk may hold checkpoints that were never fetched.
    `placed_later`: the nodes are named when the run starts (Slurm): only their number must
    match."""
    run_id = point.folder.root.name
    if placed_later:
        if len(nodes) != len(point.node_names):
            raise ResumeError(f"--resume {run_id}: the run ran on {len(point.node_names)} "
                              f"node(s) and would now run on {len(nodes)}; pass --nodes "
                              f"{len(point.node_names)}")
    elif nodes != point.node_names:
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
    skipped = "".join(f"\n  not loadable, {why}" for why in point.skipped)
    if found is None and recipe.checkpoint.mirror is not None:
        from launcher.job.mirror import newest_mirrored

        found = newest_mirrored(recipe.checkpoint.mirror, run_id, point.folder.uid,
                                required=checkpoint_must_be_here)
    if found is None:
        where = point.checkpoint_dir
        if checkpoint_must_be_here:
            why = ("the run stopped before its first one" if not point.skipped else
                   "the trainer would start over from step 0")
            raise ResumeError(f"--resume {run_id}: no complete checkpoint in {where}: {why}. "
                              f"Start a new run instead{skipped}")
        return [f"no checkpoint fetched into {where}; the head's own folder is checked when "
                f"the trainer starts{skipped}"]
    saved = found.meta["signature"]
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
               "starts" if found.state != point.checkpoint_dir / found.name else "")
            + skipped]
