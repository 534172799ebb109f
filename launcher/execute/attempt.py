"""One attempt of a run, the same on every backend: preflight (the backend's session: every
node reached and checked, code and workdir shipped), the run folder, the plan with what
preflight found, setup and the mirror's restores, the rendezvous store and the sidecars, the
nodes supervised (fail-fast, restarts, the hang watch), their folders collected, summary.json
and the run report.

    run_attempt(backend, request, nodes)   -> summary, or RunFailed (logs and summary kept)

launcher/pipeline/ runs attempts (the gate first, machine recovery between them); a backend
supplies only its Session (launcher/execute/backend.py).
"""

from __future__ import annotations

import signal
from datetime import datetime, timezone
from typing import Any, Callable

from launcher.core.errors import RunFailed
from launcher.execute.prepare import PrepareFailed, preparation
from launcher.execute.recovery import Recovery
from launcher.job.request import RunRequest
from launcher.execute.sidecar import EXIT_PREEMPTED, Preemptions, Sidecar
from launcher.execute.supervisor import NodeExit, NodeProcess, Outcome, supervise
from launcher.job.mirror import DRAIN_S
from launcher.job.runplan import RunPlan
from launcher.report.display import make_display
from launcher.runs.folder import RunFolder
from launcher.runs.logs import LineRouter, failure_excerpt
from launcher.runs.progress import StepLines
from launcher.runs.screen import ScreenFilter, screen_filter_on
from launcher.runs.timeline import JOB, LAST, Timeline
from launcher.workdir.left_out import missing_left_out

EXIT_INTERRUPTED = 130
# `launch stop`, or a SIGTERM to launch: the run stopped as asked.
EXIT_STOPPED = 128 + signal.SIGTERM


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# What the bundled trainer reports of itself (result.json of the node that held rank 0): only
# a trainer run's summary has these keys; a user's own job gets what launch measured itself.
TRAINER_FACTS = ("steps", "images_per_sec", "final_loss", "eval_accuracy", "train_time_s",
                 # The mean step and its mean parts: compute + data wait + communication wait.
                 "step_split", "tx_bytes_per_step",
                 # Which interface counter each figure comes from; nodes sharing one (local
                 # nodes on loopback) are one entry, counted once.
                 "tx_counters", "checkpoint", "ddp", "auto",
                 # Ranks whose own compute held every step back (train/stragglers.py), and
                 # every rank's step split as step_split's (means: compute, data wait, exposed
                 # communication wait).
                 "stragglers", "rank_times")


def run_attempt(backend, request: RunRequest, nodes: list, *, display=None,
                node_lost: Callable[[str], str | None] | None = None,
                machine_lost: Callable[[str, str], None] | None = None,
                folder: RunFolder | None = None,
                timeline: Timeline | None = None) -> dict[str, Any]:
    """One attempt of `request` on `nodes`: the summary, or RunFailed after writing it.
    `folder`: the run folder when the client made it already (a handed-over run's first
    attempt); else made here (a new one, or the next attempt of a resumed run). `node_lost`:
    why a node's machine is gone (launcher/pipeline/recover.py), or None; `machine_lost(name,
    why)`: told once when the attempt fails for a lost machine, as it starts stopping the
    others (the replacement may begin then). `timeline`: the run's phases so far
    (launcher/runs/timeline.py); else the attempt's own, from now."""
    timeline = timeline or Timeline()
    uid = folder.uid if folder is not None and folder.uid else \
        RunFolder.uid_for(request.runs_dir, request.run_id, request.resume)
    def lost(plan: RunPlan) -> set[str]:
        return {c.name for c in plan.nodes if node_lost is not None and node_lost(c.name)}

    timeline.begin("preflight")   # the backend's session: connect, check, ship
    session = backend.open(request, nodes, uid)   # PreflightFailed: nothing was made
    timeline.begin("preparation")
    try:
        if folder is None:
            folder = RunFolder.for_launch(request.runs_dir, request.run_id,
                                          resume=request.resume, uid=uid)
        plan = session.plan(request, uid, folder.attempt_base())
        code = session.code_record()
        if code is not None:
            # Every node provably runs the same code: the hash each node computed is this one.
            folder.write_json("code.json", code)
        procs = [session.process(cmd, folder.stamp) for cmd in plan.nodes]
        store = session.process(plan.store, folder.stamp, "store") if plan.store else None
        notices = Preemptions()
        services = [Sidecar(session.process(cmd, folder.stamp, "spot"), "spot watcher",
                            notices.line) for cmd in plan.spot]
        if plan.mirror is not None:
            services.insert(0, Sidecar(session.process(plan.mirror.watch, folder.stamp, "mirror"),
                                       "checkpoint mirror", drain_s=DRAIN_S))
        return execute_plan(
            plan, folder, procs, display=display, grace_s=request.grace_s, store=store,
            services=services, after=lambda: session.collect(plan, folder, lost(plan)),
            prepare=preparation(session, plan, backend.capabilities.one_machine, timeline),
            verdict=notices.judge, node_lost=node_lost, machine_lost=machine_lost,
            backend=backend.name,
            backend_settings=backend.to_json(),
            all_lines=request.all_lines, timeline=timeline)
    finally:
        session.close()


