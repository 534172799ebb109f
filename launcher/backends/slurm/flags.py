"""The command-line flags that set a run's Slurm settings, by the recipe key (slurm.*) each one
overrides: launcher/commands/where.py reads them, the Slurm backend names them in messages."""

SLURM_FLAGS = {"partition": "--partition", "account": "--account", "time": "--time",
               "sbatch_args": "--sbatch-arg", "python": "--python",
               "gpus_per_node": "--gpus-per-node"}
