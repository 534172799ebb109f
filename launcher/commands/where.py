"""The flags that say where to run, the same for every command that runs on nodes (run,
bench, topo, check), turned here into launcher.backends.Where: below the commands, no
argparse Namespace travels.

    -i INVENTORY     hosts of an Ansible inventory over SSH       (backends/ssh/)
    --cluster NAME   the inventory `launch provision` wrote for NAME
    --slurm          a Slurm allocation (sbatch/srun)              (backends/slurm/)
    --local, or none of these: this machine                       (backends/local/)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.backends import SshOptions, Where
from launcher.backends.slurm.flags import SLURM_FLAGS
from launcher.core.errors import LauncherError


def add_ssh_arguments(parser) -> None:
    """The host-key flags of every command that reaches nodes over SSH."""
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="SSH: record unknown host keys in known_hosts, like OpenSSH's "
                             "accept-new (a changed key is always refused)")
    parser.add_argument("--known-hosts",
                        help="SSH: known_hosts file (default: the inventory's "
                             "UserKnownHostsFile, else ~/.ssh/known_hosts)")


def add_where_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say where to run, the same for every command."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true",
                       help="this machine (also the default when no inventory is given)")
    where.add_argument("-i", "--inventory", metavar="INVENTORY",
                       help="an Ansible inventory (YAML or INI): its hosts over SSH")
    where.add_argument("--cluster", metavar="NAME",
                       help="the cluster `launch provision --cluster NAME` made (its inventory)")
    where.add_argument("--slurm", action="store_true",
                       help="one Slurm batch job from this login node (sbatch/srun; SLURM_CONF "
                            "names the cluster); the run folder must be on a filesystem the "
                            "compute nodes share")
    parser.add_argument("--limit", metavar="PATTERN",
                        help="with -i/--cluster: only these hosts (an Ansible host pattern, "
                             "e.g. gpu-0* or node1,node2)")
    add_ssh_arguments(parser)

    slurm = parser.add_argument_group("Slurm (with --slurm; they win over the recipe's slurm "
                                      "block)")
    slurm.add_argument("--partition", help="Slurm: partition(s) to run in (default: the "
                                           "cluster's default partition)")
    slurm.add_argument("--account", help="Slurm: account to charge")
    slurm.add_argument("--time", metavar="HH:MM:SS", help="Slurm: the job's time limit")
    slurm.add_argument("--sbatch-arg", dest="sbatch_args", action="append", metavar="ARG",
                       help="Slurm: one more sbatch option, e.g. --sbatch-arg=--qos=high "
                            "(repeatable)")
    slurm.add_argument("--python", metavar="PATH",
                       help="Slurm: the interpreter with torch on the compute nodes (default "
                            "python3 on the PATH the job inherits)")
    slurm.add_argument("--gpus-per-node", type=int, metavar="G",
                       help="Slurm: GPUs to ask for per node (default: the partition's GRES)")


def ssh_options_from_args(args: argparse.Namespace) -> SshOptions:
    """The SSH flags of `add_ssh_arguments`."""
    known = args.known_hosts
    if known and Path(known).expanduser().is_dir():
        raise LauncherError(f"--known-hosts {known} is a folder: give the known_hosts file "
                            "(e.g. ~/.ssh/known_hosts)")
    return SshOptions(known_hosts=known, accept_new_host_keys=args.accept_new_host_keys)


def where_from_args(args: argparse.Namespace) -> Where:
    """What `add_where_arguments` read, as the backends take it."""
    return Where(local=args.local, inventory=args.inventory, cluster=args.cluster,
                 slurm=args.slurm, limit=args.limit, ssh=ssh_options_from_args(args),
                 slurm_flags={key: getattr(args, key) for key in SLURM_FLAGS})
