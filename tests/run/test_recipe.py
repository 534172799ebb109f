"""Recipe validation: every rejected case names the file and the key, exit code 2, no traceback."""

from __future__ import annotations

import copy

import pytest
import yaml

from launcher.core.errors import RecipeError
from launcher.job.recipe import load_recipe

BASE = {
    "name": "t",
    "train": {"model": "vit_tiny", "dataset": "digits", "image_size": 8, "patch_size": 4,
              "steps": 10},
    "ddp": {},
}


def write(tmp_path, data, name="recipe.yml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_(**changes):
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


CASES = [
    # (recipe, key the message must name, words it must contain)
    (with_(train__batchsize=32), "train.batchsize",
     "unknown key (did you mean `batch_size`? Every key is in docs/recipes.md.)"),
    (with_(colour="red"), "colour",
     "unknown key (check the spelling. Every key is in docs/recipes.md.)"),
    (with_(ddp__powersgd__ranks=2), "ddp.powersgd.ranks", "unknown key"),
    (with_(nodes="two"), "nodes", "integer"),
    (with_(train__batch_size="big"), "train.batch_size", "integer"),
    (with_(train__model="vit_huge"), "train.model", "vit_b16"),
    (with_(ddp__comm_hook="int8"), "ddp.comm_hook", "powersgd"),
    (with_(nproc_per_node="many"), "nproc_per_node", "auto"),
    (with_(nproc_per_node=0), "nproc_per_node", "from 1 to 64"),
    (with_(env={"BAD NAME": "x"}), "env", "environment variable"),
    (with_(train__precision="fp8"), "train.precision", "bf16"),
    (with_(rendezvous__port=80), "rendezvous.port", "1024"),
    (with_(ddp__comm_hook="powersgd", ddp__powersgd={"start_iter": 1}),
     "ddp.powersgd.start_iter", "start_iter > 1"),
    (with_(ddp__comm_hook="powersgd", ddp__powersgd={"start_iter": 0, "warm_start": False}),
     "ddp.powersgd.start_iter", "error_feedback"),
    (with_(ddp__comm_hook="auto", ddp__powersgd={"error_feedback": False}),
     "ddp.powersgd.error_feedback", "comm_hook auto runs PowerSGD as its paper does"),
    (with_(ddp__comm_hook="auto", ddp__powersgd={"warm_start": False}),
     "ddp.powersgd.warm_start", "with error feedback and warm start"),
    (with_(ddp__static_graph=True, train__grad_accum_steps=4), "ddp.static_graph",
     "grad_accum_steps"),
    (with_(train__patch_size=3), "train.patch_size", "does not divide"),
    (with_(train__epochs=2), "train", "exactly one of steps or epochs"),
    (with_(name="my run"), "name", "letters"),
    (with_(ddp__bucket_cap_mb=0), "ddp.bucket_cap_mb", "'auto'"),
    (with_(ddp__bucket_cap_mb="huge"), "ddp.bucket_cap_mb", "size in MiB"),
    # Values that passed validation and crashed at start (issue 11): refused when loaded.
    (with_(train__steps=None, train__epochs=float("inf")), "train.epochs", "1000000"),
    (with_(ddp__bucket_cap_mb=float("nan")), "ddp.bucket_cap_mb", "between"),
    (with_(rendezvous__timeout=1e30), "rendezvous.timeout", "integer"),
    (with_(rendezvous__timeout=10**9), "rendezvous.timeout", "86400"),
    (with_(train__seed=2**70), "train.seed", "4294967295"),
    (with_(train__lr=float("inf")), "train.lr", "finite"),
    (with_(nproc_per_node=10**6), "nproc_per_node", "from 1 to 64"),
    (with_(train__batch_size=10**9), "train.batch_size", "65536"),
    (with_(train__image_size=10**6), "train.image_size", "4096"),
    (with_(nodes=True), "nodes", "integer"),
    (with_(nodes=1e30), "nodes", "integer"),
    (with_(nodes=10**6), "nodes", "4096"),
    (with_(train__save_model="yes"), "train.save_model", "boolean"),
    (with_(env={"LAUNCH_RUN_ID": "other"}), "env", "set by launch"),
    (with_(env={"PATH": "/tmp/evil"}), "env", "PATH is set by launch"),
    (with_(env={"X": "a\0b"}), "env", "NUL"),
    (with_(name="n" * 300), "name", "at most 64"),
]


@pytest.mark.parametrize("data,key,words", CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_rejected_with_key_path(tmp_path, data, key, words):
    path = write(tmp_path, data)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert str(path) in message
    assert f"{key}:" in message
    assert words in message


def test_missing_required_train_block(tmp_path):
    with pytest.raises(RecipeError, match=r"set exactly one of job \(your own script, module or "
                                          r"command\) or train \(the bundled ViT trainer\)"):
        load_recipe(write(tmp_path, {"name": "x"}))


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(write(tmp_path, "name: [unclosed"))
    with pytest.raises(RecipeError, match="must be a YAML mapping"):
        load_recipe(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(RecipeError, match="cannot read the recipe"):
        load_recipe(tmp_path / "absent.yml")


def test_several_problems_reported_together(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, with_(nodes="two", train__model="x", typo=1)))
    message = str(err.value)
    for key in ("nodes:", "train.model:", "typo:"):
        assert key in message


def test_yaml_one_point_one_floats_and_env_scalars(tmp_path):
    # PyYAML reads 5e-4 (no dot) as a string; the recipe still means a number.
    recipe = load_recipe(write(tmp_path, "name: t\nenv: {A: 1, B: true, C: x}\n"
                                          "train: {steps: 1, lr: 5e-4, image_size: 8, "
                                          "patch_size: 4}\n"))
    assert recipe.train.lr == 5e-4
    assert recipe.env_strings() == {"A": "1", "B": "1", "C": "x"}


def test_cli_exit_code_2_without_traceback(run_launch, tmp_path):
    path = write(tmp_path, with_(ddp__comm_hook="powersgd", ddp__powersgd={"start_iter": 1}))
    proc = run_launch("run", "--local", str(path), "--dry-run")
    assert proc.returncode == 2
    assert "ddp.powersgd.start_iter" in proc.stderr
    assert "Traceback" not in proc.stderr
    debug = run_launch("--debug", "run", "--local", str(path), "--dry-run")
    assert "Traceback" in debug.stderr


def test_bf16_hook_refused_before_start_on_cpu_nodes(run_launch, tmp_path):
    """bf16 compression needs NCCL on CUDA; this machine (and CI) have no GPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: bf16 compression is valid here")
    path = write(tmp_path, with_(ddp__comm_hook="bf16"))
    proc = run_launch("run", "--local", "--nodes", "2", str(path), "--run-id", "bf16")
    assert proc.returncode == 2
    assert f"{path}: ddp.comm_hook: bf16 compression needs NCCL" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_auto_settings_load(tmp_path):
    recipe = load_recipe(write(tmp_path, with_(ddp__comm_hook="auto", ddp__bucket_cap_mb="auto")))
    assert (recipe.ddp.comm_hook, recipe.ddp.bucket_cap_mb) == ("auto", "auto")


def test_bf16_hook_refused_for_inventory_without_gpus():
    from launcher.job.recipe import check_recipe_for_hardware, recipe_from_mapping

    recipe = recipe_from_mapping(with_(ddp__comm_hook="bf16"), "r.yml")
    check_recipe_for_hardware(recipe, [8, 8])  # GPU nodes: fine
    with pytest.raises(RecipeError, match="ddp.comm_hook"):
        check_recipe_for_hardware(recipe, [0, 0])


def test_nproc_more_than_gpus_refused():
    from launcher.job.recipe import check_recipe_for_hardware, recipe_from_mapping

    recipe = recipe_from_mapping(with_(nproc_per_node=8), "r.yml")
    with pytest.raises(RecipeError, match="nproc_per_node: is 8 but a node has only 4"):
        check_recipe_for_hardware(recipe, [8, 4])


def test_recipe_knows_the_trainer_model_sizes():
    from launcher.job.recipe import VIT_WIDTH_HEADS
    from train.model import VIT_SIZES

    assert VIT_WIDTH_HEADS == {k: (v.width, v.heads) for k, v in VIT_SIZES.items()}


@pytest.mark.parametrize("path", ["launcher/recipes/vit-tiny-local.yml",
                                  "launcher/recipes/vit-b16-p4d.yml",
                                  "launcher/recipes/vit-b16-g6e.yml"])
def test_shipped_recipes_load(repo_root, path):
    assert load_recipe(repo_root / path).name
