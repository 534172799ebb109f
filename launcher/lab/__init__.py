"""Network-namespace hosts with real sshd (and a real Slurm on them) that stand in for a cluster in tests and demos."""
