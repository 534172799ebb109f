"""nccl-tests' table layout written by `launch bench`, and read back by our own parser."""

from __future__ import annotations

import pytest

from launcher.nccl.nccl_tests import Measurement, RankDevice, ResultRow, parse_nccl_tests
from launcher.nccl.perf_table import format_float, format_row, measured_row, render_table


@pytest.mark.parametrize("value, width, printed", [
    (27.764, 7, "  27.76"),
    (0.0012, 6, "  0.00"),
    (1234.567, 7, "1234.57"),
    (12345.67, 7, "12345.7"),
    (123456.7, 7, " 123457"),
    (1.23e8, 7, "1.2e+08"),
    (231.456, 6, "231.46"),
    (1234.5, 6, "1234.5"),
    (123456.0, 6, "123456"),
    (1.23e7, 6, " 1e+07"),
])
def test_format_float_squeezes_like_nccl_tests(value, width, printed):
    assert format_float(value, width) == printed


def test_a_row_is_byte_for_byte_the_layout_nccl_tests_prints():
    row = ResultRow(size=1048576, count=262144, type="float", redop="sum", root=-1,
                    out_of_place=Measurement(27.76, 37.78, 66.11, 0),
                    in_place=Measurement(27.49, 38.15, 66.76, None))
    assert format_row(row) == ("     1048576        262144     float     sum      -1    27.76"
                               "   37.78   66.11       0    27.49   38.15   66.76    N/A")


def sweep(collective, nranks, redop="sum", root=-1):
    rows = []
    for exponent in range(3, 31, 3):  # 8 B .. 1 GiB
        size = 1 << exponent
        seconds = 20e-6 + size / 9e9  # 20 us latency, 9 GB/s
        rows.append(measured_row(collective, nranks, size=size, type="float", redop=redop,
                                 root=root, out_of_place=(seconds, 0),
                                 in_place=(seconds * 1.01, 1 if exponent == 30 else 0)))
    return rows


@pytest.mark.parametrize("collective, redop, root", [
    ("all_reduce", "sum", -1), ("all_gather", "none", -1), ("reduce_scatter", "sum", -1),
    ("broadcast", "none", 0), ("alltoall", "none", -1),
])
def test_rendered_table_parses_back(collective, redop, root):
    devices = [RankDevice(rank=r, host=f"node{r // 2}", device=r % 2, bus_id="0000:00:00",
                          gpu="cpu (gloo)", pid=4000 + r) for r in range(4)]
    rows = sweep(collective, 4, redop, root)
    text = render_table(collective, devices, rows, warmup_iters=5, iters=20,
                        comment="launch bench --local (torch.distributed, gloo)")
    run = parse_nccl_tests(text, "bench.txt")

    assert run.collective == collective
    assert (run.ranks, run.hosts, run.layout) == (4, ["node0", "node1"], "current")
    assert run.wrong_total == 1
    assert [(r.size, r.count, r.redop, r.root) for r in run.rows] == [
        (r.size, r.count, r.redop, r.root) for r in rows]
    for parsed, measured in zip(run.rows, rows):
        for got, want in zip(parsed.measurements, measured.measurements):
            # Printed with two decimals, or fewer significant ones once the number is long.
            assert got.busbw == pytest.approx(want.busbw, abs=0.005, rel=1e-5)
            assert got.time_us == pytest.approx(want.time_us, abs=0.005, rel=1e-5)
    assert run.peak_busbw == pytest.approx(max(m.busbw for r in rows for m in r.measurements),
                                           abs=0.005)
    average = sum(m.busbw for r in rows for m in r.measurements) / (2 * len(rows))
    assert run.avg_busbw == pytest.approx(average, rel=1e-5)
