"""Labels and timestamps that launchers and log viewers put in front of every line.

People paste what their launcher printed: Slurm, MPI, torchrun, pdsh, SkyPilot, kubectl,
journald and CloudWatch each put their own label before the line the program wrote. These are
stripped from the front of a line before any parser sees it, one known pattern at a time (a
line may carry several: a timestamp, then a launcher's label). Only these patterns are
removed, only at the start of a line; what remains is for the parsers, which stay strict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An ISO 8601 / RFC 3339 time as kubectl and CloudWatch print it:
# `2025-05-16T16:39:51.208-07:00`, `2024-03-01T10:15:30.123456789Z`
_ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# What may follow a pdsh label for it to be one: nccl-tests' `#` lines and rows, or an NCCL
# log line's `HOST:PID:TID [`. Other `word: text` lines (`GENOA-06: Test NCCL failure ...`,
# which nccl-tests itself writes) keep their first word.
_PDSH_FOLLOWS = r"(?=\s*(?:#|\d|[A-Za-z0-9][\w.-]*:\d+:\d+ \[))"


@dataclass(frozen=True)
class Label:
    source: str  # who writes it
    pattern: re.Pattern


def _label(source: str, pattern: str) -> Label:
    return Label(source, re.compile(pattern))


LABELS = (
    # `[1,0]<stdout>:#  Rank  0 Group  0 Pid ...` (job, rank, stream)
    _label("Open MPI --tag-output", r"\[\d+,\d+\]<std(?:out|err)>:"),
    # `[0]<stdout>:node01:150770:150790 [0] NCCL INFO Bootstrap : Using ib0:10.149.0.1<0>`
    _label("horovodrun (Gloo)", r"\[\d+\]<std(?:out|err)>:"),
    # `[default0]:tp4-pods-0:78:108 [0] NCCL INFO comm ... rank 0 nRanks 8` (role, local
    # rank), and torch's own `[rank0]: Traceback ...`
    _label("torchrun --tee", r"\[(?:default|rank)\d+\]: ?"),
    # ` 0: #  Rank  0 Group  0 Pid 291005 on node005 ...` (task number; ` 0:` alone on an
    # empty line)
    _label("srun --label", r"\s*\d+:(?: |$)"),
    # `gpu1505: gpu1505:22060:22171 [0] NCCL INFO Connected all rings` (host, or its address)
    _label("pdsh (DeepSpeed's multi-node launcher)", rf"[A-Za-z0-9][\w.-]*: {_PDSH_FOLLOWS}"),
    # `(head, rank=0, pid=3808) [1,0]<stdout>:# Using devices`,
    # `(worker1, rank=1, pid=2769, ip=10.100.10.12) ...`, Ray's `(RayTrainWorker pid=1, ...)`
    _label("SkyPilot / Ray", r"\([\w-]+(?:, rank=\d+)?,? pid=\d+(?:, ip=[\d.]+)?\) "),
    # `  | 2025-05-16T16:39:51.208-07:00 | ip-10-36-29-253:79:79 [0] NCCL INFO ...`, and the
    # same row copied without its second bar: `...-07:00ip-10-36-29-253:79:79 [0] ...`
    _label("CloudWatch Logs console", rf"\s*\|\s*{_ISO_TIME}\s*(?:\|\s*)?"),
    # `2024-03-01T10:15:30.123456789Z [1,0]<stdout>:# nThread 1 ...`
    _label("kubectl logs --timestamps", rf"{_ISO_TIME} ?"),
    # `Feb 04 10:15:01 node01 horovodrun[4242]: [0]<stdout>:node01:150770:...` (journalctl's
    # default `short` output: time, host, unit[pid])
    _label("journalctl", r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w.@/-]+(?:\[\d+\])?: "),
    # `[2026-01-01 12:08:32] llama-3-8b-node-0-0:194:710 [0] ... NCCL WARN ...`
    # (NCCL_DEBUG_TIMESTAMP_FORMAT's default, on WARN lines from NCCL 2.26)
    _label("NCCL's own timestamp", r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\] "),
    # `Tue Apr 21 18:22:52 2020[0]<stdout>:cuda is available:1` (horovodrun
    # --timestamp-output, as Arena's `arena logs` shows it)
    _label("horovodrun --timestamp-output",
           r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"),
)

_MAX_LABELS = 4  # a timestamp, a job launcher, an MPI tag and one more are the most seen


def strip_labels(line: str) -> str:
    """The line without the known labels at its front, and without the copy of itself that
    the CloudWatch console appends (`MESSAGE | MESSAGE`)."""
    for _ in range(_MAX_LABELS):
        for label in LABELS:
            match = label.pattern.match(line)
            if match and match.end() > 0:
                line = line[match.end():]
                break
        else:
            break
    return _undouble(line)


def labels_of(line: str) -> list[str]:
    """Which labels `strip_labels` removes from this line, outermost first (for tests and
    messages)."""
    found = []
    for _ in range(_MAX_LABELS):
        for label in LABELS:
            match = label.pattern.match(line)
            if match and match.end() > 0:
                found.append(label.source)
                line = line[match.end():]
                break
        else:
            break
    return found


def _undouble(line: str) -> str:
    """`X | X` -> `X`: the CloudWatch console shows a row's message twice when copied."""
    stripped = line.rstrip()
    half = (len(stripped) - 3) // 2
    if half > 0 and stripped[half:half + 3] == " | " and stripped[:half] == stripped[half + 3:]:
        return stripped[:half]
    return line
