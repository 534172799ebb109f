"""`launch provision`: create (or complete) a GPU cluster on EC2 and write its inventory."""

from __future__ import annotations

import argparse
import getpass
import re

from launcher.commands.common import aws_command
from launcher.provision.plan import ProvisionSpec


def default_cluster() -> str:
    user = re.sub(r"[^a-z0-9-]", "-", getpass.getuser().lower()).strip("-") or "user"
    return f"{user[:30]}-cluster" if user[0].isalpha() else f"c-{user[:28]}-cluster"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "provision", help="create a GPU cluster on AWS EC2 and write its inventory",
        description="Create (or complete: re-running creates only what is missing) a cluster of "
                    "EC2 GPU instances with EFA, a cluster placement group and a security group "
                    "of its own, then wait for it, write the inventory and run `launch setup`. "
                    "AWS credentials and region come from the usual AWS configuration.")
    p.add_argument("--instance", required=True, metavar="TYPE",
                   help="instance type, e.g. p4d.24xlarge (see `launch catalog`)")
    p.add_argument("--count", type=int, default=1, help="number of instances (default 1)")
    p.add_argument("--cluster", default=default_cluster(), metavar="NAME",
                   help="cluster name, used in tags and resource names (default: %(default)s)")
    p.add_argument("--region", help="AWS region (default: AWS_REGION / your profile)")
    p.add_argument("--az", metavar="ZONE",
                   help="availability zone (default: the first that offers the type)")
    p.add_argument("--subnet", metavar="ID",
                   help="subnet to use (default: the default VPC's subnet in the zone)")
    p.add_argument("--key-name", metavar="K", help="EC2 key pair the instances accept")
    p.add_argument("--key-file", metavar="PATH",
                   help="its private key, for the inventory (default: ~/.ssh/K.pem or ~/.ssh/K)")
    p.add_argument("--ssh-user", default="ubuntu", help="login user of the image (default ubuntu)")
    p.add_argument("--ssh-cidr", metavar="CIDR",
                   help="where SSH may come from (default: this machine's public address; "
                        "refused when it cannot be found)")
    p.add_argument("--ami", metavar="ID",
                   help="image id (default: the current Ubuntu from AWS's public SSM parameter)")
    p.add_argument("--ubuntu", default="22.04", choices=["22.04", "24.04"],
                   help="Ubuntu release when --ami is not given (default 22.04)")
    p.add_argument("--placement-group", action=argparse.BooleanOptionalAction, default=None,
                   help="cluster placement group (default: on when --count > 1)")
    p.add_argument("--capacity-reservation", metavar="ID",
                   help="launch into this capacity reservation (its zone is used)")
    p.add_argument("--spot", action="store_true", help="spot instances (can be reclaimed)")
    p.add_argument("--ttl", type=float, default=24.0, metavar="HOURS",
                   help="expiry written to the tags and flagged by `launch status` "
                        "(default 24; 0: none). Nothing is terminated automatically")
    p.add_argument("--disk-gb", type=int, default=200,
                   help="root volume size in GB (default 200: driver, CUDA, torch, data)")
    p.add_argument("--inventory", metavar="PATH",
                   help="where to write the inventory (default: "
                        "$LAUNCH_HOME/clusters/NAME/inventory.yml)")
    p.add_argument("--skip-setup", action="store_true", help="do not run `launch setup` after")
    p.add_argument("--no-wait-ssh", dest="wait_ssh", action="store_false",
                   help="do not wait for SSH nor record host keys (for addresses this machine "
                        "cannot reach, e.g. a private subnet without VPN)")
    p.add_argument("--keep-on-failure", action="store_true",
                   help="keep what was created when provisioning fails (default: delete it)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan; with credentials also send every creating call with "
                        "DryRun=True. Creates nothing")
    p.add_argument("--json", action="store_true", help="print the plan or summary as JSON")
    p.set_defaults(func=run)


@aws_command
def run(args: argparse.Namespace) -> int:
    from launcher.provision.create import provision

    spec = ProvisionSpec(
        cluster=args.cluster, instance_type=args.instance, count=args.count, region=args.region,
        key_name=args.key_name, key_file=args.key_file, ssh_user=args.ssh_user,
        ssh_cidr=args.ssh_cidr, ami=args.ami, ubuntu=args.ubuntu, az=args.az,
        subnet=args.subnet, placement_group=args.placement_group,
        capacity_reservation=args.capacity_reservation, spot=args.spot, ttl_hours=args.ttl,
        disk_gb=args.disk_gb, inventory=args.inventory, skip_setup=args.skip_setup,
        wait_ssh=args.wait_ssh, keep_on_failure=args.keep_on_failure,
    )
    return provision(spec, dry_run=args.dry_run, as_json=args.json)
