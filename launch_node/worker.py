"""Where every rank of a script, a module or the bundled trainer starts (launch's torchrun runs
`python launch_node/worker.py script PATH` or `... module NAME`, the job's arguments in
LAUNCH_JOB_ARGV, out of reach of torchrun's parser), before it becomes that program with exec
(same pid, so launch's probes and py-spy find it as the rank):

- LAUNCH_ATTEMPT: the attempt the node agent was started for (launch's restarts, `--resume`)
  plus the rounds torchrun started this rank in before (rounds_before), so a job counts
  0, 1, 2 ... across every kind of restart, the same on every node;
- the workdir (the folder the job runs in) first on PYTHONPATH, before the recipe's entries,
  so that the job's own processes (DataLoader workers, subprocesses) import its code first;
- the rank dies with its agent (PR_SET_PDEATHSIG): torchrun starts each worker in a session
  of its own, where no process-group signal of launch reaches it;
- one line naming the rank: the rendezvous has formed (launch's restart accounting reads it);
- one output stream: the rank's stderr goes where its stdout goes. torchrun's `--tee` writes
  each to a file of its own and tails the two with a thread each, 0.1 s apart, so a
  traceback printed after 30 lines often came out before them, and the failure message,
  reading the rank's last lines, showed the 30 lines without the exception (measured: 1 run
  in 2). One stream keeps the order printed, on screen and in every log;
- the shipped workdir held (a shared flock on its `.launch-lock`, kept across exec): a later
  launch with other content ships into a sibling copy instead of changing files under a
  running job; and checked: the copy still holds what this run shipped (its digest), else the
  rank stops with a message rather than run another launch's code;
- the job's own folder (LAUNCH_WORKDIR, made from the copy LAUNCH_WORKDIR_COPY by
  launch_node/job_folder.py: one per run and node, the copy's files hard-linked) made, held and
  entered: the rank runs there, so what one run writes is never seen by another run, nor by
  another node sharing the machine.

`worker.py exec ARGV...` does only the last part, for a job that brings its own launcher (a
command), then becomes ARGV.

Imports only the standard library and launch_node/job_folder.py: nodes run it with their own
interpreter.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import sys
import time

# launch's own launch_node first (a job's own package of that name comes after: this process
# becomes the job by exec, with a fresh sys.path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch_node import job_folder  # noqa: E402

USAGE = "usage: worker.py (script PATH | module NAME | exec ARGV...) [ARGS...]"
# The job's arguments, a JSON list (launcher/job/spec.py JOB_ARGV_ENV): launch gives a script's
# or module's arguments here, not on torchrun's command line, where torchrun's own parser
# would take `--nn` or `--max` for one of its options.
JOB_ARGV = "LAUNCH_JOB_ARGV"
# launcher/workdir/node.py's LOCK and STATE (this file imports nothing of launch's; a test
# checks that the names agree).
WORKDIR_LOCK = ".launch-lock"
WORKDIR_STATE = ".launch-shipped.json"


MAX_STATE_BYTES = 64 << 20   # launcher/workdir/node.py's


def _own_file(folder: str, name: str, flags: int) -> int:
    """launch's own file in the workdir copy, where the job writes too, opened as
    launcher/workdir/node.py own_file opens it: never through a link, never waiting on a
    FIFO, a regular file or OSError naming it."""
    try:
        fd = os.open(os.path.join(folder, name), flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        raise OSError(err.errno, f"{name}: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{name} is not a regular file")
    return fd


def hold_workdir(env) -> str | None:
    """Hold the shipped workdir for this process and what it execs (LAUNCH_WORKDIR_COPY, or
    LAUNCH_WORKDIR when the plan names no job folder, shipped with LAUNCH_WORKDIR_DIGEST), then
    make, hold and enter the job's own folder (LAUNCH_WORKDIR) when the plan names one; why
    the job cannot start, or None."""
    copy = env.get("LAUNCH_WORKDIR_COPY")
    workdir, digest = copy or env.get("LAUNCH_WORKDIR"), env.get("LAUNCH_WORKDIR_DIGEST")
    if not workdir or not (digest or copy):
        return None
    try:
        fd = _own_file(workdir, WORKDIR_LOCK, os.O_RDWR | os.O_CREAT)
        # Blocks only while a ship changes the folder (seconds).
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.set_inheritable(fd, True)
        state = _own_file(workdir, WORKDIR_STATE, os.O_RDONLY)
        try:
            data = os.read(state, MAX_STATE_BYTES + 1)
        finally:
            os.close(state)
        if len(data) > MAX_STATE_BYTES:
            raise ValueError(f"{WORKDIR_STATE} is larger than {MAX_STATE_BYTES} bytes")
        found = json.loads(data).get("digest")
    except (OSError, ValueError, AttributeError, RecursionError) as err:
        return (f"the shipped workdir {workdir} cannot be read: {err} (a job may have "
                "replaced launch's own files there; launch run ships it again)")
    if digest and found != digest:
        return (f"the shipped workdir {workdir} no longer holds what this run shipped (another "
                "launch shipped other content into it after this run did); run again: a "
                "busy copy sends the new run to a copy of its own")
    if copy and env.get("LAUNCH_WORKDIR"):
        return enter_job_folder(copy, env["LAUNCH_WORKDIR"], env)
    return None


def enter_job_folder(copy: str, folder: str, env) -> str | None:
    """Make (or find) the job's folder, hold its run's lock across exec and make it the cwd
    (by descriptor: nothing between the check and the chdir can redirect it); why not, or
    None. Says in one line when files had to be copied or old runs' folders were removed."""
    try:
        made = job_folder.make(copy, folder, job_folder.keep_setting(env))
    except job_folder.JobFolderError as err:
        return f"the job's folder cannot be made: {err}"
    try:
        os.fchdir(made.folder)
    finally:
        os.close(made.folder)
    env["PWD"] = os.getcwd()   # a shell the job starts reads its folder from PWD
    if made.copied:
        print(f"launch: {made.copied} file(s) of {copy} copied into the job's folder {folder}, "
              f"not hard-linked ({made.why})", flush=True)
    if made.removed:
        print(f"launch: removed the job folders of {len(made.removed)} older run(s) beside "
              f"{folder} ({job_folder.KEEP_ENV} keeps {job_folder.keep_setting(env)})",
              flush=True)
    return None


