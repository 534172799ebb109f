"""Run folders as `launch run` leaves them, assembled from the area's fixture files.

tests/nccl/data/runs/ holds what the trainer and runner write (plan, summary, result,
metrics); the NCCL logs and topology dumps come from the parser fixtures, one file per host as
NCCL_DEBUG_FILE=nccl-debug.%h.%p.log writes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from launcher.nccl.links import link_peak
from launcher.nccl.nccl_tests import RankDevice, parse_nccl_tests
from launcher.nccl.perf_table import measured_row, render_table
from launcher.nccl.sweep import bandwidth_document

# nccl #527: all_reduce of 1 GiB on two p4d nodes (16 A100s), 35215 us out of place and
# 35198 us in place: busbw 57.17 / 57.20 GB/s over a network of 4x 100 Gb/s = 50 GB/s.
TREE_TIMES_S = (0.035215, 0.035198)


def split_by_host(log: Path, folders: dict[str, Path]) -> None:
    """One log of several hosts -> one file per host; lines without a host go to every one."""
    lines = log.read_text().splitlines(keepends=True)
    for host, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        mine = [line for line in lines
                if line.startswith(f"{host}:") or not any(line.startswith(f"{h}:")
                                                          for h in folders)]
        (folder / f"nccl-debug.{host}.4127.log").write_text("".join(mine))


def copy_log(log: Path, folder: Path, host: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log, folder / f"nccl-debug.{host}.100.log")


def build_runs(data: Path, into: Path) -> tuple[Path, Path]:
    """(runs folder, facts folder) with the runs p4d-socket, bench-sock, p4d-efa, g6e-single
    and bench-tree."""
    runs = into / "runs"
    shutil.copytree(data / "runs", runs)
    sock = runs / "p4d-socket"
    split_by_host(data / "debug_socket_2nodes.log",
                  {"ip-10-0-0-5": sock / "p4d-a", "ip-10-0-0-6": sock / "p4d-b"})
    for node in ("p4d-a", "p4d-b"):
        shutil.copyfile(data / "topo_p4d.txt", sock / node / "topology.txt")
    # The bench beside it: nccl-tests reduce_scatter on the same two hosts, over sockets.
    table = data / "rs_interleaved_debug.txt"
    run = parse_nccl_tests(table.read_text(), str(table))
    doc = bandwidth_document(run, source="nccl-tests", run_id="bench-sock", nnodes=2,
                             instance_type="p4d.24xlarge", peak=link_peak("p4d.24xlarge", 2),
                             backend="nccl", dtype="float")
    (runs / "bench-sock" / "bandwidth.json").write_text(json.dumps(doc, indent=2))
    tree = runs / "bench-tree"
    (tree / "bandwidth.txt").write_text(tree_table())
    run = parse_nccl_tests((tree / "bandwidth.txt").read_text(), str(tree / "bandwidth.txt"))
    doc = bandwidth_document(run, source="nccl-tests", run_id="bench-tree", nnodes=2,
                             instance_type="p4d.24xlarge", peak=link_peak("p4d.24xlarge", 2),
                             backend="nccl", dtype="float")
    (tree / "bandwidth.json").write_text(json.dumps(doc, indent=2))
    efa = runs / "p4d-efa"
    copy_log(data / "debug_efa_node1.log", efa / "efa-1", "ip-172-31-40-11")
    copy_log(data / "debug_efa_node2.log", efa / "efa-2", "ip-172-31-44-200")
    copy_log(data / "debug_single_node_pcie.log", runs / "g6e-single" / "g6e-box", "g6e-box")
    shutil.copyfile(data / "topo_g6e_pcie.txt", runs / "g6e-single" / "g6e-box" / "topology.txt")
    # What `launch setup` fetched for the EFA nodes: their topology and EFA device count.
    facts = into / "launch-home" / "clusters" / "efa" / "facts"
    facts.mkdir(parents=True)
    for host in ("efa-1", "efa-2"):
        (facts / f"{host}.json").write_text(json.dumps({
            "host": host, "efa_devices": 4, "topology": (data / "topo_p4d.txt").read_text()}))
    return runs, facts


def tree_table() -> str:
    """nccl #527's 2-node p4d all_reduce as `launch bench` prints it: 16 ranks, one size."""
    devices = [RankDevice(rank=r, host=("efa-a", "efa-b")[r // 8], device=r % 8,
                          bus_id=f"0x{r % 8:02x}", gpu="NVIDIA A100-SXM4-40GB", pid=100 + r)
               for r in range(16)]
    out_of_place, in_place = ((t, 0) for t in TREE_TIMES_S)
    row = measured_row("all_reduce", 16, size=1 << 30, type="float", out_of_place=out_of_place,
                       in_place=in_place)
    return render_table("all_reduce", devices, [row], warmup_iters=5, iters=20,
                        nccl_version="2.12.12", comment="nccl #527, 2 x p4d.24xlarge")
