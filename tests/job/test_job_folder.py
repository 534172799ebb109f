"""The job's own folder (launch_node/job_folder.py, made by launch_node/worker.py): each run and
node starts from exactly the node's copy (shipped files and what setup wrote), hard-linked, and
what one run writes is never seen by another. Real folders shipped by launch's own ship_local,
real worker.py processes, real flock(2)."""

from __future__ import annotations

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
