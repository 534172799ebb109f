"""`launch catalog`: instance facts, built in, refreshed from EC2 when credentials exist; any type
EC2 describes can be listed by name."""

from __future__ import annotations

import argparse
import json

from launcher.cluster import catalog
from launcher.cluster.catalog import InstanceFacts
from launcher.commands.common import aws_command
from launcher.core.table import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "catalog", help="GPU instance types: GPUs, interconnect, EFA, price",
        description="Facts per instance type. EC2's own columns come from DescribeInstanceTypes "
                    "when AWS credentials and a region are configured (then any type EC2 "
                    "knows can be named); interconnect, GPU link peak and the list price come "
                    "from launch's table, each price labelled with its source and date.")
    parser.add_argument("types", nargs="*", metavar="TYPE",
                        help="only these types (default: the built-in table)")
    parser.add_argument("--region", help="region to ask EC2 in (default: your AWS configuration)")
    parser.add_argument("--offline", action="store_true",
                        help="do not ask EC2, show the built-in table only")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def live(types: list[str], region: str | None) -> tuple[dict[str, InstanceFacts], str]:
    """Built-in facts enriched from EC2 where possible, and a note on where they came from."""
    from launcher.provision import aws

    sess = aws.session(region)
    if not aws.has_credentials(sess) or not sess.region_name:
        return ({t: catalog.lookup(t) for t in types},
                "built-in table (no AWS credentials or region: EC2 was not asked)")
    try:
        answer = aws.client(sess, "ec2", quick=True).describe_instance_types(InstanceTypes=types)
    except aws.LOOKUP_ERRORS as err:
        if any(catalog.builtin(t) is None for t in types):
            raise aws.AwsError(aws.explain(err, "DescribeInstanceTypes", ", ".join(types))) \
                from None
        return ({t: catalog.lookup(t) for t in types},
                f"built-in table (DescribeInstanceTypes failed: {aws.error_message(err)})")
    described = {d["InstanceType"]: d for d in answer.get("InstanceTypes", [])}
    facts: dict[str, InstanceFacts] = {}
    for name in types:
        known, seen = catalog.builtin(name), described.get(name)
        if seen is None:
            if known is None:
                raise aws.AwsError(f"EC2 does not describe instance type {name} in "
                                   f"{sess.region_name}; check the name")
            facts[name] = known
        else:
            facts[name] = (catalog.enrich(known, seen, sess.region_name) if known
                           else catalog.from_ec2(seen, sess.region_name))
    return facts, f"built-in table, EC2 columns from DescribeInstanceTypes in {sess.region_name}"


def _price(f: InstanceFacts) -> str:
    return f"{f.price.usd_per_hour:.2f}" if f.price else "-"


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
        f.instance_type, f.gpu_summary, f.interconnect,
        f"{f.gpu_link} {f.gpu_link_gbps:g}" if f.gpu_link_gbps is not None else f.gpu_link,
        str(f.efa_max_interfaces) if f.efa_supported else "no", str(f.network_cards),
        f.network_performance, _price(f),
    ) for f in facts.values()]
    print(format_table(("TYPE", "GPUS", "INTERCONNECT", "GPU LINK GB/s", "EFA", "CARDS",
                        "NETWORK", "$/HOUR"), rows), end="")
    labels: dict[str, list[str]] = {}
    for f in facts.values():
        labels.setdefault(f.price.label() if f.price else "no on-demand list price known",
                          []).append(f.instance_type)
    print("GPU link: peak per GPU, one direction. $/hour, Linux:")
    for label, names in labels.items():
        print(f"  {label}: {', '.join(names)}")
    print(f"Source: {source}.")
    return 0
