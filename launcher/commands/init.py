"""`launch init [DIR] [--recipe NAME]`: a recipe and an inventory to start from, copied from the
ones that ship with launch, and the commands to type next. Never overwrites a file."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from launcher import bundled
from launcher.errors import LauncherError

RECIPE_FILE = "recipe.yml"
INVENTORY_FILE = "inventory.yml"
# The recipe that runs anywhere: CPU, no cluster, a minute on 2 cores. A newcomer's first
# `launch run` should succeed on the laptop or login node they typed `launch init` on.
DEFAULT_RECIPE = "vit-tiny-local"


class InitError(LauncherError):
    """`launch init` wrote nothing: a file is in the way or the recipe name is unknown."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "init", help="write a recipe and an inventory template to start from",
        description=f"Writes DIR/{RECIPE_FILE} (a copy of a bundled recipe, with the comments "
                    f"that explain its settings) and DIR/{INVENTORY_FILE} (an inventory template "
                    "documenting every key), then prints the commands to type next. Existing "
                    "files are never overwritten: launch init then writes nothing (exit 2).")
    parser.add_argument("dir", nargs="?", default=".", type=Path, metavar="DIR",
                        help="folder to write into, created if missing (default: here)")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, metavar="NAME",
                        help=f"bundled recipe to copy (default {DEFAULT_RECIPE}, the CPU demo "
                             "that runs on this machine; `launch recipes` lists them all)")
    parser.set_defaults(func=run)


def _shown(path: Path) -> str:
    """The path as the user would type it: relative when it lies below here, quoted once."""
    absolute = path.resolve()
    try:
        text = str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(absolute)
    return shlex.quote(text)


def _next_commands(usage: str | None, name: str, recipe: str,
                   inventory: str) -> list[tuple[str, str]]:
    """(command, why) lines from the recipe's own `launch run` line, pointed at the copies."""
    tokens = shlex.split(usage) if usage else ["launch", "run", name, "--local"]
    swap = {name: recipe, INVENTORY_FILE: inventory}
    run = " ".join(swap.get(t, shlex.quote(t)) for t in tokens)
    if "--local" in tokens:
        # Without --local, -i: the same recipe on the inventory's hosts.
        cluster = " ".join(swap.get(t, shlex.quote(t)) for t in tokens if t != "--local")
        return [
            (f"{run} --dry-run", "the plan: one torchrun per node; starts nothing"),
            (run, "train on this machine"),
            (f"# on a cluster: put your hosts in {inventory}, then", ""),
            (f"launch setup -i {inventory}", "drivers, NCCL, EFA, torch on every node"),
            (f"{cluster} -i {inventory}", ""),
        ]
    return [
        (f"{run} --dry-run", "the plan per host; connects to nothing"),
        (f"# put your hosts in {inventory} (addresses, SSH user and key, gpus), then", ""),
        (f"launch setup -i {inventory}", "drivers, NCCL, EFA, torch on every node"),
        (run, ""),
    ]


def run(args: argparse.Namespace) -> int:
    source = bundled.bundled_recipe(args.recipe)
    if source is None:
        raise InitError(f"--recipe {args.recipe}: no bundled recipe of that name (there are "
                        f"{', '.join(bundled.recipe_names())}: `launch recipes` says what each "
                        "trains)")
    folder: Path = args.dir
    if folder.exists() and not folder.is_dir():
        raise InitError(f"{folder} is a file, not a folder: give launch init a folder to "
                        "write into")
    writes = [(folder / RECIPE_FILE, source),
              (folder / INVENTORY_FILE, bundled.example_inventory())]
    for target, _ in writes:
        if target.exists() or target.is_symlink():
            raise InitError(f"{target} already exists: launch init never overwrites files; "
                            "move it away or give another folder (launch init DIR)")
    folder.mkdir(parents=True, exist_ok=True)
    for target, origin in writes:
        # "x": a file that appeared since the check above is still never overwritten.
        with open(target, "x") as out:
            out.write(origin.read_text())

    name = source.name.removesuffix(bundled.RECIPE_SUFFIX)
    header = bundled.recipe_header(source)
    recipe, inventory = _shown(writes[0][0]), _shown(writes[1][0])
    width = max(len(recipe), len(inventory))
    print(f"wrote {recipe:<{width}}  a copy of the bundled recipe {name}: {header.description}")
    print(f"wrote {inventory:<{width}}  an inventory template: hosts, SSH user and key, GPUs "
          "(every key explained in its comments)")
    lines = _next_commands(header.usage, name, recipe, inventory)
    pad = max(len(cmd) for cmd, why in lines if why)
    print("\nnext:")
    for cmd, why in lines:
        print(f"  {cmd:<{pad}}   # {why}" if why else f"  {cmd}")
    return 0
