"""`launch bench -i INVENTORY --nccl-tests` across nodes: the mpirun command it runs on the head.

mpirun itself needs GPUs and nccl-tests on real nodes; here the command is checked whole (dry
run), and the remote wrapper that writes the hostfile before starting mpirun is run for real on
this machine, with values that a shell would mangle if they were pasted into the script.
"""

from __future__ import annotations

import json
import subprocess

from launcher.nccl.sweep import hostfile_text, mpi_prefix, parse_env_text, with_hostfile


def test_the_head_runs_mpirun_with_a_hostfile_and_the_nodes_settings(run_launch, tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  vars:\n    gpus: 8\n    instance_type: p4d.24xlarge\n  hosts:\n"
        "    node0:\n      ansible_host: 198.51.100.7\n      private_ip: 10.0.0.5\n"
        "    node1:\n      ansible_host: 198.51.100.8\n      private_ip: 10.0.0.6\n")
    proc = run_launch("bench", "-i", str(inventory), "--nccl-tests", "--dry-run", "--json",
                      "--run-id", "b1", "--max-bytes", "1G")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    test = ["/opt/launch/nccl-tests/bin/all_reduce_perf", "-b", "8", "-e", "1073741824", "-f", "2",
            "-d", "float", "-w", "5", "-n", "20", "-c", "1", "-g", "1"]
    assert plan == {"run_id": "b1", "node": "node0", "argv": [
        "sh", "-c", 'printf "%s" "$1" > "$2" && shift 2 && exec "$@"', "launch-bench",
        "10.0.0.5 slots=8\n10.0.0.6 slots=8\n", "/tmp/launch-b1.hostfile",
        "/usr/bin/mpirun", "--allow-run-as-root", "--prefix", "/usr",
        "--hostfile", "/tmp/launch-b1.hostfile", "-np", "16", "--map-by", "ppr:8:node",
        "--bind-to", "none", "--mca", "pml", "^cm,ucx", "--mca", "btl", "tcp,self",
        "--mca", "btl_tcp_if_exclude", "lo,docker0", "-x", "NCCL_DEBUG=INFO", *test]}
    text = run_launch("bench", "-i", str(inventory), "--nccl-tests", "--dry-run",
                      "--run-id", "b1", "--max-bytes", "1G")
    assert "(and -x KEY=VALUE for each setting in /etc/launch/nccl.env on node0" in text.stdout


def test_an_efa_node_uses_the_efa_installers_open_mpi_and_passes_its_settings():
    env = parse_env_text("# Written by launch setup (role efa)\nFI_PROVIDER=efa\n"
                         "FI_EFA_FORK_SAFE=1\nNCCL_NET_PLUGIN=ofi\n"
                         "LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib\n")
    assert env == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "NCCL_NET_PLUGIN": "ofi",
                   "LD_LIBRARY_PATH": "/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib"}
    assert mpi_prefix(env) == "/opt/amazon/openmpi"
    assert mpi_prefix({}) == "/usr"


def test_the_hostfile_is_written_before_the_command_starts(tmp_path):
    path = tmp_path / "it's $HOME; `x`.hostfile"
    text = hostfile_text(["10.0.0.5", "10.0.0.6"], 4)
    proc = subprocess.run(with_hostfile(text, str(path), ["cat", str(path)]),
                          capture_output=True, text=True, check=True)
    assert proc.stdout == "10.0.0.5 slots=4\n10.0.0.6 slots=4\n"
    assert path.read_text() == proc.stdout
