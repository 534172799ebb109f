"""launch: a cluster job launcher with provisioning recipes for multi-node PyTorch training."""

__version__ = "0.1.0"