def build_summary(plan: RunPlan, outcome: Outcome, folder: RunFolder, started: str,
                  finished: str, tails: dict[str, list[str]],
                  progress: dict[str, Any] | None = None) -> dict[str, Any]:
    exits = {e.name: e for e in outcome.nodes}
    # The restarts made (a failure beyond the budget, which ended the run, is in restarts[]
    # too, with restarted: false).
    restarts = [r for r in outcome.recovery.get("restarts", []) if r.get("restarted", True)]
    summary: dict[str, Any] = {
        "run_id": plan.run_id,
        "status": outcome.status,
        "recipe": plan.recipe_name,
        "recipe_file": plan.recipe_source,
        "job": plan.job.to_json(),
        "nnodes": plan.nnodes,
        "nproc_per_node": plan.nproc_per_node,
        "world_size": plan.world_size,
        "nodes": [
            {"name": n.name, "address": n.address, "exit_code": exits[n.name].exit_code,
             "status": exits[n.name].status,
             # The restarts that began at this node: restarts[] entries naming it.
             "restarts": sum(r["node"] == n.name for r in restarts)}
            for n in plan.nodes
        ],
        # LAUNCH_ATTEMPT of the job's last start, as its processes saw it: 0 for a first start,
        # one more for each restart and each --resume (attempts/<n>/ numbers launches of the
        # run from 1: the files of the n-th).
        "attempt": folder.attempt_base() + len(restarts),
        # The checkpoint step this attempt started from (`launch run --resume`), if any.
        "resumed_from_step": outcome.recovery.get("resumed_from_step"),
        # Every failure the run restarted after (or stopped at, beyond the budget): where it
        # began, why, when (s after start), the checkpoint step resumed from, steps redone.
        "restarts": outcome.recovery.get("restarts", []),
        "restarts_allowed": plan.recovery.restarts,
        "hang": outcome.recovery.get("hang"),
    }
    for key in ("preemption", "lost"):
        # The interruption notices the spot watchers saw (launcher/execute/sidecar.py), the
        # nodes whose machine was gone (launcher/backends/ssh/replace.py).
        if outcome.recovery.get(key):
            summary[key] = outcome.recovery[key]
    if plan.mirror is not None:
        from launcher.job.mirror import mirror_summary

        summary["mirror"] = mirror_summary(folder.root, plan.nodes[0].name)
    if plan.job.is_trainer:
        rank0_node, result = folder.trainer_result([n.name for n in plan.nodes])
        summary["rank0_node"] = rank0_node
        summary.update({key: result.get(key) for key in TRAINER_FACTS})
    else:
        # Steps, loss and per-rank busy time exist only when the job printed LAUNCH_STEP lines
        # (docs/jobs.md): launch invents none of them.
        summary["progress"] = progress
    summary.update({
        "started_at": started,
        "finished_at": finished,
        "duration_s": round(outcome.duration_s, 3),
        "run_dir": str(folder.root),
    })
    if outcome.status != "succeeded":
        summary["failure"] = {
            "reason": outcome.reason,
            "interrupted": outcome.status in ("interrupted", "stopped"),
            "first_failed_node": outcome.first_failure,
            # How long stopping every other node took (SIGTERM, then SIGKILL after --grace).
            "stopped_in_s": None if outcome.stop_latency_s is None
            else round(outcome.stop_latency_s, 3),
            "last_lines": tails.get(outcome.first_failure or "", []),
        }
    return summary


