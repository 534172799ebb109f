"""Launch overhead on a lab cluster: time from starting a run to every rank having passed
rendezvous, `launch` (preflight, ship code, start over fabric, stream) against a plain
`ssh host torchrun ...` fan-out started in parallel, on 2, 4 and 8 hosts.

Needs root (it builds a lab of SSH hosts in network namespaces). Prints a table and writes
benchmarks/results/launch_overhead.json.

    .venv/bin/python benchmarks/launch_overhead.py [--hosts 2 4 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.backends import LaunchOptions  # noqa: E402
from launcher.backends.ssh import SshBackend, plan_inventory  # noqa: E402
from launcher.display import PlainDisplay  # noqa: E402
from launcher.inventory import load_inventory  # noqa: E402
from launcher.lab import Lab  # noqa: E402
from launcher.recipe import recipe_from_mapping  # noqa: E402
from launcher.ssh import SshOptions  # noqa: E402

PASSED = re.compile(r"rendezvous-passed rank=(\d+) world=(\d+) t=([0-9.]+)")


def probe_program(place):
    return [f"{place.code_dir}/train/rendezvous_probe.py"]


def recipe_for(hosts: int):
    return recipe_from_mapping({"name": "overhead", "nodes": hosts,
                                "rendezvous": {"timeout": 300},
                                "train": {"steps": 1}}, "benchmarks/launch_overhead.py")


def last_rank_passed(text: str, world: int) -> float:
    times = {int(m[1]): float(m[3]) for m in PASSED.finditer(text)}
    if len(times) != world:
        raise RuntimeError(f"only {len(times)} of {world} ranks passed rendezvous:\n{text[-2000:]}")
    return max(times.values())


def time_launch(lab: Lab, hosts: int, run_id: str, runs_dir: Path, port: int) -> float:
    nodes = load_inventory(lab.inventory)[:hosts]
    started = time.time()
    # The benchmark prints its own table; the runs' lines go nowhere.
    quiet = PlainDisplay(open("/dev/null", "w"))  # noqa: SIM115
    SshBackend(lab.inventory, SshOptions()).launch(
        recipe_for(hosts), nodes, run_id, LaunchOptions(str(runs_dir), display=quiet),
        rdzv_port=port, program=probe_program)
    logs = "".join(p.read_text() for p in (runs_dir / run_id).glob("*/node.log"))
    return last_rank_passed(logs, hosts) - started


def time_plain_fanout(lab: Lab, hosts: int, run_id: str, port: int) -> float:
    """What people script by hand: the same torchrun line per host, over ssh, all at once,
    with the code already in place (copied before the clock starts)."""
    nodes = load_inventory(lab.inventory)[:hosts]
    plan = plan_inventory(recipe_for(hosts), nodes, run_id, rdzv_port=port,
                          program=probe_program)
    for cmd in plan.nodes:
        code = Path(cmd.cwd) / "code" / "train"
        code.mkdir(parents=True, exist_ok=True)
        (code / "rendezvous_probe.py").write_bytes(
            (REPO / "train" / "rendezvous_probe.py").read_bytes())
    ssh = ["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    started = time.time()
    procs = []
    for cmd, node in zip(plan.nodes, nodes):
        env = [f"{k}={v}" for k, v in cmd.env.items()]
        # By hand the head's agent hosts the rendezvous store (c10d's default), where launch
        # runs it as a process of its own.
        argv = [a.replace("is_host=0", "is_host=1") if cmd.is_head else a for a in cmd.argv]
        line = shlex.join(["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cmd.cwd, "env",
                           *env, *argv])
        procs.append(subprocess.Popen([*ssh, f"root@{node.address}", line], text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = "".join(p.communicate(timeout=600)[0] for p in procs)
    return last_rank_passed(out, hosts) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/launch_overhead.json"))
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="launch-overhead-") as tmp:
        tmp = Path(tmp)
        lab = Lab.create(tmp / "lab", max(args.hosts))
        try:
            port = 29700
            for hosts in args.hosts:
                launch_s, plain_s = [], []
                for rep in range(args.repeats):
                    port += 2
                    # Alternate the order so neither variant always runs on a warmer cache.
                    order = ["launch", "plain"] if rep % 2 == 0 else ["plain", "launch"]
                    for variant in order:
                        run_id = f"{variant}-{hosts}-{rep}"
                        if variant == "launch":
                            launch_s.append(time_launch(lab, hosts, run_id, tmp / "runs", port))
                        else:
                            plain_s.append(time_plain_fanout(lab, hosts, run_id, port + 1))
                row = {"hosts": hosts, "launch_s": statistics.median(launch_s),
                       "plain_fanout_s": statistics.median(plain_s),
                       "launch_samples": launch_s, "plain_samples": plain_s}
                row["ratio"] = row["launch_s"] / row["plain_fanout_s"]
                results.append(row)
                print(f"  {hosts} hosts: launch {row['launch_s']:.2f}s, plain "
                      f"{row['plain_fanout_s']:.2f}s", file=sys.stderr, flush=True)
        finally:
            lab.destroy()

    print(f"{'hosts':>5}  {'launch (s)':>10}  {'plain ssh fan-out (s)':>21}  {'ratio':>6}")
    for r in results:
        print(f"{r['hosts']:>5}  {r['launch_s']:>10.2f}  {r['plain_fanout_s']:>21.2f}  "
              f"{r['ratio']:>6.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "what": "seconds from start to every rank past rendezvous (median of repeats)",
        "repeats": args.repeats, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
