"""`launch run --recover`: a run that survives losing a machine, not only a process.

An attempt of the run fails; for each of its nodes launch asks the place the machines come
from (a *fleet*: the EC2 cluster `launch provision` made, launcher/provision/replacement.py;
or the SSH lab, launcher/lab/hosts.py LabFleet, where a test cannot reach EC2) whether the machine
is gone (stopped, terminated, reclaimed). For each lost node, in order:

    replace   a new machine in its place (the same zone and placement group; the head's
              place for a lost head), in the inventory
    set up    `launch setup` on it
    check     `launch check` on it (any FAIL refuses it)
    gate      the collective gate over the run's nodes, the new one among them

then the run goes on as a new attempt of the same run (`--resume`: its folder, its uid, its
checkpoint mirror; a lost head's checkpoints come back from the mirror). Bounded by a number
of recoveries (`--recover N`) and a time for each (`--recover-timeout`, checked between the
steps above). Every step is said on stderr and kept in the run folder's recoveries.json,
which the run's summary.json carries as `recoveries`; the fleet keeps its own record (the
cluster's ledger: `launch status` shows recoveries and what they cost).

Within an attempt, a node agent whose machine is gone is not restarted there (run_attempt's
`node_lost`): the attempt ends at once and the recovery begins. Any backend whose inventory
names where its machines come from can do this; each says whether it can
(`machine recovery` in its capabilities).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError, RunFailed
from launcher.execute.attempt import run_attempt
from launcher.job.request import Recover, RunRequest


class Fleet(Protocol):
    what: str
    inventory: str

    def gone(self, node: Node) -> str | None: ...
    def replace(self, node: Node) -> Node: ...
    def set_up(self, node: Node) -> None: ...
    def cost_per_hour(self, count: int) -> float | None: ...
    def record(self, entry: dict[str, Any]) -> None: ...


class RecoveryFailed(RunFailed):
    """The run failed, and replacing its lost machine did not bring it back."""


def say(text: str) -> None:
    print(f"launch: recover: {text}", file=sys.stderr, flush=True)


def fleet_source(nodes: list[Node]) -> tuple[str, str]:
    """Where the nodes' machines come from, as their inventory says: ("cluster", NAME) or
    ("lab", NAME); refused when it says neither. The one check of whether --recover can work,
    made by the dry run and before anything starts as well as by the run itself, so that a
    dry run accepts exactly what the run accepts."""
    cluster = next((n.extra["launch_cluster"] for n in nodes if n.extra.get("launch_cluster")),
                   None)
    if cluster:
        return "cluster", str(cluster)
    lab = next((n.extra["launch_lab"] for n in nodes if n.extra.get("launch_lab")), None)
    if lab:
        return "lab", str(lab)
    raise LauncherError("--recover replaces a lost machine, which launch can do only where it "
                        "knows where machines come from: a cluster `launch provision` made "
                        "(--cluster NAME, or its inventory) or a lab (`launch lab up`)")


def fleet_of(nodes: list[Node]) -> Fleet:
    """Where the nodes' machines come from (fleet_source), as a Fleet."""
    kind, name = fleet_source(nodes)
    if kind == "cluster":
        from launcher.provision.replacement import Ec2Fleet

        return Ec2Fleet(name, say=say)
    from launcher.lab.hosts import LabFleet

    return LabFleet(name, say=say)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class RecoveryBook:
    """recoveries.json in the run folder: every recovery, step by step, kept across attempts."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "recoveries.json"
        try:
            self.entries: list[dict[str, Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = []

    def save(self) -> None:
        if self.path.parent.is_dir():
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.entries, indent=2) + "\n")
            tmp.replace(self.path)

    def into_summary(self) -> None:
        """The run's summary.json (the last attempt's) carries every recovery."""
        summary_path = self.path.parent / "summary.json"
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError):
            return
        summary["recoveries"] = self.entries
        tmp = summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(summary_path)


def _resumed_from(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("resumed_from_step")
    except (OSError, ValueError, AttributeError):
        return None


def run_recovering(backend: Any, request: RunRequest, nodes: list[Node], *, display=None,
                   folder=None, timeline=None) -> dict:
    """run_attempt, again on replacements while machines are lost and recoveries left."""
    policy: Recover = request.recover
    fleet = fleet_of(nodes)
    run_dir = Path(request.runs_dir).resolve() / request.run_id
    mirrored = request.recipe.checkpoint is not None and \
        request.recipe.checkpoint.mirror is not None
    if not mirrored:
        say("warning: the recipe has no checkpoint.mirror: a lost head takes its checkpoints "
            "with it, and its replacement starts the run over")
    current, resume = list(nodes), request.resume
    while True:
        by_name = {n.name: n for n in current}
        try:
            summary = run_attempt(backend, request.with_(resume=resume), current,
                                  display=display, folder=folder, timeline=timeline,
                                  node_lost=lambda name: fleet.gone(by_name[name])
                                  if name in by_name else None)
        except RunFailed as failed:
            folder = None   # the next attempt begins in the run's folder
            book = RecoveryBook(run_dir)
            lost = {n.name: why for n in current if (why := fleet.gone(n))}
            if not lost:
                book.into_summary()
                raise
            if len(book.entries) + len(lost) > policy.max_recoveries:
                book.into_summary()
                raise RecoveryFailed(
                    f"{failed}\nlaunch: recover: {', '.join(lost)} lost ({'; '.join(lost.values())}), "
                    f"and the run has used {len(book.entries)} of its "
                    f"{policy.max_recoveries} recoveries (--recover N)",
                    exit_code=failed.exit_code) from None
            detected = time.monotonic()
            if timeline is not None:
                timeline.begin("machine recovery")
            for name, why in lost.items():
                node = next(n for n in current if n.name == name)
                new = recover_one(fleet, node, why, policy, book, request.run_id, detected)
                current = [new if n.name == name else n for n in current]
            check_and_gate(fleet, backend, request, current, book, detected, policy)
            book.save()
            resume = True
            say(f"resuming run {request.run_id} on {', '.join(n.name for n in current)}")
            continue
        book = RecoveryBook(run_dir)
        if book.entries:
            resumed = _resumed_from(run_dir)
            for entry in book.entries:
                entry.setdefault("resumed_from_step", resumed)
            book.save()
            book.into_summary()
            summary["recoveries"] = book.entries
        return summary


def _step(entry: dict[str, Any], name: str, started: float, policy: Recover,
          since: float) -> None:
    entry[f"{name}_s"] = round(time.monotonic() - started, 3)
    if time.monotonic() - since > policy.timeout_s:
        raise RecoveryFailed(f"the recovery of node {entry['node']} took longer than "
                             f"--recover-timeout {policy.timeout_s:g}s (at: {name}); the run "
                             "stops here (`launch run --resume` continues it)", exit_code=1)


def recover_one(fleet: Fleet, node: Node, why: str, policy: Recover, book: RecoveryBook,
                run_id: str, detected: float) -> Node:
    entry: dict[str, Any] = {"run_id": run_id, "node": node.name, "why": why,
                             "lost_id": node.extra.get("instance_id"), "detected_at": _now(),
                             "fleet": fleet.what}
    book.entries.append(entry)
    book.save()
    say(f"node {node.name} is lost ({why}); replacing it from {fleet.what}")
    try:
        t0 = time.monotonic()
        new = fleet.replace(node)
        entry.update(replacement=new.name, replacement_id=new.extra.get("instance_id"),
                     address=new.address)
        _step(entry, "replace", t0, policy, detected)
        book.save()
        t0 = time.monotonic()
        fleet.set_up(new)
        _step(entry, "setup", t0, policy, detected)
    except (LauncherError, OSError) as err:
        entry["failed"] = str(err)
        book.save()
        fleet.record(entry)
        if isinstance(err, RunFailed):
            raise
        raise RecoveryFailed(f"node {node.name} was lost ({why}) and could not be replaced: "
                             f"{err}", exit_code=1) from None
    book.save()
    return new


def check_and_gate(fleet: Fleet, backend: Any, request: RunRequest, nodes: list[Node],
                   book: RecoveryBook, detected: float, policy: Recover) -> None:
    """`launch check` on the new nodes, then, for a run that gates (`--gate`), the collective
    gate over all of them; then the fleet records each recovery with what it cost (every node
    waited: the cluster's price for the time from the loss to the restart).

    A replacement is held to the rules its run started under: the gate (a torchrun on every
    node: 7.8 s of the 38 s from a loss to the first resumed step on the lab, most of it
    torch's start) runs when the run asked for it at its start. A run without `--gate`
    started on nodes nobody gated; its replacement gets `launch check`, and the resumed run's
    per-node step times, as its other nodes did."""
    from launcher.check.probe import check_nodes
    from launcher.pipeline.gate import gate_before_run

    fresh = [e for e in book.entries if "checked_s" not in e and "failed" not in e]
    new_names = {e["replacement"] for e in fresh}
    new_nodes = [n for n in nodes if n.name in new_names]
    t0 = time.monotonic()
    for row in check_nodes(backend, new_nodes, min_free_bytes=1 << 30):
        if row.failed:
            problems = "; ".join(f"{name}: {row.checks[name].evidence}" for name in row.failed)
            for entry in fresh:
                entry["failed"] = f"launch check: {problems}"
                fleet.record(entry)
            book.save()
            raise RecoveryFailed(f"the replacement {row.node.name} failed `launch check` "
                                 f"({problems}); the run stops here", exit_code=1)
    for entry in fresh:
        _step(entry, "checked", t0, policy, detected)
    t0 = time.monotonic()
    gated = request.gate and len(nodes) > 1
    if gated:
        try:
            gate_before_run(backend, request.with_(exclude_bad=False), nodes,
                            run_id=f"{request.run_id}-recovery{len(book.entries)}",
                            stream=sys.stderr)
        except LauncherError as err:
            for entry in fresh:
                entry["failed"] = f"gate: {err}"
                fleet.record(entry)
            book.save()
            raise RecoveryFailed(f"after replacing {', '.join(sorted(new_names))}: {err}",
                                 exit_code=1) from None
    total = time.monotonic() - detected
    price = fleet.cost_per_hour(len(nodes))
    for entry in fresh:
        if gated:
            _step(entry, "gate", t0, policy, detected)
        else:
            entry["gate_s"] = None   # the run does not gate (`--gate`)
        entry["recovered_in_s"] = round(total, 3)
        entry["cost_usd"] = None if price is None else round(price * total / 3600, 4)
        fleet.record(entry)
        say(f"node {entry['node']} replaced by {entry['replacement']} in {total:.0f}s "
            f"(replace {entry.get('replace_s')}s, setup {entry.get('setup_s')}s, check "
            f"{entry.get('checked_s')}s"
            + (f", gate {entry['gate_s']}s)" if entry["gate_s"] is not None else
               "; no gate: the run does not gate (--gate))")
            + (f", ${entry['cost_usd']:.2f} of cluster time" if entry["cost_usd"] else ""))
