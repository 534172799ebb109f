"""Run folders that may be hostile (issue 25, classes 1-3 and the run-folder parts of 8), as
tables: links planted to make `launch report` or `--resume` write or move files elsewhere;
FIFOs, devices and huge sparse files where launch expects small JSON; tampered JSON (wrong
types, null, 1e999, a 300-digit attempt, missing keys, files where folders belong); control
characters meant for the terminal. Every case answers with its exit code and a message naming
the file (and the key), no traceback, nothing written or moved outside its folder, and no
process left; `launch runs` keeps listing the other runs."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import launch_cmd
from tests.run.hostile import Guard, check, run_cli, snapshot

pytestmark = pytest.mark.timeout(120)   # a FIFO opened for reading would hang a case

RUN = "r1"
FOREIGN = "holds what neither launch nor its trainer makes"
NODE = "node0"
RECIPE = {"name": "t", "nodes": 1, "checkpoint": {"every_steps": 10},
          "train": {"dataset": "digits", "image_size": 8, "patch_size": 4, "steps": 20,
                    "depth": 2}}
SECRET = "keep me\n"


def write_checkpoint(folder: Path, step: int, recipe: dict) -> None:
    """A checkpoint as train/checkpoint.py writes one, under the recipe's settings."""
    import torch

    from launcher.job.recipe import recipe_from_mapping
    from launch_node import checkpoint_files as files
    from train.options import resume_signature

    folder.mkdir(parents=True, exist_ok=True)
    name = files.stem(step)
    size = files.write_atomic(folder / f"{name}.pt", lambda f: torch.save({"step": step}, f))
    signature = resume_signature(recipe_from_mapping(recipe, "r").model_dump(), 1)
    files.write_json_atomic(folder / f"{name}.json", {
        "format": files.FORMAT, "step": step, "epoch": 0, "offset": step, "signature": signature,
        "bytes": size, "file": f"{name}.pt"})


def make_run(runs: Path, run_id: str = RUN, *, status: str | None = "succeeded",
             checkpoint: bool = True) -> Path:
    """A run folder as a finished `launch run --local` leaves it (the files launch reads)."""
    root = runs / run_id
    node = root / NODE
    node.mkdir(parents=True)
    (root / "launch.json").write_text(json.dumps({
        "run_id": run_id, "stamp": f"{run_id}.0123456789abcdef", "pid": 1, "host": "h",
        "started_at": "2026-01-02T03:04:05+00:00", "attempt": 1}))
    (root / "plan.json").write_text(json.dumps({
        "run_id": run_id, "recipe": {"name": "t", "source": "recipe.yml"}, "nnodes": 1,
        "nproc_per_node": 1, "world_size": 1,
        "nodes": [{"name": NODE, "address": "127.0.0.1", "gpus": 0, "env": {},
                   "argv": ["python", "-m", "torch.distributed.run", "train/main.py"]}]}))
    result = {"backend": "gloo", "steps": 20, "final_loss": 0.25, "eval_accuracy": 0.9,
              "images_per_sec": 100.0, "step_time_s": 0.1, "comm_wait_s": 0.02,
              "compute_s": 0.08, "comm_share": 0.2}
    if status is not None:
        (root / "summary.json").write_text(json.dumps({
            "run_id": run_id, "status": status, "recipe": "t", "nnodes": 1, "attempt": 1,
            "restarts": [], "hang": None, "rank0_node": NODE, "duration_s": 12.5,
            "started_at": "2026-01-02T03:04:05+00:00", **result}))
    (node / "result.json").write_text(json.dumps(result))
    (root / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "loss": 1.0 / s, "images_per_sec": 100.0, "step_time_s": 0.1,
         "comm_wait_s": 0.02, "compute_s": 0.08}) + "\n" for s in (5, 10, 15, 20)))
    (node / "node.log").write_text("node0/0: step 20/20\n")
    (root / "recipe.yml").write_text(yaml.safe_dump(RECIPE))
    if checkpoint:
        write_checkpoint(node / "checkpoints", 10, RECIPE)
    return root


# ---- what a case does ----------------------------------------------------------------------

