"""A lab cluster on one Linux box: N hosts as network namespaces on a bridge, each with its
own address and its own OpenSSH server, plus a key pair, known_hosts and an inventory.

Needs root, iproute2 and openssh-server. Used by the tests and `launch lab up/down`, for
anyone who wants to rehearse a multi-node run before paying for one. The hosts share this
machine's file system and processes; only the network is theirs (so `ip netns pids` tells
which processes run "on" a host). `cap` limits a host's link with tc (tbf) in both
directions, to make a communication-bound cluster.

`lose(host)` takes a host away as a machine goes (its link first, so no connection hears a
goodbye; then its processes and its namespace), and `replace_host(host)` brings a fresh host
in at its place in the inventory: with `LabFleet` they are what `launch run --recover` asks
of EC2 where a test cannot reach EC2 (docs/provision.md).

`private_workers=True` builds what `launch provision --public-ip head` makes on EC2: only the
head (host0) is on the bridge this machine can reach; every host, the head included, is on a
second bridge this machine has no address on. The inventory reaches the other hosts through the
head (ProxyCommand), and the ranks talk over the private network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.cluster.inventory import Node, write_inventory
from launcher.lab import netns
from launcher.lab.netns import LabError, run

SSHD = "/usr/sbin/sshd"


def lab_unavailable_reason() -> str | None:
    """Why a lab cannot be built here, or None (tests skip with this reason)."""
    if os.geteuid() != 0:
        return "the SSH lab needs root (network namespaces, veth, sshd)"
    if not shutil.which("ip"):
        return "the SSH lab needs iproute2 (`ip`): apt-get install iproute2"
    if not Path(SSHD).exists():
        return "the SSH lab needs Debian's openssh-server (/usr/sbin/sshd)"
    return netns.unavailable_reason()


def sshd_path(path: Path) -> str:
    """A path as one sshd_config argument: double-quoted, so a lab folder may hold spaces.
    sshd has no escape for a quote and expands %-tokens in AuthorizedKeysFile: refused."""
    text = str(path)
    bad = [c for c in ('"', "%", "\n", "\r") if c in text]
    if bad:
        raise LabError(f"{text}: a lab folder cannot hold {' or '.join(map(repr, bad))} "
                       "(sshd_config cannot say it); choose another --dir")
    return f'"{text}"'


@dataclass
class LabHost:
    name: str
    netns: str
    address: str         # where SSH reaches it (private_address when behind the head)
    veth: str            # root-namespace end of the link the ranks use, on a bridge
    sshd_pid: int = 0
    ifname: str = "eth0"              # that link's name inside the host
    private_address: str | None = None  # the rank address, when not `address`
    links: list[str] = field(default_factory=list)  # every root-side veth end, for removal

    @property
    def rank_address(self) -> str:
        return self.private_address or self.address


@dataclass
class Lab:
    directory: str
    lab_id: str
    subnet: str
    bridge: str
    hosts: list[LabHost] = field(default_factory=list)
    private_subnet: str | None = None   # private_workers: the network behind the head
    private_bridge: str | None = None
    python: str | None = None           # the hosts' interpreter (the inventory's launch_python)

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
               python: str | None = None, private_workers: bool = False) -> Lab:
        """Build the lab; on any failure, tear down what was made and raise."""
        reason = lab_unavailable_reason()
        if reason:
            raise LabError(reason)
        directory = Path(directory).resolve()
        sshd_path(directory)   # refused before anything is made
        directory.mkdir(parents=True, exist_ok=True)
        lab_id = secrets.token_hex(2)
        net = netns.free_subnet()
        lab = cls(str(directory), lab_id, str(net), f"lab{lab_id}br",
                  python=python or sys.executable)
        if private_workers:
            lab.private_subnet = str(netns.free_subnet(private=True))
            lab.private_bridge = f"lab{lab_id}pb"
        try:
            lab._build(hosts, net, cap, python or sys.executable)
        except BaseException:
            lab.destroy()
            raise
        return lab

    def _build(self, count: int, net: ipaddress.IPv4Network, cap: str | None,
               python: str) -> None:
        netns.add_bridge(self.bridge, net)
        private = ipaddress.ip_network(self.private_subnet) if self.private_subnet else None
        if self.private_bridge:
            # No address on this machine's side: it cannot reach the private network at all.
            netns.add_bridge(self.private_bridge, None)
        self.save()
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"launch-lab-{self.lab_id}",
             "-f", str(self.key))
        (self.dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        known = []
        for i in range(count):
            host = LabHost(name=f"host{i}", netns=f"lab{self.lab_id}h{i}",
                           address=netns.host_address(net, i), veth=f"lab{self.lab_id}v{i}")
            self.hosts.append(host)
            self.save()
            netns.add_namespace(host.netns)
            if private is None or i == 0:
                self._link(host, host.veth, "eth0", self.bridge, host.address, net.prefixlen)
                netns.add_default_route(host.netns, netns.gateway(net))
            if private is not None:
                assert self.private_bridge
                address = netns.host_address(private, i)
                link = f"lab{self.lab_id}q{i}"
                self._link(host, link, "priv0", self.private_bridge, address, private.prefixlen)
                host.private_address, host.ifname, host.veth = address, "priv0", link
                if i > 0:
                    host.address = address   # reached only through the head
            if cap:
                self.cap(host.name, cap)
            self.save()
        self._write_hosts_files()
        for host in self.hosts:
            known.append(self._start_sshd(host))
            self.save()
        self.known_hosts.write_text("".join(known))
        self._wait_for_sshd()
        self._write_inventory(python)

    def _link(self, host: LabHost, root_end: str, inside: str, bridge: str, address: str,
              prefixlen: int) -> None:
        # Listed before it is made: a failure half-way still leaves it to destroy().
        host.links.append(root_end)
        netns.add_link(host.netns, root_end, inside, bridge, address, prefixlen)

    def _write_inventory(self, python: str) -> None:
        # Imported here: launcher.cluster.ssh loads fabric and paramiko, which `launch --help` and the
        # other lab commands do not need.
        from launcher.cluster.ssh import proxy_command, ssh_common_args

        head = self.hosts[0]
        nodes = []
        for i, h in enumerate(self.hosts):
            extra = {}
            if self.private_bridge and i > 0:
                extra["ansible_ssh_common_args"] = ssh_common_args(
                    str(self.known_hosts),
                    proxy_command(head.address, user="root", key_file=str(self.key),
                                  known_hosts=str(self.known_hosts)))
            nodes.append(Node(name=h.name, address=h.address, private_address=h.rank_address,
                              extra=extra))
        behind = (f"; host1.. on {self.private_subnet} behind host0 (bridge "
                  f"{self.private_bridge})" if self.private_bridge else "")
        write_inventory(
            self.inventory, nodes,
            common={
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.key),
                "ansible_ssh_common_args": ssh_common_args(str(self.known_hosts)),
                # The hosts share this machine's file system: the same interpreter works.
                "launch_python": python,
                "launch_interface": head.ifname,
                # Run folders inside the lab folder: removing the lab removes them too.
                "launch_run_root": str(self.dir / "node-runs"),
                # Where the hosts come from: `launch run --recover` replaces a lost one here.
                "launch_lab": str(self.dir),
                # How a detached run's controller on the head reaches the other hosts (what
                # `launch setup`'s cluster_ssh role gives a real cluster): the lab's own key.
                "launch_cluster_key": str(self.key),
                "launch_cluster_known_hosts": str(self.known_hosts),
                "gpus": 0,
                # The hosts share this machine's cores; each reporting all of them would
                # make every node start one OpenMP thread per core and oversubscribe.
                "cpus": max(1, (os.cpu_count() or 1) // len(self.hosts)),
            },
            header=f"launch lab {self.lab_id}: {len(self.hosts)} hosts on {self.subnet} "
                   f"(bridge {self.bridge}){behind}; remove with `launch lab down --dir "
                   f"{self.dir}`",
        )

    def _write_hosts_files(self) -> None:
        """Every host's /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts over it for
        sshd and all it starts): this machine's, and every lab host's addresses, also in the
        v4-mapped IPv6 form. c10d's store looks up the name of each client that connects,
        which it sees as ::ffff:10.x.y.z: without an entry the lookup failed (the lab has no
        DNS) and every run printed "[c10d] The hostname of the client socket cannot be
        retrieved. err=-3" once per connection, 6 times in all. Written in place: a file
        mounted already shows a host added later (replace_host)."""
        try:
            own = Path("/etc/hosts").read_text()
        except OSError:
            own = "127.0.0.1 localhost\n"
        names = {}
        for h in self.hosts:
            for addr in dict.fromkeys([h.address, h.rank_address]):
                names.setdefault(addr, h.name)
        lines = [f"# launch lab {self.lab_id}: this machine's /etc/hosts, then the lab's hosts",
                 own.rstrip("\n"), *(f"{a} {n}" for a, n in names.items()),
                 *(f"::ffff:{a} {n}" for a, n in names.items())]
        for h in self.hosts:
            path = Path("/etc/netns") / h.netns / "hosts"
            if path.parent.is_dir():
                with open(path, "w") as f:   # in place: mounted copies see the change
                    f.write("\n".join(lines) + "\n")

    def _start_sshd(self, host: LabHost) -> str:
        hdir = self.dir / host.name
        hdir.mkdir(exist_ok=True)
        host_key = hdir / "ssh_host_ed25519_key"
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key))
        config = hdir / "sshd_config"
        config.write_text("\n".join([
            "Port 22",
            *(f"ListenAddress {a}" for a in dict.fromkeys([host.address, host.rank_address])),
            f"HostKey {sshd_path(host_key)}",
            f"PidFile {sshd_path(hdir / 'sshd.pid')}",
            f"AuthorizedKeysFile {sshd_path(self.dir / 'authorized_keys')}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "Subsystem sftp internal-sftp",
            "PrintMotd no",
            # "Starting session: ..." in sshd.log for every session (tests count them).
            "LogLevel VERBOSE",
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
        # Both addresses where they differ (a private worker): the run's controller on the head
        # reaches every node by its private one.
        names = ",".join(dict.fromkeys([host.address, host.rank_address]))
        return f"{names} {public[0]} {public[1]}\n"

    def _wait_for_sshd(self, timeout: float = 20.0, hosts: list[LabHost] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for host in hosts or self.hosts:
            while True:
                # Probed from inside the host: this machine cannot reach hosts behind the head.
                probe = run("ip", "netns", "exec", host.netns, "bash", "-c",
                            f"exec 3<>/dev/tcp/{host.address}/22", check=False)
                if probe.returncode == 0:
                    break
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
        try:
            data["hosts"] = [LabHost(**h) for h in data["hosts"]]
            return cls(**data)
        except (TypeError, KeyError) as err:
            raise LabError(f"{path}: not a lab this launch made ({err}); remove its network "
                           "namespaces with `ip netns` and the folder by hand") from None

    def destroy(self) -> None:
        """Remove everything the lab made; safe to call twice and after a partial build. The
        hosts lab.json lists count too: a replacement another Lab object brought in (the
        fleet of `launch run --recover` loads its own) is removed with the rest."""
        hosts = list(self.hosts)
        if (self.dir / "lab.json").exists():
            try:
                known = {h.netns for h in hosts}
                hosts += [h for h in Lab.load(self.dir).hosts if h.netns not in known]
            except LabError:
                pass
        for host in hosts:
            if host.sshd_pid:
                netns.kill(host.sshd_pid)
            netns.remove_namespace(host.netns, [host.veth, *host.links])
        netns.remove_links([self.bridge, *filter(None, [self.private_bridge])])
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- machines that go, and their replacements ------------------------------------
    def lose(self, name: str) -> None:
        """The host goes away as a machine does: its links first (no connection to it hears a
        goodbye: launch must notice by itself), then everything that ran on it, then its
        namespace. It stays in the lab's list until replace_host() takes its place."""
        host = self.host(name)
        netns.remove_links([host.veth, *host.links])
        for pid in self.pids(name):
            if _run_process(pid):
                netns.kill(pid)
        # The hosts share this machine's files: a login shell killed mid-start left a lock of
        # the machine's (pyenv's rehash lock) behind, and every later login waited 60 s on it.
        # What is not the run's may finish first.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and \
                any(not _is_sshd(pid) for pid in self.pids(name)):
            time.sleep(0.1)
        netns.kill(host.sshd_pid)
        netns.remove_namespace(host.netns)

    def is_lost(self, name: str) -> bool:
        return self.host(name).netns not in netns.namespaces()

    def replace_host(self, name: str) -> LabHost:
        """A fresh host (a new namespace, address and sshd, its key in known_hosts) in the
        place of `name` in the lab and its inventory, as a replacement instance takes a lost
        node's place in a cluster's inventory."""
        if self.private_bridge:
            raise LabError("replacing a host of a lab with private workers is not supported")
        lost = self.host(name)
        index = max(int(h.netns.rsplit("h", 1)[1]) for h in self.hosts) + 1
        net = ipaddress.ip_network(self.subnet)
        host = LabHost(name=f"host{index}", netns=f"lab{self.lab_id}h{index}",
                       address=netns.host_address(net, index), veth=f"lab{self.lab_id}v{index}")
        self.hosts[self.hosts.index(lost)] = host
        self.save()
        netns.add_namespace(host.netns)
        self._link(host, host.veth, "eth0", self.bridge, host.address, net.prefixlen)
        netns.add_default_route(host.netns, netns.gateway(net))
        self._write_hosts_files()
        with open(self.known_hosts, "a") as known:
            known.write(self._start_sshd(host))
        self.save()
        self._wait_for_sshd(hosts=[host])
        self._write_inventory(self.python or sys.executable)
        return host

    # ---- use ---------------------------------------------------------------------------
    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LabError(f"no lab host {name}; hosts are {[h.name for h in self.hosts]}")

    def pids(self, name: str) -> list[int]:
        """Processes whose network namespace is this host's: what runs 'on' the host."""
        return netns.pids(self.host(name).netns)

    def cap(self, name: str, rate: str, burst: str = "256kb", latency: str = "100ms") -> None:
        """Token-bucket limit on both directions of the host's link."""
        host = self.host(name)
        for prefix in ((), ("ip", "netns", "exec", host.netns)):
            dev = host.ifname if prefix else host.veth
            run(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", latency)

    def uncap(self, name: str) -> None:
        host = self.host(name)
        for prefix in ((), ("ip", "netns", "exec", host.netns)):
            dev = host.ifname if prefix else host.veth
            run(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def tx_bytes(self, name: str) -> int:
        """Bytes the host has sent on its link (its eth0 counter)."""
        host = self.host(name)
        out = run("ip", "netns", "exec", host.netns, "cat",
                  f"/sys/class/net/{host.ifname}/statistics/tx_bytes").stdout
        return int(out.strip())


def _run_process(pid: int) -> bool:
    """A process of a launch run (its environment carries the run's stamp)."""
    try:
        return b"LAUNCH_RUN_STAMP=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _is_sshd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
    except OSError:
        return True


class LabFleet:
    """The lab as the place a run's machines come from (`launch_lab` in its inventory), for
    `launch run --recover` (launcher/backends/ssh/replace.py): where a test cannot reach EC2, the
    lab says whether a host is gone and brings a fresh one in, through the same recovery as
    launcher/provision/replacement.py's Ec2Fleet."""

    def __init__(self, directory: str | Path, say=print):
        self.lab, self.say = Lab.load(directory), say
        self.what = f"lab {self.lab.dir}"

    @property
    def inventory(self) -> str:
        return str(self.lab.inventory)

    def cost_per_hour(self, count: int) -> float | None:
        return None

    def gone(self, node: Node) -> str | None:
        try:
            lost = self.lab.is_lost(node.name)
        except LabError:
            return None
        return f"lab host {node.name}: its network namespace is gone" if lost else None

    def replace(self, node: Node) -> Node:
        from launcher.cluster.inventory import load_inventory

        host = self.lab.replace_host(node.name)
        self.say(f"lab host {host.name} ({host.address}) replaces {node.name}")
        return next(n for n in load_inventory(self.lab.inventory) if n.name == host.name)

    def set_up(self, node: Node) -> None:
        # The lab's hosts share this machine's software: nothing to install, where an EC2
        # replacement runs `launch setup`.
        self.say(f"{node.name}: the lab's hosts share this machine's software; nothing to set "
                 "up")

    def record(self, entry: dict) -> None:
        """A lab keeps no ledger; the run's own records are the run folder's."""
