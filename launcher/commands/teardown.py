"""`launch teardown`: delete every AWS resource of a cluster; safe to repeat."""

from __future__ import annotations

import argparse

from launcher.commands.common import aws_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "teardown", help="terminate a cluster's instances and delete its groups and addresses",
        description="Find the cluster's resources by tag and in the ledger, terminate the "
                    "instances, wait, then release Elastic IPs and delete the placement group "
                    "and security group. Running it again is harmless.")
    p.add_argument("--cluster", required=True, metavar="NAME", help="cluster to tear down")
    p.add_argument("--region", help="AWS region (default: the ledger's, then your AWS profile)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    p.set_defaults(func=run)


@aws_command
def run(args: argparse.Namespace) -> int:
    from launcher.provision.teardown import teardown

    return teardown(args.cluster, args.region, dry_run=args.dry_run)
