"""The report page, `launch compare` and the live view: real run folders (tests/report/data,
made by tests/report/make_runs.py) and a real browser to open the pages in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.report.browser import chromium

DATA = Path(__file__).resolve().parent / "data" / "runs"


@pytest.fixture
def runs(tmp_path) -> Path:
    """A copy of the kept runs: reports are written into it, never into the checkout."""
    target = tmp_path / "runs"
    shutil.copytree(DATA, target)
    return target


@pytest.fixture(scope="session")
def browser():
    if not chromium():
        pytest.skip("chromium is not installed (scripts/test installs it as root)")
