"""EC2's spot interruption notice, read on the node from its instance metadata (IMDSv2), and
the last-chance checkpoint signal to the run's ranks there.

    python launch_node/spot.py watch RUN_DIR [--interval 5]

(the run's stamp and the node's name from LAUNCH_RUN_STAMP and LAUNCH_NODE, which every
process of a run gets).

When EC2 is about to reclaim a spot instance, `/latest/meta-data/spot/instance-action`
answers `{"action": "terminate"|"stop"|"hibernate", "time": "2026-12-01T12:02:00Z"}` (404
until then), about two minutes ahead. The watcher asks every `interval` seconds (AWS's own
advice is every 5), with an IMDSv2 session token (`launch provision` makes instances that
accept nothing else). On the notice it sends SIGUSR1, once, to every rank of the run on this
node that handles it (SigCgt in /proc/<pid>/status: a process with no handler would be killed
by it), and prints one line launch reads:

    spot: interruption notice: terminate at 2026-12-01T12:02:00Z; SIGUSR1 to rank(s) 2, 3

The bundled trainer answers SIGUSR1 with a checkpoint at the next step every rank agrees on;
a job of the user's own decides itself (docs/jobs.md). Then it goes on watching, in case the
notice is withdrawn (a `stop` that never came) and comes again.

Imports only the standard library (and node_probe, stdlib too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch_node.node_probe import STAMP_ENV, _environ, rank_processes  # noqa: E402

IMDS = "http://169.254.169.254"
TOKEN_TTL_S = 21600
NOTICE = "spot: interruption notice:"
# The last-chance signal, and the variable launch gives every rank of a run that may get it
# (train/checkpoint.py: every step the ranks agree whether one of them got it).
LAST_CHANCE = signal.SIGUSR1
INTERRUPTIBLE_ENV = "LAUNCH_INTERRUPTIBLE"


class Metadata:
    """IMDSv2: a session token (PUT), then reads that carry it; a token that expired (401)
    is asked for again."""

    def __init__(self, base: str = IMDS, timeout: float = 2.0):
        self.base, self.timeout = base, timeout
        self.token: str | None = None

    def _token(self) -> str:
        request = urllib.request.Request(
            f"{self.base}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:
            return answer.read().decode()

    def get(self, path: str) -> str | None:
        """The value at `path`, or None where there is none (404)."""
        for _ in range(2):
            if self.token is None:
                self.token = self._token()
            request = urllib.request.Request(f"{self.base}/latest/meta-data/{path}",
                                             headers={"X-aws-ec2-metadata-token": self.token})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return answer.read().decode()
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                if err.code == 401:
                    self.token = None
                    continue
                raise
        return None


def instance_action(metadata: Metadata) -> dict | None:
    text = metadata.get("spot/instance-action")
    if not text:
        return None
    try:
        action = json.loads(text)
    except ValueError:
        return {"action": "unknown", "time": None, "raw": text[:200]}
    return action if isinstance(action, dict) else None


def handles(pid: int, sig: int) -> bool:
    """Whether the process installed a handler for `sig` (SigCgt, a hex bit mask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def last_chance(run_dir: str, stamp: str, node: str | None) -> list[str]:
    """SIGUSR1 to the run's ranks on this node that handle it; returns who got it."""
    told = []
    for rank in rank_processes(Path(run_dir), stamp, node):
        pid = rank.get("pid")
        if not isinstance(pid, int) or _environ(pid).get(STAMP_ENV) != stamp:
            continue
        if not handles(pid, LAST_CHANCE):
            continue
        try:
            os.kill(pid, LAST_CHANCE)
        except OSError:
            continue
        told.append(str(rank.get("rank") if rank.get("rank") is not None else f"pid {pid}"))
    return told


def watch(run_dir: str, stamp: str, node: str | None, interval: float = 5.0,
          base: str = IMDS) -> int:
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    metadata = Metadata(base)
    noticed: dict | None = None
    unreachable = False
    print(f"spot: watching {base} for an interruption notice every {interval:g}s", flush=True)
    while not stop:
        try:
            action = instance_action(metadata)
            unreachable = False
        except (OSError, urllib.error.URLError) as err:
            if not unreachable:
                print(f"spot: instance metadata unreachable ({err}); trying again", flush=True)
            unreachable, action = True, None
        if action is not None and action != noticed:
            told = last_chance(run_dir, stamp, node)
            print(f"{NOTICE} {action.get('action')} at {action.get('time')}; "
                  + (f"SIGUSR1 to rank(s) {', '.join(told)}" if told
                     else "no rank here handles SIGUSR1"), flush=True)
        noticed = action
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    w = sub.add_parser("watch")
    w.add_argument("run_dir")
    w.add_argument("--stamp", default=os.environ.get(STAMP_ENV))
    w.add_argument("--node", default=os.environ.get("LAUNCH_NODE"))
    w.add_argument("--interval", type=float, default=5.0)
    args = p.parse_args(argv)
    if not args.stamp:
        p.error(f"--stamp (or {STAMP_ENV}) is required: only the run's own ranks are signalled")
    return watch(args.run_dir, args.stamp, args.node, args.interval)


if __name__ == "__main__":
    sys.exit(main())
