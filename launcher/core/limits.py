"""The largest cluster launch runs, shared by the recipe, the inventory reader and the run
folder's schema so that the three refuse at the same size."""

MAX_NODES = 4096
MAX_PROCS_PER_NODE = 64
