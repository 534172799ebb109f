"""`launch bench [--nodes N] (--local | -i INVENTORY | --slurm) [--op OP] [--min-bytes 8]
[--max-bytes 1G] [--dtype float|bfloat16] [--nccl-tests] [--dry-run [--json]]`."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path

from launcher.backends import backend_for, print_plan
from launcher.cluster.inventory import Node
from launcher.commands.common import grace_seconds
from launcher.commands.where import add_where_arguments, where_from_args
from launcher.core.errors import LauncherError, RunFailed
from launcher.nccl import sweep
from launcher.pipeline.bench import bench_request, finish, finish_sweep, instance_type_of
from launcher.pipeline.run import run
from launcher.runs.folder import RunFolder, check_run_id, new_run_id

HELP = """\
Measures the bus bandwidth of one collective across the nodes, the way nccl-tests does: for each
size from --min-bytes to --max-bytes (doubling), warm-up iterations, a barrier, --iters timed
iterations (time averaged over ranks), then one more on fresh data whose every element is
checked (#wrong). The sweep is launch_bench/bench.py started through the same torchrun launch path as
`launch run` (NCCL on GPUs, gloo on CPU). The table is printed in nccl-tests' own layout with
its algbw/busbw formulas, and runs/<run_id>/ gets bandwidth.txt (that table: `launch inspect`
reads it), bandwidth.json, bandwidth.png (busbw against size, with the link's peak from the
catalog when the instance type is known) and the run report.

--max-bytes defaults to 1G when the nodes have GPUs and 64M on CPU nodes (gloo moves about
1 GB/s there, and 64M already shows where its bandwidth flattens).

--nccl-tests runs the nccl-tests binary instead (<op>_perf from --nccl-tests-dir, where
`launch setup` builds it): with --local, one process over this machine's GPUs; with -i, on the
head node, through mpirun across all nodes when there is more than one: a hostfile with a slot
per GPU, one rank per GPU, and -x for each setting of the head's /etc/launch/nccl.env (the MPI
build of nccl-tests and the SSH between the nodes come from `launch setup`).

