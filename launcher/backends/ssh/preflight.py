"""Preflight: check every node before any rank starts, in parallel, and report all problems.

SSH reachable with the inventory's key, host key known (or recorded when asked), the node's
interpreter has torch (version, CUDA, GPU count), versions agree across nodes, the recipe's
processes fit the GPUs, the private address is the node's own, the rendezvous port is free on
the head, and the code launch shipped arrived intact.

One round trip of work per node: the probe takes the code on its stdin, writes it into the
run's folder on the node (removed again if preflight fails), reports the facts and the hash of
what it reads back from there. The code once went first by SFTP (a mkdir, a session, a put
per file: 0.30 s of a 2-host launch's 1.0 s over a plain ssh fan-out,
benchmarks/launch_overhead.py). The probe imports torch only when its cached facts no longer
fit (measured on the 8-host lab: the probe's torch import was most of launch's overhead over a
bare ssh fan-out), and never for a `command:` job (needs_torch), which it runs with -S.

A run's probe is held (`held`): once it has answered it waits on its stdin, and the node's
agent is later started by it (an exec of the start line launch sends), on the same SSH
session. Every session costs the node a login shell (~/.bashrc: a pyenv or conda init is
~0.2 s of CPU, measured on the lab), and a node's run then costs one session, as a plain ssh
fan-out does: at 64 lab hosts launch's extra sessions were most of its time over one
(benchmarks/scale.py).
"""

from __future__ import annotations

import base64
import functools
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from fabric import Connection

from launcher.backends.ssh.options import DEFAULT_FANOUT
from launcher.check.probe import node_function
from launcher.cluster.inventory import Node
from launcher.cluster.ssh import HostProblem, Started, connect, remote
from launcher.cluster.ssh_options import SshOptions
from launcher.core.errors import LauncherError, NotStarted
from launcher.job.recipe import Recipe, check_recipe_for_hardware

