"""Command line entry point: parse arguments, call one function, turn errors into messages.

Each subcommand lives in `launcher/commands/<name>.py` and exposes `register(subparsers)`,
which adds its parser and sets `func` to a callable taking the parsed args and returning the
exit code. Adding a command means adding its module name to COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from launcher import __version__
from launcher.core.errors import LauncherError

COMMANDS = [
    "run",
    "attach",
    "logs",
    "stop",
    "fetch",
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
    # A name holding bytes that are not UTF-8 (Python's \udcXX surrogates: a file name, an
    # argument, a variable from another system) is printed escaped, never the end of launch
    # with a codec error in the middle of a message or a plan.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    # `launch run train.py -- --epochs 3`: everything after the first `--` is the job's own,
    # verbatim (argparse would read options there, or refuse positionals after others). Other
    # commands keep `--` as argparse's end of options.
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "run" and "--" in argv[argv.index("run"):]:
        split = argv.index("--", argv.index("run"))
        args = parser.parse_args(argv[:split])
        args.job_args = argv[split + 1:]
    elif command == "run":
        args, extra = parser.parse_known_args(argv)
        if extra:
            # `launch run train.py --epochs 3`: the `--` forgotten.
            import shlex

            parser.error(f"unrecognized arguments: {shlex.join(extra)} (arguments for your "
                         f"script go after --: launch run ... SCRIPT.py -- {shlex.join(extra)})")
    else:
        args = parser.parse_args(argv)
    from launcher.core.home import keep_nothing

    keep_nothing(bool(getattr(args, "dry_run", False)))
    try:
        return int(args.func(args) or 0)
    except LauncherError as err:
        _traceback_if(args.debug)
        print(f"launch: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        _traceback_if(args.debug)
        print("launch: interrupted", file=sys.stderr)
        return 130
    finally:
        keep_nothing(False)   # main() called again in this process (tests) starts afresh


def _traceback_if(debug: bool) -> None:
    """--debug adds the traceback to the message and changes nothing else: the same message
    and exit code follow it (scripts that test for exit 2 behave the same with it)."""
    if debug:
        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
