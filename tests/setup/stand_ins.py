"""NVIDIA's driver packages, DKMS, kernel headers and a reboot, stood in for on the test node.

The stand-ins behave like the real parts where `launch setup` depends on it:
- The driver packages depend on each other as NVIDIA's do: a metapackage per flavour
  (nvidia-open, cuda-drivers) on the kernel module package, nvidia-smi's package and the
  persistence daemon's, all at exactly its version; fabric manager on the driver's kernel
  package at exactly its version, so apt refuses a fabric manager of another release. Up to 580
  the inner packages carry the branch in their names (nvidia-dkms-580-open), from 590 on they do
  not (nvidia-dkms-open), and the two namings conflict, as a branch switch on Ubuntu meets them.
- The kernel module package builds its module with DKMS in its postinst, which fails without
  the running kernel's headers, as DKMS does.
- Nothing is "loaded" until the node reboots: before that nvidia-smi cannot reach a driver, the
  fabric manager and persistence daemons refuse to start, and after a reboot into another
  release nvidia-smi reports the version mismatch. A reboot (REBOOT, run by Ansible's reboot
  module through launch_platform_reboot_command) loads what DKMS built for the running kernel
  and starts the services that are enabled (SysV links: the node runs no systemd).
- nvidia-smi reports the GPUs listed in /etc/nvidia-stub/gpus ("name, bus id" lines), the
  fabric state as Completed only while fabric manager runs, persistence mode only while the
  persistence daemon runs, and fails with the text of /etc/nvidia-stub/fail when that exists.
- fi_info (from the stand-in EFA installer) lists the devices named in /etc/efa-stub/devices.
"""

from __future__ import annotations

BOOT_ID = "/run/launch-test-boot-id"
REBOOT = "/usr/local/sbin/launch-test-reboot"
# Two releases of 580 (the newest is what a fresh install gets) and one of 590.
DRIVER_RELEASES = {"580": ["580.82.07-1", "580.95.05-1"], "590": ["590.44.01-1"]}


def upstream(version: str) -> str:
    return version.rsplit("-", 1)[0]


def names(branch: str) -> dict[str, str]:
    """The inner packages of a branch, named as NVIDIA names them for that branch."""
    s = f"-{branch}" if int(branch) < 590 else ""
    return {"common": f"nvidia-kernel-common{s}", "open": f"nvidia-dkms{s}-open",
            "proprietary": f"nvidia-dkms{s}", "utils": f"nvidia-utils{s}",
            "compute": f"nvidia-compute-utils{s}", "fabricmanager": f"nvidia-fabricmanager{s}"}


def family_names() -> set[str]:
    """Every package name of the stand-in driver family (all branches)."""
    return {n for b in DRIVER_RELEASES for n in names(b).values()} | {"nvidia-open", "cuda-drivers"}


DKMS = r"""#!/bin/sh
# Stand-in for DKMS (Debian's archive is out of the node's reach): a build needs the kernel's
# headers, as the real one's does, and `dkms status` lists what was built.
set -eu
state=/var/lib/dkms-stub
case "${1:-}" in
  status) cat "$state"/nvidia.status 2>/dev/null || true ;;
  install)
    module=$2 kernel=$4 flavour=$5
    if [ ! -e "/lib/modules/$kernel/build" ]; then
      echo "Error! Your kernel headers for kernel $kernel cannot be found at /lib/modules/$kernel/build or /lib/modules/$kernel/source." >&2
      exit 1
    fi
    mkdir -p "$state"
    echo "$module, $kernel, $(uname -m): installed" > "$state/nvidia.status"
    echo "${module#*/} $flavour" > "$state/nvidia.built" ;;
  remove) rm -f "$state/nvidia.status" "$state/nvidia.built" ;;
  *) echo "stand-in dkms: unsupported: $*" >&2; exit 2 ;;
esac
"""

DKMS_POSTINST = """#!/bin/sh
set -e
[ "$1" = configure ] || exit 0
dkms install nvidia/{upstream} -k "$(uname -r)" {flavour}
"""

DKMS_PRERM = """#!/bin/sh
set -e
dkms remove nvidia/{upstream} --all || true
"""

