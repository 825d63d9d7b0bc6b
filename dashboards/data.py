"""Cached data access for the pages: every figure comes from analytics, computed once per window.

- The reader connection (gpufleet.collector.store.open_reader: views over the store's current manifest, never the writer's
  file) is a st.cache_resource keyed by store path and manifest version, so a new publish is picked up and a reader never
  sees a half-written batch.
- One gpufleet.analytics.core.Analysis per window and filters computes everything the Utilization, Jobs, Teams, Waste and
  MFU pages show (`window_bundle`): the functions `gpufleet analyze` and the report call, no figure of the dashboard's own.
  Each page's bundle holds its own figures alone, computed on the window's one Analysis (`window_analysis`), which the
  pages share for a few minutes (ANALYSIS_KEPT: its parts, allocations and held parts are read once for all of them, not
  once a page, and a figure two pages show is computed once) and which is then closed, its temporary tables with it.
  The Bundle is a st.cache_resource, one object for every session (st.cache_data would pickle a copy each), so the pages
  never change what they are given.
- Cache keys are plain tuples holding every input of a figure: store, window, filters and a configuration fingerprint. A
  relative window ("the last 24 h", `Window`) also carries the number of its reuse period (step_for): its figures are
  computed for the window ending when first asked for (`resolved`: one end for every loader of the period, so the pages
  agree to the second), and reused until the period ends. Its start is put back onto the
  5-minute facts grain, or onto the hour where its timeline's buckets are whole hours (start_grain; like Grafana's
  "now-24h/h"), so bucket edges fall on the facts' and are answered from them, not read raw (its end's newest minutes are
  read raw anyway). What they were computed for travels with them (`Resolved`), so the job report and the previous window's
  totals are asked for exactly the same window.

Nothing here computes a figure: it calls analytics and caches what comes back.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import duckdb
import polars as pl
import streamlit as st

from gpufleet.analytics import fairness, mfu
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params, from_config
from gpufleet.collector.facts import GRAIN_5M
from gpufleet.dashboards import config as dconfig
from gpufleet.times import HOUR, default_bucket, floor_time, utcnow

log = logging.getLogger(__name__)

TOP_JOBS = 25  # the Waste page's most wasteful jobs
TIMELINE_BY = ("fleet", "cluster", "model", "partition", "account", "user_name")
UTILIZATION_BY = ("fleet", "cluster", "model", "host", "partition", "account", "user_name")
FACT_GRAIN = timedelta(seconds=GRAIN_5M)  # where a relative window starts (see the module's docstring and start_grain)


# --- settings and the store ---


@st.cache_resource(show_spinner=False)
def settings(config_path: str | None, store: str | None) -> dconfig.Settings:
    """Validated once per (config, store): a ConfigError reaches the app, which shows it."""
    return dconfig.resolve(config_path, store)


def current_settings() -> dconfig.Settings:
    return settings(*dconfig.app_arguments())


def manifest_version(root: str | Path) -> int | None:
    """The store's publish counter, summed over its shards (None: no store yet); cheap: one small file per shard."""
    from gpufleet.collector.store import store_version

    return store_version(root)


@st.cache_resource(max_entries=8, show_spinner=False)
def _reader(root: str, version: int, memory_limit: str, threads: int) -> duckdb.DuckDBPyConnection:
    """The pages' reader of the store's manifest `version`."""
    from gpufleet.collector.store import open_reader

    con = open_reader(root)
    if memory_limit:  # validated by dashboards/config.py: digits and a unit
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def reader(root: str | Path) -> duckdb.DuckDBPyConnection:
    """The reader connection for the store's current manifest (gpufleet.collector.store.StoreError: no store). Queries use
    cursors of their own (analytics does), so sessions share it safely."""
    from gpufleet.collector.store import StoreError

    version = manifest_version(root)
    if version is None:
        raise StoreError(f"no store at {root}: expected a directory written by `gpufleet collect` (manifest.json missing)")
    d = current_settings().dashboard
    return _reader(str(root), version, d["memory_limit"], d["threads"])


