"""What reading an inventory costs every `-i` command (issue 37), and what keeping Ansible's
answer (launcher/cluster/inventory_cache.py) saves.

Two inventories made in a temporary folder: 4 hosts in INI (a host range, a group of groups,
[group:vars], group_vars/) and 256 hosts in YAML (groups and children, all.vars, group_vars/,
a few host_vars/ files). For each, `load_inventory` (launcher/cluster/inventory.py, what `launch
run/check/bench/setup/attach -i` call) in three variants, round-robin so that the shared
machine's noise weighs on each alike:

- ansible: LAUNCH_INVENTORY_CACHE=0, Ansible's loader in a child process every time (before);
- first:   the cache on and its entry removed: a first run, or the first after an edit;
- kept:    the cache on and its entry there: every later run.

Then where the loader's time goes, measured the same way: a bare Python start, a Python that
imports Ansible's inventory and vars managers, the whole child (`python -m
launcher.cluster.ansible_inventory PATH all`: start, import, parsing and every host's
variables), launch's bounds check of the files (inventory_files.py, in this process) and the
cache's key (hashing every file Ansible reads, in this process). With --cli, also `launch run
--dry-run -i` as a user types it, the cache off against on (a fresh process each time).

Prints the tables and writes benchmarks/results/inventory_load.json.

    .venv/bin/python benchmarks/inventory_load.py --repeat 5
    .venv/bin/python benchmarks/inventory_load.py --repeat 3 --cli
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from launcher.cluster.inventory import load_inventory  # noqa: E402
from launcher.cluster.inventory_cache import CACHE_ENV, FOLDER, inventory_key  # noqa: E402
from launcher.cluster.inventory_files import check_inventory_files  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "inventory_load.json"
VARIANTS = ("ansible", "first", "kept")
PARTS = ("python start", "python + import ansible", "loader child (whole)", "bounds check",
         "cache key")
IMPORT_ANSIBLE = ("import ansible.inventory.manager, ansible.vars.manager, "
                  "ansible.parsing.dataloader")
RECIPE = "name: t\ntrain: {dataset: digits, image_size: 8, patch_size: 4, steps: 2}\n"


def small_ini(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "hosts.ini").write_text(
        "[trainers]\nnode[01:04] gpus=8\n\n[gpu:children]\ntrainers\n\n"
        "[trainers:vars]\nansible_user=ubuntu\n")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "gpu.yml").write_text("launch_python: /opt/venv/bin/python\n"
                                                   "instance_type: p4d.24xlarge\n")
    return folder / "hosts.ini"


def large_yaml(folder: Path, hosts: int = 256) -> Path:
    import yaml

    folder.mkdir(parents=True)
    racks = {f"rack{r}": {"hosts": {
        f"gpu-{i:03d}": {"ansible_host": f"10.0.{i // 256}.{i % 256}",
                         "private_ip": f"172.16.{i // 256}.{i % 256}"}
        for i in range(r * 32, min(hosts, (r + 1) * 32))}} for r in range((hosts + 31) // 32)}
    doc = {"all": {"vars": {"ansible_user": "ubuntu"},
                   "children": {"gpu": {"vars": {"gpus": 8}, "children": racks}}}}
    (folder / "inventory.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "all.yml").write_text("launch_python: /opt/venv/bin/python\n")
    (folder / "group_vars" / "gpu.yml").write_text("instance_type: p4d.24xlarge\n")
    (folder / "host_vars").mkdir()
    for i in range(0, hosts, 64):
        (folder / "host_vars" / f"gpu-{i:03d}.yml").write_text("launch_interface: ens32\n")
    return folder / "inventory.yml"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child(*argv: str) -> None:
    subprocess.run([sys.executable, *argv], check=True, stdout=subprocess.DEVNULL,
                   stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})


def load_variant(variant: str, path: Path, home: Path) -> int:
    os.environ[CACHE_ENV] = "0" if variant == "ansible" else "1"
    if variant == "first":
        shutil.rmtree(home / FOLDER, ignore_errors=True)
    return len(load_inventory(path, warn=lambda _: None))


def measure(name: str, path: Path, home: Path, repeat: int) -> dict:
    print(f"  {name}: loads", file=sys.stderr, flush=True)
    load_variant("first", path, home)   # an entry for the first "kept"
    loads: dict[str, list[float]] = {v: [] for v in VARIANTS}
    hosts = 0
    for _ in range(repeat):
        for variant in VARIANTS:
            start = time.perf_counter()
            hosts = load_variant(variant, path, home)
            loads[variant].append(time.perf_counter() - start)
    print(f"  {name}: parts", file=sys.stderr, flush=True)
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    for _ in range(repeat):
        parts["python start"].append(timed(lambda: child("-c", "pass")))
        parts["python + import ansible"].append(timed(lambda: child("-c", IMPORT_ANSIBLE)))
        parts["loader child (whole)"].append(timed(lambda: child(
            "-m", "launcher.cluster.ansible_inventory", str(path), "all")))
        parts["bounds check"].append(timed(lambda: check_inventory_files(path)))
        parts["cache key"].append(timed(lambda: inventory_key(str(path), "all")))
    return {"inventory": name, "hosts": hosts,
            "loads_s": loads, "parts_s": parts,
            "median_s": {k: statistics.median(v) for k, v in {**loads, **parts}.items()}}


def cli_rows(path: Path, folder: Path, home: Path, repeat: int) -> dict:
    """`launch run --dry-run -i` as a user types it: a fresh process, the cache off or on."""
    (folder / "recipe.yml").write_text(RECIPE)
    argv = [sys.executable, "-m", "launcher", "run", "recipe.yml", "-i", str(path), "--nodes",
            "1", "--dry-run"]
    times: dict[str, list[float]] = {"off": [], "on": []}
    for setting in ("on",) + ("off", "on") * repeat:   # the first "on" fills the cache
        env = {**os.environ, "PYTHONPATH": str(REPO), "LAUNCH_HOME": str(home),
               CACHE_ENV: "1" if setting == "on" else "0"}
        start = time.perf_counter()
        subprocess.run(argv, cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        times[setting].append(time.perf_counter() - start)
    times["on"] = times["on"][1:]
    return {"runs_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()}}


def tables(rows: list[dict], cli: dict | None) -> str:
    out = ["load_inventory, median s (ratio to ansible)",
           f"{'inventory':<28}{'hosts':>6}" + "".join(f"{v:>20}" for v in VARIANTS)]
    for row in rows:
        base = row["median_s"]["ansible"]
        cells = "".join(f"{row['median_s'][v]:>11.4f} ({row['median_s'][v] / base:5.3f}x)"
                        for v in VARIANTS)
        out.append(f"{row['inventory']:<28}{row['hosts']:>6}{cells}")
    out += ["", "where the loader's time goes, median s",
            f"{'part':<28}" + "".join(f"{row['inventory'][:18]:>20}" for row in rows)]
    for part in PARTS:
        out.append(f"{part:<28}" + "".join(f"{row['median_s'][part]:>20.4f}" for row in rows))
    if cli:
        for name, result in cli.items():
            off, on = result["median_s"]["off"], result["median_s"]["on"]
            out += ["", f"`launch run --dry-run -i` ({name}), median s: cache off {off:.2f}, "
                        f"on {on:.2f} ({on / off:.2f}x)"]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="also `launch run --dry-run -i`")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    stamp = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "load_before": os.getloadavg(), "cpus": os.cpu_count(), "repeat": args.repeat}
    with tempfile.TemporaryDirectory(prefix="inventory-load-") as tmp:
        folder = Path(tmp)
        home = folder / "home"
        os.environ["LAUNCH_HOME"] = str(home)
        inventories = {"4 hosts, INI": small_ini(folder / "small"),
                       "256 hosts, YAML": large_yaml(folder / "large")}
        rows = [measure(name, path, home, args.repeat) for name, path in inventories.items()]
        cli = None
        if args.cli:
            cli = {name: cli_rows(path, path.parent, folder / "cli-home", args.repeat)
                   for name, path in inventories.items()}
    stamp["load_after"] = os.getloadavg()
    text = tables(rows, cli)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**stamp, "rows": rows, "cli": cli}, indent=2) + "\n")
    out.with_suffix(".txt").write_text(text + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
