"""`launch check [--local | -i INVENTORY | --cluster NAME] [--nodes N] [--collective
[--min-busbw GBS]] [--json] [--verbose]`: node health as a host x check table."""

from __future__ import annotations

import argparse
import json
import os
import sys

from launcher.backends import backend_for, print_plan
from launcher.check import health
from launcher.check.health import GIB
from launcher.check.probe import PROBE_TIMEOUT_S, check_nodes
from launcher.check.verdict_table import render, summary, to_json
from launcher.cluster.inventory import Node
from launcher.commands.common import port_number
from launcher.commands.where import add_where_arguments, where_from_args
from launcher.core.errors import LauncherError
from launcher.runs.folder import check_run_id, new_run_id

# Bounds that keep the numbers finite (inf and nan parse as floats): a petabyte of free disk,
# a bus bandwidth far beyond any link.
MAX_DISK_GB = 1_000_000
MAX_GBS = 1_000_000

HELP = """\
Asks every node at once (one SSH round trip each, about 30 s in all; a node that takes longer
than 90 s is reported unreachable) and prints one row per host, one column per check, each ok,
warn, FAIL or skip, then the evidence of every cell that is not ok:

  reach     the node answered the probe (SSH, its interpreter)
  gpus      GPUs nvidia-smi lists against the inventory's `gpus` or the instance type's count
  ecc       volatile uncorrectable ECC errors (since the driver loaded); ECC switched off
  remap     remapped rows pending or failed, retired pages pending (need a reset / replacing)
  reset     the driver asks for a reset, a drain-and-reset or another recovery action
  throttle  clock slowdowns (hardware: fail; power cap, software thermal: warn) active
  persist   persistence mode
  xid       Xid events in this boot's kernel log; 48 62 63 64 74 79 92 94 95 119 120 fail
  nvlink    every NVLink link up (`nvidia-smi nvlink -s`), where the GPUs have NVLink
  fabric    nvidia-fabricmanager active and the GPUs' fabric state Completed (NVSwitch)
  efa       EFA devices (`fi_info -p efa`, sysfs) against the instance type's count
  memlock   `ulimit -l` unlimited (RDMA pins memory: fail where EFA is expected)
  iface     the interface holding private_ip, which launch hands to gloo/NCCL
  clock     clock offset from the nodes' median (warn from 1 s)
  versions  driver, CUDA, NCCL, torch, Python agree across nodes (torch/NCCL/Python: fail)
  disk      free space under launch_run_root (--min-free-gb)

CPU-only nodes show the GPU checks as skip. With --collective, a short all-reduce over all
nodes follows (launch_bench/bench.py --gate through the same launch path as `launch run`), against
--min-busbw when given, else each node against the others; when it is under the bar, node
pairs are measured in rounds of disjoint pairs until the slow node is named (columns busbw
and transport: the network NCCL used against the EFA/sockets the node should use).

Exit codes: 0 no check failed; 1 some check failed; 2 bad arguments or inventory.
"""


def register(sub) -> None:
    p = sub.add_parser("check", help="node health: GPUs, Xid, NVLink, fabric manager, EFA, "
                                     "memlock, clocks, versions, disk; --collective names a "
                                     "slow node",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, help="with -i: the first N hosts (default: all)")
    add_where_arguments(p)
    p.add_argument("--collective", action="store_true",
                   help="also run the collective gate (all-reduce, then node pairs)")
    p.add_argument("--min-busbw", type=float, metavar="GBS",
                   help="with --collective: the bus bandwidth (GB/s) every node pair must "
                        "reach; without it nodes are judged against each other")
    p.add_argument("--min-free-gb", type=float, default=10.0,
                   help="free disk under the run root below which disk fails (default 10)")
    p.add_argument("--instance-type", help="--local: this machine's instance type")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--verbose", action="store_true", help="evidence of every cell, ok too")
    p.add_argument("--runs-dir", default="runs",
                   help="--collective: where the gate's run folder goes (default: runs/)")
    p.add_argument("--rdzv-port", type=port_number,
                   help="--collective: rendezvous port of the gate job (default: 29500 "
                        "with -i, a free one on this machine)")
    p.add_argument("--dry-run", action="store_true",
                   help="say which nodes would be asked and what (and, with --collective, the "
                        "gate job's plan); contact none, write nothing")
    p.set_defaults(func=main)


def _local_node(args) -> Node:
    return Node("local", "127.0.0.1", "127.0.0.1", python=sys.executable,
                run_root=os.path.abspath(args.runs_dir),
                instance_type=args.instance_type)


