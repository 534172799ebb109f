"""The node_facts role's collector, run as the role runs it, against stand-in nvidia-smi output.

The integration tests cover a CPU node; here fake `nvidia-smi`, `dpkg-query`, `fi_info` and
`ldd` programs print what they print on an A100 node with EFA (formats from nvidia-smi 570,
dpkg, libfabric's fi_info and glibc's ldd), and the collector's JSON is compared whole. torch is
a stand-in module of a CUDA build, so the test does not depend on which torch build this
machine has (a CUDA torch reports an NCCL version, a CPU one none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
  *libnccl2*) printf 'installed 2.29.7-1+cuda13.0' ;;
  *) exit 1 ;;
esac
"""

# `fi_info -p efa -t FI_EP_RDM` on a node with two EFA devices, and `fi_info --version`.
FAKE_FI_INFO = """#!/bin/sh
if [ "$1" = --version ]; then
  printf 'fi_info: 2.1.0amzn3.0\\nlibfabric: 2.1.0amzn3.0\\nlibfabric api: 2.1\\n'; exit 0
fi
for d in rdmap16s27 rdmap32s27; do
  printf 'provider: efa\\n    fabric: efa\\n    domain: %s-rdm\\n    version: 122.0\\n    type: FI_EP_RDM\\n    protocol: FI_PROTO_EFA\\n' "$d"
done
"""

FAKE_LDD = """#!/bin/sh
printf '\\tlinux-vdso.so.1 (0x00007ffc2a1f5000)\\n'
printf '\\tlibnccl.so.2 => %s (0x00007f3b6c000000)\\n' "$FAKE_NCCL"
printf '\\tlibcudart.so.13 => /usr/local/cuda-13.0/lib64/libcudart.so.13 (0x00007f3b6bc00000)\\n'
"""

# A CUDA build of torch as the probe sees it.
FAKE_TORCH = """__version__ = "2.13.0"


class version:
    cuda = "13.0"


class cuda:
    class nccl:
        @staticmethod
        def version():
            return (2, 29, 7)
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
    (tmp_path / "fake-torch" / "torch").mkdir(parents=True, exist_ok=True)
    (tmp_path / "fake-torch" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    nccl = tmp_path / "lib" / "libnccl.so.2.29.7"
    nccl.parent.mkdir(exist_ok=True)
    nccl.write_text("")
    if not (tmp_path / "lib" / "libnccl.so.2").exists():
        (tmp_path / "lib" / "libnccl.so.2").symlink_to("libnccl.so.2.29.7")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
             "FAKE_TOPOLOGY": str(tmp_path / "topology.txt"),
             "LAUNCH_FACTS_HOST": "gpu0", "LAUNCH_FACTS_PYTHON": sys.executable,
             "LAUNCH_FACTS_CUDA_HOME": str(tmp_path / "cuda"),
             "LAUNCH_FACTS_ENV_FILE": str(tmp_path / "nccl.env"),
             "LAUNCH_FACTS_NCCL_TESTS_BIN": str(tmp_path / "nccl-tests"),
             "LAUNCH_FACTS_PCI_GPUS": "2", "LAUNCH_FACTS_EFA_DEVICES": "2",
             "LAUNCH_FACTS_FI_INFO": str(fake_bin / "fi_info"),
             "FAKE_NCCL": str(tmp_path / "lib" / "libnccl.so.2"),
             "PYTHONPATH": str(tmp_path / "fake-torch"), **env},
        stdin=subprocess.DEVNULL)
    return json.loads(proc.stdout)


def test_a_gpu_node_is_described_whole(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "version.json").write_text(
        json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.8.1"}}))
    (tmp_path / "nccl.env").write_text(
        "# written by launch setup\nFI_PROVIDER=efa\nFI_EFA_FORK_SAFE=1\n\n")
    (tmp_path / "nccl-tests").mkdir()
    (tmp_path / "nccl-tests" / "all_reduce_perf").write_text("")
    facts = collect(tmp_path, {"nvidia-smi": FAKE_SMI, "dpkg-query": FAKE_DPKG_QUERY,
                               "fi_info": FAKE_FI_INFO, "ldd": FAKE_LDD})
    for machine_specific in ("hostname", "os", "kernel", "architecture"):
        assert isinstance(facts.pop(machine_specific), str)
    assert facts == {
        "host": "gpu0",
        "pci_nvidia_gpus": 2,
        "efa_devices": 2,
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
        "nccl_package_version": "2.29.7-1+cuda13.0",
        "nccl_version": "2.29.7",
        "nccl_env": {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"},
        "nccl_tests_bin": str(tmp_path / "nccl-tests"),
        "nccl_tests_nccl": "2.29.7",
        # This machine has no EFA p2p provider: GPUDirect RDMA is not seen.
        "efa": {"fi_info_devices": 2, "libfabric_version": "2.1.0amzn3.0",
                "gpudirect_rdma": None},
        "torch": {"python": sys.executable, "version": "2.13.0", "cuda": "13.0",
                  "nccl": "2.29.7"},
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
