"""Read GPU metrics from Prometheus, Thanos, Mimir or VictoriaMetrics over the HTTP query API.

For sites whose metrics already live in a TSDB. Windows are read in chunks aligned to multiples
of `chunk_seconds` since the epoch, so the same window always has the same batch key (re-reading
it is a no-op). A chunk is read only once it is older than `lag_seconds`, so it is complete.

Raw samples, not resampled ones: `query_range` evaluates on a step grid with lookback, which
invents values between scrapes and moves timestamps. An *instant* query of a range selector,
`{__name__=~"..."}[<chunk>s]` at the chunk's end, returns every stored sample with its real
timestamp, which is what the store keeps. Every Prometheus-compatible API answers it. It is
evaluated 1 ms after the chunk's end over a range 1 ms longer, keeping the samples in (start, end]:
whether a range is closed at its start (Prometheus 2.x) or not (3.x, VictoriaMetrics) then does
not matter, and VictoriaMetrics 1.79's miss of a sample at exactly midnight UTC is avoided. An answer
of resultType "vector" (a proxy, or an older Thanos or VictoriaMetrics, that rewrote the query
into an instant one) holds one sample per series: it is stored, and reported as unrecognized
input, since most of the window's samples are then missing. Any other shape fails the chunk.

Chunks are read in parallel (read_windows): each as `gpu_shards` queries, one per shard of the
targets (instance_shard), up to `parallel_requests` in flight, the next chunks read while one is
parsed; a chunk's batch is built from the union of its shards' answers, the batch one query gives.

A backfill reads whole chunks that are complete (older than `lag_seconds`); the chunks of the
window it cannot read yet are named, with when they can be (skipped_windows).
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Iterator

import httpx

from gpufleet.collector.exposition_parse import (
    GPUFLEET_BUILD_INFO, JOB_REPORT_METRICS, JOB_SHARE_METRICS, PRECEDENCE_WITHIN_S, merge_exporters, parse_rows, samples_table,
)
from gpufleet.collector.schema import METRIC_TO_COLUMN, NVIDIA_SMI_INDEX, NVIDIA_SMI_INFO, NVIDIA_SMI_PREFIX, SAMPLE_SCHEMA, empty_table
from gpufleet.collector.config import GPU_SHARDS, GPU_SHARDS_MAX, PARALLEL_REQUESTS
from gpufleet.collector.schema import Batch, Unrecognized
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.scrape import no_gpu_rows
from gpufleet.exposition import Family, render
from gpufleet.times import utcnow

log = logging.getLogger(__name__)

# What to fetch: every metric the canonical schema reads (nvidia_gpu_exporter's with the series
# that name its GPUs), plus the job mapping, job reports and the gpufleet exporter's build info
# (which tells its samples from dcgm-exporter's: PRECEDENCE).
DEFAULT_METRICS = tuple(sorted({m for m in METRIC_TO_COLUMN if m.startswith(("DCGM_", "gpufleet_", NVIDIA_SMI_PREFIX))}
                               | {"gpufleet_gpu_job_info", GPUFLEET_BUILD_INFO, *JOB_REPORT_METRICS, *JOB_SHARE_METRICS, NVIDIA_SMI_INDEX, NVIDIA_SMI_INFO}))


# The GPU shards of a window: a target's shard is decided by the last character of its host, the
# `instance` label up to its first ":" ("gpu-node-17:9400" -> "7"), so every exporter of one host
# is in one shard and adding a target moves no other. Digits and letters (either case) are dealt
# round-robin over the shards in this order; any other character, and an instance that is empty,
# missing or starts with ":", is in shard 0. instance_shard_regex is the same rule as a label
# matcher (RE2, fully anchored, as Prometheus, Thanos, Mimir and VictoriaMetrics match): it
# matches exactly the instances instance_shard puts in its shard, so the shards are a partition.
_SHARD_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"  # GPU_SHARDS_MAX of them


def instance_shard(instance: str, shards: int) -> int:
    """The GPU shard (0 .. shards-1) of a series with this `instance` label ("" when it has none)."""
    host = instance.split(":", 1)[0]
    i = _SHARD_CHARS.find(host[-1].lower()) if host and host[-1].isascii() else -1
    return i % shards if i >= 0 else 0


@functools.lru_cache(maxsize=None)
def instance_shard_regex(shard: int, shards: int) -> str:
    """The regular expression an `instance=~` matcher uses to select GPU shard `shard` of `shards`."""
    def chars(k: int) -> str:
        return "".join(c + c.upper() if c.isalpha() else c for i, c in enumerate(_SHARD_CHARS) if i % shards == k)

    rest = "(:(?s:.*))?"  # the port and anything after it
    if shard:
        return f"[^:]*[{chars(shard)}]{rest}"
    others = "".join(chars(k) for k in range(1, shards))
    return f"([^:]*[^:{others}])?{rest}"


def shard_matchers(shards: int) -> list[str]:
    """The label matcher to add to a query per GPU shard ("" for one shard: no matcher)."""
    if shards == 1:
        return [""]
    return [f',instance=~"{instance_shard_regex(k, shards)}"' for k in range(shards)]


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
    parallel_requests: int = PARALLEL_REQUESTS  # queries in flight at once (1: one after the other)
    gpu_shards: int = GPU_SHARDS  # queries per window, each for one shard of the targets (instance_shard)
    # (k, n): read only the targets of shard k (0-based) of n by the same rule: a collector shard's
    # share ([collector] shard = "k+1/n"); None: every target
    part: tuple[int, int] | None = None
    metrics: tuple[str, ...] = DEFAULT_METRICS
    selector: str = ""  # extra label matchers, e.g. 'cluster="a"'
    headers: dict[str, str] = field(default_factory=dict)
    name: str = "prometheus"
    clock: Callable[[], datetime] = utcnow  # naive UTC; what "complete" is measured against
    # its reads need only these settings, so a backfill may run them as Dask tasks (gpufleet.collector.backfill)
    reads_anywhere = True

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
        yield from self.read_windows(self.pending(now, watermark))

    def backfill_windows(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        """The whole chunks in (start, end] that are complete now. An incomplete chunk read now
        would be stored under its key and the rest of it never read (a second read is a duplicate)."""
        ready = self.clock() - timedelta(seconds=self.lag_seconds)
        return [(lo, hi) for lo, hi in self.chunks(start, end) if hi <= ready]

    def skipped_windows(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime, datetime]]:
        """(chunk start, chunk end, when it can be read) of the chunks overlapping (start, end]
        that backfill_windows leaves out: not complete yet, or only partly inside the window."""
        read = set(self.backfill_windows(start, end))
        c = self.chunk_seconds
        t = int(_epoch(start) // c * c)
        out = []
        while t < _epoch(end):
            lo, hi = _from_epoch(t), _from_epoch(t + c)
            if (lo, hi) not in read:
                out.append((lo, hi, hi + timedelta(seconds=self.lag_seconds)))
            t += c
        return out

    def __post_init__(self) -> None:
        if self.part is not None and not (1 <= self.part[1] <= GPU_SHARDS_MAX and 0 <= self.part[0] < self.part[1]):
            raise ValueError(f"part must be (k, n) with 0 <= k < n <= {GPU_SHARDS_MAX}, not {self.part}")
        if not 1 <= self.gpu_shards <= GPU_SHARDS_MAX or self.parallel_requests < 1:
            raise ValueError(f"gpu_shards must be 1..{GPU_SHARDS_MAX} and parallel_requests >= 1, "
                             f"not {self.gpu_shards} and {self.parallel_requests}")

    def read_window(self, start: datetime, end: datetime) -> Batch:
        batches = self.read_windows([(start, end)])
        try:
            return next(batches)
        finally:
            batches.close()

    def read_windows(self, windows: Iterable[tuple[datetime, datetime]]) -> Iterator[Batch]:
        """One batch per window (lo, hi], in order. Each window is read as `gpu_shards` queries
        (one per shard of the targets, instance_shard_regex), up to `parallel_requests` of them
        in flight at once, reading ahead while the window before is parsed; a window's batch is
        built from the union of its shards' answers, so it is the batch one query would give. A
        failing query fails its window (SourceError, raised when that window's turn comes): the
        windows before it are yielded, none after. parallel_requests = 1: one query at a time."""
        windows = list(windows)
        shards = shard_matchers(self.gpu_shards)
        workers = max(1, min(self.parallel_requests, len(windows) * len(shards)))
        with httpx.Client(headers=self.headers, timeout=self.timeout,
                          limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers)) as client:
            if workers == 1:  # sequential: each query answered before the next is sent
                for lo, hi in windows:
                    yield self._assemble([self._answer(self._fetch(client, lo, hi, k), k) for k in range(len(shards))], lo, hi)
                return
            pool = ThreadPoolExecutor(workers, thread_name_prefix="prometheus-api")
            queued: deque[tuple[datetime, datetime, list[Future]]] = deque()
            todo = iter(windows)
            ahead = -(-workers // len(shards))  # windows in flight while one is parsed: every worker busy

            def submit() -> None:
                for lo, hi in todo:
                    queued.append((lo, hi, [pool.submit(self._fetch, client, lo, hi, k) for k in range(len(shards))]))
                    return

            try:
                for _ in range(ahead):
                    submit()
                while queued:
                    lo, hi, futures = queued.popleft()
                    # the first failing shard fails the window; the answers are decoded here, not in the
                    # workers: threads decoding JSON at once fight over the GIL (+10-30% CPU measured)
                    answers = [self._answer(f.result(), k) for k, f in enumerate(futures)]
                    submit()
                    yield self._assemble(answers, lo, hi)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)

    def _query(self, start: datetime, end: datetime, shard: int) -> str:
        names = "|".join(self.metrics)
        matchers = f'__name__=~"{names}"' + (f",{self.selector}" if self.selector else "")
        matchers += shard_matchers(self.gpu_shards)[shard]
        if self.part is not None and self.part[1] > 1:
            matchers += f',instance=~"{instance_shard_regex(*self.part)}"'
        # evaluated 1 ms after the chunk's end over a range 1 ms longer, the answer's samples outside
        # (start, end] dropped in _to_batch: VictoriaMetrics 1.79 does not return a sample stamped
        # exactly at the query time when that is midnight UTC and the series is new that day
        return f"{{{matchers}}}[{round((end - start).total_seconds() * 1000) + 1}ms]"

    def _where(self, shard: int) -> str:
        return (self.url + (f" (collector shard {self.part[0] + 1}/{self.part[1]})" if self.part else "")
                + (f" (GPU shard {shard + 1}/{self.gpu_shards})" if self.gpu_shards > 1 else ""))

    def _fetch(self, client: httpx.Client, start: datetime, end: datetime, shard: int) -> httpx.Response:
        """The answer to one shard's query for (start, end]; SourceError when there is none or it is an HTTP error."""
        where = self._where(shard)
        try:
            r = client.post(self.url.rstrip("/") + "/api/v1/query",
                            data={"query": self._query(start, end, shard), "time": f"{_epoch(end) + 0.001:.3f}"})
        except httpx.HTTPError as e:
            raise SourceError(f"Prometheus API {where} unreachable: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            # VictoriaMetrics echoes the (long) query first and says what is wrong at the end
            text = r.text if len(r.text) <= 600 else f"{r.text[:200]} ... {r.text[-300:]}"
            raise SourceError(f"Prometheus API {where} answered HTTP {r.status_code}: {text}")
        return r

    def _answer(self, r: httpx.Response, shard: int) -> tuple[str, list[dict]]:
        """(resultType, series) of one shard's answer; SourceError when it is not a matrix or a
        vector, or holds a series of another shard (a server or proxy that dropped the matcher)."""
        where = self._where(shard)
        try:
            doc = r.json()
            data = doc["data"] if doc.get("status") == "success" else None
            series, kind = data["result"], data.get("resultType", "matrix")
            if not isinstance(series, list):
                series = None
        except (ValueError, KeyError, TypeError, AttributeError):
            series, kind = None, None
        if series is None or kind not in ("matrix", "vector"):
            what = f"resultType {kind!r}" if series is not None else "not a Prometheus API answer"
            raise SourceError(f"Prometheus API {where}: unexpected answer ({what}): {r.text[:300]}",
                              [Unrecognized(self.url, "unknown_answer", f"{what}: {r.text[:200]}")])
        if self.gpu_shards > 1 or self.part is not None:
            for s in series:
                instance = str(s.get("metric", {}).get("instance", "")) if isinstance(s, dict) else ""
                if self.part is not None and instance_shard(instance, self.part[1]) != self.part[0]:
                    raise SourceError(
                        f"Prometheus API {where}: answered a series of instance {instance!r}, which is another collector shard's "
                        f"(the server or a proxy ignored the matcher instance=~{instance_shard_regex(*self.part)!r}?)",
                        [Unrecognized(self.url, "unknown_answer", f"series of another collector shard: instance {instance!r}")])
                if self.gpu_shards > 1 and instance_shard(instance, self.gpu_shards) != shard:
                    raise SourceError(
                        f"Prometheus API {where}: answered a series of instance {instance!r}, which is not in this shard "
                        f"(the server or a proxy ignored the matcher instance=~{instance_shard_regex(shard, self.gpu_shards)!r}?)",
                        [Unrecognized(self.url, "unknown_answer", f"series of another GPU shard: instance {instance!r}")])
        return kind, series

    def _assemble(self, answers: list[tuple[str, list[dict]]], start: datetime, end: datetime) -> Batch:
        """The window's batch from its shards' answers (one answer: the unsharded query's)."""
        unrecognized, series = [], []
        lo, hi = _epoch(start), _epoch(end)
        vector_series = vector_kept = 0
        for kind, part in answers:
            if kind == "vector":  # one sample per series, at its own time: keep it, say what is missing
                # an instant vector is stamped with the evaluation time (1 ms after the chunk), not
                # the sample's: it stands for the chunk's end
                part = [{"metric": s.get("metric", {}), "values": [[min(float(s["value"][0]), hi), s["value"][1]]] if s.get("value") else []}
                        for s in part]
                vector_series += len(part)
                vector_kept += sum(1 for s in part if s["values"] and s["values"][0][0] > lo)  # _to_batch keeps (lo, hi]
            series += part
        if vector_series:
            stored = (f"only the latest sample of each series was stored, for {vector_kept} of its {vector_series} series"
                      if vector_kept else f"nothing was stored: none of its {vector_series} series had a sample inside the window")
            unrecognized.append(Unrecognized(self.url, "vector_answer", (
                f"the range query for {start.isoformat()}..{end.isoformat()} was answered with a vector (a proxy or an older "
                f"Thanos/VictoriaMetrics rewrote it?): {stored}")))
        # one order whatever the server's or the shards': the batch does not depend on how it was read
        series.sort(key=lambda s: sorted((str(k), str(v)) for k, v in s.get("metric", {}).items()))
        batch = self._to_batch(series, start, end)
        if not series:
            unrecognized.append(Unrecognized(self.url, "empty_answer", (
                f"no series of the {len(self.metrics)} metrics asked for in {start.isoformat()}..{end.isoformat()}"
                + (f" with {self.selector}" if self.selector else "") + ": nothing there, or other metric names")))
        batch.unrecognized[:0] = unrecognized
        return batch

    def _to_batch(self, series: list[dict], start: datetime, end: datetime) -> Batch:
        """Group raw samples by (instance, timestamp) - one scrape - and parse each like a scrape."""
        scrapes: dict[tuple[str, float], dict[str, Family]] = {}
        lo, hi = _epoch(start), _epoch(end)
        for s in series:
            labels = dict(s.get("metric", {}))
            name = labels.pop("__name__", "")
            instance = labels.get("instance", "")
            key = tuple(labels.items())  # the series' labels, the same at every sample
            for t, v in s.get("values", []):
                t = float(t)
                if not lo < t <= hi:
                    continue  # chunks are (start, end]; Prometheus 2.x ranges also include start
                fams = scrapes.get((instance, t))
                if fams is None:
                    fams = scrapes[instance, t] = {}
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = Family(name, "gauge", "")
                fam.samples.append((key, float(v)))
        parts, times, gpus, allocations, throughput, checkpoints, shares, rejected, problems = [], [], [], [], [], [], [], 0, []
        unrecognized: dict[tuple[str, str], Unrecognized] = {}  # one per instance and kind in a chunk
        for (instance, t), fams in sorted(scrapes.items()):
            body = render(fams.values()).decode()
            parsed = parse_rows(body, ts=_from_epoch(t), cluster=self.cluster, target=instance, source="prometheus")
            for kind, text in parsed.warnings:
                unrecognized.setdefault((instance, kind), Unrecognized(instance or self.url, kind, text))
            if not parsed.num_rows:
                unrecognized.setdefault((instance, "no_gpu_rows"), Unrecognized(instance or self.url, "no_gpu_rows", no_gpu_rows(body, parsed)))
            parts.append(parsed)
            times.append(t)
            gpus += parsed.gpus
            allocations += parsed.allocations
            throughput += parsed.throughput
            checkpoints += parsed.checkpoints
            shares += parsed.shares
            rejected += parsed.rejected
            problems += parsed.problems[:3]
        # a GPU both dcgm-exporter and the gpufleet exporter report: one value per field (PRECEDENCE)
        parts = merge_exporters(parts, times, PRECEDENCE_WITHIN_S)
        return Batch(
            key=f"prometheus:{self.cluster}:{start.isoformat()}:{end.isoformat()}",
            samples=samples_table(parts) if parts else empty_table(SAMPLE_SCHEMA),  # one table for the window, as scrape.py
            gpus=gpus,
            allocations=allocations,
            throughput=throughput,
            checkpoints=checkpoints,
            shares=shares,
            rejected=rejected,
            problems=problems,
            watermark=(self.watermark_name, end.isoformat()),
            unrecognized=list(unrecognized.values()),
        )
