"""What a rank's environment is made of: one rule for every backend (docs/jobs.md#the-environment).

    1. the node's login environment: what a command started by `ssh NODE` gets there (SSH);
       on this machine (`--local`) and on Slurm, which start ranks from launch's own
       environment, only the variables of it that a login would set (LOGIN_NAMES,
       LOGIN_PREFIXES; on Slurm also Slurm's own SLURM_* of the node's step)
    2. the recipe's `env:`
    3. `launch run --env KEY=VALUE` / `--env KEY` (the value launch was started with)
    4. launch's own: LAUNCH_*, PYTHONPATH (the workdir first), PATH (the node's interpreter's
       folder first), OMP_NUM_THREADS, NCCL_DEBUG*, the socket interface...

A later layer wins over an earlier one, except that the recipe and --env may not set launch's
own names (launcher/job/recipe.py RESERVED_ENV). Before this rule a `--local` rank inherited
launch's whole shell and an SSH rank none of it: `ACCELERATE_USE_CPU=1 launch run ...` worked
on this machine, and over SSH each rank trained alone without a word.

Pure: the environment to read is given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launcher.core.errors import LauncherError
from launcher.job.recipe import MAX_ENV_VALUE, env_name_problem, env_value_problem

# What login(1), sshd and pam_env give a session (see environ(7)), and the terminal.
LOGIN_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
               "TERM")
LOGIN_PREFIXES = ("LC_",)
# The GPUs launch was given on this machine: `--local` splits them between its nodes (hidden,
# `CUDA_VISIBLE_DEVICES=`, they must stay hidden from the ranks too).
MACHINE_NAMES = ("CUDA_VISIBLE_DEVICES",)

# Where a value of a rank's environment comes from, as --dry-run says it.
FROM_LOGIN = "login"
FROM_RECIPE = "recipe env"
FROM_FLAG = "--env"


# What launch's own services (the checkpoint mirror) take from launch's environment where they
# run beside it: the cloud SDK's settings and credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID,
# AWS_ENDPOINT_URL, ...), as launch itself uses them. Not the user's ranks, not over SSH.
SERVICE_PREFIXES = ("AWS_",)


def service_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(SERVICE_PREFIXES)}


def is_login_name(name: str) -> bool:
    return name in LOGIN_NAMES or name.startswith(LOGIN_PREFIXES)


def login_env(environ: Mapping[str, str], *, machine: bool = True) -> dict[str, str]:
    """The variables of `environ` a login on this machine would set (`machine`: and the GPUs
    launch was given), in a stable order."""
    names = sorted(n for n in environ if is_login_name(n) or (machine and n in MACHINE_NAMES))
    return {n: environ[n] for n in names}


def env_flags(items: list[str] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """`--env KEY=VALUE` and `--env KEY` (its value from `environ`, launch's own), in order,
    a later one winning, by the recipe's rules for its env (names launch owns refused).
    Raises LauncherError naming the flag."""
    values: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq:
            if name not in environ:
                raise LauncherError(
                    f"--env {name}: {name} is not set in launch's environment; set it "
                    f"(export {name}=...) or give the value (--env {name}=VALUE)")
            value = environ[name]
        why = (env_name_problem(name) or env_value_problem(name, value)) if name \
            else "the name is empty (--env NAME=VALUE)"
        if why:
            raise LauncherError(f"--env {item if eq else name}: {why}")
        if "\0" in value:
            raise LauncherError(f"--env {name}: the value holds a NUL byte, which no "
                                "environment variable can carry")
        if len(value) > MAX_ENV_VALUE:
            raise LauncherError(f"--env {name}: the value is {len(value)} characters; at most "
                                f"{MAX_ENV_VALUE}")
        values[name] = value
    return values


def masked(value: str) -> str:
    """How a value given with --env is shown and kept (the dry run, plan.json): it may be a
    token, and dry runs end up in CI logs."""
    return f"<--env value, {len(value)} characters>"


def path_with(python: str, path: str | None) -> str:
    """PATH with the node's interpreter's folder first: `python`, `pip` and the tools installed
    beside it (torchrun, deepspeed) are the ones the job's own commands find."""
    folder = os.path.dirname(python)
    parts = [p for p in (path or os.defpath).split(":") if p]
    return ":".join([folder, *[p for p in parts if p != folder]]) if folder else ":".join(parts)
