"""Runs side by side (`launch compare`, benchmarks/ddp_tuning.py): what differed in their
recipes, and what each one measured, with every figure's ratio against the first run.

Each run's figures come from the same facts its report states (launcher.report.build.build_report,
summary.json); its recipe from the copy the run folder keeps (recipe.yml); the cost from the
catalog's list price of its nodes' instance type, when the plan names one.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.cluster import catalog
from launcher.core.errors import LauncherError
from launcher.core.table import format_table
from launcher.core.yamlfile import load_yaml_file
from launcher.report.build import build_report
from launcher.runs.folder import RECIPE_COPY
from launcher.runs.schema import PlanRecord, SummaryRecord, read_record


class CompareError(LauncherError):
    pass


@dataclass
class RunFacts:
    label: str
    run_dir: Path
    report: dict[str, Any]
    summary: dict[str, Any]
    recipe: dict[str, Any] | None
    instance_types: list[str | None] = field(default_factory=list)

    @property
    def training(self) -> dict[str, Any]:
        return self.report.get("training") or {}


def _json(model, path: Path) -> Any:
    """A run folder's file as launch reads them (launcher/runs/schema.py), or None."""
    try:
        return read_record(model, path, within=path.parent.parent).model_dump(
            exclude_unset=True)
    except LauncherError:
        return None


def load_run(run_dir: str | Path, label: str) -> RunFacts:
    """A run folder's facts (nothing is written to it)."""
    run_dir = Path(run_dir)
    try:
        report = build_report(run_dir)
        plan = _json(PlanRecord, run_dir / "plan.json") or {}
        types = [n.get("instance_type") for n in plan.get("nodes") or []]
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise CompareError(f"{run_dir}: plan.json or summary.json is not what launch writes "
                           f"({type(err).__name__}: {err})") from None
    summary = _json(SummaryRecord, run_dir / "summary.json")
    recipe = None
    if (run_dir / RECIPE_COPY).is_file():
        try:
            recipe = load_yaml_file(run_dir / RECIPE_COPY, "the run's recipe copy")
        except LauncherError:
            recipe = None     # compare_runs notes the run as one without a recipe
    return RunFacts(label, run_dir, report,
                    summary if isinstance(summary, dict) else {},
                    as_run(recipe, plan) if isinstance(recipe, dict) else None, types)


