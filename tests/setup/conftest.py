"""A real node for `launch setup`: a fresh Debian 12 root reached over SSH, and a stand-in for
NVIDIA's package repository.

- The root is made once by debootstrap and cached as a tarball under $LAUNCH_TEST_CACHE
  (default /var/cache/launch-tests), keyed by what goes into it; each node extracts a fresh copy.
- Each node runs its own sshd inside that copy (chroot) in new mount, PID and UTS namespaces,
  inside a network namespace joined to this machine by a veth pair. Ansible reaches it over
  SSH at the veth address, like a cloud instance. Killing the namespace's first process ends
  every process in it and drops every mount it made, so teardown cannot leave a bind mount of
  /dev behind, even after a failed test.
- The repository is signed with a key made for the session and served over HTTP from this
  machine's end of the veth pair. It holds packages with the real names (cuda-keyring,
  libnccl2, libnccl-dev at two versions each; the NVIDIA driver's family for branches 580 and
  590, which stand_ins.py describes) and the two the driver needs from the distribution's
  archive (dkms, the running kernel's headers). The same server hands out a stand-in AWS EFA
  installer that records its version, lays out the libraries as AWS's does and brings fi_info.
- torch comes from a wheel directory (pip download, cached) bind-mounted read-only into the root.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import http.server
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from launcher.lab import netns
from tests.conftest import remove_later
from tests.setup import stand_ins

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LAUNCH_TEST_CACHE", "/var/cache/launch-tests"))
DEBIAN_MIRROR = os.environ.get("LAUNCH_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a fresh Ubuntu cloud image has that Debian's minbase lacks, sshd for the connection, and
# the Debian packages python_env installs (the node cannot reach Debian's mirror).
ROOT_PACKAGES = ["python3", "python3-apt", "python3-venv", "python3-packaging", "openssh-server",
                 "sudo", "gnupg", "ca-certificates"]
PYTHON_ENV_DEFAULTS = REPO / "launcher/playbooks/roles/python_env/defaults/main.yml"
# The node's torch: the CPU build of the version the controller uses, and what train/ needs at
# the role's pins for the node's Python (bookworm: 3.11), launch's tools (py-spy) and what a
# detached run's controller imports.
TORCH_VERSION = "2.13.0+cpu"
_PYTHON_ENV = yaml.safe_load(PYTHON_ENV_DEFAULTS.read_text())
NODE_PINS = [*_PYTHON_ENV["python_env_packages_by_python"]["3.11"],
             *_PYTHON_ENV["python_env_tools"], *_PYTHON_ENV["python_env_controller_packages"]]
WHEELS = [f"torch=={TORCH_VERSION}", *NODE_PINS]
# Two versions of each stand-in package: the first is the test's pin, the second the pin change.
NCCL_VERSIONS = ["2.28.9-1+cuda13.0", "2.29.7-1+cuda13.0"]
KEYRING_VERSIONS = ["1.0-1", "1.1-1"]
EFA_VERSION = "1.43.2"          # the efa role's pin
NS_PREFIX = "launch-setup-"
WHEEL_MOUNT = "/srv/wheels"


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """subprocess.run, captured; a failure shows what the program said (debootstrap in CI)."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    proc = subprocess.run(argv, **kw)
    if check and proc.returncode != 0:
        said = "\n".join(str(x)[-3000:] for x in (proc.stdout, proc.stderr) if x)
        raise RuntimeError(f"{shlex.join(argv)} exited {proc.returncode}:\n{said}")
    return proc


def _lab_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, chroot, debootstrap)"
    if platform.machine() != "x86_64":
        return "the node's torch wheel is for x86_64"
    for tool in ("debootstrap", "ip", "unshare", "sshd", "ssh", "dpkg-deb", "apt-ftparchive", "gpg"):
        if not shutil.which(tool) and not Path("/usr/sbin", tool).exists():
            return f"{tool} is missing (scripts/test installs it)"
    return None


