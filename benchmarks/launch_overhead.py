"""Launch overhead on a lab cluster: time from starting a run to every rank having passed
rendezvous, `launch` (preflight, ship code, start over fabric, stream) against a plain
`ssh host torchrun ...` fan-out started in parallel, on 2, 4 and 8 hosts; and the same for a
user's own script (`launch run --ssh probe.py`: a workdir shipped, the script run by torchrun
from there), which should cost no more than the bundled trainer; and the bundled run detached
(`launch run --detach`: the pipeline handed over to a controller on the head, which connects to
the nodes again from there), timed from the same start to the same milestone, read from the
head's copy of the node logs after the client has gone (goal: within 10% of attached).

Where launch's time goes: a table of phases, each the median over repeats of the time from
one milestone to the next, a milestone being reached when the last host reaches it
(connected, code uploaded, workdir shipped, probed: preflight; run folder and plan; the
rendezvous store started; every agent started; the store's line that it is up; every worker's
first line, before it imports torch; every rank past rendezvous). The plain fan-out has the
last two.

With `--cpu`, also the CPU every process used, by kind (median seconds): on the lab hosts
(every process in their network namespaces: the preflight probe, the workdir ship, the
rendezvous store, the hang watch, the agents and their ranks, sshd and shells) and here
(launch itself, the plain fan-out's ssh clients). All hosts share this machine's cores, so
CPU one variant spends that the other does not is time: the instrument that found where the
ratio went (process accounting, acct(2); a sampler process names each pid by its command line).

Needs root (it builds a lab of SSH hosts in network namespaces). Prints the tables and writes
benchmarks/results/launch_overhead.json.

    .venv/bin/python benchmarks/launch_overhead.py [--hosts 2 4 8] [--repeats 3] [--cpu]

The Slurm column (`--slurm`): on a Slurm lab (`launch lab up --slurm`: slurmctld and a slurmd
per network namespace), the same time for `launch run --slurm` (preflight, code copied into
the run folder, sbatch, the job followed) against a hand-written sbatch script of the same job
(srun torchrun, the first node hosting the rendezvous), submitted with `sbatch --wait`. Writes
benchmarks/results/launch_overhead_slurm.json and .txt.

    .venv/bin/python benchmarks/launch_overhead.py --slurm [--slurm-nodes 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import resource
import select
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.backends.ssh.backend import SshBackend, plan_inventory  # noqa: E402
from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.cluster.ssh import SshOptions  # noqa: E402
from launcher.job.recipe import recipe_from_mapping  # noqa: E402
from launcher.job.request import RunRequest  # noqa: E402
from launcher.job.spec import job_of, script_recipe, workload  # noqa: E402
from launcher.pipeline.run import run, run_here  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402
from launcher.report.display import PlainDisplay  # noqa: E402
from launcher.workdir.scan import scan_workdir  # noqa: E402

VARIANTS = ("launch", "script", "plain", "detached")

PASSED = re.compile(r"rendezvous-passed rank=(\d+) world=(\d+) t=([0-9.]+)")
STARTED = re.compile(r"probe-started t=([0-9.]+)")
PROBE = REPO / "launch_bench" / "rendezvous_probe.py"

# Milestones in the order a launch reaches them (the last host's time, from the start).
MILESTONES = ("connected", "code uploaded", "workdir shipped", "probed", "preflight done",
              "handed over", "planned", "store started", "agents started", "store listening",
              "workers started", "rendezvous passed")


class Timeline:
    """When the last host reached each milestone of one launch, in seconds from its start:
    the launcher's own functions wrapped for the benchmark's run (the launcher is unchanged)."""

    def __init__(self):
        self.started = time.time()
        self.at: dict[str, float] = {}

    def mark(self, milestone: str) -> None:
        self.at[milestone] = max(self.at.get(milestone, 0.0), time.time() - self.started)

    def from_logs(self, text: str, world: int) -> float:
        self.mark_at("workers started", max(float(m[1]) for m in STARTED.finditer(text)))
        passed = last_rank_passed(text, world)
        self.mark_at("rendezvous passed", passed)
        return passed - self.started

    def mark_at(self, milestone: str, t: float) -> None:
        self.at[milestone] = t - self.started

    def phases(self) -> dict[str, float]:
        """Each reached milestone's time since the previous reached one."""
        out, before = {}, 0.0
        for name in MILESTONES:
            if name in self.at:
                out[name] = max(0.0, self.at[name] - before)
                before = max(before, self.at[name])
        return out


