"""Read GPU metrics from Prometheus, Thanos, Mimir or VictoriaMetrics over the HTTP query API.

For sites whose metrics already live in a TSDB. Windows are read in chunks aligned to multiples
of `chunk_seconds` since the epoch, so the same window always has the same batch key (re-reading
it is a no-op). A chunk is read only once it is older than `lag_seconds`, so it is complete.

Raw samples, not resampled ones: `query_range` evaluates on a step grid with lookback, which
invents values between scrapes and moves timestamps. An *instant* query of a range selector,
`{__name__=~"..."}[<chunk>s]` at the chunk's end, returns every stored sample with its real
timestamp, which is what the store keeps. Every Prometheus-compatible API answers it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Iterator

import httpx

from gpufleet.collector.exposition_parse import JOB_REPORT_METRICS, parse_rows, samples_table
from gpufleet.collector.schema import METRIC_TO_COLUMN, NVIDIA_SMI_INDEX, NVIDIA_SMI_INFO, NVIDIA_SMI_PREFIX, SAMPLE_SCHEMA
from gpufleet.collector.schema import Batch
from gpufleet.collector.sources.base import SourceError
from gpufleet.exposition import Family, render

log = logging.getLogger(__name__)

# What to fetch: every metric the canonical schema reads (nvidia_gpu_exporter's with the series
# that name its GPUs), plus the job mapping and job reports.
DEFAULT_METRICS = tuple(sorted({m for m in METRIC_TO_COLUMN if m.startswith(("DCGM_", "gpufleet_", NVIDIA_SMI_PREFIX))}
                               | {"gpufleet_gpu_job_info", *JOB_REPORT_METRICS, NVIDIA_SMI_INDEX, NVIDIA_SMI_INFO}))


def _epoch(dt: datetime) -> float:
    return dt.replace(tzinfo=timezone.utc).timestamp()


def _from_epoch(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None)


@dataclass
class PrometheusApiSource:
    url: str
    cluster: str
    chunk_seconds: int = 900
    lag_seconds: int = 120
    initial_lookback_seconds: int = 86400
    timeout: float = 60.0
    metrics: tuple[str, ...] = DEFAULT_METRICS
    selector: str = ""  # extra label matchers, e.g. 'cluster="a"'
    headers: dict[str, str] = field(default_factory=dict)
    name: str = "prometheus"

    @property
    def watermark_name(self) -> str:
        return f"prometheus:{self.cluster}"

    def chunks(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
        """Aligned chunks (lo, hi] covering (start, end]; the first may start before `start`."""
        c = self.chunk_seconds
        t = int(_epoch(start) // c * c)
        stop = _epoch(end)
        while t + c <= stop:
            yield _from_epoch(t), _from_epoch(t + c)
            t += c

    def pending(self, now: datetime, watermark: str | None) -> list[tuple[datetime, datetime]]:
        start = datetime.fromisoformat(watermark) if watermark else now - timedelta(seconds=self.initial_lookback_seconds)
        return list(self.chunks(start, now - timedelta(seconds=self.lag_seconds)))

    def run(self, now: datetime, watermark: str | None = None) -> Iterable[Batch]:
        for start, end in self.pending(now, watermark):
            yield self.read_window(start, end)

    def backfill_windows(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        return list(self.chunks(start, end))

    def read_window(self, start: datetime, end: datetime) -> Batch:
        names = "|".join(self.metrics)
        matchers = f'__name__=~"{names}"' + (f",{self.selector}" if self.selector else "")
        query = f"{{{matchers}}}[{int((end - start).total_seconds())}s]"
        try:
            r = httpx.post(
                self.url.rstrip("/") + "/api/v1/query",
                data={"query": query, "time": f"{_epoch(end):.3f}"},
                headers=self.headers,
                timeout=self.timeout,
            )
        except httpx.HTTPError as e:
            raise SourceError(f"Prometheus API {self.url} unreachable: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise SourceError(f"Prometheus API {self.url} answered HTTP {r.status_code}: {r.text[:300]}")
        try:
            doc = r.json()
            series = doc["data"]["result"] if doc.get("status") == "success" else None
        except (ValueError, KeyError, TypeError):
            series = None
        if series is None:
            raise SourceError(f"Prometheus API {self.url}: unexpected answer: {r.text[:300]}")
        return self._to_batch(series, start, end)

    def _to_batch(self, series: list[dict], start: datetime, end: datetime) -> Batch:
        """Group raw samples by (instance, timestamp) - one scrape - and parse each like a scrape."""
        scrapes: dict[tuple[str, float], dict[str, Family]] = {}
        lo = _epoch(start)
        for s in series:
            labels = dict(s.get("metric", {}))
            name = labels.pop("__name__", "")
            instance = labels.get("instance", "")
            for t, v in s.get("values", []):
                if float(t) <= lo:
                    continue  # chunks are (start, end]; Prometheus 2.x ranges also include start
                fams = scrapes.setdefault((instance, float(t)), {})
                fam = fams.setdefault(name, Family(name, "gauge", ""))
                fam.add(tuple(labels.items()), float(v))
        parts, gpus, allocations, throughput, rejected, problems = [], [], [], [], 0, []
        for (instance, t), fams in sorted(scrapes.items()):
            parsed = parse_rows(
                render(fams.values()).decode(), ts=_from_epoch(t), cluster=self.cluster, target=instance, source="prometheus"
            )
            parts.append(parsed)
            gpus += parsed.gpus
            allocations += parsed.allocations
            throughput += parsed.throughput
            rejected += parsed.rejected
            problems += parsed.problems[:3]
        return Batch(
            key=f"prometheus:{self.cluster}:{start.isoformat()}:{end.isoformat()}",
            samples=samples_table(parts) if parts else SAMPLE_SCHEMA.empty_table(),  # one table for the window, as scrape.py
            gpus=gpus,
            allocations=allocations,
            throughput=throughput,
            rejected=rejected,
            problems=problems,
            watermark=(self.watermark_name, end.isoformat()),
        )
