"""Cached data access for the pages: every figure comes from analytics, computed once per window.

- The reader connection (gpufleet.collector.store.open_reader: views over the store's current manifest,
  never the writer's file) is a st.cache_resource keyed by store path and manifest version, so
  a new publish by the collector is picked up and a reader never sees a half-written batch.
- One gpufleet.analytics.core.Analysis per window and filters computes everything the Utilization, Jobs,
  Teams, Waste and MFU pages show (`window_bundle`); the Analysis itself (large temporary
  tables) is dropped as soon as the bundle is made. The Bundle, the job list and MFU figures are
  kept with st.cache_resource: one object for every session, not a copy each (st.cache_data
  pickles: a 16,384-GPU week's job list is 212 MiB pickled, ~0.9 s to store and read back), so
  the pages never change what they are given - as they never did the warmer's Bundles.
  The pages get it through dashboards/figures.py, whose warmer computes the configured presets'
  bundles ahead in the served app.
- Cache keys are plain tuples holding every input of a figure: store, window, filters and a
  fingerprint of the configuration. A relative window ("the last 24 h", `Window`) also carries
  the number of its reuse period (step_for: longer for longer windows): its figures are computed
  with the window ending at the moment they are first asked for, and reused until the period
  ends. Its start is put back onto the store's 5-minute summary grain (the last 6 h are then 6 h
  and at most 5 minutes), or onto the hour where its timeline's buckets are whole hours (the
  last 24 h, 7 d, 30 d: 24 h and at most an hour, like Grafana's "now-24h/h"), so its timeline's
  bucket edges fall on summary edges - on hour edges for the longer windows, whose hours are
  then read from their joined segments - and the analysis answers them from the per-GPU
  summaries instead of reading those buckets raw; its end lies in the open hour, whose newest
  minutes (after its summary ends) are read raw anyway. What they were computed for travels with them
  (`Resolved`), so the job report and the previous window's totals are asked for exactly the same
  window.

Nothing here computes a figure: it calls analytics and caches what comes back.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import streamlit as st

from gpufleet.analytics import fairness, mfu
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params, from_config
from gpufleet.analytics.timeline import default_bucket
from gpufleet.collector.summaries import BUCKET_S
from gpufleet.dashboards import config as dconfig
from gpufleet.times import HOUR, floor_time, utcnow

log = logging.getLogger(__name__)
# the CPU priority (a Linux thread's nice value) of work computed ahead of any page (work_ahead)
AHEAD_NICE = 19
_AHEAD = threading.local()

TOP_JOBS = 25  # the Waste page's most wasteful jobs
TIMELINE_BY = ("fleet", "cluster", "model", "partition", "account", "user_name")
UTILIZATION_BY = ("fleet", "cluster", "model", "host", "partition", "account", "user_name")
SUMMARY_GRAIN = timedelta(seconds=BUCKET_S)  # where a relative window starts (see the module's docstring and start_grain)


# --- settings and the store ---


@st.cache_resource(show_spinner=False)
def settings(config_path: str | None, store: str | None) -> dconfig.Settings:
    """Validated once per (config, store): a ConfigError reaches the app, which shows it."""
    return dconfig.resolve(config_path, store)


def current_settings() -> dconfig.Settings:
    return settings(*dconfig.app_arguments())


def manifest_version(root: str | Path) -> int | None:
    """The store's publish counter, summed over its shards (None: no store yet). Cheap: one
    small file per shard."""
    from gpufleet.collector.store import store_version

    return store_version(root)


@st.cache_resource(max_entries=8, show_spinner=False)
def _reader(root: str, version: int, memory_limit: str, threads: int, ahead: bool) -> duckdb.DuckDBPyConnection:
    """The pages' reader, or (`ahead`) the one of the threads that work ahead (work_ahead): a
    DuckDB of its own, created in such a thread, so its worker threads take that thread's priority."""
    from gpufleet.collector.store import open_reader

    con = open_reader(root)
    if memory_limit:  # validated by dashboards/config.py: digits and a unit
        con.execute(f"SET memory_limit = '{memory_limit}'")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def reader(root: str | Path) -> duckdb.DuckDBPyConnection:
    """The reader connection for the store's current manifest. Raises gpufleet.collector.store.StoreError
    when there is no store. Queries use cursors of their own (analytics does), so sessions
    share the connection safely."""
    from gpufleet.collector.store import StoreError

    version = manifest_version(root)
    if version is None:
        raise StoreError(f"no store at {root}: expected a directory written by `gpufleet collect` (manifest.json missing)")
    d = current_settings().dashboard
    return _reader(str(root), version, d["memory_limit"], d["threads"], working_ahead())