# --- the window ---


def step_for(length: timedelta) -> timedelta:
    """How long the figures of a relative window of this length are reused before they are
    computed again (about 1/300 of the window: a 24 h view moves on every 5 minutes)."""
    if length <= timedelta(hours=6):
        return timedelta(minutes=1)
    if length <= timedelta(days=2):
        return timedelta(minutes=5)
    if length <= timedelta(days=8):
        return timedelta(minutes=30)
    return timedelta(hours=2)


def start_grain(length: timedelta) -> timedelta:
    """Where a relative window of this length starts (module docstring): on the hour when its timeline's buckets are whole
    hours (24 h and longer), so each hour inside it is read from its hour facts; else on the 5-minute facts grain. A window at
    most one grain longer than `length` keeps its timeline's bucket (gpufleet.times.default_bucket)."""
    bucket = default_bucket(length)
    return HOUR if bucket % HOUR == timedelta(0) else FACT_GRAIN


def _epoch_s(t: datetime) -> float:
    return (t - datetime(1970, 1, 1)).total_seconds()


@dataclass(frozen=True)
class Window:
    """What a page asked for: the store, "the last 24 h" (preset) or a fixed window, the filters.

    `epoch` numbers the reuse period of a window that follows now (step_for): in the cache key, so figures are computed
    afresh, for the window ending at that moment, once a period."""

    root: str
    preset: str | None
    start: datetime | None
    end: datetime | None
    filters: Filters
    fingerprint: str
    epoch: int | None

    @property
    def relative(self) -> bool:
        return self.preset is not None

    @property
    def length(self) -> timedelta:
        return dconfig.WINDOWS[self.preset] if self.preset else self.end - self.start  # type: ignore[operator]

    @property
    def key(self) -> tuple:
        f = self.filters
        return ("req", self.root, self.preset, self.start.isoformat() if self.start else None, self.end.isoformat() if self.end else None,
                f.cluster, f.account, f.user_name, f.model, f.partition, self.fingerprint, self.epoch)

    def resolve(self, now: datetime) -> "Resolved":
        now = now.replace(microsecond=0)
        if self.preset:
            start = floor_time(now - self.length, start_grain(self.length))  # see the module's docstring
            return Resolved(self.root, start, now, now, self.filters, self.fingerprint, True)
        assert self.start is not None and self.end is not None
        return Resolved(self.root, self.start, self.end, min(self.end, now), self.filters, self.fingerprint, False)


@dataclass(frozen=True)
class Resolved:
    """A window with its times fixed: what one set of figures was computed for."""

    root: str
    start: datetime
    end: datetime
    as_of: datetime  # min(end, now): a running job counts until then
    filters: Filters
    fingerprint: str
    relative: bool

    @property
    def key(self) -> tuple:
        f = self.filters
        return ("win", self.root, self.start.isoformat(), self.end.isoformat(), self.as_of.isoformat(),
                f.cluster, f.account, f.user_name, f.model, f.partition, self.fingerprint, self.relative)

    @property
    def length(self) -> timedelta:
        return self.end - self.start


