"""What launch runs on a node (with the node's interpreter) to watch its ranks and, when the
run hangs, to describe them. Prints JSON.

    python launch_node/node_probe.py heartbeats RUN_DIR
    python launch_node/node_probe.py activity RUN_DIR --stamp STAMP [--node NODE]
    python launch_node/node_probe.py dump RUN_DIR --stamp STAMP [--node NODE] [--timeout 10]
    python launch_node/node_probe.py kill --stamp STAMP PID...
    python launch_node/node_probe.py reap --stamp STAMP [--node NODE]
    python launch_node/node_probe.py watch RUN_DIR --stamp STAMP [--node NODE]

`heartbeats`: every rank's heartbeat file (launch_node/heartbeat.py) in the node's folder.
`activity`: the heartbeats, and every process of this run on the node (its environment
carries LAUNCH_RUN_STAMP=STAMP, whatever session it moved to): pid, state, CPU time, its rank
when torchrun started it (RANK in its environment). A job of the user's own has no heartbeat:
launch tells a hung one from one computing silently by its processes' CPU time.
`dump`: for every rank (a heartbeat naming a live process of this run; without heartbeats,
the run's processes torchrun started, else its Python processes): its
process state from /proc (R running, S sleeping, D disk wait, T stopped, t traced, Z zombie),
the kernel function it waits in (wchan), and every thread's Python stack:
  1. `py-spy dump` (the py-spy next to this interpreter, else on PATH): reads the process's
     memory, so it also works on a stopped process (measured: py-spy 0.3.14 5 of 5 on Python
     3.11, running and SIGSTOPped; 0.4.3 failed every time, hence the pin in pyproject.toml);
  2. else SIGUSR2, which the trainer registered with faulthandler: works where ptrace is not
     allowed, but only in a process that runs (a stopped one answers when continued).
On NCCL ranks it also asks the flight recorder for a dump (TORCH_NCCL_DEBUG_INFO_PIPE_FILE).
`kill`: SIGKILL to the given ranks, each only if it is a process of this run (the stamp):
torchrun then restarts the node's workers, the way it does when one dies.
`reap`: SIGKILL to every process of this run still on the node, once its agents are gone (a
job's child that moved to a session of its own, out of reach of the agent's process group).
`watch`: `heartbeats`, `activity` or `reap` for every such line on stdin, one JSON line each,
until stdin ends: the hang watch's looks over one SSH channel kept for the run, each a line
instead of an interpreter started (launcher/backends/ssh/watcher.py), and the reap after the
run's end over the same channel.
`watch --guard PGID`: the same looks, asked from inside the node agent's own SSH session
(launcher/backends/ssh/agent.py START_SCRIPT starts it beside the agent, on the session's
stdin; it answers on the session's stderr, which carries nothing of the job's): a line `WHAT ID`
is answered `@@launch-watch ID JSON`, and `signal NAME ID` signals the agent's process group.
When stdin ends (the agent ended and sshd closed it, or launch closed it, or the connection
dropped) it is the agent's guard: a live agent's process group gets SIGTERM, SIGKILL 3 s later;
then every process of this start of the node still there (the run's stamp and
LAUNCH_AGENT_SESSION=PGID in its environment: a job's child in a session of its own) is
killed, and what was killed is the last line, `@@launch-watch end JSON`, with the node's
folder in it when it is small (folder_files: launch then fetches nothing). One SSH session per
node does the agent, its looks, its signals and its reap: every session costs the node a login
shell (a pyenv or conda init in ~/.bashrc: 0.17 s of CPU measured on the lab), and at 64 hosts
launch's four sessions per node were most of its time over a plain fan-out.
launch starts it with `python -S` (no site-packages: it needs only the standard library, and a
node's site-packages with torch's CUDA wheels has dozens of .pth files and paths to read at
every start).
`--node`: only the processes of that launch node (LAUNCH_NODE in their environment): nodes that
share a machine's processes (local nodes, lab hosts in network namespaces) are told apart.

Imports only the standard library (and heartbeat.py beside it, stdlib too).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import stat as stat_module
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch_node.heartbeat import (HEARTBEAT_DIR, STACK_SIGNAL, read_heartbeat,  # noqa: E402
                             stack_path)

STAMP_ENV = "LAUNCH_RUN_STAMP"
# The process group (= session) of one start of a node's agent, in every process it starts
# (launcher/backends/ssh/agent.py START_SCRIPT): what the guard's reap keeps to, so that a
# start's end never reaps the next start of the same node.
SESSION_ENV = "LAUNCH_AGENT_SESSION"
ANSWER_MARK = "@@launch-watch "
GUARD_GRACE_S = 3.0
# The node's folder comes back in the guard's last line when it is this small (launch then
# opens no SFTP session to fetch it: a session costs the node a login shell); else launch
# fetches it over SFTP. Small enough that 1,024 nodes' folders held at once are 256 MB at most.
INLINE_BYTES = 1 << 18
INLINE_FILES = 256
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "waiting on disk", "T": "stopped",
               "t": "stopped by a tracer", "Z": "zombie", "X": "dead", "I": "idle"}


def read_heartbeats(run_dir: str | Path) -> list[dict[str, Any]]:
    folder = Path(run_dir) / HEARTBEAT_DIR
    out = []
    for path in sorted(folder.glob("local*.json")):
        beat = read_heartbeat(path)
        if beat is not None:
            out.append(beat)
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return _parse_environ(raw)


def _parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def process_state(pid: int) -> tuple[str | None, str | None]:
    """(state letter, wchan) from /proc, or (None, None) when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, None
    # The command name sits in parentheses and may hold spaces: the state follows the last ')'.
    state = stat.rsplit(")", 1)[1].split()[0]
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or None
    except OSError:
        wchan = None
    return state, (None if wchan == "0" else wchan)


