"""The interface every collector source implements, and the batch it hands to the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Protocol

import pyarrow as pa


@dataclass
class Batch:
    """What one source run produced; the store commits a batch whole or not at all.

    `key` identifies the input window deterministically (the same window read twice gives the
    same key), which is what makes re-ingesting idempotent. `watermark` is committed in the same
    transaction, so a crash never advances a watermark past data that was not stored.
    Row dicts use the column names of gpufleet.collector.schema.
    """

    key: str
    samples: pa.Table | None = None  # gpufleet.collector.schema.SAMPLE_SCHEMA
    jobs: list[dict[str, Any]] = field(default_factory=list)  # JOB_COLUMNS
    allocations: list[dict[str, Any]] = field(default_factory=list)  # one observation each: ts + ALLOCATIONS key
    gpus: list[dict[str, Any]] = field(default_factory=list)  # one observation each: ts + GPUS columns
    throughput: list[dict[str, Any]] = field(default_factory=list)  # job-reported FLOP/s: ts + job_throughput columns
    rejected: int = 0  # malformed lines/records skipped (the good ones around them are kept)
    problems: list[str] = field(default_factory=list)  # what was rejected, for the log (first few)
    watermark: tuple[str, str] | None = None  # (watermark name, new value)
    # (cluster, scheduler, as of): `jobs` holds every job of that scope the scheduler still
    # knows, so a job the store has as PENDING or RUNNING that is not among them is gone (a pod
    # deleted between two listings) and is closed as of that time
    jobs_complete: tuple[str, str, datetime] | None = None


class SourceError(Exception):
    """A source could not run at all (target down, command missing). Reported, never fatal."""


class Source(Protocol):
    name: str

    def run(self, now: datetime) -> Iterable[Batch]:
        """Produce batches for everything new up to `now` (UTC, naive)."""
        ...
