"""`launch catalog`: GPU instance facts, built in, refreshed from EC2 when credentials exist."""

from __future__ import annotations

import argparse
import json

from launcher import catalog
from launcher.catalog import PRICE_AS_OF, PRICE_REGION, InstanceFacts
from launcher.commands.common import aws_command
from launcher.table import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "catalog", help="GPU instance types launch knows: GPUs, interconnect, EFA, price",
        description="Facts per instance type. EC2's own columns are refreshed from "
                    "DescribeInstanceTypes when AWS credentials and a region are configured; "
                    "interconnect, GPU link peak and price come from launch's table.")
    parser.add_argument("types", nargs="*", metavar="TYPE", help="only these types (default: all)")
    parser.add_argument("--region", help="region to ask EC2 in (default: your AWS configuration)")
    parser.add_argument("--offline", action="store_true",
                        help="do not ask EC2, show the built-in table only")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def live(types: list[str], region: str | None) -> tuple[dict[str, InstanceFacts], str]:
    """Built-in facts enriched from EC2 where possible, and a note on where they came from."""
    from botocore.exceptions import BotoCoreError, ClientError

    from launcher.provision import aws

    facts = {t: catalog.lookup(t) for t in types}
    sess = aws.session(region)
    if not aws.has_credentials(sess) or not sess.region_name:
        return facts, "built-in table (no AWS credentials or region: EC2 was not asked)"
    try:
        answer = aws.client(sess, "ec2", quick=True).describe_instance_types(InstanceTypes=types)
    except (ClientError, BotoCoreError) as err:
        return facts, f"built-in table (DescribeInstanceTypes failed: {aws.error_message(err)})"
    for described in answer.get("InstanceTypes", []):
        name = described["InstanceType"]
        facts[name] = catalog.enrich(facts[name], described, sess.region_name)
    return facts, f"built-in table, EC2 columns from DescribeInstanceTypes in {sess.region_name}"


@aws_command
def run(args: argparse.Namespace) -> int:
    types = args.types or catalog.known_types()
    if args.offline:
        facts = {t: catalog.lookup(t) for t in types}
        source = "built-in table (--offline)"
    else:
        facts, source = live(types, args.region)
    if args.json:
        print(json.dumps({"source": source, "types": [f.to_json() for f in facts.values()]},
                         indent=2))
        return 0
    rows = [(
        f.instance_type, f.gpu_summary, f.interconnect, f"{f.gpu_link} {f.gpu_link_gbps:g}",
        str(f.efa_max_interfaces) if f.efa_supported else "no", str(f.network_cards),
        f.network_performance, f"{f.price_per_hour:.2f}",
    ) for f in facts.values()]
    print(format_table(("TYPE", "GPUS", "INTERCONNECT", "GPU LINK GB/s", "EFA", "CARDS",
                        "NETWORK", "$/HOUR"), rows), end="")
    print(f"GPU link: peak per GPU, one direction. $/hour: on-demand Linux list price in "
          f"{PRICE_REGION} as of {PRICE_AS_OF}.\nSource: {source}.")
    return 0
