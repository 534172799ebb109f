"""`launch setup` applied for real: a fresh Debian 12 root over SSH, a stand-in NVIDIA repository.

The module's node goes through what a user's node would: a check-mode preview on the fresh
node, a first application, a second one that must change nothing, a check-mode run that must
predict nothing, then changes (an older keyring pin, a new NCCL pin, bad input), then the same
node as a GPU node of an NVSwitch type (a PCI bus with GPUs, NVSwitches and EFA, and the
stand-in driver packages of stand_ins.py): driver and fabric manager installed, held, rebooted
into, started and checked; a second run and a check-mode run that change nothing; `launch setup
--verify`; a driver that does not come up; a switch to another branch. The fixtures run the
first steps once for the module, because installing torch is the slow part; the later tests
depend on them and run in file order, as pytest runs a module's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.setup import stand_ins
from tests.setup.conftest import NCCL_VERSIONS

pytestmark = [pytest.mark.slow, pytest.mark.lab]

NCCL_PIN, NCCL_NEW_PIN = NCCL_VERSIONS
NCCL_PACKAGES = ["libnccl2", "libnccl-dev"]
NEWEST_580 = stand_ins.DRIVER_RELEASES["580"][-1]
NEWEST_590 = stand_ins.DRIVER_RELEASES["590"][-1]
DRIVER_580 = ["nvidia-open", "nvidia-kernel-common-580", "nvidia-dkms-580-open",
              "nvidia-utils-580", "nvidia-compute-utils-580", "nvidia-fabricmanager-580"]
DRIVER_590 = ["nvidia-open", "nvidia-kernel-common", "nvidia-dkms-open", "nvidia-utils",
              "nvidia-compute-utils", "nvidia-fabricmanager"]
CHECKS = ["driver", "gpus", "dkms", "fabric_manager", "persistence", "efa", "nccl", "torch"]

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
    find(1) walked 51,000 paths in 0.16 s of CPU where os.walk and lstat took 0.75 s, and the
    module looks 16 times. It runs in root, so that the prune patterns are relative: a `-path`
    pattern reads [ * ? in the root's own path as wildcards.
    """
    prune: list[str] = []
    for rel in UNTRACKED:
        prune += ["-path", f"./{rel}", "-prune", "-o"]
    out = subprocess.run(
        ["find", ".", "-mindepth", "1", *prune,
         "-printf", r"%P\0%y\0%m\0%U\0%G\0%s\0%T@\0%l\0"],
        cwd=root, stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout
    fields = out.decode("utf-8", "surrogateescape").split("\0")[:-1]
    state: dict[str, tuple] = {}
    for i in range(0, len(fields), 8):
        rel, kind, mode, uid, gid, size, mtime, target = fields[i:i + 8]
        state[rel] = (kind, int(mode, 8), int(uid), int(gid), int(size),
                      None if kind == "d" else mtime, target if kind == "l" else None)
    return state


def tree_diff(before: dict, after: dict) -> list[str]:
    return sorted({p for p in before.keys() | after.keys() if before.get(p) != after.get(p)})


def package_versions(node) -> dict[str, str]:
    """The installed packages (removed ones keep a dpkg record with an empty status)."""
    out = node.ssh("dpkg-query", "--showformat=${Package} ${db:Status-Status} ${Version}\\n",
                   "--show").stdout
    return {name: version for name, status, version in
            (line.split(" ", 2) for line in out.splitlines() if line) if status == "installed"}


def check_results(run) -> list[tuple[str, list[dict]]]:
    """Every run of the node checks in a `launch setup` run: (role, results) in order."""
    return [(e["event_data"].get("role"), json.loads(e["event_data"]["res"]["stdout"])["checks"])
            for e in run.events() if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Run the node checks"]


def statuses(results: list[dict]) -> dict[str, str]:
    return {c["check"]: c["status"] for c in results}


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
    # The hang watch's stack reader, beside the interpreter where launch_node/node_probe.py looks.
    assert node.ssh("/opt/launch/venv/bin/py-spy", "--version").stdout.split() == ["py-spy",
                                                                                  "0.3.14"]
    # The node checks ran at the end: nothing GPU or EFA to check on this node.
    (role, results), = check_results(first)
    assert role == "node_checks"
    assert statuses(results) == {**dict.fromkeys(CHECKS[:6], "n/a"), "nccl": "ok", "torch": "ok"}
    assert {c["check"]: c["evidence"] for c in results}["torch"] == "2.13.0+cpu (CPU build)"


def test_the_node_reaches_the_cluster_over_ssh_with_checked_host_keys(first, node):
    # mpirun's way between nodes: the cluster key from setup, the host key from known_hosts
    # (BatchMode refuses an unknown key instead of asking), no StrictHostKeyChecking=no.
    proc = node.ssh("ssh", "-o", "BatchMode=yes", node.address, "hostname")
    assert proc.stdout.strip() == "node0"
    config = node.ssh("cat", "/root/.ssh/config").stdout
    assert f"Host {node.address}" in config and "StrictHostKeyChecking yes" in config
    assert "StrictHostKeyChecking no" not in config
    known = node.ssh("cat", "/root/.ssh/known_hosts").stdout
    host_key = node.ssh("cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
    assert f"{node.address} ssh-ed25519 {host_key}" in known


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
    assert facts["nccl_package_version"] == NCCL_PIN and facts["nccl_version"] == "2.28.9"
    assert facts["efa_devices"] == 0 and facts["nccl_env"] == {}
    assert facts["efa"] == {"fi_info_devices": None, "libfabric_version": None,
                            "gpudirect_rdma": None}
    assert facts["nccl_tests_nccl"] is None
    assert facts["nccl_tests_bin"] is None
    assert facts["torch"] == {"python": "/opt/launch/venv/bin/python", "version": "2.13.0+cpu",
                              "cuda": None, "nccl": None}


def test_gpu_only_steps_skip_with_their_message(first, node):
    out = first.proc.stdout
    assert "No NVIDIA GPU on the PCI bus: skipping the NVIDIA driver" in out
    assert "No EFA device on the PCI bus: skipping the EFA installer" in out
    assert "(no NVIDIA GPU on this node): skipping the nccl-tests build" in out
    versions = package_versions(node)
    assert stand_ins.family_names() & versions.keys() == set()
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
    # apt-get unholds what it moves; the role holds it again. Another cluster name is another
    # cluster: it gets its own key pair for node-to-node SSH.
    assert run.changed_tasks() == [
        "node0: cluster_ssh : Authorise the cluster's public key",
        "node0: cluster_ssh : Create the cluster's SSH folder on this machine",
        "node0: cluster_ssh : Install the cluster's private key",
        "node0: cluster_ssh : Make the cluster key pair",
        "node0: nccl : Hold the NCCL packages at the pinned version",
        f"node0: nccl : Install NCCL {NCCL_NEW_PIN}",
        "node0: node_facts : Fetch the facts to the controller",
        "node0: node_facts : Keep the facts on the node",
    ]
    facts = json.loads((launch_setup.home / "clusters" / "lab" / "facts" / "node0.json").read_text())
    assert facts["nccl_package_version"] == NCCL_NEW_PIN


def test_a_node_that_must_have_gpus_fails_naming_host_task_and_reason(second, node, launch_setup):
    gpu_node = node.write_inventory(node.workdir / "gpu-missing.yml", nccl_version=NCCL_NEW_PIN,
                                    gpus=8)
    before = tree_state(node.root)
    run = launch_setup("-i", str(gpu_node), "--tags", "nvidia_driver")
    assert run.proc.returncode == 2, run.output
    assert run.summary()["node0"]["failed"] == 1
    assert ("node0 failed at 'launch_platform : Assert the node has the GPUs the inventory "
            "says':") in run.proc.stdout
    assert ("The inventory says node0 has gpus=8, but its PCI bus shows 0 NVIDIA GPU(s)"
            in run.proc.stdout)
    assert tree_diff(before, tree_state(node.root)) == []


@pytest.mark.parametrize("extra, says", [
    ({"nvidia_driver_flavour": "closed"},
     "node0: nvidia_driver_flavour is \"closed\"; it must be one of open, proprietary"),
    ({"python_env_packages_by_python": {"3.10": ["numpy==2.2.6"]}},
     "node0: python3 is Python 3.11, and launch setup has venv pins "
     "(python_env_packages_by_python) for Python 3.10, 3.11, 3.12 only. Nothing was changed."),
    ({"nccl_version": "2.29.7-1+cuda12.8"},
     "node0: nccl_version 2.29.7-1+cuda12.8 is not a 2.x.y-N+cuda13.0 build"),
])
def test_bad_input_stops_before_anything_changes(second, node, inventory, launch_setup,
                                                 tmp_path, extra, says):
    values = tmp_path / "bad.yml"
    values.write_text(json.dumps(extra))
    before = tree_state(node.root)
    run = launch_setup("-i", str(inventory), "-e", f"@{values}")
    assert run.proc.returncode == 2, run.output
    assert says in " ".join(run.proc.stdout.split()), run.proc.stdout
    assert "node0 failed at 'launch_platform : Assert" in run.proc.stdout
    assert run.changed_tasks() == []
    assert tree_diff(before, tree_state(node.root)) == []


# ---- the same node with GPUs, NVSwitches and EFA on its "bus" --------------------------------

# The roles that differ on a GPU node; the others were applied (and re-applied) above.
GPU_TAGS = "nvidia_driver,efa,node_checks"


@pytest.fixture(scope="module")
def gpu(second, node):
    """(inventory, extra-vars file) of the node as a 2-GPU NVSwitch node with one EFA device.

    launch_platform's PCI facts are overridden by extra vars (which outrank the facts it sets);
    the stand-in nvidia-smi and fi_info read the same GPUs and device from the node's files.
    nccl_tests is left out: its CUDA compiler and the GitHub tarball are out of reach here.
    """
    (node.root / "etc/nvidia-stub").mkdir(parents=True, exist_ok=True)
    (node.root / "etc/nvidia-stub/gpus").write_text(
        "NVIDIA A100-SXM4-40GB, 00000000:10:1C.0\nNVIDIA A100-SXM4-40GB, 00000000:10:1D.0\n")
    (node.root / "etc/efa-stub").mkdir(parents=True, exist_ok=True)
    (node.root / "etc/efa-stub/devices").write_text("rdmap16s27\n")
    bus = node.workdir / "p4d-bus.yml"
    bus.write_text(json.dumps({
        "launch_platform_nvidia_gpus": ["0000:10:1c.0", "0000:10:1d.0"],
        "launch_platform_nvswitches": ["0000:c0:00.0"],
        "launch_platform_efa_devices": ["0xefa1"]}))
    # Whatever NCCL the node has now (the pin-change test moves it): the GPU runs leave it be.
    nccl = package_versions(node)["libnccl2"]
    inv = node.write_inventory(node.workdir / "gpu.yml", nccl_version=nccl, gpus=2)
    return inv, bus


@pytest.fixture(scope="module")
def gpu_first(gpu, node, launch_setup):
    inv, bus = gpu
    before = package_versions(node)
    run = launch_setup("-i", str(inv), "-e", f"@{bus}", "--tags", GPU_TAGS)
    return run, before


@pytest.fixture(scope="module")
def gpu_second(gpu_first, gpu, launch_setup):
    inv, bus = gpu
    return launch_setup("-i", str(inv), "-e", f"@{bus}", "--tags", GPU_TAGS)


def _ok_tasks(run) -> list[str]:
    return [f"{e['event_data'].get('role')} : {e['event_data'].get('task')}" for e in run.events()
            if e.get("event") == "runner_on_ok" and e["event_data"]["res"].get("changed")]


def test_gpu_node_gets_headers_then_driver_and_fabric_manager_at_one_version(gpu_first, node):
    run, before = gpu_first
    assert run.proc.returncode == 0, run.output
    versions = package_versions(node)
    kernel = os.uname().release
    new = {p: versions[p] for p in versions.keys() - before.keys()}
    assert new == {**dict.fromkeys(DRIVER_580, NEWEST_580), "dkms": "3.0.10-8+deb12u1",
                   f"linux-headers-{kernel}": "1"}
    changed = _ok_tasks(run)
    headers = changed.index("nvidia_driver : Install the running kernel's headers")
    driver = changed.index(f"nvidia_driver : Install NVIDIA driver {NEWEST_580}")
    assert headers < driver
    # DKMS built the module for the running kernel with those headers.
    status = node.ssh("dkms", "status").stdout.strip()
    assert status == f"nvidia/{NEWEST_580.split('-')[0]}, {kernel}, x86_64: installed"
    held = set(node.ssh("apt-mark", "showhold").stdout.split())
    assert held == set(DRIVER_580) | set(NCCL_PACKAGES)
    pin = node.ssh("cat", "/etc/apt/preferences.d/launch-nvidia-driver").stdout
    assert "Pin: version 580.*" in pin and "Pin-Priority: 1001" in pin
    blacklist = node.ssh("cat", "/etc/apt/apt.conf.d/51launch-nvidia-driver").stdout
    assert "Unattended-Upgrade::Package-Blacklist" in blacklist and '"nvidia-";' in blacklist


def test_gpu_node_is_rebooted_into_the_driver_with_its_services_running(gpu_first, node):
    run, _ = gpu_first
    assert "launch_platform : Reboot the node" in _ok_tasks(run)
    assert node.ssh("cat", stand_ins.BOOT_ID).stdout.strip() != "first-boot"
    smi = node.ssh("nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader")
    assert smi.stdout.splitlines() == [f"{i}, NVIDIA A100-SXM4-40GB, {NEWEST_580.split('-')[0]}"
                                       for i in (0, 1)]
    for service in ("nvidia-fabricmanager", "nvidia-persistenced"):
        # Enabled (what started it at the reboot) and running now.
        assert node.ssh("sh", "-c", f"ls /etc/rc2.d/S*{service}").returncode == 0
        assert node.ssh("service", service, "status", check=False).returncode == 0, service
    # The driver's checks ran after the reboot, the EFA check after the installer, all at the end.
    runs = check_results(run)
    assert [[c["check"] for c in results] for _, results in runs] == [CHECKS[:5], ["efa"], CHECKS]
    assert statuses(runs[-1][1]) == dict.fromkeys(CHECKS, "ok"), runs[-1]
    evidence = {c["check"]: c["evidence"] for c in runs[-1][1]}
    assert evidence["gpus"] == "2 x NVIDIA A100-SXM4-40GB"
    assert evidence["fabric_manager"] == (f"{NEWEST_580} held, running, GPU fabric "
                                          "Completed/Success")
    assert evidence["driver"].startswith(f"{NEWEST_580.split('-')[0]} (open kernel modules")
    # No FI_EFA_USE_DEVICE_RDMA: libfabric decides by the device (forcing it aborts on devices
    # without RDMA read).
    env = node.ssh("cat", "/etc/launch/nccl.env").stdout.splitlines()
    assert [line for line in env if not line.startswith("#")] == [
        "FI_PROVIDER=efa",
        "FI_EFA_FORK_SAFE=1",
        "NCCL_NET_PLUGIN=ofi",
        "LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib",
    ]


def test_gpu_node_second_application_changes_nothing(gpu_second):
    assert gpu_second.proc.returncode == 0, gpu_second.output
    assert gpu_second.changed_tasks() == []
    assert gpu_second.summary()["node0"]["changed"] == 0


def test_gpu_node_check_mode_changes_nothing(gpu_second, gpu, node, launch_setup):
    inv, bus = gpu
    before = tree_state(node.root)
    run = launch_setup("-i", str(inv), "-e", f"@{bus}", "--tags", GPU_TAGS, "--check")
    assert run.proc.returncode == 0, run.output
    assert run.changed_tasks() == []
    assert tree_diff(before, tree_state(node.root)) == []


def _verify_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["host", "driver"])
    assert lines[header].split() == ["host", *CHECKS]
    rows = {}
    for line in lines[header + 1:]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def test_verify_prints_one_row_per_host_and_changes_nothing(gpu_second, gpu, node,
                                                           launch_setup):
    inv, bus = gpu
    before = tree_state(node.root)
    run = launch_setup("-i", str(inv), "-e", f"@{bus}", "--verify")
    assert run.proc.returncode == 0, run.output
    assert _verify_rows(run.proc.stdout) == {"node0": ["ok"] * len(CHECKS)}
    assert f"node0  efa             ok      fi_info -p efa: 1 device(s) = PCI bus" in run.proc.stdout
    assert tree_diff(before, tree_state(node.root)) == []
    saved = json.loads((run.run_dir / "verify.json").read_text())
    assert statuses(saved["checks"]["node0"]) == dict.fromkeys(CHECKS, "ok")


def test_a_driver_that_does_not_come_up_fails_setup_naming_host_check_and_evidence(
        gpu_second, gpu, node, launch_setup):
    inv, bus = gpu
    broken = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
    fail_file = node.root / "etc/nvidia-stub/fail"
    fail_file.write_text(broken + "\n")
    try:
        run = launch_setup("-i", str(inv), "-e", f"@{bus}", "--tags", "nvidia_driver")
        assert run.proc.returncode == 2, run.output
        assert "node0 failed at 'node_checks : Fail on the checks that failed':" in run.proc.stdout
        flat = " ".join(run.proc.stdout.split())
        assert f"node0 failed 4 check(s): driver: nvidia-smi: {broken}" in flat
        verify = launch_setup("-i", str(inv), "-e", f"@{bus}", "--verify")
        assert verify.proc.returncode == 1, verify.output
        assert _verify_rows(verify.proc.stdout) == {
            "node0": ["FAIL", "FAIL", "ok", "FAIL", "FAIL", "ok", "ok", "ok"]}
        assert f"node0  driver          FAIL    nvidia-smi: {broken}" in verify.proc.stdout
    finally:
        fail_file.unlink()


def test_a_branch_switch_moves_exactly_the_driver_family(gpu_second, gpu, node, launch_setup):
    inv, bus = gpu
    before = package_versions(node)
    switched = node.write_inventory(node.workdir / "gpu-590.yml", gpus=2,
                                    nccl_version=package_versions(node)["libnccl2"],
                                    nvidia_driver_branch="590")
    run = launch_setup("-i", str(switched), "-e", f"@{bus}", "--tags", "nvidia_driver")
    assert run.proc.returncode == 0, run.output
    after = package_versions(node)
    moved = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert moved == set(DRIVER_580) | set(DRIVER_590)
    assert {p: after[p] for p in DRIVER_590} == dict.fromkeys(DRIVER_590, NEWEST_590)
    assert set(node.ssh("apt-mark", "showhold").stdout.split()) == set(DRIVER_590) | set(NCCL_PACKAGES)
    # Rebooted into 590, fabric manager 590 running, the driver's checks passed.
    (_, results), = check_results(run)
    assert statuses(results) == dict.fromkeys(CHECKS[:5], "ok")
    smi = node.ssh("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").stdout
    assert smi.split() == [NEWEST_590.split("-")[0]] * 2
