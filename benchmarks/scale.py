"""Hundreds of hosts (issue 37): what launch costs per node as the fleet grows.

Lab part (`--lab`, needs root): on launch's own lab (SSH hosts in network namespaces,
launcher/lab/hosts.py), a `command:` job that prints, sleeps, and prints again, started by
`launch run -i` (the real CLI, a process of its own: its wall time, peak memory and CPU from
wait4) against a plain `ssh` fan-out of the same command to the same hosts, in one run, at
each host count (--hosts, default 8 32 64). With --cpu (default on), the CPU of every process
on the lab hosts by kind (benchmarks/launch_overhead.py's process accounting), per node: what
launch starts on each node beside the job.

Simulated fleet (`--fleet`): the launcher's own pipeline (launcher/execute/attempt.py: the
supervisor, the many-node screen, the line router, the timeline, the report) driven against N
stand-in nodes (benchmarks/standin.py: in-process, each node's lines as a real node prints
them, no Python or torch started), at --fleet-nodes (default 64 256 1024): the launcher's
time to "all started" (every node started and its first line seen), its peak memory, CPU
seconds and threads, per node.

Prints the tables and writes benchmarks/results/scale.json.

    flock /work/cpu.lock .venv/bin/python benchmarks/scale.py --lab --hosts 8 32
    .venv/bin/python benchmarks/scale.py --fleet --fleet-nodes 64 256 1024
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import launch_overhead as overhead  # noqa: E402  (its lab, its CPU meter)
from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "scale.json"


def job_line(sleep_s: float) -> str:
    return (f'echo "started on node $LAUNCH_NODE_RANK"; sleep {sleep_s:g}; '
            'echo "done on node $LAUNCH_NODE_RANK"')


# ---- the lab part --------------------------------------------------------------------------

def timed_child(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
                ) -> tuple[float, float, float, str, int]:
    """(wall s, CPU s, peak MB, output, peak threads) of one process to its end (wait4's
    rusage; its threads looked at every 0.2 s)."""
    import threading

    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    threads = [0]

    def look() -> None:
        while proc.returncode is None:
            try:
                text = Path(f"/proc/{proc.pid}/status").read_text()
                threads[0] = max(threads[0], int(text.split("Threads:")[1].split()[0]))
            except (OSError, IndexError, ValueError):
                return
            time.sleep(0.2)

    looker = threading.Thread(target=look, daemon=True)
    looker.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:6]} exited {proc.returncode}:\n"
                           f"{out.decode(errors='replace')[-3000:]}")
    looker.join()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, \
        out.decode(errors="replace"), threads[0]


def time_launch(lab: Lab, hosts: int, run_id: str, tmp: Path, sleep_s: float, cpu: bool
                ) -> dict:
    recipe = tmp / f"{run_id}.yml"
    recipe.write_text(json.dumps({"name": "scale", "nodes": hosts,
                                  "job": {"command": ["sh", "-c", job_line(sleep_s)]}}))
    env = {**os.environ, "LAUNCH_HOME": str(tmp / "launch-home"), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "launcher", "run", "-i", str(lab.inventory), str(recipe),
            "--nodes", str(hosts), "--run-id", run_id, "--runs-dir", str(tmp / "runs")]
    with overhead.measured_cpu(lab, cpu) as meter:
        wall, used, peak, out, threads = timed_child(argv, env, tmp)
    if f"run {run_id} succeeded" not in out:
        raise RuntimeError(f"launch did not run the job everywhere:\n{out[-3000:]}")
    # The run's own timeline (summary.json): which part grew when the ratio does.
    summary = json.loads((tmp / "runs" / run_id / "summary.json").read_text())
    phases = {p["name"]: p["s"] for p in (summary.get("timeline") or {}).get("phases") or []}
    return {"wall_s": wall, "cpu_s": used, "peak_mb": peak, "threads": threads,
            "nodes_cpu": meter and meter.seconds, "phases": phases}


def time_plain(lab: Lab, hosts: int, sleep_s: float, cpu: bool) -> dict:
    """What people script by hand: the same command per host over ssh, all at once."""
    nodes = load_inventory(lab.inventory)[:hosts]
    ssh = ["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    with overhead.measured_cpu(lab, cpu) as meter:
        start = time.monotonic()
        procs = [subprocess.Popen(
            [*ssh, f"root@{node.address}",
             shlex.join(["env", f"LAUNCH_NODE_RANK={rank}", "sh", "-c", job_line(sleep_s)])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            for rank, node in enumerate(nodes)]
        out = b"".join(p.communicate(timeout=600)[0] for p in procs).decode(errors="replace")
        wall = time.monotonic() - start
    if out.count("done on node") != hosts:
        raise RuntimeError(f"the plain fan-out did not run everywhere:\n{out[-3000:]}")
    return {"wall_s": wall, "nodes_cpu": meter and meter.seconds}


def lab_part(host_counts: list[int], sleep_s: float, cpu: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="launch-scale-") as tmp:
        tmp = Path(tmp)
        built = time.monotonic()
        lab = Lab.create(tmp / "lab", max(host_counts))
        print(f"  lab of {max(host_counts)} hosts built in {time.monotonic() - built:.0f} s",
              file=sys.stderr, flush=True)
        try:
            for hosts in host_counts:
                plain = time_plain(lab, hosts, sleep_s, cpu)
                launch = time_launch(lab, hosts, f"scale-{hosts}", tmp, sleep_s, cpu)
                row = {"hosts": hosts, "plain_s": plain["wall_s"], "launch_s": launch["wall_s"],
                       "ratio": launch["wall_s"] / plain["wall_s"],
                       "launch_peak_mb": launch["peak_mb"], "launch_cpu_s": launch["cpu_s"],
                       "launch_threads": launch["threads"], "phases": launch["phases"],
                       "load": os.getloadavg()}
                if cpu:
                    on_nodes = [k for k in overhead.CPU_ROWS if k not in overhead.HERE]
                    row["node_cpu_per_node"] = {
                        "launch": {k: launch["nodes_cpu"][k] / hosts for k in on_nodes},
                        "plain": {k: plain["nodes_cpu"][k] / hosts for k in on_nodes}}
                rows.append(row)
                print(f"  {hosts} hosts: plain {row['plain_s']:.1f} s, launch "
                      f"{row['launch_s']:.1f} s ({row['ratio']:.2f}x)", file=sys.stderr,
                      flush=True)
        finally:
            lab.destroy()
    return rows


def lab_table(rows: list[dict]) -> str:
    lines = ["| hosts | plain ssh fan-out | launch | ratio | launch's peak memory, CPU, threads "
             "| load |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['hosts']} | {r['plain_s']:.1f} s | {r['launch_s']:.1f} s | "
                     f"{r['ratio']:.2f}x | {r['launch_peak_mb']:.0f} MB, "
                     f"{r['launch_cpu_s']:.1f} s, {r['launch_threads']} | "
                     f"{r['load'][0]:.1f} |")
    if rows and "node_cpu_per_node" in rows[0]:
        kinds = list(rows[0]["node_cpu_per_node"]["launch"])
        lines += ["", "CPU s per node on the hosts, by kind (launch / plain):", "",
                  "| kind | " + " | ".join(f"{r['hosts']} hosts" for r in rows) + " |",
                  "| --- |" + " --- |" * len(rows)]
        for kind in kinds:
            lines.append(f"| {kind} | " + " | ".join(
                f"{r['node_cpu_per_node']['launch'][kind]:.3f} / "
                f"{r['node_cpu_per_node']['plain'][kind]:.3f}" for r in rows) + " |")
        lines.append("| total | " + " | ".join(
            f"{sum(r['node_cpu_per_node']['launch'].values()):.3f} / "
            f"{sum(r['node_cpu_per_node']['plain'].values()):.3f}" for r in rows) + " |")
    if rows and any(r.get("phases") for r in rows):
        names = list(dict.fromkeys(n for r in rows for n in r.get("phases") or {}))
        lines += ["", "launch's timeline (summary.json), s:", "",
                  "| phase | " + " | ".join(f"{r['hosts']} hosts" for r in rows) + " |",
                  "| --- |" + " --- |" * len(rows)]
        for name in names:
            lines.append(f"| {name} | " + " | ".join(
                f"{(r.get('phases') or {}).get(name, 0):.2f}" for r in rows) + " |")
    return "\n".join(lines)


# ---- the simulated fleet -------------------------------------------------------------------

def vm(field: str) -> float:
    """A /proc/self/status figure in MB (VmHWM: peak resident memory; VmRSS: now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def fleet_one(nodes: int, ranks: int, steps: int, step_s: float) -> dict:
    """One run of the pipeline against `nodes` stand-ins, in this process (the caller starts
    a fresh one per size, so that memory and threads are this size's alone)."""
    import contextlib
    import resource
    import threading

    from standin import Script, StandinBackend

    from launcher.job.recipe import recipe_from_mapping
    from launcher.job.request import RunRequest
    from launcher.pipeline.run import run_here
    from launcher.report.display import PlainDisplay

    recipe = recipe_from_mapping({"name": "fleet", "nodes": nodes,
                                  "job": {"command": ["torchrun", "train.py"]}},
                                 "benchmarks/scale.py")
    script = Script(ranks=ranks, steps=steps, step_s=step_s)
    backend = StandinBackend(nodes, script)
    peak_threads = [threading.active_count()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak_threads[0] = max(peak_threads[0], threading.active_count())

    with tempfile.TemporaryDirectory(prefix="launch-fleet-") as tmp, \
            open(os.devnull, "w") as null:
        request = RunRequest(recipe, f"fleet-{nodes}", nodes, runs_dir=tmp)
        threads_before, rss_before = threading.active_count(), vm("VmRSS")
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        with contextlib.redirect_stdout(null):
            summary = run_here(backend, request, display=PlainDisplay(null))
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        done.set()
        sampler.join()
        named = {n["name"] for n in summary["nodes"]}
    if summary["status"] != "succeeded" or len(named) != nodes or \
            len(script.first_seen) != nodes:
        raise RuntimeError(f"the stand-in run of {nodes} nodes did not end as it should: "
                           f"{summary['status']}, {len(script.first_seen)} seen")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"nodes": nodes, "ranks_per_node": ranks, "steps": steps, "step_s": step_s,
            "all_started_s": max(script.first_seen.values()) - start,
            "wall_s": wall, "job_s": steps * step_s,
            "cpu_s": cpu, "cpu_ms_per_node": 1000 * cpu / nodes,
            "peak_mb": vm("VmHWM"), "rss_before_mb": rss_before,
            "mb_per_node": (vm("VmHWM") - rss_before) / nodes,
            "threads_before": threads_before, "peak_threads": peak_threads[0],
            "threads_per_node": (peak_threads[0] - threads_before) / nodes}


def fleet_part(sizes: list[int], ranks: int, steps: int, step_s: float) -> list[dict]:
    rows = []
    for nodes in sizes:
        proc = subprocess.run(
            [sys.executable, __file__, "--fleet-one", str(nodes), "--ranks", str(ranks),
             "--steps", str(steps), "--step-s", str(step_s)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        if proc.returncode != 0:
            raise RuntimeError(f"the fleet of {nodes} failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"  {nodes} stand-in nodes: all started {r['all_started_s']:.2f} s, peak "
              f"{r['peak_mb']:.0f} MB, CPU {r['cpu_s']:.1f} s", file=sys.stderr, flush=True)
    return rows


def fleet_table(rows: list[dict]) -> str:
    lines = ["| stand-in nodes (ranks) | all started | wall (job) | launcher CPU | CPU per node "
             "| peak memory | memory per node | threads (peak) | threads per node |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['nodes']} ({r['nodes'] * r['ranks_per_node']}) | {r['all_started_s']:.2f} s "
            f"| {r['wall_s']:.1f} s ({r['job_s']:.0f} s) | {r['cpu_s']:.1f} s | "
            f"{r['cpu_ms_per_node']:.1f} ms | {r['peak_mb']:.0f} MB | "
            f"{1024 * r['mb_per_node']:.0f} KB | {r['peak_threads']} | "
            f"{r['threads_per_node']:.2f} |")
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", action="store_true", help="the lab part (needs root)")
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--sleep", type=float, default=20.0,
                        help="seconds the job sleeps between its two lines")
    parser.add_argument("--no-cpu", dest="cpu", action="store_false",
                        help="leave out the CPU by kind on the hosts")
    parser.add_argument("--fleet", action="store_true", help="the simulated fleet")
    parser.add_argument("--fleet-nodes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--ranks", type=int, default=8, help="ranks per stand-in node")
    parser.add_argument("--steps", type=int, default=5, help="steps of the stand-in job")
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds per stand-in step")
    parser.add_argument("--fleet-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if args.fleet_one:
        print(json.dumps(fleet_one(args.fleet_one, args.ranks, args.steps, args.step_s)))
        return 0
    if not (args.lab or args.fleet):
        args.lab = args.fleet = True
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    tables = []
    stamp = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "load_before": os.getloadavg(), "cpus": os.cpu_count()}
    if args.lab:
        rows = lab_part(args.hosts, args.sleep, args.cpu)
        result["lab"] = {**stamp, "sleep_s": args.sleep, "rows": rows}
        tables.append(lab_table(rows))
    if args.fleet:
        rows = fleet_part(args.fleet_nodes, args.ranks, args.steps, args.step_s)
        result["fleet"] = {**stamp, "rows": rows}
        tables.append(fleet_table(rows))
    text = "\n\n".join(tables)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
