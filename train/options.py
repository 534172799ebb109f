"""The trainer's options, declared once.

Each option names the recipe key it comes from, its type, default, bounds and help. From this
one table:
- launcher/job/recipe.py takes the defaults and bounds of the recipe's `train:` and `ddp:` keys,
- launcher/job/runplan.py turns a recipe into the trainer's argv (`argv_for`),
- train/main.py builds its argument parser (`add_options`),
so recipe defaults and trainer defaults agree by construction (they once drifted: image_size
224 in recipes vs 32 in the trainer). Imports nothing but the standard library: launch loads it
at start-up, and nodes run it without launcher/.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
MODELS = ("vit_tiny", "vit_s16", "vit_b16")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd", AUTO)
PRECISIONS = ("fp32", "bf16")
POWERSGD_WIRES = ("fp32", "bf16", "fp16")
POWERSGD_HOOKS = ("launch", "torch")
# `comm_hook: auto` (train/autocomm.py) skips the first steps (bucket rebuilds), measures plain
# all-reduce until a sign test at AUTO_ALPHA says whether communication is above
# AUTO_MIN_COMM_SHARE of the step (AUTO_MIN_SAMPLES to AUTO_MAX_SAMPLES steps; ranks agree on
# their numbers every AUTO_CHECK_EVERY steps), then, after PowerSGD's warm-up, forks rounds of
# AUTO_ROUND_STEPS steps run twice, plain and PowerSGD, until the same test says whether
# PowerSGD is AUTO_MIN_GAIN faster (from AUTO_MIN_PAIRS pairs, at most AUTO_MAX_ROUNDS rounds),
# unless its loss strays AUTO_GUARD_EXCESS above plain all-reduce's. The run report's advice
# uses the same share (launcher/nccl/advice.py), and a recipe too short for auto to decide is
# warned about when it is loaded.
AUTO_MIN_COMM_SHARE = 0.15
AUTO_MIN_GAIN = 0.10
AUTO_ALPHA = 0.01
AUTO_SKIP_STEPS = 2
AUTO_MIN_SAMPLES = 8
AUTO_MAX_SAMPLES = 40
AUTO_CHECK_EVERY = 4
AUTO_ROUND_STEPS = 16
AUTO_MIN_PAIRS = AUTO_ROUND_STEPS - 1
AUTO_MAX_ROUNDS = 3
AUTO_GUARD_EXCESS = 0.04
AUTO_MEASURE_STEPS = AUTO_SKIP_STEPS + AUTO_MIN_SAMPLES
SHORT_FLAG_SECTIONS = ("train", "ddp")
# A straggler: a rank whose busy time per step is above THRESHOLD x the median rank's for
# INTERVALS intervals in a row. The trainer judges its own ranks (train/stragglers.py); launch
# judges a user's job from its LAUNCH_STEP lines (launcher/runs/progress.py) with the same rule.
STRAGGLER_THRESHOLD = 1.25
STRAGGLER_INTERVALS = 3


def lr_warmup_steps(warmup_steps: int | None, total_steps: int) -> int:
    """train.warmup_steps, or its default: 5% of the steps."""
    return warmup_steps if warmup_steps is not None else int(0.05 * total_steps)


def auto_trial_from(start_iter: int, lr_warmup: int) -> int:
    """The first step (0-based) comm_hook auto may compress: after PowerSGD's own warm-up
    (`ddp.powersgd.start_iter`) and the learning-rate warm-up, as the PowerSGD hook's
    documentation asks, and never before the plain all-reduce has been measured."""
    return max(start_iter, lr_warmup, AUTO_MEASURE_STEPS)


def auto_trial_steps(start_iter: int, lr_warmup: int) -> int:
    """Steps a run needs at least for comm_hook auto to try PowerSGD and decide."""
    return auto_trial_from(start_iter, lr_warmup) + AUTO_ROUND_STEPS


@dataclass(frozen=True)
class Option:
    key: str                       # where a recipe holds it: "train.image_size"
    kind: str                      # int | float | str | bool | size_or_auto
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None       # inclusive bounds, checked when a recipe is loaded
    high: float | None = None
    optional: bool = False         # may be unset (None): then it is left off the argv

    @property
    def flag(self) -> str:
        """train.image_size -> --image-size; ddp.powersgd.rank -> --powersgd-rank;
        checkpoint.keep -> --checkpoint-keep (the train and ddp blocks came first and keep
        their short flags; a newer block keeps its name, or `--keep` would say nothing)."""
        parts = self.key.split(".")
        if parts[0] in SHORT_FLAG_SECTIONS:
            parts = parts[1:]
        return "--" + "-".join(parts).replace("_", "-")

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def argv(self, value: Any) -> list[str]:
        """The value as trainer flags, each one argv item."""
        if value is None:
            return []
        if self.kind == "bool":
            return [self.flag if value else "--no-" + self.flag[2:]]
        if isinstance(value, float):
            return [self.flag, repr(value)]   # repr round-trips exactly; %g would not
        return [self.flag, str(value)]


def _o(key, kind, default, help, **kw) -> Option:
    return Option(key, kind, default, help, **kw)


OPTIONS: tuple[Option, ...] = (
    _o("train.model", "str", "vit_tiny", "ViT size", choices=MODELS),
    _o("train.depth", "int", None, "override the model's number of blocks", low=1, high=64,
       optional=True),
    _o("train.width", "int", None, "override the model's embedding width", low=8, high=8192,
       optional=True),
    _o("train.heads", "int", None, "override the model's attention heads", low=1, high=128,
       optional=True),
    _o("train.dataset", "str", "synthetic", "synthetic | digits | the path of an image folder"),
    _o("train.image_size", "int", 224, "image side in pixels", low=4, high=4096),
    _o("train.patch_size", "int", 16, "patch side in pixels", low=1, high=1024),
    _o("train.batch_size", "int", 32, "images per rank per micro-step", low=1, high=65536),
    _o("train.steps", "int", None, "optimizer steps (or epochs)", low=1, high=10**9,
       optional=True),
    _o("train.epochs", "float", None, "passes over the training set (or steps)", low=1e-6,
       high=1e6, optional=True),
    _o("train.lr", "float", 5e-4, "peak learning rate (AdamW)", low=1e-12, high=10.0),
    _o("train.weight_decay", "float", 0.05, "AdamW weight decay", low=0.0, high=10.0),
    _o("train.warmup_steps", "int", None, "linear warm-up steps (default: 5% of steps)",
       low=0, high=10**9, optional=True),
    _o("train.precision", "str", "fp32", "bf16 autocast or fp32", choices=PRECISIONS),
    _o("train.seed", "int", 0, "seed for weights and data order", low=0, high=2**32 - 1),
    _o("train.grad_accum_steps", "int", 1, "micro-steps per optimizer step", low=1, high=1024),
    _o("train.num_workers", "int", 0, "DataLoader workers per rank", low=0, high=64),
    _o("train.log_every", "int", 10, "steps between progress lines", low=1, high=10**9),
    _o("train.save_model", "bool", False, "rank 0 saves OUT_DIR/model.pt at the end"),
    _o("ddp.static_graph", "bool", False, "DDP static_graph"),
    _o("ddp.gradient_as_bucket_view", "bool", False, "DDP gradient_as_bucket_view"),
    _o("ddp.bucket_cap_mb", "size_or_auto", 25.0,
       "DDP bucket size in MiB, or auto: chosen from all-reduce timings", low=1e-3, high=1024),
    _o("ddp.comm_hook", "str", "none", "gradient communication hook", choices=COMM_HOOKS),
    # 4, not torch's 1: on the demo, PowerSGD at rank 1 from step 16 ended at 86% held-out
    # accuracy, rank 2 at 94%, rank 4 at 97% (plain all-reduce 96%); comm_hook auto's loss
    # guard turns down rank 1 and 2 there.
    _o("ddp.powersgd.rank", "int", 4, "PowerSGD matrix approximation rank", low=1, high=64),
    _o("ddp.powersgd.start_iter", "int", 10, "PowerSGD's plain all-reduce warm-up steps",
       low=0, high=10**9),
    _o("ddp.powersgd.warm_start", "bool", True, "PowerSGD warm start"),
    _o("ddp.powersgd.error_feedback", "bool", True, "PowerSGD error feedback"),
    _o("ddp.powersgd.wire", "str", "bf16", "precision of PowerSGD's P, Q and vectors on the wire",
       choices=POWERSGD_WIRES),
    _o("ddp.powersgd.hook", "str", "launch", "PowerSGD hook: launch's (train/powersgd.py) or "
       "torch's powerSGD_hook", choices=POWERSGD_HOOKS),
    # A recipe without a `checkpoint:` block writes none; with one, exactly one of every_steps
    # and every_minutes says when (train/checkpoint.py).
    _o("checkpoint.every_steps", "int", None, "write a checkpoint every N optimizer steps",
       low=1, high=10**9, optional=True),
    _o("checkpoint.every_minutes", "float", None, "write a checkpoint every M minutes",
       low=0.01, high=10**6, optional=True),
    _o("checkpoint.keep", "int", 2, "checkpoints kept (the oldest are deleted)", low=1,
       high=1000),
    _o("checkpoint.asynchronous", "bool", True,
       "copy the state to CPU and write it from a thread while training goes on"),
)
BY_KEY = {o.key: o for o in OPTIONS}


def default(key: str) -> Any:
    return BY_KEY[key].default


# What a checkpoint depends on: resuming with any of these changed would load weights of the
# wrong shape, or continue another data order, sampler shard or compression state. Everything
# else (steps, lr, buckets, precision, ...) may change between a run and its resume.
RESUME_KEYS = ("train.model", "train.depth", "train.width", "train.heads", "train.dataset",
               "train.image_size", "train.patch_size", "train.batch_size",
               "train.grad_accum_steps", "train.seed", "ddp.comm_hook", "ddp.powersgd.rank")


def lookup(data: dict[str, Any], key: str) -> Any:
    """recipe_dict["ddp"]["powersgd"]["rank"] for "ddp.powersgd.rank"; None when a block the
    recipe may leave out (checkpoint) is absent."""
    for part in key.split("."):
        if data is None:
            return None
        data = data[part]
    return data


def resume_signature(values: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The settings a checkpoint was written under, from a recipe dict (launch) or from the
    trainer's own options (`{key: value}` flat): compared before resuming."""
    out: dict[str, Any] = {}
    for key in RESUME_KEYS:
        out[key] = values[key] if key in values else lookup(values, key)
    out["world_size"] = world_size
    return out


def argv_for(recipe: dict[str, Any]) -> list[str]:
    """A recipe (as a plain dict with train/ddp blocks) as the trainer's flags."""
    out: list[str] = []
    for option in OPTIONS:
        out += option.argv(lookup(recipe, option.key))
    return out


def _size_or_auto(text: str) -> float | str:
    if text == AUTO:
        return text
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size in MiB > 0 or auto, got {text}")
    return value


_TYPES = {"int": int, "float": float, "str": str, "size_or_auto": _size_or_auto}


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every option as an argparse flag (the trainer's side of `argv_for`)."""
    for option in OPTIONS:
        # argparse %-formats help texts ("%(default)s"): the table's are plain prose ("5% of
        # steps"), so a literal % is escaped, or --help fails for every option.
        kw: dict[str, Any] = {"default": option.default, "help": option.help.replace("%", "%%"),
                              "dest": option.dest}
        if option.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = _TYPES[option.kind]
            if option.choices:
                kw["choices"] = option.choices
        parser.add_argument(option.flag, **kw)


def options_under(section: str) -> Iterator[Option]:
    """The options whose recipe key starts with `section.` (e.g. "ddp")."""
    return (o for o in OPTIONS if o.key.startswith(section + "."))