NVIDIA_SMI = r'''#!/usr/bin/python3
"""Stand-in nvidia-smi of driver {upstream}: answers from the module loaded at the last reboot."""
import os, sys

VERSION = "{upstream}"

def die(text, code):
    print(text)
    sys.exit(code)

def running(service):
    try:
        with open(f"/run/stub-services/{{service}}.pid") as fh:
            os.kill(int(fh.read()), 0)
        return True
    except (OSError, ValueError):
        return False

if os.path.exists("/etc/nvidia-stub/fail"):
    die(open("/etc/nvidia-stub/fail").read().strip(), 9)
try:
    loaded = open("/run/nvidia-stub/loaded").read().split()[0]
except (OSError, IndexError):
    die("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
        "that the latest NVIDIA driver is installed and running.", 9)
if loaded != VERSION:
    die("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: "
        + VERSION, 18)
try:
    gpus = [line.split(",") for line in open("/etc/nvidia-stub/gpus") if line.strip()]
except OSError:
    gpus = []
if not gpus:
    die("No devices were found", 6)
fabric = running("nvidia-fabricmanager")
persistence = running("nvidia-persistenced")
rows = [{{"index": str(i), "name": name.strip(), "uuid": f"GPU-00000000-0000-0000-0000-00000000000{{i}}",
         "pci.bus_id": bus.strip(), "memory.total": "40960", "driver_version": VERSION,
         "fabric.state": "Completed" if fabric else "Not Started",
         "fabric.status": "Success" if fabric else "N/A",
         "persistence_mode": "Enabled" if persistence else "Disabled"}}
        for i, (name, bus) in enumerate(gpus)]
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query:
    for row in rows:
        print(", ".join(row[field] for field in query.split(",")))
elif args[:1] == ["topo"]:
    print("\t" + "\t".join(f"GPU{{r['index']}}" for r in rows))
    for r in rows:
        print(f"GPU{{r['index']}}\t" + "\t".join(" X " if o is r else "NV12" for o in rows))
elif not args:
    print(f"| NVIDIA-SMI {{VERSION}}    Driver Version: {{VERSION}}    CUDA Version: 13.0     |")
else:
    die(f"stand-in nvidia-smi: unsupported arguments {{args}}", 2)
'''

# An init script per daemon: the node has no systemd, so the service module drives these (the
# packages also carry the systemd units real nodes use).
INIT_SCRIPT = r"""#!/bin/sh
### BEGIN INIT INFO
# Provides:          {service}
# Required-Start:    $remote_fs
# Required-Stop:     $remote_fs
# Default-Start:     2 3 4 5
# Default-Stop:      0 1 6
# Short-Description: stand-in {service} {upstream}
### END INIT INFO
pidfile=/run/stub-services/{service}.pid
case "$1" in
  start)
    start-stop-daemon --status --pidfile "$pidfile" && exit 0
    loaded=$(cut -d' ' -f1 /run/nvidia-stub/loaded 2>/dev/null || true)
    if [ "$loaded" != "{upstream}" ]; then
      echo "{service} {upstream}: the NVIDIA driver {upstream} is not loaded (loaded: ${{loaded:-none}})" >&2
      exit 1
    fi
    mkdir -p /run/stub-services
    start-stop-daemon --start --background --make-pidfile --pidfile "$pidfile" --startas {daemon} ;;
  stop) start-stop-daemon --stop --pidfile "$pidfile" --remove-pidfile --oknodo ;;
  status) start-stop-daemon --status --pidfile "$pidfile" ;;
  restart) "$0" stop; "$0" start ;;
  *) echo "Usage: $0 start|stop|status|restart" >&2; exit 3 ;;
esac
"""

SYSTEMD_UNIT = """[Unit]
Description=stand-in {service} {upstream}

[Service]
ExecStart={daemon}

[Install]
WantedBy=multi-user.target
"""

DAEMON = "#!/bin/sh\nexec sleep infinity\n"

# Lives on the node, not in a package: it is the machine.
REBOOT_SCRIPT = r"""#!/bin/sh
# What a reboot does to this stand-in node (its sshd stays up: the namespaces are the machine):
# the daemons stop, the module DKMS built for the running kernel is what loads, the boot id
# changes, and the services that are enabled start.
for script in /etc/init.d/nvidia-*; do
  [ -x "$script" ] && "$script" stop >/dev/null 2>&1 || true
done
mkdir -p /run/nvidia-stub
if [ -e /var/lib/dkms-stub/nvidia.built ]; then
  cp /var/lib/dkms-stub/nvidia.built /run/nvidia-stub/loaded
else
  rm -f /run/nvidia-stub/loaded
fi
cat /proc/sys/kernel/random/uuid > {boot_id}
for link in /etc/rc2.d/S*nvidia-*; do
  [ -e "$link" ] && "$link" start >/dev/null 2>&1 || true
done
exit 0
""".format(boot_id=BOOT_ID)

