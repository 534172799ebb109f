"""Command line entry point: parse arguments, call one function, turn errors into messages.

Each subcommand lives in `launcher/commands/<name>.py` and exposes `register(subparsers)`,
which adds its parser and sets `func` to a callable taking the parsed args and returning the
exit code. Adding a command means adding its module name to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from launcher import __version__
from launcher.errors import LauncherError

COMMANDS = [
    "run",
    "runs",
    "recipes",
    "init",
    "lab",
    "inspect",
    "bench",
    "topo",
    "check",
    "report",
    "compare",
    "catalog",
    "provision",
    "setup",
    "teardown",
    "status",
    "extend",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch",
        description="Launch, provision and measure multi-node PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"launch {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"launcher.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # `launch run train.py -- --epochs 3`: everything after the first `--` is the job's own,
    # verbatim (argparse would read options there, or refuse positionals after others).
    before, job_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, None)
    args = parser.parse_args(before)
    if job_args is not None:
        if not getattr(args, "takes_job_args", False):
            parser.error(f"`--` passes arguments to your script: only `launch run` takes "
                         f"them (launch {args.command} does not)")
        args.job_args = job_args
    try:
        return int(args.func(args) or 0)
    except LauncherError as err:
        if args.debug:
            raise
        print(f"launch: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("launch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
