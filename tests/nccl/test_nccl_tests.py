"""nccl-tests output: every layout variant parsed to its exact JSON, bandwidths rechecked."""

from __future__ import annotations

import json

import pytest

from launcher.nccl.busbw import algo_bandwidth, bus_bandwidth
from launcher.nccl.errors import NcclParseError
from launcher.nccl.nccl_tests import parse_nccl_tests
from launcher.nccl.text import number

FIXTURES = [
    "ar_current_p4d",        # current layout, bare `NCCL version`, `# Reducing maxBytes`
    "ar_old_layout",         # no root column, `error` floats, no Group, never names itself
    "ag_mpirun_2nodes",      # `[1,0]<stdout>:` on every line, 2 hosts, version from the code
    "rs_interleaved_debug",  # NCCL_DEBUG=INFO lines inside header and table, 2 hosts
    "bcast_unchecked",       # root 0, `-c 0` so #wrong is N/A, `0x17` bus ids, named on $ line
    "alltoall_2nodes",       # in-place N/A, 3 wrong elements, `Out of bounds ... FAILED`
    "ag_old_no_redop",       # oldest all_gather: neither redop nor root column
]


def load(data_dir, name):
    path = data_dir / f"{name}.txt"
    return parse_nccl_tests(path.read_text(), str(path)), json.loads(
        (data_dir / f"{name}.json").read_text())


@pytest.mark.parametrize("name", FIXTURES)
def test_parses_to_the_expected_json(data_dir, name):
    run, expected = load(data_dir, name)
    assert run.to_json() == expected


def _half_unit(value: float, big: float) -> float:
    """Half the last printed digit: nccl-tests prints 2 decimals below `big`, fewer above."""
    return 0.005 if value < big else 0.05 if value < big * 100 else 0.5


@pytest.mark.parametrize("name", FIXTURES)
def test_busbw_recomputed_from_size_and_time_matches_the_column(data_dir, name):
    run, _ = load(data_dir, name)
    checked = 0
    for row in run.rows:
        for side in row.measurements:
            # The printed time is rounded: the true one lies within half a unit of it.
            slack = _half_unit(side.time_us, 100)
            fast, slow = (side.time_us - slack) * 1e-6, (side.time_us + slack) * 1e-6
            for printed, formula in (
                (side.busbw, lambda t: bus_bandwidth(run.collective, row.size, t, run.ranks)),
                (side.algbw, lambda t: algo_bandwidth(row.size, t)),
            ):
                rounding = _half_unit(printed, 1000)
                assert formula(slow) - rounding <= printed <= formula(fast) + rounding, (
                    f"{name}: size {row.size} time {side.time_us}: printed {printed}, "
                    f"formula gives {formula(side.time_us * 1e-6):.4f}")
                checked += 1
    assert checked == 4 * len(run.rows)


def test_peak_is_the_largest_busbw_of_any_row_not_the_average(data_dir):
    run, _ = load(data_dir, "ar_current_p4d")
    every_busbw = [m.busbw for row in run.rows for m in row.measurements]
    assert run.peak_busbw == max(every_busbw)
    assert run.avg_busbw < run.peak_busbw / 2  # tiny sizes pull the printed average down


def test_old_layout_keeps_the_error_floats_out_of_wrong(data_dir):
    run, _ = load(data_dir, "ar_old_layout")
    assert run.layout == "old"
    errors = {m.error for row in run.rows for m in row.measurements}
    assert errors <= {0.0, 1e-07, 3e-08} and 1e-07 in errors
    assert all(m.wrong is None for row in run.rows for m in row.measurements)


def test_mpirun_prefixed_and_plain_text_parse_alike(data_dir):
    tagged = (data_dir / "ag_mpirun_2nodes.txt").read_text()
    plain = "\n".join(line.split(">:", 1)[-1] for line in tagged.splitlines())
    assert parse_nccl_tests(plain).to_json() == parse_nccl_tests(tagged).to_json()


def test_old_version_code_is_decoded():
    text = ("# nccl-tests version 2.0.0 nccl-headers=2708 nccl-library=2708\n"
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw #wrong\n"
            "        1024           256     float     sum      -1    10.00    0.10    0.15       0"
            "    10.00    0.10    0.15       0\n")
    assert parse_nccl_tests(text).nccl_version == "2.7.8"


def test_millisecond_times_of_the_oldest_builds_become_microseconds():
    text = ("#       size         count    type   redop     time   algbw   busbw    error"
            "     time   algbw   busbw    error\n"
            "#        (B)    (elements)                    (ms)  (GB/s)  (GB/s)"
            "            (ms)  (GB/s)  (GB/s)\n"
            "    10000000       2500000   float     sum    1.250    8.00   12.00    0e+00"
            "    1.300    7.69   11.54    0e+00\n")
    row = parse_nccl_tests(text).rows[0]
    assert (row.out_of_place.time_us, row.in_place.time_us) == (1250.0, 1300.0)


def test_unrelated_text_is_refused_naming_the_file():
    with pytest.raises(NcclParseError, match=r"^notes\.txt: not nccl-tests output: no `#  size"):
        parse_nccl_tests("just some notes\n# a comment\n", "notes.txt")


def test_a_run_that_died_before_its_first_row_is_a_failed_result(data_dir):
    text = (data_dir / "ar_current_p4d.txt").read_text().split("           8  ")[0]
    text += "node1: Test NCCL failure common.cu:958 'unhandled system error'\n"
    run = parse_nccl_tests(text, "run.log")
    assert (run.failed, run.rows, run.collective, run.ranks) == (True, (), "all_reduce", 8)
    assert run.failure_reason == "node1: Test NCCL failure common.cu:958 'unhandled system error'"
    assert run.to_json()["peak_busbw"] is None


def test_a_header_without_rows_or_failure_lines_says_what_is_missing(data_dir):
    text = (data_dir / "ar_current_p4d.txt").read_text().split("           8  ")[0]
    run = parse_nccl_tests(text, "cut.log")
    assert run.failed and run.failure_lines == ()
    assert run.failure_reason.startswith("no result rows after the table header")


def test_a_run_that_failed_midway_keeps_its_rows(data_dir):
    text = (data_dir / "ar_current_p4d.txt").read_text().split("       16384  ")[0]
    text += " .. ip-172-31-5-10 pid 1: Test failure common.cu:891\n"
    run = parse_nccl_tests(text)
    assert run.failed and [r.size for r in run.rows] == [8 << i for i in range(11)]
    assert run.failure_lines == (" .. ip-172-31-5-10 pid 1: Test failure common.cu:891".strip(),)


def test_two_collectives_in_one_file_are_refused(data_dir):
    text = ((data_dir / "ar_current_p4d.txt").read_text()
            + (data_dir / "alltoall_2nodes.txt").read_text())
    with pytest.raises(NcclParseError, match=r"several collectives \(all_reduce, alltoall\)"):
        parse_nccl_tests(text, "both.txt")


def test_number_reads_the_printed_forms():
    assert number("1.2e+04") == 12000.0
    assert number("2e-01*") == 0.2  # old builds star an error above tolerance
    assert number("N/A") is None
    assert number("inf") is None
    with pytest.raises(ValueError):
        number("float")
