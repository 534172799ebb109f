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
checkpoint mirror; a lost head's checkpoints come back from the mirror). A node's replacement
(replace, set up, check) begins the moment the attempt knows its machine is gone, in a thread
of its own (Replacements), while the attempt stops the other nodes, fetches their files and
writes its summary and report; the gate waits for the attempt's end (it needs every node).
Bounded by a number of recoveries (`--recover N`) and a time for each (`--recover-timeout`,
checked between the steps above). Every step is said on stderr and kept in the run folder's
recoveries.json, which the run's summary.json carries as `recoveries`; the fleet keeps its own
record (the cluster's ledger: `launch status` shows recoveries and what they cost).

Within an attempt, a node agent whose machine is gone is not restarted there (run_attempt's
`node_lost`): the attempt ends at once (`machine_lost`: the replacement begins). Any backend
whose inventory names where its machines come from can do this; each says whether it can
(`machine recovery` in its capabilities). A run stopped meanwhile (Ctrl-C, `launch stop`) is
not recovered: the replacements it began are waited for and named (Replacements.unused).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from launcher.cluster.inventory import Node
from launcher.core.errors import LauncherError, NotStarted, RunFailed
from launcher.execute.attempt import EXIT_INTERRUPTED, EXIT_STOPPED, run_attempt
from launcher.execute.supervisor import interrupt_words
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
        self._lock = threading.Lock()   # replacements save from threads of their own

    def save(self) -> None:
        with self._lock:
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


class Replacements:
    """The replacements of one attempt's lost machines, each begun in a thread of its own the
    moment the attempt knows the machine is gone (`begin`, run_attempt's `machine_lost`),
    rather than after the attempt has stopped its other nodes, fetched their files and
    written its summary and report: on EC2 a new instance's launch and boot then overlap all
    of that (at hundreds of nodes, the collection alone takes seconds). Only within the run's
    budget of recoveries: a loss beyond it starts nothing."""

    def __init__(self, fleet: Fleet, backend: Any, policy: Recover, book: RecoveryBook,
                 run_id: str):
        self.fleet, self.backend, self.policy, self.book, self.run_id = \
            fleet, backend, policy, book, run_id
        self.used = len(book.entries)      # recoveries of earlier attempts
        self.begun: dict[str, tuple[str, float, Future]] = {}   # node -> why, when, its work
        # A Ctrl-C ended unused()'s wait: not waited for again (settle).
        self.abandoned = False
        self._lock = threading.Lock()

    def begin(self, node: Node, why: str) -> None:
        with self._lock:
            if node.name in self.begun or \
                    self.used + len(self.begun) >= self.policy.max_recoveries:
                return
            at = time.monotonic()
            self.begun[node.name] = (why, at, _in_thread(
                f"launch-replace-{node.name}", recover_one, self.fleet, node, why, self.policy,
                self.book, self.run_id, at, self.backend))

    def why(self, name: str) -> str | None:
        """Why `name`'s machine is gone, where its replacement has begun (the fleet may no
        longer know the lost node by its name: the lab's replacement takes it over)."""
        begun = self.begun.get(name)
        return begun[0] if begun else None

    def first_at(self) -> float | None:
        return min((at for _, at, _ in self.begun.values()), default=None)

    def replacement(self, node: Node, why: str) -> Node:
        """`node`'s replacement, replaced, set up and checked: the one begun during the
        attempt (waited for), else begun now. Its failure is raised here."""
        with self._lock:
            begun = self.begun.get(node.name)
        if begun is not None:
            return begun[2].result()
        return recover_one(self.fleet, node, why, self.policy, self.book, self.run_id,
                           time.monotonic(), self.backend)

    def unused(self) -> list[str]:
        """The replacements begun that the run will not use (it stops), waited for and named,
        so that nobody pays for them unknowingly. The wait is said (on EC2 it is a boot); a
        Ctrl-C ends it, saying which are still coming up, and is raised."""
        with self._lock:
            begun = {name: f for name, (_, _, f) in self.begun.items()}
        coming = [name for name, f in begun.items() if not f.done()]
        if coming:
            say(f"waiting for the replacement of {', '.join(coming)} to come up, to name it "
                f"(Ctrl-C again stops waiting)")
        names = []
        try:
            for future in begun.values():
                try:
                    names.append(future.result().name)
                except Exception:  # noqa: BLE001 (its failure is in recoveries.json)
                    pass
        except KeyboardInterrupt:
            self.abandoned = True
            still = [name for name, f in begun.items() if not f.done()]
            say(f"stopped waiting for the replacement of {', '.join(still)}: launch stops "
                f"bringing it in; what it made so far stays in {self.fleet.what} "
                "(`launch status`, `launch teardown`)" + (
                    f"; {_unused(names, self.fleet, 'the run stopped')}" if names else ""))
            raise
        return names

    def settle(self) -> list[str]:
        """The run stops: unused() (unless a Ctrl-C already ended its wait), and the book kept
        (recoveries.json, the attempt's summary.json) whatever happens meanwhile."""
        try:
            return [] if self.abandoned else self.unused()
        finally:
            self.book.save()
            self.book.into_summary()


def _in_thread(name: str, fn, *args) -> Future:
    """fn(*args) in a daemon thread of its own, as a Future. Not a pool's: Python joins a
    pool's threads at exit, so after a Ctrl-C launch would wait out a replacement's boot
    without a word."""
    future: Future = Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 (handed to whoever waits)
            future.set_exception(err)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


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
    # Every recovery of the run, across its attempts (and earlier launches: --resume). Kept
    # here, not read again per attempt: a replacement made before the run's folder exists (a
    # machine already gone at the first preflight) is written once the folder is there.
    book = RecoveryBook(run_dir)
    while True:
        by_name = {n.name: n for n in current}
        replacements = Replacements(fleet, backend, policy, book, request.run_id)

        def node_lost(name: str, by_name=by_name, replacements=replacements) -> str | None:
            return replacements.why(name) or \
                (fleet.gone(by_name[name]) if name in by_name else None)

        def machine_lost(name: str, why: str, by_name=by_name,
                         replacements=replacements) -> None:
            if name in by_name:
                replacements.begin(by_name[name], why)

        try:
            try:
                summary = run_attempt(backend, request.with_(resume=resume), current,
                                      display=display, folder=folder, timeline=timeline,
                                      node_lost=node_lost, machine_lost=machine_lost)
            except (RunFailed, NotStarted) as failed:
                # NotStarted: preflight could not reach or check a node, nothing was started
                # (nothing made either, for a run's first attempt: it is not resumed then); a
                # machine already gone when the run (or `--resume`) began is replaced as one lost
                # during it.
                started = isinstance(failed, RunFailed)
                if started:
                    folder = None   # the next attempt begins in the run's folder
                # Ctrl-C or `launch stop` during the attempt, also while a failure (the loss
                # itself) was stopping its nodes: stopped as asked, not recovered.
                stopped = started and failed.exit_code in (EXIT_INTERRUPTED, EXIT_STOPPED)
                if started and not stopped and failed.stop_asked is not None:
                    say(f"{interrupt_words(failed.stop_asked)} came as the attempt ended: the "
                        "run is not recovered")
                asked = stopped or (started and failed.stop_asked is not None)
                lost = {} if asked else \
                    {n.name: why for n in current if (why := node_lost(n.name))}
                if not lost:
                    unused = replacements.settle()
                    if unused:
                        raise RunFailed(f"{failed}\nlaunch: recover: "
                                        f"{_unused(unused, fleet, 'the run stopped')}",
                                        exit_code=failed.exit_code) from None
                    raise
                if replacements.used + len(lost) > policy.max_recoveries:
                    unused = replacements.settle()
                    raise RecoveryFailed(
                        f"{failed}\nlaunch: recover: {', '.join(lost)} lost "
                        f"({'; '.join(lost.values())}), and the run has used "
                        f"{replacements.used} of its {policy.max_recoveries} recoveries "
                        "(--recover N)"
                        + (f"; {_unused(unused, fleet, 'the others were found lost')}"
                           if unused else ""),
                        exit_code=failed.exit_code) from None
                detected = replacements.first_at() or time.monotonic()
                if timeline is not None:
                    timeline.begin("machine recovery")
                for name, why in lost.items():
                    new = replacements.replacement(by_name[name], why)
                    current = [new if n.name == name else n for n in current]
                gate_and_record(fleet, backend, request, current, book,
                                book.entries[replacements.used:], detected, policy)
                book.save()
                resume = resume or started
                say(f"{'resuming' if resume else 'starting'} run {request.run_id} on "
                    f"{', '.join(n.name for n in current)}")
                continue
        except KeyboardInterrupt:
            # Ctrl-C between attempts: a replacement, its check or the gate under way
            # (within an attempt, launch's own handler makes it the attempt's end, above), or
            # a second one that ended unused()'s wait above (which said what it left).
            unused = replacements.settle()
            if unused:
                say(_unused(unused, fleet, "the run was interrupted"))
            raise
        if book.entries:
            resumed = _resumed_from(run_dir)
            for entry in book.entries:
                entry.setdefault("resumed_from_step", resumed)
            book.save()
            book.into_summary()
            summary["recoveries"] = book.entries
        return summary


def _unused(names: list[str], fleet: Fleet, before: str) -> str:
    return (f"{', '.join(names)}, brought in before {before}, stay(s) in {fleet.what} unused "
            "(`launch status`, `launch teardown`)")


def _step(entry: dict[str, Any], name: str, started: float, policy: Recover,
          since: float) -> None:
    entry[f"{name}_s"] = round(time.monotonic() - started, 3)
    if time.monotonic() - since > policy.timeout_s:
        raise RecoveryFailed(f"the recovery of node {entry['node']} took longer than "
                             f"--recover-timeout {policy.timeout_s:g}s (at: {name}); the run "
                             "stops here (`launch run --resume` continues it)", exit_code=1)


def recover_one(fleet: Fleet, node: Node, why: str, policy: Recover, book: RecoveryBook,
                run_id: str, detected: float, backend: Any) -> Node:
    """`node`'s replacement: replaced, set up, and `launch check`ed (any FAIL refuses it),
    each step's time in its recoveries.json entry."""
    from launcher.check.probe import check_nodes

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
        t0 = time.monotonic()
        (row,) = check_nodes(backend, [new], min_free_bytes=1 << 30)
    except (LauncherError, OSError) as err:
        entry["failed"] = str(err)
        book.save()
        fleet.record(entry)
        if isinstance(err, RunFailed):
            raise
        raise RecoveryFailed(f"node {node.name} was lost ({why}) and could not be replaced: "
                             f"{err}", exit_code=1) from None
    if row.failed:
        problems = "; ".join(f"{name}: {row.checks[name].evidence}" for name in row.failed)
        entry["failed"] = f"launch check: {problems}"
        book.save()
        fleet.record(entry)
        raise RecoveryFailed(f"the replacement {new.name} failed `launch check` ({problems}); "
                             "the run stops here", exit_code=1)
    _step(entry, "checked", t0, policy, detected)
    book.save()
    return new


def gate_and_record(fleet: Fleet, backend: Any, request: RunRequest, nodes: list[Node],
                    book: RecoveryBook, fresh: list[dict[str, Any]], detected: float,
                    policy: Recover) -> None:
    """For a run that gates (`--gate`), the collective gate over `nodes`, the checked
    replacements (`fresh`: their recoveries.json entries) among them; then the fleet records
    each recovery with what it cost (every node waited: the cluster's price for the time from
    the loss to the restart).

    A replacement is held to the rules its run started under: the gate (a torchrun on every
    node: 7.8 s of the 38 s from a loss to the first resumed step on the lab, most of it
    torch's start) runs when the run asked for it at its start. A run without `--gate`
    started on nodes nobody gated; its replacement gets `launch check`, and the resumed run's
    per-node step times, as its other nodes did."""
    from launcher.pipeline.gate import gate_before_run

    new_names = {e["replacement"] for e in fresh}
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
