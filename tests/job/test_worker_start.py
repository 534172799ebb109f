"""What launch_node/worker.py gives a rank as it starts: a LAUNCH_ATTEMPT that counts the rounds
its torchrun agent started it in (the same on every node: tests/job/test_local_job.py runs the
real case), and a MASTER_PORT that rank 0 can listen on, or a line saying why not."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from launch_node import worker

WORKER = Path(worker.__file__)
SAY_ATTEMPT = "import os; print('ATTEMPT', os.environ['LAUNCH_ATTEMPT'])\n"


def start_rank(tmp_path: Path, **env: str) -> str:
    """One rank started through worker.py as torchrun starts it; what it printed."""
    script = tmp_path / "job.py"
    script.write_text(SAY_ATTEMPT)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LAUNCH_", "TORCHELASTIC_", "MASTER_"))}
    proc = subprocess.run([sys.executable, str(WORKER), "script", str(script)], text=True,
                          capture_output=True, env={**clean, **env}, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def torchrun_error_file(tmp_path: Path, agent: str, restart_count: int, local_rank: int) -> str:
    """Where torchrun points TORCHELASTIC_ERROR_FILE: one folder per agent, one per round."""
    folder = tmp_path / "torchrun" / agent / f"attempt_{restart_count}" / str(local_rank)
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / "error.json")


def test_attempt_counts_the_rounds_of_the_agent_not_its_own_restart_count(tmp_path):
    # Rounds 0 and 1 of one agent whose workers never failed: its restart count stays 0.
    said = [start_rank(tmp_path, LAUNCH_ATTEMPT="2", LOCAL_RANK="0",
                       TORCHELASTIC_RESTART_COUNT="0",
                       TORCHELASTIC_ERROR_FILE=torchrun_error_file(tmp_path, "run_a1", 0, 0))
            for _ in range(2)]
    assert "ATTEMPT 2" in said[0] and "ATTEMPT 3" in said[1], said
    assert "attempt 3 on" in said[1]   # the line naming the rank says the same
    # Another local rank of that agent counts its own starts; a new agent starts again at the
    # attempt launch started it for.
    other = start_rank(tmp_path, LAUNCH_ATTEMPT="2", LOCAL_RANK="1",
                       TORCHELASTIC_RESTART_COUNT="0",
                       TORCHELASTIC_ERROR_FILE=torchrun_error_file(tmp_path, "run_a1", 0, 1))
    fresh = start_rank(tmp_path, LAUNCH_ATTEMPT="4", LOCAL_RANK="0",
                       TORCHELASTIC_RESTART_COUNT="0",
                       TORCHELASTIC_ERROR_FILE=torchrun_error_file(tmp_path, "run_b7", 0, 0))
    assert "ATTEMPT 2" in other and "ATTEMPT 4" in fresh


def test_attempt_falls_back_to_torchruns_count_without_its_folder(tmp_path):
    # No log folder (torchrun without --log-dir gives os.devnull), or none at all.
    assert "ATTEMPT 3" in start_rank(tmp_path, LAUNCH_ATTEMPT="1", LOCAL_RANK="0",
                                     TORCHELASTIC_RESTART_COUNT="2",
                                     TORCHELASTIC_ERROR_FILE=os.devnull)
    assert "ATTEMPT 1" in start_rank(tmp_path, LAUNCH_ATTEMPT="1", TORCHELASTIC_RESTART_COUNT="0")


def held_port() -> socket.socket:
    """A port taken on this machine's IPv4 addresses, as another program's socket takes it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", 0))
    s.listen()
    return s


def test_rank0_told_when_master_port_stays_taken(capsys):
    with held_port() as holder:
        port = str(holder.getsockname()[1])
        worker.wait_for_master_port({"RANK": "0", "MASTER_PORT": port,
                                     "TORCHELASTIC_USE_AGENT_STORE": "False"}, wait_s=0.3)
        said = capsys.readouterr().out
        assert f"launch: MASTER_PORT {port}, which torchrun chose for this round, is taken" in said
        assert "pytorch/pytorch#126510" in said
        # Not rank 0, or a store the agent shares: not this rank's port to listen on.
        worker.wait_for_master_port({"RANK": "1", "MASTER_PORT": port}, wait_s=0.3)
        worker.wait_for_master_port({"RANK": "0", "MASTER_PORT": port,
                                     "TORCHELASTIC_USE_AGENT_STORE": "True"}, wait_s=0.3)
        assert capsys.readouterr().out == ""


def test_rank0_waits_for_a_master_port_taken_for_a_moment(capsys):
    holder = held_port()
    port = str(holder.getsockname()[1])
    threading.Timer(0.3, holder.close).start()
    worker.wait_for_master_port({"RANK": "0", "MASTER_PORT": port}, wait_s=30)
    said = capsys.readouterr().out
    assert f"launch: MASTER_PORT {port}, which torchrun chose for this round, was taken" in said
    assert "it is free now" in said
    with socket.socket() as s:   # and it is
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", int(port)))
