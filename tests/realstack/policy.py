"""The one rule for tests that need a real component which is not there.

Locally a missing component (no root to install a Debian package, no apt) is a skip with a reason
that says how to get it. In CI (env CI=true) the same situation is a failure: CI is supposed to
have everything, and a silently skipped integration test is a green build that tested nothing.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the current test with `reason`, or fail it when running under CI=true."""
    if in_ci():
        pytest.fail(f"real component unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)
