"""The trainer's options have one owner (train/options.py): every recipe field reaches the
trainer's parser with the value the recipe holds, and the defaults agree by construction."""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel

from launcher.job.recipe import DDP, Checkpoint, Recipe, Train, recipe_from_mapping
from launcher.job.runplan import trainer_args
from train.main import parse_args
from train.options import OPTIONS

BASE = {"name": "walk", "train": {"steps": 10}}
# A value other than the default for every option, written by hand. A new option without a
# sample fails test_every_option_reaches_the_trainer: add one here.
SAMPLES = {
    "train.model": "vit_s16", "train.depth": 3, "train.width": 96, "train.heads": 6,
    "train.dataset": "digits", "train.image_size": 64, "train.patch_size": 8,
    "train.batch_size": 7, "train.steps": 33, "train.epochs": 2.5, "train.lr": 0.00123,
    "train.weight_decay": 0.2, "train.warmup_steps": 4, "train.precision": "bf16",
    "train.seed": 12345, "train.grad_accum_steps": 2, "train.num_workers": 1,
    "train.log_every": 3, "train.save_model": True, "ddp.static_graph": True,
    "ddp.gradient_as_bucket_view": True, "ddp.bucket_cap_mb": 3.5, "ddp.comm_hook": "fp16",
    "ddp.powersgd.rank": 2, "ddp.powersgd.start_iter": 5, "ddp.powersgd.warm_start": False,
    "ddp.powersgd.error_feedback": False, "ddp.powersgd.wire": "fp16",
    "ddp.powersgd.hook": "torch", "checkpoint.every_steps": 25,
    "checkpoint.every_minutes": 2.5, "checkpoint.keep": 5, "checkpoint.asynchronous": False,
}


def recipe_with(key: str, value):
    data = copy.deepcopy(BASE)
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    if key == "train.epochs":
        del data["train"]["steps"]
    if key.startswith("checkpoint.") and key != "checkpoint.every_minutes":
        data["checkpoint"].setdefault("every_steps", 50)  # a checkpoint block says when
    return recipe_from_mapping(data, "walk.yml")


@pytest.mark.parametrize("option", OPTIONS, ids=[o.key for o in OPTIONS])
def test_every_option_reaches_the_trainer(option):
    value = SAMPLES[option.key]
    assert value != option.default
    args = parse_args(trainer_args(recipe_with(option.key, value), "/tmp/out"))
    assert getattr(args, option.dest) == value


def test_checkpoint_flags_keep_their_block_name():
    """`--keep` alone would not say what is kept."""
    args = trainer_args(recipe_with("checkpoint.keep", 5), "/tmp/out")
    assert args[args.index("--checkpoint-every-steps") + 1] == "50"
    assert args[args.index("--checkpoint-keep") + 1] == "5"
    assert "--checkpoint-asynchronous" in args


def test_a_recipe_without_checkpoints_passes_no_checkpoint_flags():
    args = trainer_args(Recipe.model_validate(BASE), "/tmp/out")
    assert not [a for a in args if a.startswith("--checkpoint")]
    assert parse_args(args).checkpoint_every_steps is None


def test_bucket_cap_auto_reaches_the_trainer():
    args = parse_args(trainer_args(recipe_with("ddp.bucket_cap_mb", "auto"), "/tmp/out"))
    assert args.bucket_cap_mb == "auto"


def fields(model: type[BaseModel], prefix: str) -> dict[str, object]:
    out = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out.update(fields(info.annotation, f"{prefix}{name}."))
        else:
            out[prefix + name] = info.default
    return out


def test_recipe_blocks_and_trainer_options_are_the_same_set_with_the_same_defaults():
    recipe_fields = {**fields(Train, "train."), **fields(DDP, "ddp."),
                     **fields(Checkpoint, "checkpoint.")}
    # launch's own: the mirror runs beside the trainer (launch_node/mirror.py), not in it.
    del recipe_fields["checkpoint.mirror"]
    assert set(recipe_fields) == {o.key for o in OPTIONS}
    parser_defaults = vars(parse_args([]))
    for option in OPTIONS:
        assert recipe_fields[option.key] == option.default, option.key
        if option.key != "train.epochs":  # the trainer alone falls back to one epoch
            assert parser_defaults[option.dest] == option.default, option.key


def test_a_default_recipe_and_the_trainer_agree_on_image_and_patch_size():
    """They once drifted: 224/16 in recipes, 32/4 in the trainer."""
    recipe = Recipe.model_validate(BASE)
    args = parse_args(trainer_args(recipe, "/tmp/out"))
    assert (args.image_size, args.patch_size) == (224, 16) == (
        recipe.train.image_size, recipe.train.patch_size)


def test_the_trainers_help_lists_every_option(capsys):
    # argparse %-formats help texts: a plain "5% of steps" in the table broke --help once.
    with pytest.raises(SystemExit) as stop:
        parse_args(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "(default: 5% of steps)" in out
    assert all(option.flag in out for option in OPTIONS)