@contextlib.contextmanager
def timed(timeline: Timeline):
    """Wrap what preflight and the runner call, each wrapper marking its milestone."""
    import launcher.backends.ssh.agent as remote_agent
    import launcher.backends.ssh.preflight as preflight
    import launcher.execute.attempt as runner
    import launcher.runs.logs as logs
    import launcher.workdir.sync as workdir_sync
    from launch_node.rdzv_store import READY

    def after(module, name: str, milestone: str, first_call_marks=None):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            if first_call_marks:
                timeline.mark(first_call_marks)
            out = original(*args, **kwargs)
            timeline.mark(milestone)
            return out
        return module, name, original, wrapper

    starts = []
    original_start = remote_agent.SshNodeProcess.start
    original_line = logs.LineRouter.line

    def start(self):
        original_start(self)
        if self.label == "store":
            timeline.mark("store started")
        elif self.label is None:
            starts.append(self.name)
            timeline.mark("agents started")

    def line(self, node, raw, label=None):
        if label == "store" and raw.startswith(READY):
            timeline.mark("store listening")
        original_line(self, node, raw, label)

    # The code's own upload is gone since preflight's probe writes it, and the probe is a
    # NodeProbe since it starts before the workdir's ship (the older names stay, for runs of
    # the code before).
    wrapped = [(preflight, "connect", "connected"), (remote_agent, "upload", "code uploaded"),
               (workdir_sync, "ship_ssh", "workdir shipped"), (preflight, "probe", "probed"),
               (getattr(preflight, "NodeProbe", None), "facts", "probed"),
               (preflight, "preflight", "preflight done")]
    patches = [after(module, name, milestone) for module, name, milestone in wrapped
               if hasattr(module, name)]
    patches.append(after(runner, "execute_plan", "run ended", first_call_marks="planned"))
    for module, name, _, wrapper in patches:
        setattr(module, name, wrapper)
    remote_agent.SshNodeProcess.start = start
    logs.LineRouter.line = line
    try:
        yield
    finally:
        for module, name, original, _ in patches:
            setattr(module, name, original)
        remote_agent.SshNodeProcess.start = original_start
        logs.LineRouter.line = original_line


# ---- CPU by kind (--cpu) -------------------------------------------------------------------

# What ran on the lab hosts, by its command line: the first kind one of whose marks it holds.
CPU_KINDS = (
    ("preflight probe", ("def torch_facts",)),                       # python -c PROBE
    ("workdir ship", ("The receiving side of a workdir ship",)),     # python -c NODE_SOURCE
    ("rendezvous store", ("/rdzv_store.py",)),
    ("hang watch", ("/node_probe.py",)),
    # A rank is forked by its agent before it execs: seen then, it has the agent's command line.
    ("agents and ranks", ("torch.distributed.run", "/worker.py", "probe.py")),
)
ON_HOSTS_ELSE = "sshd and shells"
HERE = ("launch itself", "ssh clients")
CPU_ROWS = (*(kind for kind, _ in CPU_KINDS), ON_HOSTS_ELSE, *HERE)
# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime, then comp_t utime, stime, mem, io, rw, minflt, majflt, swaps, and the command name.
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")


