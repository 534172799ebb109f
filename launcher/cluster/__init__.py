"""The machines: inventories (YAML, INI, Ansible's), the instance catalog, SSH connections to nodes."""
