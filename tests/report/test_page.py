"""report.html: written with every run report, opened in a real headless browser (chromium).
Each plot carries the run's own numbers (the step count on its axis, the straggler's rank in
its legend), and a run that lacks a plot's data gets a sentence, never an empty plot."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from launcher.report.build import write_run_report
from launcher.report.page import svg
from launcher.report.plots import job_busy_plot, rank_split_plot, timeline_plot
from tests.nccl.runfolders import build_runs
from tests.report.browser import Page, open_page, well_formed

NCCL_DATA = Path(__file__).resolve().parents[1] / "nccl" / "data"


def page_of(run_dir: Path, **kwargs) -> Page:
    """Writes the run's report (report.html with it) and opens the page."""
    write_run_report(run_dir)
    page = open_page(run_dir / "report.html", **kwargs)
    # Rendered without errors, self-contained, every plot well-formed SVG with text as text.
    assert page.console == []
    assert page.sources == [] and not [link for link in page.links if "//" in link]
    assert all(well_formed(svg) for svg in page.svgs)
    assert len(page.svgs) == len(page.figures)
    return page


def test_a_bench_page_draws_bus_bandwidth_against_the_links_peak(tmp_path, browser):
    runs, _ = build_runs(NCCL_DATA, tmp_path)
    page = page_of(runs / "bench-tree")
    assert list(page.figures) == ["plot-bandwidth"]      # a bench trains nothing
    text = page.text("plot-bandwidth")
    # nccl #527: 1 GiB in 35198 us in place = 57.20 GB/s busbw; algbw 1 GiB / 35.2 ms =
    # 30.51 GB/s against the p4d network's 4 x 100 Gb/s = 50 GB/s: 61%.
    assert "all_reduce: peak busbw 57.20 GB/s, 61% of the link's peak (algbw)" in text
    assert "peak: p4d.24xlarge network 4x 100 Gigabit = 50 GB/s per node" in text
    assert "1 GiB" in text and "algbw: what each node's network carried" in text


def test_a_run_with_only_its_result_says_what_it_cannot_draw(tmp_path, browser):
    """p4d-socket kept result.json but no metrics.jsonl: its figures are in the headline and
    report.md's sentences; no curve is drawn and each missing one is said. Its rank 0's
    result.json: 1871.8 images/s, a step split with comm_share 0.41."""
    runs, _ = build_runs(NCCL_DATA, tmp_path)
    page = page_of(runs / "p4d-socket")
    assert "plot-loss" not in page.figures
    assert "logged no step to metrics.jsonl" in page.dom
    assert "1871.8" in page.dom and "41%" in page.dom      # images/s, communication share


def test_the_demo_runs_page_carries_its_numbers(runs, browser):
    """The demo run (vit-tiny-local, 330 steps on 2 local nodes; its summary.json: held-out
    accuracy 0.96378..., 698.768 images/s, a mean step of 0.095452 s of which 0.1844 waiting
    on communication, no restart)."""
    page = page_of(runs / "demo")
    assert list(page.figures) == ["plot-loss", "plot-throughput", "plot-rank-split",
                                  "plot-rank-busy", "plot-comm-share"]
    loss = page.figures["plot-loss"]
    assert "330" in loss                                   # the step count ends the axis
    assert "training loss over 330 steps; held-out accuracy 0.9638 after the last" in loss
    assert "held-out accuracy 0.9638" in loss              # the marker's legend
    assert "330" in page.figures["plot-rank-busy"] and "330" in page.figures["plot-comm-share"]
    split = page.text("plot-rank-split")
    assert "rank 0 (node0)" in split and "rank 1 (node1)" in split
    assert "mean time per step (ms)" in split             # rank_times are means
    assert "straggler" not in split                        # nobody held the run back
    busy = page.figures["plot-rank-busy"]
    assert "rank 0 on node0" in busy and "rank 1 on node1" in busy
    assert page.text("plot-comm-share").startswith("0 | 50 | 100")
    assert "comm hook none; median" in page.text("plot-comm-share")
    assert "images/s" in page.figures["plot-throughput"]
    for headline in ("<b>330</b>", "<b>96.38%</b>", "<b>698.8</b>", "<b>95.5 ms</b>",
                     "<b>18%</b>"):
        assert headline in page.dom
    assert "plot-timeline" not in page.figures and "No restart, hang or resume." in page.dom


