"""sbatch arguments read as sbatch reads them (issue 25, class 4): a table of what a recipe's
slurm.sbatch_args or `--sbatch-arg` may try (abbreviated long options, bundled short ones,
options that take the next item, --export, CR, '%'), each through `launch run --slurm
--dry-run` in this process; and the option table itself checked against the sbatch installed
here (Slurm's getopt answers), so that a table that drifted from sbatch fails."""

from __future__ import annotations

import os
import shlex
import string
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from shutil import which

import pytest
import yaml

from launcher.job.recipe import env_name_problem
from launcher.job.sbatch_args import OWNED, TABLE, SbatchArgError, normalize, parse
from tests.run.hostile import Guard, check, run_cli

pytestmark = pytest.mark.timeout(120)

RECIPE = {"name": "t", "train": {"dataset": "digits", "image_size": 8, "patch_size": 4,
                                 "steps": 2}}
SLURM = ["run", "recipe.yml", "--slurm", "--nodes", "2", "--dry-run"]


@dataclass
class Case:
    id: str
    args: list[str]
    code: int
    says: str | list[str]
    via: str = "flag"        # flag: --sbatch-arg=ARG each; recipe: slurm.sbatch_args


REFUSED = [
    # abbreviated long options: sbatch takes any unambiguous prefix
    Case("er-abbreviates-error", ["--er", "/tmp/elsewhere.out"], 2,
         "--er (sbatch reads --error) is set by launch"),
    Case("part-abbreviates-partition", ["--part=gpu"], 2,
         "--part (sbatch reads --partition) is set by launch: set slurm.partition"),
    Case("acco-abbreviates-account", ["--acco=other"], 2, "(sbatch reads --account)"),
    Case("arr-abbreviates-array", ["--arr=0-99"], 2, "(sbatch reads --array)"),
    Case("exclus-abbreviates-exclusive", ["--exclus"], 2, "(sbatch reads --exclusive)"),
    Case("tim-is-ambiguous", ["--tim=99:00:00"], 2,
         "--tim is ambiguous to sbatch (it could be --time, --time-min)"),
    Case("tasks-per-abbreviates", ["--tasks-per=8"], 2, "(sbatch reads --tasks-per-node)"),
    Case("outp-abbreviates-output", ["--outp=x"], 2, "(sbatch reads --output)"),
    Case("tasks-is-tasks-per-node", ["--tasks=8"], 2, "(sbatch reads --tasks-per-node)"),
    Case("chd-abbreviates-chdir", ["--chd=/"], 2, "(sbatch reads --chdir)"),
    Case("ambiguous-prefix", ["--e=x"], 2, "--e is ambiguous to sbatch"),
    Case("unknown-option", ["--bogus=1"], 2, "--bogus is not an option of sbatch"),
    # bundled short options
    Case("Qe-bundle", ["-Qe", "FILE"], 2, ["-Q (sbatch reads --quiet)",
                                           "-e (sbatch reads --error)"]),
    Case("Ha-bundle", ["-Ha0-99"], 2, "-a0-99 (sbatch reads --array)"),
    Case("Ht-bundle", ["-Ht1"], 2, "-t1 (sbatch reads --time)"),
    Case("vn-bundle", ["-vn64"], 2, "-n64 (sbatch reads --ntasks)"),
    Case("short-with-next-item", ["-p", "gpu"], 2, "-p (sbatch reads --partition)"),
    Case("J-bundle", ["-vJother"], 2, "(sbatch reads --job-name)"),
    Case("unknown-short", ["-Z"], 2, "-Z (in '-Z') is not an option of sbatch"),
    # an option's value is the next item, whatever it is
    Case("qos-swallows-nothing-at-the-end", ["--qos"], 2, "--qos needs a value"),
    Case("a-word-would-be-the-script", ["--qos=high", "extra.sh"], 2,
         "'extra.sh' is not an sbatch option (sbatch would take it as the job script)"),
    Case("double-dash-ends-options", ["--qos=a", "--"], 2, "'--' is not an sbatch option",
         via="recipe"),
    Case("no-arg-option-with-value", ["--hold=1"], 2, "--hold takes no value"),
    # what launch needs sbatch to do
    Case("quiet-hides-the-job-id", ["--quiet"], 2, "would not print the job id"),
    Case("test-only-submits-nothing", ["--test-only"], 2, "use launch's --dry-run"),
    Case("wait-never-returns", ["-W"], 2, "sbatch would not return until it ends"),
    Case("requeue", ["--requeue"], 2, "one run is one attempt"),
    Case("other-cluster", ["-M", "other"], 2, "launch follows the job on this cluster"),
    Case("wrap", ["--wrap=hostname"], 2, "launch writes the job script"),
    Case("uid", ["--uid=0"], 2, "the job runs as you"),
    Case("input", ["--input=/etc/passwd"], 2, "the job reads no input"),
    # --export: the recipe env's rule, and ALL kept
    Case("export-reserved", ["--export=ALL,LD_PRELOAD=/tmp/x.so"], 2,
         "--export LD_PRELOAD: LD_PRELOAD is set by launch"),
    Case("export-launch-stamp", ["--export=ALL,LAUNCH_RUN_STAMP=x"], 2,
         "LAUNCH_RUN_STAMP is set by launch"),
    Case("export-without-all", ["--export=FOO=1"], 2, "exports only what it names"),
    Case("export-none", ["--export=NONE"], 2, "exports only what it names"),
    Case("export-file", ["--export-file=/tmp/env"], 2, "set variables in the recipe's env"),
    Case("export-two-items", ["--export", "ALL,PATH=/x"], 2, "--export PATH: PATH is set"),
    Case("export-prefix-is-ambiguous", ["--expo=ALL"], 2, "(it could be --export, "
                                                          "--export-file)"),
    Case("export-bad-name", ["--export=ALL,A-B=1"], 2, "not a valid environment variable"),
    # line breaks and controls
    Case("carriage-return", ["--comment=a\rb"], 2, "holds a control character"),
    Case("line-feed", ["--qos=high\n#SBATCH --array=1-9"], 2, "holds a control character"),
    Case("nul", ["--comment=a\x00b"], 2, "holds a control character"),
    # the same refusals from the recipe's slurm block, named by its key
    Case("recipe-abbreviation", ["--er=x"], 2, ["slurm.sbatch_args", "(sbatch reads --error)"],
         via="recipe"),
    Case("recipe-bundle", ["-vn64"], 2, ["slurm.sbatch_args", "(sbatch reads --ntasks)"],
         via="recipe"),
    Case("recipe-carriage-return", ["--qos=a\r"], 2, ["slurm.sbatch_args", "control"],
         via="recipe"),
]