REPORT = ["report", RUN]
RUNS = ["runs"]
RESUME_DRY = ["run", "--resume", RUN, "--local", "--dry-run"]


def resume_begin(case_dir: Path) -> tuple[int, str]:
    """What a real `--resume` does first in the run folder (RunFolder.for_launch): the earlier
    attempt's files moved to attempts/<n>/, a new launch.json. Answered like the CLI does."""
    from launcher.core.errors import LauncherError
    from launcher.runs.folder import RunFolder

    try:
        RunFolder.for_launch(case_dir / "runs", RUN, resume=True)
    except LauncherError as err:
        return err.exit_code, str(err)
    return 0, "began"


@dataclass
class Case:
    id: str
    plant: Callable[[Path, Path], None]      # (run folder, outside folder)
    argv: list[str] | str                    # CLI argv, or "resume-begin"
    code: int
    says: str | list[str]
    after: Callable[[Path, Path], None] | None = None   # more checks (run folder, outside)
    runs: list[str] = field(default_factory=list)       # other runs that must stay listed


def run_case(case: Case, tmp_path: Path, monkeypatch, capsys) -> None:
    case_dir = tmp_path / "case"
    outside = tmp_path / "outside"
    (outside / "elsewhere").mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET)
    make_run(outside / "fake-runs", RUN)                 # a run folder a link may point to
    root = make_run(case_dir / "runs")
    make_run(case_dir / "runs", "r0-good")              # must stay listed by `launch runs`
    case.plant(root, outside)
    guard = Guard(tmp_path, case_dir)
    if case.argv == "resume-begin":
        code, text = resume_begin(case_dir)
        assert code == case.code, text
        for fragment in [case.says] if isinstance(case.says, str) else case.says:
            assert fragment in text, text
    else:
        outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
        check(outcome, case.code, case.says)
        for run_id in case.runs:
            assert run_id in outcome.out, outcome.out
    guard.verify()
    assert (outside / "secret.txt").read_text() == SECRET
    assert not list((outside / "elsewhere").iterdir())
    if case.after:
        case.after(root, outside)


def link(name: str, target: Callable[[Path], Path]) -> Callable[[Path, Path], None]:
    def plant(root: Path, outside: Path) -> None:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            import shutil
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target(outside))
    return plant


def secret(outside: Path) -> Path:
    return outside / "secret.txt"


def elsewhere(outside: Path) -> Path:
    return outside / "elsewhere"


def fake_run(outside: Path) -> Path:
    return outside / "fake-runs" / RUN


def both(*plants):
    def plant(root: Path, outside: Path) -> None:
        for p in plants:
            p(root, outside)
    return plant


def regular(name: str):
    def after(root: Path, outside: Path) -> None:
        assert (root / name).is_file() and not (root / name).is_symlink()
    return after


def moved_as_link(root: Path, outside: Path) -> None:
    kept = root / "attempts" / "1" / "summary.json"
    assert kept.is_symlink() and os.readlink(kept) == str(secret(outside))
    assert secret(outside).read_text() == SECRET
    assert json.loads((root / "launch.json").read_text())["attempt"] == 2


def replace_run_with_link(root: Path, outside: Path) -> None:
    import shutil
    shutil.rmtree(root)
    root.symlink_to(fake_run(outside))


def fifo(name: str):
    def plant(root: Path, outside: Path) -> None:
        (root / name).unlink(missing_ok=True)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(root / name)
    return plant


def sparse(name: str):
    def plant(root: Path, outside: Path) -> None:
        with open(root / name, "wb") as f:
            f.truncate(4 << 30)   # 4 GB, no disk used
    return plant


def dev_zero(name: str):
    def plant(root: Path, outside: Path) -> None:
        (root / name).unlink(missing_ok=True)
        (root / name).symlink_to("/dev/zero")
    return plant


# ---- class 1: links planted in the run folder ------------------------------------------------

