"""nccl-tests' bandwidth formulas (doc/PERFORMANCE.md), checked against hand arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest

from launcher.nccl.busbw import algo_bandwidth, bus_bandwidth, bus_factor, element_count


@pytest.mark.parametrize("collective, nranks, factor", [
    ("all_reduce", 8, Fraction(7, 4)),
    ("all_reduce", 2, Fraction(1)),
    ("all_reduce", 1, Fraction(0)),
    ("reduce_scatter", 16, Fraction(15, 16)),
    ("all_gather", 4, Fraction(3, 4)),
    ("alltoall", 2, Fraction(1, 2)),
    ("broadcast", 8, Fraction(1)),
    ("reduce", 8, Fraction(1)),
])
def test_bus_factor(collective, nranks, factor):
    assert bus_factor(collective, nranks) == factor


def test_bandwidths_in_gb_per_second():
    # 4 GB in half a second is 8 GB/s seen by the caller; an 8-rank ring all_reduce moves
    # 2(8-1)/8 of it over each link.
    assert algo_bandwidth(4_000_000_000, 0.5) == pytest.approx(8.0)
    assert bus_bandwidth("all_reduce", 4_000_000_000, 0.5, 8) == pytest.approx(14.0)
    assert bus_bandwidth("all_gather", 4_000_000_000, 0.5, 4) == pytest.approx(6.0)
    assert bus_bandwidth("broadcast", 4_000_000_000, 0.5, 4) == pytest.approx(8.0)


def test_unknown_collective_and_bad_time_are_refused():
    with pytest.raises(ValueError, match="sendrecv"):
        bus_factor("sendrecv", 2)
    with pytest.raises(ValueError, match="positive"):
        algo_bandwidth(1024, 0.0)


@pytest.mark.parametrize("collective, expected", [
    ("all_reduce", 262144), ("broadcast", 262144), ("reduce", 262144),
    ("all_gather", 16384), ("reduce_scatter", 16384), ("alltoall", 16384),
])
def test_element_count_is_per_rank_for_the_gather_family(collective, expected):
    assert element_count(collective, 1 << 20, 4, 16) == expected
