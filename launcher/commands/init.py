"""`launch init [DIR] [--recipe NAME | --script PATH | -m MODULE]`: a recipe and an inventory to
start from (a copy of a bundled recipe, or one running your own script or module, as `launch
run SCRIPT.py` would), and the commands to type next. Never overwrites a file."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import unicodedata
from pathlib import Path

import yaml

from launcher.core import bundled
from launcher.core.errors import LauncherError

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
                    f"that explain its settings, named after DIR) and DIR/{INVENTORY_FILE} (an "
                    "inventory template documenting every key), then prints the commands to "
                    "type next. Existing files are never overwritten: launch init then writes "
                    "nothing (exit 2).")
    parser.add_argument("dir", nargs="?", default=".", type=Path, metavar="DIR",
                        help="folder to write into, created if missing (default: here); its "
                             "name becomes the recipe's name")
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, metavar="NAME",
                        help=f"bundled recipe to copy (default {DEFAULT_RECIPE}, the CPU demo "
                             "that runs on this machine; `launch recipes` lists them all)")
    own = parser.add_mutually_exclusive_group()
    own.add_argument("--script", metavar="PATH",
                     help="a recipe that runs your own script (relative to the current "
                          "folder, which it ships as the workdir): what `launch run PATH` "
                          "runs, to edit (docs/jobs.md)")
    own.add_argument("-m", "--module", metavar="MODULE",
                     help="the same for `python -m MODULE`")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be written, write nothing")
    parser.set_defaults(func=run)


# The recipe `launch init --script` writes: launch run SCRIPT.py's, every key explained.
JOB_RECIPE = """\
# Your own {what}, started by launch on every node (docs/jobs.md says what each node gets).
#   launch run {recipe} --local
name: {name}
nodes: 2
nproc_per_node: auto          # the node's GPUs; 1 process on a CPU node
# Shipped to every node (relative to this file); .gitignore and .launchignore are honoured.
workdir: {workdir}
job:
  {key}: {target}
  args: []                    # e.g. [--epochs, "3", --name, "two words"]: passed verbatim
# Shell lines run on every node in the workdir before the job, again only when the workdir or
# these lines change, e.g. - python -m pip install -r requirements.txt
setup: []
env: {{}}                       # e.g. {{NCCL_DEBUG_SUBSYS: INIT}}; PYTHONPATH after the workdir
restarts: 0                   # restarts after a failure; load from $LAUNCH_CHECKPOINT_DIR
"""


def job_recipe_text(args: argparse.Namespace, folder: Path, name: str) -> str:
    """JOB_RECIPE for --script/-m: the workdir is the current folder, as seen from DIR."""
    key, target = ("script", args.script) if args.script else ("module", args.module)
    workdir = os.path.relpath(Path.cwd(), os.path.abspath(folder))
    from launcher.job.recipe import recipe_from_mapping

    text = JOB_RECIPE.format(what=f"{key} {target}", recipe=RECIPE_FILE, name=name,
                             workdir=json.dumps(workdir), key=key, target=json.dumps(target))
    recipe_from_mapping(yaml.safe_load(text), f"{folder / RECIPE_FILE}", folder)  # it loads
    return text


def _shown(path: Path) -> str:
    """The path as the user would type it: relative when it lies below here, quoted once, and
    never starting with '-' (pasted, that would be read as an option)."""
    absolute = Path(os.path.abspath(path))
    try:
        text = str(absolute.relative_to(Path.cwd()))
    except ValueError:
        text = str(absolute)
    if text.startswith("-"):
        text = f"./{text}"
    return shlex.quote(text)


def _control_characters(text: str) -> list[str]:
    """The control characters in `text` (newline, escape, ...), as they would be escaped."""
    return [repr(c)[1:-1] for c in dict.fromkeys(text)
            if unicodedata.category(c) == "Cc"]


def recipe_name_for(folder: Path, fallback: str) -> str:
    """The recipe's `name` for a folder: its own name when that is a valid recipe name, else
    that name with every run of other characters made one '-' (runs of a recipe are told
    apart by it); `fallback` when nothing usable is left."""
    base = Path(os.path.abspath(folder)).name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("._-")[:64].rstrip("-")
    return name or fallback


def named_recipe_text(text: str, name: str, source: Path) -> str:
    """The bundled recipe's text with its top-level `name:` set to `name`, comments kept."""
    plain = yaml.safe_load(f"name: {name}") == {"name": name}
    value = name if plain else json.dumps(name)
    renamed, count = re.subn(r"^name:[^\n]*", lambda _m: f"name: {value}", text, count=1,
                             flags=re.MULTILINE)
    if count != 1 or (yaml.safe_load(renamed) or {}).get("name") != name:
        raise InitError(f"{source}: its top-level `name:` line could not be set to {name}; "
                        "copy the file by hand")
    from launcher.job.recipe import recipe_from_mapping

    recipe_from_mapping(yaml.safe_load(renamed), str(source))  # the copy loads as it is
    return renamed


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


def _check_folder(folder: Path, targets: list[Path]) -> None:
    """Refuse, before writing anything, a folder launch init cannot or must not write into."""
    bad = _control_characters(str(folder))
    if bad:
        raise InitError(f"{str(folder)!r}: the folder name holds control characters "
                        f"({', '.join(bad)}); a name printed for pasting must not hold any: "
                        "choose another")
    try:
        if folder.is_symlink() and not folder.exists():
            raise InitError(f"{_shown(folder)} is a symbolic link to {os.readlink(folder)}, "
                            "which does not exist: remove the link or give another folder")
        if folder.exists() and not folder.is_dir():
            raise InitError(f"{_shown(folder)} is a file, not a folder: give launch init a "
                            "folder to write into")
        for target in targets:
            if target.exists() or target.is_symlink():
                raise InitError(f"{_shown(target)} already exists: launch init never "
                                "overwrites files; move it away or give another folder "
                                "(launch init DIR)")
    except OSError as err:  # a name too long, a folder that cannot be searched
        raise _cannot_write(err, folder) from None


