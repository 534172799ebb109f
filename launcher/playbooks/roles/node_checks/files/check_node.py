#!/usr/bin/env python3
"""Read-only checks of one node: print {"checks": [{"check", "status", "evidence"}]} as JSON.

The node_checks role runs this with the system python3 (standard library only, Python 3.10 and
later). LAUNCH_CHECK_NAMES lists the checks to run, LAUNCH_CHECK_EXPECT (JSON) what the node
must have. A status is "ok", "fail" or "n/a" (the node has nothing to check: no GPU, no EFA);
the evidence says what was seen, so a failure can be acted on without logging in. Nothing here
changes the node.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": None, "devices": None}
try:
    info["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
except Exception:
    pass
if torch.version.cuda:
    try:
        info["devices"] = torch.cuda.device_count()
    except Exception:
        pass
print(json.dumps(info))
"""


def run(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """(exit code, stdout or else stderr); 127 when the program is missing."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not installed"
    except (OSError, subprocess.TimeoutExpired) as err:
        return 126, str(err)
    text = proc.stdout if proc.returncode == 0 else (proc.stderr.strip() or proc.stdout.strip())
    return proc.returncode, text.strip() if proc.returncode else text


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def package(name: str) -> tuple[str | None, bool]:
    """(installed version or None, held)."""
    rc, out = run(["dpkg-query", "--showformat=${db:Status-Want} ${db:Status-Status} ${Version}",
                   "--show", name])
    parts = out.split() if rc == 0 else []
    if len(parts) == 3 and parts[1] == "installed":
        return parts[2], parts[0] == "hold"
    return None, False


def upstream(version: str | None) -> str:
    """580.95.05-1 -> 580.95.05 (the Debian revision is the packager's, not NVIDIA's)."""
    return (version or "").split(":")[-1].rsplit("-", 1)[0]


def service_state(name: str) -> tuple[bool, str]:
    """Whether a service runs: systemd when it is the init system, else the SysV script."""
    if os.path.isdir("/run/systemd/system") and shutil.which("systemctl"):
        rc, out = run(["systemctl", "is-active", name])
        return rc == 0, first_line(out) or "inactive"
    if shutil.which("service") or os.path.exists("/usr/sbin/service"):
        rc, out = run(["service", name, "status"])
        return rc == 0, first_line(out) or ("running" if rc == 0 else "not running")
    return False, "no systemctl or service to ask"


def smi_query(fields: str) -> tuple[list[list[str]] | None, str]:
    """Rows of `nvidia-smi --query-gpu=FIELDS`, or None and why not."""
    rc, out = run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if rc != 0:
        return None, first_line(out) or f"nvidia-smi exited {rc}"
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    return rows, ""


class Checks:
    def __init__(self, expect: dict):
        self.expect = expect
        self.pci_gpus = int(expect.get("pci_gpus") or 0)
        self.gpus = int(expect.get("gpus") or 0)
        self.nvswitch = str(expect.get("nvswitch")).lower() == "true"

    def _no_gpu(self) -> tuple[str, str] | None:
        if self.pci_gpus == 0 and self.gpus == 0:
            return "n/a", "no NVIDIA GPU on the PCI bus"
        return None

    def driver(self) -> tuple[str, str]:
        if (skip := self._no_gpu()):
            return skip
        e = self.expect
        rows, why = smi_query("driver_version")
        if rows is None:
            return "fail", f"nvidia-smi: {why}"
        loaded = rows[0][0] if rows and rows[0] else ""
        branch = str(e.get("driver_branch"))
        if loaded.split(".")[0] != branch:
            return "fail", f"driver {loaded} is loaded, the pinned branch is {branch}"
        installed, _ = package(e.get("driver_package", ""))
        if installed and upstream(installed) != loaded:
            return "fail", (f"{e.get('driver_package')} {installed} is installed but {loaded} is "
                            "loaded: reboot the node")
        flavour = loaded_flavour()
        if flavour and flavour != e.get("driver_flavour"):
            return "fail", (f"{loaded} runs the {flavour} kernel modules, nvidia_driver_flavour "
                            f"is {e.get('driver_flavour')}")
        source = f"{e.get('driver_package')} {installed}" if installed else "not from apt"
        return "ok", f"{loaded} ({flavour or 'unknown'} kernel modules; {source})"

    def gpus_check(self) -> tuple[str, str]:
        if (skip := self._no_gpu()):
            return skip
        rows, why = smi_query("index,name")
        if rows is None:
            return "fail", f"nvidia-smi: {why}"
        names = sorted({row[-1] for row in rows})
        seen = f"{len(rows)} x {', '.join(names)}" if rows else "no GPU"
        if len(rows) != self.gpus:
            return "fail", f"nvidia-smi shows {seen}, expected {self.gpus}"
        return "ok", seen

    def dkms(self) -> tuple[str, str]:
        if (skip := self._no_gpu()):
            return skip
        kernel = os.uname().release
        rc, out = run(["dkms", "status"])
        lines = [line.strip() for line in out.splitlines()
                 if rc == 0 and line.strip().startswith("nvidia")]
        for line in lines:
            if kernel in line and line.endswith("installed"):
                return "ok", line
        rc_mod, mod = run(["modinfo", "-k", kernel, "-F", "filename", "nvidia"])
        if rc_mod == 0 and mod.strip():
            return "ok", f"nvidia module for {kernel} from a package: {first_line(mod)}"
        said = "; ".join(lines) or (out if rc else "no nvidia module")
        return "fail", f"no nvidia module built for the running kernel {kernel} (dkms status: {said})"

    def fabric_manager(self) -> tuple[str, str]:
        if (skip := self._no_gpu()):
            return skip
        if not self.nvswitch:
            return "n/a", "no NVSwitch"
        e = self.expect
        fm, held = package(e.get("fabricmanager_package", ""))
        driver, _ = package(e.get("driver_package", ""))
        if fm is None:
            return "fail", f"{e.get('fabricmanager_package')} is not installed"
        if driver and fm != driver:
            return "fail", f"fabric manager {fm} differs from driver {driver}: they must match"
        active, state = service_state(e.get("fabricmanager_service", ""))
        if not active:
            return "fail", f"{e.get('fabricmanager_service')} is not running ({state})"
        rows, why = smi_query("fabric.state,fabric.status")
        if rows is None:
            return "fail", f"nvidia-smi: {why}"
        states = sorted({"/".join(row) for row in rows})
        incomplete = [row for row in rows if row[0] not in ("Completed", "N/A")
                      or row[-1] not in ("Success", "N/A")]
        if incomplete:
            return "fail", f"fabric state of the GPUs: {', '.join(states)} (expected Completed/Success)"
        return "ok", f"{fm}{' held' if held else ''}, running, GPU fabric {', '.join(states)}"

    def persistence(self) -> tuple[str, str]:
        if (skip := self._no_gpu()):
            return skip
        service = self.expect.get("persistenced_service", "")
        active, state = service_state(service)
        rows, why = smi_query("persistence_mode")
        if rows is None:
            return "fail", f"nvidia-smi: {why}"
        modes = sorted({row[0] for row in rows})
        if not active or modes != ["Enabled"]:
            return "fail", (f"{service} {'runs' if active else 'is not running (' + state + ')'}, "
                            f"persistence mode {', '.join(modes) or 'unknown'}")
        return "ok", f"{service} running, persistence mode Enabled on {len(rows)} GPU(s)"

    def efa(self) -> tuple[str, str]:
        e = self.expect
        pci, expected = int(e.get("pci_efa") or 0), int(e.get("efa") or 0)
        if pci == 0 and expected == 0:
            return "n/a", "no EFA device"
        rc, out = run([e.get("fi_info") or "fi_info", "-p", "efa", "-t", "FI_EP_RDM"])
        domains = sorted(set(re.findall(r"^\s*domain:\s*(\S+)", out, re.M))) if rc == 0 else []
        where = f"catalog {e.get('instance_type')}" if e.get("instance_type") else "PCI bus"
        seen = f"fi_info -p efa: {len(domains)} device(s)" if rc == 0 else f"fi_info: {first_line(out)}"
        gdr = gpudirect_rdma()
        gdr_text = f"GPUDirect RDMA: {'yes (' + gdr + ')' if gdr else 'no NVIDIA p2p provider'}"
        if len(domains) != expected:
            return "fail", f"{seen}, expected {expected} ({where}); {gdr_text}"
        if str(e.get("gdr")).lower() == "true" and self.pci_gpus and not gdr:
            return "fail", (f"{seen}; {e.get('instance_type')} supports GPUDirect RDMA but no EFA "
                            "device has NVIDIA's p2p provider (/sys/class/infiniband/*/device/p2p)")
        return "ok", f"{seen} = {where}; {gdr_text}"

    def nccl(self) -> tuple[str, str]:
        e = self.expect
        version, held = package(e.get("nccl_package", "libnccl2"))
        if version is None:
            return "fail", f"{e.get('nccl_package')} is not installed"
        if version != e.get("nccl_version"):
            return "fail", f"{e.get('nccl_package')} {version}, pinned {e.get('nccl_version')}"
        links = linked_nccl(os.path.join(e.get("nccl_tests_bin") or "", "all_reduce_perf"))
        note = f"; nccl-tests link NCCL {links}" if links else ""
        return "ok", f"{version}{' held' if held else ' NOT held'}{note}"

    def torch(self) -> tuple[str, str]:
        e = self.expect
        python = e.get("python") or "python3"
        rc, out = run([python, "-c", TORCH_PROBE], timeout=300)
        if rc != 0:
            return "fail", f"{python} cannot import torch: {first_line(out.splitlines()[-1] if out else '')}"
        info = json.loads(out.strip().splitlines()[-1])
        pinned = e.get("torch_version") or ""
        if info["version"] != pinned:
            return "fail", f"torch {info['version']}, pinned {pinned}"
        want_cuda = e.get("torch_cuda") or None
        if want_cuda != info["cuda"]:
            return "fail", f"torch {info['version']} is built for CUDA {info['cuda']}, not {want_cuda}"
        build = f"CUDA {info['cuda']}" if info["cuda"] else "CPU build"
        nccl = f", NCCL {info['nccl']}" if info["nccl"] else ""
        if info["cuda"] and self.gpus and info["devices"] != self.gpus:
            return "fail", f"torch {info['version']} ({build}) sees {info['devices']} GPU(s), expected {self.gpus}"
        sees = f", sees {info['devices']} GPU(s)" if info["cuda"] and info["devices"] is not None else ""
        return "ok", f"{info['version']} ({build}{nccl}{sees})"


def loaded_flavour() -> str | None:
    """open or proprietary: the loaded module says it; else the installed kernel module package."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            return "open" if "Open Kernel Module" in fh.read() else "proprietary"
    except OSError:
        pass
    names = []
    # One pattern a call: dpkg-query fails (and prints only an error) when any finds nothing.
    # Ubuntu's names, then Debian's.
    for pattern in ("nvidia-dkms*", "nvidia-kernel-*dkms"):
        rc, out = run(["dpkg-query", "--showformat=${Package} ${db:Status-Status}\n", "--show",
                       pattern])
        if rc == 0:
            names += [line.split()[0] for line in out.splitlines() if line.endswith(" installed")]
    if not names:
        return None
    return "open" if any("open" in name for name in names) else "proprietary"


def gpudirect_rdma() -> str | None:
    """The EFA devices' peer-to-peer providers: NVIDIA's means GPUDirect RDMA works (what
    AWS's own EFA tests look at)."""
    for path in sorted(glob.glob("/sys/class/infiniband/*/device/p2p")):
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if "NVIDIA" in text:
            return first_line(text)
    return None


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


CHECKS = {"driver": Checks.driver, "gpus": Checks.gpus_check, "dkms": Checks.dkms,
          "fabric_manager": Checks.fabric_manager, "persistence": Checks.persistence,
          "efa": Checks.efa, "nccl": Checks.nccl, "torch": Checks.torch}


def main() -> None:
    expect = json.loads(os.environ.get("LAUNCH_CHECK_EXPECT") or "{}")
    names = [n for n in os.environ.get("LAUNCH_CHECK_NAMES", ",".join(CHECKS)).split(",") if n]
    checks = Checks(expect)
    results = []
    for name in names:
        if name not in CHECKS:
            results.append({"check": name, "status": "fail", "evidence": "unknown check"})
            continue
        try:
            status, evidence = CHECKS[name](checks)
        except Exception as err:  # noqa: BLE001 (one broken probe must not hide the others)
            status, evidence = "fail", f"{type(err).__name__}: {err}"
        results.append({"check": name, "status": status, "evidence": evidence})
    print(json.dumps({"checks": results}, sort_keys=True))


if __name__ == "__main__":
    main()
