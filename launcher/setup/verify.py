"""`launch setup --verify`: the read-only node checks on every host, as one table.

It runs site.yml's node_checks role alone (`--tags node_checks`), in Ansible's check mode, with
node_checks_fail false so that every check of every host reports; the roles' own inputs
(driver branch and flavour, NCCL and torch pins) are what the checks expect. Useful on nodes
someone else set up (an AWS Deep Learning AMI, an older run of launch setup).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from launcher.core.table import format_table
from launcher.setup.apply import apply_playbook

# Column order: what the node_checks role runs (roles/node_checks/defaults/main.yml).
CHECKS = ("driver", "gpus", "dkms", "fabric_manager", "persistence", "efa", "nccl", "torch")
VERIFY_FILE = "verify.json"


def verify_table(checks: dict[str, list[dict[str, str]]], hosts: list[str],
                 problems: dict[str, str]) -> str:
    """host x check: ok, FAIL, n/a (nothing to check there), or why the host has no results."""
    rows = []
    for host in hosts:
        if host in checks:
            status = {c["check"]: c["status"] for c in checks[host]}
            rows.append((host, *(("FAIL" if status.get(n) == "fail" else status.get(n, "-"))
                                 for n in CHECKS)))
        else:
            rows.append((host, *([problems.get(host, "not checked")] + [""] * (len(CHECKS) - 1))))
    return format_table(("host", *CHECKS), rows)


def evidence_table(checks: dict[str, list[dict[str, str]]], hosts: list[str]) -> str:
    rows = [(host, c["check"], c["status"] if c["status"] != "fail" else "FAIL", c["evidence"])
            for host in hosts for c in checks.get(host, []) if c["status"] != "n/a"]
    return format_table(("host", "check", "status", "evidence"), rows) if rows else ""


def verify_arguments(extra_vars: dict[str, Any] | None) -> dict[str, Any]:
    """How --verify runs the playbook: check mode, the node checks only, every result kept
    (a failed check is a table cell, not a stopped play)."""
    return {"check": True, "tags": ["node_checks"],
            "extra_vars": {**(extra_vars or {}), "node_checks_fail": False}}


def run_verify(inventory: Path, *, limit: str | None = None, cluster: str | None = None,
               extra_vars: dict[str, Any] | None = None, out: TextIO | None = None) -> int:
    """0 when every host ran every check and none failed; 1 otherwise (the table says where)."""
    out = out or sys.stdout
    run = apply_playbook(inventory, limit=limit, cluster=cluster, out=out, echo=False,
                         what="launch setup --verify", **verify_arguments(extra_vars))
    report = run.report
    hosts = list(report.counts) or sorted(report.checks)
    problems = {}
    for failure in report.failures:
        problems.setdefault(failure.host, "UNREACHABLE" if failure.unreachable
                            else f"FAILED at {failure.task}")
    out.write("\n" + verify_table(report.checks, hosts, problems))
    evidence = evidence_table(report.checks, hosts)
    if evidence:
        out.write("\n" + evidence)
    for failure in report.failures:
        out.write(f"\n{failure.host} {'unreachable' if failure.unreachable else 'failed'} at "
                  f"'{failure.task}':\n")
        out.write("".join(f"  {line}\n" for line in failure.message.splitlines()))
    (run.run_dir / VERIFY_FILE).write_text(json.dumps(
        {"hosts": hosts, "checks": report.checks, "problems": problems}, indent=2, sort_keys=True))
    out.write(f"\nresults: {run.run_dir / VERIFY_FILE}\n")
    out.flush()
    failed = any(c["status"] == "fail" for results in report.checks.values() for c in results)
    unchecked = [h for h in hosts if h not in report.checks]
    if not hosts:
        return run.rc or 1
    return 1 if failed or unchecked or run.rc else 0
