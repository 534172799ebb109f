"""What a run is, as one value: the recipe and the job it names, the shipped workdir, how many
nodes, the run's id and folder, and what launch does around it (gate, bench, restarts, machine
recovery, detach). `launch run`, `launch bench` and the gate build one; the pipeline
(launcher/pipeline/) and every backend read it; a detached run carries it to its controller as
request.json in the run folder (to_json / from_json), so the run is the same value wherever it
lives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.job.recipe import Recipe, recipe_from_mapping
from launcher.job.spec import Job, job_of

REQUEST_FILE = "request.json"


@dataclass(frozen=True)
class Recover:
    """`launch run --recover`: how many lost machines a run may replace, and how long each
    replacement may take (launcher/pipeline/recover.py)."""

    max_recoveries: int = 2
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class RunRequest:
    recipe: Recipe
    run_id: str
    count: int                              # nodes
    job: Job = field(default=None)          # type: ignore[assignment]  # default: the recipe's
    workdir: Any = None                     # the shipped folder's manifest (workdir/scan.py)
    runs_dir: str = "runs"
    grace_s: float = 5.0
    rdzv_port: int | None = None
    resume: bool = False                    # a new attempt in the run's existing folder
    recover: Recover | None = None
    gate: bool = False
    exclude_bad: bool = False
    bench: bool = False
    detach: bool = False
    all_lines: bool = False                 # every node's lines on the terminal, at any scale

    def __post_init__(self):
        if self.job is None:
            object.__setattr__(self, "job", job_of(self.recipe))

    def with_(self, **changes: Any) -> RunRequest:
        return replace(self, **changes)

    # ---- request.json ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        recipe = self.recipe
        return {
            "recipe": {"data": recipe.model_dump(mode="json", exclude_unset=True),
                       "source": recipe.source,
                       "base_dir": recipe.base_dir, "text": recipe.text,
                       "command_line_env": list(recipe.command_line_env)},
            "run_id": self.run_id, "count": self.count, "job": self.job.to_json(),
            "workdir": self.workdir.to_json() if self.workdir is not None else None,
            "runs_dir": self.runs_dir, "grace_s": self.grace_s, "rdzv_port": self.rdzv_port,
            "resume": self.resume,
            "recover": None if self.recover is None else
            {"max_recoveries": self.recover.max_recoveries,
             "timeout_s": _finite(self.recover.timeout_s)},
            "gate": self.gate, "exclude_bad": self.exclude_bad, "bench": self.bench,
            "detach": self.detach, "all_lines": self.all_lines,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], manifest_from_json=None) -> RunRequest:
        """The request a client wrote; `manifest_from_json` rebuilds the workdir's manifest
        (launcher/workdir/scan.py, a layer above this one)."""
        rec = data["recipe"]
        recipe = recipe_from_mapping(rec["data"], rec["source"], rec["base_dir"],
                                     text=rec.get("text"))
        if rec.get("command_line_env"):
            # The names --env gave: their values are shown masked wherever the run shows them.
            recipe = recipe.model_copy(
                update={"command_line_env": tuple(rec["command_line_env"])})
        job = data["job"]
        workdir = data.get("workdir")
        recover = data.get("recover")
        return cls(
            recipe=recipe, run_id=data["run_id"], count=int(data["count"]),
            job=Job(job["kind"], job.get("target"), tuple(job.get("args") or ()),
                    job.get("workdir"), tuple(job.get("setup") or ())),
            workdir=manifest_from_json(workdir) if workdir and manifest_from_json else None,
            runs_dir=data.get("runs_dir", "runs"), grace_s=float(data.get("grace_s", 5.0)),
            rdzv_port=data.get("rdzv_port"), resume=bool(data.get("resume")),
            recover=Recover(int(recover["max_recoveries"]), float(recover["timeout_s"]))
            if recover else None,
            gate=bool(data.get("gate")), exclude_bad=bool(data.get("exclude_bad")),
            bench=bool(data.get("bench")), detach=bool(data.get("detach")),
            all_lines=bool(data.get("all_lines")))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
