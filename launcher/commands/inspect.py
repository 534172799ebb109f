"""`launch inspect FILE... [--json]`: say what a bandwidth log or topology dump shows."""

from __future__ import annotations

import argparse
import json

from launcher.core.errors import LauncherError
from launcher.nccl.detect import parse_file
from launcher.nccl.summary import summary_lines

HELP = """\
Reads nccl-tests output (all_reduce_perf and the other *_perf binaries, any layout), NCCL_DEBUG=INFO
logs, and `nvidia-smi topo -m` output, tells which each FILE is, and prints a short summary of
each. Pastes are taken as people make them: the labels launchers put before lines (mpirun's
[1,0]<stdout>:, horovodrun's [0]<stdout>:, torchrun's [default0]:, srun --label's 0:, pdsh's
host:, SkyPilot's (head, rank=0, pid=N)) and log timestamps (kubectl, journalctl, CloudWatch,
NCCL's own) are stripped; NCCL lines cut from their HOST:PID:TID prefix still count; topology
columns glued or wrapped by a terminal are repaired, and the repairs listed.

A run that failed after its header is a result, not an error: "failed": true, the reason, the
failure lines, and what the NCCL lines in the output say.

--json prints JSON Lines: one compact JSON object per FILE, one line each, in the order given
(so a single FILE prints exactly one JSON object). Each object has "file" and "kind"
("nccl-tests", "nccl-debug" or "topology") and that kind's fields.

A FILE that is unreadable or none of the three is reported on stderr with its name; the other
files are still summarised, and the exit code is 2.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect", help="summarise nccl-tests output, NCCL_DEBUG logs and nvidia-smi topo -m",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="a log or topology dump")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per FILE, one per line (JSON Lines)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    errors: list[LauncherError] = []
    printed = 0
    for path in args.files:
        try:
            parsed = parse_file(path)
        except LauncherError as err:
            errors.append(err)
            continue
        if args.json:
            print(json.dumps({"file": path, **parsed.to_json()}), flush=True)
        else:
            print(("\n" if printed else "") + "\n".join(summary_lines(parsed)), flush=True)
        printed += 1
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise LauncherError(f"{len(errors)} of {len(args.files)} files could not be read:\n"
                            + "\n".join(f"  {err}" for err in errors))
    return 0
