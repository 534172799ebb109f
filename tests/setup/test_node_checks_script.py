"""The node_checks role's script, run as the role runs it, against programs that answer as they
do on a set-up 8-GPU NVSwitch node and on nodes with one thing wrong.

Fake `nvidia-smi`, `dpkg-query`, `dkms`, `systemctl`/`service` and `fi_info` print what the
real ones print (formats of nvidia-smi's CSV queries, dpkg-query's --showformat, DKMS 3's
status line, libfabric's fi_info); torch is a stand-in module of a CUDA build. The test node
(test_apply.py) runs the same script against the stand-in driver packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = (Path(__file__).resolve().parents[2]
          / "launcher/playbooks/roles/node_checks/files/check_node.py")
KERNEL = os.uname().release

SMI = """#!/bin/sh
[ -n "$SMI_FAIL" ] && { echo "$SMI_FAIL"; exit 9; }
case "$1" in
  --query-gpu=driver_version) for i in 0 1 2 3 4 5 6 7; do echo "$SMI_VERSION"; done ;;
  --query-gpu=index,name) for i in 0 1 2 3 4 5 6 7; do echo "$i, NVIDIA H100 80GB HBM3"; done ;;
  --query-gpu=fabric.state,fabric.status) for i in 0 1 2 3 4 5 6 7; do echo "$FABRIC"; done ;;
  --query-gpu=persistence_mode) for i in 0 1 2 3 4 5 6 7; do echo "Enabled"; done ;;
  *) exit 2 ;;
esac
"""

# ${db:Status-Want} ${db:Status-Status} ${Version}; the kernel module package for the flavour.
DPKG_QUERY = """#!/bin/sh
for last; do :; done
case "$*" in
  *nvidia-dkms\\*) printf 'nvidia-dkms-580-open installed\\n' ;;
  *nvidia-kernel-\\*dkms) echo "dpkg-query: no packages found matching $last" >&2; exit 1 ;;
  *--show\\ nvidia-open) printf 'hold installed %s' "$DRIVER_PKG" ;;
  *--show\\ nvidia-fabricmanager-580) printf 'hold installed %s' "$FM_PKG" ;;
  *--show\\ libnccl2) printf 'hold installed 2.29.7-1+cuda13.0' ;;
  *) exit 1 ;;
esac
"""

DKMS = """#!/bin/sh
[ "$1" = status ] && echo "nvidia/580.95.05, $DKMS_KERNEL, x86_64: installed"
"""

SERVICE = """#!/bin/sh
# systemctl is-active NAME | service NAME status
name=$2; [ "$1" = is-active ] || name=$1
case " $RUNNING " in *" $name "*) echo active; exit 0 ;; *) echo inactive; exit 3 ;; esac
"""

FI_INFO = """#!/bin/sh
for d in rdmap79s0 rdmap80s0 rdmap81s0 rdmap82s0; do
  printf 'provider: efa\\n    fabric: efa\\n    domain: %s-rdm\\n    version: 122.0\\n    type: FI_EP_RDM\\n    protocol: FI_PROTO_EFA\\n' "$d"
done
"""

TORCH = """__version__ = "2.13.0"
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def device_count():
        return 8
    class nccl:
        @staticmethod
        def version():
            return (2, 29, 7)
