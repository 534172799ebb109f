"""Arguments several commands share. Kept free of heavy imports: the CLI loads every
command module at start-up."""

from __future__ import annotations


def add_ssh_arguments(parser) -> None:
    """The host-key flags every command that reaches nodes over SSH takes."""
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="with -i: record unknown SSH host keys in known_hosts, like "
                        "OpenSSH's accept-new (a changed key is always refused)")
    parser.add_argument("--known-hosts",
                        help="with -i: known_hosts file (default: the inventory's "
                        "UserKnownHostsFile, else ~/.ssh/known_hosts)")
