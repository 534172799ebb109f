"""`launch inspect` end to end, through the real CLI in a subprocess."""

from __future__ import annotations

import json

DEBUG_SOCKET = {
    "kind": "nccl-debug", "nccl_version": "2.21.5", "network": "Socket", "efa": None,
    "transports": {"NET/Socket": 4}, "channels": 2, "ranks": 2,
    "hosts": ["ip-10-0-0-5", "ip-10-0-0-6"], "nccl_warnings": [], "lines_without_host": 0,
}


def test_summaries_of_each_kind(run_launch, data_dir):
    proc = run_launch("inspect", str(data_dir / "ar_current_p4d.txt"),
                      str(data_dir / "debug_socket_2nodes.log"), str(data_dir / "topo_p4d.txt"),
                      check=True)
    out = proc.stdout
    assert "ar_current_p4d.txt: nccl-tests all_reduce" in out
    assert "ranks: 8 on 1 host(s): ip-172-31-5-10" in out
    assert "busbw: peak 237.31 GB/s at 2 GiB, average 91.38 GB/s" in out
    assert "wrong: 0" in out
    assert "debug_socket_2nodes.log: NCCL_DEBUG log" in out
    assert "network: Socket" in out and "transports (connections): NET/Socket 4" in out
    assert "EFA: no libfabric provider selected" in out
    assert "warning: NCCL used TCP sockets (NET/Socket) between nodes" in out
    assert "class: nvswitch" in out and "worst GPU link: NV12" in out
    assert "GPUs: 8, NICs: 4 (rdmap16s27, rdmap32s27, rdmap144s27, rdmap160s27)" in out
    assert proc.stderr == ""


def test_efa_is_shown_with_its_nic_count(run_launch, data_dir):
    proc = run_launch("inspect", str(data_dir / "debug_libfabric_torchrun.log"), check=True)
    assert "network: Libfabric" in proc.stdout
    assert "EFA: provider efa, 4 NIC(s)" in proc.stdout
    assert "NET/Libfabric/GDRDMA 4, P2P/CUMEM 4" in proc.stdout


def test_no_socket_warning_for_a_single_box(run_launch, data_dir):
    proc = run_launch("inspect", str(data_dir / "debug_single_node_pcie.log"), check=True)
    assert "transports (connections): P2P/direct pointer 4, SHM 4" in proc.stdout
    assert "warning" not in proc.stdout


def test_json_for_one_file_is_one_object(run_launch, data_dir):
    path = str(data_dir / "debug_socket_2nodes.log")
    proc = run_launch("inspect", "--json", path, check=True)
    assert json.loads(proc.stdout) == {"file": path, **DEBUG_SOCKET}


def test_json_for_several_files_is_one_line_each_in_order(run_launch, data_dir):
    names = ["alltoall_2nodes.txt", "debug_socket_2nodes.log", "topo_single_gpu.txt"]
    proc = run_launch("inspect", "--json", *(str(data_dir / n) for n in names), check=True)
    objects = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["kind"] for o in objects] == ["nccl-tests", "nccl-debug", "topology"]
    assert objects[0] == {"file": str(data_dir / names[0]),
                          **json.loads((data_dir / "alltoall_2nodes.json").read_text())}
    assert objects[2]["class"] == "single-gpu"


def test_unrelated_file_exits_2_naming_it(run_launch, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("remember to buy milk\n")
    proc = run_launch("inspect", str(notes))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"launch: error: {notes}: not a log `launch inspect` knows")
    assert "Traceback" not in proc.stderr


def test_bad_files_do_not_hide_good_ones(run_launch, data_dir, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    missing = tmp_path / "missing.log"
    proc = run_launch("inspect", "--json", str(notes), str(data_dir / "debug_socket_2nodes.log"),
                      str(missing))
    assert proc.returncode == 2
    assert [json.loads(line)["kind"] for line in proc.stdout.splitlines()] == ["nccl-debug"]
    assert "2 of 3 files could not be read" in proc.stderr
    assert f"{notes}: not a log" in proc.stderr
    assert f"{missing}: cannot read it: No such file or directory" in proc.stderr
