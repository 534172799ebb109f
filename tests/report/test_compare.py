"""`launch compare`: runs side by side, ratios against the first, recipe differences, cost;
benchmarks/ddp_tuning.py prints its table through the same code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.report.compare import MISSING, recipe_differences
from tests.nccl.runfolders import build_runs
from tests.report.browser import open_page, well_formed
from tests.report.conftest import DATA

NCCL_DATA = Path(__file__).resolve().parents[1] / "nccl" / "data"


def test_recipe_differences_are_listed_key_by_key():
    a = {"name": "a", "train": {"epochs": 15, "lr": 5e-4}, "ddp": {"comm_hook": "none"}}
    b = {"name": "b", "train": {"epochs": 15, "lr": 1e-3},
         "ddp": {"comm_hook": "powersgd", "powersgd": {"rank": 4}}}
    assert recipe_differences([a, b]) == {
        "name": ["a", "b"], "train.lr": [5e-4, 1e-3], "ddp.comm_hook": ["none", "powersgd"],
        "ddp.powersgd.rank": [MISSING, 4]}
    assert recipe_differences([a, a]) == {}


def test_prices_come_from_the_catalog_for_nodes_of_a_known_type(tmp_path, run_launch):
    runs, _ = build_runs(NCCL_DATA, tmp_path)
    proc = run_launch("compare", "p4d-socket", "p4d-efa", "--runs-dir", str(runs), "--json",
                      check=True)
    figures = json.loads(proc.stdout)["figures"]
    hourly = 2 * 21.957642       # two p4d.24xlarge at the catalog's us-east-1 list price
    assert figures["price of the nodes ($/h)"] == [
        {"value": pytest.approx(hourly), "ratio": 1.0}, {"value": None, "ratio": None}]
    # p4d-socket's images/s: 1871.8 in its rank 0's result.json.
    assert figures["images per dollar"][0]["value"] == pytest.approx(1871.8 * 3600 / hourly)
    # p4d-efa's nodes have no instance type (no price: n/a, not zero); it stopped after
    # three logged intervals of 3303.2, 3531.0 and 3413.3 images/s (its metrics.jsonl): the
    # report quotes their median.
    assert figures["images/s"] == [{"value": 1871.8, "ratio": 1.0},
                                   {"value": 3413.3, "ratio": pytest.approx(3413.3 / 1871.8)}]
    assert "cost of the run ($)" not in figures      # neither run has a duration


def test_what_is_not_a_run_is_named(run_launch, tmp_path):
    proc = run_launch("compare", "nosuch", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == (f"launch: error: no run folder nosuch here or in {tmp_path}/: pass "
                           "runs/<run_id>, a run id (with --runs-dir if the runs are "
                           "elsewhere), or a folder path\n")
    (tmp_path / "empty").mkdir()
    proc = run_launch("compare", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "no plan.json, so not a run folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_two_demo_runs_with_different_comm_hooks_side_by_side(run_launch, tmp_path, ddp_tuning,
                                                               browser):
    """The demo recipe with comm_hook none and fp16 (real runs, tests/report/data). Their
    summary.json: 698.768 and 670.232 images/s, 42838963 and 21423776 bytes sent per step,
    held-out accuracy 0.96379 and 0.96657."""
    page = tmp_path / "compare.html"
    proc = run_launch("compare", "demo", "demo-fp16", "--runs-dir", str(DATA),
                      "--html", str(page), check=True)
    table = proc.stdout.removesuffix(f"page: {page}\n")
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()}
    assert rows["images/s"].split()[1:] == ["698.8", "670.2", "(0.96x)"]   # 670.232 / 698.768
    assert rows["sent per step per host (MB)"].split()[-2:] == ["21.424", "(0.50x)"]
    assert rows["held-out accuracy"].split()[-2:] == ["0.9666", "(1.00x)"]
    assert rows["ddp.comm_hook"].split() == ["ddp.comm_hook", "none", "fp16"]
    assert "ratios: against demo" in table
    # benchmarks/ddp_tuning.py prints the same table for the same two runs.
    assert ddp_tuning.variant_table({"demo": DATA / "demo",
                                     "demo-fp16": DATA / "demo-fp16"}) == table
    shown = open_page(page)
    assert shown.console == [] and all(well_formed(svg) for svg in shown.svgs)
    bars = shown.text("plot-side-by-side")
    assert "698.8 (1.00x)" in bars and "670.2 (0.96x)" in bars
    assert "demo-fp16" in shown.text("plot-loss")
    assert "<td>ddp.comm_hook</td><td>none</td><td>fp16</td>" in shown.dom


def test_two_runs_of_one_script_differ_in_one_argument_and_the_node_count(tmp_path):
    """Two runs of `launch run main.py --nodes N -- ARGS`, the second made from the folder
    above with --workdir project: the difference is one argument and the nodes, said as such
    (the whole argument lists once stood side by side, `.` against `project` as a
    difference, the command line's node count as `-`) and both runs' step lines are plotted
    (tests/report/data/runs/job-steps, kept)."""
    import shutil

    from launcher.report.compare import load_comparison, render_text
    from launcher.report.compare_html import _curves

    first, second = tmp_path / "runs" / "steps-a", tmp_path / "runs" / "steps-b"
    for run in (first, second):
        shutil.copytree(DATA / "job-steps", run)
    recipe = (second / "recipe.yml").read_text()
    (second / "recipe.yml").write_text(recipe.replace("'300'", "'400'").replace(
        "workdir: .", "workdir: project"))
    plan = json.loads((second / "plan.json").read_text())
    base = plan["recipe"]["base_dir"]
    plan["recipe"]["base_dir"] = str(Path(base).parent)
    plan["nodes"] = plan["nodes"] * 2
    plan["nnodes"] = 4
    (second / "plan.json").write_text(json.dumps(plan))
    comparison = load_comparison([first, second])
    assert comparison.recipe_differences == {"job.args": [
        ["--mode", "crash-once", "--steps", "300"], ["--mode", "crash-once", "--steps", "400"]],
        "nodes": [2, 4]}
    text = render_text(comparison)
    assert "job.args    … --steps 300  … --steps 400" in text
    assert "nodes       2              4" in text
    assert _curves(comparison) is not None


def test_a_recipe_a_program_made_is_kept_and_compared(tmp_path):
    """A recipe made from a mapping (benchmarks/ddp_tuning.py, a handed-over request whose
    file is elsewhere) has no file to copy: the run folder keeps its mapping as recipe.yml,
    and `launch compare` reads it (it once said "no readable recipe.yml" for every one)."""
    from launcher.core.yamlfile import load_yaml_file
    from launcher.job.recipe import recipe_from_mapping
    from launcher.runs.folder import RECIPE_COPY, RunFolder

    data = {"name": "variant", "nodes": 2, "train": {"epochs": 1},
            "ddp": {"comm_hook": "powersgd"}}
    recipe = recipe_from_mapping(data, "benchmarks/ddp_tuning.py:variant")
    folder = RunFolder.for_launch(tmp_path / "runs", "r1")
    folder.keep_recipe(recipe.source, recipe.text)
    assert load_yaml_file(folder.root / RECIPE_COPY, "copy") == data
