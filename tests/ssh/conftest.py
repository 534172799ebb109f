from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from launcher.lab.hosts import Lab
from tests.run.conftest import run_pids
from launch_node import mirror
from launch_node.mirror import FolderStore


def run_env_pids(lab: Lab, host: str, run_id: str) -> list[int]:
    """Processes on a lab host (its network namespace) that belong to the run."""
    on_host = set(lab.pids(host))
    return [pid for pid in run_pids(run_id, this_worker=False) if pid in on_host]


def only_sshd_left(lab: Lab) -> dict[str, list[str]]:
    """What runs on each host besides its sshd: must be nothing after a run ends. A process
    that has exited and waits for its parent to reap it (a zombie: sshd's session process,
    for a moment after the connection's end reaches it; seen once with an empty command line
    in the full suite) runs nothing and is not counted."""
    leftovers = {}
    for host in lab.hosts:
        others = []
        for pid in lab.pids(host.name):
            if pid == host.sshd_pid:
                continue
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if state != "Z":
                others.append(cmdline.replace(b"\0", b" ").decode(errors="replace")
                              or f"[pid {pid}, state {state}]")
        if others:
            leftovers[host.name] = others
    return leftovers


def lab_worker_pid(lab: Lab, host: str, run_id: str) -> int | None:
    for pid in run_env_pids(lab, host, run_id):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"torch.distributed.run" not in args and any(a.endswith(b"train/main.py") for a in args):
            return pid
    return None


def edit_inventory(lab: Lab, directory: Path, **host_changes) -> Path:
    """A copy of the lab inventory with per-host variables changed (host=dict)."""
    data = yaml.safe_load(lab.inventory.read_text())
    for host, changes in host_changes.items():
        data["all"]["hosts"][host].update(changes)
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_venv_without_torch(directory: Path) -> str:
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(directory)], check=True)
    return str(directory / "bin" / "python")


def new_key(directory: Path) -> str:
    key = directory / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return str(key)


def remote_run_dirs(lab: Lab, run_id: str) -> list[str]:
    """The run's folders on the hosts (<run_root>/<run_id>.<uid>)."""
    root = lab.dir / "node-runs"
    return sorted(p.name for p in root.glob(f"{run_id}.*")) if root.exists() else []


def mirrored(dest_root, run_id: str) -> dict:
    """The run's mirror (its folder is <mirror>/<run_id>.<uid>)."""
    found = list(dest_root.glob(f"{run_id}.*"))
    return mirror.complete_units(FolderStore(str(found[0]))) if found else {}


def newest_step(dest_root, run_id: str) -> int:
    units = mirrored(dest_root, run_id)
    return max((int(m["order"]) for m in units.values()), default=0)
