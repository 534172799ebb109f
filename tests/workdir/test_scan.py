"""scan_workdir: links, loops, special and unreadable files, sizes, secrets, the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from launcher.core.errors import LauncherError
from launcher.workdir.scan import WorkdirError, scan_workdir
from tests.workdir.conftest import Link, make_tree, shipped


def _error(root: Path, **kwargs) -> str:
    with pytest.raises(WorkdirError) as err:
        scan_workdir(root, **kwargs)
    assert isinstance(err.value, LauncherError) and err.value.exit_code == 2
    return str(err.value)


def test_the_folder_must_be_a_folder(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert f"{tmp_path / 'train.py'} is not a folder" in _error(tmp_path / "train.py")
    assert str(tmp_path / "missing") in _error(tmp_path / "missing")


# ---- links -----------------------------------------------------------------------------------

@pytest.mark.parametrize("links, refused", [
    ({"up": Link("..")}, ["up"]),
    ({"abs": Link("/etc/passwd")}, ["abs"]),
    ({"abs_inside": Link("/tmp")}, ["abs_inside"]),
    ({"sub/out": Link("../../x")}, ["sub/out"]),
    ({"here": Link(".")}, ["here"]),
    ({"sub/back": Link("..")}, ["sub/back"]),
    ({"sub/back": Link("../sub")}, ["sub/back"]),
    ({"self": Link("self")}, ["self"]),
    ({"a": Link("b"), "b": Link("a")}, ["a", "b"]),
    ({"a": Link("sub/b"), "sub/b": Link("../c"), "c": Link("a")}, ["a", "c", "sub/b"]),
    # Neither escapes on its own; together the tree is endless: x/l/m/l/m/...
    ({"x/l": Link("../y"), "y/m": Link("../x")}, ["x/l", "y/m"]),
    # Read as text, sub/d/side/../.. is sub; the kernel goes up from x, where side leads.
    ({"sub/d/side": Link("../../x"), "sub/d/esc": Link("side/../..")}, ["sub/d/esc"]),
    ({"hop": Link("sub"), "esc": Link("hop/../..")}, ["esc"]),
])
def test_links_that_leave_or_loop_are_refused(tmp_path, links, refused):
    root = make_tree(tmp_path / "w", {"x.py": "", "sub/d/f": "", "x/": None, "y/": None,
                                      **links})
    message = _error(root)
    named = sorted(p for p in links if f"{root / p}: a link to {links[p].target}" in message)
    assert named == refused, message


def test_links_resolve_the_way_the_kernel_does(tmp_path):
    """`s/../x` goes up from where the link s leads, not from s's own folder: inside here."""
    root = make_tree(tmp_path / "w", {"a/b/f": "", "x.py": "data", "s": Link("a/b"),
                                      "t": Link("s/../../x.py"), "lib": Link("a/b"),
                                      "chain": Link("t")})
    assert (root / "t").resolve() == root / "x.py"   # the kernel agrees
    manifest = scan_workdir(root)
    links = {e.path: e.target for e in manifest.entries if e.kind == "link"}
    assert links == {"s": "a/b", "t": "s/../../x.py", "lib": "a/b", "chain": "t"}
    assert manifest.warnings == ()


def test_dangling_links_inside_are_shipped_with_a_warning(tmp_path):
    root = make_tree(tmp_path / "w", {
        ".gitignore": "checkpoints/\n",
        "checkpoints/step-9.pt": "", "latest": Link("checkpoints/step-9.pt"),
        "later": Link("outputs/result.json"), "notdir": Link("x.py/y"), "x.py": ""})
    manifest = scan_workdir(root)
    assert {"latest", "later", "notdir"} <= shipped(manifest)
    joined = "\n".join(manifest.warnings)
    assert "link latest -> checkpoints/step-9.pt points to checkpoints/step-9.pt, which is " \
           "left out (.gitignore:1 `checkpoints/`)" in joined
    assert "link later -> outputs/result.json points to nothing in the folder" in joined
    assert "link notdir -> x.py/y" in joined


def test_links_in_left_out_folders_are_not_looked_at(tmp_path):
    root = make_tree(tmp_path / "w", {".gitignore": ".venv/\n", ".venv/bin/python":
                                      Link("/usr/bin/python3"), ".venv/loop": Link("."),
                                      "train.py": ""})
    assert shipped(scan_workdir(root)) == {".gitignore", "train.py"}


# ---- special and unreadable files ------------------------------------------------------------

