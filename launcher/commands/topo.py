"""`launch topo (--local | -i INVENTORY) [--nodes N] [--json]`: every node's GPU wiring."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess

from launcher.commands.common import add_ssh_arguments
from launcher.errors import LauncherError
from launcher.inventory import Node, load_inventory, select_nodes
from launcher.nccl.topocheck import NodeOutput, check_topologies, render

HELP = """\
Runs `nvidia-smi topo -m` on every node, parses it (GPU x GPU and GPU x NIC link codes, class
nvswitch / partial-nvlink / pcie, worst GPU link), reports where nodes differ from each other
or from the catalog row of their instance type (inventory key instance_type; --instance-type
with --local), and recommends DDP settings: compression and larger buckets on PCIe-only nodes
or a slow network, none needed behind NVSwitch and EFA/InfiniBand.

A node without nvidia-smi (no NVIDIA driver: a CPU machine, or `launch setup` not run) is
reported as such. Exit codes: 0 every node's topology was read; 1 some node had none (the
others are still reported); 2 bad arguments or inventory.
"""

NVIDIA_SMI_TOPO = ["nvidia-smi", "topo", "-m"]
TIMEOUT_S = 60.0


def register(sub) -> None:
    p = sub.add_parser("topo", help="read nvidia-smi topo -m on every node, compare, recommend",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="this machine")
    where.add_argument("-i", "--inventory", help="Ansible YAML inventory")
    p.add_argument("--nodes", type=int, help="with -i: the first N hosts (default: all)")
    p.add_argument("--instance-type", help="with --local: this machine's instance type")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_ssh_arguments(p)
    p.set_defaults(func=main)


def local_output(instance_type: str | None) -> NodeOutput:
    name = "local"
    if shutil.which(NVIDIA_SMI_TOPO[0]) is None:
        return NodeOutput(name, instance_type, None,
                          "nvidia-smi not found on this machine: no NVIDIA driver, so no GPU "
                          "topology to read (a CPU machine uses gloo over TCP)")
    try:
        proc = subprocess.run(NVIDIA_SMI_TOPO, capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return NodeOutput(name, instance_type, None, f"nvidia-smi topo -m failed: {err}")
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()[:1] or ["no output"]
        return NodeOutput(name, instance_type, None,
                          f"nvidia-smi topo -m exited with code {proc.returncode}: {why[0]}")
    return NodeOutput(name, instance_type, proc.stdout)


def remote_output(node: Node, options) -> NodeOutput:
    from launcher.nccl.remote import run_on_node

    try:
        result = run_on_node(node, NVIDIA_SMI_TOPO, options, timeout=TIMEOUT_S)
    except LauncherError as err:  # unreachable, host key, authentication: named by host
        return NodeOutput(node.name, node.instance_type, None, str(err))
    if result.exit_code == 127:
        return NodeOutput(node.name, node.instance_type, None,
                          "nvidia-smi is not installed (no NVIDIA driver; `launch setup` "
                          "installs it on GPU nodes)")
    if result.exit_code != 0:
        why = (result.stderr or result.stdout).strip().splitlines()[:1] or ["no output"]
        return NodeOutput(node.name, node.instance_type, None,
                          f"nvidia-smi topo -m exited with code {result.exit_code}: {why[0]}")
    return NodeOutput(node.name, node.instance_type, result.stdout)


def main(args) -> int:
    if args.local:
        outputs = [local_output(args.instance_type)]
    elif args.inventory:
        from launcher.execute.ssh import in_parallel
        from launcher.ssh import SshOptions

        nodes = load_inventory(args.inventory)
        nodes = select_nodes(nodes, args.nodes or len(nodes), args.inventory)
        options = SshOptions.from_args(args)
        by_name = {node.name: node for node in nodes}
        answers = in_parallel(lambda name: remote_output(by_name[name], options), list(by_name))
        outputs = [answers[node.name] if isinstance(answers[node.name], NodeOutput)
                   else NodeOutput(node.name, node.instance_type, None,
                                   f"{type(answers[node.name]).__name__}: {answers[node.name]}")
                   for node in nodes]
    else:
        raise LauncherError("say where to look: --local for this machine, or -i INVENTORY.yml "
                            "for hosts over SSH")
    checked = check_topologies(outputs)
    print(json.dumps(checked, indent=2) if args.json else "\n".join(render(checked)))
    return 0 if checked["complete"] else 1
