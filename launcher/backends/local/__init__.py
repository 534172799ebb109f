"""The local backend: every node a process group on this machine."""
