"""The torchrun (torch.distributed.run) command line for one node agent. Pure."""

from __future__ import annotations

import ipaddress


def endpoint(host: str, port: int) -> str:
    """host:port, with IPv6 literals bracketed the way torchrun parses them."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def torchrun_argv(
    python: str,
    *,
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    local_addr: str,
    is_host: bool,
    join_timeout: int,
    log_dir: str,
    max_restarts: int = 0,
) -> list[str]:
    """Dashed flag spellings, as torch/distributed/run.py documents them.

    `is_host` and `--local-addr` are explicit because c10d's own guess (matching the endpoint
    against the machine's hostname) fails inside network namespaces and on cloud hosts whose
    hostname resolves to another interface: every node then waits as a client until timeout.
    launch runs the store in a process of its own (launch_node/rdzv_store.py), so every agent is a
    client: is_host=0.
    `--node-rank` is omitted: c10d assigns ranks at rendezvous and ignores it.
    `max_restarts` (the recipe's `restarts`): how often this agent restarts its workers after
    one fails; launch counts the run's restarts and stops it beyond the recipe's number.
    """
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", rdzv_id,
        "--rdzv-conf", f"is_host={1 if is_host else 0},join_timeout={join_timeout}",
        "--local-addr", local_addr,
        # 0 (the default): one failed rank fails the run. With restarts, the workers are
        # restarted, the rendezvous re-forms and the trainer resumes from its checkpoint.
        "--max-restarts", str(max_restarts),
        # Per-rank stdout/stderr files under log_dir, and the same lines on torchrun's stdout
        # prefixed [default<local_rank>]: which launch turns into node/local_rank.
        "--tee", "3",
        "--log-dir", log_dir,
    ]
