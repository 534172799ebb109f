"""A user's code folder shipped to the nodes: the scan (.gitignore, .launchignore, links, secrets), the copy on a node, the transfer."""