# Accepted, and submitted spelled out in full: what sbatch will read is what was checked.
ACCEPTED = [
    Case("qos-two-items", ["--qos", "high"], 0, "--qos=high"),
    Case("short-qos", ["-q", "high"], 0, "--qos=high"),
    Case("abbreviated-allowed", ["--constr=a100"], 0, "--constraint=a100"),
    Case("verbose-bundle", ["-vv"], 0, "--verbose --verbose"),
    Case("export-all-with-a-variable", ["--export=ALL,WANDB_MODE=offline"], 0,
         "--export=ALL,WANDB_MODE=offline"),
    Case("dependency", ["--dependency=afterok:12"], 0, "--dependency=afterok:12"),
    Case("hold", ["-H"], 0, "--hold"),
    Case("percent-where-nothing-expands", ["--comment=100%"], 0, "--comment=100%"),
    Case("recipe-two-items", ["--mail-type", "END"], 0, "--mail-type=END", via="recipe"),
]


def _run(case: Case, tmp_path: Path, monkeypatch, capsys):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    recipe = dict(RECIPE)
    argv = list(SLURM)
    if case.via == "recipe":
        recipe["slurm"] = {"sbatch_args": case.args}
    else:
        argv += [f"--sbatch-arg={a}" for a in case.args]
    (case_dir / "recipe.yml").write_text(yaml.safe_dump(recipe))
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(argv, case_dir, monkeypatch, capsys)
    guard.verify()
    assert not (case_dir / "runs").exists()
    return outcome


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_what_launch_owns_is_refused_however_spelled(case, tmp_path, monkeypatch, capsys):
    outcome = _run(case, tmp_path, monkeypatch, capsys)
    says = [case.says] if isinstance(case.says, str) else case.says
    check(outcome, case.code, [*says, "--sbatch-arg" if case.via == "flag" else
                               "slurm.sbatch_args"], stream="err")


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_arguments_are_submitted_spelled_out(case, tmp_path, monkeypatch, capsys):
    outcome = _run(case, tmp_path, monkeypatch, capsys)
    check(outcome, 0, case.says, stream="out")
    submit = next(line for line in outcome.out.splitlines() if line.startswith("  sbatch "))
    argv = shlex.split(submit)
    # every option as sbatch's whole name, and nothing launch owns among the extra ones
    for item in argv[1:-1]:
        assert item.startswith("--"), submit
    assert parse(argv[1:-1])


