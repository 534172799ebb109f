"""`launch topo`: nodes compared with each other and the catalog, and the DDP advice."""

from __future__ import annotations

import json
import stat

from launcher.nccl.advice import wiring_advice
from launcher.nccl.topocheck import NodeOutput, check_topologies, render

AUTO = ("set ddp.comm_hook: auto and ddp.bucket_cap_mb: auto: the trainer times its "
        "all-reduces, sizes the buckets to them, and switches to PowerSGD only if that makes "
        "steps faster")
NO_COMPRESSION = ("NVSwitch between all GPUs and EFA/InfiniBand between nodes: no compression "
                  "needed (ddp.comm_hook: none, the default 25 MB buckets)")


def output(data_dir, name, itype, fixture):
    return NodeOutput(name, itype, (data_dir / fixture).read_text())


def test_two_p4d_nodes_agree_and_need_no_compression(data_dir):
    checked = check_topologies([output(data_dir, "a", "p4d.24xlarge", "topo_p4d.txt"),
                                output(data_dir, "b", "p4d.24xlarge", "topo_p4d.txt")])
    assert checked["differences"] == []
    assert checked["advice"] == [NO_COMPRESSION]
    assert checked["complete"] is True
    assert render(checked) == [
        "a (p4d.24xlarge): nvswitch, 8 GPU(s), 4 NIC(s), worst GPU link NV12",
        "b (p4d.24xlarge): nvswitch, 8 GPU(s), 4 NIC(s), worst GPU link NV12",
        f"recommended: {NO_COMPRESSION}",
    ]


def test_a_node_that_differs_from_its_peer_and_its_type(data_dir):
    checked = check_topologies([output(data_dir, "a", "p4d.24xlarge", "topo_p4d.txt"),
                                output(data_dir, "b", "p4d.24xlarge", "topo_g6e_pcie.txt")])
    assert checked["differences"] == [
        "nodes differ: a nvswitch, 8 GPU(s), 4 NIC(s), worst link NV12; b pcie, 4 GPU(s), "
        "1 NIC(s), worst link SYS",
        "b: p4d.24xlarge has 8 GPUs but nvidia-smi shows 4: a GPU is missing or hidden "
        "(check nvidia-smi, dmesg)",
        "b: p4d.24xlarge should be nvswitch but nvidia-smi shows pcie (worst link SYS): check "
        "the driver and fabric manager (nvidia-fabricmanager on NVSwitch machines)",
    ]
    assert checked["advice"] == [f"GPUs talk over PCIe (no NVSwitch): {AUTO}"]


def test_a_node_without_nvidia_smi_is_named_and_the_rest_still_judged(data_dir):
    checked = check_topologies([
        output(data_dir, "a", None, "topo_partial_nvlink_old.txt"),
        NodeOutput("b", None, None, "nvidia-smi is not installed"),
        NodeOutput("c", None, "GPU0 garbage\n"),
    ])
    assert checked["complete"] is False
    assert [n["problem"] for n in checked["nodes"]] == [
        None, "nvidia-smi is not installed",
        "c: nvidia-smi topo -m: not `nvidia-smi topo -m` output: no `GPU0  GPU1 ... CPU "
        "Affinity` header above a `GPU0  X ...` row"]
    assert checked["nodes"][0]["topology"]["class"] == "partial-nvlink"
    assert checked["advice"] == [
        f"GPUs talk over PCIe for some pairs (no NVSwitch): {AUTO}"]


def test_wiring_advice_for_sockets_between_nodes_and_for_gloo():
    assert wiring_advice("nvswitch", 2, fast_network=False) == [
        f"nodes talk over TCP sockets (no EFA or InfiniBand): {AUTO}"]
    # No compression named by hand, for NCCL or gloo alike: auto measures and chooses.
    for advice in wiring_advice("pcie", 1, None) + wiring_advice("nvswitch", 2, False):
        assert "comm_hook: auto" in advice
        assert not any(hook in advice for hook in ("bf16", "fp16", "powersgd"))
    assert wiring_advice("nvswitch", 2, fast_network=None) == []  # network unknown: no guess
    assert wiring_advice(None, 2, None) == []


def test_cli_without_nvidia_smi_says_so_and_exits_1(run_launch, tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    proc = run_launch("topo", "--local", env={"PATH": str(empty)})
    assert proc.returncode == 1
    assert proc.stdout == ("local: nvidia-smi is not installed: no NVIDIA driver, so no GPU "
                           "topology to read (a CPU machine uses gloo over TCP; `launch setup` "
                           "installs the driver on GPU nodes)\n")


def test_cli_reads_nvidia_smi_and_compares_with_the_catalog(run_launch, tmp_path, data_dir):
    """A stand-in nvidia-smi on PATH prints a recorded p4d matrix."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$*" = "topo -m" ] || exit 3\n'
                   f'exec /bin/cat {data_dir}/topo_p4d.txt\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": str(bin_dir)}
    proc = run_launch("topo", "--local", "--instance-type", "g6e.48xlarge", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "local (g6e.48xlarge): nvswitch, 8 GPU(s), 4 NIC(s), worst GPU link NV12",
        "difference: local: g6e.48xlarge should be pcie but nvidia-smi shows nvswitch (worst "
        "link NV12): check the driver and fabric manager (nvidia-fabricmanager on NVSwitch "
        "machines)",
        "recommended: NVSwitch between all GPUs: no compression needed (ddp.comm_hook: none, "
        "the default 25 MB buckets)",
    ]
    as_json = json.loads(run_launch("topo", "--local", "--json", env=env, check=True).stdout)
    node = as_json["nodes"][0]
    assert (node["name"], node["instance_type"], node["problem"]) == ("local", None, None)
    topo = node["topology"]
    assert (topo["class"], topo["gpus"], topo["nics"], topo["worst_link"]) == \
        ("nvswitch", 8, 4, "NV12")
    assert topo["matrix"][0] == ["X"] + ["NV12"] * 7
    assert (as_json["differences"], as_json["complete"]) == ([], True)