def work_ahead() -> None:
    """Mark the calling thread - one the dashboard starts to compute figures before a page asks
    for them (the warmer's, a window's prefetch) - as working ahead, for the rest of its life: the
    lowest CPU priority (Linux: the thread's nice value, AHEAD_NICE; it cannot be raised again
    unprivileged), and its store reads on a reader of their own (`reader`), whose DuckDB worker
    threads inherit that priority. So a page opened meanwhile has the cores first, and the work
    ahead takes what the pages leave (a page waiting for that work leaves it all)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), AHEAD_NICE)
        except OSError as e:  # (a container may forbid it: the work goes on at the pages' priority)
            log.warning("the dashboard's work ahead keeps the pages' CPU priority: %s", e)
    _AHEAD.on = True


def working_ahead() -> bool:
    """Whether the calling thread works ahead (work_ahead)."""
    return getattr(_AHEAD, "on", False)


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
    """Where a relative window of this length starts (see the module's docstring): on the hour
    when its timeline's buckets are whole hours (24 h and longer), so every bucket edge falls on
    an hour's and each hour inside the window is read from its joined segments; else on the
    5-minute summary grain. The window's timeline keeps its bucket: a window at most one grain
    longer than `length` gets the same one (gpufleet.analytics.timeline.default_bucket)."""
    bucket = default_bucket(length)
    return HOUR if bucket % HOUR == timedelta(0) else SUMMARY_GRAIN


def _epoch_s(t: datetime) -> float:
    return (t - datetime(1970, 1, 1)).total_seconds()


@dataclass(frozen=True)
class Window:
    """What a page asked for: the store, "the last 24 h" (preset) or a fixed window, the filters.

    `epoch` numbers the reuse period of a window that follows now (see step_for): part of the
    cache key, so figures are computed afresh - with the window ending at that moment - once per
    period, and reused within it."""

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


def _request(key: tuple) -> tuple[dconfig.Settings, Resolved, Params]:
    """The settings, the window resolved now, and its Params, from a Window.key."""
    s = current_settings()
    _, root, preset, start, end, *filters, fp, epoch = key
    w = Window(root, preset, datetime.fromisoformat(start) if start else None, datetime.fromisoformat(end) if end else None,
               _filters(tuple(filters)), fp, epoch)
    r = w.resolve(utcnow())
    return s, r, params_for(s, r.start, r.end, r.filters)


def _resolved(key: tuple) -> tuple[dconfig.Settings, Resolved, Params]:
    """The settings, the window and its Params, from a Resolved.key."""
    s = current_settings()
    _, root, start, end, as_of, *filters, fp, relative = key
    r = Resolved(root, datetime.fromisoformat(start), datetime.fromisoformat(end), datetime.fromisoformat(as_of), _filters(tuple(filters)),
                 fp, relative)
    return s, r, params_for(s, r.start, r.end, r.filters)


@dataclass
class Bundle:
    """The figures of one window, as analytics computed them."""

    totals: Any
    utilization: dict[str, pl.DataFrame]
    timeline: dict[str, pl.DataFrame]
    waste: dict[tuple[str, str], pl.DataFrame]  # (by, kind) -> waste_by
    top_jobs: pl.DataFrame
    jobs: pl.DataFrame  # gpufleet.analytics.jobs.job_summaries
    fairness: Any | None  # gpufleet.analytics.fairness.FairnessReport; None when it failed (fairness_error says why)
    fairness_error: str | None
    mfu: dict[str, pl.DataFrame] | None
    mfu_error: str | None
    prices: dict[str, float]
    computed_s: float
    window: Resolved  # the times these figures are for
    facts_hours: int = 0  # the hours summed from their facts (gpufleet.analytics.fact_window; 0: computed from the store)
    mfu_apart: bool = False  # MFU left out, to be asked of window_mfu (a Bundle from facts: see window_bundle)


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the window's figures (analytics)...")
def window_bundle(key: tuple) -> Bundle:
    """Everything the Utilization, Jobs, Teams, Waste and MFU pages show (`key`: a Window.key):
    summed from the window's hour facts where they answer it - then without MFU (window_mfu:
    the job list the Jobs page waits for comes first) -, else computed."""
    import time

    from gpufleet.analytics import jobs as ajobs
    from gpufleet.analytics import timeline

    t0 = time.monotonic()
    s, w, p = _request(key)
    a, tl, hours = _from_facts(s, w, p)
    if a is None:
        # the job list and MFU read the detail; under an account, user or partition filter, the GPUs its jobs held only
        a = Analysis(reader(w.root), p, now=w.as_of, detail=True)
    try:
        totals = a.totals()
        util = {by: a.utilization(by) for by in UTILIZATION_BY}
        tl = tl if tl is not None else timeline.utilization_timelines(a, TIMELINE_BY)
        waste = {(by, kind): a.waste_by(by, kind) for by in ("account", "user_name") for kind in ("idle", "no_process")}
        top = a.top_wasteful_jobs(TOP_JOBS)
        listed = window_jobs(key) if hours else None  # (from facts: the Jobs page's list, computed first)
        summaries = listed.jobs if listed is not None else ajobs.job_summaries(a)
        fair, fair_err = None, None
        if hours:  # (the Teams page's own, from the accounting alone: the same figures, computed once)
            fair, fair_err = window_fairness(key)
        else:
            try:
                fair = fairness.fairness(a, s.shares, s.half_life)
            except Exception as e:  # noqa: BLE001 - one page's figure must not take the others down
                log.exception("fairness failed")
                fair_err = f"fairness could not be computed: {type(e).__name__}: {e}"
        # from facts, MFU (a third of the rest at 16,384 GPUs) is read apart (window_mfu), without the rest
        mfu_figures, mfu_err = (None, None) if hours else _mfu(a)
        return Bundle(totals=totals, utilization=util, timeline=tl, waste=waste, top_jobs=top, jobs=summaries,
                      fairness=fair, fairness_error=fair_err, mfu=mfu_figures, mfu_error=mfu_err, prices=dict(a.prices),
                      computed_s=time.monotonic() - t0, window=w, facts_hours=hours, mfu_apart=bool(hours))
    finally:
        _close(a)


@dataclass
class JobList:
    """What the Jobs page lists of a window: its Bundle's job list, or the same read from its
    hours' facts alone (gpufleet.analytics.fact_window.window_jobs)."""

    jobs: pl.DataFrame  # gpufleet.analytics.jobs.job_summaries
    window: Resolved  # the times it is for
    facts_hours: int = 0  # the hours summed from their facts (0: the Bundle's list)

    @classmethod
    def of(cls, b: Bundle) -> "JobList":
        return cls(b.jobs, b.window, b.facts_hours)


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner="Listing the window's jobs (analytics)...")
def window_jobs(key: tuple) -> JobList | None:
    """The Jobs page's job list (`key`: a Window.key) read from the window's hour facts alone (a
    third of its whole analysis' time: the job list a Bundle from facts takes too) - under an
    account, user or partition filter and over a window of 12 h or less too, which the rest of a
    window's figures are not summed from facts for; None where they do not answer it (then the
    Bundle's)."""
    from gpufleet.analytics import fact_window, hour_facts

    s, w, p = _request(key)
    facts = _answering(s, p, job_list=True)
    if facts is None:
        return None
    jobs = fact_window.window_jobs(reader(w.root), p, w.as_of, facts, names=fact_names(w))
    return None if jobs is None else JobList(jobs, w, len(hour_facts.whole_hours(p)))


