"""Module-level task functions for tests/test_tasks.py: Dask workers import them by reference."""

from __future__ import annotations

import os
import time
from pathlib import Path


def square_slowly(item: tuple[int, float]) -> int:
    n, pause = item
    time.sleep(pause)
    return n * n


def flaky(item: tuple[str, int]) -> str:
    """Fails the first `fails` calls for this counter file, then answers (a transient failure)."""
    counter, fails = Path(item[0]), item[1]
    seen = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(seen + 1))
    if seen < fails:
        raise RuntimeError(f"transient failure {seen + 1} in pid {os.getpid()}")
    return f"ok after {seen}"
