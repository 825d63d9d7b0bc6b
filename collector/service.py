"""The collector service: sources on their own schedules, one writer, its own /metrics.

APScheduler runs each source on an interval with jitter; `max_instances=1` keeps runs of one
source from overlapping and `coalesce` folds missed runs into one. Sources fetch concurrently
but commits are serialized, because the store has exactly one writer. A failing source is
logged and reported in the metrics; it never stops the others or the service.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from collector.sources.base import Batch, Source, SourceError
from collector.store import StoreWriter

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.success = Gauge("gpufleet_collect_source_success", "1 if the source's last run succeeded.", ["source"], registry=r)
        self.duration = Gauge("gpufleet_collect_source_duration_seconds", "Duration of the source's last run.", ["source"], registry=r)
        self.last_success = Gauge("gpufleet_collect_source_last_success_timestamp_seconds", "Unix time of the last successful run.", ["source"], registry=r)
        self.lag = Gauge("gpufleet_collect_source_lag_seconds", "How far the source's data lags now (watermark or last success).", ["source"], registry=r)
        self.rows = Counter("gpufleet_collect_rows_written", "Rows committed to the store.", ["source", "table"], registry=r)
        self.rejected = Counter("gpufleet_collect_rows_rejected", "Malformed lines or records skipped (good rows around them kept).", ["source"], registry=r)
        self.duplicates = Counter("gpufleet_collect_batches_duplicate", "Batches skipped because the same window was already stored.", ["source"], registry=r)
        self.failures = Counter("gpufleet_collect_source_failures", "Source runs that failed.", ["source"], registry=r)
        self.target_up = Gauge("gpufleet_collect_target_up", "1 if the scrape target answered the last round.", ["target"], registry=r)


@dataclass
class ScheduledSource:
    source: Source
    interval: float


class Collector:
    def __init__(self, writer: StoreWriter, sources: list[ScheduledSource], *, clock: Callable[[], datetime] = utcnow):
        self.writer = writer
        self.sources = sources
        self.clock = clock
        self.metrics = CollectorMetrics()
        self._commit_lock = threading.Lock()

    def _watermark_kwargs(self, source: Any) -> dict[str, Any]:
        name = getattr(source, "watermark_name", None)
        if not name:
            return {}
        with self._commit_lock:
            return {"watermark": self.writer.watermark(name)}

    def commit(self, source_name: str, batches: Iterable[Batch]) -> int:
        """Commit batches one by one (each whole or not at all) and publish; returns rows written."""
        written = 0
        for batch in batches:
            with self._commit_lock:
                result = self.writer.commit(batch)
                self.writer.publish()
            m = self.metrics
            if result.duplicate or result.conflict:
                m.duplicates.labels(source_name).inc()
            if result.samples_written:
                m.rows.labels(source_name, "gpu_samples").inc(result.samples_written)
            if result.jobs_written:
                m.rows.labels(source_name, "jobs").inc(result.jobs_written)
            if batch.rejected:
                m.rejected.labels(source_name).inc(batch.rejected)
                log.warning("%s: %d malformed entries skipped; first: %s", source_name, batch.rejected, "; ".join(batch.problems[:3]))
            written += result.samples_written + result.jobs_written
            if batch.watermark:
                self._set_lag(source_name, batch.watermark[1])
        return written

    def _set_lag(self, source_name: str, watermark: str) -> None:
        try:
            lag = (self.clock() - datetime.fromisoformat(watermark)).total_seconds()
        except ValueError:
            return
        self.metrics.lag.labels(source_name).set(max(0.0, lag))

    def run_source(self, source: Source) -> bool:
        """One run of one source; never raises."""
        name = source.name
        t0 = time.monotonic()
        now = self.clock()
        try:
            self.commit(name, source.run(now, **self._watermark_kwargs(source)))
            ok = True
        except SourceError as e:
            log.error("source %s failed: %s", name, e)
            ok = False
        except Exception:  # noqa: BLE001 - a source bug must not stop the service
            log.exception("source %s failed unexpectedly", name)
            ok = False
        m = self.metrics
        m.duration.labels(name).set(time.monotonic() - t0)
        m.success.labels(name).set(1 if ok else 0)
        if ok:
            m.last_success.labels(name).set(time.time())
            if not getattr(source, "watermark_name", None):
                m.lag.labels(name).set(0)
        else:
            m.failures.labels(name).inc()
        for target, status in getattr(source, "status", {}).items():
            m.target_up.labels(target).set(1 if status.up else 0)
        return ok

    def run_once(self) -> bool:
        """Every source once, in order; True if all succeeded."""
        results = [self.run_source(s.source) for s in self.sources]
        return all(results)

    def serve(self, stop: threading.Event, *, jitter_fraction: float = 0.1) -> None:
        """Run every source on its schedule until `stop` is set."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(max(2, len(self.sources)))}, timezone="UTC")
        for s in self.sources:
            scheduler.add_job(
                self.run_source,
                "interval",
                args=[s.source],
                seconds=s.interval,
                jitter=max(0.0, s.interval * jitter_fraction),
                id=s.source.name,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(s.interval)),
                next_run_time=datetime.now(timezone.utc),
            )
        scheduler.start()
        log.info("collector running %d sources: %s", len(self.sources), ", ".join(f"{s.source.name} every {s.interval:g}s" for s in self.sources))
        try:
            stop.wait()
        finally:
            scheduler.shutdown(wait=True)
            with self._commit_lock:
                self.writer.close()
