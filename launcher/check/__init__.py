"""`launch check`: what is wrong with the nodes before (and while) a job runs on them.

    node_probe.py   the one script each node runs (stdlib only): raw outputs and facts
    nvsmi.py, xid.py, links.py   parsers of what the probe brings back (nvidia-smi -q[-x],
                    kernel log Xids, nvlink -s, fi_info)
    health.py       facts -> checks (ok | warn | fail | skipped, with the evidence line)
    probe.py        run the probe on every node through the backend, in parallel
    gate.py         the collective gate: run the all-reduce/pairwise search, read its verdict
    table.py        the host x check table and its JSON
"""
