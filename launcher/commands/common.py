"""Arguments several commands share. Kept free of heavy imports: the CLI loads every
command module at start-up."""

from __future__ import annotations

import functools


def add_ssh_arguments(parser) -> None:
    """The host-key flags every command that reaches nodes over SSH takes."""
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="with -i: record unknown SSH host keys in known_hosts, like "
                        "OpenSSH's accept-new (a changed key is always refused)")
    parser.add_argument("--known-hosts",
                        help="with -i: known_hosts file (default: the inventory's "
                        "UserKnownHostsFile, else ~/.ssh/known_hosts)")


def aws_command(handler):
    """For commands that talk to AWS: botocore is imported only when one runs (boto3 costs
    ~0.1 s of every `launch` start-up otherwise), and botocore's own errors (no credentials,
    no region, endpoint unreachable) become one message instead of a traceback."""

    @functools.wraps(handler)
    def run(args):
        from botocore.exceptions import BotoCoreError

        from launcher.provision.aws import AwsError

        try:
            return handler(args)
        except BotoCoreError as err:
            raise AwsError(f"AWS could not be reached or configured: {err}") from None

    return run