@pytest.mark.slow
def test_the_demo_run_ends_with_its_page(demo_local_run, browser):
    proc, run_dir = demo_local_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"; with plots: {run_dir / 'report.html'}" in proc.stdout
    page = open_page(run_dir / "report.html")
    assert page.console == [] and "330" in page.figures["plot-loss"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"held-out accuracy {summary['eval_accuracy']:.4f}" in page.text("plot-loss")


def test_the_straggler_is_marked_with_its_rank(runs, browser):
    """node1's rank was stopped 70% of the time (tests/report/make_runs.py); its summary.json
    names it: rank 1 on node1, 1.569x the median rank's compute for 11 intervals."""
    page = page_of(runs / "straggler")
    assert "straggler: rank 1 on node1 (1.569x)" in page.figures["plot-rank-split"]
    assert "rank 1 on node1 (straggler)" in page.figures["plot-rank-busy"]
    assert "rank 0 on node0" in page.figures["plot-rank-busy"]      # the others, unmarked
    assert "60" in page.figures["plot-rank-busy"]                    # its 60 steps
    assert "<b>rank 1</b><span>straggler</span>" in page.dom
    assert "Straggler: node node1 rank 1: compute 1.569x the median rank" in page.dom


def test_a_hang_and_its_restart_are_on_the_time_line_with_the_stacks_linked(runs, browser):
    """node1's rank stopped after the first checkpoint: found hung at 17.163 s (10.013 s
    without a step), every stack dumped, restarted, resumed from step 40; the run took
    26.641 s and both nodes exited 0 (its summary.json)."""
    run_dir = runs / "hang-restart"
    page = page_of(run_dir)
    timeline = page.figures["plot-timeline"]
    assert "hang: restart 1, resumed from step 40" in timeline
    assert "hang found at 17.2 s (no step for 10 s)" in timeline
    assert timeline.count("exit 0") == 2 and {"node0", "node1"} <= set(timeline)
    assert "seconds since the run started (it took 26.6 s)" in timeline
    # Run-relative links, the only kind the page makes (report/page.py href).
    assert page.links == ["./hang/node0.rank0.txt", "./hang/node1.rank1.txt"]
    assert all((run_dir / link).is_file() for link in page.links)
    # The curves show both attempts: the steps redone after the resume overlap the first.
    assert {"attempt 1", "attempt 2"} <= set(page.figures["plot-loss"])
    assert "200" in page.figures["plot-loss"]
    # Each attempt in its own colour, the same in every plot (matplotlib's C0 and C1), so
    # that the legend tells them apart.
    assert {"attempt 1", "attempt 2"} <= set(page.figures["plot-comm-share"])
    for ident in ("plot-loss", "plot-throughput", "plot-comm-share"):
        drawn = page.svgs[list(page.figures).index(ident)]     # one SVG per figure, in order
        assert {"#1f77b4", "#ff7f0e"} <= set(re.findall(r"stroke: (#[0-9a-f]{6})", drawn)), ident


TRAINER_FIELDS = ("steps", "images_per_sec", "step_time_s", "final_loss", "eval_accuracy",
                  "train_time_s", "comm_share", "comm_wait_s", "compute_s",
                  "tx_bytes_per_step", "tx_counters", "checkpoint", "ddp", "auto",
                  "stragglers", "rank_times", "rank0_node")


@pytest.mark.parametrize("gone", ["absent", "null"])
def test_a_run_without_any_trainer_figure_shows_what_launch_knows(runs, browser, gone):
    """A run whose trainer left nothing (no metrics.jsonl, no result.json, every trainer
    field of summary.json left out or null: made here from the hang-restart run). The page
    keeps the exits, the restart and the hang; no empty plot."""
    run_dir = runs / "hang-restart"
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "node0" / "result.json").unlink()
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in TRAINER_FIELDS:
        if gone == "absent":
            summary.pop(key, None)
        else:
            summary[key] = None
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = page_of(run_dir)
    assert list(page.figures) == ["plot-timeline"]
    assert "hang: restart 1, resumed from step 40" in page.figures["plot-timeline"]
    assert "This run logged no step to metrics.jsonl" in page.dom
    assert "<b>1</b><span>restart(s)</span>" in page.dom
    assert "<b>26.6 s</b><span>duration</span>" in page.dom      # 26.641 s
    assert "<td>node1</td><td>succeeded</td><td class=\"num\">0</td>" in page.dom
    for absent in ("held-out accuracy", "images/s</span>", "<span>steps</span>"):
        assert absent not in page.dom


