"""Detached runs: the pipeline handed to a controller where the run lives, and followed from
wherever the user is.

    hand_over(backend, request)       the backend places the pipeline (its run folder made,
                                      handover.json written, the controller started:
                                      launcher/commands/controller.py) and says where; this
                                      machine keeps runs/<id>/detached.json, which attach,
                                      logs, stop, fetch and `launch runs` read
    attach(home, display)             the run's console (launcher/runs/console.py) replayed onto
                                      this terminal until the run ends: its end event, exit code
                                      and error message are the run's, as if it had run attached

The client may die or lose its connection at any time after hand_over returns: nothing of the
run depends on it.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from launcher.core import safefile
from launcher.core.errors import LauncherError, RunFailed
from launcher.job.request import RunRequest
from launcher.execute.supervisor import StopRequest, interrupt_words
from launcher.report.display import make_display
from launcher.runs.console import CONSOLE, EventReader, replay
from launcher.runs.timeline import FOLLOWING, Timeline, handed_over

HANDOVER = "handover.json"       # in the run folder: what the controller runs (request, backend)
HANDOVER_MODE = 0o600            # it holds --env's values, which plan.json masks
DETACHED = "detached.json"       # in this machine's runs/<id>/: where the run lives
CONTROLLER = "controller.json"   # in the run folder: the controller's pid, host, end
CONTROLLER_LOG = "controller.log"
GONE_GRACE_S = 10.0              # a controller gone without an end event: looked at again


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def handover_doc(backend, request: RunRequest, uid: str, runs_dir: str,
                 **session: Any) -> dict[str, Any]:
    """handover.json: the request as the controller sees it (its runs folder), how it makes
    the backend again, the run's uid, and what the client found already (`session`)."""
    return {"request": request.with_(runs_dir=runs_dir).to_json(),
            "backend": {"name": backend.name, "settings": session.pop("settings", None)
                        or backend.to_json()},
            "uid": uid, "session": session}


def hand_over(backend, request: RunRequest) -> dict[str, Any]:
    """The run started where it lives; its handle (kept in runs/<id>/detached.json)."""
    # The runs folder the handle is kept in: checked before the run starts (a run must not
    # start with nowhere here to find it again), made only once it has (a refused run leaves
    # nothing).
    runs = Path(request.runs_dir).resolve()
    if runs.exists() and not runs.is_dir():
        raise LauncherError(f"--runs-dir {runs} is a file, not a folder")
    nodes = backend.nodes(request.count)
    handle = backend.hand_over(request, nodes)   # refuses before anything is made or started
    handle = {"run_id": request.run_id, "backend": backend.name,
              "settings": backend.to_json(), **handle}
    runs.mkdir(parents=True, exist_ok=True)   # a project's first run may live elsewhere
    local = runs / request.run_id      # the run folder itself where the runs folder is shared
    safefile.make_dirs(local, within=runs)
    safefile.write_json(local / DETACHED, handle, within=runs)
    if request.detach:
        say(f"run {request.run_id} detached: its pipeline runs on {handle['where']}")
        say(f"follow it: launch attach {request.run_id}; its logs: launch logs "
            f"{request.run_id} [-f]; stop it: launch stop {request.run_id}")
    return handle


def describe_hand_over(backend, request: RunRequest, nodes: list) -> list[str]:
    """What --dry-run says a detached run would start, and where."""
    lines = [f"detached: the pipeline would run on {backend.capabilities.controller}"]
    lines += backend.describe_hand_over(request, nodes)
    return lines


def follow_handed_over(backend, handle: dict[str, Any], display=None,
                       timeline: Timeline | None = None) -> dict[str, Any]:
    """`launch run` on a backend that hands every run over (Slurm): attached to it, Ctrl-C
    stops the run (SIGTERM too); the run's end is this command's. `timeline`: this process's
    phases (launcher/runs/timeline.py); the run's summary.json then holds the whole wall time
    as seen here, the controller's phases inside it, and its report is written again from
    that summary (report_again)."""
    home = backend.home(handle)
    if timeline is not None:
        timeline.begin(FOLLOWING)
    # The controller's own timeline, as its summary.json held it when the run ended: every
    # amendment starts from it (the summary's is this process's view once amended).
    theirs: dict[str, Any] = {}

    def amend(summary: dict[str, Any]) -> None:
        if timeline is not None and isinstance(summary.get("timeline"), dict):
            inner = theirs.setdefault("timeline", summary["timeline"])
            summary["timeline"] = handed_over(timeline, inner)
    end = attach(home, display, on_signal="stop")
    try:
        return finish(home, end, amend=amend)
    finally:
        if theirs and timeline is not None:
            report_again(home, timeline, amend)


