"""launch's own measuring workloads, started by torchrun on every rank like a job:

    bench.py             the collective bandwidth sweep (`launch bench`); with --gate, the
                         collective gate (`launch check --gate`)
    gate.py              the gate's rounds: all nodes, then node pairs until the slow one is named
    gatesearch.py        which pairs to measure next, and the verdict (pure)
    rendezvous_probe.py  join, barrier, leave: benchmarks/launch_overhead.py times launchers by it

Imports torch and the trainer's process-group setup (train/main.py), never `launcher`.
"""