def make_window(s: dconfig.Settings, *, preset: str | None, start: datetime | None, end: datetime | None,
                filters: Filters, now: datetime | None = None) -> Window:
    now = now or utcnow()
    if preset and preset in dconfig.WINDOWS:
        epoch = int(_epoch_s(now) // step_for(dconfig.WINDOWS[preset]).total_seconds())
        return Window(str(s.store), preset, None, None, filters, s.fingerprint, epoch)
    assert start is not None and end is not None
    # a fixed window reaching past now is recomputed every minute while it does
    epoch = int(_epoch_s(now) // 60) if end > now else None
    return Window(str(s.store), None, start, end, filters, s.fingerprint, epoch)


def params_for(s: dconfig.Settings, start: datetime, end: datetime, filters: Filters) -> Params:
    return from_config(s.doc, s.config_path, start, end, filters)


def _filters(values: tuple) -> Filters:
    cluster, account, user_name, model, partition = values
    return Filters(cluster=cluster, account=account, user_name=user_name, model=model, partition=partition)


@st.cache_data(ttl=timedelta(hours=1), max_entries=64, show_spinner=False)
def resolved(key: tuple) -> Resolved:
    """The window a Window.key names, resolved when first asked for: every loader of one reuse period computes for the same
    window, so one page's figures and another's (and the attempts the goodput waterfall and the Reliability page share,
    reliability_read) are of the same seconds."""
    _, root, preset, start, end, *filters, fp, epoch = key
    w = Window(root, preset, datetime.fromisoformat(start) if start else None, datetime.fromisoformat(end) if end else None,
               _filters(tuple(filters)), fp, epoch)
    return w.resolve(utcnow())


def _request(key: tuple) -> tuple[dconfig.Settings, Resolved, Params]:
    """The settings, the window (resolved), and its Params, from a Window.key."""
    s = current_settings()
    r = resolved(key)
    return s, r, params_for(s, r.start, r.end, r.filters)


def _resolved(key: tuple) -> tuple[dconfig.Settings, Resolved, Params]:
    """The settings, the window and its Params, from a Resolved.key."""
    s = current_settings()
    _, root, start, end, as_of, *filters, fp, relative = key
    r = Resolved(root, datetime.fromisoformat(start), datetime.fromisoformat(end), datetime.fromisoformat(as_of), _filters(tuple(filters)),
                 fp, relative)
    return s, r, params_for(s, r.start, r.end, r.filters)


# What each page shows of its window's figures: window_bundle computes those alone, so a page's first load waits for
# its own figures, not the other pages' (docs/performance.md, stop 88)
PAGE_FIGURES = {
    "utilization": frozenset({"totals", "utilization", "timeline"}),
    "jobs": frozenset({"jobs", "states"}),
    "teams": frozenset({"fairness", "states", "utilization"}),
    "waste": frozenset({"totals", "utilization", "waste", "top_jobs", "goodput", "previous", "queue_gaps"}),
    "mfu": frozenset({"mfu"}),
}


@dataclass
class Bundle:
    """The figures of one window a page shows (PAGE_FIGURES), as analytics computed them; None: not this page's."""

    prices: dict[str, float]
    computed_s: float
    window: Resolved  # the times these figures are for
    totals: Any = None
    utilization: dict[str, pl.DataFrame] | None = None
    timeline: dict[str, pl.DataFrame] | None = None
    waste: dict[tuple[str, str], pl.DataFrame] | None = None  # (by, kind) -> waste_by
    top_jobs: pl.DataFrame | None = None
    jobs: pl.DataFrame | None = None  # gpufleet.analytics.jobs.job_summaries
    fairness: Any | None = None  # gpufleet.analytics.fairness.FairnessReport; None when it failed (fairness_error says why)
    fairness_error: str | None = None
    mfu: dict[str, pl.DataFrame] | None = None
    mfu_error: str | None = None
    goodput: dict | None = None  # gpufleet.analytics.goodput.compute; None when it failed (goodput_error says why)
    goodput_error: str | None = None
    states: Any | None = None  # gpufleet.analytics.window_states.WindowStates; None when it failed (states_error says why)
    states_error: str | None = None
    previous: Any | None = None  # gpufleet.analytics.trends.Baseline: the window of the same length just before
    queue_gaps: Any | None = None  # gpufleet.analytics.queue_gaps.queue_gaps, up to the window's as_of


# How long a window's Analysis is kept for its other pages' bundles, and how many windows' at once: a user moves between the
# pages of one window within minutes; the Analysis' temporary tables are large (GiBs at 16,384 GPUs), so few are kept
ANALYSIS_KEPT, ANALYSES_KEPT = timedelta(minutes=10), 2


@dataclass
class SharedAnalysis:
    """A window's Analysis for every page's bundle (window_analysis); `lock`: one bundle computes on it at a time (its
    cursor runs one statement at a time, and a figure's temporary tables are made once). `figures`: each figure the
    bundles asked of it, by name, computed once (several pages show the totals, utilization and states; the Waste page's
    goodput takes the MFU page's figures in)."""

    analysis: Analysis
    lock: threading.Lock = field(default_factory=threading.Lock)
    figures: dict[str, Any] = field(default_factory=dict)

    def figure(self, name: str, compute: Callable[[], Any]) -> Any:
        """The figure `name`, computed by `compute` on its first asking (the caller holds the lock)."""
        if name not in self.figures:
            self.figures[name] = compute()
        return self.figures[name]


def _release(shared: SharedAnalysis) -> None:
    """Close a window's Analysis once the cache lets it go (its temporary tables go with its cursor), after any bundle on it."""
    with shared.lock:
        _close(shared.analysis)


@st.cache_resource(ttl=ANALYSIS_KEPT, max_entries=ANALYSES_KEPT, show_spinner=False, on_release=_release)
def window_analysis(key: tuple) -> SharedAnalysis:
    """The window's Analysis (`key`: a Window.key) the pages' bundles compute their figures on: the Utilization page's
    allocations and held parts serve the Jobs, Teams, Waste and MFU pages too (each made its own: 0.2-0.3 s a page on the
    demo's week, seconds at 16,384 GPUs)."""
    _, w, p = _request(key)
    return SharedAnalysis(Analysis(reader(w.root), p, now=w.as_of))


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the window's figures (analytics)...")
def window_bundle(key: tuple, page: str) -> Bundle:
    """The figures `page` shows (PAGE_FIGURES[page]; `key`: a Window.key), from the window's analysis
    (gpufleet.analytics.core.Analysis, as `gpufleet analyze` computes it). The waterfall of goodput takes the MFU and
    states figures in, so the Waste page computes those too; its previous window and queue gaps are read beside the
    analysis, as `gpufleet analyze` reads them."""
    import time

    from gpufleet.analytics import jobs as ajobs
    from gpufleet.analytics import timeline
    from gpufleet.analytics.queue_gaps import queue_gaps
    from gpufleet.analytics.trends import previous_baseline

    want = PAGE_FIGURES[page]
    t0 = time.monotonic()
    s, w, p = _request(key)
    con = reader(w.root)
    # what reads no figure of the window's analysis - the goodput waterfall's interrupted attempts (reliability_read), the
    # previous window's totals and the queue gaps, each on cursors of their own - is read in worker threads beside it:
    # DuckDB runs a statement while Python runs
    with ThreadPoolExecutor(2, thread_name_prefix="window-bundle") as pool:
        attempts = pool.submit(reliability_read, w.key) if "goodput" in want else None
        previous = pool.submit(previous_baseline, con, p, now=w.as_of) if "previous" in want else None
        gaps = pool.submit(queue_gaps, con, p, now=w.as_of) if "queue_gaps" in want else None
        shared = window_analysis(key)
        with shared.lock:
            a, once = shared.analysis, shared.figure
            got: dict[str, Any] = {}
            if "totals" in want:
                got["totals"] = once("totals", a.totals)
            if "utilization" in want:
                got["utilization"] = once("utilization", lambda: {by: a.utilization(by) for by in UTILIZATION_BY})
            if "timeline" in want:
                got["timeline"] = once("timeline", lambda: timeline.utilization_timelines(a, TIMELINE_BY))
            if "waste" in want:
                got["waste"] = once("waste", lambda: {(by, kind): a.waste_by(by, kind) for by in ("account", "user_name")
                                                      for kind in ("idle", "no_process")})
            if "top_jobs" in want:
                got["top_jobs"] = once("top_jobs", lambda: a.top_wasteful_jobs(TOP_JOBS))
            if "jobs" in want:
                got["jobs"] = once("jobs", lambda: ajobs.job_summaries(a))
            if "fairness" in want:
                got["fairness"], got["fairness_error"] = once("fairness", lambda: _fairness(s, a))
            if want & {"mfu", "goodput"}:
                got["mfu"], got["mfu_error"] = once("mfu", lambda: _mfu(a))
            if want & {"states", "goodput"}:
                got["states"], got["states_error"] = once("states", lambda: _window_states(s, a, p))
            if "goodput" in want:
                got["goodput"], got["goodput_error"] = once("goodput", lambda: _goodput(s, con, a, p, w, got["mfu"], got["states"],
                                                                                attempts))
        if previous is not None:
            got["previous"] = previous.result()
        if gaps is not None:
            got["queue_gaps"] = gaps.result()
        return Bundle(prices=dict(a.prices), computed_s=time.monotonic() - t0, window=w, **got)


def _fairness(s: dconfig.Settings, a: Analysis) -> tuple[Any, str | None]:
    """The window's fairness (gpufleet.analytics.fairness) with the configured shares, or None and why it failed."""
    try:
        return fairness.fairness(a, s.shares, s.half_life), None
    except Exception as e:  # noqa: BLE001 - one page's figure must not take the others down
        log.exception("fairness failed")
        return None, f"fairness could not be computed: {type(e).__name__}: {e}"


def _reliability_settings(s: dconfig.Settings) -> Any:
    """[analytics.reliability]'s settings (gpufleet.analytics.reliability.settings)."""
    from gpufleet.analytics import reliability as arel
    from gpufleet.analytics.params import analytics_options

    return arel.settings(analytics_options(s.doc, s.config_path))


def _goodput(s: dconfig.Settings, con: duckdb.DuckDBPyConnection, a: Analysis, p: Params, w: Resolved,
             mfu_figures: dict[str, pl.DataFrame] | None, states: Any, attempts: Future) -> tuple[dict | None, str | None]:
    """The window's goodput waterfall (gpufleet.analytics.goodput.compute) on the bundle's analysis, window states (the teams'
    prices) and attempts (`attempts`: reliability_store.read's, read beside the analysis); None: it failed, with the error."""
    from gpufleet.analytics import goodput

    try:
        return goodput.compute(a, con, p, _reliability_settings(s), as_of=w.as_of, mfu_jobs=mfu_figures["jobs"] if mfu_figures else None,
                               states=states, reliability_read=attempts.result()), None
    except Exception as e:  # noqa: BLE001 - one page's figure must not take the others down
        log.exception("goodput waterfall failed")
        return None, f"the goodput waterfall could not be computed: {type(e).__name__}: {e}"


def _window_states(s: dconfig.Settings, a: Analysis, p: Params) -> tuple[Any, str | None]:
    """Where the window's GPU time went, per job and team (gpufleet.analytics.window_states) on the bundle's analysis."""
    from gpufleet.analytics.states import thresholds
    from gpufleet.analytics.window_states import window_states

    try:
        return window_states(a, thresholds(s.doc, s.config_path, p)), None
    except Exception as e:  # noqa: BLE001 - one page's figure must not take the others down
        log.exception("the window's states failed")
        return None, f"where the GPU time went could not be computed: {type(e).__name__}: {e}"


def _close(a: Analysis) -> None:
    """Drop the analysis' temporary tables (they go with its cursor) as soon as it is done."""
    try:
        a.con.close()
    except duckdb.Error:
        pass


def _mfu(a: Analysis) -> tuple[dict[str, pl.DataFrame] | None, str | None]:
    """Per-job and per-account MFU (analytics/mfu.py), each row with its method."""
    try:
        jobs = mfu.job_mfu(a)
        return {"jobs": jobs, "accounts": mfu.account_mfu(a, jobs)}, None
    except Exception as e:  # noqa: BLE001 - one page's figure must not take the others down
        log.exception("MFU failed")
        return None, f"MFU could not be computed: {type(e).__name__}: {e}"


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner=False)
def edge_warnings(key: tuple) -> list[str]:
    """The window's edge warnings (`key`: a Resolved.key; gpufleet.analytics.facts.edge_warnings, as
    `gpufleet analyze` gives them): every window page says them (ui.window_caption)."""
    from gpufleet.analytics.facts import edge_warnings as warnings

    s, w, p = _resolved(key)
    return warnings(reader(w.root), p)


@st.cache_data(ttl=timedelta(minutes=10), max_entries=64, show_spinner=False)
def named_job(key: tuple, job: str, exact: tuple[str, str, str] | None = None) -> dict | None:
    """The job list's row (`key`: a Resolved.key; the window's job table, its filters applied) of the job named `job` on the
    Jobs page (gpufleet.analytics.jobs.job_row: read for that job alone, so its report is drawn before the window's list is
    computed; `exact`: the job's cluster, scheduler and key, a row selected in the list); None: not among the window's jobs
    (job_not_in_window says why)."""
    from gpufleet.analytics import jobs as ajobs

    _, w, p = _resolved(key)
    return ajobs.job_row(reader(w.root), p, job, now=w.as_of, exact=exact)


@st.cache_data(ttl=timedelta(minutes=10), max_entries=16, show_spinner=False)
def job_not_in_window(key: tuple, job: str) -> str:
    """Why a job typed into the Jobs page is not among the window's (gpufleet.analytics.jobs.job_not_in_window): when it
    ran, or that the store has no such job."""
    from gpufleet.analytics import jobs as ajobs

    _, w, p = _resolved(key)
    return ajobs.job_not_in_window(reader(w.root), p, job)


@st.cache_data(ttl=timedelta(hours=1), max_entries=64, show_spinner="Computing the job's report (analytics)...")
def job_report(key: tuple, job: dict) -> dict | None:
    """gpufleet.analytics.jobs.job_report for one job, on the window narrowed to the job's run and to the job itself (its
    cluster, account and user): the same figures (a job's depend only on its own allocation inside the window, and idle
    stretches are still judged whole through the reach) at a fraction of the cost. Also the per-GPU timelines."""
    from gpufleet.analytics import jobs as ajobs
    from gpufleet.analytics import timeline

    s, w, p = _resolved(key)
    start = max(w.start, job["start"]) if job.get("start") else w.start
    end = min(w.end, job["end"]) if job.get("end") else w.end
    if end <= start:
        return None
    f = Filters(cluster=job["cluster"], account=job.get("account"), user_name=job.get("user_name"), model=w.filters.model,
                partition=job.get("partition"), job_key=job["job_key"])
    narrowed = params_for(s, start, end, f)
    con = reader(w.root)
    # the job's states and shared GPUs read its raw samples and shares on cursors of their own, in a worker thread beside the
    # analysis (DuckDB runs a statement while Python runs)
    with ThreadPoolExecutor(1, thread_name_prefix="job-report") as pool:
        states = pool.submit(_job_states, s, con, narrowed, job)
        shared = pool.submit(ajobs.gpu_shares, con, narrowed, job["cluster"], job["scheduler"], job["job_key"])
        a = Analysis(con, narrowed, now=w.as_of, timeline=True)  # (its GPU timeline: the parts' sums)
        try:
            r = ajobs.job_report(a, job["job_key"])
            if r is None or r.job["cluster"] != job["cluster"] or r.job["scheduler"] != job["scheduler"]:
                return None
            tl = timeline.job_gpu_timeline(a, job["cluster"], job["scheduler"], job["job_key"])
            return {"report": r, "timeline": tl, "shared_gpus": shared.result(), **_job_mfu(a, job, w), **states.result()}
        finally:
            _close(a)


def _job_states(s: dconfig.Settings, con: duckdb.DuckDBPyConnection, p: Params, job: dict) -> dict:
    """Where the job's GPU time went (gpufleet.analytics.states.job_breakdown on the job's narrowed window) as "states" (None:
    no GPU of it mapped), or "states_error" saying why it could not be computed."""
    from gpufleet.analytics.states import job_breakdown, thresholds

    try:
        return {"states": job_breakdown(con, p, job["job_key"], thresholds(s.doc, s.config_path, p)), "states_error": None}
    except Exception as e:  # noqa: BLE001 - the report's other figures stand without it
        log.exception("the states of a job failed")
        return {"states": None, "states_error": f"where the time went could not be computed: {type(e).__name__}: {e}"}


def _job_mfu(a: Analysis, job: dict, w: Resolved) -> dict:
    """The job's MFU row (gpufleet.analytics.mfu.job_mfu over the job's narrowed analysis `a`, with the window's throughput
    reports) as "mfu" (None: the job has none), or "mfu_error" saying why it could not be computed."""
    try:
        rows = mfu.job_mfu(a, reports_in=(w.start, w.end)).filter(
            (pl.col("cluster") == job["cluster"]) & (pl.col("scheduler") == job["scheduler"]) & (pl.col("job_key") == job["job_key"]))
        return {"mfu": rows.row(0, named=True) if rows.height else None, "mfu_error": None}
    except Exception as e:  # noqa: BLE001 - the report's other figures stand without it
        log.exception("MFU of a job failed")
        return {"mfu": None, "mfu_error": f"MFU could not be computed: {type(e).__name__}: {e}"}


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Reading GPU health (analytics)...")
def health(key: tuple, bucket_s: float) -> dict:
    """GPU health of the window (`key`: a Window.key; gpufleet.analytics.health: from its facts), with the times it is for."""
    from gpufleet.analytics import health as ahealth

    s, w, p = _request(key)
    con = reader(w.root)
    return {**ahealth.window_health(con, p, temperature=timedelta(seconds=bucket_s)), "foreign": ahealth.foreign_processes(con, p),
            "window": w}


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Reading the window's shared GPUs (analytics)...")
def team_shares(key: tuple) -> pl.DataFrame:
    """Each team's shared GPUs in the window (gpufleet.analytics.shares; `key`: a Window.key)."""
    from gpufleet.analytics.shares import team_shares as shares

    s, w, p = _request(key)
    return shares(reader(w.root), p)


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner=False)
def reliability_read(key: tuple) -> Any:
    """The window's job attempts, classified, and their checkpoints (gpufleet.analytics.reliability_store.read; `key`: a
    Resolved.key), read once for both that need them: the goodput waterfall (window_bundle) and the Reliability page (each
    had read them: the page's first visit after the bundle's read them again, 0.25-0.4 s of its 0.5-0.7 s on the demo).
    One object for every session (st.cache_resource: read-only, never pickled)."""
    from gpufleet.analytics import reliability_store

    s, w, p = _resolved(key)
    return reliability_store.read(reader(w.root), p, _reliability_settings(s), w.as_of)


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Classifying the window's job attempts (analytics)...")
def reliability(key: tuple) -> dict:
    """The window's reliability (gpufleet.analytics.reliability_store.report: gpufleet.reliability/v1) from its attempts
    (reliability_read) with the window it was computed for; a running job's time counts up to the window's as_of."""
    from gpufleet.analytics import reliability_store

    s, w, p = _request(key)
    rel = reliability_store.report(reader(w.root), p, _reliability_settings(s), as_of=w.as_of, done=reliability_read(w.key))
    return {**rel, "resolved": w}