def report_again(home, timeline: Timeline, amend) -> None:
    """The run's report (report.md/json/html) drawn again from its amended summary.json:
    the controller wrote it with its own timeline, which misses what only this machine saw
    (sbatch, the queue, following the job). Only the parts drawn from the timeline are
    drawn again (launcher/report/retime.py): the controller's other plots and tables stay,
    and no node log is read again. The report's own time is then this process's "report"
    phase, added to summary.json's timeline and report.json's, as an attached run
    does (launcher/execute/attempt.py): report.md and the page show the timeline as it stood
    when they were written, short of that last phase. Only where the run folder is here
    (a shared filesystem); a report that cannot be written leaves the controller's."""
    folder = home.local_folder()
    if folder is None:
        return
    timeline.begin("report")
    try:  # the import too: a report bug must never hide the run's outcome
        from launcher.report.retime import rewrite_timeline

        report = rewrite_timeline(folder)
    except Exception as err:  # noqa: BLE001
        say(f"warning: the run's report was not written again with this machine's timeline "
            f"({type(err).__name__}: {err}); it holds the controller's. `launch report "
            f"{folder}` retries it")
        return
    try:
        summary = json.loads((folder / "summary.json").read_text())
        amend(summary)
        safefile.write_json(folder / "summary.json", summary, within=folder.parent)
        if "timeline" in report:
            safefile.write_json(folder / "report.json",
                                {**report, "timeline": summary["timeline"]},
                                within=folder.parent)
    except (OSError, ValueError, LauncherError) as err:
        say(f"warning: could not write the run's summary again in {folder}: {err}")


def finish(home, end: dict[str, Any], amend=None) -> dict[str, Any]:
    """The run's summary once it ended (what only the run's home knows at its end added:
    a Slurm job's final state; `amend`'s changes to it); RunFailed with its message and exit
    code otherwise, led by why the run's home ended it when it did (Slurm's time limit, a
    cancel from outside)."""
    code = int(end.get("code", 1))
    why = home.ending() if code != 0 else None
    if why:
        # Not the run, not launch: its home ended it (Slurm's time limit, a cancel from
        # outside); the run failed, whatever its pipeline saw (the signal Slurm sent).
        home.settle(status="failed", reason=why, amend=amend)
        raise RunFailed(f"{why}\n{end.get('message') or ''}".rstrip(), exit_code=1)
    home.settle(amend=amend)
    if code != 0:
        raise RunFailed(str(end.get("message") or f"the run ended with exit code {code}"),
                        exit_code=code)
    raw = home.read("summary.json", 16 << 20)
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {}


def attach(home, display=None, *, on_signal: str = "detach",
           out=None, err=None, all_lines: bool = False) -> dict[str, Any]:
    """The run's console replayed here from its start until its end event (returned), with
    every node's line where `all_lines` (a many-node run's screen shows fewer). A
    signal (Ctrl-C) detaches (`on_signal="detach"`: the run goes on) or asks the run to stop
    and goes on following it until it ended (`"stop"`; a second one stops it at once)."""
    display = display or make_display()
    out, err = out or sys.stdout, err or sys.stderr
    reader = EventReader()
    end: dict[str, Any] | None = None
    gone_since: list[float] = []

    def gone() -> bool:
        """The controller is not there, and has not been for a while (an end event may still
        be on its way through a shared filesystem)."""
        if home.alive() is not False:
            gone_since.clear()
            return False
        gone_since.append(time.monotonic())
        return time.monotonic() - gone_since[0] > GONE_GRACE_S

    asked = 0
    request = StopRequest()
    with request:
        try:
            for chunk in home.follow(CONSOLE, 0, gone):
                for event in reader.feed(chunk):
                    if event["k"] == "end":
                        end = event
                        break
                    replay(event, display, out, err, all_lines)
                if end is not None:
                    break
                if request.count > asked:
                    asked = request.count
                    if on_signal == "detach":
                        raise RunFailed(f"detached from run {home.run_id}; it goes on "
                                        f"({home.where}): `launch attach {home.run_id}` follows "
                                        "it again", exit_code=130)
                    # A second one too: the controller's supervisor stops the nodes at once then.
                    display.message(home.stop(request.signum or signal.SIGTERM))
        finally:
            display.close()
    if end is None:
        return no_end(home, asked and request.signum)
    return end


def no_end(home, signum: int | None) -> dict[str, Any]:
    """The run's controller is gone without its end event: it never started (cancelled while
    it waited), or its home ended it (a Slurm job cancelled from outside, out of time), or it
    died. Said as the run's failure, with what is known, and kept in its summary."""
    if signum:
        reason = f"{interrupt_words(signum)} before the run started ({home.where}); it was " \
                 "cancelled"
        home.settle(status="interrupted", reason=reason)
        raise RunFailed(reason, exit_code=130 if signum == signal.SIGINT else 128 + signum)
    why = home.ending()
    if why:
        home.settle(status="failed", reason=why)
        raise RunFailed(f"{why}\n{home.log_hint()}", exit_code=1)
    raise LauncherError(f"the controller of run {home.run_id} ({home.where}) ended without "
                        f"saying how the run ended; its log: {home.log_hint()}")