def comp_t(value: int) -> int:
    """acct's 16-bit float: 13 bits of mantissa, 3 of base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def kind_of(cmdline: str) -> str:
    for kind, marks in CPU_KINDS:
        if any(mark in cmdline for mark in marks):
            return kind
    return ON_HOSTS_ELSE


def sample_pids(namespaces: list[str]) -> int:
    """The sampler (`--sample-pids`): every process in these network namespaces (inode
    numbers) by pid, with its command line once it is final (after sshd, sh and env exec
    what they run), until stdin ends; then the map as JSON. Says `ready` after its first look."""
    seen: dict[int, str] = {}
    final: set[int] = set()
    wanted = {f"net:[{inode}]" for inode in namespaces}
    passing = ("sshd", "sh", "bash", "dash", "env", "setsid")
    looks = 0
    while not select.select([sys.stdin], [], [], 0.02)[0] or sys.stdin.read(1):
        looks += 1
        if looks == 2:
            print("ready", flush=True)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in final:
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/net") not in wanted:
                    final.add(int(entry))   # not on a lab host: never looked at again
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            seen[int(entry)] = b" ".join(argv).decode(errors="replace")[:600]
            if os.path.basename(argv[0].decode(errors="replace")).split(":")[0] not in passing:
                final.add(int(entry))
    print(json.dumps(seen))
    return 0


class CpuMeter:
    """CPU seconds by kind of every process of one timed run: process accounting for what
    ran on the lab hosts (each record written when its process exits; the run's all have by
    the time it returns), rusage for this process and its children."""

    def __init__(self, lab: Lab, folder: Path):
        self.file = folder / f"acct-{time.monotonic_ns()}"
        self.file.touch()
        namespaces = [str(Path(f"/run/netns/{h.netns}").stat().st_ino) for h in lab.hosts]
        self.sampler = subprocess.Popen(
            [sys.executable, __file__, "--sample-pids", *namespaces], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        if self.sampler.stdout.readline().strip() != "ready":
            raise RuntimeError("the pid sampler did not start")
        if self.libc.acct(str(self.file).encode()) != 0:
            raise OSError(ctypes.get_errno(), "acct(2): process accounting (needs root)")
        self.before = (resource.getrusage(resource.RUSAGE_SELF),
                       resource.getrusage(resource.RUSAGE_CHILDREN))
        return self

    def __exit__(self, *exc) -> None:
        after = (resource.getrusage(resource.RUSAGE_SELF),
                 resource.getrusage(resource.RUSAGE_CHILDREN))
        time.sleep(0.3)   # the last records
        self.libc.acct(None)
        names = {int(pid): cmd for pid, cmd in json.loads(self.sampler.communicate("")[0]).items()}
        self.seconds = dict.fromkeys(CPU_ROWS, 0.0)
        for kind, (b, a) in zip(HERE, zip(self.before, after)):
            self.seconds[kind] = (a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime)
        data = self.file.read_bytes()
        self.file.unlink()
        ticks = os.sysconf("SC_CLK_TCK")
        for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
            record = ACCT_V3.unpack_from(data, offset)
            pid, ppid, utime, stime = record[6], record[7], record[10], record[11]
            # A process too short-lived for the sampler counts as its parent's kind; one of
            # neither is not the lab's (the machine is shared).
            cmd = names.get(pid, names.get(ppid))
            if cmd is not None:
                self.seconds[kind_of(cmd)] += (comp_t(utime) + comp_t(stime)) / ticks


@contextlib.contextmanager
def measured_cpu(lab: Lab, on: bool):
    if not on:
        yield None
        return
    with CpuMeter(lab, lab.dir) as meter:
        yield meter


# What torchrun starts on every node: the probe (it ignores the --out-dir launch adds).
PROBE_JOB = workload("launch_bench/rendezvous_probe.py")


def recipe_for(hosts: int):
    return recipe_from_mapping({"name": "overhead", "nodes": hosts,
                                "rendezvous": {"timeout": 300},
                                "train": {"steps": 1}}, "benchmarks/launch_overhead.py")


def last_rank_passed(text: str, world: int) -> float:
    times = {int(m[1]): float(m[3]) for m in PASSED.finditer(text)}
    if len(times) != world:
        raise RuntimeError(f"only {len(times)} of {world} ranks passed rendezvous:\n{text[-2000:]}")
    return max(times.values())


def time_launch(lab: Lab, hosts: int, run_id: str, runs_dir: Path, port: int,
                workdir: Path | None = None, cpu: bool = False
                ) -> tuple[float, dict[str, float], dict[str, float] | None]:
    """(seconds to every rank past rendezvous, the phases, CPU by kind with `cpu`). With
    `workdir`: a user's own script there, as `launch run --ssh probe.py` from that folder
    runs it."""
    nodes = load_inventory(lab.inventory)[:hosts]
    # The benchmark prints its own table; the runs' lines go nowhere.
    quiet = PlainDisplay(open("/dev/null", "w"))  # noqa: SIM115
    backend = SshBackend(lab.inventory, SshOptions())
    with measured_cpu(lab, cpu) as meter:
        timeline = Timeline()
        launch_timed(backend, timeline, hosts, nodes, run_id, runs_dir, port, quiet, workdir)
    logs = "".join(p.read_text() for p in (runs_dir / run_id).glob("*/node.log"))
    return timeline.from_logs(logs, hosts), timeline.phases(), meter and meter.seconds


def time_detached(lab: Lab, hosts: int, run_id: str, runs_dir: Path, port: int
                  ) -> tuple[float, dict[str, float], None]:
    """The bundled run handed over (`--detach`): the client's part marked when it returns,
    then every rank past rendezvous read from the head's node logs (their times are the
    ranks' own clock, so how often this looks does not count), and the run waited to its end
    so the next variant has the lab to itself."""
    backend = SshBackend(lab.inventory, SshOptions())
    timeline = Timeline()
    run(backend, RunRequest(recipe_for(hosts), run_id, hosts, job=PROBE_JOB,
                            runs_dir=str(runs_dir), rdzv_port=port, detach=True))
    timeline.mark("handed over")
    handle = json.loads((runs_dir / run_id / "detached.json").read_text())
    home = backend.home(handle)
    names = [n.name for n in load_inventory(lab.inventory)[:hosts]]
    deadline = time.monotonic() + 600
    try:
        while True:
            logs = "".join((home.read(f"{n}/node.log", 1 << 24) or b"").decode(errors="replace")
                           for n in names)
            if len({m[1] for m in PASSED.finditer(logs)}) >= hosts and \
                    home.alive() is False:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"detached run {run_id} did not end:\n{logs[-2000:]}")
            time.sleep(0.5)
    finally:
        close = getattr(home, "close", None)
        if close is not None:
            close()
    return timeline.from_logs(logs, hosts), timeline.phases(), None


def launch_timed(backend, timeline, hosts, nodes, run_id, runs_dir, port, quiet, workdir):
    with timed(timeline):
        if workdir is None:
            run_here(backend, RunRequest(recipe_for(hosts), run_id, hosts, job=PROBE_JOB,
                                         runs_dir=str(runs_dir), rdzv_port=port),
                     display=quiet)
        else:
            # What `launch run` does before the backend: the recipe, the job, the scan.
            recipe = user_recipe(hosts, workdir)
            run_here(backend, RunRequest(recipe, run_id, hosts, job=job_of(recipe),
                                         workdir=scan_workdir(workdir),
                                         runs_dir=str(runs_dir), rdzv_port=port),
                     display=quiet)


def user_recipe(hosts: int, workdir: Path):
    data = script_recipe(script="probe.py", module=None, workdir=str(workdir), nodes=hosts)
    data["rendezvous"] = {"timeout": 300}
    return recipe_from_mapping(data, "<command line>", workdir)


def user_workdir(tmp: Path) -> Path:
    """A user's project: the probe as their script, beside a few files of their own."""
    folder = tmp / "project"
    folder.mkdir()
    (folder / "probe.py").write_bytes(PROBE.read_bytes())
    (folder / "README.md").write_text("a user's project\n")
    (folder / "data.csv").write_text("x,y\n" + "".join(f"{i},{i * i}\n" for i in range(5000)))
    return folder


