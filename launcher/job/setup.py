"""A job's `setup:` commands: run on every node in the shipped workdir before the job, and again
only when the workdir's content or the commands change.

The workdir keeps a marker (`.launch-setup-done`) holding the key of the last setup that
succeeded in it: a hash of the workdir's content (its manifest digest) and the commands. Setup's
own outputs (a built extension, downloaded data, an installed package) stay where it put them:
the shipped folder is updated in place and never loses files launch did not ship.

Setup runs once per copy of the workdir: on every node that has its own copy, once where nodes
share one (--local, Slurm's shared filesystem, an NFS home): a lock in the folder (flock) lets
one node run it while the others wait, then find the marker and skip. A node-local effect
(`pip install` into a node's own environment) therefore needs a node-local workdir or a shared
environment (docs/jobs.md).

Each command is one shell line, run by bash (sh where there is no bash) with -e, in the
workdir, with the job's environment; the first failure stops setup and no job starts.
"""

from __future__ import annotations

import hashlib
import json

SETUP_MARKER = ".launch-setup-done"
SETUP_LOCK = ".launch-setup.lock"
SETUP_LOG = "setup.log"

# argv: key, then the commands. Prints each command before it runs; exits with the failing
# command's code. The marker is removed first: a setup stopped half way runs again.
SETUP_SCRIPT = r"""key=$1
shift
marker=""" + SETUP_MARKER + r"""
if [ -f "$marker" ] && [ ! -L "$marker" ] && [ "$(head -c 64 "$marker" 2>/dev/null)" = "$key" ]; then
  echo "launch: setup skipped: it succeeded here before with this workdir and these commands"
  exit 0
fi
rm -f "$marker"
if command -v bash >/dev/null 2>&1; then shell=bash; else shell=sh; fi
for line in "$@"; do
  printf 'launch: setup $ %s\n' "$line"
  "$shell" -e -c "$line"
  code=$?
  if [ "$code" -ne 0 ]; then
    printf 'launch: setup command failed with exit code %s: %s\n' "$code" "$line"
    exit "$code"
  fi
done
printf '%s\n' "$key" > "$marker"
echo "launch: setup done"
"""


def setup_key(workdir_digest: str | None, commands: tuple[str, ...] | list[str]) -> str:
    """What decides whether setup runs again on a node."""
    text = json.dumps({"workdir": workdir_digest, "commands": list(commands)})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# argv: the lock file, the script, then its own arguments: the script under the folder's lock
# (flock, where util-linux is installed), so that nodes sharing the folder take turns. The
# folder is the job's too: a link or a FIFO a job left in the lock's place is removed first
# (flock would create a file through the link, or wait forever opening the FIFO); a folder
# there is refused. The marker is read only as a regular file that is not a link, 64 bytes
# of it; it is removed before setup runs and written anew after.
LOCKED = r"""lock=$1; body=$2; shift 2
if [ -d "$lock" ] && [ ! -L "$lock" ]; then
  printf 'launch: %s/%s is a folder, not launch'"'"'s setup lock: remove it\n' "$PWD" "$lock" >&2
  exit 97
fi
if [ -L "$lock" ] || { [ -e "$lock" ] && [ ! -f "$lock" ]; }; then rm -f -- "$lock" || exit 97; fi
if command -v flock >/dev/null 2>&1; then exec flock "$lock" sh -c "$body" launch-setup "$@"; fi
exec sh -c "$body" launch-setup "$@"
"""


def setup_argv(key: str, commands: tuple[str, ...] | list[str]) -> list[str]:
    """The one command a node runs (in the workdir) for the whole setup."""
    return ["sh", "-c", LOCKED, "launch-locked", SETUP_LOCK, SETUP_SCRIPT, key, *commands]
