"""Real pastes from public issues, docs and blog posts (data/real/, sources in SOURCES): each
gives the facts a person reads off the text, written here by hand from the text itself."""

from __future__ import annotations

import json

import pytest

from launcher.nccl.detect import parse_file
from launcher.nccl.errors import NcclParseError

H100 = "NVIDIA H100 80GB HBM3"
EFA_ERROR_AT = ("int cm_req_handle_error_entry(nccl_net_ofi_context_t*, fid_cq*, "
                "fi_cq_err_entry*, uint16_t):46")
GENOA_FAILURE = ("GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error (run with "
                 "NCCL_DEBUG=INFO for details) / '")

# file -> facts. For tables: "rows" is the sizes of the rows a reader counts (a row cut short
# by the paste is not one), "peak_busbw" the largest busbw of either placement.
FACTS = {
    # 16 rank lines on node005 and node007; count x 4 bytes = size with sum: all_reduce; 11
    # sizes 8 MiB .. 8 GiB; validation 0, so every #wrong is N/A.
    "srun_label_ar_h100_2nodes.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": 16,
        "hosts": ["node005", "node007"], "gpus": [H100] * 16, "nccl_version": None,
        "rows": [8 << 20 << i for i in range(11)], "peak_busbw": 167.87,
        "avg_busbw": 142.735, "wrong_total": None, "failed": False},
    "srun_label_ar_h100_ring.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": 16,
        "hosts": ["node005", "node007"], "rows": [8 << 20 << i for i in range(11)],
        "peak_busbw": 102.27, "avg_busbw": 85.5294, "wrong_total": None, "failed": False},
    # No rank lines; redop none and a per-rank count (512 x 4 < 65536): all_gather or alltoall.
    "srun_label_ag_mi250x.txt": {
        "kind": "nccl-tests", "collective": None, "ranks": None, "hosts": [],
        "rows": [64 << 10 << i for i in range(17)], "peak_busbw": 92.74,
        "avg_busbw": 37.9868, "wrong_total": 0, "failed": False,
        "collective_reason_has": "all_gather and alltoall"},
    # No rank lines, but busbw is twice algbw (92.89 vs 47.94): all_reduce on many ranks, not a
    # sendrecv.
    "srun_label_ar_mi250x.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": None,
        "rows": [64 << 10 << i for i in range(17)], "peak_busbw": 92.89,
        "avg_busbw": 43.7269, "wrong_total": 0, "failed": False},
    "srun_label_ar_p4de_25m.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "rows": [26214400],
        "peak_busbw": 26.23, "avg_busbw": 25.3468, "wrong_total": 0, "failed": False},
    "skypilot_mpirun_ag_h200.txt": {
        "kind": "nccl-tests", "collective": None, "ranks": 16,
        "hosts": ["nc-d87e1263-head", "nc-d87e1263-worker1"],
        "rows": [1024 << i for i in range(24)], "peak_busbw": 332.58, "avg_busbw": 122.073,
        "wrong_total": 0, "failed": False, "collective_reason_has": "all_gather and alltoall"},
    # The `redop` column is blank in both rows; count 1048576 x 4 x 64 = size.
    "old_alltoall_blank_redop.txt": {
        "kind": "nccl-tests", "collective": None, "ranks": None,
        "rows": [256 << 20, 512 << 20], "redops": [None, None], "peak_busbw": 0.51,
        "avg_busbw": 0.507636, "wrong_total": 0, "failed": False,
        "collective_reason_has": "all_gather and alltoall"},
    "old_allreduce_64ranks.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "rows": [256 << 20, 512 << 20],
        "peak_busbw": 4.33, "avg_busbw": 4.32178, "wrong_total": 0, "failed": False},
    # The command line names all_reduce_perf; the 2 GiB row is cut after its in-place busbw.
    "old_allreduce_256gpu_truncated.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "nccl_version": "2.8.4",
        "rows": [32 << 20 << i for i in range(6)], "peak_busbw": 74.36, "avg_busbw": None,
        "wrong_total": None, "failed": False},
    # Two ranks, `float sum -1` and busbw = algbw: all_reduce and sendrecv look the same. The
    # 8 KiB row is cut mid-number.
    "sendrecv_2ranks_unnamed.txt": {
        "kind": "nccl-tests", "collective": None, "ranks": 2, "hosts": ["gpu23", "gpu24"],
        "rows": [256 << i for i in range(5)], "peak_busbw": 0.13, "wrong_total": 0,
        "failed": False, "collective_reason_has": "sendrecv"},
    "failed_alltoall_5090_collapsed.txt": {
        "kind": "nccl-tests", "collective": "alltoall", "ranks": 1, "hosts": ["node"],
        "nccl_version": "2.25.1", "rows": [], "failed": True,
        "failure_reason": "node: Test CUDA failure common.cu:297 'an illegal memory access "
                          "was encountered'",
        "failure_lines": 7,
        "debug": {"network": "Socket", "channels": 64, "ranks": 1, "hosts": ["node"]}},
    "failed_allreduce_5090_p2p.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": 2, "hosts": ["GENOA-06"],
        "rows": [], "failed": True, "failure_reason": GENOA_FAILURE, "failure_lines": 6,
        "debug": None},
    "failed_allreduce_5090_debug.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": 2, "hosts": ["GENOA-06"],
        "nccl_version": "2.25.1", "rows": [], "failed": True, "failure_reason": GENOA_FAILURE,
        "failure_lines_have": "NCCL WARN Cuda failure 1 'invalid argument' (enqueue.cc:1500)",
        "debug": {"network": "Socket", "transports": {"SHM": 4}, "channels": 2, "ranks": 2,
                  "hosts": ["GENOA-06"], "warnings": 3}},
    # CONSTRUCTED from the file above with kubectl's timestamps: the same facts.
    "kubectl_timestamps_failed_allreduce.txt": {
        "kind": "nccl-tests", "collective": "all_reduce", "ranks": 2, "hosts": ["GENOA-06"],
        "nccl_version": "2.25.1", "rows": [], "failed": True, "failure_reason": GENOA_FAILURE,
        "debug": {"network": "Socket", "transports": {"SHM": 4}, "ranks": 2}},
    # Each of 2 channels crosses between node01 (rank 0) and node03 (rank 1) both ways.
    "horovod_gloo_debug.log": {
        "kind": "nccl-debug", "nccl_version": "2.16.2", "network": "IB", "efa": None,
        "transports": {"NET/IB": 4}, "channels": 2, "ranks": 2,
        "hosts": ["node01", "node03"], "lines_without_host": 0, "warnings": 0},
    # CONSTRUCTED from the file above with journalctl's prefix: the same facts.
    "journald_short_horovod.log": {
        "kind": "nccl-debug", "nccl_version": "2.16.2", "network": "IB",
        "transports": {"NET/IB": 4}, "channels": 2, "ranks": 2, "hosts": ["node01", "node03"]},
    "torchrun_default_comm.log": {
        "kind": "nccl-debug", "ranks": 8, "hosts": ["tp4-dp2-inference-pods-0"]},
    "torchrun_default_ofi.log": {
        "kind": "nccl-debug", "efa": {"provider": "efa", "nics": 4}, "network": None,
        "hosts": ["tp4-dp2-inference-pods-0"]},
    # No nRanks line: the rings `0 1 2 3` give 4 ranks; `Channel 31/32` gives 32 channels.
    "torchrun_default_tp_channels.log": {
        "kind": "nccl-debug", "channels": 32, "ranks": 4,
        "hosts": ["tp4-dp2-inference-pods-0"]},
    "torchrun_default_p2p.log": {
        "kind": "nccl-debug", "transports": {"P2P/CUMEM": 7},
        "hosts": ["tp4-dp2-inference-pods-0"]},
    # The NCCL hosts, not pdsh's labels (addresses); 9 P2P/IPC connection lines, the last
    # line cut before its NCCL part.
    "pdsh_ip_prefix_p2p.log": {
        "kind": "nccl-debug", "transports": {"P2P/IPC": 9},
        "hosts": ["lambda-scalar02", "lambda-scalar03"], "lines_without_host": 0},
    "pdsh_host_prefix_ib.log": {
        "kind": "nccl-debug", "transports": {}, "channels": 2,
        "hosts": ["gpu1504", "gpu1505"], "lines_without_host": 0},
    "cloudwatch_glued_init.log": {
        "kind": "nccl-debug", "nccl_version": "2.21.5", "efa": None,
        "hosts": ["ip-10-36-29-253"], "lines_without_host": 0},
    "cloudwatch_p4d_ofi.log": {
        "kind": "nccl-debug", "efa": {"provider": "efa", "nics": 4},
        "hosts": ["ip-10-36-22-140"], "lines_without_host": 0},
    "eks_ofi_warn_cpp_signature.log": {
        "kind": "nccl-debug", "nccl_version": "2.27.3",
        "transports": {"NET/Libfabric/GDRDMA": 4}, "hosts": ["llama-3-8b-node-0-0"],
        "warnings": 2, "every_warning_has": "Unresponsive receiver", "warned_at": EFA_ERROR_AT},
    "warn_cpp_signature_plugin_init.log": {
        "kind": "nccl-debug", "nccl_version": "2.28.3", "hosts": ["x3002c0s31b0n0"],
        "lines_without_host": 8, "warnings": 5,
        "warned_at": "int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):418",
        "a_warning_starts": "NET/OFI aws-ofi-nccl initialization failed"},
    "stripped_prefix_cxi_16ranks.log": {
        "kind": "nccl-debug", "nccl_version": "2.28.3", "network": "AWS Libfabric",
        "efa": {"provider": "cxi", "nics": 2}, "ranks": 16, "channels": 4,
        "transports": {"P2P/CUMEM": 8}, "hosts": [], "lines_without_host": 26},
    "grep_channel_lines_ibext.log": {
        "kind": "nccl-debug", "transports": {"NET/IBext_v8/GDRDMA": 2, "P2P/CUMEM": 1},
        "hosts": [], "lines_without_host": 3},
    "partial_prefix_cxi.log": {
        "kind": "nccl-debug", "network": "AWS Libfabric", "efa": {"provider": "cxi", "nics": 8},
        "ranks": 2, "hosts": [], "lines_without_host": 14},
    "redacted_host_p2p_socket.log": {
        "kind": "nccl-debug", "transports": {"NET/Socket": 2, "P2P/IPC": 14}, "channels": 8,
        "hosts": [], "lines_without_host": 16},
    # 8 GPUs all NV12 to each other; 10 NICs in the legend although the header glued two.
    "topo_glued_nic_columns.txt": {
        "kind": "topology", "gpus": 8, "nics": 10, "class": "nvswitch", "worst_link": "NV12",
        "nic_names": [f"mlx5_{i}" for i in range(10)],
        "nic_links": {0: ["PXB", "PXB"] + ["SYS"] * 8,
                      6: ["SYS"] * 6 + ["PXB", "PXB", "SYS", "SYS"]},
        "cpu_affinity": {0: "24-31,88-95", 7: "40-47,104-111"},
        "repairs_have": ["'NIC7NIC8'", "'SYSSYS'", "'PXBSYS'"]},
}

