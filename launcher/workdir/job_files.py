"""What a run wrote in its nodes' job folders (launch_node/job_folder.py), brought to this
machine: `launch fetch RUN --workdir` puts each node's into <run folder>/workdir/<node>/.

Only what the run wrote comes back, not the shipped files beside it (those are the user's
own, here already): a file that was not in the job's view when it was made, or that no longer
is what was put there (launch_node/job_folder.py run_files). Where the job folders are on a
disk this machine reads (`--local`, a Slurm cluster's shared filesystem) they are read here;
over SSH the backend lists them with the node's own interpreter and copies them over SFTP
(launcher/backends/ssh/job_files.py). Either way the files are written with no link followed
and nothing outside the node's folder here (launcher/core/safefile.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch_node.job_folder import JobFolderError, open_run_file, run_files
from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.names import component_problem, shown
from launcher.workdir.scan import human_bytes

FOLDER = "workdir"
# How each node's list was told, for people (launch_node/job_folder.py run_files's `how`).
HOW = {"record": "files not shipped, or changed since",
       "links": "files with one link (a view made before launch kept a record of it: a "
                "shipped file rewritten in place is missed)"}


@dataclass(frozen=True)
class Target:
    """A node's job folder, as the run's plan.json names it."""

    node: str
    job_dir: str
    probe: tuple[str, ...] = ()      # launch_node/node_probe.py with the node's interpreter


@dataclass
class NodeFiles:
    """One node's answer: what the run wrote there (path, size), and how many were copied
    here; `error` when the folder could not be read."""

    node: str
    job_dir: str
    files: list[tuple[str, int]] = field(default_factory=list)
    how: str = "record"
    copied: int = 0
    skipped: list[str] = field(default_factory=list)   # listed, then gone or unwritable here
    error: str | None = None

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)


def targets(plan: dict[str, Any], source: Any = "plan.json") -> list[Target]:
    """The job folders plan.json (`source`) names, one per node (none for a run whose job ran
    in the node's folder: launch's own workloads, a run without a workdir). A node's name
    becomes a folder here: one that cannot is refused, naming the file."""
    out = []
    for node in plan.get("nodes") or []:
        if isinstance(node, dict) and isinstance(node.get("job_dir"), str) \
                and isinstance(node.get("name"), str):
            why = component_problem(node["name"])
            if why:
                raise LauncherError(f"{source}: node {shown(node['name'])} cannot name a "
                                    f"folder: {why}")
            out.append(Target(node["name"], node["job_dir"],
                              tuple(str(a) for a in node.get("probe") or ())))
    return out


def checked(files: Any, where: str) -> list[tuple[str, int]]:
    """A node's list as the node sent it, each path one that stays inside the node's folder
    here: relative, no empty, `.` or `..` part (a node answers what its files are called; this
    machine decides where they may go)."""
    out = []
    for entry in files if isinstance(files, list) else []:
        if not (isinstance(entry, list | tuple) and len(entry) == 2
                and isinstance(entry[0], str) and isinstance(entry[1], int)):
            raise JobFolderError(f"{where}: not a list of files ({str(entry)[:80]})")
        rel, size = entry
        if rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")) \
                or "\0" in rel:
            raise JobFolderError(f"{where}: {rel[:120]!r} is not a path inside a job folder")
        out.append((rel, size))
    return out


def list_here(target: Target) -> NodeFiles:
    """A node's job folder on a disk this machine reads."""
    try:
        files, how = run_files(target.job_dir)
    except JobFolderError as err:
        return NodeFiles(target.node, target.job_dir, error=str(err))
    return NodeFiles(target.node, target.job_dir, files, how)


def copy_here(found: NodeFiles, dest: Path, within: Path) -> NodeFiles:
    """The files `found` lists, read from the job folder on this machine's disk into
    dest/<path>; one that vanished or became something else since it was listed is skipped."""
    for rel, _size in found.files:
        try:
            fd = open_run_file(found.job_dir, rel)
        except (OSError, JobFolderError) as err:
            found.skipped.append(f"{rel}: {err}")
            continue
        try:
            with os.fdopen(fd, "rb") as source:
                safefile.write_with(dest / rel, lambda out: _pump(source, out), within=within)
        except (OSError, LauncherError) as err:
            found.skipped.append(f"{rel}: {err}")
            continue
        found.copied += 1
    return found


def _pump(source, out) -> None:
    while chunk := source.read(1 << 20):
        out.write(chunk)


def describe(found: NodeFiles) -> str:
    """One line for a node's answer."""
    if found.error:
        return f"{found.node}: {found.error}"
    return (f"{found.node}: {len(found.files)} file(s), {human_bytes(found.size)} written by the "
            f"run in {found.job_dir}")


def fetch_here(found_targets: list[Target], dest: Path, dry_run: bool = False
               ) -> list[NodeFiles]:
    """Every target's job folder read on this machine's disk (the nodes' files are here:
    `--local`, a Slurm cluster's shared filesystem) into dest/<node>/."""
    out = []
    for target in found_targets:
        found = list_here(target)
        if not dry_run and found.error is None:
            copy_here(found, dest / target.node, within=dest)
        out.append(found)
    return out
