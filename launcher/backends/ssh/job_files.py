"""What a run wrote in its job folders on SSH hosts, copied here (`launch fetch RUN --workdir`,
launcher/workdir/job_files.py): each host lists its folder with its own interpreter and
launch_node/job_folder.py, sent on the command's stdin (the run's code on the node may be gone
by now; the module is the standard library only), then each listed file comes over SFTP.
At most --fanout hosts at a time."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import launch_node.job_folder as job_folder_module
from launcher.cluster.inventory import Node
from launcher.cluster.ssh import connect, remote, run_with_input
from launcher.core import safefile
from launcher.core.errors import LauncherError
from launcher.core.node_code import code_root
from launcher.execute.backend import in_parallel
from launcher.workdir.job_files import NodeFiles, Target, checked

ANSWER = "launch-job-files:"
# The listing, as the node runs it: the module, then the one call.
_LISTER = None
LIMIT = 64 << 20   # a listing of ~500,000 files; more ends the command (a node's bound)


def lister() -> bytes:
    global _LISTER
    if _LISTER is None:
        source = (code_root() / "launch_node" / "job_folder.py").read_text()
        _LISTER = (source + f"""

import json as _json, sys as _sys
try:
    _files, _how = run_files(_sys.argv[1])
    _answer = {{"files": _files, "how": _how}}
except JobFolderError as _err:
    _answer = {{"error": str(_err)}}
print({ANSWER!r} + _json.dumps(_answer))
""").encode()
    return _LISTER


def fetch_job_files(backend, targets: list[Target], dest: Path,
                    dry_run: bool = False) -> list[NodeFiles]:
    hosts = {n.name: n for n in backend.nodes(None)}

    def one(target: Target) -> NodeFiles:
        node = hosts.get(target.node)
        if node is None:
            return NodeFiles(target.node, target.job_dir,
                             error=f"not a host of {backend.inventory or 'the inventory'}: "
                                   "name the inventory the run used (-i INVENTORY)")
        return _one(backend, node, target, dest, dry_run)

    answers = in_parallel(one, targets, max_workers=backend.fanout)
    return [a if isinstance(a, NodeFiles) else NodeFiles(t.node, t.job_dir, error=str(a))
            for t, a in answers.items()]


def _one(backend, node: Node, target: Target, dest: Path, dry_run: bool) -> NodeFiles:
    python = target.probe[0] if target.probe else node.python
    try:
        conn = connect(node, backend.options)
    except LauncherError as err:
        return NodeFiles(target.node, target.job_dir, error=str(err))
    try:
        status, output = run_with_input(conn, remote(python, "-S", "-", target.job_dir),
                                        lister(), timeout=300, limit=LIMIT)
        answer = next((line[len(ANSWER):] for line in reversed(output.splitlines())
                       if line.startswith(ANSWER)), None)
        if status != 0 or answer is None:
            tail = output.strip().splitlines()[-1:] or ["no output"]
            return NodeFiles(target.node, target.job_dir,
                             error=f"listing its job folder with {python} exited {status}: "
                                   f"{tail[0][:300]}")
        doc = json.loads(answer)
        if doc.get("error"):
            return NodeFiles(target.node, target.job_dir, error=str(doc["error"]))
        found = NodeFiles(target.node, target.job_dir,
                          checked(doc.get("files"), f"{node.name}: {target.job_dir}"),
                          str(doc.get("how") or "record"))
        if dry_run:
            return found
        # SFTP opens what the path names on the node as the run's own user, who wrote it: a
        # link the job put there since the listing reads what that user may read anyway.
        # This side is what must hold: nothing written outside dest, through no link.
        sftp = conn.sftp()
        mine = dest / target.node
        for rel, _size in found.files:
            remote_path = posixpath.join(target.job_dir, rel)
            try:
                safefile.write_with(mine / rel, lambda f: sftp.getfo(remote_path, f),
                                    within=dest)
            except LauncherError as err:   # gone since it was listed (a job still writing)
                found.skipped.append(f"{rel}: {err}")
                continue
            found.copied += 1
        return found
    except (OSError, ValueError, job_folder_module.JobFolderError) as err:
        return NodeFiles(target.node, target.job_dir, error=f"{type(err).__name__}: {err}")
    finally:
        conn.close()