REFUSED = {"custom_p4dn_node_summary.txt": "not a log `launch inspect` knows"}


def test_every_real_paste_is_listed_in_sources_and_has_facts(data_dir):
    real = data_dir / "real"
    files = sorted(p.name for p in real.iterdir() if p.name != "SOURCES")
    assert files == sorted([*FACTS, *REFUSED])
    sources = (real / "SOURCES").read_text()
    for name in files:
        assert f"\n{name} | " in sources, name
    assert len(files) - sources.count("CONSTRUCTED:") >= 20


@pytest.mark.parametrize("name", sorted(FACTS))
def test_real_paste_gives_its_facts(data_dir, name):
    parsed = parse_file(data_dir / "real" / name)
    got = parsed.to_json()
    for key, want in FACTS[name].items():
        if key == "rows":
            assert [row["size"] for row in got["rows"]] == want
        elif key == "redops":
            assert [row["redop"] for row in got["rows"]] == want
        elif key == "collective_reason_has":
            assert want in got["collective_reason"]
        elif key == "failure_lines":
            assert len(got["failure_lines"]) == want
        elif key == "failure_lines_have":
            assert want in got["failure_lines"]
        elif key == "debug":
            assert _debug_facts(got["debug"], want) == want
        elif key == "warnings":
            assert len(got["nccl_warnings"]) == want
        elif key == "every_warning_has":
            assert all(want in w for w in got["nccl_warnings"])
        elif key == "a_warning_starts":
            assert any(w.startswith(want) for w in got["nccl_warnings"])
        elif key == "warned_at":
            assert any(w.endswith(f"({want})") for w in got["nccl_warnings"])
        elif key == "nic_names":
            assert list(parsed.nic_names) == want
        elif key == "nic_links":
            assert {gpu: list(parsed.nic_links[gpu]) for gpu in want} == want
        elif key == "cpu_affinity":
            assert {gpu: parsed.cpu_affinity[gpu] for gpu in want} == want
        elif key == "repairs_have":
            assert all(any(glued in w for w in got["warnings"]) for glued in want)
        else:
            assert got[key] == want, key


