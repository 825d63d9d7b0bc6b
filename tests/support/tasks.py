"""Module-level task functions and sources for tests/test_tasks.py: Dask workers import them by reference."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from gpufleet.collector.schema import JOB_COLUMNS, Batch
from gpufleet.collector.sources.base import SourceError


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


def mark_and_square(item: tuple[str, int]) -> int:
    """Leaves a file named after the task when it starts: how many tasks a runner has started."""
    folder, n = Path(item[0]), item[1]
    (folder / str(n)).touch()
    return n * n


@dataclass
class ChunkedSource:
    """A backfill source whose reads need only its settings (as the Prometheus API's): a job row
    per chunk of `chunk_s` seconds, and a SourceError for the chunk starting at `fail_at`."""

    fail_at: datetime | None = None
    chunk_s: int = 60
    name: str = "chunked"
    reads_anywhere = True

    def backfill_windows(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        n = int((end - start).total_seconds() // self.chunk_s)
        return [(start + timedelta(seconds=i * self.chunk_s), start + timedelta(seconds=(i + 1) * self.chunk_s)) for i in range(n)]

    def read_window(self, lo: datetime, hi: datetime) -> Batch:
        if lo == self.fail_at:
            raise SourceError(f"chunk {lo.isoformat()} is unreadable (pid {os.getpid()})")
        job = dict.fromkeys(JOB_COLUMNS) | {
            "cluster": "c", "scheduler": "slurm", "job_key": f"c:{lo:%H%M}", "job_id": f"{lo:%H%M}", "user_name": "u", "account": "a",
            "state": "COMPLETED", "submit": lo, "start": lo, "end": hi, "gpus": 1, "source": self.name, "updated_at": hi}
        return Batch(key=f"chunked:{lo.isoformat()}", jobs=[job])
