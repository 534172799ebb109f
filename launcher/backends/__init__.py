"""Where to run, decided once for every command that runs on nodes (run, bench, topo, check).

    -i INVENTORY     hosts of an Ansible inventory over SSH       (backends/ssh.py)
    --cluster NAME   the inventory `launch provision` wrote for NAME
    --slurm          a Slurm allocation (sbatch/srun)              (backends/slurm.py)
    --local, or none of these: this machine                       (backends/local.py)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from launcher.backends.base import Backend, GroupResult, LaunchOptions, NodeResult, print_plan
from launcher.errors import LauncherError

__all__ = ["Backend", "GroupResult", "LaunchOptions", "NodeResult", "add_ssh_arguments",
           "add_where_arguments", "backend_from_args", "print_plan", "ssh_options"]


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


# The Slurm flags by the recipe key (slurm.*) each one overrides.
SLURM_FLAGS = {"partition": "--partition", "account": "--account", "time": "--time",
               "sbatch_args": "--sbatch-arg", "python": "--python",
               "gpus_per_node": "--gpus-per-node"}


def ssh_options(args):
    """The SSH flags of `add_ssh_arguments` as launcher.ssh.SshOptions."""
    from launcher.ssh import SshOptions

    return SshOptions.from_args(args)


def _inventory_path(args) -> str | None:
    if getattr(args, "cluster", None):
        from launcher.home import inventory_for

        return str(inventory_for(args.cluster))
    return getattr(args, "inventory", None)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def backend_from_args(args, local_count: int, say: Callable[[str], None] = _stderr) -> Backend:
    """The backend the flags name. Without -i/--cluster/--slurm the run stays on this machine,
    and `say` tells so in one line (on stderr, so that --json output stays clean) unless
    --local asked for it; `local_count` is the number of nodes that line announces."""
    slurm_flags = {key: getattr(args, key, None) for key in SLURM_FLAGS}
    if getattr(args, "slurm", False):
        from launcher.backends.slurm import SlurmBackend

        if getattr(args, "limit", None):
            raise LauncherError("--limit selects hosts of an inventory; with --slurm, Slurm "
                                "picks the nodes (narrow them with --partition or "
                                "--sbatch-arg=--nodelist=...)")
        return SlurmBackend(slurm_flags)
    given = [SLURM_FLAGS[key] for key, value in slurm_flags.items() if value not in (None, [])]
    if given:
        raise LauncherError(f"{', '.join(given)}: Slurm options go with --slurm")
    inventory = _inventory_path(args)
    if inventory:
        from launcher.backends.ssh import SshBackend

        return SshBackend(inventory, ssh_options(args), limit=args.limit)
    if getattr(args, "limit", None):
        raise LauncherError("--limit selects hosts of an inventory: give it with -i or --cluster")
    from launcher.backends.local import LocalBackend

    backend = LocalBackend()
    if not getattr(args, "local", False):
        say(f"launch: no inventory given: {local_count} node{'s' if local_count != 1 else ''} "
            "on this machine (-i INVENTORY or --cluster NAME runs on hosts over SSH, --slurm "
            "on a Slurm cluster)")
    return backend