LINKS = [
    Case("report-md-is-a-link", link("report.md", secret), REPORT, 0, "# Run report",
         after=regular("report.md")),
    Case("report-temporaries-are-links",
         both(link("report.md.tmp", secret), link("report.json.tmp", secret),
              link(".report.json.tmp", secret)),
         REPORT, 0, "# Run report", after=regular("report.json")),
    Case("report-run-folder-is-a-link", replace_run_with_link, REPORT, 2,
         ["r1: is a symbolic link", "never through a link"],
         after=lambda root, outside: not (fake_run(outside) / "report.md").exists() or
         pytest.fail("the report was written through the link")),
    Case("report-plan-is-a-link", link("plan.json", lambda o: fake_run(o) / "plan.json"),
         REPORT, 2, "plan.json: is a symbolic link"),
    Case("report-node-folder-is-a-link", link(NODE, elsewhere), REPORT, 2,
         f"{NODE}: is a symbolic link"),
    Case("report-summary-is-a-link", link("summary.json", lambda o: fake_run(o) / "summary.json"),
         REPORT, 0, ["summary.json: is a symbolic link", "# Run report"]),
    Case("resume-launch-json-is-a-link", link("launch.json", lambda o: fake_run(o) / "launch.json"),
         RESUME_DRY, 2, "launch.json is not a plain file"),
    Case("resume-run-folder-is-a-link", replace_run_with_link, RESUME_DRY, 2,
         "r1: is a symbolic link"),
    Case("resume-recipe-copy-is-a-link", link("recipe.yml", secret), RESUME_DRY, 2,
         [FOREIGN, "recipe.yml (a symbolic link to"]),
    Case("resume-checkpoints-is-a-link", link(f"{NODE}/checkpoints", elsewhere), RESUME_DRY, 2,
         [FOREIGN, f"{NODE}/checkpoints (a symbolic link"]),
    Case("resume-attempts-is-a-link", link("attempts", elsewhere), "resume-begin", 2,
         [FOREIGN, "attempts (a symbolic link"],
         after=lambda root, outside: (root / "plan.json").is_file() or
         pytest.fail("plan.json was moved")),
    Case("resume-attempt-folder-is-a-link", link("attempts/1", elsewhere), "resume-begin", 2,
         "attempts/1 (a symbolic link"),
    Case("resume-torchrun-log-folder-is-a-link", link(f"{NODE}/torchrun", elsewhere),
         "resume-begin", 2, f"{NODE}/torchrun (a symbolic link"),
    Case("resume-hang-folder-is-a-link", link(f"{NODE}/hang", elsewhere), RESUME_DRY, 2,
         f"{NODE}/hang (a symbolic link"),
    Case("resume-fifo-where-nccl-writes", fifo(f"{NODE}/nccl-debug.h.1.log"), RESUME_DRY, 2,
         f"{NODE}/nccl-debug.h.1.log (a FIFO)"),
    Case("resume-keeps-nccls-own-pipe", fifo(f"{NODE}/hang/nccl-trace.rank0.pipe"), RESUME_DRY,
         0, "resuming run r1 from checkpoint step 10"),
    Case("runs-lists-a-linked-folder-as-refused-without-reading-it",
         lambda root, outside: (root.parent / "r2").symlink_to(fake_run(outside)), RUNS, 0,
         ["r2", "refused", "is a symbolic link"], runs=["r0-good", RUN]),
]


@pytest.mark.parametrize("case", LINKS, ids=[c.id for c in LINKS])
def test_links_in_a_run_folder_are_never_followed(case, tmp_path, monkeypatch, capsys):
    run_case(case, tmp_path, monkeypatch, capsys)


def test_a_node_log_planted_as_a_link_stops_a_resume_before_anything_starts(
        tmp_path, monkeypatch, capsys):
    """A real `--resume` (no --dry-run): the attempt begins, then the node's log is opened
    for appending; a link there is refused before any process starts."""
    case = Case("resume-node-log-is-a-link", link(f"{NODE}/node.log", secret),
                ["run", "--resume", RUN, "--local"], 2, f"{NODE}/node.log (a symbolic link")
    run_case(case, tmp_path, monkeypatch, capsys)