# shutil, subprocess and concurrent.futures are imported where a dump uses them: `watch`, started
# on every node of every SSH run, needs none of them (half of its interpreter's start, ~30 ms
# of CPU).


def find_py_spy() -> str | None:
    import shutil

    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def py_spy_dump(pid: int, timeout: float) -> tuple[str | None, str | None]:
    """(stack text, error)."""
    import subprocess

    exe = find_py_spy()
    if exe is None:
        return None, "py-spy is not installed next to the node's Python nor on PATH"
    try:
        proc = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"py-spy dump took more than {timeout:g}s"
    except OSError as err:
        return None, f"py-spy could not run: {err}"
    if proc.returncode != 0 or "Thread " not in proc.stdout:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return None, f"py-spy dump failed: {why[-1] if why else f'exit {proc.returncode}'}"
    return proc.stdout, None


def faulthandler_dump(pid: int, path: Path, timeout: float) -> tuple[str | None, str | None]:
    """Ask the rank to print its own stacks (launch_node/heartbeat.py registered the signal)."""
    try:
        before = path.stat().st_size
    except OSError:
        return None, f"no stack file {path}"
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError as err:
        return None, f"could not signal {pid}: {err}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            if path.stat().st_size > before:
                time.sleep(0.2)  # let it finish writing every thread
                with open(path, "rb") as f:
                    f.seek(before)
                    return f.read().decode(errors="replace"), None
        except OSError:
            break
    return None, f"the rank did not answer {signal.Signals(STACK_SIGNAL).name} within " \
                 f"{timeout:g}s"


def flight_recorder(pid: int, rank: int, env: dict[str, str], timeout: float) -> str | None:
    """Ask NCCL for its flight recorder dump; returns the dump's path once written."""
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    out = env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not stem or not out:
        return None
    cwd = Path(f"/proc/{pid}/cwd")
    pipe = Path(f"{stem}{rank}.pipe")
    dump = Path(f"{out}{rank}")
    if not pipe.is_absolute():
        pipe, dump = Path(os.readlink(cwd)) / pipe, Path(os.readlink(cwd)) / dump
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None  # no pipe: gloo, or NCCL built without it
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dump.exists():
            return str(dump)
        time.sleep(0.1)
    return None