def test_a_users_job_without_step_lines_shows_its_exits_and_duration(runs, browser):
    """A user's own script that printed no LAUNCH_STEP line (tests/report/data/job-silent,
    a real run: its summary.json has no trainer field and no progress; both nodes exited 0
    after 4.687 s)."""
    page = page_of(runs / "job-silent")
    assert page.figures == {}                      # nothing drawn empty
    assert "script job main.py" in page.dom
    assert "No step curve to draw: the job printed no LAUNCH_STEP line." in page.dom
    assert "It printed no LAUNCH_STEP line" in page.dom              # report.md's sentence
    assert "<b>4.7 s</b><span>duration</span>" in page.dom
    assert page.dom.count("<td>succeeded</td><td class=\"num\">0</td>") == 2
    for absent in ("<span>steps</span>", "images/s", "waiting on communication"):
        assert absent not in page.dom


def test_a_users_job_with_step_lines_gets_their_curves(runs, browser):
    """tests/report/data/job-steps: the user's script printed LAUNCH_STEP lines with loss and
    busy_s for 300 steps (progress.jsonl); rank 1 crashed once and the run restarted at
    5.752 s; summary.json: step 300, busy medians 1.528 ms (node0/0) and 1.518 ms (node1/0),
    no straggler, 10.523 s."""
    page = page_of(runs / "job-steps")
    assert list(page.figures) == ["plot-loss", "plot-rank-busy", "plot-timeline"]
    loss = page.figures["plot-loss"]
    assert "300" in loss and "training loss over 300 steps" in loss
    assert "seconds since the run started" in loss
    assert "The job's LAUNCH_STEP lines carry no samples=" in page.dom   # no throughput
    busy = page.figures["plot-rank-busy"]
    assert "node0/0" in busy and "node1/0" in busy and "straggler" not in page.text(
        "plot-rank-busy")
    assert "worker: restart 1" in page.text("plot-timeline")
    assert "<b>300</b><span>steps</span>" in page.dom
    assert "<b>1</b><span>restart(s)</span>" in page.dom


def test_of_many_ranks_the_stragglers_and_the_slowest_are_drawn():
    """64 ranks whose compute grows with the rank number, rank 3 named a straggler: the 32
    bars drawn are rank 3 and the 31 slowest (33 to 63), and the title says how many."""
    rank_times = [{"rank": r, "node": f"n{r // 8}", "compute_s": 0.1 + r * 1e-4,
                   "data_wait_s": 0.0, "comm_wait_s": 0.05} for r in range(64)]
    stragglers = [{"node": "n0", "rank": 3, "ratio": 1.4, "intervals": 5}]
    fig, sentence = rank_split_plot(rank_times, stragglers)
    text = svg(fig, "plot-rank-split")
    drawn = {int(m) for m in re.findall(r">rank (\d+) \(n\d\)<", text)}
    assert drawn == {3, *range(33, 64)} and sentence is None
    assert "where each rank's step went (32 slowest of 64 ranks drawn)" in text
    assert "straggler: rank 3 on n0 (1.4x)" in text


