"""What `launch check` asks every node, in one round trip: run with the node's own interpreter as
`python -c <this file> RUN_ROOT`, standard library only (Python 3.8+), never failing as a whole.

It collects raw outputs (nvidia-smi -q -x, nvlink -s, the kernel log's NVRM lines, fi_info -p
efa, the fabric manager's state) and facts (torch/CUDA/NCCL versions, memlock limit, addresses
and their interfaces, free disk under the run root), and prints them as one JSON line after
LAUNCH-CHECK. launch parses and judges them (launcher/check/health.py): the node only reports.
Each tool gets a time limit: a GPU that hangs nvidia-smi is itself the finding.
"""

import sys

# `python -c` puts the working directory first on sys.path: a stray timeit.py or json.py in the
# login folder would shadow the standard library (seen: /tmp/timeit.py broke torch's import).
sys.path[:] = [p for p in sys.path if p not in ("", ".")]

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

TOOL_TIMEOUT_S = 20
KEEP_LOG_LINES = 400


def run(argv, timeout=TOOL_TIMEOUT_S):
    """A tool's answer: exit code, output, or why it could not run."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout,
                              universal_newlines=True, errors="replace")
        return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-2000:]}
    except FileNotFoundError:
        return {"rc": 127, "stdout": "", "stderr": argv[0] + ": not installed"}
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": "%s did not answer in %d s" % (
            " ".join(argv), timeout)}
    except OSError as err:
        return {"rc": 126, "stdout": "", "stderr": "%s: %s" % (argv[0], err)}


def kernel_log():
    """The NVRM lines of this boot's kernel log: dmesg (the ring since boot), else journald's
    kernel log of this boot. Lines only, the rest stays on the node."""
    tried = []
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        answer = run(argv)
        if answer["rc"] == 0 and answer["stdout"].strip():
            lines = [line for line in answer["stdout"].splitlines() if "NVRM" in line]
            return {"source": " ".join(argv), "lines": lines[-KEEP_LOG_LINES:],
                    "total_lines": len(answer["stdout"].splitlines())}
        why = (answer["stderr"] or answer["stdout"] or "no output").strip().splitlines()
        tried.append("%s: %s" % (argv[0], why[0] if why else "exit %s" % answer["rc"]))
    return {"source": None, "lines": [], "error": "; ".join(tried)}


def interfaces():
    """address -> interface, and per interface its state, MTU and speed."""
    out = {"addresses": {}, "interfaces": {}}
    answer = run(["ip", "-o", "addr", "show"])
    for line in answer["stdout"].splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] in ("inet", "inet6"):
            name = parts[1].split("@")[0]
            out["addresses"][parts[3].split("/")[0]] = name
            info = out["interfaces"].setdefault(name, {})
            for key in ("operstate", "mtu", "speed"):
                try:
                    with open("/sys/class/net/%s/%s" % (name, key)) as f:
                        info[key] = f.read().strip()
                except OSError:
                    info[key] = None
    if answer["rc"] != 0:
        out["error"] = answer["stderr"].strip()
    return out


def efa_sysfs():
    """EFA devices as the kernel sees them: /sys/class/infiniband/* bound to the efa driver."""
    found = []
    root = "/sys/class/infiniband"
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        try:
            driver = os.path.basename(os.readlink(os.path.join(root, name, "device", "driver")))
        except OSError:
            continue
        if driver == "efa":
            found.append(name)
    return found


def nvswitches():
    try:
        return len(os.listdir("/proc/driver/nvidia-nvswitch/devices"))
    except OSError:
        return 0


def torch_facts():
    facts = {}
    try:
        import torch
    except Exception as err:  # noqa: BLE001 (a broken install is a finding, not a crash)
        return {"error": "%s: %s" % (type(err).__name__, err)}
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    try:
        facts["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:  # noqa: BLE001
        facts["gpus"] = 0
        facts["cuda_error"] = str(err)
    try:
        version = torch.cuda.nccl.version()
        facts["nccl"] = ".".join(str(v) for v in version) if isinstance(version, tuple) \
            else str(version)
    except Exception:  # noqa: BLE001 (a CPU build has no NCCL)
        facts["nccl"] = None
    return facts


def disk(run_root):
    """Free space where run folders (and checkpoints) go; the root may not exist yet."""
    path = os.path.expanduser(run_root)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser("~"), path)
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        usage = shutil.disk_usage(probe)
        return {"path": path, "measured_at": probe, "free_bytes": usage.free,
                "total_bytes": usage.total}
    except OSError as err:
        return {"path": path, "error": str(err)}


def memlock():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    unlimited = resource.RLIM_INFINITY
    return {"soft": None if soft == unlimited else soft,
            "hard": None if hard == unlimited else hard}


def main():
    run_root = sys.argv[1] if len(sys.argv) > 1 else ".launch/runs"
    started = time.time()
    out = {"hostname": socket.gethostname(), "python": sys.executable,
           "python_version": "%d.%d.%d" % sys.version_info[:3], "cpus": os.cpu_count(),
           "kernel": os.uname().release}
    smi = run(["nvidia-smi", "-q", "-x"])
    out["nvidia_smi"] = smi
    if smi["rc"] == 0:
        out["nvlink"] = run(["nvidia-smi", "nvlink", "-s"])
        out["fabricmanager"] = run(["systemctl", "is-active", "nvidia-fabricmanager"])
    if smi["rc"] != 127 or os.path.exists("/proc/driver/nvidia"):
        # Also when nvidia-smi fails: a GPU that fell off the bus says so only here.
        out["kernel_log"] = kernel_log()
    out["nvswitches"] = nvswitches()
    out["fi_info"] = run(["fi_info", "-p", "efa"])
    out["efa_sysfs"] = efa_sysfs()
    out["memlock"] = memlock()
    out["net"] = interfaces()
    out["torch"] = torch_facts()
    out["disk"] = disk(run_root)
    out["probe_s"] = round(time.time() - started, 3)
    # Taken last, just before the answer leaves: launch compares it with its own clock when
    # the answer arrives (the clock check).
    out["time"] = time.time()
    sys.stdout.write("LAUNCH-CHECK " + json.dumps(out) + "\n")
    sys.stdout.flush()
    # Leave at once: torch's teardown at exit takes about a second, which would count against
    # this node's clock.
    os._exit(0)


main()