def describe_rank(beat: dict[str, Any], run_dir: Path, stamp: str, timeout: float
                  ) -> dict[str, Any]:
    pid = int(beat["pid"])
    out: dict[str, Any] = {key: beat.get(key) for key in
                           ("node", "rank", "local_rank", "pid", "step", "phase", "attempt",
                            "cmd")}
    env = _environ(pid)
    state, wchan = process_state(pid)
    if state is None or env.get(STAMP_ENV) != stamp:
        out.update(state="gone", state_name="not running (its heartbeat is all that is left)",
                   stack=None, stack_source=None, error="process gone")
        return out
    out.update(state=state, state_name=STATE_NAMES.get(state, state), wchan=wchan)
    stopped = state in ("T", "t")
    stack, error = py_spy_dump(pid, timeout)
    source = "py-spy" if stack else None
    if stack is None and not stopped:  # a stopped process cannot run a signal handler
        stack, fallback_error = faulthandler_dump(
            pid, run_dir / stack_path(".", int(beat.get("local_rank") or 0)), min(timeout, 5.0))
        if stack:
            source = "faulthandler"  # py-spy's error stays, as a note
        else:
            error = f"{error}; {fallback_error}"
    out.update(stack=stack, stack_source=source, error=error)
    out["nccl_trace"] = None if stopped else flight_recorder(
        pid, int(beat.get("rank") or 0), env, timeout=min(timeout, 5.0))
    return out


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, CPU ticks: user + system) from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may hold spaces: the fields follow the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    try:
        return fields[0], int(fields[1]), int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def run_processes(stamp: str, node: str | None = None, session: str | None = None
                  ) -> list[dict[str, Any]]:
    """Every process of the run on this node (but this probe), by the stamp in its
    environment: a pid that another process reused is never taken for one of the run's.
    `node`: only the processes of that launch node; `session`: only those of that start of
    its agent (SESSION_ENV)."""
    out = []
    me = os.getpid()
    # Every process's environment is read, but only the run's are parsed: the stamp's entry
    # is looked for in the raw bytes first (a substring search in C). A hang watch's look
    # reads every process of the machine every 2 s; parsing each environment into a dict
    # was most of its CPU (4.5 against 1.7 ms per look at 99 processes; a lab of 64 hosts
    # on one machine holds ~500, looked at by 64 watchers).
    entry_bytes = b"\0" + f"{STAMP_ENV}={stamp}".encode() + b"\0"
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if entry_bytes not in b"\0" + raw + b"\0":
            continue
        env = _parse_environ(raw)
        if env.get(STAMP_ENV) != stamp or (node is not None and env.get("LAUNCH_NODE") != node) \
                or (session is not None and env.get(SESSION_ENV) != session):
            continue
        stat = _stat(pid)
        if stat is None:
            continue
        argv = _cmdline(pid)
        out.append({
            "pid": pid, "ppid": stat[1], "state": stat[0], "cpu_ticks": stat[2],
            "rank": _as_int(env.get("RANK")), "local_rank": _as_int(env.get("LOCAL_RANK")),
            # torchrun's agent (launch's, or one the user's command started): it waits for
            # its workers and is not one of the job's ranks.
            "agent": "torch.distributed.run" in argv or any(
                a.endswith(("/torchrun", "torch/distributed/run.py")) for a in argv),
            "python": bool(argv) and os.path.basename(argv[0]).startswith("python"),
            "cmd": " ".join(argv)[:300],
        })
    return out


def activity(run_dir: str | Path, stamp: str, node: str | None = None) -> dict[str, Any]:
    return {"beats": read_heartbeats(run_dir), "procs": run_processes(stamp, node),
            "ticks_per_s": os.sysconf("SC_CLK_TCK")}


