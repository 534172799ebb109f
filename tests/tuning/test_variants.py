"""Each benchmark variant builds the DDP it claims, through the same path a run takes:
recipe -> plan's trainer flags -> the trainer's argument parser -> DDP."""

from __future__ import annotations

import dataclasses

import torch

from launcher.job.recipe import recipe_from_mapping
from launcher.job.runplan import trainer_args
from train.ddp import NEVER, DDPSettings, OneBucketAtATime, wrap_ddp
from train.main import parse_args
from train.model import build_vit

MB = 1 << 20


def build(ddp_tuning, name):
    recipe = recipe_from_mapping(ddp_tuning.variant_recipe(name, 1), f"{name}.yml")
    args = parse_args(trainer_args(recipe, "/tmp/unused"))
    settings = DDPSettings.from_args(args)
    if settings.bucket_cap_mb == "auto":  # the trainer measures the link; a stand-in size
        settings = dataclasses.replace(settings, bucket_cap_mb=7.0)
    model = build_vit("vit_tiny", 8, 4, 1, 10, depth=1)
    ddp, state = wrap_ddp(model, settings, torch.device("cpu"))
    return args, ddp, state


def hook_names(ddp):
    return [hook.__qualname__ for hook, _ in ddp._comm_hooks]


def test_default_is_plain_ddp(world_of_one, ddp_tuning):
    _, ddp, state = build(ddp_tuning, "default")
    assert (ddp.static_graph, ddp.gradient_as_bucket_view) == (False, False)
    assert ddp.bucket_bytes_cap == 25 * MB
    assert hook_names(ddp) == [] and state is None


def test_tuned(world_of_one, ddp_tuning):
    _, ddp, state = build(ddp_tuning, "tuned")
    assert (ddp.static_graph, ddp.gradient_as_bucket_view) == (True, True)
    assert ddp.bucket_bytes_cap == 5 * MB
    assert hook_names(ddp) == []


def test_tuned_fp16(world_of_one, ddp_tuning):
    _, ddp, _ = build(ddp_tuning, "tuned+fp16")
    assert ddp.static_graph and ddp.gradient_as_bucket_view
    assert hook_names(ddp) == ["fp16_compress_hook"]


def test_tuned_powersgd(world_of_one, ddp_tuning):
    _, ddp, state = build(ddp_tuning, "tuned+powersgd")
    assert hook_names(ddp) == ["powersgd_hook"] and state.wire == "bf16"   # launch's own
    assert ddp._comm_hooks[0][1] is state
    # On gloo the buckets' PowerSGD chains run one after another (see OneBucketAtATime).
    assert isinstance(ddp._comm_hooks[0][0], OneBucketAtATime)
    assert state.matrix_approximation_rank == 4
    assert state.start_powerSGD_iter == 10
    assert state.use_error_feedback and state.warm_start


def test_tuned_powersgd_torch(world_of_one, ddp_tuning):
    _, ddp, state = build(ddp_tuning, "tuned+powersgd-torch")
    assert hook_names(ddp) == ["powerSGD_hook"]
    assert state.matrix_approximation_rank == 4 and state.start_powerSGD_iter == 10


def test_auto_registers_powersgd_that_waits_for_a_decision(world_of_one, ddp_tuning):
    args, ddp, state = build(ddp_tuning, "auto")
    assert args.bucket_cap_mb == "auto" and args.comm_hook == "auto"
    assert hook_names(ddp) == ["powersgd_hook"]
    assert state.matrix_approximation_rank == 4
    assert state.start_powerSGD_iter == NEVER  # plain all-reduce until auto decides
