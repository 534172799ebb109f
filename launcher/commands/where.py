"""The flags that say where to run, the same for every command that runs on nodes (run, bench,
topo, check, attach, logs, stop, fetch), made from the backends' own declarations
(launcher/backends/__init__.py TABLE, each backend's options.py) and turned here into a
launcher.backends.Where: below the commands, no argparse Namespace travels.
"""

from __future__ import annotations

import argparse

from launcher.backends import TABLE, Where, where_from_values
from launcher.backends.flags import Flag
from launcher.backends.ssh.options import HOST_KEYS, ssh_settings
from launcher.cluster.ssh_options import SshOptions


def _add(parser, flag: Flag) -> None:
    parser.add_argument(*flag.names, dest=flag.dest, help=flag.help, **flag.kwargs)


def add_ssh_arguments(parser) -> None:
    """The host-key flags of a command that reaches hosts over SSH without a backend
    (`launch extend`)."""
    for flag in HOST_KEYS:
        _add(parser, flag)


def add_where_arguments(parser: argparse.ArgumentParser) -> None:
    """Every backend's selecting flags (one of them at most) and its own flags."""
    select = parser.add_mutually_exclusive_group()
    for entry in reversed(TABLE):           # --local first in --help, as people read it
        for flag in entry.SELECT:
            _add(select, flag)
    for entry in reversed(TABLE):
        group = parser.add_argument_group(entry.GROUP) if hasattr(entry, "GROUP") else parser
        for flag in entry.FLAGS:
            _add(group, flag)


def where_from_args(args: argparse.Namespace) -> Where:
    """What `add_where_arguments` read, as the backends take it."""
    dests = {flag.dest for entry in TABLE for flag in (*entry.SELECT, *entry.FLAGS)}
    return where_from_values({dest: getattr(args, dest, None) for dest in dests})


def ssh_options_from_args(args: argparse.Namespace) -> SshOptions:
    """The SSH flags of `add_ssh_arguments`."""
    return SshOptions(**ssh_settings(vars(args)))
