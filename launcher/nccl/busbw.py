"""nccl-tests' bandwidth arithmetic, for parsed tables and for `launch bench` alike.

algbw is bytes moved per second as the caller sees it: S / t, where S is the size column of
nccl-tests (the larger of the send and receive buffers, so for all_gather and reduce_scatter it
already is count x type size x ranks). busbw scales algbw by how much of the data each rank's
link must carry in a ring, so that it can be compared with a link's rated speed whatever the
collective and rank count (NVIDIA/nccl-tests doc/PERFORMANCE.md). Units are GB/s = 1e9 B/s,
as nccl-tests prints them.
"""

from __future__ import annotations

from fractions import Fraction

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce")

# Bytes per element of the type names nccl-tests prints in its `type` column. Used to turn a
# size into the element count nccl-tests prints beside it, and back.
TYPE_SIZES = {
    "int8": 1, "char": 1, "uint8": 1, "f8e4m3": 1, "f8e5m2": 1,
    "half": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "int": 4, "uint32": 4, "float": 4, "float32": 4,
    "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}

# The collectives whose count column is per rank (the buffer holds one slice per rank).
_PER_RANK_COUNT = {"all_gather", "reduce_scatter", "alltoall"}


def bus_factor(collective: str, nranks: int) -> Fraction:
    """busbw / algbw: 2(n-1)/n for all_reduce, (n-1)/n for the gather/scatter family, 1 else."""
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    if collective == "all_reduce":
        return Fraction(2 * (nranks - 1), nranks)
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return Fraction(nranks - 1, nranks)
    if collective in ("broadcast", "reduce"):
        return Fraction(1)
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


def algo_bandwidth(size_bytes: int, time_s: float) -> float:
    """algbw in GB/s for `size_bytes` moved in `time_s` seconds."""
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s}")
    return size_bytes / time_s / 1e9


def bus_bandwidth(collective: str, size_bytes: int, time_s: float, nranks: int) -> float:
    """busbw in GB/s, as nccl-tests computes it for the same size, time and rank count."""
    return algo_bandwidth(size_bytes, time_s) * float(bus_factor(collective, nranks))


def element_count(collective: str, size_bytes: int, type_size: int, nranks: int) -> int:
    """The `count` column nccl-tests prints for a row of `size_bytes` (elements per rank slice
    for all_gather, reduce_scatter and alltoall; elements of the whole buffer otherwise)."""
    bus_factor(collective, nranks)  # rejects unknown collectives with the same message
    elements = size_bytes // type_size
    return elements // nranks if collective in _PER_RANK_COUNT else elements