def facts_answer(key: tuple) -> bool:
    """Whether hour facts are kept, can answer the window (`key`: a Window.key;
    gpufleet.analytics.hour_facts.why_not) and are there for every hour of it (whether they are
    current is known when they are read)."""
    from gpufleet.analytics import hour_facts

    s, _, p = _request(key)
    facts = _answering(s, p)
    return facts is not None and hour_facts.facts_present(p, facts)


def _answering(s: dconfig.Settings, p: Params, job_list: bool = False):
    """The hour facts (facts_dir) where they are kept and can answer the window `p` (`job_list`:
    its job list alone; gpufleet.analytics.hour_facts.why_not), else None."""
    from gpufleet.analytics import hour_facts

    facts = facts_dir(s)
    return facts if facts is not None and hour_facts.answerable(p, job_list) else None


@dataclass
class WasteView:
    """What the Waste page shows of a window: its Bundle's figures, or the same read from its
    hours' facts alone (window_waste) with the Utilization page's (window_use: by model and host)."""

    totals: Any  # core.Totals
    waste: dict[tuple[str, str], pl.DataFrame]  # (by, kind) -> waste_by
    top_jobs: pl.DataFrame
    utilization: dict[str, pl.DataFrame]
    window: Resolved
    facts_hours: int = 0  # the hours summed from their facts (0: the Bundle's figures)

    @classmethod
    def of(cls, b: Bundle) -> "WasteView":
        return cls(b.totals, b.waste, b.top_jobs, b.utilization, b.window, b.facts_hours)


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner="Summing the window's waste (analytics)...")
def window_waste(key: tuple) -> Any:
    """The Waste page's totals, waste by account and user and top jobs (`key`: a Window.key; a
    gpufleet.analytics.fact_window.WindowWaste) read from the window's hour facts alone - the
    allocations with idle or no-process stretches, not the whole analysis the Bundle takes; None
    where they do not answer it (then the Bundle's)."""
    from gpufleet.analytics import fact_window

    s, w, p = _request(key)
    facts = _answering(s, p)
    if facts is None:
        return None
    return fact_window.window_waste(reader(w.root), p, w.as_of, facts, TOP_JOBS, names=fact_names(w))


