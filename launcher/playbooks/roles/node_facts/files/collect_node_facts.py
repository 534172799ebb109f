#!/usr/bin/env python3
"""Print one JSON object that describes this node for `launch run` preflight and reports.

The node_facts role runs this with the system python3 (standard library only). Inputs come
from LAUNCH_FACTS_* environment variables so no value passes through a shell. An unchanged
node must print the same bytes on every run (no timestamps, sorted keys), or a second
`launch setup` would report a change. Every probe that cannot answer gives null, not an error:
a CPU node has no nvidia-smi and that is a fact too.
"""

from __future__ import annotations

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
        "torch": torch_facts(env.get("LAUNCH_FACTS_PYTHON", "python3")),
    }
    print(json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    main()
