"""`launch topo [--local | -i INVENTORY | --cluster NAME | --slurm] [--nodes N] [--json]`: every
node's GPU wiring."""

from __future__ import annotations

import argparse
import json
import shlex

from launcher.backends import NodeResult, backend_for
from launcher.cluster.inventory import Node
from launcher.commands.where import add_where_arguments, where_from_args
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
    p.add_argument("--nodes", type=int, help="with -i: the first N hosts (default: all)")
    add_where_arguments(p)
    p.add_argument("--instance-type", help="on this machine: its instance type")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dry-run", action="store_true",
                   help="say which nodes would be asked and what; contact none")
    p.set_defaults(func=main)


def node_output(answer: NodeResult, instance_type: str | None) -> NodeOutput:
    """One node's `nvidia-smi topo -m` answer, or why there is none."""
    if answer.error is not None:  # unreachable, host key, authentication: named by host
        return NodeOutput(answer.node, instance_type, None, answer.error)
    if answer.exit_code == 127:
        return NodeOutput(answer.node, instance_type, None,
                          "nvidia-smi is not installed: no NVIDIA driver, so no GPU topology "
                          "to read (a CPU machine uses gloo over TCP; `launch setup` installs "
                          "the driver on GPU nodes)")
    if answer.exit_code != 0:
        why = (answer.stderr or answer.stdout).strip().splitlines()[:1] or ["no output"]
        return NodeOutput(answer.node, instance_type, None,
                          f"nvidia-smi topo -m exited with code {answer.exit_code}: {why[0]}")
    return NodeOutput(answer.node, instance_type, answer.stdout)


def main(args) -> int:
    backend = backend_for(where_from_args(args), 1)
    # On this machine one answer covers every local node agent: ask once, as "local".
    nodes = ([Node("local", "127.0.0.1", "127.0.0.1")] if backend.capabilities.one_machine
             else backend.nodes(args.nodes))
    if args.dry_run:
        print(f"launch topo: would run `{shlex.join(NVIDIA_SMI_TOPO)}` on "
              f"{backend.where_nodes(nodes)}; nothing contacted (--dry-run)")
        return 0
    answers = backend.run_on_all(nodes, NVIDIA_SMI_TOPO, timeout=TIMEOUT_S)
    # In the nodes' order; named as the backend answers (Slurm: the allocated nodes' names).
    outputs = [node_output(answer, args.instance_type or node.instance_type)
               for node, answer in zip(nodes, answers)]
    checked = check_topologies(outputs)
    print(json.dumps(checked, indent=2) if args.json else "\n".join(render(checked)))
    return 0 if checked["complete"] else 1
