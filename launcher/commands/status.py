"""`launch status`: clusters in the ledger and in AWS, uptime, cost so far, expiry."""

from __future__ import annotations

import argparse

from launcher.commands.common import aws_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status", help="clusters launch made: nodes, uptime, cost so far, time left",
        description="Lists clusters from the ledger ($LAUNCH_HOME) and, with AWS credentials, "
                    "instances tagged by launch in the region (also ones no ledger here knows).")
    p.add_argument("--region", help="AWS region to ask (default: your AWS configuration)")
    p.add_argument("--all", action="store_true", help="include torn-down clusters")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


@aws_command
def run(args: argparse.Namespace) -> int:
    from launcher.provision.status import status

    return status(args.region, as_json=args.json, show_all=args.all)
