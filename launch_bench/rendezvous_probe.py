"""Rendezvous probe: join the process group, pass a barrier, print when this rank passed.

Used by benchmarks/launch_overhead.py to time how long a launcher takes to bring every rank
through rendezvous. Imports only torch, like the trainer.
"""

import time

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    print(f"rendezvous-passed rank={dist.get_rank()} world={dist.get_world_size()} "
          f"t={time.time():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