def test_the_attempt_move_itself_moves_a_link_as_a_link(tmp_path):
    """Below the refusal, the move never follows a link either (safefile.move)."""
    from launcher.runs.folder import RunFolder

    root = make_run(tmp_path / "runs", checkpoint=False)
    (tmp_path / "secret.txt").write_text(SECRET)
    (root / "summary.json").unlink()
    (root / "summary.json").symlink_to(tmp_path / "secret.txt")
    assert RunFolder(root).begin_attempt() == 2
    moved_as_link(root, tmp_path)


# ---- class 2: FIFOs, devices and huge files where small JSON belongs -------------------------

KINDS = {"fifo": (fifo, "FIFO"), "sparse-4g": (sparse, "4294967296 bytes"),
         "dev-zero": (dev_zero, "symbolic link")}
# What each command does with each file: (exit code, says) with {kind} for the kind's words.
# A file a command does not read leaves it answering as usual.
READS = {
    "runs": (RUNS, {
        "launch.json": (0, ["launch.json", "{kind}", "unreadable"]),
        "summary.json": (0, ["summary.json", "{kind}", "unknown"]),
        "plan.json": (0, ["plan.json", "{kind}"]),
    }, (0, ["succeeded"])),
    "report": (REPORT, {
        "plan.json": (2, ["plan.json", "{kind}"]),
        "summary.json": (0, ["warning", "summary.json", "{kind}"]),
        f"{NODE}/result.json": (0, ["warning", "result.json", "{kind}"]),
        f"{NODE}/topology.txt": (0, ["topology not read", "{kind_nccl}"]),
        f"{NODE}/nccl-debug.h.1.log": (0, ["NCCL log not read", "{kind_nccl}"]),
    }, (0, ["# Run report"])),
    "resume": (RESUME_DRY, {
        "launch.json": (2, ["launch.json", "{kind_resume}"]),
        "plan.json": (2, ["plan.json", "{kind_resume}"]),
        "recipe.yml": (2, ["recipe.yml", "{kind}"]),
        f"{NODE}/checkpoints/step-00000010.json": (2, ["step-00000010.json", "{kind}"]),
    }, (0, ["resuming run r1 from checkpoint step 10"])),
}
FILES = ["launch.json", "summary.json", "plan.json", f"{NODE}/result.json", "recipe.yml",
         f"{NODE}/checkpoints/step-00000010.json", f"{NODE}/topology.txt",
         f"{NODE}/nccl-debug.h.1.log", "metrics.jsonl"]


def _words(kind: str, command: str, name: str) -> dict[str, str]:
    said = KINDS[kind][1]
    # launch.json and plan.json are checked as plain files before --resume reads them; the
    # report's NCCL log reader says "not a regular file" for a FIFO and a device alike.
    resume = "not a plain file" if kind != "sparse-4g" else said
    nccl = ("not a regular file" if kind == "fifo" else said)
    return {"kind": said, "kind_resume": resume, "kind_nccl": nccl}


def _expected(command: str, name: str, kind: str) -> tuple[int, list[str]]:
    argv, reads, default = READS[command]
    code, says = reads.get(name, default)
    if command == "resume" and kind != "sparse-4g" and name not in ("launch.json", "plan.json"):
        # A resumed run writes on in its folder: a link or a FIFO anywhere in it is refused.
        code, says = 2, [FOREIGN, name, "{kind}"]
    return code, [s.format(**_words(kind, command, name)) for s in says]


NOT_REGULAR = [
    Case(f"{command}-{name.replace('/', '-')}-{kind}", KINDS[kind][0](name), argv,
         *_expected(command, name, kind), runs=["r0-good"] if command == "runs" else [])
    for command, (argv, _, _) in READS.items()
    for name in FILES for kind in KINDS
]


