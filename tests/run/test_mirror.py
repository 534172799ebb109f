"""The checkpoint mirror (launch_node/mirror.py) into a shared folder: what counts as mirrored, what
is brought back, what is never chosen; and the recipe key that asks for it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.core.errors import RecipeError
from launcher.job.recipe import recipe_from_mapping
from launch_node import checkpoint_files as files
from launch_node import mirror
from launch_node.mirror import FolderStore, JobUnits, Mirror, Status, mirror_problem


def write_checkpoint(folder: Path, step: int, payload: bytes = b"") -> None:
    """What the trainer's writer does: the state, then its .json (train/checkpoint.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = files.stem(step)
    size = files.write_atomic(folder / f"{stem}.pt",
                              lambda f: f.write(payload or f"state {step}".encode() * 1000))
    files.write_json_atomic(folder / f"{stem}.json", {"step": step, "bytes": size,
                                                      "signature": {"world_size": 2}})


def watcher(folder: Path, dest: Path, layout: str = "trainer") -> Mirror:
    return Mirror(folder, FolderStore(str(dest)), layout, Status(str(dest), layout),
                  say=lambda text: None)


def test_a_trainer_checkpoint_is_mirrored_and_restored_whole(tmp_path):
    head, dest = tmp_path / "head" / "checkpoints", tmp_path / "mirror" / "run.abcd1234"
    write_checkpoint(head, 10)
    write_checkpoint(head, 20)
    assert watcher(head, dest).pass_once() == 2
    manifests = sorted(p.name for p in (dest / "manifests").iterdir())
    assert manifests == ["step-00000010.json", "step-00000020.json"]
    newest = mirror.newest(FolderStore(str(dest)))
    assert (newest["unit"], newest["order"], newest["meta"]["step"]) == ("step-00000020", 20, 20)

    # The head's folder is gone: a new head gets the newest checkpoint back, byte for byte.
    fresh = tmp_path / "new-head" / "checkpoints"
    mirror.restore(fresh, str(dest), "trainer")
    (back,) = files.complete(fresh)
    assert back.step == 20
    assert back.state.read_bytes() == (head / "step-00000020.pt").read_bytes()
    # With its times kept, a watcher there takes it for the mirrored one: nothing goes up again.
    assert watcher(fresh, dest).pass_once() == 0


def test_a_half_uploaded_checkpoint_is_never_chosen(tmp_path):
    head, dest = tmp_path / "head", tmp_path / "mirror"
    write_checkpoint(head, 10)
    watcher(head, dest).pass_once()
    # What an uploader killed before its manifest leaves: step 30's files, no manifest; and a
    # copy cut short (its temp file).
    store = FolderStore(str(dest))
    for name in ("step-00000030.pt", "step-00000030.json"):
        store.put_file(mirror.object_key("step-00000030", "deadbeef0000", name),
                       open(head / name.replace("30", "10"), "rb"), 0)
    torn = dest / mirror.object_key("step-00000040", "0123456789ab", "step-00000040.pt")
    torn.parent.mkdir(parents=True)
    torn.with_name(torn.name + files.TMP_SUFFIX).write_bytes(b"half")
    assert mirror.newest(store)["unit"] == "step-00000010"
    fresh = tmp_path / "fresh"
    mirror.restore(fresh, str(dest), "trainer")
    assert [c.step for c in files.complete(fresh)] == [10]
    # A checkpoint whose .json never came (the trainer died writing) is not uploaded.
    (head / "step-00000050.pt").write_bytes(b"no json yet")
    assert watcher(head, dest).pass_once() == 0
    assert "step-00000050" not in mirror.complete_units(store)
    # The next watcher removes the dead copy's temp file.
    assert store.abort_incomplete(mirror.OBJECTS) == 1


def test_a_manifest_whose_files_are_not_all_there_fails_the_restore_loudly(tmp_path):
    head, dest = tmp_path / "head", tmp_path / "mirror"
    write_checkpoint(head, 10)
    watcher(head, dest).pass_once()
    (pt,) = (dest / "objects" / "step-00000010").rglob("*.pt")
    pt.write_bytes(b"cut")
    with pytest.raises(mirror.MirrorError, match="missing or not"):
        mirror.restore(tmp_path / "fresh", str(dest), "trainer")
    assert not (tmp_path / "fresh" / "step-00000010.json").exists()


def test_the_mirror_follows_the_trainers_pruning_but_a_new_head_deletes_nothing(tmp_path):
    head, dest = tmp_path / "head", tmp_path / "mirror"
    write_checkpoint(head, 10)
    first = watcher(head, dest)
    first.pass_once()
    write_checkpoint(head, 20)
    files.prune(head, keep=1)
    first.pass_once()
    assert sorted(mirror.complete_units(FolderStore(str(dest)))) == ["step-00000020"]
    assert not (dest / "objects" / "step-00000010").exists()
    assert first.status.deleted == ["step-00000010"]
    # A replacement head starts with an empty folder: its watcher removes nothing.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert watcher(empty, dest).pass_once() == 0
    assert sorted(mirror.complete_units(FolderStore(str(dest)))) == ["step-00000020"]


def test_a_file_pruned_during_its_upload_still_uploads_whole(tmp_path):
    head, dest = tmp_path / "head", tmp_path / "mirror"
    write_checkpoint(head, 10, payload=os.urandom(1 << 20))
    expected = (head / "step-00000010.pt").read_bytes()
    store = FolderStore(str(dest))

    class PruneFirst(FolderStore):
        """The trainer prunes the checkpoint right after the watcher picked it."""

        def put_file(self, key, src, size):
            files.prune(head, keep=0)
            super().put_file(key, src, size)

    w = Mirror(head, PruneFirst(str(dest)), "trainer", Status(str(dest), "trainer"),
               say=lambda text: None)
    assert w.pass_once() == 1
    fresh = tmp_path / "fresh"
    mirror.restore(fresh, str(dest), "trainer")
    assert (fresh / "step-00000010.pt").read_bytes() == expected
    assert mirror.newest(store)["bytes"] == len(expected) + \
        (dest / mirror.object_key("step-00000010", mirror.newest(store)["version"],
                                  "step-00000010.json")).stat().st_size


