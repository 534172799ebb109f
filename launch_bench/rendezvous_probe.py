"""Rendezvous probe: join the process group, pass a barrier, print when this rank passed.

Used by benchmarks/launch_overhead.py to time how long a launcher takes to bring every rank
through rendezvous, and how much of it the worker itself takes (its first line is printed
before torch is imported). Imports only torch, like the trainer.
"""

import time

print(f"probe-started t={time.time():.6f}", flush=True)

import torch.distributed as dist  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    print(f"rendezvous-passed rank={dist.get_rank()} world={dist.get_world_size()} "
          f"t={time.time():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