def test_special_files_are_left_out_unopened(tmp_path):
    root = make_tree(tmp_path / "w", {"train.py": ""})
    os.mkfifo(root / "pipe")   # opening it for reading would block the scan forever
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        expected = {("pipe", "a FIFO"), ("sock", "a socket")}
        try:
            os.mknod(root / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
            expected.add(("null", "a character device"))
        except PermissionError:
            pass
        manifest = scan_workdir(root)
    assert {(x.path, x.reason) for x in manifest.excluded} == expected
    assert shipped(manifest) == {"train.py"}


def _scan_unprivileged(root: Path) -> dict:
    """scan_workdir as a user the files' modes apply to: root reads everything, so a forked
    child drops to nobody (the interpreter is loaded already; the venv may be under /root)."""
    if os.geteuid() != 0:
        try:
            return {"ok": sorted(shipped(scan_workdir(root)))}
        except WorkdirError as err:
            return {"error": str(err)}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                out = {"ok": sorted(shipped(scan_workdir(root)))}
            except WorkdirError as err:
                out = {"error": str(err)}
            os.write(write, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def open_tmp():
    """A folder every user can reach (pytest's own is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="launch-workdir-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_unreadable_files_and_folders_are_named(open_tmp):
    root = make_tree(open_tmp / "w", {"ok.py": "", "secret.bin": "x", "locked/inner.py": "",
                                      "fine/a.py": ""})
    for path in (root, root / "fine", root / "locked"):
        path.chmod(0o755)
    for path in (root / "ok.py", root / "fine/a.py"):
        path.chmod(0o644)
    (root / "secret.bin").chmod(0o000)
    (root / "locked").chmod(0o000)
    answer = _scan_unprivileged(root)
    assert "error" in answer, answer
    assert f"{root / 'secret.bin'}: cannot read it (Permission denied)" in answer["error"]
    assert f"{root / 'locked'}: cannot list it (Permission denied)" in answer["error"]
    (root / "secret.bin").chmod(0o644)
    (root / "locked").chmod(0o755)
    (root / "locked/inner.py").chmod(0o644)
    assert _scan_unprivileged(root) == {"ok": ["fine/a.py", "locked/inner.py", "ok.py",
                                               "secret.bin"]}


# ---- sizes and secrets -----------------------------------------------------------------------

def test_large_folders_warn_then_refuse(tmp_path):
    root = make_tree(tmp_path / "w", {"big.ckpt": b"x" * 6000, "mid.bin": b"y" * 3000,
                                      "small.py": b"z" * 10})
    manifest = scan_workdir(root, warn_bytes=5000)
    (warning,) = manifest.warnings
    assert "9.0 kB to ship (over 5.0 kB)" in warning
    assert "big.ckpt (6.0 kB), mid.bin (3.0 kB)" in warning
    message = _error(root, limit_bytes=8000, limit_hint="--workdir-limit")
    assert "holds 9.0 kB to ship, more than the limit of 8.0 kB" in message
    assert "big.ckpt (6.0 kB)" in message and f"{root}/.launchignore" in message
    assert "raise --workdir-limit" in message
    (root / ".launchignore").write_text("*.ckpt\n")
    assert scan_workdir(root, limit_bytes=8000, warn_bytes=5000).warnings == ()


def test_files_that_look_like_secrets_are_listed_not_left_out(tmp_path):
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
    root = make_tree(tmp_path / "w", {
        ".env": "TOKEN=1", ".env.prod": "", ".env.example": "TOKEN=", "cfg/id_rsa": key,
        "cfg/id_rsa.pub": "ssh-rsa AAAA", "id_ed25519": "", "tls/server.pem": "",
        "tls/server.key": "", "credentials.json": "", ".aws/credentials": "", ".netrc": "",
        "store.p12": b"\x30\x82", "notes/deploy": key, "train.py": "import os",
        "identity.py": "", "README.md": "see id_rsa"})
    manifest = scan_workdir(root)
    assert {s.path: s.why for s in manifest.secrets} == {
        ".env": "a dotenv file", ".env.prod": "a dotenv file",
        "cfg/id_rsa": "holds a private key", "id_ed25519": "an SSH private key's name",
        "tls/server.pem": "a PEM key or certificate",
        "tls/server.key": "a PEM key or certificate", "credentials.json": "named credentials",
        ".aws/credentials": "named credentials", ".netrc": "a tool's credentials file",
        "store.p12": "a key store", "notes/deploy": "holds a private key"}
    assert {s.path for s in manifest.secrets} <= shipped(manifest)
    text = "\n".join(manifest.render())
    assert "look like secrets (11;" in text and "    notes/deploy (holds a private key)" in text


# ---- the manifest ----------------------------------------------------------------------------

def test_manifest_entries(tmp_path):
    root = make_tree(tmp_path / "w", {"run.sh": "#!/bin/sh\n", "pkg/mod.py": "x = 1\n",
                                      "empty/": None, "cfg": Link("pkg/mod.py")})
    (root / "run.sh").chmod(0o755)
    (root / "pkg/mod.py").chmod(0o640)
    manifest = scan_workdir(root)
    got = {e.path: (e.kind, oct(e.mode), e.size, e.sha256, e.target) for e in manifest.entries}
    sha = {p: hashlib.sha256((root / p).read_bytes()).hexdigest()
           for p in ("run.sh", "pkg/mod.py")}
    assert got == {
        "run.sh": ("file", "0o755", 10, sha["run.sh"], None),
        "pkg": ("dir", "0o755", 0, None, None),
        "pkg/mod.py": ("file", "0o640", 6, sha["pkg/mod.py"], None),
        "empty": ("dir", "0o755", 0, None, None),
        "cfg": ("link", "0o777", 0, None, "pkg/mod.py"),
    }
    assert [e.path for e in manifest.entries] == sorted(got)
    assert manifest.files == 2 and manifest.total_bytes == 16
    data = json.loads(json.dumps(manifest.to_json()))
    assert data["digest"] == manifest.digest and len(data["entries"]) == 5


def test_digest_follows_content_not_times(tmp_path):
    root = make_tree(tmp_path / "w", {"a.py": "one", "b/c.py": "two", "l": Link("a.py")})
    first = scan_workdir(root).digest
    os.utime(root / "a.py", (1, 1))
    assert scan_workdir(root).digest == first
    changes = [
        lambda: (root / "a.py").write_text("ONE"),
        lambda: (root / "a.py").chmod(0o755),
        lambda: ((root / "l").unlink(), os.symlink("b/c.py", root / "l")),
        lambda: (root / "b/c.py").rename(root / "b/d.py"),
        lambda: (root / "new/").mkdir(),
    ]
    seen = {first}
    for change in changes:
        change()
        digest = scan_workdir(root).digest
        assert digest not in seen
        seen.add(digest)


def test_hash_cache_never_hides_a_change(tmp_path, launch_home, monkeypatch):
    root = make_tree(tmp_path / "w", {"a.bin": b"A" * 100, "b.bin": b"x" * 50})
    # Rewritten right after a scan, within the clock's tick: not cached as clean.
    scan_workdir(root)
    (root / "b.bin").write_bytes(b"y" * 50)
    assert {e.path: e.sha256 for e in scan_workdir(root).entries}["b.bin"] == \
        hashlib.sha256(b"y" * 50).hexdigest()
    # Hashed as if long after the last change: cached.
    later = time.time_ns() + 10 * 10**9
    monkeypatch.setattr("launcher.workdir.scan.time.time_ns", lambda: later)
    first = scan_workdir(root)
    (cache,) = (launch_home / "workdir-hashes").iterdir()
    assert set(json.loads(cache.read_text())) == {"a.bin", "b.bin"}
    # Same size, mtime put back: the ctime still tells (after a moment, so that the clock
    # has moved: the real-world version of that moment is the racy margin).
    mtime = (root / "a.bin").stat().st_mtime_ns
    time.sleep(0.05)
    with open(root / "a.bin", "r+b") as f:
        f.write(b"B")
    os.utime(root / "a.bin", ns=(mtime, mtime))
    second = scan_workdir(root)
    assert second.entries[0].sha256 == hashlib.sha256(b"B" + b"A" * 99).hexdigest()
    assert first.digest != second.digest


def test_names_that_are_not_utf8(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    (root / os.fsdecode(b"caf\xe9.txt")).write_text("latin-1 name")
    manifest = scan_workdir(root)
    (entry,) = manifest.entries
    assert os.fsencode(entry.path) == b"caf\xe9.txt"
    assert json.loads(json.dumps(manifest.to_json()))["entries"][0]["path"] == entry.path


def test_render_groups_what_is_left_out(tmp_path):
    root = make_tree(tmp_path / "w", {".gitignore": "*.pt\nwandb/\n", "wandb/run/x": "",
                                      **{f"ckpt/{i}.pt": "" for i in range(5)},
                                      "train.py": "print()", ".env": "K=V"})
    lines = scan_workdir(root).render()
    text = "\n".join(lines)
    assert lines[0].startswith(f"workdir {root}: 3 files, ") and "1 folders" in lines[0]
    assert "left out (6):" in text
    assert "    .gitignore:1 `*.pt`: ckpt/0.pt, ckpt/1.pt, ckpt/2.pt, and 2 more" in text
    assert "    .gitignore:2 `wandb/`: wandb/" in text
    assert "    .env (a dotenv file)" in text


def test_launch_leaves_its_own_output_out(tmp_path):
    root = make_tree(tmp_path / "w", {"train.py": "", "runs/r1/node.log": "", ".gitignore":
                                      "!runs/\n", "other/runs/keep": ""})
    (root / ".launch-shipped.json").write_text("{}")   # a node's copy, scanned again
    manifest = scan_workdir(root, leave_out={root / "runs": "the runs folder (--runs-dir)",
                                             tmp_path / "elsewhere": "not inside"})
    assert shipped(manifest) == {".gitignore", "train.py", "other/runs/keep"}
    assert [(x.path, x.reason) for x in manifest.excluded] == [
        (".launch-shipped.json", "launch's bookkeeping in a node's copy"),
        ("runs/", "the runs folder (--runs-dir)")]
