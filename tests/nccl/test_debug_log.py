"""NCCL_DEBUG=INFO logs: version, network, EFA, transports per connection, channels, ranks."""

from __future__ import annotations

import pytest

from launcher.nccl.debug_log import parse_debug_log, parse_debug_logs, transport_name
from launcher.nccl.errors import NcclParseError

# No WARN line, and every NCCL line with its HOST:PID:TID prefix.
CLEAN = {"nccl_warnings": [], "lines_without_host": 0}

EXPECTED = {
    # Two nodes x 1 GPU over TCP: each of the 4 connections is logged as [send] and [receive].
    "debug_socket_2nodes.log": {
        "kind": "nccl-debug", "nccl_version": "2.21.5", "network": "Socket", "efa": None,
        "transports": {"NET/Socket": 4}, "channels": 2, "ranks": 2,
        "hosts": ["ip-10-0-0-5", "ip-10-0-0-6"], **CLEAN,
    },
    # mpirun prefixes; IB with GDRDMA except one channel's NIC; a WARN line with a source spot.
    "debug_ib_gdr_mpirun.log": {
        "kind": "nccl-debug", "nccl_version": "2.18.3", "network": "IB", "efa": None,
        "transports": {"NET/IB": 1, "NET/IB/GDRDMA": 3, "P2P/IPC": 4}, "channels": 2,
        "ranks": 4, "hosts": ["gpu01", "gpu02"], "lines_without_host": 0,
        "nccl_warnings": ["Call to ibv_reg_dmabuf_mr failed with error Protocol not supported "
                          "(misc/ibvwrap.cc:189)"],
    },
    # One p4d node's log of a 16-rank job: old aws-ofi-nccl spelling, `AWS Libfabric`.
    "debug_efa_node1.log": {
        "kind": "nccl-debug", "nccl_version": "2.18.5", "network": "AWS Libfabric",
        "efa": {"provider": "efa", "nics": 4},
        "transports": {"NET/AWS Libfabric/GDRDMA": 4, "P2P/IPC": 14}, "channels": 8,
        "ranks": 16, "hosts": ["ip-172-31-40-11"], **CLEAN,
    },
    # torchrun `[default0]:` prefixes, newer plugin spelling, `1(2)/GDRDMA/Shared` devices,
    # a split communicator repeating a connection line, channels only from `coll channels`.
    "debug_libfabric_torchrun.log": {
        "kind": "nccl-debug", "nccl_version": "2.23.4", "network": "Libfabric",
        "efa": {"provider": "efa", "nics": 4},
        "transports": {"NET/Libfabric/GDRDMA": 4, "P2P/CUMEM": 4}, "channels": 2,
        "ranks": 4, "hosts": ["ip-10-2-3-4"], **CLEAN,
    },
    # One PCIe box, one process, 4 GPUs: direct pointers and shared memory, no network.
    "debug_single_node_pcie.log": {
        "kind": "nccl-debug", "nccl_version": "2.20.5", "network": "Socket", "efa": None,
        "transports": {"P2P/direct pointer": 4, "SHM": 4}, "channels": 2, "ranks": 4,
        "hosts": ["g6e-box"], **CLEAN,
    },
    # NCCL 2.4: `Ring 00 : 1 -> 0 [receive]`, no `Using network` line, no channel total.
    "debug_old_ring.log": {
        "kind": "nccl-debug", "nccl_version": "2.4.8", "network": None, "efa": None,
        "transports": {"NET/Socket": 2}, "channels": 1, "ranks": 2,
        "hosts": ["node-a", "node-b"], **CLEAN,
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parses_to_the_expected_json(data_dir, name):
    path = data_dir / name
    assert parse_debug_log(path.read_text(), str(path)).to_json() == EXPECTED[name]


def test_logs_of_both_nodes_merge_without_counting_a_connection_twice(data_dir):
    names = ["debug_efa_node1.log", "debug_efa_node2.log"]
    log = parse_debug_logs([(name, (data_dir / name).read_text()) for name in names])
    assert log.paths == tuple(names)
    assert log.to_json() == {
        "kind": "nccl-debug", "nccl_version": "2.18.5", "network": "AWS Libfabric",
        "efa": {"provider": "efa", "nics": 4},
        # 2 channels x 7 P2P hops per node; 2 channels x 2 inter-node hops, seen from both ends
        "transports": {"NET/AWS Libfabric/GDRDMA": 4, "P2P/IPC": 28}, "channels": 8,
        "ranks": 16, "hosts": ["ip-172-31-40-11", "ip-172-31-44-200"], **CLEAN,
    }


@pytest.mark.parametrize("name, socket", [
    ("debug_socket_2nodes.log", True),
    ("debug_old_ring.log", True),
    ("debug_single_node_pcie.log", False),  # says `Using network Socket`, uses no network
    ("debug_efa_node1.log", False),
])
def test_uses_socket(data_dir, name, socket):
    assert parse_debug_log((data_dir / name).read_text()).uses_socket is socket


def test_ranks_that_disagree_are_all_reported(data_dir):
    text = (data_dir / "debug_socket_2nodes.log").read_text()
    text += ("ip-10-0-0-7:511:511 [0] NCCL INFO NCCL version 2.19.3+cuda12.3\n"
             "ip-10-0-0-7:511:540 [0] NCCL INFO Using network IB\n")
    log = parse_debug_log(text)
    assert (log.nccl_version, log.network) == ("2.19.3, 2.21.5", "IB, Socket")


@pytest.mark.parametrize("via, name", [
    ("P2P/IPC/read", "P2P/IPC"),
    ("P2P/IPC", "P2P/IPC"),
    ("P2P/CUMEM/read", "P2P/CUMEM"),
    ("P2P/direct pointer", "P2P/direct pointer"),
    ("SHM/direct/direct", "SHM"),
    ("NET/Socket/1", "NET/Socket"),
    ("NET/IB/5/GDRDMA", "NET/IB/GDRDMA"),
    ("NET/AWS Libfabric/1(2)/GDRDMA/Shared", "NET/AWS Libfabric/GDRDMA"),
    ("NET/Libfabric/0", "NET/Libfabric"),
])
def test_transport_names(via, name):
    assert transport_name(via) == name


def test_a_file_without_nccl_lines_is_refused_by_name(data_dir):
    sources = [("debug_socket_2nodes.log", (data_dir / "debug_socket_2nodes.log").read_text()),
               ("train.out", "epoch 1 loss 0.93\nepoch 2 loss 0.71\n")]
    with pytest.raises(NcclParseError, match=r"^train\.out: not an NCCL_DEBUG=INFO log"):
        parse_debug_logs(sources)
