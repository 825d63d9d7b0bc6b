"""Every read of raw samples the analytics make, counted: what read them, the time range asked, rows.

Figures come from the store's facts (analytics/facts.py); raw samples are read only where the facts cannot answer (KINDS):
the minutes a window edge cuts out of a 5-minute bucket (FactWindow, "edge"), a job's per-sample states (states.job_breakdown,
"job states"), the events inside a part where a health counter rises and the GPUs whose health moved after the newest facts
(health, "health events"), foreign processes (health), Fleet now's samples after the newest facts ("fleet now"), the newest
sample of a GPU gone quiet within the facts ("fleet now newest"), the last XIDs of Fleet now's forget window without facts
("fleet now xids"), and the tests' oracle (tests/support/gputime.py, "raw path"). Each goes through `read`, which notes it
in READS, a small counter always on (totals per kind, the latest reads kept), so a test can assert that no surface falls back
to reading a window's samples (tests/test_raw_reads.py). Nothing happens at import beyond making the empty counter.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from gpufleet.collector.reading import query_rows
from gpufleet.collector.store import samples_between

KINDS = ("edge", "raw path", "job states", "health events", "foreign processes", "fleet now", "fleet now newest", "fleet now xids")


@dataclass(frozen=True)
class Read:
    """One read: its kind (KINDS), the time range asked [lo_us, hi_us) in epoch microseconds
    (None: unbounded on that side) and the rows it answered."""

    kind: str
    lo_us: int | None
    hi_us: int | None
    rows: int

    @property
    def span_us(self) -> int | None:
        return None if self.lo_us is None or self.hi_us is None else self.hi_us - self.lo_us


class RawReads:
    """Totals per kind (reads, rows, microseconds asked) since the start, and the latest `keep`
    reads themselves; `mark` and `since` give the reads between two points."""

    def __init__(self, keep: int = 4096):
        self._lock = threading.Lock()
        self._latest: deque[tuple[int, Read]] = deque(maxlen=keep)
        self.count = 0  # reads noted since the start
        self.totals: dict[str, dict[str, int]] = {}

    def note(self, kind: str, lo_us: int | None, hi_us: int | None, rows: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind of raw read {kind!r}: expected one of {', '.join(KINDS)}")
        r = Read(kind, lo_us, hi_us, rows)
        with self._lock:
            self.count += 1
            self._latest.append((self.count, r))
            t = self.totals.setdefault(kind, {"reads": 0, "rows": 0, "us": 0})
            t["reads"] += 1
            t["rows"] += rows
            t["us"] += r.span_us or 0

    def mark(self) -> int:
        """A point to ask `since` from."""
        return self.count

    def since(self, mark: int) -> list[Read]:
        """The reads after `mark`, oldest first; an error if more were made than are kept."""
        with self._lock:
            if self.count - mark > (self._latest.maxlen or 0):
                raise RuntimeError(f"{self.count - mark} raw reads since the mark, more than the {self._latest.maxlen} kept")
            return [r for n, r in self._latest if n > mark]


READS = RawReads()


# In a query read here: the samples of the read's days (collector.store.samples_between), not the
# gpu_samples view, over which DuckDB opens the footer of every sample file of the store
SAMPLES = "{samples}"


def read(con: duckdb.DuckDBPyConnection, kind: str, query: str, params: dict[str, Any] | None,
         lo_us: int | None, hi_us: int | None, reach_us: int = 0) -> pa.Table:
    """`query` (one that reads gpu_samples, or SAMPLES: the files of the days of [lo_us - reach_us,
    hi_us), the rows its WHERE reads) on `con`, its answer counted in READS as a read of `kind`
    over [lo_us, hi_us)."""
    if SAMPLES in query:
        if lo_us is None or hi_us is None:
            raise ValueError(f"a read of {kind} over {SAMPLES} needs its time range: got [{lo_us}, {hi_us})")
        query = query.replace(SAMPLES, samples_between(con, lo_us - reach_us, hi_us))
    t = query_rows(con, query, params)
    READS.note(kind, lo_us, hi_us, t.num_rows)
    return t
