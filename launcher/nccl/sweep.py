"""`launch bench`, the pure parts: sizes, the program torchrun starts, the nccl-tests command,
and the sweep's results turned into nccl-tests' own table and `bandwidth.json`.

Both sources (launch_bench/bench.py's torch.distributed sweep and the nccl-tests binaries) end as the
same thing: text in nccl-tests' layout, read by `parse_nccl_tests`. So bandwidth.json has the
shape `launch inspect --json` gives any nccl-tests log, and `launch inspect bandwidth.txt`
reads a bench back.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.core.errors import LauncherError
from launcher.nccl.compare import compare, points_of_run
from launcher.nccl.links import LinkPeak
from launcher.nccl.nccl_tests import Measurement, NcclTestsRun, RankDevice
from launcher.nccl.perf_table import measured_row, render_table

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPES = ("float", "bfloat16")
# nccl-tests' own defaults (-b 8 -w 5 -n 20). The largest size depends on the hardware: 1 GiB
# reaches a GPU link's plateau, but a CPU all-reduce over gloo moves ~1 GB/s on this kind of
# box, and 64 MiB already shows where its bandwidth flattens, in seconds rather than minutes.
DEFAULT_MIN_BYTES = 8
DEFAULT_MAX_BYTES_GPU = 1 << 30
DEFAULT_MAX_BYTES_CPU = 64 << 20
WARMUP_ITERS = 5
ITERS = 20
STEP_FACTOR = 2
RESULTS_FILE = "bench-results.json"  # what launch_bench/bench.py's rank 0 writes in its node folder
# Where the nccl_tests role installs the binaries (playbooks/roles/nccl_tests/defaults).
NCCL_TESTS_DIR = "/opt/launch/nccl-tests/bin"

NOT_MEASURED = Measurement(time_us=None, algbw=None, busbw=None, wrong=None)

_SIZE = re.compile(r"(?P<number>[0-9]+)\s*(?P<unit>[KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class BenchError(LauncherError):
    """A bench that cannot start or whose results cannot be read."""


def parse_size(text: str, flag: str) -> int:
    """`8`, `1K`, `64M`, `1G` (binary units, as nccl-tests' -b/-e read them) -> bytes."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise BenchError(f"{flag} {text!r}: expected bytes as a number with an optional K, M or "
                         "G suffix (8, 1K, 64M, 1G)")
    size = int(match["number"]) * _UNITS[match["unit"].upper()]
    if size < 1:
        raise BenchError(f"{flag} {text!r}: must be at least 1 byte")
    return size


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = STEP_FACTOR) -> list[int]:
    """min, min*factor, ... up to max, as nccl-tests' `-b MIN -e MAX -f FACTOR` steps."""
    if min_bytes > max_bytes:
        raise BenchError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def default_max_bytes(gpus_per_node: list[int]) -> int:
    return DEFAULT_MAX_BYTES_GPU if any(gpus_per_node) else DEFAULT_MAX_BYTES_CPU


def bench_args(op: str, sizes: list[int], dtype: str, warmup_iters: int,
               iters: int) -> list[str]:
    """launch_bench/bench.py's flags for one sweep (the program and its --out-dir are the
    plan's: launcher/job/spec.py workload)."""
    return ["--op", op, "--sizes", ",".join(str(s) for s in sizes), "--dtype", dtype,
            "--warmup-iters", str(warmup_iters), "--iters", str(iters)]


def find_results(run_dir: Path, nodes: list[str]) -> Path:
    """The node folder that held rank 0 has the results (c10d decides which node that is)."""
    for node in nodes:
        path = run_dir / node / RESULTS_FILE
        if path.exists():
            return path
    raise BenchError(f"{run_dir}: no node folder holds {RESULTS_FILE}; the sweep did not "
                     "finish (see the node.log files there)")


def load_results(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(path.read_text())
        for key in ("op", "dtype", "world_size", "backend", "warmup_iters", "iters", "ranks",
                    "rows"):
            results[key]  # noqa: B018 (a KeyError names the missing key)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BenchError(f"{path}: not the results launch_bench/bench.py writes ({err}); rerun "
                         "`launch bench`") from None
    return results