# Runs on the node with its own interpreter; argv: one JSON object: the private address, the
# port to test (0: none), the node's env file (what `launch setup`, role efa, writes for NCCL
# on EFA nodes: KEY=VALUE lines, no expansion; LD_LIBRARY_PATH goes in front of the node's
# own), the shipped code folder and its files to hash (none: no hash). With "unpack", once it
# has the node's own facts it reads its stdin: a line with what the job needs (its script,
# module or command, looked for as the job will: in its workdir, on its PYTHONPATH, on PATH
# with the interpreter's folder first; or null), then a JSON object {relative path: base64
# content} it writes under that folder (the code and the recipe). So it starts while launch
# still ships the workdir (the job is looked for in the copy the ship used), and costs the
# ship's time no second round trip: a user's script went through preflight 0.2 s (2 hosts)
# to 0.35 s (8) later than the bundled trainer when the probe waited for the ship
# (benchmarks/launch_overhead.py). It also reports the login folder (`home`): the plan's paths
# on the node are made absolute from it.
#
# torch's facts (version, CUDA build, GPUs it sees) cost a torch import, ~1.5 s of CPU. They are
# cached in ~/.cache/launch/torch-facts.json under a key of everything that could change them:
# the interpreter, torch's installed version (its version.py as the file system sees it: every
# install writes it anew; importlib.metadata.version cost half of the probe's own 50 ms of CPU,
# on every node of every launch) and its folder's mtime, the NVIDIA driver's version, the GPU
# devices the driver lists and CUDA_VISIBLE_DEVICES. Any change: import again.
# What torch says is asked as `launch check` asks it: ask_node.py's torch_facts, put in front.
PROBE = node_function("torch_facts") + r"""
import base64, hashlib, json, os, shutil, socket, subprocess, sys
args = json.loads(sys.argv[1])
login_env = dict(os.environ)   # a held probe's agent gets the login's, not what torch set
addr, port, env_file = args["addr"], int(args["port"]), args["env_file"]
code_dir, files = args.get("code_dir"), args.get("files") or []
out = {"python": sys.executable, "cpus": os.cpu_count(), "hostname": socket.gethostname(),
       "home": os.getcwd()}
env = {}
try:
    with open(env_file) as f:
        for line in f:
            key, sep, value = line.strip().partition("=")
            if sep and key and not key.startswith("#"):
                env[key] = value
except OSError:
    pass
if env.get("LD_LIBRARY_PATH") and os.environ.get("LD_LIBRARY_PATH"):
    env["LD_LIBRARY_PATH"] += ":" + os.environ["LD_LIBRARY_PATH"]
out["env"] = env

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""

def cached_torch_facts():
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch_error": "ModuleNotFoundError: No module named 'torch'"}
    folder = list(spec.submodule_search_locations)[0]
    try:
        gpus_dir = sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus_dir = []
    try:
        version = os.stat(os.path.join(folder, "version.py"))
        installed = [version.st_ino, version.st_size, version.st_mtime_ns]
    except OSError:
        installed = None
    key = json.dumps([sys.executable, installed,
                      os.stat(folder).st_mtime_ns, read("/proc/driver/nvidia/version"),
                      gpus_dir, os.environ.get("CUDA_VISIBLE_DEVICES")])
    cache = os.path.join(os.path.expanduser("~"), ".cache", "launch", "torch-facts.json")
    try:
        with open(cache) as f:
            cached = json.load(f)
        if cached.get(key):
            return dict(cached[key], cached=True)
    except (OSError, ValueError, AttributeError):
        cached = {}
    facts = torch_facts()
    if "error" in facts or "cuda_error" in facts:
        return {"torch_error": facts.get("error") or f"CUDA: {facts['cuda_error']}"}
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        if not isinstance(cached, dict):
            cached = {}
        cached[key] = facts
        with open(cache + ".tmp", "w") as f:
            json.dump(cached, f)
        os.replace(cache + ".tmp", cache)
    except OSError:
        pass
    return facts

# A job that is not torch's (a `command:`): the GPUs the driver lists, as many as
# CUDA_VISIBLE_DEVICES leaves, without torch (its import: ~1.5 s of CPU where not cached).
def driver_facts():
    try:
        gpus = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip()]))
    return {"gpus": gpus, "gpus_from": "driver"}

out.update(cached_torch_facts() if args.get("torch", True) else driver_facts())
try:
    listing = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    out["addresses"] = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] in ("inet", "inet6"):
            ip = parts[3].split("/")[0]
            out["addresses"].append(ip)
            if ip == addr:
                out["interface"] = parts[1].split("@")[0]
except OSError:
    pass
if port:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the rendezvous store binds: connections of a run that just ended (TIME_WAIT)
        # do not make the port busy, a process listening on it does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            out["port_free"] = True
        except OSError as err:
            out["port_free"] = False
            out["port_error"] = err.strerror
if "controller_key" in args:
    # A detached run's controller runs launch here with this interpreter, and reaches the
    # other nodes with the cluster's key: what it lacks is said now, not by a dead controller.
    import importlib.util
    out["controller_missing"] = [m for m in ("pydantic", "yaml", "fabric", "paramiko")
                                 if importlib.util.find_spec(m) is None]
    key = os.path.expanduser(args["controller_key"])
    out["controller_key"] = key if os.path.isfile(key) and os.access(key, os.R_OK) else None
job = None
if args.get("unpack"):
    try:
        job = json.loads(sys.stdin.readline() or "null")
        # One line (launch's JSON has none inside): a held probe's stdin goes on after it.
        for rel, content in json.loads(sys.stdin.readline() or "{}").items():
            path = os.path.join(args["unpack"], rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(content))
    except (OSError, ValueError) as err:
        out["code_error"] = f"writing the code: {err}"
if code_dir is not None:
    # launcher/core/node_code.py content_hash, here on the node (this script imports nothing).
    digest = hashlib.sha256()
    try:
        for rel in files:
            digest.update(rel.encode() + b"\0")
            with open(os.path.join(code_dir, rel), "rb") as f:
                digest.update(f.read() + b"\0")
        out["code_sha256"] = digest.hexdigest()
    except OSError as err:
        out["code_error"] = str(err)
if job:
    cwd = job.get("cwd") or os.getcwd()
    problem = None
    if job.get("script"):
        path = os.path.join(cwd, job["script"])
        if not os.path.isfile(path):
            problem = f"job.script {job['script']}: no such file " + (
                "on the node" if job["script"].startswith("/") else f"in the workdir ({cwd})")
    elif job.get("module"):
        import importlib.util
        top = job["module"].split(".")[0]
        extra = [os.path.join(cwd, p) for p in (job.get("pythonpath") or "").split(":") if p]
        sys.path[:0] = [cwd, *extra]
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            problem = (f"job.module {job['module']}: no module or package {top} in the workdir "
                       f"({cwd}), on the recipe's PYTHONPATH nor in {sys.executable}")
    elif job.get("command"):
        prog = job["command"]
        if "/" in prog:
            path = os.path.join(cwd, prog)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                problem = f"job.command {prog}: no executable file {path} on the node"
        else:
            where = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
            if shutil.which(prog, path=where) is None:
                problem = (f"job.command {prog}: not found on the node (PATH {where}); install "
                           "it in the node's environment, e.g. with setup:")
    if problem:
        out["job_error"] = problem
print("LAUNCH-PROBE " + json.dumps(out), flush=True)
if args.get("hold"):
    # Held: this session becomes the node agent's once launch sends its command line (a line
    # with its length, then that JSON argv), read with os.read alone, so that nothing after
    # it (the node watcher's first looks) is taken into this process's buffers and lost at
    # exec. End of input (preflight failed elsewhere, launch went away): nothing to start.
    def take(count):
        data = b""
        while len(data) < count:
            chunk = os.read(0, count - len(data))
            if not chunk:
                sys.exit(0)
            data += chunk
        return data
    size = b""
    while not size.endswith(b"\n"):
        size += take(1)
    argv = json.loads(take(int(size)))
    import signal
    for name in ("SIGPIPE", "SIGXFSZ"):   # Python ignores them; exec keeps what is ignored
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, login_env)
    except OSError as err:
        print(f"launch: the node agent's start {argv[0]}: {err}", file=sys.stderr, flush=True)
        sys.exit(127)
"""


