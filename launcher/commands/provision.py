"""`launch provision`: create (or complete) a GPU cluster on EC2 and write its inventory."""

from __future__ import annotations

import argparse
import getpass
import re

from launcher.commands.common import aws_command
from launcher.provision.plan import ProvisionSpec, parse_duration


def default_cluster() -> str:
    user = re.sub(r"[^a-z0-9-]", "-", getpass.getuser().lower()).strip("-") or "user"
    return f"{user[:30]}-cluster" if user[0].isalpha() else f"c-{user[:28]}-cluster"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "provision", help="create a GPU cluster on AWS EC2 and write its inventory",
        description="Create (or complete: re-running creates only what is missing) a cluster of "
                    "EC2 GPU instances with EFA, a cluster placement group and a security group "
                    "of its own, then wait for it, write the inventory and run `launch setup`. "
                    "Every zone that offers the type is tried before giving up; quotas are "
                    "checked before anything is created. AWS credentials and region come from "
                    "the usual AWS configuration.")
    p.add_argument("--instance", required=True, metavar="TYPE",
                   help="instance type, e.g. p4d.24xlarge: any type EC2 describes "
                        "(`launch catalog` lists launch's own table)")
    p.add_argument("--count", type=int, default=1, help="number of instances (default 1)")
    p.add_argument("--cluster", default=default_cluster(), metavar="NAME",
                   help="cluster name, used in tags and resource names (default: %(default)s)")
    p.add_argument("--region", metavar="REGION[,REGION...]",
                   help="AWS region (default: AWS_REGION / your profile); several, comma "
                        "separated, are tried in order when one has no room or no quota")
    p.add_argument("--az", metavar="ZONE",
                   help="only this availability zone (default: every zone that offers the type, "
                        "in turn, until one has room)")
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
                   help="image id (default: --image from AWS's public SSM parameters)")
    p.add_argument("--image", default="ubuntu", choices=["ubuntu", "dlami"],
                   help="ubuntu: Canonical's current Ubuntu (setup installs everything); dlami: "
                        "AWS Deep Learning Base OSS Nvidia Driver GPU AMI (driver, EFA, NCCL "
                        "come with it; setup verifies and adds the Python env)")
    p.add_argument("--ubuntu", default="22.04", choices=["22.04", "24.04"],
                   help="Ubuntu release of --image (default 22.04)")
    p.add_argument("--placement-group", action=argparse.BooleanOptionalAction, default=None,
                   help="cluster placement group (default: on when --count > 1)")
    p.add_argument("--capacity-reservation", metavar="ID",
                   help="launch into this capacity reservation or Capacity Block for ML (its "
                        "zone, and its placement group if it was made in one)")
    p.add_argument("--market", choices=["on-demand", "spot", "capacity-block"],
                   help="how the instances are bought (default on-demand; capacity-block with "
                        "--capacity-reservation of a Capacity Block). Spot nodes can be "
                        "reclaimed with two minutes' notice: `launch run` watches for it "
                        "(docs/recovery.md)")
    p.add_argument("--spot", dest="market", action="store_const", const="spot",
                   help="the same as --market spot")
    p.add_argument("--public-ip", default="head", choices=["head", "all", "none"],
                   help="head (default): only the head node gets a public address, the others "
                        "are reached through it; all: every node; none: private addresses only "
                        "(VPN, or --jump)")
    p.add_argument("--jump", metavar="[USER@]HOST[:PORT]",
                   help="reach every node through this SSH host (a bastion; its key must be in "
                        "~/.ssh/known_hosts)")
    p.add_argument("--ttl", default="24", metavar="DURATION",
                   help="lifetime: 8h, 90m, 2d or hours (default 24; 0: none). The nodes power "
                        "off and terminate themselves at the expiry, even if launch never runs "
                        "again; `launch extend` moves it")
    p.add_argument("--disk-gb", type=int, default=200,
                   help="root volume size in GB (default 200: driver, CUDA, torch, data)")
    p.add_argument("--encrypt-root", action=argparse.BooleanOptionalAction, default=True,
                   help="encrypt the root volume with the account's default EBS key (default on)")
    p.add_argument("--instance-profile", metavar="NAME",
                   help="IAM instance profile for the nodes (e.g. S3 access for checkpoints)")
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

    regions = [r.strip() for r in (args.region or "").split(",") if r.strip()]
    spec = ProvisionSpec(
        cluster=args.cluster, instance_type=args.instance, count=args.count,
        region=regions[0] if regions else None, fallback_regions=tuple(regions[1:]),
        key_name=args.key_name, key_file=args.key_file, ssh_user=args.ssh_user,
        ssh_cidr=args.ssh_cidr, ami=args.ami, image=args.image, ubuntu=args.ubuntu, az=args.az,
        subnet=args.subnet, placement_group=args.placement_group,
        capacity_reservation=args.capacity_reservation, market=args.market,
        public_ip=args.public_ip, jump=args.jump, ttl_hours=parse_duration(args.ttl),
        disk_gb=args.disk_gb, encrypt_root=args.encrypt_root,
        instance_profile=args.instance_profile, inventory=args.inventory,
        skip_setup=args.skip_setup, wait_ssh=args.wait_ssh,
        keep_on_failure=args.keep_on_failure,
    )
    return provision(spec, dry_run=args.dry_run, as_json=args.json)
