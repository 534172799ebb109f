"""Every name launch checks, by one rule each, checked one way.

Run ids, recipe names, host names (which name folders, here as runs/<run id>/<node>/ and on
the nodes), environment variable names, interface names, Slurm partitions, accounts and time
limits, cluster names. A host called `../../escape-node` once made a real SSH run write its
logs outside the run folder; a run id or interface ending in a newline passed checks written
with `re.match(r"^...$")` (`$` also matches before a final newline) and `lo\\n` reached
NCCL_SOCKET_IFNAME. So every rule is matched whole (`fullmatch`), ASCII only (`\\d` in a
Python pattern also matches other scripts' digits), and control characters are refused before
any pattern is tried. Nothing else in launch defines a name pattern of its own
(tests/run/test_names.py walks every checker with "name\\n").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from launcher.core.errors import LauncherError

MAX_COMPONENT = 128
# C0 controls, DEL, C1 controls (NEL among them) and Unicode's line and paragraph separators:
# a terminal or a log reader may end a line, or run an escape sequence, at any of them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Rule:
    pattern: str
    says: str          # what a valid one looks like, for messages
    max_len: int
    example: str       # a valid one (the tests walk every rule with it)
    compiled: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", re.compile(self.pattern, re.ASCII))

    def problem(self, value: object) -> str | None:
        if not isinstance(value, str) or not value:
            return "it is empty or not text"
        if _CONTROL.search(value):
            return "it holds a control character (a newline, tab, escape...)"
        if len(value) > self.max_len:
            return f"it is {len(value)} characters long (at most {self.max_len})"
        if not self.compiled.fullmatch(value):
            return self.says
        return None


_SLURM_WORD = r"[A-Za-z0-9_.-]{1,128}"
RULES: dict[str, Rule] = {
    "run id": Rule(
        r"[A-Za-z0-9][A-Za-z0-9._-]*", "use letters, digits, '.', '_' and '-', starting with a "
        "letter or digit (it names the run folder and the rendezvous)", 128, "demo-2"),
    "recipe name": Rule(
        r"[A-Za-z0-9][A-Za-z0-9._-]*", "use letters, digits, '.', '_' and '-', starting with a "
        "letter or digit (it becomes part of run ids and folder names)", 64, "vit-tiny-local"),
    # Host names (RFC 1123), IPv4/IPv6 literals, Ansible aliases, node names: not starting
    # with a dot or a dash (hidden files, options), no slash.
    "folder name": Rule(
        r"[A-Za-z0-9_@:][A-Za-z0-9._@:-]*", "use letters, digits and . _ - : @, not starting "
        "with '.' or '-' (it names a folder)", MAX_COMPONENT, "gpu-01"),
    "environment variable name": Rule(
        r"[A-Za-z_][A-Za-z0-9_]*", "use letters, digits and '_', not starting with a digit",
        256, "NCCL_DEBUG"),
    # Linux: IFNAMSIZ is 16 with the terminating NUL.
    "network interface name": Rule(
        r"[A-Za-z0-9_.:@-]+", "use letters, digits and . _ : @ - (an interface such as eth0)",
        15, "eth0"),
    # Slurm's own spellings: a partition list "gpu,gpu-spot", an account, a time limit in one
    # of sbatch's forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED).
    "Slurm partition name": Rule(
        rf"{_SLURM_WORD}(,{_SLURM_WORD}){{0,31}}", "use letters, digits, '_', '.', '-'; several "
        "separated by commas", 4096, "gpu,gpu-spot"),
    "Slurm account name": Rule(_SLURM_WORD, "use letters, digits, '_', '.', '-'", 128, "proj-1"),
    "Slurm time limit": Rule(
        r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]+(:[0-9]{1,2}){0,2}|UNLIMITED|INFINITE",
        "use HH:MM:SS, minutes, D-HH:MM:SS or UNLIMITED", 32, "04:00:00"),
    # What `python -m` takes: dotted identifiers (ASCII: a job's module on every node).
    "Python module name": Rule(
        r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "use dotted identifiers, as "
        "`python -m` takes them (pkg.train)", 256, "pkg.train"),
    # It becomes part of security group, placement group and host names.
    "cluster name": Rule(
        r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?", "use 1-40 lowercase letters, digits and '-', "
        "starting with a letter and not ending with '-'", 40, "demo"),
}


class UnsafeName(LauncherError):
    pass


def name_problem(kind: str, value: object) -> str | None:
    """Why `value` is not a valid name of this kind (a key of RULES), or None."""
    return RULES[kind].problem(value)


def control_problem(text: str) -> str | None:
    """Why a text launch prints or hands on (a path, an argument) cannot hold what it holds:
    a control character; None when it holds none."""
    if _CONTROL.search(text):
        return "it holds a control character (a newline, tab, escape...)"
    return None


def shown(value: object) -> str:
    """A name quoted in a message: repr (control characters escaped), cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:45]}... ({len(text)} chars)"


def check_name(kind: str, value: str, what: str | None = None) -> str:
    """`value` unchanged when it is a valid name of this kind; UnsafeName naming `what` (the
    flag or key it came from; default the kind) and what a valid one looks like."""
    why = name_problem(kind, value)
    if why:
        raise UnsafeName(f"{what or kind} {shown(value)} cannot be used: {why}")
    return value


def component_problem(value: object) -> str | None:
    """Why `value` cannot be a folder name, or None when it can."""
    return name_problem("folder name", value)


def path_component(value: str, what: str) -> str:
    """`value` unchanged when it is safe as one folder name; UnsafeName naming `what` else."""
    return check_name("folder name", value, what)
