"""The Slurm lab fixture of tests/slurm, for the user's own jobs on Slurm."""

from tests.slurm.conftest import slurm_lab  # noqa: F401 (a fixture: pytest finds it here)
