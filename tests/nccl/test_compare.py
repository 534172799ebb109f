"""Which figure a link's speed is held against: busbw on one node, what crosses each node's
network across nodes, and the sentence `launch bench` ends with."""

from __future__ import annotations

from fractions import Fraction

import pytest

from launcher.nccl.compare import Point, bench_verdict, compare, node_factor
from launcher.nccl.links import LinkPeak
from launcher.nccl.nccl_tests import parse_nccl_tests
from tests.nccl.runfolders import tree_table


def test_what_crosses_each_nodes_network():
    # all_reduce on m nodes: 2(m-1)/m of algbw; the gather/scatter family (m-1)/m; a root
    # collective all of it; alltoall (m-1)/m of every local rank's buffer.
    assert node_factor("all_reduce", 2, 16) == 1
    assert node_factor("all_reduce", 4, 32) == Fraction(3, 2)
    assert node_factor("reduce_scatter", 2, 8) == Fraction(1, 2)
    assert node_factor("broadcast", 3, 24) == 1
    assert node_factor("alltoall", 2, 16) == 4
    assert node_factor("alltoall", 2, None) is None  # ranks per node unknown
    assert node_factor(None, 2, 16) is None
    assert node_factor("all_reduce", 1, 8) is None


def test_one_node_holds_busbw_against_the_gpu_link():
    got = compare("all_reduce", [Point(1 << 30, 131.87, 230.77)], nnodes=1, nranks=8,
                  instance_type="p4d.24xlarge")
    assert (got.figure, got.measured, got.peak.gbps, got.ratio) == ("busbw", 230.77, 300.0, 0.7692)
    assert got.basis == "one node: busbw is nccl-tests' figure for a GPU link"


def test_without_a_catalog_type_the_written_peak_is_used_with_busbw():
    written = LinkPeak(12.5, "a 100 Gb/s NIC")
    got = compare("all_reduce", [Point(8, 1.0, 1.9)], nnodes=2, nranks=4, instance_type=None,
                  peak=written)
    assert (got.figure, got.peak, got.ratio) == ("busbw", written, 0.152)
    assert compare("all_reduce", [Point(8, 1.0, 1.9)], nnodes=2, nranks=4,
                   instance_type=None) is None
    assert compare("all_reduce", [], nnodes=1, nranks=4, instance_type="p4d.24xlarge") is None


def test_bench_line_for_a_tree_run_above_the_wire():
    run = parse_nccl_tests(tree_table())
    assert bench_verdict(run, nnodes=2, instance_type="p4d.24xlarge", peak=None) == (
        "peak bus bandwidth 57.20 GB/s at 1 GiB; algbw 30.51 GB/s at 1 GiB = 61% of "
        "p4d.24xlarge network 4x 100 Gigabit = 50 GB/s per node (across 2 nodes each node's "
        "network carries at least all_reduce's algbw whatever algorithm NCCL picks; busbw "
        "assumes one ring of all ranks; busbw 57.20 GB/s is above the network's line rate "
        "because NCCL's tree algorithm sends less across nodes than busbw assumes: set "
        "NCCL_ALGO=Ring to measure the ring)")
    assert bench_verdict(run, nnodes=2, instance_type=None, peak=None) == (
        "peak bus bandwidth 57.20 GB/s at 1 GiB (no instance type known: no peak to compare "
        "with)")


@pytest.mark.parametrize("nnodes", [1, 2])
def test_busbw_ratio_is_the_most_the_links_can_have_carried(nnodes):
    got = compare("all_reduce", [Point(1 << 30, 30.49, 57.17)], nnodes=nnodes, nranks=16,
                  instance_type="p4d.24xlarge")
    assert got.busbw_ratio == round(57.17 / got.peak.gbps, 4)
