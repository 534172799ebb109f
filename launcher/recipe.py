"""Recipes: what to train and how, validated when loaded.

A recipe is YAML. Unknown keys, wrong types and combinations that cannot work are rejected
here, with the file and the key path, instead of at step 1 on a cluster that bills by the hour.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from launcher.errors import RecipeError

# (width, heads) of the standard sizes, as in train/model.py VIT_SIZES: loading a recipe
# must not import torch (a second of start-up for every command).
VIT_WIDTH_HEADS = {"vit_tiny": (192, 3), "vit_s16": (384, 6), "vit_b16": (768, 12)}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RECIPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rendezvous(_Strict):
    port: int = Field(29500, ge=1024, le=65535)
    # Seconds the node agents wait for each other before giving up (c10d join_timeout).
    timeout: int = Field(600, ge=10)


class Train(_Strict):
    model: Literal["vit_tiny", "vit_s16", "vit_b16"] = "vit_tiny"
    # Optional overrides of the standard size (e.g. a shallower model for a CPU demo).
    depth: int | None = Field(None, ge=1)
    width: int | None = Field(None, ge=8)
    heads: int | None = Field(None, ge=1)
    dataset: str = "synthetic"
    image_size: int = Field(224, ge=4)
    patch_size: int = Field(16, ge=1)
    batch_size: int = Field(32, ge=1)
    steps: int | None = Field(None, ge=1)
    epochs: float | None = Field(None, gt=0)
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.05, ge=0)
    warmup_steps: int | None = Field(None, ge=0)
    precision: Literal["fp32", "bf16"] = "fp32"
    seed: int = 0
    grad_accum_steps: int = Field(1, ge=1)
    num_workers: int = Field(0, ge=0)
    log_every: int = Field(10, ge=1)
    save_model: bool = False

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("expected synthetic, digits or the path of an image folder")
        return value

    @model_validator(mode="after")
    def _length(self) -> Train:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("set exactly one of steps or epochs")
        return self


class PowerSGD(_Strict):
    rank: int = Field(1, ge=1)
    start_iter: int = Field(10, ge=0)
    warm_start: bool = True
    error_feedback: bool = True


class DDP(_Strict):
    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    # auto: the trainer times all-reduces on the real process group before building DDP and
    # picks the bucket size from the measured latency and bandwidth (train/ddp.py).
    bucket_cap_mb: float | Literal["auto"] = 25.0
    # auto: plain all-reduce first while the trainer measures how long it waits on
    # communication; PowerSGD (the powersgd block's rank) only if a trial shows it pays.
    comm_hook: Literal["none", "fp16", "bf16", "powersgd", "auto"] = "none"
    powersgd: PowerSGD = PowerSGD()

    @field_validator("bucket_cap_mb", mode="before")
    @classmethod
    def _bucket(cls, value: Any) -> float | str:
        if value == "auto":
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0
        if isinstance(value, bool) or number <= 0:
            raise ValueError(f"expected a size in MiB > 0 or 'auto' (got {value!r})")
        return number


class Recipe(_Strict):
    name: str
    nodes: int = Field(1, ge=1)
    nproc_per_node: int | Literal["auto"] = "auto"
    rendezvous: Rendezvous = Rendezvous()
    env: dict[str, str | int | float | bool] = {}
    train: Train
    ddp: DDP = DDP()
    # Where the recipe came from; set by load_recipe, not part of the YAML.
    source: str = Field("<recipe>", exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RECIPE_NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' and '-' (it becomes part of run ids)")
        return value

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                               and value >= 1):
            return value
        raise ValueError(f"expected a whole number >= 1 or 'auto' (got {value!r})")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    def env_strings(self) -> dict[str, str]:
        """Recipe env as strings, the way a process receives it (YAML true -> "1")."""
        out = {}
        for key, value in self.env.items():
            out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


def _combination_errors(recipe: Recipe) -> list[tuple[str, str]]:
    """Settings that validate one by one but cannot work together."""
    problems = []
    ps = recipe.ddp.powersgd
    if recipe.ddp.comm_hook == "powersgd" and (ps.error_feedback or ps.warm_start) \
            and ps.start_iter <= 1:
        problems.append((
            "ddp.powersgd.start_iter",
            f"is {ps.start_iter}, but error_feedback/warm_start need start_iter > 1 (DDP "
            "rebuilds its buckets after the first iterations); use 2 or more, or turn both off",
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


def _explain(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    got = err.get("input")
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see the recipe reference in README.md)"
    if kind == "missing":
        return "required key is missing"
    msg = msg.removeprefix("Value error, ")
    msg = msg.replace("Input should be", "expected")
    return f"{msg} (got {got!r})" if kind != "value_error" and not isinstance(got, dict) else msg


def recipe_from_mapping(data: Any, source: str) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(source, "", "a recipe must be a YAML mapping (name:, train:, ddp: ...)")
    try:
        recipe = Recipe.model_validate({**data, "source": source})
    except ValidationError as exc:
        seen, lines = set(), []
        for err in exc.errors():
            where = _format_location(err["loc"])
            line = f"{where}: {_explain(err)}" if where else _explain(err)
            if where not in seen:  # a union reports each branch; one line per key is enough
                seen.add(where)
                lines.append(line)
        if len(lines) == 1:
            key, _, why = lines[0].partition(": ")
            raise RecipeError(source, key, why) from None
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
    from launcher.bundled import bundled_recipe, recipe_names

    path = Path(arg)
    if path.exists():
        return path
    bundled = bundled_recipe(str(arg))
    if bundled is not None:
        return bundled
    raise RecipeError(str(arg), "", "cannot read the recipe: no such file, nor a bundled recipe "
                      "of that name (" + ", ".join(recipe_names()) + ": `launch recipes`)")


def load_recipe(arg: str | Path) -> Recipe:
    path = str(resolve_recipe(arg))
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RecipeError(path, "", f"cannot read the recipe: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(path, "", f"not valid YAML: {err}") from None
    return recipe_from_mapping(data, path)


def check_recipe_for_hardware(recipe: Recipe, gpus_per_node: list[int]) -> None:
    """Checks that depend on the nodes the recipe will run on, before anything starts."""
    cpu_only = all(g == 0 for g in gpus_per_node)
    if recipe.ddp.comm_hook == "bf16" and cpu_only:
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