def needs_torch(job) -> bool:
    """Whether preflight asks the node's interpreter for torch (its version, CUDA, the GPUs it
    sees): every job torchrun starts; not a `command:`, which brings its own launcher (its
    nodes need no torch in launch_python, and the GPU count is the driver's)."""
    return job is None or job.uses_torchrun


@dataclass(frozen=True)
class NodeFacts:
    torch: str | None            # None: not asked (a job that is not torch's)
    cuda: str | None
    gpus: int
    cpus: int
    interface: str | None
    hostname: str
    env: dict[str, str]          # from NODE_ENV_FILE (EFA/libfabric settings), else empty
    home: str | None = None      # the login folder: relative paths on the node start there
    shipped: object = None       # what shipping the workdir sent (launcher/workdir/sync.py)


class PreflightFailed(NotStarted):
    def __init__(self, problems: list[HostProblem]):
        self.problems = problems
        lines = [f"preflight found {len(problems)} problem(s); nothing was started:"]
        lines += [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


class NodeProbe:
    """The probe, started on a node: it gathers the node's facts at once. `unpack_to`: a folder
    on the node that `facts()` sends the code to (Shipment.payload), with the job to look for,
    once launch has them (after the workdir's ship)."""

    def __init__(self, conn: Connection, node: Node, port: int,
                 code: tuple[str, list[str]] | None = None, unpack_to: str | None = None,
                 controller_key: str | None = None, needs_torch: bool = True,
                 hold: bool = False):
        args: dict = {"addr": node.private_address, "port": port, "env_file": node.env_file}
        if hold:
            args["hold"] = True
        if controller_key is not None:
            args["controller_key"] = controller_key
        # A job that is not torch's (a `command:`, on a node that is no controller): neither
        # torch's facts nor site-packages (-S: the probe then uses the standard library only;
        # a site-packages with torch's CUDA wheels is dozens of .pth files read at each start).
        bare = not needs_torch and controller_key is None
        if bare:
            args["torch"] = False
        if code:
            args.update(code_dir=code[0], files=code[1])
        if unpack_to:
            args["unpack"] = unpack_to
        self.node, self.unpacks, self.holds = node, unpack_to is not None, hold
        self.held = None   # the channel a held probe waits on, once it has answered
        self.started = Started(conn, remote(node.python, *(["-S"] if bare else []), "-c",
                                            PROBE, json.dumps(args)))

    def close(self) -> None:
        self.started.close()

    def facts(self, payload: bytes = b"", job: dict | None = None) -> dict:
        node = self.node
        data = json.dumps(job).encode() + b"\n" + payload + b"\n" if self.unpacks else b""
        if self.holds:
            exited, output = self.started.hold(data, b"LAUNCH-PROBE ", timeout=120)
            if exited is None:
                self.held = self.started.channel
        else:
            exited, output = self.started.finish(data, timeout=120)
        for line in output.splitlines():
            if line.startswith("LAUNCH-PROBE "):
                try:
                    facts = json.loads(line.removeprefix("LAUNCH-PROBE "))
                except ValueError:
                    facts = None
                if isinstance(facts, dict):
                    return facts
                raise HostProblem(node.name, f"{node.python}: the probe's answer is not a JSON "
                                             "object (is something printing into its output?)")
        detail = output.strip().splitlines()[-1:] or ["no output"]
        if exited == 127:
            raise HostProblem(node.name, f"interpreter {node.python} (launch_python) not "
                                         "found: run `launch setup` or set launch_python")
        raise HostProblem(node.name, f"{node.python} failed to run the probe (exit {exited}): "
                                     f"{detail[0]}")


def check_node(node: Node, facts: dict, is_head: bool, port: int,
               code_hash: str | None = None) -> list[HostProblem]:
    problems = []
    if facts.get("job_error"):
        problems.append(HostProblem(node.name, facts["job_error"]))
    if code_hash is not None and facts.get("code_sha256") != code_hash:
        got = facts.get("code_sha256") or facts.get("code_error") or "(nothing)"
        problems.append(HostProblem(node.name, f"the code on the node hashes to {got[:40]}, "
                                               f"launch's copy to {code_hash[:12]}: the copy "
                                               "did not arrive intact (disk full?)"))
    if facts.get("controller_missing"):
        problems.append(HostProblem(node.name, f"the controller of a detached run runs launch "
                                               f"here with {node.python}, which cannot import "
                                               f"{', '.join(facts['controller_missing'])}: run "
                                               "`launch setup` (role python_env installs them) "
                                               "or run attached"))
    if "controller_key" in facts and facts["controller_key"] is None:
        problems.append(HostProblem(node.name, "the controller of a detached run reaches the "
                                               "other nodes with the cluster's own key, which "
                                               "is not on this host (launch_cluster_key): run "
                                               "`launch setup` (role cluster_ssh makes it) or "
                                               "run attached"))
    if "torch_error" in facts:
        problems.append(HostProblem(node.name, f"{node.python} cannot import torch "
                                               f"({facts['torch_error']}): run `launch setup` or "
                                               "point launch_python at an interpreter with torch"))
    if node.gpus is not None and facts.get("gpus", 0) < node.gpus:
        who = "the driver lists" if facts.get("gpus_from") == "driver" else "torch sees"
        problems.append(HostProblem(node.name, f"the inventory says gpus: {node.gpus} but {who} "
                                               f"{facts.get('gpus', 0)}: check the driver "
                                               "(nvidia-smi) or fix the inventory"))
    if "interface" not in facts and "addresses" in facts:
        problems.append(HostProblem(node.name, f"private_ip {node.private_address} is not an "
                                               f"address of this host (it has "
                                               f"{', '.join(facts['addresses'])}): fix private_ip"))
    if is_head and port and facts.get("port_free") is False:
        problems.append(HostProblem(node.name, f"rendezvous port {port} on "
                                               f"{node.private_address} is in use "
                                               f"({facts.get('port_error')}): another run? pass "
                                               "--rdzv-port or change rendezvous.port"))
    return problems


@dataclass(frozen=True)
class Shipment:
    """What preflight uploads to every node before probing it: the code (relative `files` of
    `local_dir`) into `<remote_dir(node)>/code`, and the recipe file beside it."""

    local_dir: object            # pathlib.Path of the folder holding train/
    files: list[str]
    sha256: str
    remote_dir: Callable[[Node], str]
    recipe_file: object = None   # pathlib.Path or None
    # A new run's folder goes again when preflight fails; a resumed run's holds its
    # checkpoints and earlier logs, and stays.
    remove_on_failure: bool = True
    # The job (launcher/job/spec.py Job), its workdir's manifest (launcher/workdir/scan.py) and where a
    # node keeps its shipped copy: shipped before the probe, which then looks for the job's
    # script, module or command there.
    job: object = None
    workdir: object = None
    node_workdir: Callable[[Node], str | None] = lambda node: None
    # A detached run's controller host also gets launch itself (launcher/), and checks it can
    # run it (launch's own dependencies, the cluster key): `controller_files`, hashed apart.
    controller: str | None = None
    controller_files: list[str] = ()
    controller_sha256: str | None = None
    controller_key: str | None = None

    def files_for(self, node: Node) -> list[str]:
        return [*self.files, *self.controller_files] if node.name == self.controller \
            else self.files

    def sha256_for(self, node: Node) -> str:
        return self.controller_sha256 if node.name == self.controller else self.sha256

    @functools.cached_property
    def payload(self) -> bytes:
        return self._payload(self.files)

    @functools.cached_property
    def controller_payload(self) -> bytes:
        return self._payload([*self.files, *self.controller_files])

    def payload_for(self, node: Node) -> bytes:
        return self.controller_payload if node.name == self.controller else self.payload

    def _payload(self, files: list[str]) -> bytes:
        """The code (under code/) and the recipe (recipe.yml) as the probe unpacks them."""
        from pathlib import Path

        sources = {posixpath.join("code", rel): Path(self.local_dir) / rel for rel in files}
        if self.recipe_file is not None:
            sources["recipe.yml"] = Path(self.recipe_file)
        return json.dumps({rel: base64.b64encode(path.read_bytes()).decode()
                           for rel, path in sources.items()}).encode()


def job_check(job, workdir: str | None, recipe: Recipe) -> dict | None:
    """What the probe looks for on a node before the job may start."""
    if job is None or job.kind == "trainer":
        return None
    check: dict = {"cwd": workdir, "pythonpath": recipe.env_strings().get("PYTHONPATH", "")}
    if job.kind == "command":
        check["command"] = job.args[0]
    else:
        check[job.kind] = job.target
    return check


def preflight(nodes: list[Node], recipe: Recipe, options: SshOptions, rdzv_port: int,
              shipment: Shipment | None = None, fanout: int = DEFAULT_FANOUT,
              held: dict | None = None) -> tuple[dict[str, Connection], dict[str, NodeFacts]]:
    """Open a connection to every node, upload the shipment, check the node and what arrived.
    Raises PreflightFailed with every problem of every node (and removes what was uploaded);
    on success the connections stay open for the run. At most `fanout` nodes are being
    connected to and checked at a time (a pool of that many threads: --fanout): a node's whole
    preflight, connect to facts, is one task of the window. `held`: each node's probe kept
    waiting to start the node's agent (the module's docstring), its channel put there."""
    from launcher.backends.ssh.agent import remove_tree
    from launcher.execute.backend import in_parallel

    conns: dict[str, Connection] = {}
    raw: dict[str, dict] = {}
    shipped: dict[str, object] = {}
    problems: list[HostProblem] = []
    by_name = {n.name: n for n in nodes}

    def one(name: str):
        node = by_name[name]
        conn = connect(node, options)
        conns[name] = conn
        port = rdzv_port if node is nodes[0] else 0
        if shipment is None:
            raw[name] = NodeProbe(conn, node, port).facts()
            return
        where = shipment.remote_dir(node)
        started = NodeProbe(conn, node, port, (posixpath.join(where, "code"),
                                               shipment.files_for(node)), unpack_to=where,
                            controller_key=shipment.controller_key
                            if node.name == shipment.controller else None,
                            needs_torch=needs_torch(shipment.job), hold=held is not None)
        try:
            workdir = ship_workdir(conn, node, name)
        except BaseException:
            started.close()
            raise
        raw[name] = started.facts(shipment.payload_for(node),
                                  job_check(shipment.job, workdir, recipe))
        if started.held is not None:
            held[name] = started.held

    def ship_workdir(conn: Connection, node: Node, name: str) -> str | None:
        """The copy of the job's workdir the node uses, shipped (while the probe runs)."""
        workdir = shipment.node_workdir(node)
        if shipment.workdir is None or not workdir:
            return workdir
        from launcher.workdir.sync import ship_ssh

        try:
            stats = ship_ssh(conn, shipment.workdir, workdir, python=node.python)
        except LauncherError as err:
            raise HostProblem(node.name, f"the workdir could not be shipped: {err}") from None
        shipped[name] = stats
        return stats.dest

    answers = in_parallel(one, list(by_name), max_workers=fanout)
    for node in nodes:
        err = answers[node.name]
        if isinstance(err, HostProblem):
            problems.append(err)
        elif isinstance(err, Exception):
            problems.append(HostProblem(node.name, f"preflight failed: {err}"))
        else:
            problems += check_node(node, raw[node.name], node is nodes[0], rdzv_port,
                                   shipment.sha256_for(node) if shipment else None)
    versions = {raw[n]["torch"] for n in raw if raw[n].get("torch")}
    if len(versions) > 1:
        per_host = ", ".join(f"{n}: {raw[n]['torch']}" for n in raw if raw[n].get("torch"))
        problems.append(HostProblem("(all)", f"torch versions differ between nodes ({per_host}); "
                                             "install one version everywhere"))
    if not problems:
        try:
            check_recipe_for_hardware(recipe, [raw[n.name].get("gpus", 0) for n in nodes])
        except LauncherError as err:
            problems.append(HostProblem("(all)", str(err)))
    if problems:
        release_held(held or {}, fanout)   # "nothing was started" holds once launch returns
        if shipment is not None and shipment.remove_on_failure:
            in_parallel(lambda name: remove_tree(conns[name], shipment.remote_dir(by_name[name])),
                        list(conns), max_workers=fanout)
        close_all(conns)
        raise PreflightFailed(problems)
    facts = {
        name: NodeFacts(torch=f.get("torch"), cuda=f.get("cuda"), gpus=f.get("gpus", 0),
                        cpus=f.get("cpus") or 1, interface=f.get("interface"),
                        hostname=f.get("hostname", name), env=f.get("env") or {},
                        home=f.get("home"), shipped=shipped.get(name))
        for name, f in raw.items()
    }
    return conns, facts


def release_held(held: dict, fanout: int = 32, timeout: float = 5.0) -> None:
    """Held probes never asked to start: their stdin ends and launch waits (`timeout` at most)
    for each to exit. Closing the connection alone ends them too, but after launch has gone:
    a caller that looks at the node as launch returns would find a probe still there."""
    from launcher.execute.backend import in_parallel

    def release(name: str) -> None:
        channel = held.pop(name)
        try:
            channel.shutdown_write()
            channel.status_event.wait(timeout)
        except Exception:  # noqa: BLE001 (a broken connection ended the probe with it)
            pass
        finally:
            channel.close()

    if held:
        in_parallel(release, list(held), max_workers=fanout)


def close_all(conns: dict[str, Connection]) -> None:
    for conn in conns.values():
        try:
            conn.close()
        except Exception:  # closing is best effort; the run's outcome is already decided
            pass