@pytest.mark.parametrize("case", NOT_REGULAR, ids=[c.id for c in NOT_REGULAR])
def test_fifos_devices_and_huge_files_never_hang_or_swamp(case, tmp_path, monkeypatch, capsys):
    run_case(case, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("argv, code", [(RUNS, 0), (REPORT, 0), (RESUME_DRY, 2)],
                         ids=["runs", "report", "resume"])
def test_fifos_answer_as_a_process_within_a_timeout(tmp_path, argv, code):
    """The same as a user runs it: a separate process, which must end by itself."""
    root = make_run(tmp_path / "runs")
    (root / "summary.json").unlink()
    os.mkfifo(root / "summary.json")
    (root / "launch.json").unlink()
    os.mkfifo(root / "launch.json")
    before = snapshot(tmp_path)
    proc = subprocess.run(launch_cmd(*argv), cwd=tmp_path, text=True, capture_output=True,
                          timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "LAUNCH_HOME": str(tmp_path / "home")})
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "FIFO" in proc.stdout + proc.stderr or "not a plain file" in proc.stderr
    assert proc.returncode == code, proc.stderr
    assert {k: v for k, v in snapshot(tmp_path).items() if "report." not in k} == \
        {k: v for k, v in before.items() if "report." not in k}


# ---- class 3: tampered JSON --------------------------------------------------------------------

def edit(name: str, change: Callable[[dict], object] | object):
    """Replace a JSON file of the run folder by `change(document)` (or by the value)."""
    def plant(root: Path, outside: Path) -> None:
        path = root / name
        doc = json.loads(path.read_text())
        value = change(doc) if callable(change) else change
        path.write_text(value if isinstance(value, str) else json.dumps(value))
    return plant


def set_key(key: str, value):
    def change(doc: dict) -> dict:
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[leaf] = value
        return doc
    return change


def drop_key(key: str):
    def change(doc: dict) -> dict:
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[leaf]
        return doc
    return change


def file_for_folder(name: str):
    def plant(root: Path, outside: Path) -> None:
        import shutil
        shutil.rmtree(root / name)
        (root / name).write_text("not a folder\n")
    return plant