def results_table(results: dict[str, Any], comment: str) -> str:
    """The sweep in nccl-tests' layout, with its algbw/busbw formulas."""
    op, world = results["op"], results["world_size"]
    redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
    root = 0 if op == "broadcast" else -1
    rows = []
    for row in results["rows"]:
        sides = {side: None if row[side] is None else (row[side]["time_s"], row[side]["wrong"])
                 for side in ("out_of_place", "in_place")}
        measured = measured_row(op, world, size=row["size"], type=results["dtype"],
                                redop=redop, root=root, **sides)
        # A placement torch.distributed does not offer prints N/A, not nccl-tests' blank
        # body: a row must keep all its columns for the table to parse back.
        rows.append(replace(measured,
                            out_of_place=measured.out_of_place or NOT_MEASURED,
                            in_place=measured.in_place or NOT_MEASURED))
    devices = [RankDevice(rank=rank, host=info["node"], device=info["device"],
                          bus_id=info["bus_id"], gpu=info["gpu"], pid=info["pid"])
               for rank, info in enumerate(results["ranks"])]
    return render_table(op, devices, rows, warmup_iters=results["warmup_iters"],
                        iters=results["iters"], nccl_version=results.get("nccl_version"),
                        comment=comment)


def bandwidth_document(run: NcclTestsRun, *, source: str, run_id: str, nnodes: int,
                       instance_type: str | None, peak: LinkPeak | None,
                       backend: str | None, dtype: str) -> dict[str, Any]:
    """bandwidth.json: what `launch inspect --json` says of the table, plus where it ran, the
    link peak the plot draws, and the comparison a run report quotes (launcher.nccl.compare)."""
    compared = compare(run.collective, points_of_run(run), nnodes=nnodes, nranks=run.ranks,
                       instance_type=instance_type, peak=peak)
    return {
        "source": source, "run_id": run_id, "table": "bandwidth.txt", "backend": backend,
        "dtype": dtype, "nnodes": nnodes, "instance_type": instance_type,
        "link_peak": peak.to_json() if peak else None,
        "compared": compared.to_json() if compared else None,
        **run.to_json(),
    }


def nccl_tests_argv(binary: str, *, min_bytes: int, max_bytes: int, dtype: str,
                    warmup_iters: int, iters: int, gpus: int) -> list[str]:
    """One nccl-tests process driving `gpus` GPUs (-g), checking every result (-c 1)."""
    return [binary, "-b", str(min_bytes), "-e", str(max_bytes), "-f", str(STEP_FACTOR),
            "-d", dtype, "-w", str(warmup_iters), "-n", str(iters), "-c", "1",
            "-g", str(gpus)]


# Open MPI on the nodes, as the nccl_tests role builds against it: the EFA installer's on EFA
# nodes, the distribution's (openmpi-bin) elsewhere.
MPI_PREFIX_EFA = "/opt/amazon/openmpi"
MPI_PREFIX_DISTRO = "/usr"


def mpi_prefix(env: dict[str, str]) -> str:
    """Which Open MPI a node has, from its /etc/launch/nccl.env (written on EFA nodes only)."""
    return MPI_PREFIX_EFA if env.get("FI_PROVIDER") == "efa" else MPI_PREFIX_DISTRO


def parse_env_text(text: str) -> dict[str, str]:
    """KEY=VALUE lines of /etc/launch/nccl.env (`#` comments; no quoting or expansion)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def hostfile_text(addresses: list[str], gpus_per_node: int) -> str:
    """Open MPI's hostfile: one line per node, a slot per GPU."""
    return "".join(f"{address} slots={gpus_per_node}\n" for address in addresses)


def mpirun_argv(prefix: str, hostfile: str, nodes: int, gpus_per_node: int,
                env: dict[str, str], test_argv: list[str]) -> list[str]:
    """nccl-tests across nodes: one MPI rank per GPU (-g 1), started from the head node.

    Needs the MPI build of nccl-tests (the nccl_tests role's default) and SSH from node to node
    (the cluster_ssh role: Open MPI's daemons start each other over SSH). `--prefix` lets the
    other nodes find Open MPI's daemon where it is not on a login shell's PATH. MPI only starts
    the ranks: its own traffic stays on TCP (`pml ^cm,ucx`, `btl tcp,self`) while NCCL picks EFA
    or sockets itself. `-x` hands NCCL's and libfabric's settings to every rank.
    """
    argv = [f"{prefix}/bin/mpirun", "--allow-run-as-root", "--prefix", prefix,
            "--hostfile", hostfile, "-np", str(nodes * gpus_per_node),
            "--map-by", f"ppr:{gpus_per_node}:node", "--bind-to", "none",
            "--mca", "pml", "^cm,ucx", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_exclude", "lo,docker0"]
    for key, value in env.items():
        argv += ["-x", f"{key}={value}"]
    per_rank = list(test_argv)
    per_rank[per_rank.index("-g") + 1] = "1"
    return argv + per_rank


def with_hostfile(text: str, path: str, argv: list[str]) -> list[str]:
    """argv preceded by writing the hostfile on the same node, in one remote command; the file's
    text and path travel as arguments, never inside the script."""
    return ["sh", "-c", 'printf "%s" "$1" > "$2" && shift 2 && exec "$@"', "launch-bench",
            text, path, *argv]