def die_with_parent() -> None:
    """torchrun starts each worker in its own session, so a killed agent would leave workers
    behind that no process-group signal reaches: the kernel kills us with the agent (kept
    across exec; train/main.py asks again when started by hand or by launch_bench)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the agent died before prctl took effect
        os._exit(1)


def one_stream() -> None:
    """stderr onto stdout's file (kept across exec): one stream, in the order printed.
    Python's own stdout is unbuffered already (-u)."""
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return
    if (out.st_dev, out.st_ino) != (err.st_dev, err.st_ino):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(1, 2)


def _int(name: str) -> int:
    try:
        return int(os.environ.get(name, "0") or 0)
    except ValueError:
        return 0


# torchrun's files for one rank of one round: <log_dir>/<rdzv id>_<suffix>/attempt_<restart
# count>/<local rank>/error.json (TORCHELASTIC_ERROR_FILE). The <rdzv id>_<suffix> folder is
# made once per agent, so it outlives the agent's rounds.
ROUND_COUNT_FILE = "launch-rounds.local{local_rank}"


def rounds_before(env) -> int | None:
    """How many rounds this rank's torchrun agent started it in before this one, counted in the
    agent's own log folder; None where torchrun names no such folder.

    Not TORCHELASTIC_RESTART_COUNT: that counts only the agent's own failures. An agent whose
    workers were healthy when a peer's failed restarts them for the peer's new round without
    counting (torch's `num_nodes_waiting`), so after one restart one node said attempt 1 and
    the other attempt 0 (seen on the Slurm lab: a rank 0 that could not listen on MASTER_PORT
    restarted the group while rank 1 still waited for it). Every agent starts every local rank
    once per round, so the count of starts is the same on every node."""
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    local_rank = env.get("LOCAL_RANK")
    if not error_file or local_rank is None or not local_rank.isdigit():
        return None
    rank_dir = os.path.dirname(error_file)
    round_dir = os.path.dirname(rank_dir)
    if (os.path.basename(error_file) != "error.json"
            or not os.path.basename(round_dir).startswith("attempt_")):
        return None
    counter = os.path.join(os.path.dirname(round_dir),
                           ROUND_COUNT_FILE.format(local_rank=local_rank))
    try:
        with open(counter) as f:
            before = int(f.read().strip() or 0)
    except (OSError, ValueError):
        before = 0
    try:
        with open(counter + ".tmp", "w") as f:
            f.write(f"{before + 1}\n")
        os.replace(counter + ".tmp", counter)
    except OSError:
        return None
    return before


