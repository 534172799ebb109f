"""The controller of a detached run: the pipeline where the run lives (the head node, a
controller host, a Slurm job's first node, or a session of its own on this machine), started by
a backend's hand_over and run by nobody's terminal.

    python -m launcher.commands.controller RUN_DIR     (the run folder holds handover.json)
    python -m launcher.commands.controller --incoming FILE RUNS_DIR
                                                       (the folder is made here, from FILE)

It makes the backend again from handover.json, runs exactly what an attached `launch run`
runs (launcher/pipeline/run.py run_here), and writes everything it would have shown into the
run's console (launcher/runs/console.py), ending with the run's exit code and message. It is
not one of launch's commands: nothing but a hand-over starts it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

CONTROLLED_ENV = "LAUNCH_CONTROLLER"   # set in the controller's own environment: its run folder


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def main(argv: list[str]) -> int:
    from launcher.backends import backend_named
    from launcher.core import safefile
    from launcher.core.errors import LauncherError, RunFailed
    from launcher.job.request import RunRequest
    from launcher.pipeline.handover import CONTROLLER, HANDOVER, HANDOVER_MODE
    from launcher.pipeline.run import run_here
    from launcher.runs.timeline import Timeline, process_start
    from launcher.runs.console import CONSOLE, ConsoleWriter, StreamDisplay, StreamText
    from launcher.runs.folder import RunFolder
    from launcher.workdir.scan import Manifest

    if argv[:1] == ["--incoming"]:
        incoming, runs = Path(argv[1]), Path(argv[2])
        doc = json.loads(incoming.read_text())
        run_id = doc["request"]["run_id"]
        folder = RunFolder.for_launch(runs, run_id, resume=bool(doc["request"].get("resume")),
                                      uid=doc["uid"])
        safefile.write_json(folder.root / HANDOVER, doc, within=folder.runs, mode=HANDOVER_MODE)
        incoming.unlink()
    else:
        root = Path(argv[0]).resolve()
        doc = json.loads(safefile.read_bytes(root / HANDOVER, "handover", max_bytes=64 << 20))
        folder = RunFolder(root)
        folder.stamp = folder.launch_record().stamp or folder.stamp
    os.environ[CONTROLLED_ENV] = str(folder.root)
    writer = ConsoleWriter(folder.root / CONSOLE)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _now()}
    folder.write_json(CONTROLLER, record)
    sys.stdout, sys.stderr = StreamText(writer, 1), StreamText(writer, 2)
    end = {"code": 1, "status": "failed"}
    try:
        request = RunRequest.from_json(doc["request"], Manifest.from_json)
        backend = backend_named(doc["backend"]["name"], doc["backend"]["settings"] or {})
        if hasattr(backend, "adopt"):
            backend.adopt(doc.get("session") or {})
        # A detached run's wall time begins with its controller (launcher/runs/timeline.py).
        summary = run_here(backend, request, display=StreamDisplay(writer), folder=folder,
                           timeline=Timeline(process_start()))
        end = {"code": 0, "status": summary.get("status", "succeeded")}
    except RunFailed as err:
        end = {"code": err.exit_code, "status": _status(folder), "message": str(err)}
    except LauncherError as err:
        end = {"code": err.exit_code, "status": _status(folder) or "failed",
               "message": str(err)}
    except BaseException as err:  # noqa: BLE001 (said in the console, never lost)
        end = {"code": 1, "status": _status(folder) or "failed",
               "message": f"the run's controller failed: {type(err).__name__}: {err}\n"
                          + traceback.format_exc()}
    finally:
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        writer.event("end", **end)
        writer.close()
        folder.write_json(CONTROLLER, {**record, "ended_at": _now(), "code": end["code"]})
    return end["code"]


def _status(folder) -> str | None:
    try:
        return json.loads((folder.root / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
