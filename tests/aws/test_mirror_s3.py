"""The checkpoint mirror against S3 (moto's HTTP server, reached by boto3 through
AWS_ENDPOINT_URL as it would reach AWS): multipart uploads, what a dead uploader leaves and is
never chosen, and a run resumed from S3 after its head's folder was deleted."""

from __future__ import annotations

import json
import shutil
import signal

import boto3
import pytest

from tests.aws.conftest import REGION
from tests.run.conftest import LaunchProcess, wait_for, write_recipe
from launch_node import checkpoint_files as files
from launch_node import mirror
from launch_node.mirror import Mirror, S3Store, Status

BUCKET = "launch-ckpt"
MiB = 1 << 20


@pytest.fixture
def s3(aws_env):
    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket=BUCKET)
    return client


def write_checkpoint(folder, step: int, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stem = files.stem(step)
    n = files.write_atomic(folder / f"{stem}.pt", lambda f: f.write(bytes([step % 256]) * size))
    files.write_json_atomic(folder / f"{stem}.json", {"step": step, "bytes": n})


def test_a_large_checkpoint_goes_up_in_parts_and_comes_back_whole(s3, tmp_path):
    head = tmp_path / "head"
    write_checkpoint(head, 40, 12 * MiB)
    store = S3Store(BUCKET, "runs/r.0000abcd", part_bytes=5 * MiB)
    watcher = Mirror(head, store, "trainer", Status(store.url, "trainer"), say=lambda t: None)
    assert watcher.pass_once() == 1
    manifest = mirror.newest(store)
    key = "runs/r.0000abcd/" + mirror.object_key("step-00000040", manifest["version"],
                                                  "step-00000040.pt")
    # A multipart object's ETag ends in -<parts>: 12 MiB in 5 MiB parts is 3.
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"').endswith("-3")
    fresh = tmp_path / "fresh"
    mirror.restore(fresh, f"s3://{BUCKET}/runs/r.0000abcd", "trainer")
    (back,) = files.complete(fresh)
    assert back.step == 40 and back.state.read_bytes() == (head / "step-00000040.pt").read_bytes()


def test_what_a_killed_uploader_leaves_in_s3_is_never_chosen_and_gets_cleaned(s3, tmp_path):
    head = tmp_path / "head"
    write_checkpoint(head, 10, MiB)
    store = S3Store(BUCKET, "p/run.12345678", part_bytes=5 * MiB)
    Mirror(head, store, "trainer", Status(store.url, "trainer"), say=lambda t: None).pass_once()
    # Step 20's state, its multipart upload begun and one part in, never completed; step 30's
    # files whole but no manifest (killed between the last file and the manifest).
    prefix = "p/run.12345678/objects"
    upload = s3.create_multipart_upload(Bucket=BUCKET,
                                        Key=f"{prefix}/step-00000020/aaaa/step-00000020.pt")
    s3.upload_part(Bucket=BUCKET, Key=f"{prefix}/step-00000020/aaaa/step-00000020.pt",
                   UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 5 * MiB)
    for name in ("step-00000030.pt", "step-00000030.json"):
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/step-00000030/bbbb/{name}", Body=b"{}")
    assert mirror.newest(store)["unit"] == "step-00000010"
    fresh = tmp_path / "fresh"
    mirror.restore(fresh, store.url, "trainer")
    assert [c.step for c in files.complete(fresh)] == [10]
    # The next watcher aborts the dead one's upload (its parts are billed until then).
    assert store.abort_incomplete(mirror.OBJECTS) == 1
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_bucket_that_does_not_exist_fails_the_run_before_it_trains(aws_env, run_launch,
                                                                      tmp_path):
    recipe = write_recipe(tmp_path, checkpoint={"every_steps": 10,
                                                "mirror": "s3://no-such-bucket/ckpt"})
    proc = run_launch("run", "--local", "--nodes", "2", str(recipe), "--run-id", "nobucket",
                      "--rdzv-port", "29641")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "the checkpoint mirror s3://no-such-bucket/ckpt/nobucket." in out
    assert "NoSuchBucket" in out and "node0" in out
    summary = json.loads((tmp_path / "runs" / "nobucket" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] is None


@pytest.mark.slow
def test_a_run_resumes_from_s3_after_its_heads_folder_is_deleted(s3, tmp_path):
    """The head's whole folder (its checkpoints with it) is gone; `--resume` brings the
    mirror's newest checkpoint back and the run ends where an uninterrupted one would."""
    recipe = write_recipe(tmp_path, train={"steps": 60, "log_every": 10},
                          checkpoint={"every_steps": 10, "keep": 1,
                                      "mirror": f"s3://{BUCKET}/ckpt"})
    run = LaunchProcess(["run", "--local", "--nodes", "2", str(recipe), "--run-id", "s3run",
                         "--rdzv-port", "29642"], tmp_path)
    run_dir = tmp_path / "runs" / "s3run"
    uid = None

    def mirrored_step() -> int:
        nonlocal uid
        uid = uid or json.loads((run_dir / "launch.json").read_text())["uid"]
        found = mirror.newest(S3Store(BUCKET, f"ckpt/s3run.{uid}"))
        return int(found["order"]) if found else 0

    try:
        wait_for(lambda: (run_dir / "launch.json").exists() and mirrored_step() >= 20, 300,
                 "step 20 in the mirror")
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        run.kill()
    before = json.loads((run_dir / "summary.json").read_text())
    assert before["status"] == "interrupted"
    # At least the checkpoint that was found there (step 20 or later). Not necessarily step 10
    # too: with keep 1, a mirror pass that comes round after the next save finds only that one
    # in the head's folder, and uploads what the head keeps (seen on a loaded machine).
    assert before["mirror"]["units"] >= 1 and before["mirror"]["failures"] == []
    newest = mirrored_step()
    shutil.rmtree(run_dir / "node0")

    resumed = LaunchProcess(["run", "--local", "--resume", "s3run", "--rdzv-port", "29643"],
                            tmp_path)
    try:
        code = resumed.wait(timeout=400)
    finally:
        resumed.kill()
    out = resumed.output()
    assert code == 0, out[-4000:]
    assert f"from checkpoint step {newest}" in out and "the head's copy is gone" in out
    assert f"mirror: restored {files.stem(newest)}" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == \
        ("succeeded", 60, newest)
    # The end of the run went up too, and the mirror holds only what the head keeps (keep 1).
    assert mirrored_step() == 60
    assert sorted(mirror.complete_units(S3Store(BUCKET, f"ckpt/s3run.{uid}"))) == \
        ["step-00000060"]
