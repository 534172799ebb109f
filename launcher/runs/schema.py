"""The files of a run folder as launch reads them back, each with a schema, read in one place.

launch.json, plan.json and summary.json (and what the report reads: each node's result.json,
metrics.jsonl, a bench's bandwidth.json, setup's node facts, a checkpoint's .json) are written
by launch, but a run folder can be edited, copied, truncated or planted. Every read goes
through `read_record`: the bytes through launcher/core/safefile.py (regular files, a size cap, no
link followed inside the run folder), then the schema below, which names the file and the key
of the first problem (a list where an object belongs, a string for a number, null, 1e999, a
300-digit attempt, a node name that would climb out of the folder). Each schema holds only
what launch reads; other keys are kept as they are.
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError)

from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.limits import MAX_NODES
from launcher.core.names import RULES, component_problem
from launcher.core.yamlfile import shorten

MAX_RECORD = 32 * safefile.MIB        # plan.json of 4096 nodes with their env is a few MB
MAX_SMALL = 1 * safefile.MIB          # launch.json, a checkpoint's .json, node facts
MAX_METRICS_TAIL = 16 * safefile.MIB  # the report averages the last logged steps
MAX_STEP = 10**12
MAX_ATTEMPT = 10**6


class RunFileError(LauncherError):
    """A run folder's file that is not what launch writes; names the file and the key."""

    def __init__(self, path: str | Path, key: str, why: str):
        self.path, self.key, self.why = str(path), key, why
        super().__init__(f"{path}: {key + ': ' if key else ''}{why}")


def _word(value: str) -> str:
    if not (0 < len(value) <= 32 and all(c.isascii() and (c.isalpha() or c in "_-")
                                         for c in value)):
        raise ValueError("expected one short word (letters, '_', '-')")
    return value


def _stamp(value: str) -> str:
    # <run id>.<hex>: it is matched against processes' environments, so no other text.
    why = RULES["run id"].problem(value)
    if why:
        raise ValueError(f"not a run stamp launch writes: {why}")
    return value


def _folder_name(value: str) -> str:
    why = component_problem(value)
    if why:
        raise ValueError(f"not a node name launch writes: {why}")
    return value


Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
# A loss is shown as it is: a diverged run's is nan (json writes NaN), and says so.
Loss = Annotated[float, Strict()]
Seconds = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
NonNegative = Seconds
Share = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_STEP)]
Step = Count
Text = Annotated[str, Strict(), Field(max_length=100_000)]
Short = Annotated[str, Strict(), Field(max_length=4096)]
# A status or state: one short word (shown in tables and compared, never trusted further).
Word = Annotated[str, Strict(), AfterValidator(_word)]
NodeName = Annotated[str, Strict(), AfterValidator(_folder_name)]


def _uid(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{8}", value):
        raise ValueError("expected 8 hexadecimal digits (launch writes it)")
    return value


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# ---- launch.json -------------------------------------------------------------------------

class LaunchRecord(_Record):
    """Who runs the run: written when the folder is made (launcher/runs/folder.py)."""

    run_id: Short | None = None
    # The run's own id: it names the run's folders on SSH nodes (launcher/backends/ssh/backend.py).
    uid: Annotated[str, Strict(), AfterValidator(_uid)] | None = None
    stamp: Annotated[str, Strict(), AfterValidator(_stamp)] | None = None
    pid: Annotated[int, Strict(), Field(ge=1, le=2**31)] | None = None
    host: Short | None = None
    started_at: Short | None = None
    attempt: Annotated[int, Strict(), Field(ge=1, le=MAX_ATTEMPT)] = 1


# ---- plan.json ---------------------------------------------------------------------------

class PlanNode(_Record):
    name: NodeName
    address: Short | None = None
    gpus: Annotated[int, Strict(), Field(ge=0, le=4096)] | None = None
    argv: list[Short] = []
    env: dict[str, Text] = {}
    instance_type: Short | None = None
    job_dir: Short | None = None      # the job's own folder on the node (job_folder.py)


class PlanRecipe(_Record):
    name: Short | None = None
    source: Short | None = None
    base_dir: Short | None = None     # where its relative paths (workdir) start


class PlanRecord(_Record):
    run_id: Short | None = None
    backend: Word | None = None
    recipe: PlanRecipe | None = None
    nnodes: Annotated[int, Strict(), Field(ge=0, le=MAX_NODES)] | None = None
    world_size: Count | None = None
    nodes: Annotated[list[PlanNode], Field(max_length=MAX_NODES)] = []

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]


