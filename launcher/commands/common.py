"""Arguments several commands share. Kept free of heavy imports: the CLI loads every
command module at start-up."""

from __future__ import annotations

import functools


def _bounded(kind, low, high, what: str):
    """An argparse type: a number of `kind` within [low, high] (nan and inf are refused);
    argparse names the flag and shows `what` when it is not."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(text) from None
        if not low <= value <= high:  # also false for nan
            raise ValueError(text)
        return value

    parse.__name__ = what
    return parse


grace_seconds = _bounded(float, 0.0, 600.0, "seconds (0 to 600)")
port_number = _bounded(int, 1, 65535, "port (1 to 65535)")
restart_count = _bounded(int, 0, 1000, "restart count (a whole number from 0 to 1000)")
hang_seconds = _bounded(float, 1.0, 7 * 86400.0, "number of seconds (1 to 604800)")
nproc_count = _bounded(int, 1, 64, "process count (1 to 64)")
recover_count = _bounded(int, 1, 100, "number of replacements (1 to 100)")
recover_seconds = _bounded(float, 60.0, 86400.0, "number of seconds (60 to 86400)")

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def byte_size(text: str) -> int:
    """An argparse type: a size such as 500MB, 2GB, 1.5GiB or a number of bytes (1 B to
    1 PB)."""
    number = text.strip().lower().rstrip("s")
    unit = number.lstrip("0123456789.")
    try:
        value = float(number[: len(number) - len(unit)]) * _UNITS[unit.strip()]
    except (ValueError, KeyError):
        raise ValueError(text) from None
    if not 1 <= value <= 10**15:
        raise ValueError(text)
    return int(value)


byte_size.__name__ = "size (e.g. 2GB, 500MB)"


def aws_command(handler):
    """For commands that talk to AWS: botocore is imported only when one runs (boto3 costs
    ~0.1 s of every `launch` start-up otherwise), and botocore's own errors (no credentials,
    no region, endpoint unreachable) and an answer it cannot parse (a proxy's or a wrong
    endpoint's HTML page, which is not a BotoCoreError) become one message, not a traceback."""

    @functools.wraps(handler)
    def run(args):
        from botocore.exceptions import BotoCoreError
        from botocore.parsers import ResponseParserError

        from launcher.provision.aws import AwsError, short_reason

        try:
            return handler(args)
        except BotoCoreError as err:
            raise AwsError(f"AWS could not be reached or configured: {err}") from None
        except ResponseParserError as err:
            raise AwsError(f"AWS's answer could not be read ({short_reason(err)}): is "
                           "AWS_ENDPOINT_URL or a proxy pointing somewhere else?") from err

    return run
