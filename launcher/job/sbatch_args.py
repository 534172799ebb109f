"""Extra sbatch arguments (a recipe's slurm.sbatch_args, `--sbatch-arg`), read as sbatch reads
them, and refused where they would override what launch sets.

sbatch parses its command line with glibc's getopt_long and the option table of
launcher/job/sbatch_table.py (Slurm's own, generated from its source). So a long option may be
abbreviated to any unambiguous prefix (`--er FILE` is `--error FILE`, `--part` is
`--partition`), short options bundle (`-Qe FILE` is `--quiet --error FILE`, `-Ha0-99` is
`--hold --array=0-99`), an option that takes an argument takes the next item whatever it is,
and the first item that is not an option ends them all (what follows would be the script and
its arguments). Comparing names as written let a recipe redirect the job's output (launch then
follows a file nobody writes), make it an array, change its partition, account, time or task
count past launch's checks, or set through `--export` what the recipe's `env:` refuses.

`normalize` parses the items exactly so, refuses what launch owns (OWNED) and returns each
option spelled out in full (`--error` never `--er`, `--name=value` as one item), so the job is
submitted with what was checked whatever sbatch version reads it.

Decided, not owned: `--dependency`, `--hold`, `--begin`, `--kill-on-invalid-dep` (the job waits;
launch shows it PENDING with Slurm's reason), `--open-mode` (the job's output file is named by
its job id: append and truncate are alike), `--get-user-env` (your own login environment),
`--signal`, `--verbose`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.job.sbatch_table import OPTIONS, SLURM_VERSION

MAX_ITEMS = 64
MAX_ITEM = 4096


@dataclass(frozen=True)
class Option:
    name: str
    arg: str       # none | required | optional
    val: str       # getopt's val: two names with one val are one option


TABLE = tuple(Option(*row) for row in OPTIONS)
_SHORT = {o.val: o for o in TABLE if len(o.val) == 1}

_OUTPUT = "the job's output goes to the run folder, where launch follows it"
_SLURM_BLOCK = "set slurm.{key} in the recipe or pass {flag}: launch checks it and reads it back"
# What launch sets, or needs left alone, by the option's long name; every name of one option
# (its val) is listed, the tests check that.
OWNED = {
    "nodes": "use --nodes / the recipe's nodes",
    "ntasks": "launch runs one task per node", "ntasks-per-node": "launch runs one task per node",
    "tasks-per-node": "launch runs one task per node",
    "output": _OUTPUT, "error": _OUTPUT,
    "input": "the job reads no input",
    "chdir": "the job runs in the run folder",
    "job-name": "the job is named by the run id",
    "parsable": "launch reads the job id with it",
    "quiet": "sbatch would not print the job id launch reads",
    "test-only": "sbatch would submit nothing: use launch's --dry-run",
    "wait": "launch follows the job itself; sbatch would not return until it ends",
    "help": "sbatch would print its help and submit nothing",
    "usage": "sbatch would print its usage and submit nothing",
    "version": "sbatch would print its version and submit nothing",
    "wrap": "launch writes the job script",
    "array": "one run is one job",
    "requeue": "one run is one attempt (launch passes --no-requeue)",
    "no-requeue": "launch passes it",
    "partition": _SLURM_BLOCK.format(key="partition", flag="--partition"),
    "account": _SLURM_BLOCK.format(key="account", flag="--account"),
    "time": _SLURM_BLOCK.format(key="time", flag="--time"),
    "gpus-per-node": _SLURM_BLOCK.format(key="gpus_per_node", flag="--gpus-per-node"),
    "exclusive": "set slurm.exclusive in the recipe",
    "clusters": "launch follows the job on this cluster (squeue, scancel): set SLURM_CONF to "
                "the other cluster's configuration instead",
    "cluster": "launch follows the job on this cluster (squeue, scancel): set SLURM_CONF to "
               "the other cluster's configuration instead",
    "uid": "the job runs as you: launch reads what it writes",
    "gid": "the job runs as you: launch reads what it writes",
    "export-file": "set variables in the recipe's env: (launch checks every name)",
}
# Options whose value is a file name pattern (sbatch's "filename pattern": %j, %x, %u... are
# replaced, and a backslash turns the replacing off). All owned: launch's own --output names
# the run folder, which therefore must hold neither (batch_path_problem).
FILENAME_PATTERNS = ("output", "error", "input")


class SbatchArgError(ValueError):
    pass


@dataclass(frozen=True)
class Given:
    option: Option
    value: str | None
    spelled: str       # as written, for messages

    def canonical(self) -> str:
        return f"--{self.option.name}" + ("" if self.value is None else f"={self.value}")


def _long(item: str, rest: list[str]) -> tuple[Given, int]:
    """One `--name[=value]` item (and the next, for a required argument), as getopt_long reads
    it: an exact name wins, else the one option the prefix names; several are ambiguous
    unless they are one option (same argument kind and val)."""
    body = item[2:]
    name, eq, value = body.partition("=")
    exact = [o for o in TABLE if o.name == name]
    matches = exact or [o for o in TABLE if o.name.startswith(name)]
    distinct = {(o.arg, o.val) for o in matches}
    if not matches:
        raise SbatchArgError(f"{item.split('=')[0]} is not an option of sbatch (Slurm "
                             f"{SLURM_VERSION}'s table; a site plugin's options cannot be "
                             "passed through launch)")
    if len(distinct) > 1:
        names = ", ".join(f"--{o.name}" for o in matches[:8])
        raise SbatchArgError(f"--{name} is ambiguous to sbatch (it could be {names}): write "
                             "the option's whole name")
    option = matches[0]
    if option.arg == "none":
        if eq:
            raise SbatchArgError(f"--{option.name} takes no value (given {item!r})")
        return Given(option, None, item), 0
    if eq or option.arg == "optional":
        return Given(option, value if eq else None, item), 0
    if not rest:
        raise SbatchArgError(f"--{option.name} needs a value: give it as --{option.name}=VALUE")
    return Given(option, rest[0], f"{item} {rest[0]}"), 1


def _short(item: str, rest: list[str]) -> tuple[list[Given], int]:
    """One `-xyz` item: letters bundled until one that takes an argument, which takes the rest
    of the item, or (required, nothing left) the next item."""
    out: list[Given] = []
    i = 1
    while i < len(item):
        letter = item[i]
        option = _SHORT.get(letter)
        if option is None:
            raise SbatchArgError(f"-{letter} (in {item!r}) is not an option of sbatch")
        tail = item[i + 1:]
        if option.arg == "none":
            out.append(Given(option, None, f"-{letter}"))
            i += 1
            continue
        if tail or option.arg == "optional":
            out.append(Given(option, tail or None, f"-{letter}{tail}"))
            return out, 0
        if not rest:
            raise SbatchArgError(f"-{letter} (--{option.name}) needs a value: give it as "
                                 f"--{option.name}=VALUE")
        out.append(Given(option, rest[0], f"-{letter} {rest[0]}"))
        return out, 1
    return out, 0


def parse(items: list[str]) -> list[Given]:
    """The options in `items`, as sbatch's getopt_long reads them. Every item must be part of
    an option: sbatch stops at the first one that is not (`--`, `-`, a word) and would take it
    as the job script, and launch's own options after it as that script's arguments."""
    out: list[Given] = []
    i = 0
    while i < len(items):
        item = items[i]
        if not isinstance(item, str):
            raise SbatchArgError(f"{item!r} is not text: give each option as text")
        if item == "--" or not item.startswith("-") or item == "-":
            raise SbatchArgError(
                f"{item!r} is not an sbatch option (sbatch would take it as the job script): "
                "give options only, e.g. --qos=high")
        rest = items[i + 1:]
        if item.startswith("--"):
            given, used = _long(item, rest)
            out.append(given)
        else:
            bundle, used = _short(item, rest)
            out += bundle
        i += 1 + used
    return out


def _text_problem(item: str) -> str | None:
    if any(ord(c) < 32 or ord(c) == 127 for c in item):
        return (f"{item!r} holds a control character (a newline or carriage return would end "
                "the script's comment line that records the command; none belongs in an option)")
    if len(item) > MAX_ITEM:
        return f"an option is at most {MAX_ITEM} characters ({len(item)} given)"
    return None


def _export_problems(value: str, env_problem: Callable[[str], str | None]) -> list[str]:
    """--export=ALL,NAME=VALUE,...: every name by the recipe's env rule; ALL kept, since the
    job needs the environment it is submitted from (python3 on its PATH, Slurm's tools)."""
    if '"' in value or "'" in value:
        return ["--export with quotes: set the variable in the recipe's env: instead"]
    tokens = value.split(",")
    out = []
    if not any(t.upper() == "ALL" for t in tokens):
        out.append(f"--export={value} exports only what it names: the job would lose the "
                   "environment launch runs it with (PATH to python3, Slurm's tools); use "
                   "--export=ALL,NAME=VALUE or the recipe's env:")
    for token in tokens:
        if token.upper() == "ALL":
            continue
        name = token.split("=", 1)[0]
        why = env_problem(name)
        if why:
            out.append(f"--export {name}: {why}")
    return out


def normalize(items: list[str], env_problem: Callable[[str], str | None]) -> list[str]:
    """The items as checked options, each spelled out (`--name` or `--name=value`); raises
    SbatchArgError saying what is refused and why. `env_problem(name)` is the recipe's rule
    for an environment variable name (None: allowed)."""
    if len(items) > MAX_ITEMS:
        raise SbatchArgError(f"at most {MAX_ITEMS} sbatch arguments ({len(items)} given)")
    for item in items:
        problem = _text_problem(item) if isinstance(item, str) else None
        if problem:
            raise SbatchArgError(problem)
    problems = []
    for given in parse(items):
        name = given.option.name
        if name in OWNED:
            written = given.spelled.split("=")[0].split(" ")[0]
            shown = written if written == f"--{name}" else f"{written} (sbatch reads --{name})"
            problems.append(f"{shown} is set by launch: {OWNED[name]}")
        elif name == "export" and given.value is not None:
            problems += _export_problems(given.value, env_problem)
        elif name in FILENAME_PATTERNS and given.value and "%" in given.value:
            problems.append(f"{given.spelled}: sbatch replaces %-patterns in it")
    if problems:
        raise SbatchArgError("; ".join(problems))
    return [g.canonical() for g in parse(items)]


def batch_path_problem(path: str) -> str | None:
    """Why a folder cannot appear in launch's own --output/--chdir (the run folder): sbatch
    replaces %j, %x, %u... in --output and takes a backslash as "replace nothing", so launch
    would follow a file nobody writes."""
    if "%" in path or "\\" in path:
        return (f"{path!r} holds '%' or '\\', which sbatch reads as a file name pattern in "
                "--output: use a runs folder (--runs-dir) without them")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"{path!r} holds a control character: use a runs folder (--runs-dir) without"
    return None