def test_a_runs_folder_sbatch_would_expand_is_refused(tmp_path, monkeypatch, capsys):
    for runs in ("runs-%j", "runs\\x"):
        case_dir = tmp_path / f"case{len(runs)}"
        case_dir.mkdir()
        (case_dir / "recipe.yml").write_text(yaml.safe_dump(RECIPE))
        outcome = run_cli([*SLURM, "--runs-dir", runs], case_dir, monkeypatch, capsys)
        check(outcome, 2, ["--runs-dir", "file name pattern in --output"], stream="err")


def test_every_name_of_an_owned_option_is_owned():
    """getopt_long treats names with one val as one option (tasks-per-node and
    ntasks-per-node): owning one name and not the other would let it through."""
    by_val: dict[str, set[str]] = {}
    for option in TABLE:
        by_val.setdefault(option.val, set()).add(option.name)
    for names in by_val.values():
        owned = names & set(OWNED)
        assert not owned or owned == names, names


def test_normalizing_is_stable():
    """The recipe's arguments are checked again with the flags' (slurm_settings): spelled-out
    arguments parse to themselves."""
    once = normalize(["-vq", "high", "--constr", "a100", "--export", "ALL,X=1"],
                     env_name_problem)
    assert once == ["--verbose", "--qos=high", "--constraint=a100", "--export=ALL,X=1"]
    assert normalize(once, env_name_problem) == once


# ---- the table against the sbatch installed here ------------------------------------------

SBATCH = which("sbatch")


def _sbatch(conf: Path, *args: str) -> str:
    proc = subprocess.run(["sbatch", *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env={**os.environ, "SLURM_CONF": str(conf)})
    return proc.stdout + proc.stderr


def _mine(item: str) -> str:
    try:
        parse([item])
        return "ok"
    except SbatchArgError as err:
        text = str(err)
        return ("ambiguous" if "ambiguous" in text else "unknown" if "not an option" in text
                else "needs-value" if "needs a value" in text else "ok")


def _theirs(output: str) -> str:
    return ("ambiguous" if "is ambiguous" in output else
            "unknown" if "unrecognized option" in output or "invalid option" in output else
            "needs-value" if "requires an argument" in output else "ok")


@pytest.mark.skipif(SBATCH is None, reason="sbatch is not installed (scripts/test installs it)")
def test_the_option_table_is_sbatchs_own(tmp_path):
    """Slurm's getopt_long answers without a controller: every option's argument kind, every
    one- and two-letter prefix (unknown, ambiguous or one option), every short letter."""
    conf = tmp_path / "slurm.conf"
    # MessageTimeout=1: the probes that parse (--wrap=x, --wr=) go on to submit, and against
    # no controller sbatch retries the connection for MessageTimeout seconds (10 by default:
    # 9 s each); with 1 it fails at once with the same answer.
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nMessageTimeout=1\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n")
    probes = []
    for option in TABLE:
        probes.append((f"--{option.name}=x", "none" if option.arg == "none" else "takes"))
        probes.append((f"--{option.name}", "required" if option.arg == "required" else "bare"))
    prefixes = [a + b for a in string.ascii_lowercase for b in ["", *string.ascii_lowercase,
                                                                "-"]]
    letters = list(string.ascii_letters + string.digits)
    with ThreadPoolExecutor(8) as pool:
        kinds = list(pool.map(lambda p: _sbatch(conf, p[0]), probes))
        by_prefix = list(pool.map(lambda p: _sbatch(conf, f"--{p}="), prefixes))
        by_letter = list(pool.map(lambda c: _sbatch(conf, f"-{c}"), letters))
    for (item, expect), output in zip(probes, kinds):
        if expect == "none":
            assert "doesn't allow an argument" in output, (item, output)
        elif expect == "takes":
            assert "doesn't allow an argument" not in output, (item, output)
        else:
            assert ("requires an argument" in output) == (expect == "required"), (item, output)
    for prefix, output in zip(prefixes, by_prefix):
        assert _mine(f"--{prefix}=x") == _theirs(output), (prefix, output)
    for letter, output in zip(letters, by_letter):
        assert _mine(f"-{letter}") == _theirs(output), (letter, output)