Exit codes: 0 measured; 1 the sweep failed (logs kept in the run folder) or counted wrong
elements; 2 bad arguments or nccl-tests not installed.
"""


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure collective bus bandwidth across nodes "
                                     "(nccl-tests' table, bandwidth.json, bandwidth.png)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int,
                   help="number of nodes (default: 2 on this machine, every host with -i)")
    add_where_arguments(p)
    p.add_argument("--op", choices=sweep.OPS, default="all_reduce")
    p.add_argument("--min-bytes", default=str(sweep.DEFAULT_MIN_BYTES),
                   help="smallest size: 8, 1K, 64M, 1G (default 8)")
    p.add_argument("--max-bytes", help="largest size (default: 1G with GPUs, 64M on CPU)")
    p.add_argument("--dtype", choices=sweep.DTYPES, default="float")
    p.add_argument("--warmup-iters", type=int, default=sweep.WARMUP_ITERS)
    p.add_argument("--iters", type=int, default=sweep.ITERS, help="timed iterations per size")
    p.add_argument("--instance-type",
                   help="the nodes' instance type, for the peak line (default with -i: the "
                        "inventory's instance_type)")
    p.add_argument("--nccl-tests", action="store_true",
                   help="run the nccl-tests binary instead of the torch.distributed sweep")
    p.add_argument("--nccl-tests-dir", default=sweep.NCCL_TESTS_DIR,
                   help=f"where <op>_perf is (default {sweep.NCCL_TESTS_DIR})")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.add_argument("--run-id", help="name of the run folder (default bench-<op>-<time>-<hex>)")
    p.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs/)")
    p.add_argument("--grace", type=grace_seconds, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping nodes (default 5)")
    p.set_defaults(func=main)


def _sizes(args, gpus_per_node: Callable[[], list[int]]) -> tuple[int, int]:
    """--min/--max-bytes; the GPU count (torch import, SSH facts) only when --max-bytes is
    not given, so that a wrong size is reported at once."""
    low = sweep.parse_size(args.min_bytes, "--min-bytes")
    high = (sweep.parse_size(args.max_bytes, "--max-bytes") if args.max_bytes
            else sweep.default_max_bytes(gpus_per_node()))
    sweep.sweep_sizes(low, high)  # refuses min > max before anything starts
    return low, high


def _check_iters(args) -> None:
    if args.iters < 1 or args.warmup_iters < 0:
        raise LauncherError(f"--iters must be at least 1 and --warmup-iters at least 0 (got "
                            f"{args.iters} and {args.warmup_iters})")


def main(args) -> int:
    _check_iters(args)
    if args.json and not args.dry_run:
        raise LauncherError("--json prints the plan and goes with --dry-run")
    run_id = check_run_id(args.run_id) if args.run_id else new_run_id(f"bench-{args.op}")
    backend = backend_for(where_from_args(args), 1 if args.nccl_tests else args.nodes or 2)
    # nccl-tests on this machine is one process driving all its GPUs: one node.
    count = 1 if args.nccl_tests and backend.capabilities.one_machine else args.nodes
    nodes = backend.nodes(count)
    if args.nccl_tests:
        support = backend.capabilities.support("nccl-tests")
        if not support.ok:
            raise LauncherError(f"--nccl-tests: {support.why}")
        return bench_nccl_tests(args, backend, nodes, run_id)
    return bench_sweep(args, backend, nodes, run_id)


def bench_sweep(args, backend, nodes: list[Node], run_id: str) -> int:
    """launch_bench/bench.py on every node through the same pipeline as `launch run`."""
    low, high = _sizes(args, lambda: backend.gpus(nodes))
    request = bench_request(backend, len(nodes), run_id, args.runs_dir, args.grace, op=args.op,
                            sizes=sweep.sweep_sizes(low, high), dtype=args.dtype,
                            warmup_iters=args.warmup_iters, iters=args.iters)
    if args.dry_run:
        print_plan(backend.plan(request, nodes), args.json)
        return 0
    summary = run(backend, request)
    # The nodes that ran, as the run names them (Slurm's only once it has placed the job).
    return finish_sweep(Path(args.runs_dir).resolve() / run_id,
                        [n["name"] for n in summary["nodes"]], summary["nproc_per_node"],
                        args.instance_type or instance_type_of(nodes))


# ----------------------------------------------------------------------------- nccl-tests


# Prints the first argument that is not an executable file, and fails; nothing when all are.
_FIRST_MISSING = 'for f; do [ -x "$f" ] || { echo "$f"; exit 1; }; done'


def _nccl_tests_binary(args) -> str:
    return str(Path(args.nccl_tests_dir) / f"{args.op}_perf")


def bench_nccl_tests(args, backend, nodes: list[Node], run_id: str) -> int:
    """The nccl-tests binary on the head node, through mpirun across the nodes when there are
    several (the MPI build, SSH between the nodes: `launch setup` makes both)."""
    binary = _nccl_tests_binary(args)
    head = nodes[0]
    gpus = max(1, backend.gpus([head])[0])
    low, high = _sizes(args, lambda: backend.gpus(nodes))
    test = sweep.nccl_tests_argv(binary, min_bytes=low, max_bytes=high, dtype=args.dtype,
                                 warmup_iters=args.warmup_iters, iters=args.iters, gpus=gpus)
    # The head's /etc/launch/nccl.env (EFA nodes): NCCL_*, FI_* and LD_LIBRARY_PATH for every
    # rank, and it says which Open MPI the node has. A dry run connects to nothing.
    node_env = {}
    if len(nodes) > 1 and not args.dry_run:
        found = backend.run_on_all([head], ["cat", head.env_file], timeout=60)[head.name]
        node_env = sweep.parse_env_text(found.stdout) if found.ok else {}
    hostfile = f"/tmp/launch-{run_id}.hostfile"
    argv = test if len(nodes) == 1 else sweep.with_hostfile(
        sweep.hostfile_text([n.private_address for n in nodes], gpus), hostfile,
        sweep.mpirun_argv(sweep.mpi_prefix(node_env), hostfile, len(nodes), gpus,
                          {"NCCL_DEBUG": "INFO", **node_env}, test))
    where = backend.where_nodes([head])
    if args.dry_run:
        note = (f"\n  (and -x KEY=VALUE for each setting in {head.env_file} on {head.name}, "
                "whose FI_PROVIDER=efa also selects the EFA installer's Open MPI)"
                if len(nodes) > 1 else "")
        print(json.dumps({"run_id": run_id, "node": head.name, "argv": argv}) if args.json
              else f"run {run_id}: nccl-tests on {where}\n  {shlex.join(argv)}{note}")
        return 0
    needed = [binary] + ([f"{sweep.mpi_prefix(node_env)}/bin/mpirun"] if len(nodes) > 1 else [])
    missing = backend.run_on_all([head], ["sh", "-c", _FIRST_MISSING, "launch-check", *needed],
                                 timeout=60)[head.name]
    if missing.error is not None:
        raise LauncherError(f"host {head.name}: {missing.error}")
    if missing.exit_code != 0:
        raise LauncherError(
            f"nccl-tests are not installed on {where}: no executable {missing.stdout.strip()}. "
            "`launch setup` builds them (with MPI) on GPU nodes (role nccl_tests); pass "
            "--nccl-tests-dir for another build, or drop --nccl-tests to measure with the "
            "torch.distributed sweep")
    folder = RunFolder.create(args.runs_dir, run_id)
    node_dir = folder.node_dir(head.name)
    node_dir.mkdir()
    # On this machine NCCL's debug lines go to files, as in `launch run`, so the table stays
    # clean and the run report reads the transports.
    env = ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{node_dir}/nccl-debug.%h.%p.log"}
           if backend.capabilities.shared_files else {})
    folder.write_json("plan.json", {
        "run_id": run_id, "nnodes": len(nodes), "world_size": len(nodes) * gpus,
        "nodes": [{"name": n.name, "gpus": n.gpus, "argv": argv if n is head else [],
                   "env": env if n is head else {}, "instance_type": n.instance_type}
                  for n in nodes]})
    result = backend.run_on_all([head], argv, timeout=3600, env=env)[head.name]
    output = result.stdout + result.stderr + (result.error or "")
    (node_dir / "node.log").write_text(output)
    folder.write_json("summary.json", {"run_id": run_id,
                                       "status": "succeeded" if result.ok else "failed",
                                       "exit_code": result.exit_code})
    if result.error is not None:
        raise RunFailed(f"host {head.name}: {result.error}")
    if result.exit_code != 0:
        tail = "\n".join(f"  {line}" for line in output.splitlines()[-20:])
        raise RunFailed(f"{where}: nccl-tests exited with code {result.exit_code}; last "
                        f"lines:\n{tail}\nfull output in {node_dir / 'node.log'}")
    return finish(folder.root, result.stdout, source="nccl-tests", backend="nccl",
                  dtype=args.dtype, nnodes=len(nodes),
                  instance_type=args.instance_type or instance_type_of(nodes))
