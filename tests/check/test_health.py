"""The verdicts of `launch check` on real outputs: the probe's answer is assembled from the files
in data/ (what nvidia-smi, dmesg, nvlink -s and fi_info printed on real nodes) and judged."""

from __future__ import annotations

from pathlib import Path

from launcher.check import health
from launcher.check.health import FAIL, OK, SKIP, WARN, expectation, node_checks
from launcher.check.nvsmi import parse_smi
from launcher.cluster.inventory import Node

DATA = Path(__file__).parent / "data"
GIB = 1 << 30


def read(*parts: str) -> str:
    return DATA.joinpath(*parts).read_text()


def answer(stdout: str = "", rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def probe(*, smi: str | None = None, nvlink: str = "", fabric: str = "inactive",
          kernel: list[str] | None = None, fi_info: str | None = None,
          memlock: int | None = None, address: str = "10.0.0.5", torch: str = "2.13.0",
          free: int = 100 * GIB) -> dict:
    """A node's answer as launcher/check/ask_node.py gives it."""
    out = {"hostname": "n", "python": "/usr/bin/python3", "python_version": "3.10.12",
           "probe_s": 3.2, "nvswitches": 0, "efa_sysfs": [],
           "nvidia_smi": answer(smi) if smi is not None
           else answer(rc=127, stderr="nvidia-smi: not installed"),
           "fi_info": answer(fi_info) if fi_info is not None
           else answer(rc=127, stderr="fi_info: not installed"),
           "memlock": {"soft": memlock, "hard": None},
           "net": {"addresses": {address: "ens32", "127.0.0.1": "lo"},
                   "interfaces": {"ens32": {"operstate": "up", "mtu": "9001",
                                            "speed": "-1"}}},
           "torch": {"torch": torch, "cuda": "12.8", "gpus": 8, "nccl": "2.27.3"},
           "disk": {"path": "/home/u/.launch/runs", "measured_at": "/home/u",
                    "free_bytes": free, "total_bytes": 500 * GIB},
           "time": 0.0}
    if smi is not None:
        out["nvlink"] = answer(nvlink)
        out["fabricmanager"] = answer(fabric, rc=0 if fabric == "active" else 3)
    if kernel is not None:
        out["kernel_log"] = {"source": "dmesg", "lines": kernel}
    return out


P4D = Node("gpu-0", "3.3.3.3", "10.0.0.5", gpus=8, instance_type="p4d.24xlarge")


def test_a100_node_with_one_of_eight_gpus_and_a_fatal_xid():
    checks = node_checks(probe(smi=read("nvsmi", "a100_sxm4_80gb_mig_535.xml"),
                               nvlink=read("nvlink", "a100_8gpu_all_up.txt"), fabric="active",
                               kernel=read("xid", "ml_engineering_xid63.log").splitlines(),
                               fi_info=read("efa", "p4d_4_devices_rdm.txt")),
                         expectation(P4D, 10 * GIB))
    assert checks["gpus"].status == FAIL
    assert "1 of the 8 GPU(s)" in checks["gpus"].evidence
    assert "the driver counts 4" in checks["gpus"].evidence
    assert checks["ecc"].status == OK
    assert checks["remap"].status == OK and "not reported" in checks["remap"].evidence
    assert checks["reset"].status == OK
    assert checks["throttle"].status == OK
    assert checks["persist"].status == WARN
    assert checks["xid"].status == FAIL and "Xid 63 x1 on 0000:10:1c" in checks["xid"].evidence
    assert checks["nvlink"].status == OK and "all 96 links of 8 GPU(s) up" in \
        checks["nvlink"].evidence
    # p4d is an NVSwitch type; the A100 XML reports its fabric state N/A.
    assert checks["fabric"].status == OK
    assert checks["efa"].status == OK and checks["efa"].evidence.startswith("4 EFA device(s)")
    assert checks["memlock"].status == OK          # soft None = unlimited
    assert checks["iface"].status == OK and checks["iface"].evidence.startswith(
        "ens32 holds 10.0.0.5")
    assert checks["disk"].status == OK


def test_fabric_manager_down_on_an_nvswitch_type_fails():
    checks = node_checks(probe(smi=read("nvsmi", "a100_sxm4_80gb_mig_535.xml"),
                               fabric="inactive", kernel=[]), expectation(P4D, 10 * GIB))
    assert checks["fabric"].status == FAIL
    assert "nvidia-fabricmanager is inactive" in checks["fabric"].evidence


def test_efa_missing_devices_and_memlock_on_an_efa_type_fail():
    checks = node_checks(probe(smi=read("nvsmi", "a100_sxm4_80gb_mig_535.xml"), kernel=[],
                               fi_info=read("efa", "efa_direct_1_device.txt"), memlock=65536),
                         expectation(P4D, 10 * GIB))
    assert checks["efa"].status == FAIL
    assert "1 of the 4 EFA device(s) of p4d.24xlarge (rdmap47s0)" in checks["efa"].evidence
    assert checks["memlock"].status == FAIL and "ulimit -l 64 KiB" in checks["memlock"].evidence


def test_cpu_node_skips_every_gpu_check():
    node = Node("cpu-0", "10.0.0.5", "10.0.0.5", gpus=0)
    checks = node_checks(probe(memlock=8 << 20), expectation(node, 10 * GIB))
    assert checks["gpus"].status == SKIP
    assert checks["gpus"].evidence == "no GPU: nvidia-smi is not installed (no NVIDIA driver)"
    for name in health.GPU_COLUMNS:
        assert checks[name].status == SKIP, name
    assert checks["efa"].status == SKIP
    assert checks["memlock"].status == WARN          # sockets only: a warning, not a failure


def test_gpu_node_without_a_driver_fails_gpus_and_still_reads_the_kernel_log():
    checks = node_checks(probe(kernel=read("xid", "fallen_off_bus_no_xid.log").splitlines()),
                         expectation(P4D, 10 * GIB))
    assert checks["gpus"].status == FAIL and "p4d.24xlarge" in checks["gpus"].evidence
    assert checks["xid"].status == FAIL and "Xid 79" in checks["xid"].evidence


def test_rules_on_faulty_text_reports():
    pending = parse_smi(read("nvsmi", "a100_sxm4_80gb_remap_pending_510.q.txt"))
    remap = health.check_remap(pending)
    assert remap.status == FAIL
    assert remap.evidence.startswith("GPU 00000000:10:1C.0: row remap pending (0 uncorrectable, "
                                     "1 correctable rows)")
    ecc = health.check_ecc(pending)
    assert ecc.status == OK and "177 corrected error(s)" in ecc.evidence
    retired = health.check_remap(parse_smi(read("nvsmi", "retired_pages_pending.q.txt")))
    assert retired.status == FAIL and "page retirement pending" in retired.evidence
    reset = health.check_reset(parse_smi(read("nvsmi", "rtx3090_reset_required.q.txt")))
    assert reset.status == FAIL and "reset required" in reset.evidence
    healthy = parse_smi(read("nvsmi", "h100_80gb_hbm3_545.q.txt"))
    assert [health.check_remap(healthy).status, health.check_reset(healthy).status,
            health.check_ecc(healthy).status, health.check_persist(healthy).status,
            health.check_throttle(healthy).status] == [OK] * 5


def test_h100_fabric_completed_and_manager_active_pass():
    report = parse_smi(read("nvsmi", "h100_80gb_hbm3_545.q.txt"))
    node = Node("h", "1.1.1.1", "1.1.1.1", instance_type="p5.48xlarge")
    ok = health.check_fabric({"fabricmanager": answer("active")}, report,
                             expectation(node, GIB))
    assert ok.status == OK and "fabric state Completed on 1 GPU(s)" in ok.evidence
    down = health.check_fabric({"fabricmanager": answer("failed", rc=3)}, report,
                               expectation(node, GIB))
    assert down.status == FAIL and "nvidia-fabricmanager is failed" in down.evidence


def test_inactive_nvlinks_fail_where_nvlink_is_expected():
    check = health.check_nvlink({"nvlink": answer(read("nvlink", "v100_links_inactive.txt"))},
                                expectation(P4D, GIB))
    assert check.status == FAIL
    assert check.evidence.startswith("GPU 3: link(s) 3, 5 inactive (2 of 6 links down)")


def test_versions_the_odd_node_out_fails():
    probes = {name: probe(torch=version) for name, version in
              (("a", "2.13.0"), ("b", "2.13.0"), ("c", "2.12.1"))}
    checks = health.check_versions(probes)
    assert checks["a"].status == OK and "(same on every node)" not in checks["c"].evidence
    assert checks["c"].status == FAIL
    assert checks["c"].evidence.startswith("torch 2.12.1 where the other nodes have 2.13.0")


def test_clock_offsets_against_the_median_node():
    checks = health.check_clocks({"a": 100.0, "b": 100.05, "c": 102.5, "d": 100.0 + 400})
    assert checks["a"].status == OK and checks["b"].status == OK
    assert checks["c"].status == WARN and checks["c"].evidence.startswith("+2.45 s")
    assert checks["d"].status == FAIL


def test_private_ip_not_on_the_host_and_a_full_disk_fail():
    node = Node("n", "1.2.3.4", "10.9.9.9", gpus=0)
    checks = node_checks(probe(free=3 * GIB), expectation(node, 10 * GIB))
    assert checks["iface"].status == FAIL
    assert "private_ip 10.9.9.9 is not an address of this host" in checks["iface"].evidence
    assert checks["disk"].status == FAIL and "3.0 GiB free" in checks["disk"].evidence
