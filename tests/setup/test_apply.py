"""`launch setup` applied for real: a fresh Debian 12 root over SSH, a stand-in NVIDIA repository.

The module's node goes through what a user's node would: a check-mode preview on the fresh
node, a first application, a second one that must change nothing, a check-mode run that must
predict nothing, then changes (an older keyring pin, a new NCCL pin, an inventory that wants
GPUs, a PCI bus with GPUs and EFA). The fixtures run the first steps once for the module,
because installing torch is the slow part; the later tests depend on them through `second`
and run in file order, as pytest runs a module's tests.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.lab]

NCCL_PIN, NCCL_NEW_PIN = "2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8"
NEWEST_570_DRIVER = "570.133.20-1"
NCCL_PACKAGES = ["libnccl2", "libnccl-dev"]

# Paths whose changes say nothing about what setup did: the SSH logins themselves (wtmp, btmp,
# lastlog, sshd's and sudo's /run), Ansible's own remote temporary folder, and apt's binary
# caches (pkgcache.bin), which any apt read, `apt-cache policy` included, rebuilds from the
# lists. /proc, /sys and /dev are the node's mounts, empty from here.
UNTRACKED = ("proc", "sys", "dev", "run", "var/log/wtmp", "var/log/btmp", "var/log/lastlog",
             "root/.ansible", "var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin")


def tree_state(root: Path) -> dict[str, tuple]:
    """Type, mode, owner, size, mtime and link target of every path under root.

    A directory's mtime is left out: it moves when a program makes and deletes a temporary file
    in it (apt-key does in /etc/apt), and the entries themselves are all compared anyway.
    """
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames
                       if os.path.normpath(os.path.join(rel_dir, d)) not in UNTRACKED]
        for name in dirnames + filenames:
            if os.path.normpath(os.path.join(rel_dir, name)) in UNTRACKED:
                continue
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            mtime = None if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns
            state[os.path.normpath(os.path.join(rel_dir, name))] = (
                st.st_mode, st.st_uid, st.st_gid, st.st_size, mtime, target)
    return state


def tree_diff(before: dict, after: dict) -> list[str]:
    return sorted({p for p in before.keys() | after.keys() if before.get(p) != after.get(p)})


def package_versions(node) -> dict[str, str]:
    out = node.ssh("dpkg-query", "--showformat=${Package} ${Version}\\n", "--show").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


@pytest.fixture(scope="module")
def node(make_node):
    return make_node("node0")


@pytest.fixture(scope="module")
def inventory(node):
    return node.write_inventory(node.workdir / "inventory.yml", nccl_version=NCCL_PIN)


@pytest.fixture(scope="module")
def check_on_fresh(node, inventory, launch_setup):
    before = tree_state(node.root)
    run = launch_setup("-i", str(inventory), "--check")
    return run, tree_diff(before, tree_state(node.root))


@pytest.fixture(scope="module")
def first(check_on_fresh, inventory, launch_setup):
    return launch_setup("-i", str(inventory))


@pytest.fixture(scope="module")
def second(first, inventory, launch_setup):
    return launch_setup("-i", str(inventory))


def test_check_mode_on_a_fresh_node_changes_nothing(check_on_fresh):
    run, changed_paths = check_on_fresh
    assert run.proc.returncode == 0, run.output
    assert "in check mode" in run.proc.stdout
    assert changed_paths == [], f"--check changed {changed_paths[:20]}"
    # The preview still says what a real run would do.
    assert "would install cuda-keyring 1.1-1" in run.proc.stdout
    assert run.summary()["node0"]["changed"] > 0, run.proc.stdout


def test_first_application_sets_up_the_node(first, node):
    assert first.proc.returncode == 0, first.output
    assert first.summary()["node0"]["failed"] == 0
    keyring = node.ssh("test", "-s", "/usr/share/keyrings/cuda-archive-keyring.gpg", check=False)
    assert keyring.returncode == 0, "the repository key is not installed"
    source = node.ssh("cat", "/etc/apt/sources.list.d/cuda-debian12-x86_64.list").stdout
    assert f"{node.repo.base_url}/debian12/x86_64/ /" in source
    assert "signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg" in source
    versions = package_versions(node)
    assert versions["cuda-keyring"] == "1.1-1"
    assert {p: versions.get(p) for p in NCCL_PACKAGES} == dict.fromkeys(NCCL_PACKAGES, NCCL_PIN)
    held = node.ssh("apt-mark", "showhold").stdout.split()
    assert sorted(held) == sorted(NCCL_PACKAGES)
    torch = node.ssh("/opt/launch/venv/bin/python", "-c",
                     "import torch, numpy, sklearn; print(torch.__version__, torch.ones(2).sum().item())")
    assert torch.stdout.split() == ["2.13.0+cpu", "2.0"]


def test_retired_repository_key_is_removed(first, node):
    keys = node.ssh("apt-key", "list").stdout
    assert node.repo.retired_key_id[-8:] not in keys.replace(" ", "")


def test_node_facts_are_fetched_next_to_the_inventory(first, inventory):
    facts = json.loads((inventory.parent / "facts" / "node0.json").read_text())
    assert facts["host"] == "node0"
    assert facts["hostname"] == "node0"
    assert facts["os"].startswith("Debian GNU/Linux 12")
    assert facts["architecture"] == "x86_64"
    assert facts["gpus"] == [] and facts["pci_nvidia_gpus"] == 0
    assert facts["driver_version"] is None and facts["topology"] is None
    assert facts["cuda_toolkit_version"] is None
    assert facts["nccl_package_version"] == NCCL_PIN and facts["nccl_version"] == "2.25.1"
    assert facts["efa_devices"] == 0 and facts["nccl_env"] == {}
    assert facts["nccl_tests_bin"] is None
    assert facts["torch"] == {"python": "/opt/launch/venv/bin/python", "version": "2.13.0+cpu",
                              "cuda": None, "nccl": None}


def test_gpu_only_steps_skip_with_their_message(first, node):
    out = first.proc.stdout
    assert "No NVIDIA GPU on the PCI bus: skipping the NVIDIA driver" in out
    assert "No EFA device on the PCI bus: skipping the EFA installer" in out
    assert "(no NVIDIA GPU on this node): skipping the nccl-tests build" in out
    versions = package_versions(node)
    assert "cuda-drivers-570" not in versions
    assert node.ssh("test", "-e", "/etc/launch/nccl.env", check=False).returncode != 0


def test_second_application_changes_nothing(second):
    assert second.proc.returncode == 0, second.output
    assert second.changed_tasks() == []
    assert second.summary()["node0"]["changed"] == 0


def test_check_mode_on_a_set_up_node_predicts_no_change(second, node, inventory, launch_setup):
    before = tree_state(node.root)
    run = launch_setup("-i", str(inventory), "--check")
    assert run.proc.returncode == 0, run.output
    assert run.changed_tasks() == []
    assert tree_diff(before, tree_state(node.root)) == []


def test_a_later_keyring_is_kept_not_downgraded(second, node, launch_setup):
    older = node.write_inventory(node.workdir / "older-keyring.yml", nccl_version=NCCL_PIN,
                                 cuda_keyring_version="1.0-1")
    run = launch_setup("-i", str(older), "--tags", "cuda_keyring")
    assert run.proc.returncode == 0, run.output
    # --tags runs that role alone, after the distro assertion (tagged always).
    roles = {e["event_data"].get("role") for e in run.events() if e.get("event") == "runner_on_ok"}
    assert roles - {None} == {"launch_platform", "cuda_keyring"}
    assert "cuda-keyring 1.1-1 is installed, later than the pinned 1.0-1: keeping it" in run.proc.stdout
    assert run.changed_tasks() == []
    assert package_versions(node)["cuda-keyring"] == "1.1-1"


def test_a_pin_change_upgrades_exactly_the_pinned_packages(second, node, launch_setup):
    before = package_versions(node)
    moved = node.write_inventory(node.workdir / "new-pin.yml", nccl_version=NCCL_NEW_PIN)
    run = launch_setup("-i", str(moved), "--cluster", "lab")
    assert run.proc.returncode == 0, run.output
    after = package_versions(node)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert changed == set(NCCL_PACKAGES)
    assert {after[p] for p in NCCL_PACKAGES} == {NCCL_NEW_PIN}
    assert sorted(node.ssh("apt-mark", "showhold").stdout.split()) == sorted(NCCL_PACKAGES)
    # apt-get unholds what it moves; the role holds it again.
    assert run.changed_tasks() == [
        "node0: nccl : Hold the NCCL packages at the pinned version",
        f"node0: nccl : Install NCCL {NCCL_NEW_PIN}",
        "node0: node_facts : Fetch the facts to the controller",
        "node0: node_facts : Keep the facts on the node",
    ]
    facts = json.loads((launch_setup.home / "clusters" / "lab" / "facts" / "node0.json").read_text())
    assert facts["nccl_package_version"] == NCCL_NEW_PIN


def test_a_node_that_must_have_gpus_fails_naming_host_task_and_reason(second, node, launch_setup):
    gpu_node = node.write_inventory(node.workdir / "gpu.yml", gpus=8)
    run = launch_setup("-i", str(gpu_node), "--tags", "nvidia_driver")
    assert run.proc.returncode == 2, run.output
    assert run.summary()["node0"]["failed"] == 1
    assert ("node0 failed at 'nvidia_driver : Fail when the node has fewer NVIDIA GPUs than "
            "the inventory says':") in run.proc.stdout
    assert "The inventory says node0 has gpus=8, but its PCI bus shows 0 NVIDIA GPU(s)" in run.proc.stdout
    assert "FAILED" in run.proc.stdout


def test_driver_and_efa_steps_run_where_the_pci_bus_has_them(second, node, inventory,
                                                             launch_setup):
    # The node's PCI bus has no GPU and no EFA: extra vars (which outrank the facts
    # launch_platform sets) say what a p4d's bus would, so the real driver and EFA tasks run,
    # against the stand-in repository and the stand-in EFA installer.
    p4d_bus = node.workdir / "p4d-bus.yml"
    p4d_bus.write_text(
        "launch_platform_nvidia_gpus: ['0000:10:1c.0', '0000:10:1d.0']\n"
        "launch_platform_efa_devices: ['0xefa1']\n"
        "launch_platform_reboot_allowed: false\n")
    args = ("-i", str(inventory), "--tags", "nvidia_driver,efa", "-e", f"@{p4d_bus}")
    run = launch_setup(*args)
    assert run.proc.returncode == 0, run.output
    # The branch's newest release, with nouveau kept away and the reboot left to the user.
    assert package_versions(node)["cuda-drivers-570"] == NEWEST_570_DRIVER
    assert "blacklist nouveau" in node.ssh("cat", "/etc/modprobe.d/blacklist-nouveau.conf").stdout
    assert "launch_platform_reboot_allowed is false: reboot this node" in run.proc.stdout
    env = node.ssh("cat", "/etc/launch/nccl.env").stdout.splitlines()
    assert [line for line in env if not line.startswith("#")] == [
        "FI_PROVIDER=efa",
        "FI_EFA_FORK_SAFE=1",
        "FI_EFA_USE_DEVICE_RDMA=1",
        "NCCL_NET_PLUGIN=ofi",
        "LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib",
    ]
    # Before the reboot nvidia-smi cannot answer, so the driver tasks run again: and change
    # nothing, like the installed EFA version.
    again = launch_setup(*args)
    assert again.proc.returncode == 0, again.output
    assert again.changed_tasks() == []

