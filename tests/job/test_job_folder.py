"""The job's own folder (launch_node/job_folder.py, made by launch_node/worker.py): each run and
node starts from exactly the node's copy (shipped files and what setup wrote), hard-linked, and
what one run writes is never seen by another. Real folders shipped by launch's own ship_local,
real worker.py processes, real flock(2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.core.errors import LauncherError, RecipeError
from launcher.job.environment import env_flags
from launcher.job.recipe import SETTINGS_ENV, recipe_from_mapping, reserved_env_reason
from launcher.job.runplan import JOB_FOLDERS, job_folder as planned_folder
from launcher.workdir.scan import scan_workdir
from launcher.workdir.sync import ship_local
from launch_node import job_folder, worker

WORKER = Path(worker.__file__)
# Run by the job: what it finds in its folder, then a snapshot of its own written there.
JOB = ("import os\n"
       "found = open('snapshot.pt').read() if os.path.exists('snapshot.pt') else 'nothing'\n"
       "open('snapshot.pt', 'w').write(os.environ['LAUNCH_RUN_ID'])\n"
       "print(os.getcwd(), os.environ['LAUNCH_WORKDIR'], found, open('train.py').read())\n")


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg" / "deep").mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("v1")
    (root / "pkg" / "deep" / "model.py").write_text("weights = 1\n")
    (root / "pkg" / ".launch-notes").write_text("the user's own, deeper down\n")
    os.symlink("pkg/deep", root / "models")
    return root


def shipped(tmp_path: Path) -> tuple[str, str]:
    """The node's copy, with what setup wrote beside the shipped files: (copy, digest)."""
    manifest = scan_workdir(project(tmp_path))
    copy = ship_local(manifest, tmp_path / "node" / "copy").dest
    Path(copy, "built.so").write_text("setup's output\n")
    Path(copy, ".launch-setup-done").write_text("x")
    return copy, manifest.digest


def view(copy: str, run: str, node: str = "node0") -> str:
    return planned_folder(copy, run, "0a1b2c3d", node)


def run_job(copy: str, digest: str, run: str, node: str = "node0",
            folder: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAUNCH_WORKDIR_COPY": copy, "LAUNCH_WORKDIR_DIGEST": digest,
           "LAUNCH_WORKDIR": folder or view(copy, run, node), "LAUNCH_RUN_ID": run}
    return subprocess.run([sys.executable, str(WORKER), "exec", sys.executable, "-c", JOB],
                          capture_output=True, text=True, env=env, cwd=copy, timeout=60)


def test_the_layout_agrees_with_the_plan():
    assert JOB_FOLDERS == job_folder.RUNS
    # The one LAUNCH_ name a recipe's env: or --env may set: the setting read on the node.
    assert list(SETTINGS_ENV) == [job_folder.KEEP_ENV] and reserved_env_reason(job_folder.KEEP_ENV) \
        is None and reserved_env_reason("LAUNCH_NODE") is not None
    assert job_folder.place("/c", planned_folder("/c", "run-1", "0a1b", "node0")) == \
        ("run-1.0a1b", "node0")


@pytest.mark.parametrize("value", ["0", "-1", "five", "1e3", "", "99999999999"])
def test_a_bad_number_of_job_folders_kept_is_refused_before_the_run_naming_it(value):
    """Refused where it is given (the recipe's env:, --env), not by every node's first rank."""
    def recipe(kept: str):
        return recipe_from_mapping({"name": "r", "job": {"command": ["true"]},
                                    "env": {job_folder.KEEP_ENV: kept}}, "r.yml")

    with pytest.raises(RecipeError, match=f"r.yml: env: {job_folder.KEEP_ENV}: the value .* "
                                          "is not a whole number of runs"):
        recipe(value)
    with pytest.raises(LauncherError, match=f"--env {job_folder.KEEP_ENV}=.*: the value .* is "
                                            "not a whole number of runs"):
        env_flags([f"{job_folder.KEEP_ENV}={value}"], {})
    assert recipe("3").env == {job_folder.KEEP_ENV: "3"}