TAMPERED = [
    # launch.json
    Case("runs-launch-list", edit("launch.json", []), RUNS, 0,
         ["launch.json", "expected a JSON object", "unreadable"], runs=["r0-good"]),
    Case("runs-attempt-1e999", edit("launch.json", '{"attempt": 1e999}'), RUNS, 0,
         ["launch.json: attempt", "unreadable"], runs=["r0-good"]),
    Case("runs-attempt-300-digits", edit("launch.json", set_key("attempt", 10**300)), RUNS, 0,
         ["launch.json: attempt", "less than or equal to 1000000"], runs=["r0-good"]),
    Case("runs-pid-string", edit("launch.json", set_key("pid", "1")), RUNS, 0,
         ["launch.json: pid", "valid integer"], runs=["r0-good"]),
    Case("runs-stamp-with-newline", edit("launch.json", set_key("stamp", "r1.x\nLD_PRELOAD=")),
         RUNS, 0, ["launch.json: stamp", "control character"], runs=["r0-good"]),
    Case("resume-attempt-300-digits", edit("launch.json", set_key("attempt", 10**300)),
         RESUME_DRY, 2, "launch.json: attempt: expected less than or equal to 1000000"),
    Case("resume-begin-attempt-null", edit("launch.json", set_key("attempt", None)),
         "resume-begin", 2, "launch.json: attempt: expected a valid integer"),
    Case("resume-not-json", edit("launch.json", "{\"attempt\": 1"), RESUME_DRY, 2,
         ["launch.json", "not valid JSON"]),
    # summary.json
    Case("runs-summary-null", edit("summary.json", "null"), RUNS, 0,
         ["summary.json", "expected a JSON object", "unknown"], runs=["r0-good"]),
    Case("runs-status-not-a-word", edit("summary.json", set_key("status", "ok; rm -rf")), RUNS,
         0, ["summary.json: status", "one short word"], runs=["r0-good"]),
    Case("runs-steps-string", edit("summary.json", set_key("steps", "20")), RUNS, 0,
         ["summary.json: steps", "valid integer"], runs=["r0-good"]),
    Case("runs-duration-inf", edit("summary.json", '{"status": "failed", "duration_s": 1e999}'),
         RUNS, 0, ["summary.json: duration_s", "finite number"], runs=["r0-good"]),
    Case("report-restarts-object", edit("summary.json", set_key("restarts", {"a": 1})),
         REPORT, 0, ["warning", "summary.json: restarts", "valid list"]),
    Case("report-restart-missing-key", edit("summary.json", set_key(
        "restarts", [{"node": NODE, "kind": "worker", "reason": "x"}])), REPORT, 0,
        ["summary.json: restarts[0].at_time_s: missing"]),
    Case("report-hang-list", edit("summary.json", set_key("hang", [1, 2])), REPORT, 0,
         ["summary.json: hang", "valid dictionary"]),
    Case("report-rank0-node-escapes", edit("summary.json", set_key("rank0_node", "../../x")),
         REPORT, 0, ["summary.json: rank0_node", "not a node name launch writes"]),
    Case("report-accuracy-above-one", edit("summary.json", set_key("eval_accuracy", 96.4)),
         REPORT, 0, ["summary.json: eval_accuracy", "less than or equal to 1"]),
    # plan.json
    Case("report-plan-nodes-string", edit("plan.json", set_key("nodes", "node0")), REPORT, 2,
         ["plan.json: nodes", "valid list"]),
    Case("report-plan-node-name-missing", edit("plan.json", drop_key("nodes.0.name")), REPORT,
         2, "plan.json: nodes[0].name: missing"),
    Case("report-plan-node-escapes", edit("plan.json", set_key("nodes.0.name", "../../x")),
         REPORT, 2, ["plan.json: nodes[0].name", "not a node name"]),
    Case("report-plan-env-not-text", edit("plan.json", set_key("nodes.0.env", {"A": 1})),
         REPORT, 2, "plan.json: nodes[0].env.A: expected a valid string"),
    Case("resume-plan-nodes-null", edit("plan.json", set_key("nodes", None)), RESUME_DRY, 2,
         "plan.json: nodes: expected a valid list"),
    Case("runs-plan-nnodes-float", edit("plan.json", set_key("nnodes", 2.5)), RUNS, 0,
         ["plan.json: nnodes", "valid integer"], runs=["r0-good"]),
    # report inputs
    Case("report-result-string-number", edit(f"{NODE}/result.json",
                                             set_key("images_per_sec", "fast")),
         REPORT, 0, ["result.json: images_per_sec", "valid number"]),
    Case("report-result-auto-wrong", edit(f"{NODE}/result.json", set_key("auto", "powersgd")),
         REPORT, 0, ["result.json: auto", "valid dictionary"]),
    Case("report-result-stragglers-item", edit(f"{NODE}/result.json", set_key(
        "stragglers", [{"node": NODE, "rank": 0, "ratio": "2x", "intervals": 3}])),
        REPORT, 0, "result.json: stragglers[0].ratio"),
    Case("report-metrics-strings", lambda root, outside: (
        (root / NODE / "result.json").unlink(),
        (root / "metrics.jsonl").write_text(
            '{"step": 1, "images_per_sec": "fast", "step_time_s": "0.1"}\n'
            '{"step": 2, "images_per_sec": 10.0, "step_time_s": 0.1}\n{"step"')),
        REPORT, 0, ["metrics.jsonl: 1 line(s) skipped", "images_per_sec", "10.0 images/s"]),
    Case("report-bandwidth-rows-string", lambda root, outside: (
        root / "bandwidth.json").write_text('{"collective": "all_reduce", "rows": "x"}'),
        REPORT, 0, ["bandwidth.json: rows", "valid list"]),
    # files where folders belong
    Case("report-node-folder-is-a-file", file_for_folder(NODE), REPORT, 2,
         f"{NODE}: is not a folder"),
    Case("resume-node-folder-is-a-file", file_for_folder(NODE), RESUME_DRY, 2,
         f"{NODE}: is not a folder"),
    Case("resume-checkpoints-is-a-file", file_for_folder(f"{NODE}/checkpoints"), RESUME_DRY,
         2, "checkpoints: is not a folder"),
    Case("resume-begin-attempts-is-a-file",
         lambda root, outside: (root / "attempts").write_text("x"), "resume-begin", 2,
         "attempts"),
    Case("report-folder-is-a-file", lambda root, outside: (
        __import__("shutil").rmtree(root), root.write_text("x")), REPORT, 2,
        "no run folder r1"),
]