def health_bucket(w: Window) -> timedelta:
    """The Health page's temperature-map bucket for `w`: the timelines' default for its length."""
    return default_bucket(w.length)


def health_for(w: Window) -> dict:
    """`w`'s GPU health as the Health page shows it (health, in health_bucket's buckets)."""
    return health(w.key, health_bucket(w).total_seconds())


@st.cache_data(ttl=timedelta(minutes=10), max_entries=8, show_spinner=False)
def fleet_now(key: tuple, as_of: datetime | None, version: int | None, tick: int | None = None) -> dict:
    """GPU states at as_of (gpufleet.analytics.fleet_now); as_of None: now, at the first ask within the 10-second `tick`.
    `version` (the manifest's) makes a new publish a new key, so "now" is as fresh as the store. The key holds everything the
    states depend on, so an entry never goes stale: the time to live only bounds how long it is kept, long enough for the
    Fleet now and Health pages of one fixed moment to share it."""
    from gpufleet.analytics import fleet_now as fn

    s, w, p = _request(key)
    at = as_of or utcnow().replace(microsecond=0)
    states = fn.gpu_states(reader(w.root), p, at, stale_after=s.stale_after)
    return {"states": states, "summary": fn.summarize(states, p, at), "hosts": fn.host_freshness(states), "as_of": at}