def time_plain_fanout(lab: Lab, hosts: int, run_id: str, port: int, cpu: bool = False
                      ) -> tuple[float, dict[str, float], dict[str, float] | None]:
    """What people script by hand: the same torchrun line per host, over ssh, all at once,
    with the code already in place (copied before the clock starts)."""
    nodes = load_inventory(lab.inventory)[:hosts]
    plan = plan_inventory(RunRequest(recipe_for(hosts), run_id, hosts, job=PROBE_JOB,
                                     rdzv_port=port), nodes)
    for cmd in plan.nodes:
        code = Path(cmd.cwd) / "code" / "launch_bench"
        code.mkdir(parents=True, exist_ok=True)
        (code / "rendezvous_probe.py").write_bytes(PROBE.read_bytes())
    ssh = ["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    with measured_cpu(lab, cpu) as meter:
        timeline = Timeline()
        procs = []
        for cmd, node in zip(plan.nodes, nodes):
            env = [f"{k}={v}" for k, v in cmd.env.items()]
            # By hand the head's agent hosts the rendezvous store (c10d's default), where
            # launch runs it as a process of its own.
            argv = [a.replace("is_host=0", "is_host=1") if cmd.is_head else a
                    for a in cmd.argv]
            line = shlex.join(["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cmd.cwd,
                               "env", *env, *argv])
            procs.append(subprocess.Popen([*ssh, f"root@{node.address}", line], text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        timeline.mark("agents started")
        out = "".join(p.communicate(timeout=600)[0] for p in procs)
    return timeline.from_logs(out, hosts), timeline.phases(), meter and meter.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/launch_overhead.json"))
    parser.add_argument("--slurm", action="store_true",
                        help="the Slurm column instead: launch --slurm vs a hand-written sbatch")
    parser.add_argument("--slurm-nodes", type=int, default=2)
    parser.add_argument("--cpu", action="store_true",
                        help="also the CPU every process used, by kind (process accounting)")
    parser.add_argument("--sample-pids", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample_pids:
        return sample_pids(args.sample_pids)
    if args.slurm:
        return slurm_main(args.slurm_nodes, args.repeats)

    results = []
    with tempfile.TemporaryDirectory(prefix="launch-overhead-") as tmp:
        tmp = Path(tmp)
        lab = Lab.create(tmp / "lab", max(args.hosts))
        workdir = user_workdir(tmp)
        try:
            port = 29700
            for hosts in args.hosts:
                seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
                phases: dict[str, list[dict]] = {v: [] for v in VARIANTS}
                cpu: dict[str, list[dict]] = {v: [] for v in VARIANTS}
                for rep in range(args.repeats):
                    port += 3
                    # Rotate the order so no variant always runs on a warmer cache.
                    turn = rep % len(VARIANTS)
                    order = VARIANTS[turn:] + VARIANTS[:turn]
                    for i, variant in enumerate(order):
                        run_id = f"{variant}-{hosts}-{rep}"
                        if variant == "plain":
                            took, split, used = time_plain_fanout(lab, hosts, run_id,
                                                                  port + i, cpu=args.cpu)
                        elif variant == "detached":
                            took, split, used = time_detached(lab, hosts, run_id,
                                                              tmp / "runs", port + i)
                        else:
                            took, split, used = time_launch(
                                lab, hosts, run_id, tmp / "runs", port + i,
                                workdir=workdir if variant == "script" else None,
                                cpu=args.cpu)
                        seconds[variant].append(took)
                        phases[variant].append(split)
                        if used is not None:
                            cpu[variant].append(used)
                row = {"hosts": hosts}
                for v in VARIANTS:
                    row[f"{v}_s"] = statistics.median(seconds[v])
                    row[f"{v}_samples"] = seconds[v]
                    row[f"{v}_phases"] = {m: statistics.median(p.get(m, 0.0) for p in phases[v])
                                          for m in MILESTONES if any(m in p for p in phases[v])}
                    if cpu[v]:
                        row[f"{v}_cpu"] = {k: statistics.median(c[k] for c in cpu[v])
                                           for k in CPU_ROWS}
                        row[f"{v}_cpu_total"] = statistics.median(sum(c.values())
                                                                  for c in cpu[v])
                row["ratio"] = row["launch_s"] / row["plain_s"]
                row["script_ratio"] = row["script_s"] / row["plain_s"]
                row["detached_vs_attached"] = row["detached_s"] / row["launch_s"]
                results.append(row)
                print(f"  {hosts} hosts: launch {row['launch_s']:.2f}s, your script "
                      f"{row['script_s']:.2f}s, plain {row['plain_s']:.2f}s, detached "
                      f"{row['detached_s']:.2f}s",
                      file=sys.stderr, flush=True)
        finally:
            lab.destroy()

    table = "\n".join([summary_table(results), "", phase_table(results),
                       *(["", cpu_table(results)] if args.cpu else [])])
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).with_suffix(".txt").write_text(table + "\n")
    Path(args.out).write_text(json.dumps({
        "what": "seconds from start to every rank past rendezvous (median of repeats); "
                "phases: seconds from one milestone (reached by the last host) to the next; "
                "cpu (--cpu): CPU seconds by kind of process (median of repeats)",
        "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repeats": args.repeats, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def summary_table(results: list[dict]) -> str:
    lines = [f"{'hosts':>5}  {'launch (s)':>10}  {'your script (s)':>15}  "
             f"{'plain ssh fan-out (s)':>21}  {'ratio':>6}  {'script ratio':>12}  "
             f"{'detached (s)':>12}  {'detached/attached':>17}"]
    for r in results:
        lines.append(f"{r['hosts']:>5}  {r['launch_s']:>10.2f}  {r['script_s']:>15.2f}  "
                     f"{r['plain_s']:>21.2f}  {r['ratio']:>6.2f}  {r['script_ratio']:>12.2f}  "
                     f"{r['detached_s']:>12.2f}  {r['detached_vs_attached']:>17.2f}")
    return "\n".join(lines)


def phase_table(results: list[dict]) -> str:
    """One column per host count and variant, one row per phase (median seconds)."""
    columns = [(r["hosts"], v, r[f"{v}_phases"]) for r in results for v in VARIANTS]
    head = f"{'phase (s, to the last host)':<28}" + "".join(
        f"{f'{h} {v}':>13}" for h, v, _ in columns)
    lines = [head]
    for m in MILESTONES:
        if not any(m in p for _, _, p in columns):
            continue
        lines.append(f"{m:<28}" + "".join(
            f"{p[m]:>13.2f}" if m in p else f"{'-':>13}" for _, _, p in columns))
    return "\n".join(lines)


def cpu_table(results: list[dict]) -> str:
    """One column per host count and variant, one row per kind of process (median CPU s)."""
    columns = [(r["hosts"], v, r.get(f"{v}_cpu", {}), r.get(f"{v}_cpu_total"))
               for r in results for v in VARIANTS]
    lines = [f"{'CPU (s) by kind':<28}" + "".join(f"{f'{h} {v}':>13}" for h, v, _, _ in columns)]
    for kind in CPU_ROWS:
        lines.append(f"{kind:<28}" + "".join(f"{c.get(kind, 0.0):>13.2f}"
                                             for _, _, c, _ in columns))
    lines.append(f"{'total':<28}" + "".join(f"{t or 0.0:>13.2f}" for _, _, _, t in columns))
    return "\n".join(lines)


# ---- the Slurm column -----------------------------------------------------------------------

# What people write by hand: one task per node, torchrun's own store on the first node (c10d
# finds it is the host by its hostname), the probe straight from the checkout (shared files).
HAND_SBATCH = """#!/bin/bash
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun {python} -m torch.distributed.run --nnodes {nodes} --nproc-per-node 1 \\
  --rdzv-backend c10d --rdzv-endpoint "$head:{port}" --rdzv-id "$SLURM_JOB_ID" \\
  {probe}
"""


def wait_idle(lab, timeout: float = 60.0) -> None:
    """Both variants start on idle nodes: never on the tail of the previous job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = lab.client(["sinfo", "--noheader", "--Node", "--format=%t"]).stdout.split()
        if out and all(state == "idle" for state in out):
            return
        time.sleep(0.1)
    raise RuntimeError("the Slurm lab's nodes did not become idle")


def time_launch_slurm(lab, nodes: int, run_id: str, runs_dir: Path,
                      port: int) -> tuple[float, float]:
    """(seconds to every rank past rendezvous, seconds launch took before the job was
    submitted: preflight, run folder, code copy, sbatch)."""
    from launcher.backends.slurm.backend import SlurmBackend

    quiet = PlainDisplay(open("/dev/null", "w"))  # noqa: SIM115
    backend = SlurmBackend({"python": sys.executable}, cwd=str(runs_dir.parent))
    started = time.time()
    run(backend, RunRequest(recipe_for(nodes), run_id, nodes, job=PROBE_JOB,
                            runs_dir=runs_dir.name, rdzv_port=port), display=quiet)
    logs = "".join(p.read_text() for p in (runs_dir / run_id).glob("*/node.log"))
    submitted = (runs_dir / run_id / "slurm.json").stat().st_mtime   # written after sbatch
    return last_rank_passed(logs, nodes) - started, submitted - started


def time_hand_sbatch(lab, nodes: int, run_id: str, runs_dir: Path, port: int) -> float:
    folder = runs_dir / run_id
    folder.mkdir(parents=True)
    script = folder / "hand.sbatch"
    script.write_text(HAND_SBATCH.format(
        python=shlex.quote(sys.executable), nodes=nodes, port=port,
        probe=shlex.quote(str(REPO / "launch_bench" / "rendezvous_probe.py"))))
    out = folder / "out.txt"
    started = time.time()
    proc = lab.client(["sbatch", "--wait", f"--nodes={nodes}", "--ntasks-per-node=1",
                       "--exclusive", f"--output={out}", str(script)], timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the hand-written job failed: {proc.stderr}\n{out.read_text()}")
    return last_rank_passed(out.read_text(), nodes) - started


def slurm_main(nodes: int, repeats: int) -> int:
    import platform

    from launcher.lab.slurm import SlurmLab

    launch_s, hand_s, submit_s = [], [], []
    with tempfile.TemporaryDirectory(prefix="launch-overhead-slurm-") as tmp:
        tmp = Path(tmp)
        lab = SlurmLab.create(tmp / "lab", nodes)
        os.environ.update(lab.env())   # launch's own Slurm commands find the lab
        try:
            port = 29800
            for rep in range(repeats):
                order = ["launch", "hand"] if rep % 2 == 0 else ["hand", "launch"]
                for variant in order:
                    port += 1
                    wait_idle(lab)
                    run_id = f"{variant}-{rep}"
                    if variant == "launch":
                        total, before = time_launch_slurm(lab, nodes, run_id, tmp / "runs",
                                                          port)
                        launch_s.append(total)
                        submit_s.append(before)
                    else:
                        hand_s.append(time_hand_sbatch(lab, nodes, run_id, tmp / "runs", port))
                print(f"  repeat {rep}: launch {launch_s[-1]:.2f}s, hand-written sbatch "
                      f"{hand_s[-1]:.2f}s", file=sys.stderr, flush=True)
        finally:
            lab.destroy()
    row = {"nodes": nodes, "launch_s": statistics.median(launch_s),
           "hand_sbatch_s": statistics.median(hand_s),
           "launch_before_sbatch_s": statistics.median(submit_s), "launch_samples": launch_s,
           "hand_samples": hand_s}
    row["ratio"] = row["launch_s"] / row["hand_sbatch_s"]
    # The machine's load drifts between repeats: each repeat's two runs, back to back, are
    # the fairer pair.
    row["paired_ratios"] = [round(a / b, 3) for a, b in zip(launch_s, hand_s)]
    row["median_paired_ratio"] = statistics.median(row["paired_ratios"])
    table = "\n".join([
        f"{'nodes':>5}  {'launch --slurm (s)':>18}  {'hand-written sbatch (s)':>23}  "
        f"{'ratio':>6}  {'paired ratio':>12}  {'launch before sbatch (s)':>24}",
        f"{nodes:>5}  {row['launch_s']:>18.2f}  {row['hand_sbatch_s']:>23.2f}  "
        f"{row['ratio']:>6.2f}  {row['median_paired_ratio']:>12.2f}  "
        f"{row['launch_before_sbatch_s']:>24.3f}"])
    print(table)
    results = REPO / "benchmarks/results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "launch_overhead_slurm.txt").write_text(table + "\n")
    (results / "launch_overhead_slurm.json").write_text(json.dumps({
        "what": "seconds from submitting to every rank past rendezvous (median of repeats; "
                "paired ratio: the median of each repeat's launch/hand ratio), on a Slurm lab "
                "(slurmctld + one slurmd per network namespace, all on one machine)",
        "machine": f"{platform.node()}: {os.cpu_count()} cores, shared with other work",
        "repeats": repeats, "results": [row]}, indent=2) + "\n")
    print(f"wrote {results / 'launch_overhead_slurm.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