def _debug_facts(debug: dict | None, want: dict | None) -> dict | None:
    if debug is None or want is None:
        return debug
    return {key: (len(debug["nccl_warnings"]) if key == "warnings" else debug[key])
            for key in want}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unrecognisable_paste_is_refused_naming_the_file(data_dir, name):
    path = data_dir / "real" / name
    with pytest.raises(NcclParseError, match=REFUSED[name]) as caught:
        parse_file(path)
    assert str(caught.value).startswith(str(path))


def test_no_real_paste_crashes_inspect(run_launch, data_dir):
    """Every paste at once through the CLI: results for all but the refused one, which gets
    the clear exit-2 message, no traceback."""
    paths = sorted(str(p) for p in (data_dir / "real").iterdir() if p.name != "SOURCES")
    proc = run_launch("inspect", "--json", *paths)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    refused = next(p for p in paths if p.endswith("custom_p4dn_node_summary.txt"))
    assert proc.stderr.startswith(f"launch: error: {refused}: not a log `launch inspect` knows")
    assert len(proc.stdout.splitlines()) == len(paths) - 1
    text = run_launch("inspect", *paths)
    assert text.returncode == 2 and "Traceback" not in text.stderr


def test_inspect_on_a_failed_run_exits_0_with_the_reason(run_launch, data_dir):
    path = data_dir / "real" / "failed_allreduce_5090_debug.txt"
    proc = run_launch("inspect", "--json", str(path), check=True)
    got = json.loads(proc.stdout)
    assert (got["kind"], got["failed"], got["rows"]) == ("nccl-tests", True, [])
    assert got["failure_reason"] == GENOA_FAILURE
    text = run_launch("inspect", str(path), check=True).stdout
    assert f"  FAILED: {GENOA_FAILURE}\n" in text
    assert "NCCL_DEBUG lines in the output:" in text
    assert "NCCL WARN: Cuda failure 1 'invalid argument' (enqueue.cc:1500)" in text
