"""`launch lab up|down`: rehearse a cluster on one Linux box (root): SSH hosts in network
namespaces, with an inventory `launch run -i` and `launch setup` can use; or, with --slurm, a
Slurm cluster (slurmctld, one slurmd per host) that `launch run --slurm` submits to."""

from __future__ import annotations

from pathlib import Path

from launcher.lab.hosts import Lab


def register(sub) -> None:
    p = sub.add_parser("lab", help="a lab cluster of SSH or Slurm hosts in network namespaces "
                                   "(root)",
                       description=__doc__)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="create N hosts, each with its own address and sshd")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--dir", required=True, help="folder for keys, inventory, host state")
    up.add_argument("--cap", help="limit every host's link, e.g. 200mbit (tc tbf)")
    up.add_argument("--private-workers", action="store_true",
                    help="only host0 is reachable from this machine; the other hosts are on a "
                         "private network behind it and the inventory reaches them through it "
                         "(what `launch provision --public-ip head` makes)")
    up.add_argument("--slurm", action="store_true",
                    help="a Slurm cluster instead: munged, slurmctld and one slurmd per host "
                         "(Debian's slurm-wlm and munge)")
    up.add_argument("--dry-run", action="store_true",
                    help="say what would be made; make nothing")
    up.set_defaults(func=lab_up)
    down = actions.add_parser("down", help="stop the hosts and remove everything the lab made")
    down.add_argument("--dir", required=True)
    down.add_argument("--dry-run", action="store_true",
                      help="list what would be stopped and removed; remove nothing")
    down.set_defaults(func=lab_down)


def lab_up(args) -> int:
    if args.dry_run:
        kind = ("a Slurm cluster: munged and slurmctld here, one slurmd per host" if args.slurm
                else "an sshd each, a key pair and known_hosts")
        cap = f"; every link capped at {args.cap} each way (tc tbf)" if args.cap else ""
        behind = ("; host1.. on a private network reached through host0"
                  if args.private_workers else "")
        print(f"launch lab up: would make {args.hosts} host(s) "
              f"{', '.join(f'host{i}' for i in range(args.hosts))} as network namespaces on a "
              f"new bridge (a free 10.200-249.x.0/24 subnet), {kind}{cap}{behind}; files in "
              f"{Path(args.dir).resolve()}; nothing made (--dry-run)")
        return 0
    if args.slurm:
        return slurm_lab_up(args)
    lab = Lab.create(args.dir, args.hosts, cap=args.cap, private_workers=args.private_workers)
    for host in lab.hosts:
        behind = (f", ranks on {host.rank_address}" if host.rank_address != host.address
                  else "")
        via = " (through host0)" if args.private_workers and host is not lab.hosts[0] else ""
        print(f"{host.name}: {host.address}{via} (netns {host.netns}{behind})")
    print(f"inventory: {lab.inventory}")
    print(f"try:       launch run vit-tiny-local -i {lab.inventory} "
          f"--nodes {len(lab.hosts)}")
    print(f"remove:    launch lab down --dir {lab.dir}")
    return 0


def slurm_lab_up(args) -> int:
    import sys

    from launcher.core.errors import LauncherError
    from launcher.lab.slurm import SlurmLab

    if args.cap:
        raise LauncherError("--cap shapes the SSH lab's links; the Slurm lab has no --cap yet")
    lab = SlurmLab.create(args.dir, args.hosts)
    print("\n".join(lab.describe()))
    print(f"use it:    {lab.export_line()}")
    print(f"try:       launch run vit-tiny-local --slurm --nodes {len(lab.hosts)} "
          f"--python {sys.executable}")
    print(f"remove:    launch lab down --dir {lab.dir}")
    return 0


def lab_down(args) -> int:
    from launcher.lab.slurm import SlurmLab

    if args.dry_run:
        slurm = SlurmLab.is_lab(args.dir)
        lab = SlurmLab.load(args.dir) if slurm else Lab.load(args.dir)
        print(f"launch lab down: would stop and remove the {'Slurm ' if slurm else ''}lab in "
              f"{args.dir}:")
        for host in lab.hosts:
            running = lab.pids(host.name)
            print(f"  {host.name}: network namespace {host.netns}, {len(running)} process(es) "
                  f"in it" + (f" ({', '.join(map(str, running))})" if running else ""))
        print(f"  bridge {lab.bridge}, and the folder {args.dir}; nothing removed (--dry-run)")
        return 0
    if SlurmLab.is_lab(args.dir):
        SlurmLab.load(args.dir).destroy()
        print(f"removed the Slurm lab in {args.dir}")
        return 0
    Lab.load(args.dir).destroy()
    print(f"removed the lab in {args.dir}")
    return 0