def execute_plan(plan: RunPlan, folder: RunFolder, procs: list[NodeProcess], *,
                 display=None, after: Callable[[], None] | None = None,
                 grace_s: float = 5.0, store: NodeProcess | None = None,
                 services: list[NodeProcess] = (),
                 extra: Callable[[], dict[str, Any]] | None = None,
                 prepare: Callable[..., None] | None = None,
                 verdict: Callable[[Outcome], Outcome] | None = None,
                 node_lost: Callable[[str], str | None] | None = None,
                 machine_lost: Callable[[str, str], None] | None = None,
                 backend: str | None = None, backend_settings: dict | None = None,
                 all_lines: bool = False,
                 timeline: Timeline | None = None) -> dict[str, Any]:
    """Runs the plan (the rendezvous `store` process and other `services` first, when given);
    returns the summary, or raises RunFailed after writing it. `prepare(router, notify,
    folder)` runs first (the workdir shipped, setup: launcher/execute/prepare.py); its
    PrepareFailed fails the run before any node starts. `extra` adds the backend's own facts
    to the summary once `after` has run (Slurm: the job id and its final state). `verdict`
    may say more of the outcome than the supervisor knew (a spot node's interruption notice:
    "preempted"); `node_lost(name)` says why a node's machine is gone (its agent is then not
    restarted there), and `machine_lost(name, why)` hears it once when that fails the run.
    Above LAUNCH_SCREEN_ALL_NODES nodes the terminal shows the head's lines and the errors
    only (launcher/runs/screen.py), unless `all_lines`. `timeline` is marked at each phase's
    beginning (launcher/runs/timeline.py); summary.json carries it."""
    display = display or make_display()
    timeline = timeline or Timeline()
    # The backend and how it is made again: `launch fetch RUN --workdir` reaches the nodes
    # of an attached run by it.
    folder.write_json("plan.json", {**plan.to_json(), **({"backend": backend} if backend else {}),
                                    **({"backend_settings": backend_settings}
                                       if backend_settings is not None else {})})
    folder.keep_recipe(plan.recipe_source, plan.recipe_text)
    recovery = Recovery(plan.recovery.restarts, plan.recovery.hang_timeout_s,
                        plan.recovery.restart_deadline_s, folder.root,
                        user_job=plan.job.kind in ("script", "module", "command"),
                        restart_together=not plan.job.uses_torchrun, node_lost=node_lost,
                        machine_lost=machine_lost)
    steps = StepLines(origin=timeline.start)
    if not plan.job.is_trainer:
        steps.record_to(folder.root, plan.nodes[0].name)
    screen = ScreenFilter(plan.nodes[0].name) \
        if screen_filter_on(len(plan.nodes), all_lines) else None
    router = LineRouter({n.name: folder.node_log(n.name) for n in plan.nodes}, display,
                        steps=steps, head=None if plan.job.is_trainer else plan.nodes[0].name,
                        screen=screen, timeline=timeline)
    recovery.steps = steps
    recovery.notify = router.message
    started = _now()
    what = (f"world size {plan.world_size}" if plan.job.uses_torchrun
            else "your command on each")
    router.message(f"run {plan.run_id}: {plan.nnodes} node(s), {what}; logs in {folder.root}")
    if screen is not None:
        router.screen_message(screen.opening(len(plan.nodes)))
    outcome = None
    try:
        if prepare is not None:
            try:
                prepare(router, router.message, folder)
            except PrepareFailed as err:
                outcome = Outcome(status="failed", first_failure=err.node, reason=err.reason,
                                  nodes=[NodeExit(n.name, started=False) for n in plan.nodes])
        if outcome is None:
            timeline.begin(JOB)
            outcome = supervise(procs, router, grace_s=grace_s, notify=router.message,
                                services=[*([store] if store else []), *services],
                                store=store, recovery=recovery)
    finally:
        router.close()
        display.close()
    if verdict is not None:
        outcome = verdict(outcome)
    stop = folder.stop_request() if outcome.status == "interrupted" else None
    if stop is not None:
        # `launch stop` sent the signal: asked for, not an accident.
        outcome.status = "stopped"
        outcome.reason = f"stopped by `launch stop` ({stop.get('by', 'someone')})"
    timeline.begin("collection")
    for node in outcome.nodes:
        if node.ended_at is not None:
            timeline.node(node.name, "exited_s", node.ended_at - timeline.start)
    if after is not None:
        after()  # e.g. reap leftovers, fetch remote files; also after a failure
    tails = {n.name: failure_excerpt(router.tail(n.name, 200), errors=router.errors(n.name))
             for n in plan.nodes}
    summary = build_summary(plan, outcome, folder, started, _now(), tails,
                            progress=steps.summary())
    if outcome.status != "succeeded":
        # A file the job did not find that the workdir's ignore rules left out: said so.
        hints = missing_left_out(plan.workdir, router.tail(outcome.first_failure, 200)
                                 if outcome.first_failure in tails else [],
                                 [n.job_dir or n.cwd or "" for n in plan.nodes])
        if hints:
            summary["failure"]["hints"] = hints
    if extra is not None:
        summary.update(extra())
    timeline.begin(LAST)
    try:  # a run folder made read-only or full must not hide the run's outcome
        folder.gather_metrics([n.name for n in plan.nodes])
        summary["timeline"] = timeline_of(timeline, summary, outcome)
        folder.write_json("summary.json", summary)
    except OSError as err:
        display.message(f"warning: could not write the summary in {folder.root}: "
                        f"{err.strerror or err}")
    timeline.begin("report")
    report = None
    try:  # the import too: a report bug, however deep, must never hide the run's outcome
        from launcher.report.build import print_run_report, write_run_report

        if outcome.status in ("interrupted", "stopped"):
            report = write_run_report(folder.root)   # kept, not shown: no advice after a Ctrl-C
        else:
            report = print_run_report(folder.root)
    except Exception as err:  # noqa: BLE001
        display.message(f"warning: no run report ({type(err).__name__}: {err}); "
                        f"`launch report {folder.root}` retries it")
    # The report's own time too: summary.json's timeline then ends at the report's write, and
    # report.json carries it as `launch report` rebuilds it from the summary (the page and
    # report.md show it as it stood when they were written).
    summary["timeline"] = timeline_of(timeline, summary, outcome)
    try:
        folder.write_json("summary.json", summary)
        if report is not None and "timeline" in report:
            folder.write_json("report.json", {**report, "timeline": summary["timeline"]})
    except OSError:
        pass   # said above, when the first write failed
    if outcome.status == "succeeded":
        restarts = sum(r.get("restarted", True) for r in summary["restarts"])
        after_restarts = f" after {restarts} restart(s)" if restarts else ""
        display.message(f"run {plan.run_id} succeeded{after_restarts}{_outcome_facts(summary)}"
                        f"; summary in {folder.root / 'summary.json'}")
        return summary
    failed = outcome.first_failure
    lines = [f"run {plan.run_id} {outcome.status}: {outcome.reason}."]
    hang = summary["hang"]
    if hang is not None and hang["action"] == "stop":
        lines.append(f"stacks of every rank: {folder.root / 'hang'}/ (summary.json `hang`)")
    if failed and failed in tails and tails[failed] and \
            outcome.status not in ("interrupted", "stopped"):
        lines.append(f"last lines of node {failed}, its workers' own error first (full log: "
                     f"{folder.node_log(failed)}):")
        lines += [f"  {line}" for line in tails[failed]]
        lines += summary["failure"].get("hints", [])
    lines.append(f"logs and summary kept in {folder.root}")
    code = EXIT_INTERRUPTED if outcome.status == "interrupted" else \
        EXIT_PREEMPTED if outcome.status == "preempted" else \
        EXIT_STOPPED if outcome.status == "stopped" else 1
    if outcome.status == "interrupted" and outcome.reason.endswith(signal.Signals.SIGTERM.name):
        code = EXIT_STOPPED
    raise RunFailed("\n".join(lines), exit_code=code, stop_asked=outcome.stop_asked)