@pytest.mark.parametrize("case", TAMPERED, ids=[c.id for c in TAMPERED])
def test_tampered_files_are_named_with_their_key(case, tmp_path, monkeypatch, capsys):
    run_case(case, tmp_path, monkeypatch, capsys)


# ---- class 8: what a run folder shows, and checkpoints that are not checkpoints ----------------

def escapes(root: Path, outside: Path) -> None:
    doc = json.loads((root / "plan.json").read_text())
    doc["recipe"]["name"] = "t\x1b]0;pwned\x07\x1b[2J"
    (root / "plan.json").write_text(json.dumps(doc))
    doc = json.loads((root / "launch.json").read_text())
    doc["started_at"] = "\x1b[31mtoday\r"
    (root / "launch.json").write_text(json.dumps(doc))


def garbage_checkpoint(step: int, older: bool):
    def plant(root: Path, outside: Path) -> None:
        from launch_node import checkpoint_files as files
        folder = root / NODE / "checkpoints"
        if not older:
            for path in folder.iterdir():
                path.unlink()
        name = files.stem(step)
        (folder / f"{name}.pt").write_bytes(b"not a checkpoint at all")
        files.write_json_atomic(folder / f"{name}.json", {
            "format": 1, "step": step, "epoch": 0, "offset": step, "signature": {},
            "bytes": 23, "file": f"{name}.pt"})
    return plant


def truncated_checkpoint(root: Path, outside: Path) -> None:
    pt = root / NODE / "checkpoints" / "step-00000010.pt"
    pt.write_bytes(pt.read_bytes()[:100])


SMALLER = [
    Case("runs-escape-sequences-shown-escaped", escapes, RUNS, 0,
         ["\\x1b]0;pwned\\x07", "\\x1b[31mtoday\\r"], runs=["r0-good"]),
    Case("runs-columns", lambda root, outside: None, RUNS, 0,
         ["run", "recipe", "backend", "nodes", "status", "started", "duration", "steps",
          "loss", "accuracy", "local", "succeeded", "12s", "0.2500", "90.00%"]),
    Case("runs-running-shows-its-last-logged-step", lambda root, outside: (
        (root / "summary.json").unlink(),
        (root / NODE / "metrics.jsonl").write_text('{"step": 15, "loss": 0.5}\n{"st')),
        RUNS, 0, ["abandoned", "15", "0.5000"]),
    Case("resume-checkpoint-that-is-not-one", garbage_checkpoint(10, older=False), RESUME_DRY,
         2, ["not a torch.save archive", "would start over from step 0"]),
    Case("resume-says-which-checkpoint-really-loads", garbage_checkpoint(30, older=True),
         RESUME_DRY, 0, ["resuming run r1 from checkpoint step 10",
                         "step 30: step-00000030.pt is not a torch.save archive"]),
    Case("resume-truncated-checkpoint", truncated_checkpoint, RESUME_DRY, 2,
         ["step-00000010.pt is 100 bytes, its .json says"]),
    Case("resume-checkpoint-json-step-mismatch", edit(
        f"{NODE}/checkpoints/step-00000010.json", set_key("step", 400)), RESUME_DRY, 2,
        "its .json says step 400"),
    Case("resume-checkpoint-json-without-signature", edit(
        f"{NODE}/checkpoints/step-00000010.json", drop_key("signature")), RESUME_DRY, 2,
        "signature: missing"),
]


@pytest.mark.parametrize("case", SMALLER, ids=[c.id for c in SMALLER])
def test_what_a_run_folder_shows_is_the_truth(case, tmp_path, monkeypatch, capsys):
    run_case(case, tmp_path, monkeypatch, capsys)


def test_a_real_run_scans_a_hostile_runs_folder_without_hanging(tmp_path):
    """Every real `launch run` looks for abandoned runs in its runs folder first."""
    from launcher.runs.leftovers import abandoned_warnings

    root = make_run(tmp_path / "runs", checkpoint=False)
    (root / "summary.json").unlink()
    os.mkfifo(root / "summary.json")
    make_run(tmp_path / "runs", "r2", status=None, checkpoint=False)
    (tmp_path / "runs" / "r3").symlink_to(root)
    assert abandoned_warnings(tmp_path / "runs") == []   # nothing of them runs here
