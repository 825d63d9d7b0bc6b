"""The interface every collector source implements. What a run hands to the store is a
schema.Batch: the store's own input type, so the store needs nothing of the sources."""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Protocol

from gpufleet.collector.schema import Batch, Unrecognized


class SourceError(Exception):
    """A source could not run at all (target down, command missing). Reported, never fatal.
    `unrecognized`: the input that made it fail when it was there but not understood."""

    def __init__(self, message: str, unrecognized: list[Unrecognized] | None = None):
        super().__init__(message)
        self.unrecognized = list(unrecognized or [])


class Source(Protocol):
    name: str

    def run(self, now: datetime) -> Iterable[Batch]:
        """Produce batches for everything new up to `now` (UTC, naive)."""
        ...