# torchrun picks MASTER_PORT for each round (when its agents do not share their store with
# the workers: launch turns sharing off for runs that restart) by binding port 0 on
# "localhost" and closing it (torch's get_free_port); rank 0 then listens on that port on every
# address. A socket on another address keeps it from doing so: an IPv4 one where "localhost"
# is ::1 (Debian's /etc/hosts), a socket opened in between. init_process_group then fails
# with EADDRINUSE (pytorch/pytorch#126510; seen on the Slurm lab). A short-lived holder is
# waited for.
MASTER_PORT_WAIT_S = 5.0


def _can_listen(port: int) -> bool:
    """Whether a listening socket can take the port on every IPv4 address, as the TCPStore of
    init_process_group will (libuv sets SO_REUSEADDR: a closed connection's TIME_WAIT does
    not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
        return True


def wait_for_master_port(env, wait_s: float = MASTER_PORT_WAIT_S) -> None:
    """Rank 0, where its process group's store is its own to make: MASTER_PORT free to listen
    on, waited for up to `wait_s`; said in one line when it is not."""
    port = env.get("MASTER_PORT", "")
    if env.get("RANK") != "0" or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" \
            or not port.isdigit() or not 0 < int(port) < 65536:
        return
    deadline = time.monotonic() + wait_s
    if _can_listen(int(port)):
        return
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if _can_listen(int(port)):
            print(f"launch: MASTER_PORT {port}, which torchrun chose for this round, was taken "
                  "on this node by another socket for a moment; it is free now", flush=True)
            return
    print(f"launch: MASTER_PORT {port}, which torchrun chose for this round, is taken on this "
          f"node by another socket (still after {wait_s:g}s): rank 0 cannot listen there and "
          "init_process_group fails with EADDRINUSE. torchrun chooses it by probing "
          "'localhost' only (pytorch/pytorch#126510); a restart of the round (--max-restarts) "
          "chooses another", flush=True)


def job_args(env) -> list[str] | None:
    """The arguments launch gave in JOB_ARGV (taken out of the environment: the job and its
    children do not see it); [] when none were given; None when it is not a JSON list of text."""
    given = env.pop(JOB_ARGV, None)
    if given is None:
        return []
    try:
        args = json.loads(given)
    except ValueError:
        return None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return None
    return args


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("script", "module", "exec"):
        print(USAGE, file=sys.stderr)
        return 2
    problem = hold_workdir(os.environ)
    if problem:
        print(f"launch: {problem}", file=sys.stderr, flush=True)
        return 2
    if argv[0] == "exec":
        try:
            os.execvp(argv[1], argv[1:])
        except OSError as err:
            print(f"launch: cannot start {argv[1]}: {err}", file=sys.stderr)
            return 127
    env = os.environ
    given = job_args(env)
    if given is None:
        print(f"launch: {JOB_ARGV} is not a JSON list of text", file=sys.stderr)
        return 2
    kind, target, args = argv[0], argv[1], [*argv[2:], *given]
    rounds = rounds_before(env)
    attempt = _int("LAUNCH_ATTEMPT") + (
        rounds if rounds is not None else _int("TORCHELASTIC_RESTART_COUNT"))
    env["LAUNCH_ATTEMPT"] = str(attempt)
    workdir = os.getcwd()
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != workdir]
    env["PYTHONPATH"] = os.pathsep.join([workdir, *rest])
    die_with_parent()
    one_stream()
    print(f"launch: worker rank {env.get('RANK', '?')}/{env.get('WORLD_SIZE', '?')} "
          f"(local rank {env.get('LOCAL_RANK', '?')}, pid {os.getpid()}) attempt {attempt} "
          f"on {socket.gethostname()}", flush=True)
    wait_for_master_port(env)
    program = ["-m", target] if kind == "module" else [target]
    try:
        os.execv(sys.executable, [sys.executable, "-u", *program, *args])
    except OSError as err:
        print(f"launch: cannot start {sys.executable}: {err}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