def fleet_now_for(ctx_window: Window, now: datetime, version: int | None) -> dict:
    """Fleet now for a page: live (now) for a window that follows now, else at the window's end."""
    if ctx_window.relative:
        return fleet_now(ctx_window.key, None, version, int(_epoch_s(now) // 10))
    return fleet_now(ctx_window.key, ctx_window.resolve(now).as_of, version)


def policy_enforce(s: dconfig.Settings) -> bool | None:
    """Whether the idle-GPU policy acts ([policy] enforce); None without a [policy] section."""
    from gpufleet.analytics import policy as apolicy

    return apolicy.load_rules(s.doc, s.config_path).enforce if isinstance(s.doc.get("policy"), dict) else None


@st.cache_data(ttl=timedelta(seconds=30), max_entries=16, show_spinner="Evaluating the idle-GPU policy on every GPU's state...")
def policy_plan(key: tuple, version: int | None, tick: int | None = None) -> dict:
    """The idle-GPU policy's plan now (gpufleet.analytics.policy; a [policy] section must exist: policy_enforce), with no action the
    job nearest to one and why (a policy.NotYet, or None). Every GPU's state over the rules' look-back: asked for, not on every visit."""
    from gpufleet.analytics import policy as apolicy

    s, w, p = _request(key)
    now = utcnow().replace(microsecond=0)
    plan = apolicy.plan_from_store(reader(w.root), apolicy.load_rules(s.doc, s.config_path), p, now)
    return {"planned": apolicy.plan_frame(plan), "closest": plan.closest, "as_of": now}


@st.cache_data(ttl=timedelta(seconds=30), max_entries=16, show_spinner=False)
def policy_past(key: tuple, version: int | None) -> pl.DataFrame:
    """The idle-GPU policy's audit trail in the window (gpufleet.analytics.policy.audit): one query."""
    from gpufleet.analytics import policy as apolicy

    _, w, _ = _request(key)
    return apolicy.audit(reader(w.root), w.start, w.end)


@st.cache_data(ttl=timedelta(seconds=30), max_entries=16, show_spinner=False)
def policy_failing(root: str, version: int | None) -> pl.DataFrame:
    """The idle-GPU policy's actions whose latest attempt failed (the Health page's: one query,
    not the plan that policy_plan() computes from every GPU's state)."""
    from gpufleet.analytics import policy as apolicy

    return apolicy.failing(reader(root))


def collector_status(root: str) -> dict:
    from gpufleet.analytics.fleet_now import collector_status as cs

    return cs(root)


@st.cache_data(ttl=timedelta(minutes=5), max_entries=8, show_spinner=False)
def job_gpu_sources(root: str, version: int | None) -> pl.DataFrame:
    """Slurm jobs by where their GPU count came from (gpufleet.analytics.health.job_gpu_sources)."""
    from gpufleet.analytics.health import job_gpu_sources as sources

    return sources(reader(root))


@st.cache_data(ttl=timedelta(minutes=5), max_entries=8, show_spinner=False)
def filter_options(root: str, version: int | None) -> dict[str, list[str]]:
    """Values the filters offer (gpufleet.analytics.fleet_now.filter_values)."""
    from gpufleet.analytics.fleet_now import filter_values

    return filter_values(reader(root))


@st.cache_data(ttl=timedelta(minutes=5), max_entries=32, show_spinner=False)
def unknown_filters(root: str, version: int | None, filters: Filters) -> list[str]:
    """A warning for each filter value the store does not know (gpufleet.analytics.core.unknown_filter_values)."""
    from gpufleet.analytics.core import unknown_filter_values

    return unknown_filter_values(reader(root), filters)