def as_run(recipe: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """The recipe as the run had it: the node count and restarts the command line gave
    (plan.json; a recipe made from `launch run train.py --nodes 4` names none), and the workdir
    as the folder it is (`.` in one recipe and `..` in another can be one folder)."""
    out = dict(recipe)
    if isinstance(plan.get("nnodes"), int):
        out["nodes"] = plan["nnodes"]
    restarts = (plan.get("recovery") or {}).get("restarts")
    if isinstance(restarts, int):
        out["restarts"] = restarts
    base = (plan.get("recipe") or {}).get("base_dir")
    if isinstance(out.get("workdir"), str) and isinstance(base, str):
        out["workdir"] = str((Path(base) / out["workdir"]).resolve())
    return out


# ----------------------------------------------------------------------------- the figures


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def split_part(run: RunFacts, key: str) -> float | None:
    """The run's mean step split (train/stepsplit.py): step_s, compute_s, data_wait_s,
    comm_wait_s, comm_share."""
    return (run.training.get("split") or {}).get(key)


def data_wait_s(run: RunFacts) -> float | None:
    """The mean data wait per step."""
    return split_part(run, "data_wait_s")


def sent_per_step(run: RunFacts) -> float | None:
    """Bytes one host sent per step (the busiest), from the hosts' interface counters."""
    sent = run.summary.get("tx_bytes_per_step") or {}
    return max(sent.values()) if sent else None


def price_per_hour(run: RunFacts) -> float | None:
    """The nodes' list prices added up; None when any node's type has no price."""
    if not run.instance_types:
        return None
    prices = []
    for itype in run.instance_types:
        facts = catalog.builtin(itype) if itype else None
        if facts is None or facts.price_per_hour is None:
            return None
        prices.append(facts.price_per_hour)
    return sum(prices)


def run_cost(run: RunFacts) -> float | None:
    hourly, duration = price_per_hour(run), run.summary.get("duration_s")
    return None if hourly is None or duration is None else hourly * duration / 3600


def images_per_dollar(run: RunFacts) -> float | None:
    hourly, speed = price_per_hour(run), run.training.get("images_per_sec")
    return None if not hourly or speed is None else speed * 3600 / hourly


def reported(run: RunFacts, trainer_key: str, job_key: str) -> float | None:
    """The trainer's figure, or what a user's job reported in LAUNCH_STEP lines."""
    value = run.summary.get(trainer_key)
    if value is None:
        value = (run.summary.get("progress") or {}).get(job_key)
    return value


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


@dataclass(frozen=True)
class Measure:
    name: str
    fmt: str                                  # format spec of the value
    get: Callable[[RunFacts], float | None]
    part: bool = False                        # a part of the step time above it


MEASURES = [
    Measure("images/s", ".1f", lambda r: r.training.get("images_per_sec")),
    Measure("step time (ms)", ".2f", lambda r: _ms(split_part(r, "step_s"))),
    Measure("compute (ms)", ".2f", lambda r: _ms(split_part(r, "compute_s")), True),
    Measure("data wait (ms)", ".2f", lambda r: _ms(data_wait_s(r)), True),
    Measure("communication wait (ms)", ".2f", lambda r: _ms(split_part(r, "comm_wait_s")),
            True),
    Measure("communication share", ".1%", lambda r: split_part(r, "comm_share")),
    Measure("sent per step per host (MB)", ".3f",
            lambda r: None if sent_per_step(r) is None else sent_per_step(r) / 1e6),
    Measure("held-out accuracy", ".4f", lambda r: r.summary.get("eval_accuracy")),
    Measure("final loss", ".4f", lambda r: reported(r, "final_loss", "loss")),
    Measure("steps", "d", lambda r: reported(r, "steps", "step")),
    Measure("duration (s)", ".1f", lambda r: r.summary.get("duration_s")),
    Measure("peak bus bandwidth (GB/s)", ".2f",
            lambda r: r.report["bandwidth"].get("peak_busbw")),
    Measure("share of the link's peak", ".0%",
            lambda r: (r.report["bandwidth"].get("compared") or {}).get("ratio")),
    Measure("price of the nodes ($/h)", ".2f", price_per_hour),
    Measure("cost of the run ($)", ".2f", run_cost),
    Measure("images per dollar", ".0f", images_per_dollar),
]
BY_NAME = {m.name: m for m in MEASURES}


def ratio(value: float | None, first: float | None) -> float | None:
    if value is None or first is None or first == 0:
        return None
    return value / first


@dataclass
class Comparison:
    runs: list[RunFacts]
    # figure name -> per run (value, ratio against the first run)
    figures: dict[str, list[tuple[float | None, float | None]]]
    recipe_differences: dict[str, list[Any]]     # dotted key -> per run its value (MISSING)
    notes: list[str]


MISSING = "-"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: value}


def recipe_differences(recipes: list[dict[str, Any] | None]) -> dict[str, list[Any]]:
    """Dotted keys (`ddp.comm_hook`) whose values differ between the recipes, in the first
    recipe's order; a key a recipe lacks is MISSING."""
    flat = [_flatten(r) if r is not None else {} for r in recipes]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return {k: [f.get(k, MISSING) for f in flat] for k in keys
            if len({json.dumps(f.get(k, MISSING), sort_keys=True, default=str)
                    for f in flat}) > 1}


def compare_runs(runs: list[RunFacts]) -> Comparison:
    if not runs:
        raise CompareError("no run to compare")
    figures = {}
    for measure in MEASURES:
        values = [measure.get(r) for r in runs]
        if all(v is None for v in values):
            continue            # a figure no run has: not a row of Nones
        figures[measure.name] = [(v, ratio(v, values[0])) for v in values]
    notes = [f"{r.label}: no readable {RECIPE_COPY} in {r.run_dir} (the recipe differences "
             "leave it out)" for r in runs if r.recipe is None]
    kept = [r.recipe for r in runs if r.recipe is not None]
    differences = recipe_differences([r.recipe for r in runs]) if len(kept) > 1 else {}
    if any(price_per_hour(r) is not None for r in runs):
        notes.append("prices: catalog list prices (`launch catalog`), "
                     f"{catalog.PRICE_REGION} on-demand")
    return Comparison(runs, figures, differences, notes)


def load_comparison(run_dirs: list[str | Path], labels: list[str] | None = None) -> Comparison:
    """The runs of these folders, labelled by `labels`, else by folder name (the run id; two
    folders of the same name in different places get #2, #3)."""
    if labels is None:
        labels, seen = [], {}
        for d in run_dirs:
            name = Path(d).resolve().name
            seen[name] = seen.get(name, 0) + 1
            labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return compare_runs([load_run(d, label) for d, label in zip(run_dirs, labels)])


# ----------------------------------------------------------------------------- rendering


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    return format(int(value), fmt) if fmt == "d" else format(value, fmt)