def test_a_jobs_entries_go_up_once_closed_and_a_folder_once_settled(tmp_path):
    folder, dest = tmp_path / "ckpt", tmp_path / "mirror"
    folder.mkdir()
    w = watcher(folder, dest, "job")
    (folder / "epoch-1.pt").write_bytes(b"one")
    (folder / ".partial").write_bytes(b"hidden: never")
    (folder / "epoch-2.pt.tmp").write_bytes(b"temp: never")
    assert w.pass_once() == 1            # a closed file is whole
    assert w.pass_once() == 0            # and goes up once
    # A file a process still holds open for writing waits, however still it looks.
    writing = open(folder / "epoch-2.pt", "wb")
    writing.write(b"two")
    writing.flush()
    assert w.pass_once() == 0 and w.pass_once() == 0
    writing.close()
    assert w.pass_once() == 1
    # A folder is one checkpoint (a sharded save adds its files one by one): taken once it
    # looked the same twice.
    (folder / "step-3").mkdir()
    (folder / "step-3" / "shard-0").write_bytes(b"a")
    assert w.pass_once() == 0
    (folder / "step-3" / "shard-1").write_bytes(b"b")
    assert w.pass_once() == 0
    assert w.pass_once() == 1
    units = mirror.complete_units(FolderStore(str(dest)))
    assert sorted(units) == ["epoch-1.pt", "epoch-2.pt", "step-3"]
    assert [f["path"] for f in units["step-3"]["files"]] == ["step-3/shard-0", "step-3/shard-1"]
    # A job restores every checkpoint its folder lacks, with its own names.
    fresh = tmp_path / "fresh"
    mirror.restore(fresh, str(dest), "job")
    assert sorted(p.relative_to(fresh).as_posix() for p in fresh.rglob("*") if p.is_file()) \
        == ["epoch-1.pt", "epoch-2.pt", "step-3/shard-0", "step-3/shard-1"]


def test_a_checkpoint_rewritten_under_its_name_goes_up_as_a_new_version(tmp_path):
    folder, dest = tmp_path / "ckpt", tmp_path / "mirror"
    folder.mkdir()
    w = watcher(folder, dest, "job")
    (folder / "last.pt").write_bytes(b"old")
    w.pass_once()
    old = mirror.complete_units(FolderStore(str(dest)))["last.pt"]["version"]
    (folder / "last.pt.tmp").write_bytes(b"newer")
    os.replace(folder / "last.pt.tmp", folder / "last.pt")
    assert w.pass_once() == 1
    new = mirror.complete_units(FolderStore(str(dest)))["last.pt"]
    assert new["version"] != old and new["bytes"] == 5
    assert [p.name for p in (dest / "objects" / "last.pt").iterdir()] == [new["version"]]


@pytest.mark.parametrize("value, says", [
    ("s3://Bad_Bucket/x", "is not an S3 bucket name"),
    ("s3://", "is not an S3 bucket name"),
    ("gs://bucket/x", "only s3:// URLs and folders"),
    ("checkpoints", "absolute path that every node mounts"),
    ("/fsx/ckpt\n", "without control characters"),
])
def test_a_mirror_launch_cannot_use_is_refused(value, says):
    assert says in mirror_problem(value)


def test_mirror_destinations_that_work():
    assert mirror_problem("s3://my-bucket") is None
    assert mirror_problem("s3://my.bucket-2/runs/vit") is None
    assert mirror_problem("/fsx/checkpoints") is None


TRAINER = {"name": "x", "train": {"steps": 10}}
JOB = {"name": "x", "job": {"command": ["a"]}}


def test_the_recipe_key_goes_with_the_trainer_and_with_a_job():
    r = recipe_from_mapping({**TRAINER, "checkpoint": {"every_steps": 5,
                                                       "mirror": "s3://b-1/p"}}, "r.yml")
    assert r.checkpoint.mirror == "s3://b-1/p" and r.checkpoint.writes
    r = recipe_from_mapping({**JOB, "checkpoint": {"mirror": "/fsx/ckpt"}}, "r.yml")
    assert r.checkpoint.mirror == "/fsx/ckpt" and not r.checkpoint.writes


@pytest.mark.parametrize("data, key, says", [
    ({**TRAINER, "checkpoint": {"mirror": "/fsx/c"}}, "",
     "checkpoint: mirror is set but neither every_steps nor every_minutes"),
    ({**JOB, "checkpoint": {"mirror": "/fsx/c", "keep": 3}}, "",
     "checkpoint.keep: configures the bundled trainer"),
    ({**JOB, "checkpoint": {"mirror": "fsx"}}, "checkpoint.mirror", "absolute path"),
])
def test_mirror_settings_that_cannot_work_are_refused(data, key, says):
    with pytest.raises(RecipeError) as err:
        recipe_from_mapping(data, "r.yml")
    assert err.value.key == key and says in err.value.why


def test_mirror_json_names_what_went_up(tmp_path):
    head, dest = tmp_path / "head", tmp_path / "mirror"
    write_checkpoint(head, 10)
    w = watcher(head, dest)
    w.pass_once()
    mirror.write_status(tmp_path / "mirror.json", w.status)
    status = json.loads((tmp_path / "mirror.json").read_text())
    assert (status["units"], status["last"]["unit"], status["failures"]) == \
        (1, "step-00000010", [])
