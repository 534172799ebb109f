"""A TTL that acts on the node itself: a systemd timer set from user data at first boot.

The instances are launched with InstanceInitiatedShutdownBehavior=terminate, so the node powering
itself off at its expiry terminates it, even if nobody runs launch again (a closed laptop).
`launch extend` moves the timer over SSH with the helper this script installs. The timer is
Persistent: an instance that was stopped past its expiry powers off right after booting.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime

SETTER = "/usr/local/sbin/launch-ttl"
EXPIRY_FILE = "/etc/launch/expires-at"

_ISO = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")

# Installed by user data; `launch-ttl EXPIRY` sets (or moves) the power-off time.
_HELPER = r"""#!/bin/sh
# launch-ttl YYYY-MM-DDTHH:MM:SSZ: power this node off (EC2 then terminates it) at that time.
set -eu
case "$1" in
  [0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]Z) ;;
  *) echo "launch-ttl: not an ISO 8601 UTC time: $1" >&2; exit 2 ;;
esac
when="$(echo "$1" | sed 's/T/ /; s/Z$//') UTC"
mkdir -p /etc/launch /etc/systemd/system
echo "$1" > /etc/launch/expires-at
cat > /etc/systemd/system/launch-ttl.service <<'EOF'
[Unit]
Description=launch: the cluster's TTL has passed, power off (the instance terminates)
[Service]
Type=oneshot
ExecStart=/bin/systemctl poweroff
EOF
cat > /etc/systemd/system/launch-ttl.timer <<EOF
[Unit]
Description=launch: power off at the cluster's expiry ($1)
[Timer]
OnCalendar=$when
Persistent=true
[Install]
WantedBy=timers.target
EOF
systemctl daemon-reload
systemctl enable launch-ttl.timer >/dev/null 2>&1
systemctl restart launch-ttl.timer
"""


def check_iso(expires_at: str) -> str:
    if not isinstance(expires_at, str) or not _ISO.fullmatch(expires_at):
        raise ValueError(f"not an ISO 8601 UTC time: {expires_at!r}")
    datetime.strptime(expires_at, "%Y-%m-%dT%H:%M:%SZ")
    return expires_at


def user_data(expires_at: str) -> str:
    """The boot script: install the helper, then set the timer to `expires_at`."""
    check_iso(expires_at)
    return ("#!/bin/sh\n"
            "# launch: terminate this node at the cluster's expiry (launch extend moves it)\n"
            "set -eu\n"
            f"cat > {SETTER} <<'LAUNCH_TTL'\n{_HELPER}LAUNCH_TTL\n"
            f"chmod 755 {SETTER}\n"
            f"{SETTER} {check_iso(expires_at)}\n")


def set_command(expires_at: str, setter: str = SETTER, sudo: bool = True) -> str:
    """The remote command `launch extend` runs on each node (one string, quoted once)."""
    return shlex.join([*(["sudo", "-n"] if sudo else []), setter, check_iso(expires_at)])