FI_INFO = r"""#!/bin/sh
# Stand-in fi_info: the EFA devices named in /etc/efa-stub/devices, as `fi_info -p efa -t
# FI_EP_RDM` lists them.
case "$*" in
  --version) printf 'fi_info: 2.1.0amzn3.0\nlibfabric: 2.1.0amzn3.0\nlibfabric api: 2.1\n'; exit 0 ;;
esac
[ -s /etc/efa-stub/devices ] || { echo "fi_getinfo: -61 (No data available)" >&2; exit 1; }
while read -r device; do
  [ -n "$device" ] || continue
  printf 'provider: efa\n    fabric: efa\n    domain: %s-rdm\n    version: 122.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n' "$device"
done < /etc/efa-stub/devices
"""


def driver_packages(branch: str, version: str) -> list[dict]:
    """The packages of one driver release: name, files, depends, conflicts, scripts."""
    up = upstream(version)
    own = names(branch)
    others = [names(b) for b in DRIVER_RELEASES if b != branch]

    def away(role: str) -> list[str]:
        return [o[role] for o in others]

    doc = lambda name: {f"/usr/share/doc/{name}/README": f"stand-in {name} {version}\n"}  # noqa: E731
    daemon_files = {}
    for role, service, daemon in (("compute", "nvidia-persistenced", "/usr/bin/nvidia-persistenced"),
                                  ("fabricmanager", "nvidia-fabricmanager", "/usr/bin/nv-fabricmanager")):
        fields = {"service": service, "upstream": up, "daemon": daemon}
        daemon_files[role] = {daemon: (DAEMON, 0o755),
                              f"/etc/init.d/{service}": (INIT_SCRIPT.format(**fields), 0o755),
                              f"/lib/systemd/system/{service}.service": SYSTEMD_UNIT.format(**fields)}
    packages = [
        {"name": own["common"], "files": doc(own["common"]), "conflicts": away("common")},
        {"name": own["utils"], "files": {"/usr/bin/nvidia-smi": (NVIDIA_SMI.format(upstream=up), 0o755)},
         "depends": [f"{own['common']} (= {version})"], "conflicts": away("utils")},
        {"name": own["compute"], "files": daemon_files["compute"],
         "depends": [f"{own['common']} (= {version})"], "conflicts": away("compute")},
        {"name": own["fabricmanager"], "files": daemon_files["fabricmanager"],
         "depends": [f"{own['common']} (= {version})"], "conflicts": away("fabricmanager")},
    ]
    for flavour in ("open", "proprietary"):
        other = "proprietary" if flavour == "open" else "open"
        packages.append({
            "name": own[flavour], "files": doc(own[flavour]),
            "depends": ["dkms", f"{own['common']} (= {version})"],
            "conflicts": [own[other]] + away("open") + away("proprietary"),
            "postinst": DKMS_POSTINST.format(upstream=up, flavour=flavour),
            "prerm": DKMS_PRERM.format(upstream=up)})
    for meta, flavour in (("nvidia-open", "open"), ("cuda-drivers", "proprietary")):
        packages.append({"name": meta, "files": doc(meta),
                         "depends": [f"{own[flavour]} (= {version})", f"{own['utils']} (= {version})",
                                     f"{own['compute']} (= {version})"]})
    return packages


def distro_packages(kernel: str) -> list[dict]:
    """What the node would get from its distribution's archive, which it cannot reach here."""
    return [
        {"name": "dkms", "version": "3.0.10-8+deb12u1", "arch": "all",
         "files": {"/usr/sbin/dkms": (DKMS, 0o755)}},
        {"name": f"linux-headers-{kernel}", "version": "1", "arch": "amd64",
         "files": {f"/usr/src/linux-headers-{kernel}/Makefile": "# stand-in kernel headers\n"},
         "links": {f"/lib/modules/{kernel}/build": f"/usr/src/linux-headers-{kernel}"}},
    ]
