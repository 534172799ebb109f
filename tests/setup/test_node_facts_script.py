"""The node_facts role's collector, run as the role runs it, against stand-in nvidia-smi output.

The integration tests cover a CPU node; here fake `nvidia-smi` and `dpkg-query` programs print
what they print on an 8x A100 node (formats from nvidia-smi 570 and dpkg), and the collector's
JSON is compared whole. torch is the real one of this interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = (Path(__file__).resolve().parents[2]
          / "launcher/playbooks/roles/node_facts/files/collect_node_facts.py")

TOPOLOGY = """\
\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV12\tPXB\t0-47\t0\t\tN/A
GPU1\tNV12\t X \tPXB\t0-47\t0\t\tN/A
NIC0\tPXB\tPXB\t X \t\t\t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: rdmap16s27
"""

FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*)
    echo "0, GPU-0f3c1a52-88a1-4b1e-9b53-1f4c8c2e0a10, 00000000:10:1C.0, 40960, 570.133.20, NVIDIA A100-SXM4-40GB"
    echo "1, GPU-7d2e9b41-02c4-4f0e-8a77-5b9e1d3c2f21, 00000000:10:1D.0, 40960, 570.133.20, NVIDIA A100-SXM4-40GB" ;;
  topo) cat "$FAKE_TOPOLOGY" ;;
  "") echo "| NVIDIA-SMI 570.133.20    Driver Version: 570.133.20    CUDA Version: 12.8     |" ;;
esac
"""

FAKE_DPKG_QUERY = """#!/bin/sh
case "$*" in
  *libnccl2*) printf 'installed 2.26.2-1+cuda12.8' ;;
  *) exit 1 ;;
esac
"""


def _tool(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)


def collect(tmp_path: Path, fakes: dict[str, str], **env: str) -> dict:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    for name, text in fakes.items():
        _tool(fake_bin, name, text)
    (tmp_path / "topology.txt").write_text(TOPOLOGY)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
             "FAKE_TOPOLOGY": str(tmp_path / "topology.txt"),
             "LAUNCH_FACTS_HOST": "gpu0", "LAUNCH_FACTS_PYTHON": sys.executable,
             "LAUNCH_FACTS_CUDA_HOME": str(tmp_path / "cuda"),
             "LAUNCH_FACTS_ENV_FILE": str(tmp_path / "nccl.env"),
             "LAUNCH_FACTS_NCCL_TESTS_BIN": str(tmp_path / "nccl-tests"),
             "LAUNCH_FACTS_PCI_GPUS": "2", "LAUNCH_FACTS_EFA_DEVICES": "4", **env},
        stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout)


def test_a_gpu_node_is_described_whole(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "version.json").write_text(
        json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.8.1"}}))
    (tmp_path / "nccl.env").write_text(
        "# written by launch setup\nFI_PROVIDER=efa\nFI_EFA_USE_DEVICE_RDMA=1\n\n")
    (tmp_path / "nccl-tests").mkdir()
    (tmp_path / "nccl-tests" / "all_reduce_perf").write_text("")
    facts = collect(tmp_path, {"nvidia-smi": FAKE_SMI, "dpkg-query": FAKE_DPKG_QUERY})
    for machine_specific in ("hostname", "os", "kernel", "architecture"):
        assert isinstance(facts.pop(machine_specific), str)
    assert facts == {
        "host": "gpu0",
        "pci_nvidia_gpus": 2,
        "efa_devices": 4,
        "gpus": [
            {"index": 0, "name": "NVIDIA A100-SXM4-40GB",
             "uuid": "GPU-0f3c1a52-88a1-4b1e-9b53-1f4c8c2e0a10", "pci_bus_id": "00000000:10:1C.0",
             "memory_mib": 40960},
            {"index": 1, "name": "NVIDIA A100-SXM4-40GB",
             "uuid": "GPU-7d2e9b41-02c4-4f0e-8a77-5b9e1d3c2f21", "pci_bus_id": "00000000:10:1D.0",
             "memory_mib": 40960},
        ],
        "driver_version": "570.133.20",
        "cuda_driver_version": "12.8",
        "nvidia_smi_error": None,
        "topology": TOPOLOGY,
        "cuda_toolkit_version": "12.8.1",
        "nccl_package_version": "2.26.2-1+cuda12.8",
        "nccl_version": "2.26.2",
        "nccl_env": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"},
        "nccl_tests_bin": str(tmp_path / "nccl-tests"),
        "torch": {"python": sys.executable, "version": torch.__version__,
                  "cuda": torch.version.cuda, "nccl": None},
    }


def test_a_driver_that_does_not_answer_is_recorded_not_fatal(tmp_path):
    broken = ("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate "
              "with the NVIDIA driver.' >&2\nexit 9\n")
    facts = collect(tmp_path, {"nvidia-smi": broken, "dpkg-query": "#!/bin/sh\nexit 1\n"},
                    LAUNCH_FACTS_PYTHON=str(tmp_path / "no-such-python"))
    assert facts["gpus"] == [] and facts["driver_version"] is None
    assert facts["nvidia_smi_error"].startswith("NVIDIA-SMI has failed")
    assert facts["nccl_version"] is None and facts["nccl_env"] == {}
    assert facts["torch"]["python"] == str(tmp_path / "no-such-python")
    assert "No such file" in facts["torch"]["error"]


def test_an_unchanged_node_gives_the_same_facts_every_run(tmp_path):
    # A second `launch setup` rewrites the node's facts file only if these differ.
    first = collect(tmp_path, {"nvidia-smi": FAKE_SMI, "dpkg-query": FAKE_DPKG_QUERY})
    assert collect(tmp_path, {"nvidia-smi": FAKE_SMI, "dpkg-query": FAKE_DPKG_QUERY}) == first
