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
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.collector.schema import Batch, Unrecognized

from gpufleet.collector.sources.base import Source, SourceError
from gpufleet.collector.store import StoreWriter
from gpufleet.procs import wait_until_stopped
from gpufleet.times import utcnow

log = logging.getLogger(__name__)

UNRECOGNIZED_LOG_EVERY = 3600.0  # seconds between repeats of one unrecognized-input warning in the log


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
        self.target_rejected = Counter("gpufleet_collect_target_lines_rejected", "Malformed exposition lines skipped, per scrape target.", ["target"], registry=r)
        self.unrecognized = Counter(
            "gpufleet_collect_input_unrecognized",
            "Inputs the collector did not recognize (a target with no GPU series, an answer of an unknown shape, a pod "
            "name as Hostname, ...): also listed in the store's manifest and on the dashboard's Health page.",
            ["source", "input", "kind"], registry=r)
        self.facts = Gauge(
            "gpufleet_collect_facts",
            "The store's facts (its one derived tier): files listed (state=listed; grain=hour: an hour's 5-minute facts, "
            "grain=day: a day's hour and day facts) and those upkeep's last pass left to build (state=awaiting_build: a "
            "store from before the facts, or after a parameter change, gets them over its next passes, newest hours "
            "first, a day once all its hours are; `gpufleet collect --rebuild-facts` builds them all at once). Their "
            "windows are read from the raw samples meanwhile: the same figures, slower.",
            ["grain", "state"], registry=r)
        self.job_gpus_fallback = Gauge(
            "gpufleet_collect_jobs_gpus_fallback",
            "Slurm jobs whose GPU count did not come from accounting: gpus_source=slurmctld or job_map (ended jobs: "
            "accounting without gres/gpu in AccountingStorageTRES), unknown (any state: no source said it; their "
            "allocated GPU-hours are unknown). Fix: add gres/gpu to AccountingStorageTRES in slurm.conf.",
            ["cluster", "gpus_source"], registry=r)
        self.clock_skew = Counter(
            "gpufleet_collect_clock_skew",
            "Records dated more than max_future_skew after the collector's clock: samples and inventory/allocation "
            "observations (dropped) and jobs (kept).", ["source"], registry=r)


@dataclass
class ScheduledSource:
    source: Source
    interval: float