def main(args) -> int:
    if args.min_busbw is not None and not args.collective:
        raise LauncherError("--min-busbw is the floor of the collective gate: give --collective")
    if args.min_busbw is not None and not 0 < args.min_busbw < MAX_GBS:
        raise LauncherError(f"--min-busbw must be a bandwidth above 0 GB/s (below {MAX_GBS:,}), "
                            f"got {args.min_busbw}")
    if not 0 <= args.min_free_gb <= MAX_DISK_GB:
        raise LauncherError(f"--min-free-gb must be from 0 to {MAX_DISK_GB:,} GB, got "
                            f"{args.min_free_gb}")
    backend = backend_for(where_from_args(args), 1, say=lambda text: print(text, file=sys.stderr))
    # This machine answers once, whatever the number of local node agents.
    nodes = [_local_node(args)] if backend.capabilities.one_machine \
        else backend.nodes(args.nodes)
    if args.dry_run:
        return dry_run(args, backend, nodes)
    out = sys.stderr if args.json else sys.stdout
    rows = check_nodes(backend, nodes, min_free_bytes=int(args.min_free_gb * GIB))
    table = [(row.node.name, row.checks) for row in rows]
    gate = None
    if args.collective:
        from launcher.pipeline.gate import run_gate
        from launcher.pipeline.run import start_anywhere

        gate_nodes = _gate_nodes(args, backend)
        reachable = {row.node.name for row in rows if "reach" not in row.failed}
        if not backend.capabilities.one_machine:
            gate_nodes = [n for n in gate_nodes if n.name in reachable]
        if _gate_runs(backend, gate_nodes):
            gate = run_gate(backend, gate_nodes, run_id=check_run_id(new_run_id("gate")),
                            runs_dir=args.runs_dir, floor_gbs=args.min_busbw,
                            rdzv_port=args.rdzv_port, stream=out,
                            start=start_anywhere(backend))
            busbw, transport = gate.busbw_checks(), gate.transports
            if backend.capabilities.one_machine:   # one row for this machine: its agents' worst
                busbw = {"local": _worst(busbw.values())} if busbw else {}
                transport = {"local": _worst(transport.values())} if transport else {}
            for host, checks in table:
                if host in busbw:
                    checks["busbw"] = busbw[host]
                if host in transport:
                    checks["transport"] = transport[host]
        else:
            print(f"launch: gate: skipped: {len(gate_nodes)} reachable node(s), a collective "
                  "needs two", file=out)
    if args.json:
        print(json.dumps(to_json(table, collective=gate.to_json() if gate else None), indent=2))
    else:
        print(render(table, verbose=args.verbose), end="")
        if gate is not None:
            for line in gate.story():
                print(f"launch: {line}")
        print(summary(table))
    failed = any(c.status == health.FAIL for _, checks in table for c in checks.values())
    return 1 if failed else 0


def _gate_nodes(args, backend) -> list[Node]:
    return backend.nodes(args.nodes or 2) if backend.capabilities.one_machine else \
        backend.nodes(args.nodes)


def _gate_runs(backend, nodes: list[Node]) -> bool:
    return len(nodes) >= 2 or backend.capabilities.one_machine


def dry_run(args, backend, nodes: list[Node]) -> int:
    """What a real check would do: the probe on each node, then the gate job's plan."""
    gate = None
    if args.collective:
        from launcher.pipeline.gate import plan_gate

        gate_nodes = _gate_nodes(args, backend)
        if _gate_runs(backend, gate_nodes):
            gate = plan_gate(backend, gate_nodes, run_id=check_run_id(new_run_id("gate")),
                             runs_dir=args.runs_dir, floor_gbs=args.min_busbw,
                             rdzv_port=args.rdzv_port)
    if args.json:
        print(json.dumps({"probe": {"nodes": [n.name for n in nodes],
                                    "timeout_s": PROBE_TIMEOUT_S},
                          "gate": json.loads(gate.dumps()) if gate else None}, indent=2))
        return 0
    print(f"launch check: would run launcher/check/ask_node.py with each node's python on "
          f"{backend.where_nodes(nodes)}, at most {PROBE_TIMEOUT_S:g} s each")
    if gate is not None:
        print("then, with the nodes that answer, the collective gate:")
        print_plan(gate, False)
    print("nothing contacted, nothing written (--dry-run)")
    return 0


def _worst(checks):
    order = {health.FAIL: 0, health.WARN: 1, health.OK: 2, health.SKIP: 3}
    return min(checks, key=lambda c: order[c.status])
