"""The SSH backend: preflight over one connection per host, the node agent, setup and machine replacement."""
