"""Which of the three a text is."""

from __future__ import annotations

import pytest

from launcher.nccl.detect import detect_kind, parse_file, parse_text
from launcher.nccl.errors import NcclParseError


@pytest.mark.parametrize("name, kind", [
    ("ar_current_p4d.txt", "nccl-tests"),
    ("ag_mpirun_2nodes.txt", "nccl-tests"),
    ("ar_old_layout.txt", "nccl-tests"),
    ("rs_interleaved_debug.txt", "nccl-tests"),  # NCCL INFO lines too: the table decides
    ("debug_socket_2nodes.log", "nccl-debug"),
    ("debug_ib_gdr_mpirun.log", "nccl-debug"),
    ("debug_libfabric_torchrun.log", "nccl-debug"),
    ("topo_p4d.txt", "topology"),
    ("topo_g6e_pcie.txt", "topology"),
    ("topo_single_gpu.txt", "topology"),
])
def test_detect_kind(data_dir, name, kind):
    text = (data_dir / name).read_text()
    assert detect_kind(text) == kind
    assert parse_text(text).to_json()["kind"] == kind


@pytest.mark.parametrize("text", [
    "",
    "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: nope\n",
    "# size count type\nthis mentions NCCL INFO but is prose\n",
    " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n",  # nvidia-smi topo -p2p r
])
def test_unrelated_text_is_none_of_them(text):
    assert detect_kind(text) is None
    with pytest.raises(NcclParseError, match=r"^notes\.txt: not a log `launch inspect` knows: "
                                             r"expected nccl-tests output"):
        parse_text(text, "notes.txt")


def test_an_unreadable_file_is_named(tmp_path):
    missing = tmp_path / "gone.log"
    with pytest.raises(NcclParseError, match=r"gone\.log: cannot read it: No such file"):
        parse_file(missing)
    with pytest.raises(NcclParseError, match=r"not a regular file"):
        parse_file(tmp_path)