"""

EXPECT = {"instance_type": "p4d.24xlarge", "pci_gpus": "8", "gpus": "8", "nvswitch": "True",
          "driver_branch": "580", "driver_flavour": "open", "driver_package": "nvidia-open",
          "fabricmanager_package": "nvidia-fabricmanager-580",
          "fabricmanager_service": "nvidia-fabricmanager",
          "persistenced_service": "nvidia-persistenced", "pci_efa": "4", "efa": "4",
          "gdr": "False", "nccl_package": "libnccl2", "nccl_version": "2.29.7-1+cuda13.0",
          "nccl_tests_bin": "/nonexistent", "torch_version": "2.13.0", "torch_cuda": "13.0"}


def check(tmp_path: Path, **env: str) -> dict[str, tuple[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nvidia-smi", SMI), ("dpkg-query", DPKG_QUERY), ("dkms", DKMS),
                       ("systemctl", SERVICE), ("service", SERVICE), ("fi_info", FI_INFO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(TORCH)
    expect = {**EXPECT, "fi_info": str(bin_dir / "fi_info"), "python": sys.executable,
              "gdr": env.pop("LAUNCH_CHECK_EXPECT_GDR", EXPECT["gdr"])}
    values = {"SMI_VERSION": "580.95.05", "DRIVER_PKG": "580.95.05-1", "FM_PKG": "580.95.05-1",
              "FABRIC": "Completed, Success", "DKMS_KERNEL": KERNEL,
              "RUNNING": "nvidia-fabricmanager nvidia-persistenced", "SMI_FAIL": "", **env}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=True,
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             "PYTHONPATH": str(tmp_path), "LAUNCH_CHECK_EXPECT": json.dumps(expect), **values})
    return {c["check"]: (c["status"], c["evidence"]) for c in json.loads(proc.stdout)["checks"]}


def test_a_set_up_nvswitch_node_passes_every_check(tmp_path):
    assert check(tmp_path) == {
        "driver": ("ok", "580.95.05 (open kernel modules; nvidia-open 580.95.05-1)"),
        "gpus": ("ok", "8 x NVIDIA H100 80GB HBM3"),
        "dkms": ("ok", f"nvidia/580.95.05, {KERNEL}, x86_64: installed"),
        "fabric_manager": ("ok", "580.95.05-1 held, running, GPU fabric Completed/Success"),
        "persistence": ("ok", "nvidia-persistenced running, persistence mode Enabled on 8 GPU(s)"),
        "efa": ("ok", "fi_info -p efa: 4 device(s) = catalog p4d.24xlarge; "
                      "GPUDirect RDMA: no NVIDIA p2p provider"),
        "nccl": ("ok", "2.29.7-1+cuda13.0 held"),
        "torch": ("ok", "2.13.0 (CUDA 13.0, NCCL 2.29.7, sees 8 GPU(s))"),
    }


def test_a_driver_installed_but_not_rebooted_into_says_reboot(tmp_path):
    results = check(tmp_path, SMI_VERSION="580.82.07")
    assert results["driver"] == ("fail", "nvidia-open 580.95.05-1 is installed but 580.82.07 is "
                                         "loaded: reboot the node")


def test_a_driver_that_does_not_answer_fails_the_gpu_checks_with_its_words(tmp_path):
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    results = check(tmp_path, SMI_FAIL=said)
    for name in ("driver", "gpus", "persistence"):
        assert results[name] == ("fail", f"nvidia-smi: {said}")
    assert results["nccl"][0] == "ok" and results["torch"][0] == "ok"


def test_fabric_manager_problems_are_named(tmp_path):
    assert check(tmp_path, FM_PKG="580.82.07-1")["fabric_manager"] == (
        "fail", "fabric manager 580.82.07-1 differs from driver 580.95.05-1: they must match")
    assert check(tmp_path, RUNNING="nvidia-persistenced")["fabric_manager"] == (
        "fail", "nvidia-fabricmanager is not running (inactive)")
    assert check(tmp_path, FABRIC="In Progress, N/A")["fabric_manager"] == (
        "fail", "fabric state of the GPUs: In Progress/N/A (expected Completed/Success)")


def test_a_module_built_for_another_kernel_fails_dkms(tmp_path):
    status, evidence = check(tmp_path, DKMS_KERNEL="5.15.0-1000-aws")["dkms"]
    assert status == "fail"
    assert evidence.startswith(f"no nvidia module built for the running kernel {KERNEL}")


def test_gpudirect_rdma_is_required_where_the_instance_type_has_it(tmp_path):
    # This machine's EFA devices (none) show no NVIDIA p2p provider: on a p4d that is a failure.
    results = check(tmp_path, LAUNCH_CHECK_EXPECT_GDR="True")
    assert results["efa"] == ("fail", "fi_info -p efa: 4 device(s); p4d.24xlarge supports "
                                      "GPUDirect RDMA but no EFA device has NVIDIA's p2p provider "
                                      "(/sys/class/infiniband/*/device/p2p)")
