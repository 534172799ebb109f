"""Shipping a workdir to the nodes: launch (scan by content + ship over the nodes' open fabric
connections, launcher/workdir/sync.py) against `rsync -a` over OpenSSH, on a 2-host SSH lab,
for a 200 MB folder of 5,000 files (random bytes, sizes spread like a code folder with some
data: many small files, a few large ones).

Three cases, each to both hosts at once, into the node's copy that the previous case left
(launch keeps one per node and workdir, rsync updates its destination):
  first      nothing on the nodes yet (launch: also a cold local hash cache)
  unchanged  the same folder again
  one file   one file's content changed (same size, new mtime)

launch's time is the scan plus the ship on connections already open (launch's preflight
opens them before it ships); the connection time is shown apart. rsync's time is the whole
command, its SSH handshake included, as a user types it. The nodes' copies are written to
/dev/shm (both tools alike): on the shared disk of the machine this was built on, creating
the same 5,000 files took anywhere from 0.3 s to 3 s from one minute to the next, which
drowned the difference between the tools; --on-disk writes them to the disk instead. Needs root (the lab) and rsync (this
script installs it with apt when missing). Writes benchmarks/results/workdir_sync.json, .txt.

    flock /work/cpu.lock .venv/bin/python benchmarks/workdir_sync.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.cluster.ssh import SshOptions, connect  # noqa: E402
from launcher.lab.hosts import Lab  # noqa: E402
from launcher.workdir.scan import scan_workdir  # noqa: E402
from launcher.workdir.sync import ship_ssh  # noqa: E402

TOTAL_BYTES = 200 * 10**6
FILES = 5000
CASES = ("first", "unchanged", "one file")


def ensure_rsync() -> None:
    if shutil.which("rsync"):
        return
    subprocess.run(["bash", "-c", f"source {shlex.quote(str(REPO / 'scripts/bootstrap.sh'))} "
                                  "&& apt_install rsync"], check=True)
    if not shutil.which("rsync"):
        raise SystemExit("rsync is needed (apt-get install rsync)")


def build_folder(root: Path, files: int, total: int, seed: int = 0) -> list[Path]:
    """`files` files, `total` bytes in all, in 50 folders: log-normal sizes (the median a
    fifth of the mean, a long tail), scaled to the total."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 1.6) for _ in range(files)]
    scale = total / sum(weights)
    sizes = [max(1, int(w * scale)) for w in weights]
    sizes[-1] += total - sum(sizes)
    paths = []
    for i, size in enumerate(sizes):
        path = root / f"pkg{i % 50:02d}" / f"mod{i:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def rsync_both(lab: Lab, src: Path, dest: str) -> float:
    """rsync -a to every lab host at once, each into its own folder (the hosts share this
    machine's files: one folder for both would let the second skip what the first wrote)."""
    ssh = shlex.join(["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                      "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
    started = time.perf_counter()
    procs = [subprocess.Popen(["rsync", "-a", "-e", ssh, f"{src}/",
                               f"root@{h.address}:{dest}/{h.name}/"],
                              stdin=subprocess.DEVNULL) for h in lab.hosts]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("rsync failed")
    return time.perf_counter() - started


def launch_both(nodes, conns, src: Path, dest: str) -> tuple[float, float, list]:
    """(scan + ship seconds, scan seconds, per-node ShipStats), every node at once."""
    started = time.perf_counter()
    manifest = scan_workdir(src, limit_bytes=1 << 30)
    scanned = time.perf_counter() - started
    with ThreadPoolExecutor(len(conns)) as pool:
        stats = list(pool.map(lambda nc: ship_ssh(nc[1], manifest, f"{dest}/{nc[0].name}",
                                                  python=sys.executable, host=nc[0].name),
                              zip(nodes, conns)))
    return time.perf_counter() - started, scanned, stats


def count_files(folder: Path) -> int:
    """Files in the copy, launch's bookkeeping (.launch-*) aside."""
    return sum(sum(not f.startswith(".launch-") for f in files)
               for _, _, files in os.walk(folder))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=FILES)
    parser.add_argument("--mb", type=int, default=TOTAL_BYTES // 10**6)
    parser.add_argument("--on-disk", action="store_true",
                        help="the nodes' copies on this machine's disk, not in /dev/shm")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/workdir_sync.json"))
    args = parser.parse_args()
    ensure_rsync()
    load_before = os.getloadavg()
    samples: dict[str, dict[str, list]] = {c: {"launch": [], "scan": [], "rsync": [],
                                               "sent": []} for c in CASES}
    connect_s = []
    with tempfile.TemporaryDirectory(prefix="launch-workdir-sync-") as tmp:
        tmp = Path(tmp)
        src = tmp / "project"
        paths = build_folder(src, args.files, args.mb * 10**6)
        lab = Lab.create(tmp / "lab", 2)
        copies = Path(tempfile.mkdtemp(prefix="launch-workdir-sync-",
                                       dir=lab.dir if args.on_disk else "/dev/shm"))
        try:
            nodes = load_inventory(lab.inventory)
            for rep in range(args.repeats):
                os.environ["LAUNCH_HOME"] = str(tmp / f"home{rep}")   # a cold hash cache
                started = time.perf_counter()
                with ThreadPoolExecutor(2) as pool:
                    conns = list(pool.map(lambda n: connect(n, SshOptions()), nodes))
                connect_s.append(time.perf_counter() - started)
                dest = str(copies / f"copy{rep}")
                rsync_dest = str(copies / f"rsync{rep}")
                os.makedirs(rsync_dest)   # rsync makes only the last folder of its target
                changed = paths[rep * 7 % len(paths)]
                try:
                    for case in CASES:
                        if case == "one file":
                            data = bytearray(changed.read_bytes())
                            data[0] ^= 0xFF
                            changed.write_bytes(bytes(data))
                        # Alternate which goes first: neither always meets a warmer machine.
                        order = ("launch", "rsync") if rep % 2 == 0 else ("rsync", "launch")
                        for variant in order:
                            # Each starts with the disk quiet: the previous step's dirty pages
                            # (and the removals between repeats, which ext4 may discard
                            # lazily) written out first, outside the clock. Without this the
                            # variant that ran first in a repeat paid for the one before.
                            os.sync()
                            if variant == "rsync":
                                samples[case]["rsync"].append(
                                    rsync_both(lab, src, rsync_dest))
                            else:
                                total, scanned, stats = launch_both(nodes, conns, src, dest)
                                samples[case]["launch"].append(total)
                                samples[case]["scan"].append(scanned)
                                samples[case]["sent"].append(
                                    [s.files_sent for s in stats] + [s.bytes_sent for s in stats])
                        for where in [Path(d) / h.name for d in (dest, rsync_dest)
                                      for h in lab.hosts]:
                            if count_files(where) != len(paths):
                                raise RuntimeError(f"{where} holds {count_files(where)} files, "
                                                   f"not {len(paths)}")
                finally:
                    for c in conns:
                        c.close()
                print(f"  repeat {rep}: " + ", ".join(
                    f"{c} launch {samples[c]['launch'][-1]:.2f}s rsync "
                    f"{samples[c]['rsync'][-1]:.2f}s" for c in CASES), file=sys.stderr,
                    flush=True)
                # The copies stay until the end: removing 800 MB between repeats made
                # whichever tool went first in the next one pay for it (ext4 discards).
        finally:
            lab.destroy()
            shutil.rmtree(copies, ignore_errors=True)

    rows = []
    for case in CASES:
        s = samples[case]
        row = {"case": case, "launch_s": statistics.median(s["launch"]),
               "scan_s": statistics.median(s["scan"]), "rsync_s": statistics.median(s["rsync"]),
               "launch_samples": s["launch"], "rsync_samples": s["rsync"],
               "files_sent_per_node": s["sent"][-1][:2], "bytes_sent_per_node": s["sent"][-1][2:]}
        row["ratio"] = row["launch_s"] / row["rsync_s"]
        row["paired_ratios"] = [round(a / b, 3) for a, b in zip(s["launch"], s["rsync"])]
        rows.append(row)
    load_after = os.getloadavg()
    where_copies = "on this machine's disk" if args.on_disk else "in /dev/shm (tmpfs)"
    when = datetime.now().astimezone().isoformat(timespec="seconds")
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    lines = [f"{'case':<10}  {'launch (s)':>10}  {'of which scan':>13}  {'rsync -a (s)':>12}  "
             f"{'ratio':>6}  {'paired ratios':>20}  {'files sent/node':>15}"]
    for r in rows:
        lines.append(f"{r['case']:<10}  {r['launch_s']:>10.3f}  {r['scan_s']:>13.3f}  "
                     f"{r['rsync_s']:>12.3f}  {r['ratio']:>6.2f}  "
                     f"{' '.join(f'{x:.2f}' for x in r['paired_ratios']):>20}  "
                     f"{r['files_sent_per_node'][0]:>15}")
    lines += [
        "",
        f"{args.files} files, {args.mb} MB, to 2 lab hosts at once, the nodes' copies "
        f"{where_copies}; median of {args.repeats} repeats. launch: scan + ship on open "
        "connections (opening both "
        f"took {statistics.median(connect_s):.3f}s more, once per run, for preflight too); "
        "rsync: the whole command, SSH handshake included.",
        f"{when}, {platform.node()}: {os.cpu_count()} cores ({cpu}), load average "
        f"{load_before[0]:.2f} before and {load_after[0]:.2f} after (shared with other work)."]
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(table + "\n")
    out.write_text(json.dumps({
        "what": f"seconds to ship a {args.mb} MB / {args.files}-file folder to 2 SSH lab "
                "hosts at once: launch (scan + ship, connections open) vs rsync -a over "
                "OpenSSH (median of repeats; paired: each repeat's launch/rsync)",
        "date": when, "machine": f"{platform.node()}: {os.cpu_count()} cores ({cpu})",
        "load_average_before": load_before, "load_average_after": load_after,
        "copies_on": where_copies,
        "connect_s": connect_s, "repeats": args.repeats, "results": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
