"""Preflight: check every node before any rank starts, in parallel, and report all problems.

SSH reachable with the inventory's key, host key known (or recorded when asked), the node's
interpreter imports torch (version, CUDA, GPU count), versions agree across nodes, the
recipe's processes fit the GPUs, the private address is the node's own, the rendezvous port
is free on the head.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fabric import Connection

from launcher.errors import LauncherError
from launcher.inventory import Node
from launcher.recipe import Recipe, check_recipe_for_hardware
from launcher.ssh import HostProblem, SshOptions, connect, remote

# Runs on the node with its own interpreter; argv: private address, port to test (0: none),
# the node's env file (what `launch setup`, role efa, writes for NCCL on EFA nodes: KEY=VALUE
# lines, no expansion; LD_LIBRARY_PATH goes in front of the node's own).
PROBE = r"""
import json, os, socket, subprocess, sys
addr, port, env_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {"python": sys.executable, "cpus": os.cpu_count(), "hostname": socket.gethostname()}
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
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as err:
    out["torch_error"] = f"{type(err).__name__}: {err}"
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
        try:
            s.bind((addr, port))
            out["port_free"] = True
        except OSError as err:
            out["port_free"] = False
            out["port_error"] = err.strerror
print("LAUNCH-PROBE " + json.dumps(out))
"""


@dataclass(frozen=True)
class NodeFacts:
    torch: str
    cuda: str | None
    gpus: int
    cpus: int
    interface: str | None
    hostname: str
    env: dict[str, str]          # from NODE_ENV_FILE (EFA/libfabric settings), else empty


class PreflightFailed(LauncherError):
    def __init__(self, problems: list[HostProblem]):
        self.problems = problems
        lines = [f"preflight found {len(problems)} problem(s); nothing was started:"]
        lines += [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


def probe(conn: Connection, node: Node, port: int) -> dict:
    result = conn.run(remote(node.python, "-c", PROBE, node.private_address, str(port),
                             node.env_file),
                      hide=True, warn=True, in_stream=False, timeout=120)
    for line in result.stdout.splitlines():
        if line.startswith("LAUNCH-PROBE "):
            return json.loads(line.removeprefix("LAUNCH-PROBE "))
    detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
    if result.exited == 127:
        raise HostProblem(node.name, f"interpreter {node.python} (launch_python) not found: "
                                     "run `launch setup` or set launch_python")
    raise HostProblem(node.name, f"{node.python} failed to run the probe (exit {result.exited}): "
                                 f"{detail[0]}")


def check_node(node: Node, facts: dict, is_head: bool, port: int) -> list[HostProblem]:
    problems = []
    if "torch_error" in facts:
        problems.append(HostProblem(node.name, f"{node.python} cannot import torch "
                                               f"({facts['torch_error']}): run `launch setup` or "
                                               "point launch_python at an interpreter with torch"))
    if node.gpus is not None and facts.get("gpus", 0) < node.gpus:
        problems.append(HostProblem(node.name, f"the inventory says gpus: {node.gpus} but torch "
                                               f"sees {facts.get('gpus', 0)}: check the driver "
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


def preflight(nodes: list[Node], recipe: Recipe, options: SshOptions,
              rdzv_port: int) -> tuple[dict[str, Connection], dict[str, NodeFacts]]:
    """Open a connection to every node and check it. Raises PreflightFailed with every
    problem of every node; on success the connections stay open for the run."""
    conns: dict[str, Connection] = {}
    raw: dict[str, dict] = {}
    problems: list[HostProblem] = []

    def one(node: Node):
        conn = connect(node, options)
        conns[node.name] = conn
        raw[node.name] = probe(conn, node, rdzv_port if node is nodes[0] else 0)

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        futures = {node.name: pool.submit(one, node) for node in nodes}
    for node in nodes:
        err = futures[node.name].exception()
        if isinstance(err, HostProblem):
            problems.append(err)
        elif err is not None:
            problems.append(HostProblem(node.name, f"preflight failed: {err}"))
        else:
            problems += check_node(node, raw[node.name], node is nodes[0], rdzv_port)
    versions = {raw[n]["torch"] for n in raw if "torch" in raw[n]}
    if len(versions) > 1:
        per_host = ", ".join(f"{n}: {raw[n]['torch']}" for n in raw if "torch" in raw[n])
        problems.append(HostProblem("(all)", f"torch versions differ between nodes ({per_host}); "
                                             "install one version everywhere"))
    if not problems:
        try:
            check_recipe_for_hardware(recipe, [raw[n.name].get("gpus", 0) for n in nodes])
        except LauncherError as err:
            problems.append(HostProblem("(all)", str(err)))
    if problems:
        close_all(conns)
        raise PreflightFailed(problems)
    facts = {
        name: NodeFacts(torch=f["torch"], cuda=f.get("cuda"), gpus=f.get("gpus", 0),
                        cpus=f.get("cpus") or 1, interface=f.get("interface"),
                        hostname=f.get("hostname", name), env=f.get("env") or {})
        for name, f in raw.items()
    }
    return conns, facts


def close_all(conns: dict[str, Connection]) -> None:
    for conn in conns.values():
        try:
            conn.close()
        except Exception:  # closing is best effort; the run's outcome is already decided
            pass
