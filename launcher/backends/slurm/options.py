"""`--slurm`: a Slurm allocation, and the flags that set a run's Slurm settings, by the recipe
key (slurm.*) each one overrides; the Slurm backend names them in messages."""

from __future__ import annotations

from typing import Any

from launcher.backends.flags import Flag

NAME = "slurm"
BACKEND = "launcher.backends.slurm.backend:SlurmBackend"
SELECT = (Flag(("--slurm",), "slurm", "one Slurm batch job from this login node (sbatch/srun; "
                                      "SLURM_CONF names the cluster); the run folder must be on "
                                      "a filesystem the compute nodes share",
               {"action": "store_true"}),)
FLAGS = (
    Flag(("--partition",), "partition", "Slurm: partition(s) to run in (default: the "
                                        "cluster's default partition)"),
    Flag(("--account",), "account", "Slurm: account to charge"),
    Flag(("--time",), "time", "Slurm: the job's time limit", {"metavar": "HH:MM:SS"}),
    Flag(("--sbatch-arg",), "sbatch_args", "Slurm: one more sbatch option, e.g. "
                                           "--sbatch-arg=--qos=high (repeatable)",
         {"action": "append", "metavar": "ARG"}),
    Flag(("--python",), "python", "Slurm: the interpreter with torch on the compute nodes "
                                  "(default python3 on the PATH the job inherits)",
         {"metavar": "PATH"}),
    Flag(("--gpus-per-node",), "gpus_per_node", "Slurm: GPUs to ask for per node (default: "
                                                "the partition's GRES)",
         {"type": int, "metavar": "G"}),
)
# The recipe key each flag overrides -> how messages name the flag.
SLURM_FLAGS = {f.dest: f.shown for f in FLAGS}
GROUP = "Slurm (with --slurm; they win over the recipe's slurm block)"


def selected(values: dict[str, Any]) -> bool:
    return bool(values.get("slurm"))


def settings(values: dict[str, Any]) -> dict[str, Any]:
    return {"flags": {key: values.get(key) for key in SLURM_FLAGS}}
