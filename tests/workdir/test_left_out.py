"""What the ignore rules left out, said at a run's start and when the job misses one of the
files (launcher/workdir/left_out.py): nanoGPT's `*.bin` data files never reached the nodes, and
the run said "26 of 26 file(s) shipped" before dying on FileNotFoundError."""

from __future__ import annotations

from launcher.workdir.left_out import left_out_note, missing_left_out
from launcher.workdir.scan import scan_workdir


def nanogpt_like(root):
    """nanoGPT's layout as far as it matters here: its .gitignore (*.bin, out*/), the data
    preparation's outputs beside the script."""
    files = {".gitignore": "__pycache__/\n*.bin\n*.pkl\nout*/\n", "train.py": "print()\n",
             "data/shakespeare_char/prepare.py": "print()\n",
             "data/shakespeare_char/train.bin": "x" * 2_000_000,
             "data/shakespeare_char/val.bin": "x" * 200_000,
             "data/shakespeare_char/meta.pkl": "x" * 500,
             "out-shakespeare-char/ckpt.pt": "x" * 10}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return scan_workdir(root)


def test_a_run_says_what_the_rules_left_out_and_how_to_ship_it(tmp_path):
    manifest = nanogpt_like(tmp_path)
    assert left_out_note(manifest) == (
        f"workdir {tmp_path}: the ignore rules left out 3 file(s) of 2.2 MB and 1 folder(s), "
        "not shipped: data/shakespeare_char/train.bin (2.0 MB, .gitignore:2 `*.bin`), "
        "data/shakespeare_char/val.bin (200.0 kB, .gitignore:2 `*.bin`), "
        "data/shakespeare_char/meta.pkl (500 B, .gitignore:3 `*.pkl`), and 1 more. To ship "
        "one, add `!NAME` to .launchignore (`!DIR/` for a folder); `launch run --dry-run` "
        "lists all")


def test_nothing_is_said_when_the_rules_left_out_nothing(tmp_path):
    (tmp_path / "train.py").write_text("print()\n")
    (tmp_path / ".git").mkdir()      # never shipped, but no rule of the user's: not news
    assert left_out_note(scan_workdir(tmp_path)) is None


def test_a_file_the_job_missed_is_named_with_its_rule(tmp_path):
    manifest = nanogpt_like(tmp_path)
    lines = ["node0/0: Traceback (most recent call last):",
             "node0/0: FileNotFoundError: [Errno 2] No such file or directory: "
             "'data/shakespeare_char/train.bin'"]
    assert missing_left_out(manifest, lines, ["/w/copy"]) == [
        "data/shakespeare_char/train.bin was not shipped: the workdir scan left out "
        "data/shakespeare_char/train.bin (.gitignore:2 `*.bin`); "
        "`!data/shakespeare_char/train.bin` in .launchignore ships it"]
    # An absolute path in the node's copy, inside a left-out folder; a file that was shipped.
    lines = ["node1/0: FileNotFoundError: [Errno 2] No such file or directory: "
             "\"/w/copy/out-shakespeare-char/ckpt.pt\"",
             "node1/0: FileNotFoundError: [Errno 2] No such file or directory: 'train.py'",
             "node1/0: OSError: No such file or directory: '/elsewhere/train.bin'"]
    assert missing_left_out(manifest, lines, ["/w/copy"]) == [
        "/w/copy/out-shakespeare-char/ckpt.pt was not shipped: the workdir scan left out "
        "out-shakespeare-char/ (.gitignore:4 `out*/`); `!out-shakespeare-char/` in "
        ".launchignore ships the folder"]
