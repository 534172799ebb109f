"""The Slurm backend: the batch script, the job's in-allocation loop, sbatch/squeue/scancel."""
