"""Launcher labels and timestamps come off the front of a line; nothing else does."""

from __future__ import annotations

import pytest

from launcher.nccl.labels import LABELS, labels_of, strip_labels

NCCL_LINE = "node01:150770:150790 [0] NCCL INFO Using network IB"

# (line as a launcher printed it, the labels on it, the line the program wrote). Each example
# is a line of a real paste in data/real/ (or of a tool's documented format where none was
# found: kubectl, journalctl).
LABELLED = [
    ("[1,0]<stdout>:#  Rank  0 Group  0 Pid   7774 on nc-d87e1263-head device  0",
     ["Open MPI --tag-output"], "#  Rank  0 Group  0 Pid   7774 on nc-d87e1263-head device  0"),
    ("[0]<stdout>:" + NCCL_LINE, ["horovodrun (Gloo)"], NCCL_LINE),
    ("[1]<stderr>:[I debug.cpp:49] [c10d] The debug level is set to DETAIL.",
     ["horovodrun (Gloo)"], "[I debug.cpp:49] [c10d] The debug level is set to DETAIL."),
    ("[default3]:tp4-dp2-inference-pods-0:81:110 [3] NCCL INFO comm 0x557cb94049d0",
     ["torchrun --tee"], "tp4-dp2-inference-pods-0:81:110 [3] NCCL INFO comm 0x557cb94049d0"),
    ("[rank0]: ncclRemoteError: A call failed", ["torchrun --tee"],
     "ncclRemoteError: A call failed"),
    (" 0: #  Rank  8 Group  0 Pid 541703 on    node007", ["srun --label"],
     "#  Rank  8 Group  0 Pid 541703 on    node007"),
    (" 0:      8388608       2097152     float     sum      -1", ["srun --label"],
     "     8388608       2097152     float     sum      -1"),
    (" 0:", ["srun --label"], ""),
    ("15: slurmstepd: error: Failed to invoke spank plugin stack", ["srun --label"],
     "slurmstepd: error: Failed to invoke spank plugin stack"),
    ("gpu1505: gpu1505:22060:22171 [0] NCCL INFO Connected all rings",
     ["pdsh (DeepSpeed's multi-node launcher)"],
     "gpu1505:22060:22171 [0] NCCL INFO Connected all rings"),
    ("104.171.201.172: lambda-scalar03:148967:150191 [1] NCCL INFO Connected all rings",
     ["pdsh (DeepSpeed's multi-node launcher)"],
     "lambda-scalar03:148967:150191 [1] NCCL INFO Connected all rings"),
    ("(head, rank=0, pid=3808) [1,0]<stdout>:# Using devices",
     ["SkyPilot / Ray", "Open MPI --tag-output"], "# Using devices"),
    ("(worker1, rank=1, pid=2769, ip=10.100.10.12) Worker nodes", ["SkyPilot / Ray"],
     "Worker nodes"),
    ("  | 2025-05-22T14:26:33.406-07:00 | ip-10-36-22-140:85:2505 [0] NCCL INFO NET/OFI x",
     ["CloudWatch Logs console"], "ip-10-36-22-140:85:2505 [0] NCCL INFO NET/OFI x"),
    ("  | 2025-05-16T16:39:51.208-07:00ip-10-36-29-253:79:79 [0] NCCL INFO Bootstrap : Using "
     "eth0:10.36.29.253<0> | ip-10-36-29-253:79:79 [0] NCCL INFO Bootstrap : Using "
     "eth0:10.36.29.253<0>", ["CloudWatch Logs console"],
     "ip-10-36-29-253:79:79 [0] NCCL INFO Bootstrap : Using eth0:10.36.29.253<0>"),
    ("2025-02-20T09:14:03.22284961Z #", ["kubectl logs --timestamps"], "#"),
    ("2024-03-01T10:15:30Z [1,0]<stdout>:" + NCCL_LINE,
     ["kubectl logs --timestamps", "Open MPI --tag-output"], NCCL_LINE),
    ("Feb 04 10:15:00 node01 horovodrun[4242]: [0]<stdout>:" + NCCL_LINE,
     ["journalctl", "horovodrun (Gloo)"], NCCL_LINE),
    ("[2026-01-01 12:08:32] llama-3-8b-node-0-0:194:710 [0] x.cc:1 NCCL WARN y",
     ["NCCL's own timestamp"], "llama-3-8b-node-0-0:194:710 [0] x.cc:1 NCCL WARN y"),
    ("Tue Apr 21 18:22:52 2020[0]<stdout>:cuda is available:1",
     ["horovodrun --timestamp-output", "horovodrun (Gloo)"], "cuda is available:1"),
]

# Lines the programs themselves write, which look a little like labels: left alone.
UNLABELLED = [
    NCCL_LINE,
    "GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error'",  # nccl-tests' own
    ".. node pid 12225: Test failure common.cu:407",
    "           8             2     float     sum      -1    19.90    0.00    0.00      0",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "  NIC0: mlx5_0",
    "Legend:",
    "GPU0     X      NV12    NV12    PXB     24-31,88-95     3               N/A",
    "NCCL INFO Channel 00/0 : 3[3] -> 11[3] [receive] via NET/IBext_v8/3/GDRDMA",
    "root@node:~/nccl-tests/build#_ NCCL_DEBUG=INFO ./alltoall_perf",
    "<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read",
]


@pytest.mark.parametrize("line, sources, rest", LABELLED)
def test_known_labels_come_off(line, sources, rest):
    assert labels_of(line) == sources
    assert strip_labels(line) == rest


@pytest.mark.parametrize("line", UNLABELLED)
def test_program_output_is_left_alone(line):
    assert labels_of(line) == []
    assert strip_labels(line) == line


def test_every_label_has_an_example():
    assert {source for _, sources, _ in LABELLED for source in sources} == \
        {label.source for label in LABELS}