def test_each_run_and_node_runs_in_its_own_folder_and_keeps_what_it_wrote(tmp_path):
    copy, digest = shipped(tmp_path)
    first = run_job(copy, digest, "first")
    assert first.returncode == 0, first.stderr
    where, named, found, code = first.stdout.split()
    assert where == named == view(copy, "first") and found == "nothing" and code == "v1"
    # A later run, and another node of the same run on this machine: neither sees the snapshot.
    for run, node in (("second", "node0"), ("first", "node1")):
        proc = run_job(copy, digest, run, node)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[2] == "nothing"
    # The first run's file stayed in its folder, not in the copy.
    assert Path(view(copy, "first"), "snapshot.pt").read_text() == "first"
    assert not Path(copy, "snapshot.pt").exists()
    # A restart of the same run on the same node finds its own folder, snapshot included.
    again = run_job(copy, digest, "first")
    assert again.stdout.split()[2] == "first"


def test_the_folder_links_the_copy_and_follows_no_link(tmp_path):
    copy, _digest = shipped(tmp_path)
    made = job_folder.make(copy, view(copy, "r1"))
    os.close(made.folder)
    os.close(made.fd)
    folder = Path(made.path)
    # Regular files: the copy's own inodes (no data copied), setup's output too.
    for name in ("train.py", "built.so", "pkg/deep/model.py", "pkg/.launch-notes"):
        assert os.stat(folder / name).st_ino == os.stat(Path(copy, name)).st_ino
    # A link stays a link with its target; launch's own files at the top stay out.
    assert os.readlink(folder / "models") == "pkg/deep"
    assert not any(n.startswith(".launch-") for n in os.listdir(folder))
    assert made.made and made.copied == 0


