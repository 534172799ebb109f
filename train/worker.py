"""Where every rank of a script, a module or the bundled trainer starts (launch's torchrun runs
`python train/worker.py script PATH ARGS...` or `... module NAME ARGS...`), before it becomes
that program with exec (same pid, so launch's probes and py-spy find it as the rank):

- LAUNCH_ATTEMPT: the attempt the node agent was started for (launch's restarts, `--resume`)
  plus the restarts torchrun made by itself (TORCHELASTIC_RESTART_COUNT), so a job counts
  0, 1, 2 ... across every kind of restart;
- the workdir (the folder the job runs in) first on PYTHONPATH, before the recipe's entries,
  so that the job's own processes (DataLoader workers, subprocesses) import its code first;
- the rank dies with its agent (PR_SET_PDEATHSIG): torchrun starts each worker in a session
  of its own, where no process-group signal of launch reaches it;
- one line naming the rank: the rendezvous has formed (launch's restart accounting reads it).

Imports only the standard library: nodes run it with their own interpreter.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

USAGE = "usage: worker.py (script PATH | module NAME) [ARGS...]"


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the agent died before prctl took effect
        os._exit(1)


def _int(name: str) -> int:
    try:
        return int(os.environ.get(name, "0") or 0)
    except ValueError:
        return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("script", "module"):
        print(USAGE, file=sys.stderr)
        return 2
    kind, target, args = argv[0], argv[1], argv[2:]
    env = os.environ
    attempt = _int("LAUNCH_ATTEMPT") + _int("TORCHELASTIC_RESTART_COUNT")
    env["LAUNCH_ATTEMPT"] = str(attempt)
    workdir = os.getcwd()
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != workdir]
    env["PYTHONPATH"] = os.pathsep.join([workdir, *rest])
    die_with_parent()
    print(f"launch: worker rank {env.get('RANK', '?')}/{env.get('WORLD_SIZE', '?')} "
          f"(local rank {env.get('LOCAL_RANK', '?')}, pid {os.getpid()}) attempt {attempt} "
          f"on {socket.gethostname()}", flush=True)
    program = ["-m", target] if kind == "module" else [target]
    try:
        os.execv(sys.executable, [sys.executable, "-u", *program, *args])
    except OSError as err:
        print(f"launch: cannot start {sys.executable}: {err}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