def _locked_build(target: Path, build) -> Path:
    """Build `target` once across concurrent sessions: build into a temporary name, rename."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_name(target.name + ".partial")
            if partial.is_dir():
                shutil.rmtree(partial)
            elif partial.exists():
                partial.unlink()
            build(partial)
            partial.rename(target)
    return target


# ---- the cached root and wheels -------------------------------------------------------------

@pytest.fixture(scope="session")
def lab_ready():
    why = _lab_missing()
    if why and os.environ.get("CI"):
        # CI runs scripts/test as root, which installs every tool: a gap there is a bug.
        pytest.fail(f"setup lab: {why}")
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def root_tarball(lab_ready) -> Path:
    key = hashlib.sha256(json.dumps(["bookworm", "minbase", sorted(ROOT_PACKAGES)]).encode())
    target = CACHE / f"debian12-root-{key.hexdigest()[:16]}.tar"

    def build(partial: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="launch-debootstrap-") as tmp:
            root = Path(tmp) / "root"
            # Debian 12 is what NVIDIA serves besides Ubuntu; minbase plus what a cloud image has.
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}",
                  "bookworm", str(root), DEBIAN_MIRROR], timeout=1800)
            # Uncompressed: extracting it per node takes a second or two.
            _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
                 timeout=600)

    return _locked_build(target, build)


@pytest.fixture(scope="session")
def wheelhouse(lab_ready) -> Path:
    key = hashlib.sha256(json.dumps(WHEELS).encode()).hexdigest()[:16]

    def build(partial: Path) -> None:
        # The controller's pip is Python 3.11 on x86_64 like the node's bookworm python3, so
        # what it downloads installs there; its configured find-links provide the CPU torch.
        _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
              "--only-binary=:all:", "-d", str(partial), *WHEELS], timeout=1800)

    return _locked_build(CACHE / f"wheels-{key}", build)


# ---- the network: one namespace, one veth pair ----------------------------------------------

@dataclass
class Lab:
    netns: str
    host_if: str
    host_ip: str
    node_ip: str
    second_node_ip: str  # a second node in the same namespace (node-to-node SSH)


def _remove_stale_namespaces() -> None:
    """Namespaces of sessions that were killed before their teardown (SIGKILL, power loss)."""
    names = _run(["ip", "netns", "list"], check=False).stdout.split()
    for name in names:
        if name.startswith(NS_PREFIX) and name[len(NS_PREFIX):].isdigit():
            if not Path(f"/proc/{name[len(NS_PREFIX):]}").exists():
                netns.remove_namespace(name)


@pytest.fixture(scope="session")
def lab(lab_ready):
    _remove_stale_namespaces()
    pid = os.getpid()
    # 10.251/16: outside the 10.200-249 range the SSH lab (launcher/lab/hosts.py) draws from.
    used = _run(["ip", "-o", "addr", "show"]).stdout
    third = next(n for n in [pid % 250 + 1, *range(1, 251)] if f" 10.251.{n}." not in used)
    lab = Lab(netns=f"{NS_PREFIX}{pid}", host_if=f"lsu{pid % 10**7}",
              host_ip=f"10.251.{third}.1", node_ip=f"10.251.{third}.2",
              second_node_ip=f"10.251.{third}.3")
    node_if = lab.host_if + "n"
    try:
        netns.add_namespace(lab.netns)
        _run(["ip", "link", "add", lab.host_if, "type", "veth", "peer", "name", node_if])
        _run(["ip", "link", "set", node_if, "netns", lab.netns])
        _run(["ip", "addr", "add", f"{lab.host_ip}/29", "dev", lab.host_if])
        _run(["ip", "link", "set", lab.host_if, "up"])
        for address in (lab.node_ip, lab.second_node_ip):
            _run(["ip", "-n", lab.netns, "addr", "add", f"{address}/29", "dev", node_if])
        _run(["ip", "-n", lab.netns, "link", "set", node_if, "up"])
        yield lab
    finally:
        netns.remove_namespace(lab.netns, [lab.host_if])


# ---- NVIDIA's repository and AWS's EFA installer, stood in for ---------------------------------

@dataclass
class VendorSite:
    base_url: str               # NVIDIA's repository: <base_url>/debian12/x86_64/
    efa_installer_url: str      # the efa role's URL template, for the stand-in installer
    gnupg_home: Path
    retired_key_file: Path      # a key to plant where NVIDIA's retired 2022 key would be
    retired_key_id: str


def _gpg(home: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return _run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback",
                 "--passphrase", "", *args], **kw)


def _new_key(home: Path, name: str) -> str:
    _gpg(home, "--quick-gen-key", name, "ed25519", "sign", "never")
    colons = _gpg(home, "--with-colons", "--list-keys", name).stdout
    return next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))


def _deb(out_dir: Path, name: str, version: str, arch: str, files: dict,
         depends: str = "", links: dict[str, str] | None = None, conflicts: list[str] = (),
         postinst: str = "", prerm: str = "") -> None:
    """A .deb; a file's content is text, bytes, or (text, mode)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        (tree / "DEBIAN").mkdir()
        control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
                   "Maintainer: launch tests <tests@launch.invalid>",
                   f"Description: stand-in for {name} (launch setup tests)"]
        if depends:
            control.append(f"Depends: {depends}")
        if conflicts:
            control += [f"Conflicts: {', '.join(conflicts)}", f"Replaces: {', '.join(conflicts)}"]
        (tree / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        for script, text in (("postinst", postinst), ("prerm", prerm)):
            if text:
                (tree / "DEBIAN" / script).write_text(text)
                (tree / "DEBIAN" / script).chmod(0o755)
        for path, content in files.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            content, mode = content if isinstance(content, tuple) else (content, 0o644)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
            target.chmod(mode)
        for path, target in (links or {}).items():
            (tree / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (tree / path.lstrip("/")).symlink_to(target)
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree),
              str(out_dir / f"{name}_{version}_{arch}.deb")])


