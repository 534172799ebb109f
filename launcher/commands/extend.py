"""`launch extend --cluster NAME --ttl 8h`: move a cluster's expiry on its nodes and tags."""

from __future__ import annotations

import argparse

from launcher.commands.where import add_ssh_arguments, ssh_options_from_args
from launcher.commands.common import aws_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "extend", help="move a cluster's expiry (the nodes' power-off timer and the tags)",
        description="Set the cluster's expiry to DURATION from now: every node's timer (over "
                    "SSH, through the head or --jump like `launch run`), then the "
                    "launch:expires-at tags and the ledger. The tags move only when every "
                    "node's timer did.")
    p.add_argument("--cluster", required=True, metavar="NAME", help="cluster to extend")
    p.add_argument("--ttl", required=True, metavar="DURATION",
                   help="new lifetime from now: 8h, 90m, 2d or hours")
    p.add_argument("--region", help="AWS region (default: the ledger's)")
    p.add_argument("-i", "--inventory", metavar="FILE",
                   help="inventory of the nodes (default: the one provision wrote)")
    add_ssh_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the command each node would run and what would be tagged; "
                        "contact nothing, change nothing")
    p.set_defaults(func=run)


@aws_command
def run(args: argparse.Namespace) -> int:
    from launcher.provision.extend import extend
    from launcher.provision.plan import parse_duration

    return extend(args.cluster, parse_duration(args.ttl), region=args.region,
                  options=ssh_options_from_args(args), inventory=args.inventory,
                  dry_run=args.dry_run)
