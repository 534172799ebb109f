from __future__ import annotations

import pytest

from launcher.lab.hosts import Lab, lab_unavailable_reason


@pytest.fixture(scope="module")
def lab3(tmp_path_factory):
    """Three SSH hosts for the module's tests; each test sets the caps it needs."""
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(reason)
    built = Lab.create(tmp_path_factory.mktemp("lab") / "lab", hosts=3)
    yield built
    built.destroy()