def _build_repo(repo: Path, gnupg_home: Path, base_url: str) -> None:
    flat = repo / "debian12" / "x86_64"
    flat.mkdir(parents=True)
    keyring = (gnupg_home / "cuda-archive-keyring.gpg").read_bytes()
    source = (f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
              f"{base_url}/debian12/x86_64/ /\n")
    for version in KEYRING_VERSIONS:
        # Like NVIDIA's: the key, and the apt source for this distro and architecture.
        _deb(flat, "cuda-keyring", version, "all", {
            "/usr/share/keyrings/cuda-archive-keyring.gpg": keyring,
            "/etc/apt/sources.list.d/cuda-debian12-x86_64.list": source,
        })
    lib = "/usr/lib/x86_64-linux-gnu"
    for version in NCCL_VERSIONS:
        upstream = version.split("-")[0]
        major, minor, patch = upstream.split(".")
        _deb(flat, "libnccl2", version, "amd64",
             {f"{lib}/libnccl.so.{upstream}": f"stand-in NCCL {version}\n"},
             links={f"{lib}/libnccl.so.2": f"libnccl.so.{upstream}"})
        _deb(flat, "libnccl-dev", version, "amd64",
             {"/usr/include/nccl.h": f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n"
                                     f"#define NCCL_PATCH {patch}\n"},
             depends=f"libnccl2 (= {version})",
             links={f"{lib}/libnccl.so": "libnccl.so.2"})
    for branch, versions in stand_ins.DRIVER_RELEASES.items():
        for version in versions:
            for package in stand_ins.driver_packages(branch, version):
                _deb(flat, package["name"], version, "amd64", package["files"],
                     depends=", ".join(package.get("depends", [])),
                     conflicts=package.get("conflicts", []), postinst=package.get("postinst", ""),
                     prerm=package.get("prerm", ""))
    for package in stand_ins.distro_packages(platform.release()):
        _deb(flat, package["name"], package["version"], package["arch"], package["files"],
             links=package.get("links"))
    packages = _run(["apt-ftparchive", "packages", "."], cwd=flat).stdout
    (flat / "Packages").write_text(packages)
    _run(["gzip", "-9kn", "Packages"], cwd=flat)
    release = _run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=NVIDIA stand-in",
                    "release", "."], cwd=flat).stdout
    (flat / "Release").write_text(release)
    _gpg(gnupg_home, "--clearsign", "--digest-algo", "SHA256", "-o", str(flat / "InRelease"),
         str(flat / "Release"))
    _gpg(gnupg_home, "-abs", "--digest-algo", "SHA256", "-o", str(flat / "Release.gpg"),
         str(flat / "Release"))


