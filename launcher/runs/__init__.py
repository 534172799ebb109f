"""A run's folder on this machine: its layout and schema, resume, node logs, progress, runs whose launch died."""
