"""`launch setup (-i INVENTORY | --cluster NAME) [--check | --verify] [--tags ...] [--limit HOST]
[-e VARS] [--dry-run]`: prepare nodes with Ansible (playbooks/site.yml, run by launcher.setup.apply),
or check them (launcher.setup.verify)."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.core.errors import LauncherError
from launcher.core.yamlfile import YamlFileError, load_yaml_file

HELP = """\
Applies playbooks/site.yml to every host of an Ansible YAML inventory through ansible-runner:
NVIDIA's CUDA repository keyring, the pinned driver branch with fabric manager on NVSwitch
systems (GPU nodes, held, rebooted into and checked), libnccl2/libnccl-dev at the pinned
version (held), the AWS EFA software (nodes with EFA devices), a Python virtual environment with
pinned torch (/opt/launch/venv, the inventory's launch_python), SSH between the nodes for
mpirun, nccl-tests built with MPI (nodes with CUDA), one facts JSON per node fetched to this
machine, and the node checks.

--verify runs only the read-only checks (driver, GPUs, kernel module, fabric manager,
persistence, EFA, NCCL, torch) and prints one table of hosts and checks; exit 1 when a check
fails. It changes nothing, so it suits nodes someone else set up.

Each host/task result is printed as it arrives, then a summary per host and every failure
with its task and message. The full log stays in $LAUNCH_HOME/setup/<timestamp>-*/.
A second run on unchanged nodes changes nothing.

Exit code: 0 when every host succeeded; Ansible's code otherwise (2: a host failed,
4: a host was unreachable, 1: Ansible could not run, e.g. --limit matches no host).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from launcher.setup.apply import ROLE_TAGS

    parser = subparsers.add_parser(
        "setup", help="install drivers, NCCL, EFA, torch and nccl-tests on the inventory's nodes",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-i", "--inventory", type=Path, metavar="INVENTORY",
                        help="Ansible YAML inventory (the one `launch run -i` reads)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="Ansible's check mode: report what would change, change nothing")
    mode.add_argument("--verify", action="store_true",
                      help="only the read-only node checks, printed as a table of hosts and "
                           "checks (exit 1 when one fails)")
    mode.add_argument("--syntax-check", action="store_true",
                      help="only check that the bundled playbooks and the inventory parse "
                           "(ansible-playbook --syntax-check); reaches no host")
    parser.add_argument("--tags", nargs="+", metavar="TAG", default=[],
                        help=f"only these roles (space or comma separated): {', '.join(ROLE_TAGS)}")
    parser.add_argument("--limit", metavar="HOST",
                        help="only these hosts (an Ansible host pattern, e.g. node0 or node0,node1)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="KEY=VALUE, or @FILE (a YAML/JSON mapping): role variables that "
                             "override the inventory's, as Ansible's -e; repeatable")
    parser.add_argument("--cluster", metavar="NAME",
                        help="the cluster `launch provision --cluster NAME` made: its inventory "
                             "(without -i) and its facts folder, which receives the node facts "
                             "(default: the inventory's launch_cluster, else next to the "
                             "inventory)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the ansible-playbook command, its hosts and variables; "
                             "contact no host, change nothing")
    parser.set_defaults(func=run)


def parse_extra_vars(values: list[str]) -> dict:
    """-e values, later ones winning: KEY=VALUE (a string) or @FILE (a mapping)."""
    merged: dict = {}
    for value in values:
        if value.startswith("@"):
            path = value[1:]
            try:
                data = load_yaml_file(path, "variables file")
            except YamlFileError as err:
                raise LauncherError(f"-e {value}: {err}") from None
            if not isinstance(data, dict):
                raise LauncherError(f"-e {value}: {path} must hold a mapping of variables")
            merged.update(data)
        elif "=" in value and value.split("=", 1)[0].isidentifier():
            key, _, text = value.partition("=")
            merged[key] = text
        else:
            raise LauncherError(f"-e {value!r}: expected KEY=VALUE or @FILE")
    return merged


def inventory_of(args: argparse.Namespace) -> Path:
    """-i, else the inventory of --cluster (the same choice `launch run` makes)."""
    if args.inventory is not None:
        return args.inventory
    if args.cluster:
        from launcher.core.home import inventory_for

        return inventory_for(args.cluster)
    raise LauncherError("launch setup needs the nodes: -i INVENTORY, or --cluster NAME for a "
                        "cluster `launch provision` made")


def run(args: argparse.Namespace) -> int:
    from launcher.setup.apply import plan_setup, run_setup, syntax_check

    inventory = inventory_of(args)
    if args.syntax_check:
        # -e takes part: a variable can decide what a playbook includes.
        return syntax_check(inventory, extra_vars=parse_extra_vars(args.extra_vars))
    if args.verify and args.tags:
        raise LauncherError("--verify runs the node checks only: drop --tags")
    extra_vars = parse_extra_vars(args.extra_vars)
    if args.dry_run:
        from launcher.setup.verify import verify_arguments

        how = (verify_arguments(extra_vars) if args.verify else
               {"check": args.check, "tags": args.tags, "extra_vars": extra_vars})
        print("\n".join(plan_setup(inventory, limit=args.limit, cluster=args.cluster,
                                   **how).describe()))
        return 0
    if args.verify:
        from launcher.setup.verify import run_verify

        return run_verify(inventory, limit=args.limit, cluster=args.cluster,
                          extra_vars=extra_vars)
    return run_setup(inventory, check=args.check, tags=args.tags, limit=args.limit,
                     cluster=args.cluster, extra_vars=extra_vars)
