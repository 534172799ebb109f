"""Ledgers that are not what launch wrote, and numbers that are not numbers (issue 25, classes
2, 3 and 8): `launch extend`, `teardown` and `status` read the cluster's ledger through one
bounded reader and one schema, so a FIFO or /dev/zero in its place, a missing field or a
wrong type is one message naming the file and the key, before any AWS call; `launch check`
refuses inf and nan where it would overflow."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.run.hostile import Guard, check, run_cli

pytestmark = pytest.mark.timeout(120)

LEDGER = {"cluster": "demo", "region": "us-east-1", "status": "active",
          "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-02T00:00:00Z",
          "instance_type": "p4d.24xlarge", "price_per_hour": 32.77,
          "resources": [{"kind": "instance", "id": "i-0123", "state": "created", "run": "r"}],
          "events": [{"at": "2026-01-01T00:00:00Z", "what": "created"}]}


def without(key: str) -> dict:
    return {k: v for k, v in LEDGER.items() if k != key}


@dataclass
class Case:
    id: str
    ledger: object          # a document, raw text, or "fifo" / "dev-zero"
    argv: list[str]
    says: str | list[str]


EXTEND = ["extend", "--cluster", "demo", "--ttl", "8h"]
TEARDOWN = ["teardown", "--cluster", "demo"]
CASES = [
    Case("extend-missing-region", without("region"), EXTEND, "ledger.json: region: missing"),
    Case("extend-missing-cluster", without("cluster"), EXTEND, "ledger.json: cluster: missing"),
    Case("extend-resources-strings", {**LEDGER, "resources": ["i-1"]}, EXTEND,
         "resources.0: expected a valid dictionary"),
    Case("extend-resource-without-state", {**LEDGER, "resources": [{"kind": "instance"}]},
         EXTEND, "resources.0.state: missing"),
    Case("extend-price-string", {**LEDGER, "price_per_hour": "32.77"}, EXTEND,
         "price_per_hour: expected a valid number"),
    Case("extend-price-inf", json.dumps(LEDGER).replace("32.77", "1e999"), EXTEND,
         "price_per_hour: expected a finite number"),
    Case("extend-status-null", {**LEDGER, "status": None}, EXTEND, "status"),
    Case("extend-not-json", '{"cluster": "demo"', EXTEND, "ledger.json: cannot read the ledger"),
    Case("extend-fifo", "fifo", EXTEND, ["ledger.json", "FIFO"]),
    Case("extend-dev-zero", "dev-zero", EXTEND, ["ledger.json", "device"]),
    Case("teardown-list", [1, 2], TEARDOWN, "not a ledger launch wrote"),
    Case("teardown-events-object", {**LEDGER, "events": {"a": 1}}, TEARDOWN,
         "events: expected a valid list"),
    Case("teardown-fifo", "fifo", TEARDOWN, ["ledger.json", "FIFO"]),
]


def _plant(path: Path, ledger: object) -> None:
    path.parent.mkdir(parents=True)
    if ledger == "fifo":
        os.mkfifo(path)
    elif ledger == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(ledger if isinstance(ledger, str) else json.dumps(ledger))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_ledger_that_is_not_launchs_is_named_before_any_aws_call(case, tmp_path,
                                                                   monkeypatch, capsys):
    case_dir = tmp_path / "case"
    _plant(case_dir / "home" / "clusters" / "demo" / "ledger.json", case.ledger)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(case_dir / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(case_dir / "no-aws-credentials"))
    guard = Guard(tmp_path, case_dir)
    outcome = run_cli(case.argv, case_dir, monkeypatch, capsys)
    guard.verify()
    check(outcome, 2, case.says, stream="err")


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e400", "-inf"])
def test_check_refuses_numbers_that_are_not_numbers(value, tmp_path, monkeypatch, capsys):
    outcome = run_cli(["check", "--local", f"--min-free-gb={value}"], tmp_path, monkeypatch,
                      capsys)
    check(outcome, 2, "--min-free-gb must be from 0 to 1,000,000 GB", stream="err")
    outcome = run_cli(["check", "--local", "--collective", f"--min-busbw={value}"], tmp_path,
                      monkeypatch, capsys)
    check(outcome, 2, "--min-busbw must be a bandwidth above 0 GB/s", stream="err")