def cells(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the figures table: each later run's value with its ratio against
    the first, `1.23x`."""
    header = ["", *(r.label for r in comparison.runs)]
    rows = []
    for name, values in comparison.figures.items():
        measure = BY_NAME[name]
        row = [f"  {name}" if measure.part else name]
        for i, (value, against) in enumerate(values):
            text = _fmt(value, measure.fmt)
            if i and against is not None:
                text += f" ({against:.2f}x)"
            row.append(text)
        rows.append(row)
    return header, rows


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _is_words(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value)


def list_differences(lists: list[list[Any]]) -> list[str]:
    """Each run's words where its list (an argv: job.args) differs from the first run's, with
    the word before each difference (its option) and `…` for what is the same: one changed
    `--lr` value is one short cell per run, not two whole argument lists."""
    import difflib
    import shlex

    first = [str(w) for w in lists[0]]
    spans: list[set[int]] = [set() for _ in lists]
    for i, other in enumerate(lists[1:], start=1):
        words = [str(w) for w in other]
        for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, first, words,
                                                           autojunk=False).get_opcodes():
            if tag != "equal":
                spans[0].update(range(max(0, a0 - 1), a1))
                spans[i].update(range(max(0, b0 - 1), b1))
    cells = []
    for words, keep in zip(lists, spans):
        words = [str(w) for w in words]
        out, last = [], -1
        for j in sorted(keep):
            if j != last + 1:
                out.append("…")
            out.append(shlex.quote(words[j]))
            last = j
        if last != len(words) - 1 and keep:
            out.append("…")
        cells.append(" ".join(out) if keep else "…" if words else "(none)")
    return cells


def timeline_cells(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the runs' timelines side by side (summary.json `timeline`): a row
    per phase in seconds, what training lost, the wall time and goodput; none when no run
    has a timeline."""
    timelines = [r.summary.get("timeline") if isinstance(r.summary.get("timeline"), dict)
                 else None for r in comparison.runs]
    if not any(timelines):
        return [], []
    phases = [{p["name"]: p["s"] for p in t.get("phases") or []} if t else {}
              for t in timelines]
    names = list(dict.fromkeys(name for run in phases for name in run))

    def row(name: str, values: list[Any], fmt: str) -> list[str]:
        return [name, *(MISSING if v is None else format(v, fmt) for v in values)]

    rows = [row(f"  {name} (s)", [run.get(name) for run in phases], ".2f") for name in names]
    rows.append(row("  lost in training (s)",
                    [None if not t or t.get("kept_steps_s") is None
                     else sum(loss["s"] for loss in t.get("training_losses") or [])
                     for t in timelines], ".2f"))
    rows.append(row("wall time (s)", [t.get("wall_s") if t else None for t in timelines],
                    ".2f"))
    rows.append(row("goodput", [t.get("goodput") if t else None for t in timelines], ".1%"))
    return ["timeline", *(r.label for r in comparison.runs)], rows


def difference_cells(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["recipe key", *(r.label for r in comparison.runs)]
    rows = []
    for key, values in comparison.recipe_differences.items():
        if all(_is_words(v) for v in values):
            rows.append([key, *list_differences(values)])
        else:
            rows.append([key, *(_value(v) for v in values)])
    return header, rows


def render_text(comparison: Comparison) -> str:
    header, rows = cells(comparison)
    out = [format_table(tuple(header), [tuple(r) for r in rows])]
    if len(comparison.runs) > 1:
        out.append(f"ratios: against {comparison.runs[0].label}\n")
    header, rows = timeline_cells(comparison)
    if rows:
        out += ["\n", format_table(tuple(header), [tuple(r) for r in rows])]
    if comparison.recipe_differences:
        header, rows = difference_cells(comparison)
        out += ["\n", format_table(tuple(header), [tuple(r) for r in rows])]
    elif len(comparison.runs) > 1 and all(r.recipe is not None for r in comparison.runs):
        out.append("the recipes are the same\n")
    out += [f"note: {n}\n" for n in comparison.notes]
    return "".join(out)


def to_json(comparison: Comparison) -> dict[str, Any]:
    return {
        "runs": [{"label": r.label, "run_dir": str(r.run_dir), "status": r.report["status"]}
                 for r in comparison.runs],
        "figures": {name: [{"value": v, "ratio": q} for v, q in values]
                    for name, values in comparison.figures.items()},
        "recipe_differences": comparison.recipe_differences,
        "timelines": {r.label: r.summary.get("timeline") for r in comparison.runs},
        "notes": comparison.notes,
    }
