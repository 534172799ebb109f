"""ship_ssh on the SSH lab: by content to every node at once, in-place changes repaired,
busy copies left alone, concurrent ships to one node, a connection dropped midway, errors
named by host. The lab's hosts share this machine's files, so what a node got is read here."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from launcher.cluster.inventory import load_inventory
from launcher.cluster.ssh import connect, remote
from launcher.cluster.ssh_options import SshOptions
from launcher.workdir.scan import WorkdirError, scan_workdir
from launcher.workdir.sync import NODE_SOURCE, ship_ssh
from tests.workdir.conftest import PROJECT, expected_tree, make_tree, tree_of

pytestmark = pytest.mark.lab
PYTHON = shutil.which("python3") or "python3"


@pytest.fixture
def nodes(lab, monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "launch-home"))
    found = load_inventory(lab.inventory)
    conns = [connect(n, SshOptions()) for n in found]
    yield list(zip(found, conns))
    for conn in conns:
        conn.close()


@pytest.fixture
def node_dir(lab, request) -> Path:
    """This test's own folder on the hosts (the module's tests share the lab)."""
    path = lab.dir / request.node.name
    path.mkdir()
    return path


def serving(lab) -> list[int]:
    """The node programs of ships still running on the lab's hosts."""
    found = []
    for host in lab.hosts:
        for pid in lab.pids(host.name):
            try:
                if b"LAUNCH-WORKDIR" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
    return found


def wait_until_no_ship_runs(lab) -> None:
    for _ in range(1000):
        if not serving(lab):
            return
        time.sleep(0.01)


def ship_all(nodes, manifest, node_dir):
    """Every node at once, as launch does; each node's copy in its own folder."""
    def one(pair):
        n, conn = pair
        return ship_ssh(conn, manifest, str(node_dir / n.name / "workdir"), python=PYTHON,
                        host=n.name)

    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(one, nodes))


def test_ships_by_content_to_every_node(lab, nodes, node_dir, tmp_path):
    project = make_tree(tmp_path / "project", PROJECT)
    (project / "run.sh").chmod(0o755)
    (project / "pkg/data.csv").chmod(0o600)
    (project / "weights.bin").write_bytes(os.urandom(5_000_000))
    first = scan_workdir(project)
    stats = ship_all(nodes, first, node_dir)
    assert [s.files_sent for s in stats] == [first.files - 1] * 2   # one content twice
    for n, _ in nodes:
        assert tree_of(node_dir / n.name / "workdir") == expected_tree(first)

    unchanged = ship_all(nodes, scan_workdir(project), node_dir)
    assert [(s.files_sent, s.bytes_sent) for s in unchanged] == [(0, 0)] * 2

    # The jobs changed shipped files in place; here one file changes, one goes.
    with open(node_dir / "host0/workdir/train.py", "r+b") as f:
        f.write(b"CORRUPTED")
    os.truncate(node_dir / "host1/workdir/weights.bin", 10)
    (node_dir / "host1/workdir/outputs/metrics.json").write_text("{}")   # the job's own
    (project / "pkg/__init__.py").write_text("VALUE = 43\n")
    (project / "same_b.txt").unlink()
    changed = scan_workdir(project)
    one = ship_all(nodes, changed, node_dir)
    assert [(s.files_sent, s.dest) for s in one] == [
        (2, str(node_dir / "host0/workdir")), (2, str(node_dir / "host1/workdir"))]
    assert one[1].bytes_sent == len("VALUE = 43\n") + 5_000_000
    for n, _ in nodes:
        got = tree_of(node_dir / n.name / "workdir")
        if n.name == "host1":
            assert got.pop("outputs/metrics.json")[2] == b"{}"
        assert got == expected_tree(changed)
        assert "same_b.txt" not in got
        assert got["run.sh"][:2] == ("file", "0o755")
        assert got["config"] == ("link", "pkg/data.csv")
    wait_until_no_ship_runs(lab)   # the node programs end right after their last answer
    assert serving(lab) == []


def test_a_busy_copy_moves_to_a_sibling(lab, nodes, node_dir, tmp_path):
    project = make_tree(tmp_path / "project", PROJECT)
    n, conn = nodes[0]
    dest = node_dir / "workdir"
    first = scan_workdir(project)
    want_first = expected_tree(first)
    ship_ssh(conn, first, str(dest), python=PYTHON)
    job = os.open(dest / ".launch-lock", os.O_RDWR)   # a running job's shared lock
    fcntl.flock(job, fcntl.LOCK_SH)
    try:
        (project / "pkg/__init__.py").write_text("VALUE = 43\n")
        second = scan_workdir(project)
        moved = ship_ssh(conn, second, str(dest), python=PYTHON)
        assert (moved.dest, moved.files_sent) == (f"{dest}.2", 1)
        assert tree_of(dest) == want_first
        assert tree_of(node_dir / "workdir.2") == expected_tree(second)
    finally:
        os.close(job)