def test_a_link_planted_in_the_folders_place_is_not_followed(tmp_path):
    copy, digest = shipped(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_folder = Path(view(copy, "r1")).parent
    run_folder.mkdir(parents=True)
    os.symlink(elsewhere, run_folder / "node0")
    proc = run_job(copy, digest, "r1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == str(run_folder / "node0")
    assert not (run_folder / "node0").is_symlink() and os.listdir(elsewhere) == []
    # The runs folder itself replaced by a link: refused, named, nothing written through it.
    os.rename(copy + JOB_FOLDERS, tmp_path / "moved")
    os.symlink(elsewhere, copy + JOB_FOLDERS)
    proc = run_job(copy, digest, "r2")
    assert proc.returncode == 2 and "the job's folder cannot be made" in proc.stderr
    assert copy + JOB_FOLDERS in proc.stderr and os.listdir(elsewhere) == []
    # A folder named outside the copy's runs folder: refused.
    proc = run_job(copy, digest, "r3", folder=str(tmp_path / "anywhere"))
    assert proc.returncode == 2 and "is not <copy>.runs/<run>/<node>" in proc.stderr


def test_only_the_newest_runs_are_kept_and_a_running_one_never_goes(tmp_path):
    copy, digest = shipped(tmp_path)
    busy = job_folder.make(copy, view(copy, "r0"))   # still running: its lock held
    os.close(busy.folder)
    os.utime(busy.fd, ns=(10**8, 10**8))              # and the oldest
    for n in range(1, 7):
        proc = run_job(copy, digest, f"r{n}")
        assert proc.returncode == 0, proc.stderr
        os.utime(Path(view(copy, f"r{n}")).parent / job_folder.LOCK, ns=(n * 10**9,) * 2)
    proc = run_job(copy, digest, "r7")
    kept = sorted(os.listdir(copy + JOB_FOLDERS))
    # r7 and the 4 newest before it, and r0, whose run holds its lock.
    assert kept == [job_folder.LOCK, *(Path(view(copy, f"r{n}")).parent.name
                                       for n in (0, 3, 4, 5, 6, 7))]
    assert "removed the job folders of 1 older run(s)" in proc.stdout
    os.close(busy.fd)
    # Once r0 ended it goes with the next new run; the setting is read from the environment.
    env = {job_folder.KEEP_ENV: "2"}
    assert job_folder.keep_setting(env) == 2
    made = job_folder.make(copy, view(copy, "r8"), keep=2)
    os.close(made.folder)
    os.close(made.fd)
    assert sorted(os.listdir(copy + JOB_FOLDERS)) == [
        job_folder.LOCK, *(Path(view(copy, f"r{n}")).parent.name for n in (7, 8))]
    with pytest.raises(job_folder.JobFolderError, match=job_folder.KEEP_ENV):
        job_folder.keep_setting({job_folder.KEEP_ENV: "0"})


def test_where_a_link_cannot_be_made_the_file_is_copied(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = tmp_path / "a" / "data.bin"
    source.write_bytes(b"x" * 3_000_000)
    os.chmod(source, 0o751)
    os.utime(source, ns=(10**9, 2 * 10**9))
    src = os.open(tmp_path / "a", os.O_RDONLY | os.O_DIRECTORY)
    dst = os.open(tmp_path / "b", os.O_RDONLY | os.O_DIRECTORY)
    try:
        job_folder.copy_file(src, dst, "data.bin")
    finally:
        os.close(src)
        os.close(dst)
    got = tmp_path / "b" / "data.bin"
    assert got.read_bytes() == source.read_bytes()
    assert os.stat(got).st_ino != os.stat(source).st_ino
    assert (os.stat(got).st_mode & 0o777, os.stat(got).st_mtime_ns) == (0o751, 2 * 10**9)


def test_the_next_ship_keeps_the_linked_copy_and_repairs_a_file_written_in_place(tmp_path):
    """Linking moves a file's ctime, which is how a ship notices a file written in place: the
    copy is checked by content then, nothing is sent or rewritten; a file the job rewrote in
    place through its link (the known limit) is written again, the job's folder keeping the
    job's bytes."""
    copy, digest = shipped(tmp_path)
    assert run_job(copy, digest, "r1").returncode == 0
    before = os.stat(Path(copy, "train.py")).st_ino
    manifest = scan_workdir(tmp_path / "project")
    stats = ship_local(manifest, tmp_path / "node" / "copy")
    assert (stats.dest, stats.files_sent) == (copy, 0)
    assert os.stat(Path(copy, "train.py")).st_ino == before
    with open(Path(view(copy, "r1"), "train.py"), "r+") as f:   # in place, not by rename
        f.write("v9")
    stats = ship_local(manifest, tmp_path / "node" / "copy")
    assert stats.files_sent == 1 and Path(copy, "train.py").read_text() == "v1"
    assert Path(view(copy, "r1"), "train.py").read_text() == "v9"
    assert run_job(copy, digest, "r2").stdout.split()[3] == "v1"


def test_what_a_run_wrote_is_told_from_what_was_shipped_and_fetched_safely(tmp_path):
    """`launch fetch --workdir`'s listing (job_folder.run_files) and its copy here
    (launcher/workdir/job_files.py): what the run made or changed comes back, the shipped and
    setup's files do not, whatever a later ship did to the copy; no link is followed, and no
    path a node names leaves the node's folder here."""
    from launcher.workdir.job_files import Target, checked, copy_here, fetch_here, list_here

    copy, digest = shipped(tmp_path)
    assert run_job(copy, digest, "r1").returncode == 0
    assert run_job(copy, digest, "r2").returncode == 0
    # A later ship changes the copy under both runs' views: r2 wrote only its snapshot.
    Path(tmp_path, "project", "train.py").write_text("v3")
    ship_local(scan_workdir(tmp_path / "project"), tmp_path / "node" / "copy")
    assert job_folder.run_files(view(copy, "r2")) == ([("snapshot.pt", 2)], "record")
    folder = Path(view(copy, "r1"))
    (folder / "out").mkdir()
    (folder / "out" / "ckpt.pt").write_bytes(b"\0weights" * 1000)
    with open(folder / "pkg" / "deep" / "model.py", "r+") as f:   # in place, through the link
        f.write("weights = 2\n")
    (folder / "new.py").write_text("v2")
    os.replace(folder / "new.py", folder / "train.py")            # replaced by rename
    os.symlink("/etc/passwd", folder / "leak")
    (folder / "pkg" / "__pycache__").mkdir()
    (folder / "pkg" / "__pycache__" / "deep.cpython-311.pyc").write_bytes(b"\x00")
    files, how = job_folder.run_files(str(folder))
    assert how == "record"
    assert [rel for rel, _ in files] == ["out/ckpt.pt", "pkg/deep/model.py", "snapshot.pt",
                                         "train.py"]
    assert dict(files)["out/ckpt.pt"] == 8000
    # Copied here under the node's name, byte for byte; a file turned into a link after the
    # listing is skipped, not followed.
    dest = tmp_path / "here" / "workdir"
    dest.mkdir(parents=True)
    got = list_here(Target("node0", str(folder)))
    os.remove(folder / "snapshot.pt")
    os.symlink("/etc/passwd", folder / "snapshot.pt")
    copy_here(got, dest / "node0", within=dest)
    assert got.error is None and got.copied == 3
    assert len(got.skipped) == 1 and got.skipped[0].startswith("snapshot.pt: ")
    assert (dest / "node0" / "out" / "ckpt.pt").read_bytes() == b"\0weights" * 1000
    assert (dest / "node0" / "train.py").read_text() == "v2"
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "node0/out/ckpt.pt", "node0/pkg/deep/model.py", "node0/train.py"]
    # A view made before launch kept its record: files with one link are the run's.
    os.remove(folder.parent / (job_folder.SHIPPED + "node0"))
    files, how = job_folder.run_files(str(folder))
    assert how == "links" and [rel for rel, _ in files] == ["out/ckpt.pt", "train.py"]
    # A removed folder is said, not a traceback.
    [gone] = fetch_here([Target("node9", str(folder.parent / "node9"))], dest)
    assert "node9" in gone.error and "removed once newer runs" in gone.error
    # What a node answers is checked before anything is written here.
    for bad in ("../outside", "/etc/x", "a//b", "a/./b"):
        with pytest.raises(job_folder.JobFolderError, match="not a path inside"):
            checked([[bad, 1]], "node0")


def _fetch(tmp_path, capsys, run_id: str) -> tuple[int, str, str]:
    """`launch fetch RUN_ID --workdir` in this process (launch's own command line), from
    tmp_path: (exit code, stdout, stderr)."""
    from launcher.cli import main

    code = main(["fetch", run_id, "--workdir", "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fetching_job_folders_names_what_is_missing(tmp_path, capsys):
    """`launch fetch RUN --workdir` where it cannot reach the nodes: the file and what to do,
    no traceback."""
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "launch.json").write_text('{"run_id": "x"}')
    node = {"name": "h0", "job_dir": "/w/c.runs/x.u/h0", "probe": ["python3"]}

    def fetch(plan):
        if plan is not None:
            (run / "plan.json").write_text(json.dumps(plan))
        return _fetch(tmp_path, capsys, "x")

    gone = tmp_path / "gone.ini"
    cases = [
        (None, f"{run / 'plan.json'} is missing: the run ended before its nodes were planned"),
        ({"backend": "ssh", "nodes": [node]}, "does not say how its nodes were reached (a run "
         "of an older launch): name where it ran (-i INVENTORY, --cluster NAME"),
        ({"backend": "ssh", "backend_settings": {"inventory": str(gone)}, "nodes": [node]},
         f"{gone}: cannot read the inventory: no such file or folder (as {run / 'plan.json'} "
         "names it): name where the run's nodes are now (-i INVENTORY or --cluster NAME)"),
    ]
    cases.append(({"backend": "local", "backend_settings": {},
                   "nodes": [{**node, "name": ".."}]},
                  f"{run / 'plan.json'}: node '..' cannot name a folder"))
    for plan, says in cases:
        code, _, err = fetch(plan)
        assert code == 2 and says in err, err
        assert "Traceback" not in err
    code, _, err = fetch({"backend": "local", "backend_settings": {}, "nodes": [node]})
    assert code == 1 and "h0: its job folder /w/c.runs/x.u/h0 could not be read: " \
        "/w/c.runs/x.u/h0: No such file or directory (a run's job folder is removed once " \
        "newer runs" in err
    assert not (run / "workdir" / "h0").exists()


def test_fetching_many_nodes_shows_the_screens_worth_and_the_totals(tmp_path, capsys):
    """`launch fetch RUN --workdir` of a local run of 10 nodes: every node's snapshot comes
    back, a line each for the first 8 (the screen's limit), then the totals."""
    copy, digest = shipped(tmp_path)
    nodes = [f"node{i}" for i in range(10)]
    for node in nodes:
        assert run_job(copy, digest, "r1", node).returncode == 0
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "launch.json").write_text('{"run_id": "r1"}')
    (run / "plan.json").write_text(json.dumps({
        "backend": "local", "backend_settings": {},
        "nodes": [{"name": n, "job_dir": view(copy, "r1", n)} for n in nodes]}))
    code, out, err = _fetch(tmp_path, capsys, "r1")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:9]] == nodes[:8]
    assert lines[9] == (f"  10 node(s): 10 file(s), 20 B written by the run, 10 copied into "
                        f"{run / 'workdir'}/NODE/")
    assert len(lines) == 10
    assert {n: (run / "workdir" / n / "snapshot.pt").read_text() for n in nodes} == \
        {n: "r1" for n in nodes}