# What the role relies on from AWS's installer: it runs with -y, writes its version where
# /opt/amazon/efa_installed_packages says, and leaves libfabric and aws-ofi-nccl under
# /opt/amazon (paths as the 1.4x installers lay them out).
EFA_INSTALLER = """#!/bin/sh
set -eu
[ "$1" = -y ] || { echo "stand-in EFA installer: expected -y" >&2; exit 2; }
mkdir -p /opt/amazon/efa/lib /opt/amazon/efa/bin /opt/amazon/ofi-nccl/lib
: > /opt/amazon/efa/lib/libfabric.so.1
: > /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so
cp fi_info /opt/amazon/efa/bin/fi_info
printf '# EFA installer version: %s\\n# Debug packages installed: no\\n' "$(cat VERSION)" \\
  > /opt/amazon/efa_installed_packages
"""


def _build_efa_installer(folder: Path, version: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "aws-efa-installer"
        tree.mkdir()
        (tree / "efa_installer.sh").write_text(EFA_INSTALLER)
        (tree / "efa_installer.sh").chmod(0o755)
        (tree / "VERSION").write_text(version)
        (tree / "fi_info").write_text(stand_ins.FI_INFO)
        (tree / "fi_info").chmod(0o755)
        folder.mkdir(parents=True, exist_ok=True)
        _run(["tar", "-C", tmp, "-czf", str(folder / f"aws-efa-installer-{version}.tar.gz"),
              "aws-efa-installer"])


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def vendor_site(lab, tmp_path_factory):
    work = tmp_path_factory.mktemp("nvidia-repo")
    gnupg_home = work / "gnupg"
    gnupg_home.mkdir(mode=0o700)
    handler = functools.partial(_QuietHandler, directory=str(work / "repo"))
    server = http.server.ThreadingHTTPServer((lab.host_ip, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        _new_key(gnupg_home, "launch test repository")
        (gnupg_home / "cuda-archive-keyring.gpg").write_bytes(
            _gpg(gnupg_home, "--export", "launch test repository", text=False).stdout)
        retired_id = _new_key(gnupg_home, "retired 2022 key stand-in")
        retired_file = gnupg_home / "retired.gpg"
        retired_file.write_bytes(
            _gpg(gnupg_home, "--export", "retired 2022 key stand-in", text=False).stdout)
        base_url = f"http://{lab.host_ip}:{server.server_address[1]}"
        _build_repo(work / "repo", gnupg_home, base_url)
        _build_efa_installer(work / "repo" / "efa", EFA_VERSION)
        thread.start()
        yield VendorSite(base_url,
                         base_url + "/efa/aws-efa-installer-{{ efa_installer_version }}.tar.gz",
                         gnupg_home, retired_file, retired_id)
    finally:
        if thread.is_alive():
            server.shutdown()
        server.server_close()
        # gpg started an agent for this home; it ends by its socket, not by name.
        _run(["gpgconf", "--homedir", str(gnupg_home), "--kill", "all"], check=False)


# ---- a node ------------------------------------------------------------------------------------

# Runs inside the new namespaces: mount what the node's programs need (gone when the namespace
# ends), then become sshd inside the root. Paths arrive as arguments, not in the script text.
NODE_INIT = r"""
set -eu
root=$1; wheels=$2; name=$3; address=$4
mount --make-rprivate /
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
mount --rbind /dev "$root/dev"
mkdir -p "$root/srv/wheels"
mount --bind -o ro "$wheels" "$root/srv/wheels"
hostname "$name"
exec chroot "$root" /usr/sbin/sshd -D -e -o ListenAddress="$address"
"""


@dataclass
class LabNode:
    name: str
    root: Path
    address: str
    key: Path
    known_hosts: Path
    repo: VendorSite
    log: Path
    process: subprocess.Popen | None = None
    workdir: Path = field(default=Path("."))

    def ssh(self, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run argv on the node over SSH, as a user checking the node would."""
        return _run(["ssh", "-i", str(self.key), "-o", "BatchMode=yes",
                     "-o", f"UserKnownHostsFile={self.known_hosts}",
                     "-o", "StrictHostKeyChecking=accept-new", f"root@{self.address}", "--",
                     shlex.join(argv)], check=check, timeout=timeout)

    def write_inventory(self, path: Path, **overrides) -> Path:
        """An inventory for this node: launch's keys plus role variables for the test repo."""
        hostvars = {
            "ansible_host": self.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts}",
            "gpus": 0,
            "launch_python": "/opt/launch/venv/bin/python",
            "launch_platform_nvidia_repo_base_url": self.repo.base_url,
            "cuda_keyring_retired_key_id": self.repo.retired_key_id,
            "efa_installer_url": self.repo.efa_installer_url,
            "nccl_version": NCCL_VERSIONS[0],
            "launch_platform_reboot_command": stand_ins.REBOOT,
            "launch_platform_boot_time_command": f"cat {stand_ins.BOOT_ID}",
            "python_env_torch_version": TORCH_VERSION,
            "python_env_pip_environment": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEEL_MOUNT},
        }
        hostvars.update(overrides)
        path.write_text(yaml.safe_dump({"all": {"hosts": {self.name: hostvars}}}, sort_keys=False))
        return path

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            # unshare --kill-child: its child, sshd as PID 1 of the namespace, dies with it, and
            # with PID 1 every process of the namespace; the mount namespace goes with them.
            self.process.kill()
            self.process.wait(timeout=30)


def _wait_for_port(address: str, port: int, process: subprocess.Popen, log: Path,
                   timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited {process.returncode}: {log.read_text()}")
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"sshd did not listen on {address}:{port}: {log.read_text()}")


def _prepare_root(root: Path, name: str, tarball: Path, public_key: str,
                  retired_key: Path) -> None:
    root.mkdir()
    _run(["tar", "--numeric-owner", "-xpf", str(tarball), "-C", str(root)], timeout=300)
    (root / "etc/hostname").write_text(f"{name}\n")
    with open(root / "etc/hosts", "a") as hosts:
        hosts.write(f"127.0.1.1 {name}\n")
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    (root / "root/.ssh/authorized_keys").write_text(public_key)
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    # Debian's mirror is out of reach from the node's namespace, as from many private subnets:
    # the only apt source is the one cuda-keyring adds.
    (root / "etc/apt/sources.list").write_text("")
    # Services must not start inside a chroot (Debian's convention for package installs there).
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    # Where a node imaged before April 2022 holds NVIDIA's old key (apt-key's legacy keyring).
    shutil.copy(retired_key, root / "etc/apt/trusted.gpg")
    # The node's reboot (stand_ins.py) and the boot id Ansible's reboot module watches.
    reboot = root / stand_ins.REBOOT.lstrip("/")
    reboot.parent.mkdir(parents=True, exist_ok=True)
    reboot.write_text(stand_ins.REBOOT_SCRIPT)
    reboot.chmod(0o755)
    (root / stand_ins.BOOT_ID.lstrip("/")).write_text("first-boot\n")


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory) -> Path:
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "launch-setup-tests",
          "-f", str(key)])
    return key