def test_concurrent_ships_to_one_node(lab, nodes, node_dir, tmp_path):
    n, _ = nodes[0]
    states, expected = [], {}
    for i in range(3):
        root = make_tree(tmp_path / f"state{i}", {**PROJECT, "pkg/__init__.py": f"V = {i}\n"})
        (root / "blob.bin").write_bytes(bytes([i]) * 2_000_000)
        states.append(scan_workdir(root))
        expected[states[-1].digest] = expected_tree(states[-1])
    conns = [connect(n, SshOptions()) for _ in range(6)]
    try:
        with ThreadPoolExecutor(6) as pool:
            used = list(pool.map(lambda i: ship_ssh(conns[i], states[i % 3],
                                                    str(node_dir / "workdir"), python=PYTHON),
                                 range(6)))
    finally:
        for conn in conns:
            conn.close()
    assert {s.dest for s in used} <= {str(node_dir / "workdir")} | {
        f"{node_dir / 'workdir'}.{k}" for k in range(2, 7)}
    for copy in [p for p in node_dir.glob("workdir*") if p.is_dir()]:
        digest = json.loads((copy / ".launch-shipped.json").read_text())["digest"]
        assert {p: v[:3] for p, v in tree_of(copy).items()} == \
            {p: v[:3] for p, v in expected[digest].items()}


def test_a_dropped_connection_leaves_the_copy_usable(lab, nodes, node_dir, tmp_path):
    project = make_tree(tmp_path / "project", PROJECT)
    (project / "big.bin").write_bytes(os.urandom(20_000_000))
    manifest = scan_workdir(project)
    n, _ = nodes[0]
    dest = node_dir / "workdir"
    conn = connect(n, SshOptions())
    channel = conn.client.get_transport().open_session()
    channel.exec_command(remote(PYTHON, "-c", NODE_SOURCE, "serve", str(dest)))
    data = json.dumps({"entries": manifest.wire_entries(), "digest": manifest.digest,
                       "busy": "sibling"}).encode()
    channel.sendall(struct.pack(">I", len(data)) + data)
    channel.sendall(b"\0" + (project / ".gitignore").read_bytes()
                    + b"\0" + (project / "big.bin").read_bytes()[:5_000_000])
    for _ in range(1000):   # until the node writes the half-sent content
        staging = [p for p in dest.glob(".launch-staging-*")] if dest.exists() else []
        if staging and any(f.stat().st_size > 1000 for f in staging[0].iterdir()):
            break
        time.sleep(0.01)
    conn.close()   # the connection drops: sshd notices, the node program ends
    wait_until_no_ship_runs(lab)
    assert serving(lab) == []
    stats = ship_ssh(nodes[0][1], manifest, str(dest), python=PYTHON)
    assert stats.files_sent == manifest.files - 1
    assert tree_of(dest) == expected_tree(manifest)
    assert list(dest.glob(".launch-staging-*")) == []


def test_problems_are_named_by_host(lab, nodes, node_dir, tmp_path):
    manifest = scan_workdir(make_tree(tmp_path / "project", PROJECT))
    n, conn = nodes[1]
    with pytest.raises(WorkdirError) as err:
        ship_ssh(conn, manifest, str(node_dir / "x"), python="/nonexistent/python3", host=n.name)
    assert str(err.value) == (f"host {n.name}: interpreter /nonexistent/python3 "
                              "(launch_python) not found: run `launch setup` or set "
                              "launch_python")
    (node_dir / "afile").write_text("")
    with pytest.raises(WorkdirError) as err:
        ship_ssh(conn, manifest, str(node_dir / "afile"), python=PYTHON, host=n.name)
    assert str(err.value) == (f"host {n.name}: shipping workdir {manifest.root} to "
                              f"{node_dir / 'afile'} failed: {node_dir / 'afile'} exists and is "
                              "not a folder")
    # A file that vanished after the scan: named, and the node's copy is left as it was.
    (manifest.root / "pkg/data.csv").unlink()
    with pytest.raises(WorkdirError, match="pkg/data.csv changed after launch scanned"):
        ship_ssh(conn, manifest, str(node_dir / "y"), python=PYTHON)
    wait_until_no_ship_runs(lab)
    assert sorted(os.listdir(node_dir / "y")) == [".launch-lock"]
    # The connection is still good for the next ship.
    (manifest.root / "pkg/data.csv").write_text(PROJECT["pkg/data.csv"])
    fixed = scan_workdir(manifest.root)
    ship_ssh(conn, fixed, str(node_dir / "y"), python=PYTHON)
    assert tree_of(node_dir / "y") == expected_tree(fixed)
