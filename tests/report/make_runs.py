"""Makes the real run folders tests/report/data/runs/ holds (not a test: run it by hand, as
root, under the CPU lock, to refresh them):

    flock /work/cpu.lock .venv/bin/python tests/report/make_runs.py [NAME ...]

Each is a real `launch run --local --nodes 2` on this machine; what the page and `launch
compare` read is kept (plan, summary, metrics, recipe copy, result.json, hang stacks, node
logs of the straggler run), the rest (checkpoints, torchrun's per-rank files, heartbeats) is
not. The runs:

  demo          the bundled demo recipe vit-tiny-local as it is (330 steps, comm_hook none)
  demo-fp16     the same with ddp.comm_hook fp16: the compared pair of the README
  demo-auto     the same with ddp.comm_hook auto, bucket_cap_mb auto, PowerSGD rank 4 (as
                benchmarks/ddp_tuning.py's auto variant): the trainer measures and decides
  straggler     the tests' FAST recipe with 256-image batches, 60 steps; node1's rank is
                stopped 70% of the time (SIGSTOP 0.25 s, SIGCONT 0.1 s) from its first
                progress line on: the trainer names it a straggler
  hang-restart  FAST, 200 steps, checkpoints every 40; node1's rank is stopped for good after
                the first checkpoint: the hang watch (10 s) dumps every stack, restarts it
                (--max-restarts 1) and the run resumes from the checkpoint and succeeds
  job-steps     a user's own script (tests/job/project.py's main.py: DDP on a tiny model,
                one LAUNCH_STEP line per step with loss and busy_s), 300 steps; rank 1
                crashes once at step 3 and the run restarts (--max-restarts 1) and resumes
  job-silent    the same script in its mode that prints one line and no LAUNCH_STEP: all
                launch knows is the exits and the duration

`--screenshots` instead writes the README's pictures from the kept runs: docs/report-demo.png
(the demo run's report.html) and docs/compare-demo.png (`launch compare --html demo
demo-fp16`), as headless chromium shows them.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.run.conftest import FAST, stopped_most_of_the_time, wait_for, worker_pid  # noqa: E402

DATA = REPO / "tests/report/data/runs"
KEEP = ("plan.json", "summary.json", "metrics.jsonl", "progress.jsonl", "recipe.yml")
KEEP_IN_NODES = ("result.json",)


def launch(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(REPO / ".venv/bin/launch"), "run", "--local", "--nodes", "2",
                             "--runs-dir", str(cwd / "runs"), *args], cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def recipe(cwd: Path, name: str, data: dict) -> str:
    path = cwd / f"{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def bundled(**ddp) -> dict:
    data = yaml.safe_load((REPO / "launcher/recipes/vit-tiny-local.yml").read_text())
    data["ddp"].update(ddp)
    return data


def fast(**train) -> dict:
    data = copy.deepcopy(FAST)
    data["train"].update(train)
    return data


def progressed(run_dir: Path) -> bool:
    return any("step 5/" in p.read_text() or "step 20/" in p.read_text()
               for p in run_dir.glob("*/node.log"))


def keep(run_dir: Path, name: str, node_logs: bool = False) -> None:
    target = DATA / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for f in KEEP:
        if (run_dir / f).exists():
            shutil.copyfile(run_dir / f, target / f)
    for node in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        wanted = [node / f for f in KEEP_IN_NODES if (node / f).exists()]
        if node_logs and (node / "node.log").exists():
            wanted.append(node / "node.log")
        if node.name == "hang":
            wanted = sorted(node.glob("*.txt"))
        for f in wanted:
            (target / node.name).mkdir(exist_ok=True)
            shutil.copyfile(f, target / node.name / f.name)


def finish(proc: subprocess.Popen, name: str) -> None:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{name}: launch run exited {proc.returncode}:\n{out[-4000:]}")


def make_demo(cwd: Path, name: str, **ddp) -> None:
    proc = launch(cwd, recipe(cwd, name, bundled(**ddp)), "--run-id", name)
    finish(proc, name)
    keep(cwd / "runs" / name, name)


def make_straggler(cwd: Path) -> None:
    name = "straggler"
    proc = launch(cwd, recipe(cwd, name, fast(batch_size=256, steps=60, log_every=5)),
                  "--run-id", name)
    run_dir = cwd / "runs" / name
    wait_for(lambda: progressed(run_dir), 300, "the first progress line")
    victim = wait_for(lambda: worker_pid(name, "node1"), 60, "node1's rank")
    with stopped_most_of_the_time(victim):
        finish(proc, name)
    keep(run_dir, name, node_logs=True)


def make_job(cwd: Path, name: str, *args: str) -> None:
    from tests.job.project import write_project

    project = write_project(cwd / "project")
    proc = subprocess.Popen([str(REPO / ".venv/bin/launch"), "run", "--local", "--nodes", "2",
                             "main.py", "--run-id", name, "--runs-dir", str(cwd / "runs"),
                             *args], cwd=project, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finish(proc, name)
    keep(cwd / "runs" / name, name)


def make_hang_restart(cwd: Path) -> None:
    name = "hang-restart"
    data = fast(steps=200, log_every=20)
    data["checkpoint"] = {"every_steps": 40, "keep": 2}
    proc = launch(cwd, recipe(cwd, name, data), "--run-id", name, "--max-restarts", "1",
                  "--hang-timeout", "10")
    run_dir = cwd / "runs" / name
    wait_for(lambda: list((run_dir / "node0" / "checkpoints").glob("*.json")), 300,
             "the first checkpoint")
    victim = wait_for(lambda: worker_pid(name, "node1"), 60, "node1's rank")
    os.kill(victim, signal.SIGSTOP)
    finish(proc, name)
    keep(run_dir, name)


MAKERS = {
    "demo": lambda cwd: make_demo(cwd, "demo", comm_hook="none"),
    "demo-fp16": lambda cwd: make_demo(cwd, "demo-fp16", comm_hook="fp16"),
    "demo-auto": lambda cwd: make_demo(cwd, "demo-auto", comm_hook="auto", bucket_cap_mb="auto",
                                       powersgd={"rank": 4}),
    "straggler": make_straggler,
    "hang-restart": make_hang_restart,
    "job-steps": lambda cwd: make_job(cwd, "job-steps", "--max-restarts", "1", "--",
                                      "--mode", "crash-once", "--steps", "300"),
    "job-silent": lambda cwd: make_job(cwd, "job-silent", "--", "--mode", "binary"),
}


def screenshots() -> None:
    from launcher.report.build import write_run_report
    from launcher.report.compare import load_comparison
    from launcher.report.compare_html import write_compare_html
    from tests.report.browser import open_page

    with tempfile.TemporaryDirectory(prefix="page-shots-") as tmp:
        runs = Path(tmp) / "runs"
        shutil.copytree(DATA, runs)
        write_run_report(runs / "demo")
        open_page(runs / "demo" / "report.html", screenshot=REPO / "docs/report-demo.png",
                  width=1100, height=2900)
        page = write_compare_html(load_comparison([runs / "demo", runs / "demo-fp16"]),
                                  Path(tmp) / "compare.html")
        open_page(page, screenshot=REPO / "docs/compare-demo.png", width=1100, height=1500)
    print("wrote docs/report-demo.png and docs/compare-demo.png")


def main(names: list[str]) -> int:
    if names == ["--screenshots"]:
        screenshots()
        return 0
    for name in names or list(MAKERS):
        with tempfile.TemporaryDirectory(prefix=f"page-{name}-") as tmp:
            started = time.monotonic()
            MAKERS[name](Path(tmp))
            print(f"{name}: kept in {DATA / name} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