def rank_processes(run_dir: Path, stamp: str, node: str | None = None) -> list[dict[str, Any]]:
    """The ranks to describe: heartbeats (the trainer), else the processes torchrun started
    (RANK in their environment; the first of each rank, not its DataLoader workers), else the
    run's Python processes (a command that brought its own launcher)."""
    beats = read_heartbeats(run_dir)
    if beats:
        return beats
    procs = [p for p in run_processes(stamp, node) if not p["agent"]]
    pids = {p["pid"] for p in procs}
    ranked = [p for p in procs if p["rank"] is not None]
    if ranked:
        # A rank's own children (DataLoader workers) inherit RANK: keep the topmost.
        chosen = [p for p in ranked if not any(q["pid"] == p["ppid"] and q["rank"] == p["rank"]
                                               for q in ranked)]
    else:
        chosen = [p for p in procs if p["python"] and p["ppid"] not in pids] or \
            [p for p in procs if p["python"]]
    return [{"node": node, "rank": p["rank"],
             "local_rank": p["local_rank"], "pid": p["pid"], "step": None, "phase": None,
             "attempt": None, "cmd": p["cmd"]} for p in chosen]


def dump(run_dir: str | Path, stamp: str, timeout: float = 10.0,
         node: str | None = None) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    run_dir = Path(run_dir)
    beats = rank_processes(run_dir, stamp, node)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(beats)))) as pool:
        ranks = list(pool.map(lambda b: describe_rank(b, run_dir, stamp, timeout), beats))
    return {"ranks": ranks, "py_spy": find_py_spy()}


def kill(pids: list[int], stamp: str) -> dict[str, Any]:
    killed, skipped = [], []
    for pid in pids:
        if _environ(pid).get(STAMP_ENV) != stamp:
            skipped.append(pid)  # gone, or a reused pid that is not ours
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            skipped.append(pid)
    return {"killed": killed, "skipped": skipped}


def reap(stamp: str, node: str | None = None, session: str | None = None) -> dict[str, Any]:
    return kill([p["pid"] for p in run_processes(stamp, node, session)], stamp)


def look(what: str, run_dir: str | Path, stamp: str, node: str | None) -> Any:
    if what == "heartbeats":
        return read_heartbeats(run_dir)
    if what == "activity":
        return activity(run_dir, stamp, node)
    if what == "reap":
        return reap(stamp, node)
    raise ValueError(f"node_probe.py watch: no such look {what[:100]!r} (heartbeats, "
                     "activity, reap)")


def watch(run_dir: str | Path, stamp: str, node: str | None = None) -> int:
    while line := sys.stdin.readline():
        try:
            answer = look(line.strip(), run_dir, stamp, node)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