def test_a_user_job_s_rank_plot_of_thousands_of_ranks_draws_the_slowest():
    """1,024 nodes of 8 ranks once drew 8,192 bars and labels (minutes of matplotlib at the
    end of the run, issue 37): the straggler and the slowest ranks are drawn, as above."""
    ranks = {f"node{n:04d}/{r}": {"step": 5, "busy_s_median": 0.1 + (n * 8 + r) * 1e-6}
             for n in range(1024) for r in range(8)}
    stragglers = [{"node": "node0000", "local_rank": "3", "ratio": 1.4}]
    fig, sentence = job_busy_plot(ranks, stragglers)
    text = svg(fig, "plot-rank-busy")
    drawn = set(re.findall(r">(node\d{4}/\d)<", text))
    slowest = [f"node{i // 8:04d}/{i % 8}" for i in range(8192 - 31, 8192)]
    assert drawn == {"node0000/3", *slowest} and sentence is None
    assert "(32 slowest of 8192 ranks drawn)" in text


def test_a_resumed_run_without_restarts_draws_its_time_line_without_a_warning():
    """A run resumed from step 60 (a machine recovery's second attempt) with no restart and no
    hang: its time line has the attempt's note and nothing a legend could name. matplotlib's
    "No artists with labels found to put in legend" went to stderr at the end of such a run
    (benchmarks/recovery.py's machine-loss log); the plot now has no legend, and no warning."""
    summary = {"resumed_from_step": 60, "attempt": 1, "duration_s": 12.5, "restarts": [],
               "nodes": [{"name": "host2", "status": "succeeded", "exit_code": 0},
                         {"name": "host1", "status": "succeeded", "exit_code": 0}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig, _ = timeline_plot(summary)
        text = svg(fig, "plot-timeline")
    assert "attempt 1: resumed from step 60 (launch run --resume)" in text
    assert fig.axes[0].get_legend() is None


def test_where_comm_hook_auto_decided_is_marked(runs, browser):
    """The demo recipe with comm_hook auto (tests/report/data/demo-auto): its summary.json
    says auto chose none at step 38: communication was 20% of the step, so it tried
    PowerSGD, whose steps took 109.276 ms against 89.349 ms for plain all-reduce ones."""
    page = page_of(runs / "demo-auto")
    text = page.text("plot-comm-share")
    assert ("auto chose none at step 38 (all-reduce 89.3 ms per step, PowerSGD 109.3 ms per "
            "step)") in text
    assert "comm hook auto;" in text
    assert "comm_hook auto kept plain all-reduce after step 38" in page.dom   # report.md's


def test_a_job_s_time_plot_starts_with_the_run_and_names_what_came_before_its_first_step(
        runs):
    """Issue 39: the "seconds since the run started" plot starts at the run's start, with the
    phases before the first step (summary.json's timeline) drawn as named bands. job-steps
    was kept before launch wrote timelines: one is written here, as launch writes one (its
    first step 6.1 s after the run's start)."""
    run = runs / "job-steps"
    summary = json.loads((run / "summary.json").read_text())
    phases = [("start-up", 0.4), ("preflight", 0.5), ("preparation", 0.241),
              ("to first step", 4.959), ("training", 4.0), ("stop", 0.3),
              ("collection", 0.1), ("summary", 0.02), ("report", 0.5)]
    summary["timeline"] = {
        "wall_s": round(sum(s for _, s in phases), 3),
        "phases": [{"name": name, "s": s} for name, s in phases],
        "training_losses": [], "largest_losses": [], "kept_steps_s": 4.0,
        "goodput": 0.36, "first_step_s": 6.1, "last_step_s": 10.1, "nodes": {}}
    (run / "summary.json").write_text(json.dumps(summary))
    write_run_report(run)
    html = (run / "report.html").read_text()
    loss = html.split('<figure id="plot-loss">')[1].split("</figure>")[0]
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", loss)
    for name in ("start-up", "preflight", "preparation", "to first step"):
        assert name in texts, texts
    assert "training" not in texts and "seconds since the run started" in loss
    # The bands: one shaded rectangle per phase before the first step.
    assert loss.count('fill: #d9d9d9') + loss.count('fill: #eeeeee') == 4