def timeline_of(timeline: Timeline, summary: dict[str, Any], outcome: Outcome
                ) -> dict[str, Any]:
    """The run's timeline until now, with what the run lost inside training: its restarts,
    hang waits, the trainer's checkpoint blocking time, the steps a resume recomputes."""
    checkpoint = summary.get("checkpoint") if isinstance(summary.get("checkpoint"), dict) \
        else {}
    return timeline.to_json(
        incidents=[r for r in summary.get("restarts") or [] if r.get("restarted", True)],
        hangs=outcome.recovery.get("hangs") or [],
        checkpoint_blocking_s=checkpoint.get("blocking_s"),
        steps_redone_at_start=outcome.recovery.get("steps_lost_before_resume"))


def _outcome_facts(summary: dict[str, Any]) -> str:
    """What the run achieved, in the words of the job: the trainer's numbers, or the steps a
    user's job reported (none when it reported none)."""
    if "steps" in summary:   # the bundled trainer
        if summary["steps"] is None:
            return ""
        acc = summary["eval_accuracy"]
        return (f": {summary['steps']} steps, final loss {summary['final_loss']}, "
                f"{summary['images_per_sec']} img/s"
                + (f", held-out accuracy {acc:.4f}" if acc is not None else ""))
    progress = summary.get("progress") or {}
    if progress.get("step") is None:
        return ""
    loss = progress.get("loss")
    return f": reached step {progress['step']}" + (f", last loss {loss:g}" if loss is not None
                                                   else "")
