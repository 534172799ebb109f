"""A lab cluster on one Linux box: N hosts as network namespaces on a bridge, each with its
own address and its own OpenSSH server, plus a key pair, known_hosts and an inventory.

Needs root, iproute2 and openssh-server. Used by the tests and `launch lab up/down`, for
anyone who wants to rehearse a multi-node run before paying for one. The hosts share this
machine's file system and processes; only the network is theirs (so `ip netns pids` tells
which processes run "on" a host). `cap` limits a host's link with tc (tbf) in both
directions, to make a communication-bound cluster.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.errors import LauncherError
from launcher.inventory import Node, write_inventory

SSHD = "/usr/sbin/sshd"


class LabError(LauncherError):
    pass


def lab_unavailable_reason() -> str | None:
    """Why a lab cannot be built here, or None (tests skip with this reason)."""
    if os.geteuid() != 0:
        return "the SSH lab needs root (network namespaces, veth, sshd)"
    if not shutil.which("ip"):
        return "the SSH lab needs iproute2 (`ip`): apt-get install iproute2"
    if not Path(SSHD).exists():
        return "the SSH lab needs Debian's openssh-server (/usr/sbin/sshd)"
    probe = subprocess.run(["ip", "netns", "add", "launch-probe-" + secrets.token_hex(3)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces are not available here: {probe.stderr.strip()}"
    name = probe.args[3]
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _free_subnet() -> ipaddress.IPv4Network:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}.0/24")
        if f" {net.network_address + 1}/" not in used and \
                not any(f" {net.network_address + 10 + i}/" in used for i in range(32)):
            return net
    raise LabError("no free 10.x.y.0/24 subnet for the lab")


@dataclass
class LabHost:
    name: str
    netns: str
    address: str
    veth: str            # root-namespace end, attached to the bridge
    sshd_pid: int = 0


@dataclass
class Lab:
    directory: str
    lab_id: str
    subnet: str
    bridge: str
    hosts: list[LabHost] = field(default_factory=list)

    # ---- paths -----------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    # ---- lifecycle ---------------------------------------------------------------------
    @classmethod
    def create(cls, directory: str | Path, hosts: int, cap: str | None = None,
               python: str | None = None) -> Lab:
        """Build the lab; on any failure, tear down what was made and raise."""
        reason = lab_unavailable_reason()
        if reason:
            raise LabError(reason)
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        lab_id = secrets.token_hex(2)
        net = _free_subnet()
        lab = cls(str(directory), lab_id, str(net), f"lab{lab_id}br")
        try:
            lab._build(hosts, net, cap, python or sys.executable)
        except BaseException:
            lab.destroy()
            raise
        return lab

    def _build(self, count: int, net: ipaddress.IPv4Network, cap: str | None,
               python: str) -> None:
        gateway = net.network_address + 1
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{gateway}/{net.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        self.save()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"launch-lab-{self.lab_id}",
             "-f", str(self.key))
        (self.dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        known = []
        for i in range(count):
            host = LabHost(name=f"host{i}", netns=f"lab{self.lab_id}h{i}",
                           address=str(net.network_address + 10 + i),
                           veth=f"lab{self.lab_id}v{i}")
            self.hosts.append(host)
            self.save()
            _run("ip", "netns", "add", host.netns)
            # The machine's DNS server is unreachable from the namespace, and every lookup
            # (c10d resolves each peer's name, sshd too) then waited for a resolver timeout:
            # runs took 26 s to pass rendezvous instead of a few. `ip netns exec` mounts this
            # file over /etc/resolv.conf for the host's sshd and all it starts: lookups fail
            # at once and fall back to addresses.
            etc = Path("/etc/netns") / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "resolv.conf").write_text("# launch lab: no DNS inside the lab\n"
                                             "nameserver 127.0.0.1\n")
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                 "netns", host.netns)
            _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
            ns = ("ip", "netns", "exec", host.netns)
            _run(*ns, "ip", "addr", "add", f"{host.address}/{net.prefixlen}", "dev", "eth0")
            _run(*ns, "ip", "link", "set", "eth0", "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            _run(*ns, "ip", "route", "add", "default", "via", str(gateway))
            if cap:
                self.cap(host.name, cap)
            known.append(self._start_sshd(host))
            self.save()
        self.known_hosts.write_text("".join(known))
        self._wait_for_sshd()
        write_inventory(
            self.inventory,
            [Node(name=h.name, address=h.address, private_address=h.address) for h in self.hosts],
            common={
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.key),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} "
                                           "-o StrictHostKeyChecking=yes",
                # The hosts share this machine's file system: the same interpreter works.
                "launch_python": python,
                "launch_interface": "eth0",
                # Run folders inside the lab folder: removing the lab removes them too.
                "launch_run_root": str(self.dir / "node-runs"),
                "gpus": 0,
                # The hosts share this machine's cores; each reporting all of them would
                # make every node start one OpenMP thread per core and oversubscribe.
                "cpus": max(1, (os.cpu_count() or 1) // len(self.hosts)),
            },
            header=f"launch lab {self.lab_id}: {len(self.hosts)} hosts on {self.subnet} "
                   f"(bridge {self.bridge}); remove with `launch lab down --dir {self.dir}`",
        )

    def _start_sshd(self, host: LabHost) -> str:
        hdir = self.dir / host.name
        hdir.mkdir(exist_ok=True)
        host_key = hdir / "ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key))
        config = hdir / "sshd_config"
        config.write_text("\n".join([
            "Port 22",
            f"ListenAddress {host.address}",
            f"HostKey {host_key}",
            f"PidFile {hdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "Subsystem sftp internal-sftp",
            "PrintMotd no",
            # launch opens one session per node plus short ones for probes and signals.
            "MaxStartups 100:30:200",
            "MaxSessions 64",
            "",
        ]))
        log = open(hdir / "sshd.log", "ab")  # noqa: SIM115 (sshd keeps it open)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(config)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        host.sshd_pid = proc.pid
        public = Path(f"{host_key}.pub").read_text().split()
        return f"{host.address} {public[0]} {public[1]}\n"

    def _wait_for_sshd(self, timeout: float = 20.0) -> None:
        import socket

        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while True:
                try:
                    with socket.create_connection((host.address, 22), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        log = (self.dir / host.name / "sshd.log").read_text(errors="replace")
                        raise LabError(f"sshd on lab host {host.name} did not start: {log}")
                    time.sleep(0.1)

    def save(self) -> None:
        (self.dir / "lab.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> Lab:
        path = Path(directory) / "lab.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise LabError(f"{path}: not a lab folder ({err})") from None
        data["hosts"] = [LabHost(**h) for h in data["hosts"]]
        return cls(**data)

    def destroy(self) -> None:
        """Remove everything the lab made; safe to call twice and after a partial build."""
        for host in self.hosts:
            for pid in self.pids(host.name):
                # Whatever still runs in the host's namespace was started inside the lab.
                _kill(pid)
            if host.sshd_pid:
                _kill(host.sshd_pid)
            _run("ip", "netns", "del", host.netns, check=False)
            shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)
            _run("ip", "link", "del", host.veth, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- use ---------------------------------------------------------------------------
    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LabError(f"no lab host {name}; hosts are {[h.name for h in self.hosts]}")

    def pids(self, name: str) -> list[int]:
        """Processes whose network namespace is this host's: what runs 'on' the host."""
        out = _run("ip", "netns", "pids", self.host(name).netns, check=False).stdout
        return [int(p) for p in out.split()]

    def cap(self, name: str, rate: str, burst: str = "256kb", latency: str = "100ms") -> None:
        """Token-bucket limit on both directions of the host's link."""
        host = self.host(name)
        for prefix in ((), ("ip", "netns", "exec", host.netns)):
            dev = "eth0" if prefix else host.veth
            _run(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", latency)

    def uncap(self, name: str) -> None:
        host = self.host(name)
        for prefix in ((), ("ip", "netns", "exec", host.netns)):
            dev = "eth0" if prefix else host.veth
            _run(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def tx_bytes(self, name: str) -> int:
        """Bytes the host has sent on its link (its eth0 counter)."""
        host = self.host(name)
        out = _run("ip", "netns", "exec", host.netns, "cat",
                   "/sys/class/net/eth0/statistics/tx_bytes").stdout
        return int(out.strip())


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