def folder_files(run_dir: str | Path, skip: tuple[str, ...] = ("code",)
                 ) -> dict[str, str] | None:
    """The node folder's regular files (all but `skip` at its top: the code launch shipped),
    {relative path: base64 content}, when at most INLINE_FILES of at most INLINE_BYTES in all;
    None when more (or unreadable: launch fetches the folder then). No link is followed; a
    file that is not regular (a fifo a job left) is left out, as SFTP's fetch does."""
    root = os.path.abspath(run_dir)
    out: dict[str, str] = {}
    total = 0
    for folder, dirs, names in os.walk(root):
        if folder == root:
            dirs[:] = [d for d in dirs if d not in skip]
            names = [n for n in names if n not in skip]
        for name in names:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue   # a link, or gone
            try:
                info = os.fstat(fd)
                if not stat_module.S_ISREG(info.st_mode):
                    continue
                total += info.st_size
                if total > INLINE_BYTES or len(out) >= INLINE_FILES:
                    return None
                data = b""
                while len(data) <= info.st_size:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                return None
            finally:
                os.close(fd)
            if len(data) != info.st_size:
                return None   # still being written: SFTP then
            out[os.path.relpath(path, root)] = base64.b64encode(data).decode()
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_agent(pgid: int, grace_s: float = GUARD_GRACE_S) -> bool:
    """The agent (its pid is its group's id) still running when launch is gone: its group
    stopped, SIGTERM then SIGKILL (torchrun given SIGTERM was seen hanging at exit on its
    --tee log threads). False when the agent had ended."""
    try:
        os.kill(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    return True


def guard(run_dir: str | Path, stamp: str, node: str | None, pgid: int) -> int:
    """`watch --guard`: the looks asked in the agent's own session, then its guard and reap
    (the module's docstring)."""
    try:
        os.setpgid(0, 0)   # out of the agent's group: launch's SIGKILL to it must not end
    except OSError:        # the guard, whose reap and last line come after
        pass
    out = sys.stdout

    def say(ident: str, answer: Any) -> None:
        out.write(f"{ANSWER_MARK}{ident} {json.dumps(answer)}\n")
        out.flush()

    try:
        while line := sys.stdin.readline():
            parts = line.split()   # WHAT ID, or signal NAME ID
            if not parts:
                continue
            what, ident = parts[0], (parts[-1] if len(parts) > 1 else "-")
            try:
                if what == "signal" and len(parts) == 3:
                    try:
                        os.killpg(pgid, getattr(signal, "SIG" + parts[1]))
                        answer: Any = {"sent": True}
                    except ProcessLookupError:   # the agent has ended: nothing to signal,
                        answer = {"sent": False}  # and no reason to try another way
                else:
                    answer = look(what, run_dir, stamp, node)
            except (ValueError, AttributeError, OSError) as err:
                answer = {"error": str(err)[:300]}
            say(ident, answer)
    except (BrokenPipeError, OSError):
        pass   # launch is gone: the guard still does its part
    stopped = stop_agent(pgid)
    reaped = reap(stamp, node, str(pgid))
    try:
        say("end", {**reaped, "stopped": stopped, "files": folder_files(run_dir)})
    except (BrokenPipeError, OSError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    hb = sub.add_parser("heartbeats")
    hb.add_argument("run_dir")
    ap = sub.add_parser("activity")
    ap.add_argument("run_dir")
    ap.add_argument("--stamp", required=True)
    ap.add_argument("--node")
    dp = sub.add_parser("dump")
    dp.add_argument("run_dir")
    dp.add_argument("--stamp", required=True)
    dp.add_argument("--timeout", type=float, default=10.0)
    dp.add_argument("--node")
    kp = sub.add_parser("kill")
    kp.add_argument("--stamp", required=True)
    kp.add_argument("pids", type=int, nargs="+")
    rp = sub.add_parser("reap")
    rp.add_argument("--stamp", required=True)
    rp.add_argument("--node")
    wp = sub.add_parser("watch")
    wp.add_argument("run_dir")
    wp.add_argument("--stamp", required=True)
    wp.add_argument("--node")
    wp.add_argument("--guard", type=int, help="the agent's process group: looks asked in its "
                    "session, its guard and reap when stdin ends")
    args = p.parse_args(argv)
    if args.what == "heartbeats":
        print(json.dumps(read_heartbeats(args.run_dir)))
    elif args.what == "activity":
        print(json.dumps(activity(args.run_dir, args.stamp, args.node)))
    elif args.what == "dump":
        print(json.dumps(dump(args.run_dir, args.stamp, args.timeout, args.node)))
    elif args.what == "reap":
        print(json.dumps(reap(args.stamp, args.node)))
    elif args.what == "watch" and args.guard is not None:
        return guard(args.run_dir, args.stamp, args.node, args.guard)
    elif args.what == "watch":
        return watch(args.run_dir, args.stamp, args.node)
    else:
        print(json.dumps(kill(args.pids, args.stamp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