# ---- summary.json ------------------------------------------------------------------------

class Restart(_Record):
    node: Short
    kind: Short
    reason: Text
    at_time_s: Seconds
    resumed_from_step: Step | None = None
    steps_lost: Step | None = None
    recovered_in_s: Seconds | None = None
    reached_step: Step | None = None
    next_step: Step | None = None
    # False for the failure beyond the restart budget, which ended the run.
    restarted: Annotated[bool, Strict()] = True


class RankVerdict(_Record):
    node: Short
    rank: Count | None = None
    state: Short | None = None
    frame: Text | None = None


class Hang(_Record):
    detected_at_s: Seconds
    idle_s: Seconds
    timeout_s: Seconds
    action: Word
    stuck: list[RankVerdict] = []
    in_collective: list[RankVerdict] = []
    dumps: list[Short] = []


class Phase(_Record):
    name: Short
    s: Seconds


class TimeLoss(_Record):
    kind: Word | None = None
    what: Short
    s: Seconds


class TimelineRecord(_Record):
    """summary.json `timeline` (launcher/runs/timeline.py): the phases add up to wall_s."""

    wall_s: Seconds
    phases: Annotated[list[Phase], Field(max_length=64)] = []
    training_losses: Annotated[list[TimeLoss], Field(max_length=10_000)] = []
    largest_losses: Annotated[list[TimeLoss], Field(max_length=64)] = []
    kept_steps_s: Seconds | None = None
    goodput: Share | None = None
    first_step_s: Seconds | None = None


class SummaryRecord(_Record):
    run_id: Short | None = None
    status: Word | None = None
    recipe: Short | None = None
    nnodes: Annotated[int, Strict(), Field(ge=0, le=MAX_NODES)] | None = None
    world_size: Count | None = None
    # LAUNCH_ATTEMPT of the job's last start (run folders written before it counted launches
    # from 1).
    attempt: Annotated[int, Strict(), Field(ge=0, le=MAX_ATTEMPT)] | None = None
    resumed_from_step: Step | None = None
    restarts: list[Restart] = []
    hang: Hang | None = None
    rank0_node: NodeName | None = None
    steps: Step | None = None
    final_loss: Loss | None = None
    eval_accuracy: Share | None = None
    images_per_sec: NonNegative | None = None
    started_at: Short | None = None
    finished_at: Short | None = None
    duration_s: Seconds | None = None
    slurm: dict[str, Any] | None = None
    # A job of the user's own: what ran, and the steps its LAUNCH_STEP lines reported.
    job: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    # Where the wall time went, and goodput (launcher/runs/timeline.py).
    timeline: TimelineRecord | None = None


# ---- what the report reads ---------------------------------------------------------------

class Straggler(_Record):
    node: Short
    rank: Count
    ratio: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
    intervals: Count


class StepSplit(_Record):
    """The mean step and its mean parts (train/stepsplit.py): step = compute + data wait +
    communication wait."""

    statistic: Word | None = None
    steps: Count
    step_s: Seconds
    compute_s: Seconds
    data_wait_s: Seconds
    comm_wait_s: Seconds
    comm_share: Share | None = None


class RankTime(StepSplit):
    node: Short
    rank: Count


class AutoChoice(_Record):
    choice: Short
    reason: Text = ""
    decided_at_step: Step | None = None
    allreduce_step_s: Seconds | None = None
    powersgd_step_s: Seconds | None = None
    last_steps_used: Short | None = None


class DDPRecord(_Record):
    comm_hook: Short | None = None


class ResultRecord(_Record):
    """A node's result.json: the trainer's final numbers (train/main.py)."""

    backend: Word | None = None
    steps: Step | None = None
    final_loss: Loss | None = None
    eval_accuracy: Share | None = None
    images_per_sec: NonNegative | None = None
    step_time_s: Seconds | None = None        # the median step (behind images/s)
    step_split: StepSplit | None = None
    ddp: DDPRecord | None = None
    auto: AutoChoice | None = None
    stragglers: list[Straggler] | None = None
    rank_times: list[RankTime] | None = None


class BackendRecord(_Record):
    """The one key the report reads from a node's result.json or a bench's results file."""

    backend: Word | None = None


class MetricsLine(_Record):
    """One line of metrics.jsonl (rank 0's logged steps)."""

    step: Step | None = None
    loss: Loss | None = None
    images_per_sec: NonNegative | None = None
    step_time_s: Seconds | None = None
    split: StepSplit | None = None