@dataclass
class MfuView:
    """What the MFU page shows of a window: the MFU figures (per job and per account: "jobs",
    "accounts"), or why they could not be computed; the window they are for."""

    figures: dict[str, pl.DataFrame] | None
    error: str | None
    window: Resolved
    facts_hours: int = 0  # the hours read from their facts (0: computed)

    @classmethod
    def of(cls, b: Bundle) -> "MfuView":
        return cls(b.mfu, b.mfu_error, b.window, b.facts_hours)


@st.cache_resource(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the window's MFU figures (analytics)...")
def window_mfu(key: tuple) -> MfuView:
    """The MFU page's figures (`key`: a Window.key): read from the window's hour facts where they
    answer it (gpufleet.analytics.fact_window.mfu_window: not the whole analysis), else its
    Bundle's (computed: with MFU), else - a Bundle from facts that no longer answer - computed."""
    from gpufleet.analytics import fact_window, hour_facts

    s, w, p = _request(key)
    facts = _answering(s, p)
    if facts is not None:
        a = fact_window.mfu_window(reader(w.root), p, w.as_of, facts, names=fact_names(w))
        if a is not None:
            try:
                return MfuView(*_mfu(a), w, len(hour_facts.whole_hours(p)))
            finally:
                _close(a)
    b = window_bundle(key)
    if not b.mfu_apart:
        return MfuView.of(b)
    a = Analysis(reader(w.root), p, now=w.as_of, detail=True)
    try:
        return MfuView(*_mfu(a), b.window)
    finally:
        _close(a)


def _from_facts(s: dconfig.Settings, w: Resolved, p: Params) -> tuple[Analysis | None, dict[str, pl.DataFrame] | None, int]:
    """The window's analysis (without what only MFU reads) and timelines from its hours' facts
    (gpufleet.analytics.fact_window) and how many hours; (None, None, 0) where they do not answer
    it (then it is computed)."""
    from gpufleet.analytics import fact_window, hour_facts

    facts = _answering(s, p)
    if facts is None:
        return None, None, 0
    got = fact_window.window_analysis(reader(w.root), p, w.as_of, facts, mfu=False, names=fact_names(w))
    if got is None:
        return None, None, 0
    a, tl = got
    return a, {by: tl[by] for by in TIMELINE_BY}, len(hour_facts.whole_hours(p))


@dataclass
class UseView:
    """What the Utilization and Teams pages show of a window: its Bundle's figures, or the same
    summed from its hours' facts (gpufleet.analytics.hour_facts) - then without the figures
    those pages do not show (the idle time in `totals`)."""

    totals: Any  # core.Totals, or hour_facts.UseTotals
    utilization: dict[str, pl.DataFrame]
    timeline: dict[str, pl.DataFrame]
    window: Resolved
    facts_hours: int = 0  # the hours summed from their facts (0: the Bundle's figures)
    facts_missed: str | None = None  # why facts (kept) did not answer the window

    @classmethod
    def of(cls, b: Bundle) -> "UseView":
        return cls(b.totals, b.utilization, b.timeline, b.window)


def fact_names(w: Resolved) -> dict:
    """The hour facts' names computed on the store as it stands now (its manifest version), for
    the configuration's parameters: hour_facts.read_window's memo, so the pages of one window
    check them once."""
    return _fact_names(w.root, manifest_version(w.root), w.fingerprint)


@st.cache_resource(max_entries=4, show_spinner=False)
def _fact_names(root: str, version: int | None, fingerprint: str) -> dict:
    return {}


def facts_dir(s: dconfig.Settings):
    """The store's hour facts (dashboards/facts.py), None when `[dashboard] facts_days` is 0."""
    from gpufleet.dashboards.facts import FactsDir, default_dir

    if not s.dashboard["facts_days"]:
        return None
    base = Path(s.dashboard["facts_dir"]).expanduser() if s.dashboard["facts_dir"] else default_dir()
    if not base.is_absolute() and s.config_path:
        base = Path(s.config_path).resolve().parent / base
    return FactsDir.of(base, s.store)


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the window's figures (analytics)...")
def window_use(key: tuple) -> UseView:
    """The Utilization and Teams pages' utilization figures (`key`: a Window.key): summed from the hours' facts
    where they answer the window, else the window's Bundle (window_bundle, which the other pages
    share)."""
    from gpufleet.analytics import hour_facts

    s, w, p = _request(key)
    facts = facts_dir(s)
    missed = None
    if facts is not None:
        missed = hour_facts.why_not(p)
        if missed is None:
            use = hour_facts.window_use(reader(w.root), p, w.as_of, facts, names=fact_names(w))
            if use is not None:
                return UseView(use.totals, use.utilization, use.timeline, w, use.hours)
            missed = ("not every hour of it has current facts yet (the served dashboard builds those of the last "
                      f"{s.dashboard['facts_days']} days' closed hours in the background)")
    view = UseView.of(window_bundle(key))
    view.facts_missed = missed
    return view


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the window's fairness figures (analytics)...")
def window_fairness(key: tuple) -> tuple[Any | None, str | None]:
    """The Teams page's fairness figures (`key`: a Window.key) from the accounting alone
    (gpufleet.analytics.fairness over the window's job table, core.JobWindow): the report, or
    None and why it failed."""
    from gpufleet.analytics.core import JobWindow

    s, w, p = _request(key)
    try:
        jobs = JobWindow(reader(w.root), p, w.as_of)  # it reads no sample: the job table alone
        try:
            return fairness.fairness(jobs, s.shares, s.half_life), None
        finally:
            jobs.close()
    except Exception as e:  # noqa: BLE001 - the page shows the utilization by account without it
        log.exception("fairness failed")
        return None, f"fairness could not be computed: {type(e).__name__}: {e}"


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


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Computing the previous window (analytics)...")
def previous_baseline(key: tuple):
    """The window of the same length just before (`key`: a Resolved.key) as a comparison base (gpufleet.analytics.trends.Baseline): its totals and
    whether the rule lets anything be compared against it."""
    from gpufleet.analytics.trends import previous_baseline as prev

    s, w, p = _resolved(key)
    return prev(reader(w.root), p, now=w.as_of, facts=facts_dir(s))


@st.cache_data(ttl=timedelta(hours=1), max_entries=64, show_spinner="Computing the job's report (analytics)...")
def job_report(key: tuple, job: dict) -> dict | None:
    """gpufleet.analytics.jobs.job_report for one job, on the window narrowed to the job's run and to
    the job itself (with its cluster, account and user): the same figures (a job's figures depend
    only on its own allocation inside the window, and idle stretches are still judged by their
    whole length through the analysis' reach), at a fraction of the cost. Also the per-GPU
    timelines."""
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
    # the job's GPU timeline reads its run's samples with the detail columns (GpuTime.bucket_detail),
    # so the whole report reads them once, raw, rather than summaries and then samples - of the
    # GPUs the job held only, not the fleet's
    a = Analysis(reader(w.root), narrowed, now=w.as_of, detail=True)
    try:
        r = ajobs.job_report(a, job["job_key"])
        if r is None or r.job["cluster"] != job["cluster"] or r.job["scheduler"] != job["scheduler"]:
            return None
        tl = timeline.job_gpu_timeline(a, job["cluster"], job["scheduler"], job["job_key"])
        shared = ajobs.gpu_shares(reader(w.root), narrowed, job["cluster"], job["scheduler"], job["job_key"])
        return {"report": r, "timeline": tl, "shared_gpus": shared, **_job_mfu(a, job, w), **_job_states(s, w, narrowed, job)}
    finally:
        _close(a)


def _job_states(s: dconfig.Settings, w: Resolved, p: Params, job: dict) -> dict:
    """Where the job's GPU time went (gpufleet.analytics.states.job_breakdown on the job's
    narrowed window) as "states" (None: no GPU of it mapped), or "states_error" saying why it
    could not be computed."""
    from gpufleet.analytics.states import job_breakdown, thresholds

    try:
        return {"states": job_breakdown(reader(w.root), p, job["job_key"], thresholds(s.doc, s.config_path, p)), "states_error": None}
    except Exception as e:  # noqa: BLE001 - the report's other figures stand without it
        log.exception("the states of a job failed")
        return {"states": None, "states_error": f"where the time went could not be computed: {type(e).__name__}: {e}"}


def _job_mfu(a: Analysis, job: dict, w: Resolved) -> dict:
    """The job's MFU row (its row of the window's per-job MFU: gpufleet.analytics.mfu.job_mfu over
    the job's narrowed analysis `a`, with the window's throughput reports) as "mfu" (None: the job
    has none), or "mfu_error" saying why it could not be computed."""
    try:
        rows = mfu.job_mfu(a, reports_in=(w.start, w.end)).filter(
            (pl.col("cluster") == job["cluster"]) & (pl.col("scheduler") == job["scheduler"]) & (pl.col("job_key") == job["job_key"]))
        return {"mfu": rows.row(0, named=True) if rows.height else None, "mfu_error": None}
    except Exception as e:  # noqa: BLE001 - the report's other figures stand without it
        log.exception("MFU of a job failed")
        return {"mfu": None, "mfu_error": f"MFU could not be computed: {type(e).__name__}: {e}"}


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Reading GPU health (analytics)...")
def health(key: tuple, bucket_s: float) -> dict:
    """GPU health of the window (`key`: a Window.key), with the times it was computed for."""
    from gpufleet.analytics import health as ahealth

    s, w, p = _request(key)
    con = reader(w.root)
    return {**ahealth.window_health(con, p, temperature=timedelta(seconds=bucket_s)), "foreign": ahealth.foreign_processes(con, p),
            "window": w}


@st.cache_data(ttl=timedelta(hours=1), max_entries=16, show_spinner="Classifying the window's job attempts (analytics)...")
def reliability(key: tuple) -> dict:
    """The window's reliability (gpufleet.analytics.reliability_store.report: gpufleet.reliability/v1)
    with the window it was computed for; a running job's time counts up to the window's as_of."""
    from gpufleet.analytics import reliability as arel, reliability_store
    from gpufleet.analytics.params import analytics_options

    s, w, p = _request(key)
    rel = reliability_store.report(reader(w.root), p, arel.settings(analytics_options(s.doc, s.config_path)), as_of=w.as_of)
    return {**rel, "resolved": w}


def health_bucket(w: Window) -> timedelta:
    """The Health page's temperature-map bucket for `w`: the timelines' default for its length."""
    from gpufleet.analytics.timeline import default_bucket

    return default_bucket(w.length)


def health_for(w: Window) -> dict:
    """`w`'s GPU health as the Health page shows it (health, in health_bucket's buckets)."""
    return health(w.key, health_bucket(w).total_seconds())


@st.cache_data(ttl=timedelta(minutes=10), max_entries=8, show_spinner=False)
def fleet_now(key: tuple, as_of: datetime | None, version: int | None, tick: int | None = None) -> dict:
    """GPU states at as_of (gpufleet.analytics.fleet_now); as_of None: now, at the first ask within the
    10-second `tick`. `version` (the manifest's) makes a new publish a new key, so "now" is as
    fresh as the store. The key holds everything the states depend on (a live key moves on with
    every tick), so an entry never goes stale: the time to live only bounds how long it is kept,
    long enough for the Fleet now and Health pages of one fixed moment to share it (at 16,384
    GPUs the states take ~0.8 s, a third of the Health page's first load)."""
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


@st.cache_data(ttl=timedelta(seconds=30), max_entries=16, show_spinner=False)
def policy(key: tuple, version: int | None, tick: int | None = None) -> dict:
    """The idle-GPU policy (gpufleet.analytics.policy): the plan now (None without a [policy]
    section), with no action the job nearest to one and why (a policy.NotYet, or None), the audit
    trail of the window, and the actions whose latest attempt failed."""
    from gpufleet.analytics import policy as apolicy

    s, w, p = _request(key)
    con = reader(w.root)
    now = utcnow().replace(microsecond=0)
    planned = closest = None
    if isinstance(s.doc.get("policy"), dict):
        rules = apolicy.load_rules(s.doc, s.config_path)
        plan = apolicy.plan_from_store(con, rules, p, now)
        planned, closest = apolicy.plan_frame(plan), plan.closest
    return {"planned": planned, "closest": closest, "past": apolicy.audit(con, w.start, w.end), "failing": apolicy.failing(con),
            "as_of": now}


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
