"""Recipes: what to run and how, validated when loaded.

A recipe is YAML. It runs either the user's own job (`job:` a script, module or command, with
its `workdir:` shipped to every node and `setup:` commands) or the bundled ViT trainer
(`train:` and `ddp:`). Unknown keys, wrong types and combinations that cannot work are rejected
here, with the file and the key path, instead of at step 1 on a cluster that bills by the hour.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError,
                      field_validator, model_validator)

from launcher.core.errors import RecipeError
from launcher.core.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launcher.core.names import control_problem, name_problem
from launcher.core.yamlfile import YamlFileError, load_yaml_file, shorten
from launcher.job.sbatch_args import SbatchArgError, normalize
from train.options import (AUTO, AUTO_MEASURE_STEPS, BY_KEY, COMM_HOOKS, MODELS, POWERSGD_HOOKS,
                           POWERSGD_WIRES, PRECISIONS, auto_trial_steps, lr_warmup_steps)

# (width, heads) of the standard sizes, as in train/model.py VIT_SIZES: loading a recipe
# must not import torch (a second of start-up for every command).
VIT_WIDTH_HEADS = {"vit_tiny": (192, 3), "vit_s16": (384, 6), "vit_b16": (768, 12)}
MAX_ARGS = 4096
MAX_ARG = 64 * 1024
MAX_SETUP = 64
MAX_ENV_VALUE = 4096
MAX_RESTARTS = 1000

# Environment names a recipe may not set, and why. Everything else passes through (NCCL_*,
# FI_*, OMP_NUM_THREADS, LD_LIBRARY_PATH for a custom NCCL, GLOO/NCCL_SOCKET_IFNAME to
# override the interface launch found...), the recipe winning over launch's defaults.
RESERVED_ENV = {
    "LAUNCH_": "launch's own run stamp and node name: cleanup finds a run's processes by them",
    "TORCHELASTIC_": "torchrun's own variables",
    "RANK": "torchrun assigns ranks", "LOCAL_RANK": "torchrun assigns ranks",
    "GROUP_RANK": "torchrun assigns ranks", "ROLE_RANK": "torchrun assigns ranks",
    "WORLD_SIZE": "torchrun sets it from nodes x nproc_per_node",
    "LOCAL_WORLD_SIZE": "torchrun sets it from nproc_per_node",
    "MASTER_ADDR": "torchrun sets it from the rendezvous",
    "MASTER_PORT": "torchrun sets it from the rendezvous",
    "CUDA_VISIBLE_DEVICES": "launch splits GPUs between local nodes; use nproc_per_node",
    "PATH": "the node's interpreter and tools are found through it",
    "PYTHONHOME": "the node's interpreter depends on it",
    "PYTHONUNBUFFERED": "launch needs the workers' lines as they are printed",
    "LD_PRELOAD": "a preloaded library changes every process launch starts, cleanup included",
    "NCCL_DEBUG_FILE": "the run report reads NCCL's logs from the file launch names",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "launch's hang forensics asks each rank for its NCCL "
                                       "flight recorder through the pipe it names",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "restarted node agents rejoin only with launch's "
                                          "setting (see launcher/job/runplan.py)",
}


# launch's own settings read on the node, which a recipe's env: or --env may give, each with
# what its value must be: checked here, before a run starts, not by each node's first rank.
SETTINGS_ENV = {
    "LAUNCH_JOB_FOLDERS_KEPT": "a whole number of runs, 1 or more",   # launch_node/job_folder.py
}


def env_value_problem(name: str, value: str) -> str | None:
    """Why `value` cannot be given to the setting `name` (SETTINGS_ENV), or None."""
    if name in SETTINGS_ENV and not (value.isascii() and value.isdigit() and len(value) < 10
                                     and int(value) >= 1):
        return f"the value {shorten(value)} is not {SETTINGS_ENV[name]}"
    return None


def reserved_env_reason(name: str) -> str | None:
    if name in SETTINGS_ENV:
        return None
    for prefix, why in RESERVED_ENV.items():
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return why
    return None


def env_name_problem(name: str) -> str | None:
    """Why a recipe may not set the environment variable `name` (the one rule for the recipe's
    env: and for sbatch's --export), or None."""
    why = name_problem("environment variable name", name)
    if why:
        return f"{shorten(name)} is not a valid environment variable name: {why}"
    reserved = reserved_env_reason(name)
    if reserved:
        return f"{name} is set by launch and cannot come from a recipe ({reserved})"
    return None


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


WholeNumber = Annotated[int, Strict()]
Number = Annotated[float, BeforeValidator(_no_bool)]
Switch = Annotated[bool, Strict()]


def _field(key: str) -> Any:
    """The recipe field for one of the trainer's options: its default, bounds and help come
    from train/options.py, the one declaration the trainer parses too."""
    option = BY_KEY[key]
    bounds: dict[str, Any] = {}
    if option.low is not None:
        bounds["ge"] = option.low
    if option.high is not None:
        bounds["le"] = option.high
    if option.kind == "float":
        bounds["allow_inf_nan"] = False
    return Field(option.default, description=option.help, **bounds)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rendezvous(_Strict):
    port: WholeNumber = Field(29500, ge=1024, le=65535)
    # Seconds the node agents wait for each other before giving up (c10d join_timeout).
    timeout: WholeNumber = Field(600, ge=10, le=86400)


class Train(_Strict):
    model: Literal[MODELS] = _field("train.model")
    # Optional overrides of the standard size (e.g. a shallower model for a CPU demo).
    depth: WholeNumber | None = _field("train.depth")
    width: WholeNumber | None = _field("train.width")
    heads: WholeNumber | None = _field("train.heads")
    dataset: str = _field("train.dataset")
    image_size: WholeNumber = _field("train.image_size")
    patch_size: WholeNumber = _field("train.patch_size")
    batch_size: WholeNumber = _field("train.batch_size")
    steps: WholeNumber | None = _field("train.steps")
    epochs: Number | None = _field("train.epochs")
    lr: Number = _field("train.lr")
    weight_decay: Number = _field("train.weight_decay")
    warmup_steps: WholeNumber | None = _field("train.warmup_steps")
    precision: Literal[PRECISIONS] = _field("train.precision")
    seed: WholeNumber = _field("train.seed")
    grad_accum_steps: WholeNumber = _field("train.grad_accum_steps")
    num_workers: WholeNumber = _field("train.num_workers")
    log_every: WholeNumber = _field("train.log_every")
    save_model: Switch = _field("train.save_model")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not value.strip() or len(value) > 4096 or "\0" in value:
            raise ValueError("expected synthetic, digits or the path of an image folder")
        return value

    @model_validator(mode="after")
    def _length(self) -> Train:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("set exactly one of steps or epochs")
        return self


class PowerSGD(_Strict):
    rank: WholeNumber = _field("ddp.powersgd.rank")
    start_iter: WholeNumber = _field("ddp.powersgd.start_iter")
    warm_start: Switch = _field("ddp.powersgd.warm_start")
    error_feedback: Switch = _field("ddp.powersgd.error_feedback")
    wire: Literal[POWERSGD_WIRES] = _field("ddp.powersgd.wire")
    hook: Literal[POWERSGD_HOOKS] = _field("ddp.powersgd.hook")


class DDP(_Strict):
    static_graph: Switch = _field("ddp.static_graph")
    gradient_as_bucket_view: Switch = _field("ddp.gradient_as_bucket_view")
    # auto: the trainer times all-reduces on the real process group before building DDP and
    # picks the bucket size from the measured latency and bandwidth (train/ddp.py).
    bucket_cap_mb: float | Literal["auto"] = Field(BY_KEY["ddp.bucket_cap_mb"].default)
    # auto: plain all-reduce first while the trainer measures how long it waits on
    # communication; PowerSGD (the powersgd block's rank) only if a trial shows it pays.
    comm_hook: Literal[COMM_HOOKS] = _field("ddp.comm_hook")
    powersgd: PowerSGD = PowerSGD()

    @field_validator("bucket_cap_mb", mode="before")
    @classmethod
    def _bucket(cls, value: Any) -> float | str:
        if value == AUTO:
            return value
        option = BY_KEY["ddp.bucket_cap_mb"]
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = float("nan")
        if isinstance(value, bool) or not option.low <= number <= option.high:
            raise ValueError(f"expected a size in MiB between {option.low:g} and "
                             f"{option.high:g}, or 'auto' (got {shorten(value)})")
        return number


class Gate(_Strict):
    # The bus bandwidth (GB/s) every pair of nodes must reach in the collective gate (`launch
    # run --gate`); unset: each node is judged against the others.
    min_busbw_gbs: Number | None = Field(None, gt=0, allow_inf_nan=False)


def _slurm_name(kind: str, value: str | None) -> str | None:
    why = None if value is None else name_problem(kind, value)
    if why:
        raise ValueError(f"{shorten(value)} is not a {kind}: {why}")
    return value


class Slurm(_Strict):
    """How `launch run --slurm` asks Slurm for the nodes; the flags of the same names win."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    # Interpreter with torch on the compute nodes, found on the PATH the job inherits from
    # the shell that runs launch (sbatch exports it), unless a path.
    python: str = "python3"
    # GPUs to ask for on each node; default: the count in the partition's GRES (gpu:N).
    gpus_per_node: WholeNumber | None = Field(None, ge=0, le=MAX_PROCS_PER_NODE)
    # Whole nodes: every CPU (OMP threads, data loading) and GPU of each node for this job.
    exclusive: Switch = True
    sbatch_args: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        return _slurm_name("Slurm partition name", value)

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        return _slurm_name("Slurm account name", value)

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        return _slurm_name("Slurm time limit", value)

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not value.strip() or len(value) > 4096 or any(ord(c) < 32 for c in value):
            raise ValueError("expected the interpreter's name or path on the compute nodes")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, value: list[str]) -> list[str]:
        # Checked as sbatch reads them, and kept spelled out as checked
        # (launcher/job/sbatch_args.py).
        try:
            return normalize(value, env_name_problem)
        except SbatchArgError as err:
            raise ValueError(str(err)) from None


class Checkpoint(_Strict):
    """When the trainer writes the state a run continues from (train/checkpoint.py), and
    where checkpoints are mirrored off the node that writes them (the trainer's, or a job's
    LAUNCH_CHECKPOINT_DIR: launch_node/mirror.py)."""

    every_steps: WholeNumber | None = _field("checkpoint.every_steps")
    every_minutes: Number | None = _field("checkpoint.every_minutes")
    keep: WholeNumber = _field("checkpoint.keep")
    asynchronous: Switch = _field("checkpoint.asynchronous")
    # s3://bucket/prefix, or a folder every node mounts at the same path (/fsx/ckpt, NFS).
    mirror: str | None = None

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value: str | None) -> str | None:
        from launch_node.mirror import mirror_problem

        problem = mirror_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _when(self) -> Checkpoint:
        both = self.every_steps is not None and self.every_minutes is not None
        if both or (self.every_steps is None and self.every_minutes is None
                    and self.mirror is None):
            raise ValueError("set exactly one of every_steps or every_minutes")
        return self

    @property
    def writes(self) -> bool:
        """The trainer writes checkpoints (a block with only `mirror` is a job's)."""
        return self.every_steps is not None or self.every_minutes is not None


def _plain_text(value: str, what: str) -> str:
    """A path or a word launch prints, ships or hands to a process: never a control character
    (a newline hidden in it, an escape sequence)."""
    if not value or len(value) > MAX_ARG or control_problem(value):
        raise ValueError(f"{shorten(value)}: {what} must be non-empty text of at most "
                         f"{MAX_ARG} characters without control characters (newline, tab, NUL)")
    return value


def _argv_item(value: Any) -> str:
    """One argv item, passed verbatim: text, or a YAML number written as the recipe shows it
    (3 -> "3"). A YAML boolean is refused: `--flag: true` is not what a command line holds."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{shorten(value)} is not an argument: write each item as text "
                         "(quote it: \"true\", \"1e-3\")")
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) \
        else str(value)
    if len(text) > MAX_ARG or "\0" in text:
        raise ValueError(f"{shorten(text)}: an argument holds at most {MAX_ARG} characters "
                         "and no NUL byte")
    return text


Argv = Annotated[list[Annotated[str, BeforeValidator(_argv_item)]],
                 Field(max_length=MAX_ARGS)]


class Job(_Strict):
    """The user's own job: exactly one of `script` (relative to the workdir, or absolute on
    the nodes) or `module`, each started by launch's torchrun on every node; or `command`,
    started once per node without torchrun (the user's own launcher: deepspeed, accelerate,
    mpirun, a torchrun line of their own) with the LAUNCH_* variables (docs/jobs.md).
    `args` follow verbatim, never through a shell."""

    script: str | None = None
    module: str | None = None
    command: Argv | None = None
    args: Argv = Field(default_factory=list)

    @field_validator("script")
    @classmethod
    def _script(cls, value: str | None) -> str | None:
        if value is None:
            return value
        _plain_text(value, "job.script")
        if not value.startswith("/") and (value == ".." or value.startswith("../")
                                          or "/../" in value or value.endswith("/..")):
            raise ValueError(f"{shorten(value)} leaves the workdir: give the script's path "
                             "inside the workdir, or an absolute path on the nodes")
        return value

    @field_validator("module")
    @classmethod
    def _module(cls, value: str | None) -> str | None:
        why = name_problem("Python module name", value) if value is not None else None
        if why:
            raise ValueError(f"{shorten(value)} is not a Python module name: {why}")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0].strip()):
            raise ValueError("expected the program and its arguments, e.g. [deepspeed, "
                             "train.py]; a shell line is [bash, -c, \"...\"]")
        return value

    @model_validator(mode="after")
    def _one(self) -> Job:
        given = [k for k in ("script", "module", "command") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("set exactly one of script, module or command" +
                             (f" (got {', '.join(given)})" if given else ""))
        return self


class Recipe(_Strict):
    name: str
    nodes: WholeNumber = Field(1, ge=1, le=MAX_NODES)
    nproc_per_node: int | Literal["auto"] = "auto"
    rendezvous: Rendezvous = Rendezvous()
    env: dict[str, str | int | float | bool] = {}
    # Exactly one of: the user's own job, or the bundled trainer (train: and ddp:).
    job: Job | None = None
    train: Train | None = None
    ddp: DDP = DDP()
    # The folder shipped to every node before setup, relative to the recipe file's folder;
    # the job runs in it. .gitignore and .launchignore rules are honoured (docs/jobs.md).
    workdir: str | None = None
    # Shell commands run on every node in the shipped folder before the job, again only when
    # the folder's content or the commands change.
    setup: list[str] = Field(default_factory=list, max_length=MAX_SETUP)
    gate: Gate = Gate()
    slurm: Slurm = Slurm()    # read by --slurm only
    # None: no checkpoints (a restart then starts over from step 0).
    checkpoint: Checkpoint | None = None
    # How many failures (a worker, a node agent, a hang) the run may restart after; 0 keeps
    # fail-fast. `launch run --max-restarts` overrides.
    restarts: WholeNumber = Field(0, ge=0, le=MAX_RESTARTS)
    # Seconds without a completed step before launch dumps every rank's stack and restarts or
    # stops; None: max(300 s, 20x the median step after warm-up). `--hang-timeout` overrides.
    hang_timeout_s: Number | None = Field(None, ge=1, le=7 * 86400, allow_inf_nan=False)
    # Where the recipe came from and the folder its relative paths start from (the recipe
    # file's, or the current folder for a recipe made from the command line); set by
    # load_recipe, not part of the YAML.
    source: str = Field("<recipe>", exclude=True)
    base_dir: str = Field(".", exclude=True)
    # A recipe made from the command line (`launch run train.py`) has no file: its YAML, kept
    # in the run folder as the run's recipe.yml (what `--resume` reads).
    text: str | None = Field(None, exclude=True)
    # The names of `env` that `launch run --env` gave (not part of the YAML, nor of the run's
    # recipe.yml: their values are shown masked and kept nowhere but where the ranks read them).
    command_line_env: tuple[str, ...] = Field((), exclude=True)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        return None if value is None else _plain_text(value, "workdir")

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: list[str]) -> list[str]:
        for command in value:
            if not command.strip() or len(command) > MAX_ARG or "\0" in command:
                raise ValueError(f"{shorten(command)}: each setup command is a non-empty "
                                 f"shell line of at most {MAX_ARG} characters")
        return value

    @model_validator(mode="after")
    def _what_runs(self) -> Recipe:
        if (self.job is None) == (self.train is None):
            raise ValueError("set exactly one of job (your own script, module or command) or "
                             "train (the bundled ViT trainer)")
        if self.job is not None:
            # Settings of the bundled trainer that a job of the user's own would silently
            # ignore: refused, so that nobody believes they took effect.
            if "ddp" in self.model_fields_set:
                raise ValueError("ddp: configures the bundled trainer (train:); a job of your "
                                 "own sets DDP up in its own code")
            trainer_keys = sorted(self.checkpoint.model_fields_set - {"mirror"}) \
                if self.checkpoint is not None else []
            if trainer_keys:
                raise ValueError(
                    f"checkpoint.{trainer_keys[0]}: configures the bundled trainer (train:); a "
                    "job of your own saves into $LAUNCH_CHECKPOINT_DIR when it chooses "
                    "(docs/jobs.md), and only checkpoint.mirror applies to it")
            if self.job.script and not self.job.script.startswith("/") and \
                    self.workdir is None:
                raise ValueError(f"job.script {self.job.script} is relative to the workdir: "
                                 "set workdir (e.g. workdir: . for the recipe's folder), or "
                                 "give an absolute path on the nodes")
        elif self.checkpoint is not None and not self.checkpoint.writes:
            raise ValueError("checkpoint: mirror is set but neither every_steps nor "
                             "every_minutes: set one, or the trainer writes no checkpoint to "
                             "mirror")
        return self

    @property
    def is_trainer(self) -> bool:
        return self.train is not None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        why = name_problem("recipe name", value)
        if why:
            raise ValueError(why)
        return value

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, value: Any) -> int | str:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool)
                             and 1 <= value <= MAX_PROCS_PER_NODE):
            return value
        raise ValueError(f"expected a whole number from 1 to {MAX_PROCS_PER_NODE} or 'auto' "
                         f"(got {shorten(value)})")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            why = env_name_problem(key)
            if why:
                raise ValueError(why)
            text = str(item)
            why = env_value_problem(key, text)
            if why:
                raise ValueError(f"{key}: {why}")
            if "\0" in text:
                raise ValueError(f"{key}: the value holds a NUL byte, which no environment "
                                 "variable can carry")
            if len(text) > MAX_ENV_VALUE:
                raise ValueError(f"{key}: the value is {len(text)} characters; at most "
                                 f"{MAX_ENV_VALUE}")
        return value

    def env_strings(self) -> dict[str, str]:
        """Recipe env as strings, the way a process receives it (YAML true -> "1")."""
        out = {}
        for key, value in self.env.items():
            out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


def _combination_errors(recipe: Recipe) -> list[tuple[str, str]]:
    """Settings that validate one by one but cannot work together."""
    problems: list[tuple[str, str]] = []
    if recipe.train is None:
        return problems
    ps = recipe.ddp.powersgd
    if recipe.ddp.comm_hook == "powersgd" and (ps.error_feedback or ps.warm_start) \
            and ps.start_iter <= 1:
        problems.append((
            "ddp.powersgd.start_iter",
            f"is {ps.start_iter}, but error_feedback/warm_start need start_iter > 1 (DDP "
            "rebuilds its buckets after the first iterations); use 2 or more, or turn both off",
        ))
    if recipe.ddp.comm_hook == AUTO and not (ps.error_feedback and ps.warm_start):
        off = "error_feedback" if not ps.error_feedback else "warm_start"
        problems.append((
            f"ddp.powersgd.{off}",
            "is off, but comm_hook auto runs PowerSGD as its paper does, with error feedback "
            "and warm start (without them compression loses accuracy); leave both on, or set "
            "comm_hook: powersgd to choose by hand",
        ))
    if recipe.ddp.static_graph and recipe.train.grad_accum_steps > 1:
        problems.append((
            "ddp.static_graph",
            f"cannot be combined with train.grad_accum_steps {recipe.train.grad_accum_steps}: "
            "static_graph breaks under no_sync() gradient accumulation (pytorch #58111); turn "
            "one of them off",
        ))
    t = recipe.train
    if t.image_size % t.patch_size:
        problems.append(("train.patch_size",
                         f"{t.patch_size} does not divide train.image_size {t.image_size}"))
    width, heads = t.width or VIT_WIDTH_HEADS[t.model][0], t.heads or VIT_WIDTH_HEADS[t.model][1]
    if width % heads:
        problems.append(("train.heads", f"{heads} does not divide the model width {width}"))
    return problems


def _format_location(loc: tuple) -> str:
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("int", "str", "float", "bool", "literal['auto']") or \
                str(item).startswith(("function-", "literal[")):
            continue  # union branch names pydantic adds; not a key the user wrote
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _keys_beside(loc: tuple) -> list[str]:
    """The keys the recipe allows where the unknown key `loc[-1]` was written."""
    model: Any = Recipe
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        # An optional block (`checkpoint: Checkpoint | None`) is its model too.
        models = [a for a in (annotation, *get_args(annotation))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            return []
        model = models[0]
    return [k for k in model.model_fields if k not in ("source", "base_dir", "text")]


def _explain(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    got = err.get("input")
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(err["loc"][-1]), _keys_beside(err["loc"]), n=1)
        hint = f"did you mean `{close[0]}`?" if close else "check the spelling."
        return f"unknown key ({hint} Every key is in docs/recipes.md.)"
    if kind == "missing":
        return "required key is missing"
    msg = msg.removeprefix("Value error, ")
    msg = msg.replace("Input should be", "expected")
    if kind == "value_error" or isinstance(got, dict):
        return msg
    return f"{msg} (got {shorten(got)})"


def recipe_from_mapping(data: Any, source: str, base_dir: str | Path = ".",
                        text: str | None = None) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(source, "", "a recipe must be a YAML mapping (name:, job: or train: "
                          "...)")
    if text is None and not Path(source).is_file():
        # A recipe with no file here (made by a program, or handed over from another machine)
        # carries its mapping as text: the run folder keeps it as recipe.yml, where `launch
        # compare` and `--resume` read it.
        try:
            text = yaml.safe_dump(data, sort_keys=False)
        except yaml.YAMLError:
            text = None
    try:
        recipe = Recipe.model_validate({**data, "source": source, "text": text,
                                        "command_line_env": (),
                                        "base_dir": str(Path(base_dir).resolve())})
    except ValidationError as exc:
        found: dict[str, str] = {}
        for err in exc.errors():
            # A union reports each branch; one line per key is enough.
            found.setdefault(_format_location(err["loc"]), _explain(err))
        if len(found) == 1:
            (key, why), = found.items()
            raise RecipeError(source, key, why) from None
        lines = [f"{key}: {why}" if key else why for key, why in found.items()]
        raise RecipeError(source, "", "invalid recipe:\n  " + "\n  ".join(lines)) from None
    problems = _combination_errors(recipe)
    if problems:
        if len(problems) == 1:
            raise RecipeError(source, *problems[0])
        raise RecipeError(source, "", "settings that cannot work together:\n  " +
                          "\n  ".join(f"{k}: {w}" for k, w in problems))
    return recipe


def resolve_recipe(arg: str | Path) -> Path:
    """A recipe file, or the name of a bundled recipe (`launch recipes` lists them)."""
    from launcher.core.bundled import bundled_recipe, recipe_names

    path = Path(arg)
    if path.exists():
        return path
    bundled = bundled_recipe(str(arg))
    if bundled is not None:
        return bundled
    raise RecipeError(str(arg), "", "cannot read the recipe: no such file, nor a bundled recipe "
                      "of that name (" + ", ".join(recipe_names()) + ": `launch recipes`)")


def load_recipe(arg: str | Path, base_dir: str | Path | None = None) -> Recipe:
    """The recipe file (or bundled name); its relative paths (workdir) start from its own
    folder, or from `base_dir` (a run folder's copy of a recipe written elsewhere)."""
    path = str(resolve_recipe(arg))
    try:
        data = load_yaml_file(path, "recipe")
    except YamlFileError as err:
        raise RecipeError(path, "", err.why) from None
    return recipe_from_mapping(data, path, base_dir or Path(path).parent)


def recipe_warnings(recipe: Recipe) -> list[str]:
    """Settings that load but will likely not do what the recipe means."""
    warnings = []
    if recipe.restarts > 0 and recipe.checkpoint is None and recipe.train is not None:
        warnings.append(
            f"{recipe.source}: restarts is {recipe.restarts} but the recipe has no "
            "`checkpoint:` block: a restarted run starts over from step 0 (add e.g. "
            "checkpoint: {every_steps: 100})")
    steps = recipe.train.steps if recipe.train is not None else None
    if recipe.train is not None and recipe.ddp.comm_hook == AUTO and steps is not None:
        trial = auto_trial_steps(recipe.ddp.powersgd.start_iter,
                                 lr_warmup_steps(recipe.train.warmup_steps, steps))
        if steps < AUTO_MEASURE_STEPS:
            warnings.append(
                f"{recipe.source}: ddp.comm_hook auto needs {AUTO_MEASURE_STEPS} steps to "
                f"measure communication and train.steps is {steps}: the run keeps plain "
                "all-reduce and records auto as undecided")
        elif steps < trial:
            warnings.append(
                f"{recipe.source}: ddp.comm_hook auto may start a PowerSGD trial that needs "
                f"{trial} steps and train.steps is {steps}: auto may end undecided")
    return warnings


def check_recipe_for_hardware(recipe: Recipe, gpus_per_node: list[int]) -> None:
    """Checks that depend on the nodes the recipe will run on, before anything starts."""
    cpu_only = all(g == 0 for g in gpus_per_node)
    if recipe.train is not None and recipe.ddp.comm_hook == "bf16" and cpu_only:
        raise RecipeError(
            recipe.source, "ddp.comm_hook",
            "bf16 compression needs NCCL >= 2.10 on CUDA GPUs, and these nodes have no GPU "
            "(gloo refuses it); use fp16 or powersgd, or run on GPU nodes",
        )
    if isinstance(recipe.nproc_per_node, int) and not cpu_only:
        fewest = min(gpus_per_node)
        if recipe.nproc_per_node > fewest:
            raise RecipeError(
                recipe.source, "nproc_per_node",
                f"is {recipe.nproc_per_node} but a node has only {fewest} GPU(s); use 'auto' "
                f"or at most {fewest}",
            )