class ProgressLine(_Record):
    """One line of progress.jsonl: a LAUNCH_STEP line of a user's job (launcher/runs/progress.py)."""

    step: Step
    loss: Loss | None = None
    busy_s: Seconds | None = None
    samples: Count | None = None
    t: Seconds | None = None


class Measured(_Record):
    algbw: Seconds | None = None
    busbw: Seconds | None = None


class BandwidthRow(_Record):
    size: Count
    out_of_place: Measured | None = None
    in_place: Measured | None = None


class LinkPeakRecord(_Record):
    gbps: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
    label: Short


class BandwidthRecord(_Record):
    """A bench's bandwidth.json (launcher/nccl/sweep.py)."""

    collective: Word | None = None
    rows: Annotated[list[BandwidthRow], Field(max_length=10_000)] = []
    nnodes: Annotated[int, Strict(), Field(ge=1, le=MAX_NODES)] | None = None
    ranks: Annotated[int, Strict(), Field(ge=1, le=10**7)] | None = None
    instance_type: Short | None = None
    link_peak: LinkPeakRecord | None = None
    peak_busbw: Seconds | None = None
    wrong_total: Count | None = None


class NodeFacts(_Record):
    """What `launch setup` fetched from a node ($LAUNCH_HOME/clusters/*/facts/<node>.json)."""

    topology: Text | None = None
    efa_devices: Annotated[int, Strict(), Field(ge=0, le=1024)] | None = None


class CheckpointMeta(_Record):
    """A checkpoint's .json (train/checkpoint.py): complete only with it."""

    format: Annotated[int, Strict(), Field(ge=1, le=1000)]
    step: Step
    epoch: Count
    offset: Count
    signature: dict[str, Any]
    bytes: Annotated[int, Strict(), Field(ge=1)]
    file: Short


# ---- reading -----------------------------------------------------------------------------

Model = TypeVar("Model", bound=BaseModel)


def _key(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "constrained-")) or part in (
                "int", "float", "str", "bool", "list", "dict", "none"):
            continue   # union branch names pydantic adds: not a key of the file
        else:
            out += ("." if out else "") + str(part)
    return out


def validate(model: type[Model], data: Any, path: str | Path) -> Model:
    """`data` (parsed JSON) as `model`, or RunFileError naming the file and the key."""
    if not isinstance(data, dict):
        raise RunFileError(path, "", f"expected a JSON object, got {shorten(data, 60)}: the "
                                     "file is not what launch writes")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ").replace("Input should be", "expected")
        said = ("missing" if err["type"] == "missing" else
                f"{msg} (got {shorten(err.get('input'), 60)})")
        raise RunFileError(path, _key(err["loc"]), f"{said}: the file is not what launch "
                                                   "writes") from None


def read_record(model: type[Model], path: str | Path, *, within: Path | None,
                max_bytes: int = MAX_RECORD) -> Model:
    """One JSON file of a run folder as `model`. `within`: the folder under which no link is
    followed (a run folder's parent: launcher/runs/folder.py)."""
    try:
        data = safefile.read_json(path, Path(path).name, max_bytes=max_bytes, within=within)
    except safefile.UnsafeFile as err:
        if err.why.startswith("not valid JSON"):
            raise RunFileError(path, "", f"{err.why}; the run may have been killed while "
                                         "writing it") from None
        raise
    return validate(model, data, path)


def read_lines(model: type[Model], path: str | Path, *, within: Path | None,
               max_bytes: int = MAX_METRICS_TAIL,
               problems: list[str] | None = None) -> list[Model]:
    """A JSON-lines file's records that fit the model, from its last `max_bytes`. The last
    line may be cut (the one being written when a run was killed) and is dropped quietly; any
    other line that does not fit is dropped and, with `problems`, counted there with the first
    one's file, line and key."""
    text = safefile.read_text(path, Path(path).name, max_bytes=max_bytes, within=within,
                              tail=True)
    lines = text.splitlines()
    out, bad = [], []
    for number, line in enumerate(lines, 1):
        try:
            out.append(validate(model, safefile.loads_json(line, path), path))
        except LauncherError as err:
            if number < len(lines):
                bad.append(f"line {number}: {str(err).removeprefix(f'{path}: ')}")
    if bad and problems is not None:
        problems.append(f"{path}: {len(bad)} line(s) skipped, first {bad[0]}")
    return out
