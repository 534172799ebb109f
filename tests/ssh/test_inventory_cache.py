"""Ansible's answer for an inventory is kept between commands (issue 37: ~0.6-2 s of every `-i`
command was Ansible's loader reading a file nobody had edited), and used only while nothing it
depends on changed (launcher/cluster/inventory_cache.py).

That a kept answer skips Ansible is shown the way a user would see it: with Ansible made
unable to run (a package called `ansible` that fails to import, first on the loader's import
path), an unchanged inventory still loads, and anything that must ask Ansible again fails."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from launcher.cluster.inventory import load_inventory
from launcher.cluster.inventory_cache import CACHE_ENV, FOLDER, MAX_ENTRIES
from launcher.core.errors import InventoryError, LauncherError

# Ansible is started ~20 times (a fresh loader wherever the kept answer must not serve).
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    return tmp_path / "home"


def entries(home: Path) -> list[Path]:
    return sorted((home / FOLDER).glob("*.json"))


def no_ansible(tmp_path: Path, monkeypatch) -> None:
    """From here on, Ansible's loader cannot start: its child process imports this
    `ansible` first."""
    fake = tmp_path / "no-ansible" / "ansible"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('Ansible made unavailable by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(fake.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))


def inventory(folder: Path) -> Path:
    """An INI inventory with what Ansible's loader resolves: a host range, a group of groups,
    [group:vars], group_vars/ and host_vars/."""
    folder.mkdir()
    (folder / "hosts.ini").write_text(
        "[trainers]\nnode[01:03] ansible_host=10.0.0.1\n\n[spare]\nnode09 ansible_host=10.0.0.9\n"
        "\n[gpu:children]\ntrainers\nspare\n\n[trainers:vars]\nansible_user=ubuntu\n")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "gpu.yml").write_text("gpus: 4\nlaunch_python: /opt/py/bin/python\n")
    (folder / "host_vars").mkdir()
    (folder / "host_vars" / "node02.yml").write_text("ansible_port: 2202\n")
    return folder / "hosts.ini"


def nodes(path: Path, limit: str | None = None) -> list[dict]:
    return [n.to_json() for n in load_inventory(path, limit, warn=lambda _: None)]


def test_an_unchanged_inventory_is_read_once_and_answers_as_ansible_does(
        tmp_path, monkeypatch, home):
    path = inventory(tmp_path / "inv")
    monkeypatch.setenv(CACHE_ENV, "0")
    asked = nodes(path)   # Ansible's own answer, nothing kept
    assert not (home / FOLDER).exists()
    assert [(n["name"], n["port"], n["gpus"], n["user"]) for n in asked] == [
        ("node01", 22, 4, "ubuntu"), ("node02", 2202, 4, "ubuntu"), ("node03", 22, 4, "ubuntu"),
        ("node09", 22, 4, None)]
    monkeypatch.delenv(CACHE_ENV)
    assert nodes(path) == asked
    assert len(entries(home)) == 1

    no_ansible(tmp_path, monkeypatch)
    assert nodes(path) == asked   # from the kept answer: Ansible could not have answered
    monkeypatch.setenv(CACHE_ENV, "off")
    with pytest.raises(InventoryError, match="Ansible's inventory loader failed: .*ImportError"):
        nodes(path)


def test_every_change_ansible_would_see_is_seen(tmp_path, monkeypatch, home):
    path = inventory(tmp_path / "inv")
    assert [n["gpus"] for n in nodes(path)] == [4] * 4
    gpu_vars = path.parent / "group_vars" / "gpu.yml"
    before = gpu_vars.stat()
    # Same size, same modification time: only the bytes say it changed.
    gpu_vars.write_text(gpu_vars.read_text().replace("gpus: 4", "gpus: 8"))
    os.utime(gpu_vars, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert gpu_vars.stat().st_size == before.st_size
    assert [n["gpus"] for n in nodes(path)] == [8] * 4
    (path.parent / "host_vars" / "node03.yml").write_text("ansible_port: 2203\n")
    assert [n["port"] for n in nodes(path)] == [22, 2202, 2203, 22]
    assert [n["name"] for n in nodes(path, "spare")] == ["node09"]   # a limit: its own answer
    monkeypatch.setenv("ANSIBLE_HOST_PATTERN_MISMATCH", "ignore")    # Ansible's settings too
    no_ansible(tmp_path, monkeypatch)
    with pytest.raises(InventoryError, match="Ansible's inventory loader failed"):
        nodes(path)
    monkeypatch.delenv("ANSIBLE_HOST_PATTERN_MISMATCH")
    assert [n["name"] for n in nodes(path, "spare")] == ["node09"]   # still kept, unchanged


def test_group_vars_made_where_there_were_none_are_seen(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("[all]\nh1 ansible_host=10.0.0.1\n")
    assert nodes(path)[0]["python"] == "python3"
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("launch_python: /opt/py/bin/python\n")
    assert nodes(path)[0]["python"] == "/opt/py/bin/python"


def test_a_script_inventory_is_asked_every_time(tmp_path, home):
    script = tmp_path / "inventory.sh"
    script.write_text(
        "#!/bin/sh\n"
        'count=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 ))\n'
        'echo "$count" > "$0.count"\n'
        "printf '{\"trainers\": {\"hosts\": [\"h%s\"]}, \"_meta\": {\"hostvars\": {}}}' "
        '"$count"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert [[n["name"] for n in nodes(script)] for _ in range(3)] == [["h1"], ["h2"], ["h3"]]
    assert entries(home) == []


def test_a_file_made_executable_is_read_as_a_script(tmp_path):
    """One file, two inventories: as INI, host `echo` (its one variable's name and value
    around the `=`); run, a script whose answer is host `from-script`. Only its mode changes."""
    path = tmp_path / "inventory"
    path.write_text("#!/bin/sh\necho '{\"trainers\": {\"hosts\": [\"from-script\"]}, "
                    "\"_meta\": {\"hostvars\": {\"from-script\": {\"k\": \"=\"}}}}'\n")
    assert [n["name"] for n in nodes(path)] == ["echo"]
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    assert [n["name"] for n in nodes(path)] == ["from-script"]


def test_an_inventory_plugin_is_never_kept(tmp_path, monkeypatch, home):
    path = tmp_path / "fleet.yml"
    path.write_text("plugin: ansible.builtin.generator\nhosts:\n  name: '{{ role }}-0'\n"
                    "layers:\n  role: [trainer]\n")
    assert [n["name"] for n in nodes(path)] == ["trainer-0"]
    assert entries(home) == []
    no_ansible(tmp_path, monkeypatch)
    with pytest.raises(InventoryError, match="Ansible's inventory loader failed"):
        nodes(path)


def test_a_damaged_entry_is_a_miss_and_is_written_anew(tmp_path, monkeypatch, home):
    path = inventory(tmp_path / "inv")
    expected = nodes(path)
    [entry] = entries(home)
    kept = json.loads(entry.read_text())
    damages = {
        "not JSON": b"\x00\xff not json",
        "cut short": entry.read_bytes()[:40],
        "not launch's shape": json.dumps({**kept, "answer": {"hosts": "node01"}}).encode(),
        "a FIFO": None,
    }
    for why, damage in damages.items():
        entry.unlink()
        if damage is None:
            os.mkfifo(entry)
        else:
            entry.write_bytes(damage)
        assert nodes(path) == expected, why
        assert json.loads(entry.read_text()) == kept, why   # written anew, whole


def test_the_cache_keeps_at_most_its_bound(tmp_path, home):
    folder = home / FOLDER
    folder.mkdir(parents=True)
    for i in range(MAX_ENTRIES + 5):
        old = folder / f"{i:032x}.json"
        old.write_text("{}")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    path = inventory(tmp_path / "inv")
    nodes(path)
    left = entries(home)
    assert len(left) == MAX_ENTRIES
    assert folder / f"{0:032x}.json" not in left   # the least recently used went first
    assert any(json.loads(p.read_text()).get("answer") for p in left)


def test_a_wrong_setting_is_an_error_naming_it(tmp_path, monkeypatch):
    path = inventory(tmp_path / "inv")
    monkeypatch.setenv(CACHE_ENV, "sometimes")
    with pytest.raises(LauncherError, match=f"{CACHE_ENV}='sometimes': use 0 .* 1"):
        nodes(path)
