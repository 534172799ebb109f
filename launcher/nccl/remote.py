"""One command on one node over SSH, for `launch topo -i` and `launch bench -i --nccl-tests`:
the SSH executor's connection (host keys verified), the argv quoted once, the output kept."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.inventory import Node


@dataclass(frozen=True)
class RemoteResult:
    node: str
    exit_code: int  # 127: the command is not installed on the node
    stdout: str
    stderr: str


def run_on_node(node: Node, argv: list[str], options, *, timeout: float) -> RemoteResult:
    """Raises the executor's HostProblem (naming the host) when the node cannot be reached."""
    from launcher.ssh import connect, remote  # fabric and paramiko load only for -i

    conn = connect(node, options)
    try:
        result = conn.run(remote(*argv), hide=True, warn=True, in_stream=False, timeout=timeout)
        return RemoteResult(node.name, result.exited, result.stdout, result.stderr)
    finally:
        conn.close()