@pytest.fixture(scope="module")
def make_node(lab, vendor_site, root_tarball, wheelhouse, ssh_key, tmp_path_factory):
    """make_node(name) -> a running LabNode on a fresh root; one at a time per lab address."""
    started: list[LabNode] = []

    def make(name: str = "node0", second: bool = False) -> LabNode:
        """A node at the lab's node address, or (second=True) beside it at the second one."""
        address = lab.second_node_ip if second else lab.node_ip
        for node in started:
            if node.address == address:
                node.stop()
        work = tmp_path_factory.mktemp(name)
        node = LabNode(name=name, root=work / "root", address=address, key=ssh_key,
                        known_hosts=work / "known_hosts", repo=vendor_site,
                        log=work / "sshd.log", workdir=work)
        started.append(node)
        _prepare_root(node.root, name, root_tarball, ssh_key.with_suffix(".pub").read_text(),
                      vendor_site.retired_key_file)
        with open(node.log, "w") as log:
            node.process = subprocess.Popen(
                ["ip", "netns", "exec", lab.netns, "unshare", "--mount", "--pid", "--uts",
                 "--fork", "--kill-child", "sh", "-c", NODE_INIT, "node-init", str(node.root),
                 str(wheelhouse), name, address],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        _wait_for_port(node.address, 22, node.process, node.log)
        return node

    try:
        yield make
    finally:
        for node in started:
            node.stop()
        for node in started:
            # Our mount namespace never had the node's mounts: this removes only the copy.
            remove_later(node.root)


@dataclass
class SetupRun:
    """One `launch setup` run: its output and the ansible-runner folder it kept."""

    proc: subprocess.CompletedProcess
    run_dir: Path

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def events(self) -> list[dict]:
        folder = self.run_dir / "artifacts" / "ansible" / "job_events"
        # Files are named <counter>-<uuid>.json: ordered by the counter, not by name.
        events = [json.loads(p.read_text()) for p in folder.glob("*.json")]
        return sorted(events, key=lambda e: e["counter"])

    def changed_tasks(self) -> list[str]:
        return sorted(f"{e['event_data'].get('host')}: {e['event_data'].get('role')} : "
                      f"{e['event_data'].get('task')}"
                      for e in self.events()
                      if e.get("event") == "runner_on_ok" and e["event_data"]["res"].get("changed"))

    def summary(self) -> dict[str, dict[str, int]]:
        """host -> the counts of the summary table `launch setup` printed."""
        lines = self.proc.stdout.split("\nsummary:\n", 1)[1].splitlines()
        header = lines[0].split()
        rows = {}
        for line in lines[1:]:
            if not line.startswith("  ") or not line.strip():
                break
            cells = line.split()
            rows[cells[0]] = dict(zip(header[1:], map(int, cells[1:])))
        return rows


@pytest.fixture(scope="module")
def launch_setup(tmp_path_factory):
    """launch_setup(*args) -> SetupRun; every run of a module shares one LAUNCH_HOME."""
    home = tmp_path_factory.mktemp("launch-home")

    def run(*args: str, timeout: float = 900) -> SetupRun:
        before = set((home / "setup").glob("*")) if (home / "setup").exists() else set()
        proc = subprocess.run(
            [sys.executable, "-m", "launcher", "setup", *args], cwd=REPO,
            env={**os.environ, "LAUNCH_HOME": str(home)}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout)
        made = set((home / "setup").glob("*")) - before if (home / "setup").exists() else set()
        assert len(made) == 1, f"expected one run folder, got {made}:\n{proc.stdout}{proc.stderr}"
        return SetupRun(proc, made.pop())

    run.home = home
    return run
