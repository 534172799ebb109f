"""`nvidia-smi topo -m`: link codes, NICs, affinity, class and worst GPU link."""

from __future__ import annotations

import pytest

from launcher.nccl.errors import NcclParseError
from launcher.nccl.topology import link_speed, looks_like_topology, parse_topology

NV12 = [["X" if i == j else "NV12" for j in range(8)] for i in range(8)]

EXPECTED = {
    # p4d-like: tabs, 8x NV12, 4 NICs named in a `NIC Legend`, GPU NUMA ID column.
    "topo_p4d.txt": {"kind": "topology", "gpus": 8, "nics": 4, "matrix": NV12,
                     "class": "nvswitch", "worst_link": "NV12", "warnings": []},
    # g6e-like PCIe box pasted with spaces: NODE within a NUMA node, SYS across.
    "topo_g6e_pcie.txt": {"kind": "topology", "gpus": 4, "nics": 1, "matrix": [
        ["X", "NODE", "SYS", "SYS"], ["NODE", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NODE"], ["SYS", "SYS", "NODE", "X"]],
        "class": "pcie", "worst_link": "SYS", "warnings": []},
    # Old driver: NVLink bridges between pairs, `SOC` for SYS, `mlx5_0` as a column, no legend.
    "topo_partial_nvlink_old.txt": {"kind": "topology", "gpus": 4, "nics": 1, "matrix": [
        ["X", "NV2", "SYS", "SYS"], ["NV2", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV2"], ["SYS", "SYS", "NV2", "X"]],
        "class": "partial-nvlink", "worst_link": "SYS", "warnings": []},
    "topo_single_gpu.txt": {"kind": "topology", "gpus": 1, "nics": 0, "matrix": [["X"]],
                            "class": "single-gpu", "worst_link": None, "warnings": []},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parses_to_the_expected_json(data_dir, name):
    path = data_dir / name
    assert parse_topology(path.read_text(), str(path)).to_json() == EXPECTED[name]


def test_nics_and_affinity_are_read(data_dir):
    topo = parse_topology((data_dir / "topo_p4d.txt").read_text())
    assert topo.nic_names == ("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27")
    assert topo.nic_links[0] == ("PXB", "NODE", "SYS", "SYS")
    assert topo.nic_links[7] == ("SYS", "SYS", "NODE", "PXB")
    assert topo.cpu_affinity[0] == "0-23,48-71" and topo.cpu_affinity[4] == "24-47,72-95"
    assert topo.numa_affinity == ("0",) * 4 + ("1",) * 4
    assert topo.gpu_numa_id == ("N/A",) * 8


def test_old_layout_without_legend_names_nics_by_column(data_dir):
    topo = parse_topology((data_dir / "topo_partial_nvlink_old.txt").read_text())
    assert topo.nic_names == ("mlx5_0",)
    assert topo.nic_links == (("PIX",), ("PIX",), ("SYS",), ("SYS",))
    assert topo.cpu_affinity == ("0-9,20-29",) * 2 + ("10-19,30-39",) * 2
    assert topo.numa_affinity == (None,) * 4


def test_worst_link_follows_the_speed_order():
    order = ["NV18", "NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert sorted(order, key=link_speed, reverse=True) == order
    assert link_speed("SOC") == link_speed("SYS")
    with pytest.raises(ValueError, match="GNS"):
        link_speed("GNS")


def test_a_mixed_nvlink_box_reports_its_slowest_pair():
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tNV4\tNV2\t0-15\t0\n"
            "GPU1\tNV4\t X \tPHB\t0-15\t0\n"
            "GPU2\tNV2\tPHB\t X \t0-15\t0\n")
    topo = parse_topology(text)
    assert (topo.link_class, topo.worst_link) == ("partial-nvlink", "PHB")


def test_the_p2p_matrix_is_not_taken_for_a_topology():
    p2p = " \tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n\nLegend:\n\n  X    = Self\n"
    assert not looks_like_topology(p2p)


def test_an_unknown_code_is_refused_with_file_and_line():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tFOO\t X \t0-7\n"
    with pytest.raises(NcclParseError, match=r"^topo\.txt: line 3: row GPU1, column GPU0: "
                                             r"unknown link code 'FOO'"):
        parse_topology(text, "topo.txt")


def test_unrelated_text_is_refused():
    with pytest.raises(NcclParseError, match=r"^x\.txt: not `nvidia-smi topo -m` output"):
        parse_topology("Mon Nov 11 nvidia-smi\nNo devices were found\n", "x.txt")


def _wrapped(text: str, width: int) -> str:
    """The text as a terminal `width` columns wide shows it and a copy keeps it: every line
    cut into `width`-character pieces, each on a line of its own."""
    return "".join(line[i:i + width] + "\n" for line in text.splitlines()
                   for i in range(0, max(len(line), 1), width))


def test_glued_nic_columns_are_split_and_said_so(data_dir):
    topo = parse_topology((data_dir / "real" / "topo_glued_nic_columns.txt").read_text())
    assert (topo.link_class, topo.gpus, topo.nics) == ("nvswitch", 8, 10)
    assert topo.warnings[0] == "header: split glued 'NIC7NIC8' into NIC7, NIC8"
    assert "row GPU6: split glued 'PXBSYS' into PXB SYS" in topo.warnings


def test_a_terminal_wrapped_paste_reads_as_the_unwrapped_one(data_dir):
    """Wrapping at 80 columns cuts cells and the header in two; joined back, the same facts."""
    text = (data_dir / "real" / "topo_glued_nic_columns.txt").read_text()
    whole, wrapped = parse_topology(text), parse_topology(_wrapped(text, 80))
    for field in ("gpu_columns", "nic_names", "matrix", "nic_links", "cpu_affinity",
                  "numa_affinity", "gpu_numa_id"):
        assert getattr(wrapped, field) == getattr(whole, field), field
    assert "the header was wrapped over 3 lines; joined" in wrapped.warnings
    assert "row GPU0 was wrapped onto line 6; joined" in wrapped.warnings


def test_the_gpu_block_stays_strict_while_nic_cells_are_only_warned_about():
    header = "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\n"
    glued_gpu = header + "GPU0\t X \tNV4NV4\tPIX\tSYS\t0-7\t0\nGPU1\tNV4\t X \tSYS\tPIX\t0-7\t0\n"
    with pytest.raises(NcclParseError, match=r"row GPU0, column GPU1: unknown link code 'NV4NV4'"):
        parse_topology(glued_gpu)
    odd_nic = header + "GPU0\t X \tNV4\tPIX\tFOO\t0-7\t0\nGPU1\tNV4\t X \tSYS\tPIX\t0-7\t0\n"
    topo = parse_topology(odd_nic)
    assert topo.nic_links == ((), ("SYS", "PIX"))
    assert topo.warnings == ("row GPU0: 1 NIC link codes for 2 NIC columns; its NIC links and "
                             "affinity are not read",)
    assert topo.cpu_affinity == (None, "0-7")
