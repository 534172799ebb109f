"""Real outputs (data/, sources in data/SOURCES): each gives the facts a person reads off the
text, written here by hand from the text itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.check.fabric import parse_fi_info, parse_nvlink_status
from launcher.check.nvsmi import SmiParseError, parse_smi
from launcher.check.xid import parse_kernel_log, summarize

DATA = Path(__file__).parent / "data"


def read(*parts: str) -> str:
    return DATA.joinpath(*parts).read_text()


# ----------------------------------------------------------------------------- nvidia-smi


def test_a100_xml_mig_healthy():
    report = parse_smi(read("nvsmi", "a100_sxm4_80gb_mig_535.xml"))
    # The header says 4 GPUs; the file lists one <gpu> (the others were left out of it).
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == \
        ("535.54.03", "12.2", 4)
    assert len(report.gpus) == 1
    gpu = report.gpus[0]
    assert gpu.bus_id == "00000000:01:00.0"
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.persistence is False and gpu.mig is True and gpu.ecc_enabled is True
    assert (gpu.volatile_correctable, gpu.volatile_uncorrectable,
            gpu.aggregate_uncorrectable) == (0, 0, 0)
    # <remapped_rows>N/A</remapped_rows> in MIG mode; retired pages all N/A.
    assert gpu.remap_pending is None and gpu.remap_failure is None
    assert gpu.retired_pending is None and gpu.retired_single_bit is None
    assert gpu.reset_required is False and gpu.drain_and_reset is False
    assert gpu.recovery_action is None           # no <gpu_recovery_action> in 535
    assert gpu.throttle_active == []            # every clocks_event_reason "Not Active"
    assert (gpu.fabric_state, gpu.fabric_status) == (None, None)   # N/A


def test_h100_text_healthy_with_fabric_completed():
    report = parse_smi(read("nvsmi", "h100_80gb_hbm3_545.q.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == \
        ("545.23.08", "12.3", 1)
    [gpu] = report.gpus
    assert gpu.bus_id == "00000000:19:00.0" and gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-10f35015-e921-bfab-2eb8-4e9b6664d5f1"
    assert gpu.persistence is True and gpu.mig is False and gpu.ecc_enabled is True
    assert (gpu.volatile_correctable, gpu.volatile_uncorrectable) == (0, 0)
    assert (gpu.remap_correctable, gpu.remap_uncorrectable) == (0, 0)
    assert gpu.remap_pending is False and gpu.remap_failure is False
    assert gpu.reset_required is False and gpu.drain_and_reset is False
    # "Idle : Active" is not a slowdown; every other reason is "Not Active".
    assert gpu.throttle_active == []
    assert (gpu.fabric_state, gpu.fabric_status) == ("Completed", "Success")


def test_l40s_header_only_paste():
    report = parse_smi(read("nvsmi", "l40s_550_header.q.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == \
        ("550.127.05", "12.8", 1)
    [gpu] = report.gpus
    assert (gpu.bus_id, gpu.name) == ("00000000:81:00.0", "NVIDIA L40S")
    # The paste stops after the architecture: nothing else is claimed.
    assert gpu.ecc_enabled is None and gpu.remap_pending is None and gpu.persistence is None


def test_a100_remap_pending_with_elisions():
    report = parse_smi(read("nvsmi", "a100_sxm4_80gb_remap_pending_510.q.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == \
        ("510.73.08", "11.6", 8)
    [gpu] = report.gpus
    assert (gpu.bus_id, gpu.name) == ("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert (gpu.volatile_correctable, gpu.volatile_uncorrectable) == (177, 0)
    assert gpu.aggregate_uncorrectable == 0
    assert (gpu.remap_correctable, gpu.remap_uncorrectable) == (1, 0)
    assert gpu.remap_pending is True and gpu.remap_failure is False


def test_retired_pages_pending_fragment():
    [gpu] = parse_smi(read("nvsmi", "retired_pages_pending.q.txt")).gpus
    assert gpu.bus_id is None
    assert (gpu.retired_single_bit, gpu.retired_double_bit, gpu.retired_pending) == (2, 0, True)


def test_remapped_rows_uncorrectable_pending_fragment():
    [gpu] = parse_smi(read("nvsmi", "remap_uncorrectable_pending.q.txt")).gpus
    assert (gpu.remap_correctable, gpu.remap_uncorrectable, gpu.remap_pending) == (0, 4, True)


def test_reset_required_in_a_broken_gpus_report():
    [gpu] = parse_smi(read("nvsmi", "rtx3090_reset_required.q.txt")).gpus
    assert gpu.reset_required is True and gpu.drain_and_reset is False


def test_not_nvidia_smi_output_is_refused():
    with pytest.raises(SmiParseError, match="not the output of `nvidia-smi -q`"):
        parse_smi("hello\nworld\n", "paste.txt")
    with pytest.raises(SmiParseError, match="not valid XML"):
        parse_smi("<?xml version='1.0'?><nvidia_smi_log><gpu>", "cut.xml")


# ----------------------------------------------------------------------------- Xid


def test_xid63_row_remapper():
    [event] = parse_kernel_log(read("xid", "ml_engineering_xid63.log"))
    assert (event.code, event.pci, event.fatal) == (63, "0000:10:1c", True)
    assert event.message.startswith("pid=1896, Row Remapper: New row marked for remapping")


def test_dmesg_ctime_xid13_and_109_warn_only():
    events = parse_kernel_log(read("xid", "gpud_dmesg_ctime_xid13_xid109.log"))
    # The peermem line has no Xid; three 13s and one 109, all on 0000:cb:00.
    assert [e.code for e in events] == [13, 13, 13, 109]
    assert {e.pci for e in events} == {"0000:cb:00"}
    assert events[3].process == "pt_main_thread"
    assert not any(e.fatal for e in events)
    assert summarize(events).startswith("Xid 13 x3 on 0000:cb:00")


def test_journal_xid45_caused_by_nvlink_xids():
    events = parse_kernel_log(read("xid", "journal_xid45_after_149_145.log"))
    assert [e.code for e in events] == [45] * 8
    assert {e.pci for e in events} == {"0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"}
    assert [e.caused_by for e in events] == [149, 145, 145, 145, 149, 145, 145, None]
    assert {e.process for e in events} == {"python3"}


def test_xid31_with_the_newer_channel_spelling():
    [event] = parse_kernel_log(read("xid", "xid31_mmu_fault.log"))
    assert (event.code, event.pci, event.process, event.fatal) == \
        (31, "0000:0a:00", "VLLM::EngineCor", False)


def test_xid48_without_nvrm_prefix_cut_mid_line():
    [event] = parse_kernel_log(read("xid", "xid48_cut_mid_line.log"))
    assert (event.code, event.pci, event.process, event.fatal) == \
        (48, "0000:03:00", "nv-hostengine", True)


def test_fallen_off_the_bus_without_an_xid_is_xid79():
    [event] = parse_kernel_log(read("xid", "fallen_off_bus_no_xid.log"))
    assert (event.code, event.pci, event.fatal, event.from_text) == \
        (79, "0000:b3:00.0", True, True)
    [logged] = parse_kernel_log(read("xid", "xid79_fallen_off_bus.log"))
    assert (logged.code, logged.pci, logged.from_text) == (79, "0000:44:00", False)


# ----------------------------------------------------------------------------- NVLink


def test_nvlink_all_up_a100():
    gpus = parse_nvlink_status(read("nvlink", "a100_8gpu_all_up.txt"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert all(g.links == {k: 25.0 for k in range(12)} for g in gpus)


def test_nvlink_two_links_inactive_v100():
    [gpu] = parse_nvlink_status(read("nvlink", "v100_links_inactive.txt"))
    assert (gpu.index, gpu.name) == (3, "Tesla V100-SXM2-32GB")
    assert gpu.inactive == [3, 5]
    assert gpu.links[0] == 25.781 and len(gpu.links) == 6


# ----------------------------------------------------------------------------- fi_info


def test_fi_info_p4d_four_devices():
    info = parse_fi_info(read("efa", "p4d_4_devices_rdm.txt"))
    assert info.devices == sorted(["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"])
    assert info.entries == 4 and info.error is None


def test_fi_info_one_device_listed_three_times():
    info = parse_fi_info(read("efa", "efa_direct_1_device.txt"))
    assert info.devices == ["rdmap47s0"] and info.entries == 3
    assert info.fabrics == ["efa-direct", "efa"]


def test_fi_info_2020_layout_with_rxd():
    info = parse_fi_info(read("efa", "libfabric_2020_efa_0_rxd.txt"))
    assert info.devices == ["efa_0"] and info.entries == 3


def test_fi_info_under_mpirun_prefixes():
    info = parse_fi_info(read("efa", "mpirun_2_nodes_1_device.txt"))
    assert info.devices == ["rdmap197s0"] and info.entries == 2


def test_fi_info_no_efa():
    info = parse_fi_info(read("efa", "fi_getinfo_61.txt"))
    assert info.devices == [] and info.error == "fi_getinfo: -61"
