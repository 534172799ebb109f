#!/usr/bin/env python3
"""Print one JSON object that describes this node for `launch run` preflight and reports.

The node_facts role runs this with the system python3 (standard library only). Inputs come
from LAUNCH_FACTS_* environment variables so no value passes through a shell. An unchanged
node must print the same bytes on every run (no timestamps, sorted keys), or a second
`launch setup` would report a change. Every probe that cannot answer gives null, not an error:
a CPU node has no nvidia-smi and that is a fact too.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess

TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
try:
    info["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
except Exception:
    pass
print(json.dumps(info))
"""


def run(argv: list[str], timeout: float = 120) -> tuple[str | None, str | None]:
    """(stdout, None) on success, (None, why) otherwise."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if proc.returncode != 0:
        return None, (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
    return proc.stdout, None


def nvidia_facts() -> dict:
    facts = {"gpus": [], "driver_version": None, "cuda_driver_version": None,
             "topology": None, "nvidia_smi_error": None}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return facts
    out, err = run([smi, "--query-gpu=index,uuid,pci.bus_id,memory.total,driver_version,name",
                    "--format=csv,noheader,nounits"])
    if out is None:
        facts["nvidia_smi_error"] = err
        return facts
    for line in out.splitlines():
        if not line.strip():
            continue
        # name goes last: it is the only field that could hold a comma.
        index, uuid, bus_id, memory, driver, name = (f.strip() for f in line.split(",", 5))
        facts["gpus"].append({"index": int(index), "name": name, "uuid": uuid,
                              "pci_bus_id": bus_id, "memory_mib": int(float(memory))})
        facts["driver_version"] = driver
    out, _ = run([smi])
    match = re.search(r"CUDA Version:\s*([0-9.]+)", out or "")
    facts["cuda_driver_version"] = match.group(1) if match else None
    out, _ = run([smi, "topo", "-m"])
    facts["topology"] = out
    return facts


def cuda_toolkit_version(cuda_home: str) -> str | None:
    try:
        with open(os.path.join(cuda_home, "version.json"), encoding="utf-8") as fh:
            return json.load(fh)["cuda"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out, _ = run([os.path.join(cuda_home, "bin", "nvcc"), "--version"])
    match = re.search(r"release ([0-9.]+)", out or "")
    return match.group(1) if match else None


def nccl_facts(package: str) -> dict:
    out, _ = run(["dpkg-query", "--showformat=${db:Status-Status} ${Version}", "--show", package])
    if not out or not out.startswith("installed "):
        return {"nccl_package_version": None, "nccl_version": None}
    version = out.split()[-1]
    return {"nccl_package_version": version, "nccl_version": version.split("-")[0]}


def env_file(path: str) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return values
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def efa_facts(fi_info: str) -> dict:
    """What libfabric sees of the EFA devices, and whether GPUDirect RDMA works over them (an
    NVIDIA peer-to-peer provider on the EFA devices, what AWS's own EFA tests look at)."""
    facts = {"fi_info_devices": None, "libfabric_version": None, "gpudirect_rdma": None}
    if not os.path.exists(fi_info):
        return facts
    out, _ = run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"])
    facts["fi_info_devices"] = len(set(re.findall(r"^\s*domain:\s*(\S+)", out or "", re.M)))
    out, _ = run([fi_info, "--version"])
    match = re.search(r"^libfabric:\s*(\S+)", out or "", re.M)
    facts["libfabric_version"] = match.group(1) if match else None
    for path in sorted(glob.glob("/sys/class/infiniband/*/device/p2p")):
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if "NVIDIA" in text:
            facts["gpudirect_rdma"] = text.splitlines()[0]
    return facts


def linked_nccl(binary: str) -> str | None:
    """The NCCL release a binary loads (libnccl.so.2 -> libnccl.so.2.29.7): the system's, not the
    one torch's wheel bundles. The same text in collect_node_facts.py and check_node.py: each is
    shipped alone by ansible.builtin.script (tests/setup/test_node_scripts_agree.py)."""
    if not os.path.exists(binary):
        return None
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60,
                             check=False, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"libnccl\.so\.\d+ => (\S+)", out)
    if not match:
        return None
    real = os.path.basename(os.path.realpath(match.group(1)))
    found = re.search(r"\.so\.(\d+\.\d+\.\d+)$", real)
    return found.group(1) if found else real


def torch_facts(python: str) -> dict:
    out, err = run([python, "-c", TORCH_PROBE])
    if out is None:
        return {"python": python, "error": err}
    try:
        return {"python": python, **json.loads(out.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"python": python, "error": f"unexpected output: {out.strip()[:200]}"}


def os_name() -> str | None:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match.group(1) if match else None


def main() -> None:
    env = os.environ
    cuda_home = env.get("LAUNCH_FACTS_CUDA_HOME", "/usr/local/cuda")
    tests_bin = env.get("LAUNCH_FACTS_NCCL_TESTS_BIN", "/opt/launch/nccl-tests/bin")
    facts = {
        "host": env.get("LAUNCH_FACTS_HOST"),
        "hostname": platform.node(),
        "os": os_name(),
        "kernel": platform.release(),
        "architecture": platform.machine(),
        "pci_nvidia_gpus": int(env.get("LAUNCH_FACTS_PCI_GPUS", "0")),
        "efa_devices": int(env.get("LAUNCH_FACTS_EFA_DEVICES", "0")),
        **nvidia_facts(),
        "cuda_toolkit_version": cuda_toolkit_version(cuda_home),
        **nccl_facts(env.get("LAUNCH_FACTS_NCCL_PACKAGE", "libnccl2")),
        "nccl_env": env_file(env.get("LAUNCH_FACTS_ENV_FILE", "/etc/launch/nccl.env")),
        "nccl_tests_bin": tests_bin if os.path.exists(os.path.join(tests_bin, "all_reduce_perf")) else None,
        "nccl_tests_nccl": linked_nccl(os.path.join(tests_bin, "all_reduce_perf")),
        "efa": efa_facts(env.get("LAUNCH_FACTS_FI_INFO", "/opt/amazon/efa/bin/fi_info")),
        "torch": torch_facts(env.get("LAUNCH_FACTS_PYTHON", "python3")),
    }
    print(json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    main()
