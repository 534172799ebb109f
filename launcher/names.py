"""Names that become path components: run ids, node (host) names, recipe and cluster names.

Each one ends up as a folder name, here (runs/<run id>/<node>/) and on the nodes
(.launch/runs/<run id>/<node>/). A host called `../../escape-node` once made a real SSH run
write its logs outside the run folder. Every such name passes through `path_component`
before it is used, so that none can climb out of, or hide in, the folder it is meant for.
"""

from __future__ import annotations

import re

from launcher.errors import LauncherError

MAX_COMPONENT = 128
# Host names (RFC 1123), IPv4/IPv6 literals, Ansible aliases, run ids: letters, digits and
# . _ - : @, not starting with a dot or a dash (hidden files, options), no slash.
_COMPONENT = re.compile(r"^[A-Za-z0-9_@:][A-Za-z0-9._@:-]*$")


class UnsafeName(LauncherError):
    pass


def component_problem(value: object) -> str | None:
    """Why `value` cannot be a folder name, or None when it can."""
    if not isinstance(value, str) or not value:
        return "it is empty or not text"
    if len(value) > MAX_COMPONENT:
        return f"it is {len(value)} characters long (at most {MAX_COMPONENT})"
    if not _COMPONENT.match(value):
        return ("use letters, digits and . _ - : @, not starting with '.' or '-' "
                "(it names a folder)")
    return None


def path_component(value: str, what: str) -> str:
    """`value` unchanged when it is safe as one folder name; UnsafeName naming `what` else."""
    why = component_problem(value)
    if why:
        shown = value if isinstance(value, str) and len(value) <= 60 else f"{str(value)[:45]}..."
        raise UnsafeName(f"{what} {shown!r} cannot be used: {why}")
    return value