class Collector:
    """Runs the sources and commits what they produce.

    `max_future_skew`: how far after the collector's own clock a record may be dated. Samples
    (and inventory/allocation observations) dated later are dropped before the commit: a source
    whose clock runs ahead (a Prometheus, an exporter that stamps its own samples) would
    otherwise store rows "from the future" that the window arithmetic of the analytics cannot
    place and that would keep a GPU looking alive after it stopped reporting. Scraped rows carry
    the collector's own clock, so the check costs them nothing. Jobs dated later are kept (their
    other fields are right) but reported. All are counted in gpufleet_collect_clock_skew_total.
    """

    def __init__(self, writer: StoreWriter, sources: list[ScheduledSource], *, clock: Callable[[], datetime] = utcnow,
                 max_future_skew: timedelta = timedelta(minutes=5), shard: Any = None, accounting: bool = True,
                 fact_params: Any = None, tasks: Any = None):
        self.writer = writer
        # what upkeep's facts bake in (facts.FactParams; None: the defaults), and where a rebuild
        # of them runs (a TaskRunner on a Dask scheduler; None: here)
        self.fact_params, self.tasks = fact_params, tasks
        self.shard = shard  # gpufleet.collector.shard.Shard, or None: the store's only collector
        self.accounting = accounting  # this collector reads scheduler accounting (and runs the report and the policy)
        self.sources = sources
        self.clock = clock
        self.max_future_skew = max_future_skew
        self.metrics = CollectorMetrics()
        self._commit_lock = threading.Lock()
        self._targets: dict[str, set[str]] = {}  # source -> targets with series in the metrics
        self._rejected_seen: dict[str, int] = {}  # target -> its rejected_total already counted
        # Rows (and already-stored batches) since reset_recognized(): `--once` and `--backfill`
        # fail when nothing at all was recognized, since an empty store reporting success is a defect
        self.recognized = 0
        self.rejected_seen = 0
        self._unrecognized_logged: dict[tuple[str, str, str], tuple[float, str]] = {}  # -> (when logged, detail)
        self.unrecognized_seen: list[Unrecognized] = []  # since reset_recognized(), for that message
        self._job_gpus_counted = False  # gpufleet_collect_jobs_gpus_fallback set since start (count_job_gpu_sources)

    def reset_recognized(self) -> None:
        self.recognized = self.rejected_seen = 0
        self.unrecognized_seen = []

    def nothing_recognized(self) -> str | None:
        """Since reset_recognized(): why the run counts as failed when no row at all was stored
        and something came in that was not understood (None otherwise). A run that stored nothing
        because there was nothing (a quiet sacct window) is only warned about."""
        if self.recognized:
            return None
        if not self.unrecognized_seen and not self.rejected_seen:
            log.warning("no source stored a row: the sources returned no data for this run")
            return None
        first = "; ".join(f"{u.input} ({u.kind}): {u.detail}" for u in self.unrecognized_seen[:3])
        rejected = f"{self.rejected_seen} malformed entries rejected" if self.rejected_seen else ""
        return "nothing recognized, no row stored: " + "; ".join(filter(None, (first, rejected)))

    def report_unrecognized(self, source_name: str, entries: list[Unrecognized]) -> None:
        """Warn, count and record (in the store's manifest, published next) input not understood."""
        if not entries:
            return
        self._announce(source_name, entries)
        with self._commit_lock:
            self.writer.note_unrecognized(source_name, entries)

    def _announce(self, source_name: str, entries: list[Unrecognized]) -> None:
        """Count every one; log each (source, input, kind) when new, when its detail changes and
        then at most every UNRECOGNIZED_LOG_EVERY (a scrape target without GPU series would
        otherwise repeat the same warning every 15 s)."""
        now = time.monotonic()
        for u in entries:
            self.metrics.unrecognized.labels(source_name, u.input, u.kind).inc()
            key = (source_name, u.input, u.kind)
            last = self._unrecognized_logged.get(key)
            if last is None or last[1] != u.detail or now - last[0] >= UNRECOGNIZED_LOG_EVERY:
                self._unrecognized_logged[key] = (now, u.detail)
                log.warning("%s: input %s not recognized (%s): %s", source_name, u.input, u.kind, u.detail)
        self.unrecognized_seen += entries

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
            self._drop_future(source_name, batch)
            self._announce(source_name, batch.unrecognized)
            with self._commit_lock:
                result = self.writer.commit(batch)
                self.writer.note_unrecognized(source_name, batch.unrecognized)
                self.writer.publish()
            stored = (batch.samples.num_rows if batch.samples is not None else 0) + len(batch.jobs) + len(batch.gpus) + len(batch.allocations)
            self.recognized += stored  # a batch stored before (duplicate) was recognized all the same
            self.rejected_seen += batch.rejected
            m = self.metrics
            if result.duplicate or result.conflict:
                m.duplicates.labels(source_name).inc()
            if result.samples_written:
                m.rows.labels(source_name, "gpu_samples").inc(result.samples_written)
            if result.jobs_written:
                m.rows.labels(source_name, "jobs").inc(result.jobs_written)
                if not self._job_gpus_counted:  # at start; then upkeep counts (a scan of every job)
                    self.count_job_gpu_sources()
            if batch.rejected:
                m.rejected.labels(source_name).inc(batch.rejected)
                log.warning("%s: %d malformed entries skipped; first: %s", source_name, batch.rejected, "; ".join(batch.problems[:3]))
            written += result.samples_written + result.jobs_written
            if batch.watermark:
                self._set_lag(source_name, batch.watermark[1])
        return written

    def _drop_future(self, source_name: str, batch: Batch) -> None:
        """Enforce max_future_skew on `batch` in place (see the class docstring)."""
        limit = self.clock() + self.max_future_skew
        skewed = 0
        samples = batch.samples
        if samples is not None and samples.num_rows:
            ts = samples["ts"].cast(pa.timestamp("us"))
            latest = pc.max(ts).as_py()
            if latest is not None and latest > limit:
                future = pc.greater(ts, pa.scalar(limit, pa.timestamp("us")))
                dropped = samples.filter(future)
                batch.samples = samples.filter(pc.invert(future))
                n = dropped.num_rows
                hosts = sorted(set(dropped["host"].to_pylist()) - {None})
                ahead = (latest - (limit - self.max_future_skew)).total_seconds()
                named = ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
                batch.rejected += n
                batch.problems.insert(0, f"{n} samples dated up to {ahead:.0f} s in the future (clock skew on {named or 'the source'}?)")
                skewed += n
        for attr, what in (("gpus", "inventory"), ("allocations", "allocation")):
            rows = getattr(batch, attr)
            late = [o for o in rows if isinstance(o.get("ts"), datetime) and o["ts"] > limit]
            if late:
                setattr(batch, attr, [o for o in rows if not (isinstance(o.get("ts"), datetime) and o["ts"] > limit)])
                hosts = sorted({str(o.get("host")) for o in late})
                batch.problems.append(f"{len(late)} {what} observations dated in the future dropped (clock skew on {', '.join(hosts[:5])}?)")
                skewed += len(late)
        jobs: list[tuple[str, str, datetime]] = []  # (job key, column, time)
        for j in batch.jobs:
            # a pending job's start may be the scheduler's estimate, which is rightly in the future
            cols = ("end",) if j.get("state") == "PENDING" else ("start", "end")
            late = [(c, j[c]) for c in cols if isinstance(j.get(c), datetime) and j[c] > limit]
            if late:
                jobs.append((str(j.get("job_key")), *max(late, key=lambda x: x[1])))
        if jobs:
            ahead = (max(t for *_, t in jobs) - (limit - self.max_future_skew)).total_seconds()
            first = "; ".join(f"job {k} {c}={t.isoformat()}" for k, c, t in jobs[:3])
            msg = f"{len(jobs)} jobs dated up to {ahead:.0f} s in the future, kept (clock skew on the scheduler?); {first}"
            batch.problems.append(msg)
            log.warning("%s: %s", source_name, msg)
            skewed += len(jobs)
        if skewed:
            self.metrics.clock_skew.labels(source_name).inc(skewed)

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
            self.report_unrecognized(name, e.unrecognized)
            if e.unrecognized:
                with self._commit_lock:
                    self.writer.publish()
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
        self._report_targets(source)
        return ok

    def _report_targets(self, source: Any) -> None:
        """Per-target series of a scrape source; the series of targets it no longer has go."""
        m = self.metrics
        status = getattr(source, "status", {})
        totals = getattr(source, "rejected_total", {})
        for target in self._targets.get(source.name, set()) - set(status):
            m.target_up.remove(target)
            m.target_rejected.remove(target)
            self._rejected_seen.pop(target, None)
        self._targets[source.name] = set(status)
        for target, st in status.items():
            m.target_up.labels(target).set(1 if st.up else 0)
            total = totals.get(target, 0)
            m.target_rejected.labels(target).inc(max(0, total - self._rejected_seen.get(target, 0)))  # inc(0) exports the series
            self._rejected_seen[target] = total

    def run_once(self) -> bool:
        """Every source once, in order; True if all succeeded."""
        results = [self.run_source(s.source) for s in self.sources]
        return all(results)

    def record_policy(self, rows: list[dict[str, Any]]) -> int:
        """Append the idle-GPU policy's audit rows through the one writer and publish them."""
        with self._commit_lock:
            n = self.writer.record_policy(rows)
            self.writer.publish()
        return n

    def maintain(self, raw_days: int, facts_5m_days: int = 35, facts_days: int = 400) -> None:
        """Compaction, facts, settling and retention; holds the commit lock (one writer). Never raises."""
        from gpufleet.collector.maintenance import apply_retention, compact, settle

        t0 = time.monotonic()
        try:
            with self._commit_lock:
                now = self.clock()
                compact(self.writer, now, self.fact_params, self.tasks)
                settle(self.writer, now)
                apply_retention(self.writer, now, raw_days, facts_5m_days, facts_days)
            ok = True
        except Exception:  # noqa: BLE001 - upkeep failing must not stop collection
            log.exception("store maintenance failed")
            ok = False
        self.metrics.duration.labels("maintenance").set(time.monotonic() - t0)
        self.metrics.success.labels("maintenance").set(1 if ok else 0)
        self.count_facts()
        self.count_job_gpu_sources()  # the job mapping fills GPU counts between job reads

    def count_job_gpu_sources(self) -> None:
        """gpufleet_collect_jobs_gpus_fallback from the store's jobs as they stand: after the
        first job batch, then with each upkeep (it reads every job: ~0.3 s at 2M of them)."""
        with self._commit_lock:
            counts = self.writer.job_gpus_fallbacks()
            self._job_gpus_counted = True
        for (cluster, source), n in counts.items():
            self.metrics.job_gpus_fallback.labels(cluster, source).set(n)

    def count_facts(self) -> None:
        """gpufleet_collect_facts from the writer's facts and what upkeep left of them."""
        with self._commit_lock:
            listed = {"hour": sum(e["grain"] == "5m" and "upto" not in e for e in self.writer.facts.values()),  # (whole hours)
                      "day": sum(e["grain"] == "day" for e in self.writer.facts.values())}
            left = {"hour": self.writer.facts_backlog.get("hours", 0), "day": self.writer.facts_backlog.get("days", 0)}
        for grain in ("hour", "day"):
            self.metrics.facts.labels(grain, "listed").set(listed[grain])
            self.metrics.facts.labels(grain, "awaiting_build").set(left[grain])

    def rebuild_facts(self, span: tuple[datetime, datetime] | None = None) -> dict[str, int]:
        """Compact what is due, then build the facts of the hours and days overlapping `span`
        (None: all) again from the samples, with upkeep's parameters: `gpufleet collect
        --rebuild-facts`. Returns how many hour and day files were written."""
        from gpufleet.collector import facts
        from gpufleet.collector.maintenance import compact_hours, rebuild_facts

        with self._commit_lock:
            now = self.clock()
            compact_hours(self.writer, now)
            return rebuild_facts(self.writer, now, self.fact_params or facts.FactParams(), span, self.tasks)

    def serve(self, stop: threading.Event, *, jitter_fraction: float = 0.1, maintenance_interval: float | None = 600.0,
              raw_days: int = 35, facts_5m_days: int = 35, facts_days: int = 400, extra_jobs: Iterable[Callable[[Any, Any], None]] = ()) -> None:
        """Run every source on its schedule, store upkeep every `maintenance_interval` seconds, and
        each of `extra_jobs` (a callable add(scheduler, collector) that adds its own job, e.g. the
        weekly report, the idle-GPU policy), until `stop`."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        extra_jobs = list(extra_jobs)
        workers = max(2, len(self.sources) + len(extra_jobs) + 1)
        scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(workers)}, timezone="UTC")
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
        if maintenance_interval:
            scheduler.add_job(self.maintain, "interval", args=[raw_days, facts_5m_days, facts_days], seconds=maintenance_interval,
                              id="maintenance", max_instances=1, coalesce=True, misfire_grace_time=int(maintenance_interval))
        for add in extra_jobs:
            add(scheduler, self)
        scheduler.start()
        log.info("collector running %d sources: %s", len(self.sources), ", ".join(f"{s.source.name} every {s.interval:g}s" for s in self.sources))
        try:
            wait_until_stopped(stop)
        finally:
            scheduler.shutdown(wait=True)
            with self._commit_lock:
                self.writer.close()
