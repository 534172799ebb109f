"""A real Slurm cluster on one Linux box, from Debian's packages (slurmctld, slurmd, munge).

    launch lab up --slurm --hosts 2 --dir /tmp/slurmlab     # then: export SLURM_CONF=...
    launch lab down --dir /tmp/slurmlab

One munged and one slurmctld in the machine's own network namespace (the login node, where
sbatch/squeue/scancel run), one slurmd per "host": a network namespace on a bridge with its own
address, hostname, /etc/hosts and resolv.conf. The hosts share this machine's files (the
shared filesystem a Slurm cluster needs) and processes; only the network, the hostname and
those two files are theirs, so `ip netns pids` tells what runs on a host. Measured facts and
the gotchas this setup avoids are in docs/slurm.md.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from launcher.lab import netns
from launcher.lab.netns import LabError, run

LAB_FILE = "slurm-lab.json"
PARTITION = "lab"
DAEMONS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "munged": "munge",
           "mungekey": "munge", "sbatch": "slurm-client"}
# slurmd's own port, the same in every host's namespace (each has its own ports).
SLURMD_PORT = 6818


def slurm_lab_unavailable_reason() -> str | None:
    """Why a Slurm lab cannot be built here, or None (tests skip with this reason)."""
    if os.geteuid() != 0:
        return "the Slurm lab needs root (network namespaces, mounts, munged, slurmd)"
    for tool in ("ip", "nsenter", "unshare"):
        if not shutil.which(tool):
            return f"the Slurm lab needs `{tool}` (iproute2, util-linux)"
    missing = sorted({pkg for tool, pkg in DAEMONS.items()
                      if not shutil.which(tool) and not Path("/usr/sbin", tool).exists()})
    if missing:
        return ("the Slurm lab needs Debian's Slurm and munge (missing: " + ", ".join(missing)
                + "): apt-get install slurm-wlm munge")
    return netns.unavailable_reason()


def _sbin(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


@dataclass
class SlurmLabHost:
    name: str            # the Slurm node name and the host's hostname
    netns: str
    address: str
    veth: str            # root-namespace end, attached to the bridge
    slurmd_pid: int = 0


@dataclass
class SlurmLab:
    directory: str
    lab_id: str
    subnet: str
    bridge: str
    controller: str      # slurmctld's hostname (its own UTS namespace)
    ctld_port: int
    cpus_per_host: int
    # Unix sockets (munge's, slurmd's per job step) need paths under 108 bytes, which a lab
    # folder deep in a test's temporary tree exceeds: they live in a short folder of their own.
    sockets: str = ""
    hosts: list[SlurmLabHost] = field(default_factory=list)
    munged_pid: int = 0
    slurmctld_pid: int = 0

    # ---- paths -----------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return Path(self.sockets) / "munge.socket.2"

    @property
    def partition(self) -> str:
        return PARTITION

    def env(self) -> dict[str, str]:
        """What a client (sbatch, launch --slurm) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # ---- lifecycle ---------------------------------------------------------------------
    @classmethod
    def create(cls, directory: str | Path, hosts: int) -> SlurmLab:
        """Build the lab; on any failure, tear down what was made and raise."""
        if not 1 <= hosts <= 64:
            raise LabError(f"--hosts {hosts}: a Slurm lab has 1 to 64 hosts")
        reason = slurm_lab_unavailable_reason()
        if reason:
            raise LabError(reason)
        directory = Path(directory).resolve()
        if (directory / LAB_FILE).exists():
            raise LabError(f"{directory} already holds a Slurm lab: `launch lab down --dir "
                           f"{directory}` first")
        directory.mkdir(parents=True, exist_ok=True)
        lab_id = secrets.token_hex(2)
        net = netns.free_subnet()
        lab = cls(str(directory), lab_id, str(net), f"slm{lab_id}br", f"slm{lab_id}ctl",
                  _free_port(), max(1, (os.cpu_count() or 1) // hosts),
                  sockets=f"{'/run' if os.access('/run', os.W_OK) else '/tmp'}/slm{lab_id}")
        try:
            lab._build(hosts, net)
        except BaseException:
            lab.destroy()
            raise
        return lab

    def _build(self, count: int, net: ipaddress.IPv4Network) -> None:
        netns.add_bridge(self.bridge, net)
        self.hosts = [SlurmLabHost(name=f"slm{self.lab_id}n{i}", netns=f"slm{self.lab_id}h{i}",
                                   address=netns.host_address(net, i),
                                   veth=f"slm{self.lab_id}v{i}") for i in range(count)]
        self.save()
        for host in self.hosts:
            netns.add_namespace(host.netns)
            netns.add_link(host.netns, host.veth, "eth0", self.bridge, host.address,
                           net.prefixlen)
            netns.add_default_route(host.netns, netns.gateway(net))
        self._write_files(str(netns.gateway(net)))
        self._start_munged()
        self._start_slurmctld()
        for host in self.hosts:
            self._start_slurmd(host)
        self.save()
        self._wait_until_idle()

    def _write_files(self, gateway: str) -> None:
        for sub in ("munge", "ctld/state", *(f"nodes/{h.name}" for h in self.hosts)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for host in self.hosts:
            (Path(self.sockets) / host.name).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o700)
        os.chmod(self.sockets, 0o700)
        # c10d reverse-resolves its peers, which it sees as v4-mapped IPv6 addresses: without
        # an entry for that form each lookup went to DNS, which a namespace cannot reach,
        # and stalled 10 s per connection (a 2-node job took 26 s instead of 5).
        names = [(gateway, self.controller), *((h.address, h.name) for h in self.hosts)]
        # "localhost" is 127.0.0.1 only, as on Ubuntu (AWS's Deep Learning AMIs). Where it is
        # ::1 first (Debian's default), torchrun's probe for MASTER_PORT binds ::1 and can
        # hand rank 0 a port an IPv4 socket holds: each srun on the head listens on several
        # (launch_node/worker.py wait_for_master_port; seen here: EADDRINUSE, a restart lost).
        hosts = ["127.0.0.1 localhost", "::1 ip6-localhost ip6-loopback"]
        hosts += [f"{addr} {name}" for addr, name in names]
        hosts += [f"::ffff:{addr} {name}" for addr, name in names]
        (self.dir / "hosts").write_text("\n".join(hosts) + "\n")
        (self.dir / "resolv.conf").write_text(
            "# launch Slurm lab: no DNS inside the lab, and lookups fail at once\n"
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        d = self.dir
        lines = [
            f"# launch Slurm lab {self.lab_id}: remove with `launch lab down --dir {d}`",
            "ClusterName=launchlab",
            f"SlurmctldHost={self.controller}({gateway})",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # A path-based socket is reachable from every network namespace.
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/ctld/state",
            f"SlurmctldPidFile={d}/ctld/slurmctld.pid",
            f"SlurmctldLogFile={d}/ctld/slurmctld.log",
            f"SlurmdSpoolDir={self.sockets}/%n",
            f"SlurmdPidFile={d}/nodes/%n/slurmd.pid",
            f"SlurmdLogFile={d}/nodes/%n/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            "ReturnToService=2",
            # Without it a job started ~3 s after sbatch.
            "SchedulerParameters=batch_sched_delay=0",
            # Seconds between SIGTERM and SIGKILL when a job is cancelled.
            "KillWait=5",
            # The hosts share this machine's cores: each gets its share, so the ranks of a
            # job start one OpenMP thread per core of the machine, not more.
            *(f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} "
              f"CPUs={self.cpus_per_host} State=UNKNOWN" for h in self.hosts),
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, argv: list[str], log: Path) -> int:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        return proc.pid

    def _start_munged(self) -> None:
        key = self.dir / "munge" / "munge.key"
        run(_sbin("mungekey"), "--create", f"--keyfile={key}")
        os.chmod(key, 0o600)
        m = self.dir / "munge"
        # --force: munged refuses a socket folder it did not make under /run otherwise.
        self.munged_pid = self._daemon(
            [_sbin("munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={self.munge_socket}", f"--pid-file={m}/munged.pid",
             f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
            m / "munged.out")
        self.save()
        self._wait_for(lambda: self.munge_socket.exists(), "munged", m / "munged.log")

    def _start_slurmctld(self) -> None:
        # slurmctld insists that SlurmctldHost is its own hostname: a UTS namespace gives it
        # that name without touching this machine's.
        script = 'hostname "$1" && exec "$2" -D -f "$3"'
        self.slurmctld_pid = self._daemon(
            ["unshare", "--uts", "sh", "-c", script, "sh", self.controller, _sbin("slurmctld"),
             str(self.conf)], self.dir / "ctld" / "slurmctld.out")
        self.save()

    def _start_slurmd(self, host: SlurmLabHost) -> None:
        # Not `ip netns exec`: it mounts a fresh /sys, hiding /sys/fs/cgroup, and slurmd 22.05
        # always initialises its cgroup plugin. A mount namespace of its own instead, where the
        # lab's hosts file and resolv.conf replace the machine's (for slurmd and every job
        # process it starts) and the hostname is the node's.
        script = ('mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && '
                  'hostname "$3" && exec "$4" -D -N "$3" -f "$5"')
        host.slurmd_pid = self._daemon(
            ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--mount", "--uts",
             "--propagation", "slave", "sh", "-c", script, "sh", str(self.dir / "hosts"),
             str(self.dir / "resolv.conf"), host.name, _sbin("slurmd"), str(self.conf)],
            self.dir / "nodes" / host.name / "slurmd.out")
        self.save()

    def _wait_for(self, ready, what: str, log: Path, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise LabError(f"{what} did not start in the Slurm lab ({log}):\n{text}")
            time.sleep(0.05)

    def _wait_until_idle(self, timeout: float = 30.0) -> None:
        """Every node registered with slurmctld and idle: jobs can start."""
        def idle() -> bool:
            states = self.node_states()
            return all(states.get(h.name) == "idle" for h in self.hosts)

        self._wait_for(idle, "the Slurm nodes", self.dir / "ctld" / "slurmctld.log", timeout)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it ("idle", "alloc", "comp*": a trailing * is a
        node slurmctld cannot reach); empty when slurmctld does not answer."""
        try:
            proc = self.client(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def problems(self, timeout: float = 30.0) -> list[str]:
        """What keeps the lab from taking the next job, after waiting up to `timeout` for every
        node to be idle (a cancelled job completes within KillWait): a daemon that is gone, a
        node in another state. Each problem comes with the tail of the log that tells why."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(h.name) == "idle" and _alive(h.slurmd_pid) for h in self.hosts):
                return []
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        found = [f"{name} is gone" for name in self.gone_daemons()
                 if not name.startswith("slurmd")]   # each slurmd: on its node's line
        if not states:
            found.append("slurmctld does not answer sinfo")
        for host in self.hosts:
            alive = "running" if _alive(host.slurmd_pid) else "gone"
            port = "answers" if _answers(host.address, SLURMD_PORT) else "does not answer"
            found.append(f"{host.name}: {states.get(host.name, '?')}; its slurmd (pid "
                         f"{host.slurmd_pid}) is {alive}, its port {port} from here; left on "
                         f"it: {self.job_pids(host.name)}")
            found += _tail(self.dir / "nodes" / host.name / "slurmd.log")
            found += _tail(self.dir / "nodes" / host.name / "slurmd.out")
        found += _tail(self.dir / "ctld" / "slurmctld.log")
        return found

    def gone_daemons(self) -> list[str]:
        """The lab's daemons that are no longer running, by name ("slurmd of NODE")."""
        daemons = [("munged", self.munged_pid), ("slurmctld", self.slurmctld_pid),
                   *((f"slurmd of {h.name}", h.slurmd_pid) for h in self.hosts)]
        return [name for name, pid in daemons if not _alive(pid)]

    def heal(self) -> list[str]:
        """Idle nodes again after problems() found some: on a node that is not idle, what ran
        there is killed and its slurmd started afresh (a gone or silent one); a node set down
        returns (ReturnToService=2 does that once its slurmd registers). Where that is not
        enough within 30 s, the whole lab is made again (rebuild). Returns what it did."""
        states = self.node_states()
        done = []
        for host in self.hosts:
            if states.get(host.name) == "idle" and _alive(host.slurmd_pid):
                continue
            _stop(host.slurmd_pid)
            left = self.job_pids(host.name)
            for pid in left:
                netns.kill(pid)
            self._start_slurmd(host)
            done.append(f"{host.name} was {states.get(host.name, '?')}: its slurmd started again "
                        f"(pid {host.slurmd_pid}), {len(left)} process(es) left there killed")
        deadline = time.monotonic() + 30.0
        while True:
            states = self.node_states()
            if all(states.get(h.name) == "idle" for h in self.hosts):
                return done
            if time.monotonic() > deadline:
                self.rebuild()
                return [*done, f"still not idle ({states}): the lab was made again, as "
                               f"{', '.join(h.name for h in self.hosts)}"]
            # A node slurmctld drained (a job it could not end: "Kill task failed") stays
            # drained until told; a down one returns by itself once its slurmd registers.
            for name, state in states.items():
                if state.startswith(("drain", "drng")):
                    self.client(["scontrol", "update", f"NodeName={name}", "State=RESUME"])
            time.sleep(1.0)

    def rebuild(self) -> None:
        """Everything removed and made again in the same folder: new namespaces, addresses,
        daemons and names, in this same object (its users hold it)."""
        directory, count = self.dir, len(self.hosts)
        self.destroy()
        fresh = SlurmLab.create(directory, count)
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def client(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this lab (from the login node)."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env()}, stdin=subprocess.DEVNULL)

    def save(self) -> None:
        (self.dir / LAB_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> SlurmLab:
        path = Path(directory) / LAB_FILE
        try:
            data = json.loads(path.read_text())
            data["hosts"] = [SlurmLabHost(**h) for h in data["hosts"]]
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise LabError(f"{path}: not a Slurm lab folder ({err})") from None

    @staticmethod
    def is_lab(directory: str | Path) -> bool:
        return (Path(directory) / LAB_FILE).exists()

    def destroy(self) -> None:
        """Remove everything the lab made and everything that ran in it; safe to call twice
        and after a partial build. slurmstepd outlives slurmd, so jobs are cancelled first,
        then the daemons stop, then whatever is still in a host's namespace is killed."""
        if self.slurmctld_pid and _alive(self.slurmctld_pid):
            try:
                jobs = self.client(["squeue", "--noheader", "--format=%i"], timeout=10)
                ids = jobs.stdout.split()
                if ids:
                    self.client(["scancel", *ids], timeout=10)
                    self._wait_no_jobs(ids)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for host in self.hosts:
            _stop(host.slurmd_pid)
        _stop(self.slurmctld_pid)
        _stop(self.munged_pid)
        for host in self.hosts:
            netns.remove_namespace(host.netns, [host.veth])
        netns.remove_links([self.bridge])
        if self.sockets:
            shutil.rmtree(self.sockets, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_no_jobs(self, ids: list[str], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.client(["squeue", "--noheader", "--format=%i", "--jobs=" + ",".join(ids)],
                               timeout=10)
            if not left.stdout.split():
                return
            time.sleep(0.2)

    # ---- use ---------------------------------------------------------------------------
    def host(self, name: str) -> SlurmLabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LabError(f"no Slurm lab host {name}; hosts are {[h.name for h in self.hosts]}")

    def pids(self, name: str) -> list[int]:
        """Processes whose network namespace is this host's: what runs 'on' the host."""
        return netns.pids(self.host(name).netns)

    def job_pids(self, name: str) -> list[int]:
        """What runs on a host besides its slurmd: job processes (slurmstepd and below)."""
        return [pid for pid in self.pids(name) if pid != self.host(name).slurmd_pid]

    def describe(self) -> list[str]:
        lines = [f"{h.name}: {h.address} (netns {h.netns})" for h in self.hosts]
        lines.append(f"controller: {self.controller}, partition {PARTITION}, "
                     f"{self.cpus_per_host} CPU(s) per host")
        return lines

    def export_line(self) -> str:
        return f"export SLURM_CONF={shlex.quote(str(self.conf))}"


def _answers(address: str, port: int) -> bool:
    """Whether a TCP connection to the address and port opens from this namespace (as
    slurmctld's to a node's slurmd)."""
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


def _tail(log: Path, lines: int = 25) -> list[str]:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
    return [f"  --- the end of {log}"] + [f"  {line}" for line in text]


def _alive(pid: int) -> bool:
    """Running, not a zombie (a daemon of an earlier `lab up` whose parent is gone may wait
    for an init that does not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM a daemon the lab started (by its recorded pid), SIGKILL if it lingers."""
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not our child (`launch lab down` in a later process)
            if not _alive(pid):
                return
        time.sleep(0.05)
    netns.kill(pid)