def _cannot_write(err: OSError, folder: Path) -> InitError:
    where = _shown(Path(err.filename)) if err.filename else _shown(folder)
    if len(where) > 100:
        where = f"{where[:60]}...{where[-30:]}"
    return InitError(f"{where}: cannot write there ({err.strerror or err}); launch init wrote "
                     "nothing: give a folder you can write to (launch init DIR)")


def _write_all(folder: Path, writes: list[tuple[Path, str]]) -> None:
    """Creates the folder and the files, or, when the system refuses (a read-only folder, a
    path too long), removes what this call made and says why: all or nothing."""
    made: list[Path] = []
    try:
        missing = [p for p in [folder, *folder.parents] if not p.exists() and not p.is_symlink()]
        for parent in reversed(missing):
            parent.mkdir()
            made.append(parent)
        for target, text in writes:
            # "x": a file that appeared since the checks is still never overwritten.
            with open(target, "x") as out:
                made.append(target)
                out.write(text)
    except OSError as err:
        for path in reversed(made):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:
                pass
        raise _cannot_write(err, folder) from None


def run(args: argparse.Namespace) -> int:
    if args.script or args.module:
        return run_job_recipe(args)
    source = bundled.bundled_recipe(args.recipe)
    if source is None:
        raise InitError(f"--recipe {args.recipe}: no bundled recipe of that name (there are "
                        f"{', '.join(bundled.recipe_names())}: `launch recipes` says what each "
                        "trains)")
    folder: Path = args.dir
    bundled_name = source.name.removesuffix(bundled.RECIPE_SUFFIX)
    name = recipe_name_for(folder, bundled_name)
    writes = [(folder / RECIPE_FILE, named_recipe_text(source.read_text(), name, source)),
              (folder / INVENTORY_FILE, bundled.example_inventory().read_text())]
    _check_folder(folder, [target for target, _ in writes])
    header = bundled.recipe_header(source)
    recipe, inventory = _shown(writes[0][0]), _shown(writes[1][0])
    if args.dry_run:
        print(f"would write {recipe}: recipe {name}, a copy of the bundled recipe "
              f"{bundled_name}")
        print(f"would write {inventory}: an inventory template")
        print("nothing written (--dry-run)")
        return 0
    _write_all(folder, writes)
    width = max(len(recipe), len(inventory))
    print(f"wrote {recipe:<{width}}  recipe {name}, a copy of the bundled recipe "
          f"{bundled_name}: {header.description}")
    print(f"wrote {inventory:<{width}}  an inventory template: hosts, SSH user and key, GPUs "
          "(every key explained in its comments)")
    lines = _next_commands(header.usage, bundled_name, recipe, inventory)
    pad = max(len(cmd) for cmd, why in lines if why)
    print("\nnext:")
    for cmd, why in lines:
        print(f"  {cmd:<{pad}}   # {why}" if why else f"  {cmd}")
    return 0


def run_job_recipe(args: argparse.Namespace) -> int:
    """`launch init --script PATH` / `-m MODULE`: a recipe running your own code."""
    from launcher.job.spec import script_recipe

    flag, given = ("--script", args.script) if args.script else ("-m", args.module)
    # The name goes into a YAML file and a comment line of it: text, one line.
    if given.encode("utf-8", "surrogateescape") != given.encode("utf-8", "replace"):
        raise InitError(f"{flag} {ascii(given)}: the name holds bytes that are not UTF-8; "
                        "a recipe is UTF-8 text: rename it")
    controls = _control_characters(given)
    if controls:
        raise InitError(f"{flag} {ascii(given)}: the name holds control characters "
                        f"({', '.join(controls)}); a recipe names it on one line: rename it")
    if args.script and not (Path.cwd() / args.script).is_file():
        raise InitError(f"--script {args.script}: no such file here ({Path.cwd()}); give the "
                        "script's path from the project's folder, where you run launch init")
    folder: Path = args.dir
    fallback = script_recipe(script=args.script, module=args.module)["name"]
    name = recipe_name_for(folder, fallback) if str(folder) != "." else fallback
    writes = [(folder / RECIPE_FILE, job_recipe_text(args, folder, name)),
              (folder / INVENTORY_FILE, bundled.example_inventory().read_text())]
    _check_folder(folder, [target for target, _ in writes])
    recipe, inventory = _shown(writes[0][0]), _shown(writes[1][0])
    what = f"script {args.script}" if args.script else f"module {args.module}"
    if args.dry_run:
        print(f"would write {recipe}: recipe {name}, your {what}")
        print(f"would write {inventory}: an inventory template")
        print("nothing written (--dry-run)")
        return 0
    _write_all(folder, writes)
    print(f"wrote {recipe}  recipe {name}: your {what}, the current folder shipped")
    print(f"wrote {inventory}  an inventory template: hosts, SSH user and key, GPUs")
    lines = [(f"launch run {recipe} --local --dry-run", "what every node would run"),
             (f"launch run {recipe} --local", "on this machine"),
             (f"launch run {recipe} -i {inventory}", "on the inventory's hosts")]
    pad = max(len(cmd) for cmd, _ in lines)
    print("\nnext:")
    for cmd, why in lines:
        print(f"  {cmd:<{pad}}   # {why}")
    return 0
