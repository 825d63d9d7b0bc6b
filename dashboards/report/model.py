"""Gather the report's figures from the analytics: the figure model the templates render.

Nothing here computes a figure of its own. Every number is taken from gpufleet.analytics.core.Analysis,
gpufleet.analytics.trends, gpufleet.analytics.jobs and gpufleet.analytics.fairness for the report's window (the
daily trend is that analysis' own timeline, gpufleet.analytics.timeline, summed per day); the per-team table adds up the analytics' per-(cluster, account)
rows by account, so a team spread over two clusters is one row. What this module adds is
judgement about what is *known*: a figure that needs GPU samples is "no data" when the window
has none, a figure that needs process counts is "not measured" when no exporter reports them,
and a window with neither samples nor jobs is a "no data" report, never a page of zeros.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any, Mapping

import duckdb
import polars as pl

from gpufleet.analytics import sql, timeline
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.core import JOB_KEY, Analysis, Totals, top_wasteful_jobs, totals_warnings, waste_by, with_utilization
from gpufleet.analytics.jobs import job_summaries
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.shares import team_shares
from gpufleet.report.window import Window
from gpufleet.analytics.trends import NO_DATA, PARTIAL, UNKNOWN, baseline, compare
from gpufleet.times import local_midnight, utcnow

log = logging.getLogger(__name__)

# headline figures that need GPU samples (utilization, idle, stranded) or process counts
# (no data too: it is capacity without samples, and a window without samples has no capacity seen either: "0.0" would say
# every GPU reported while its allocated hours had none)
NEEDS_SAMPLES = {"busy_gpu_h", "utilization_pct", "idle_allocated_gpu_h", "idle_allocated_cost", "no_process_gpu_h",
                 "stranded_gpu_h", "stranded_cost", "no_data_gpu_h"}
NEEDS_PROCESSES = {"no_process_gpu_h"}
LABELS = {"allocated_gpu_h": "GPU-hours allocated", "busy_gpu_h": "GPU-hours busy", "utilization_pct": "Fleet utilization",
          "idle_allocated_gpu_h": "Idle allocated GPU-hours", "idle_allocated_cost": "Cost of idle allocated GPUs",
          "no_process_gpu_h": "GPU-hours held with no process", "stranded_gpu_h": "Stranded GPU-hours (no job held them)",
          "stranded_cost": "Cost of stranded capacity", "no_data_gpu_h": "GPU-hours with no data"}
UNITS = {"allocated_gpu_h": "gpu_h", "busy_gpu_h": "gpu_h", "utilization_pct": "pct", "idle_allocated_gpu_h": "gpu_h",
         "idle_allocated_cost": "usd", "no_process_gpu_h": "gpu_h", "stranded_gpu_h": "gpu_h", "stranded_cost": "usd",
         "no_data_gpu_h": "gpu_h"}
LOW_COVERAGE = 0.9  # below this share of capacity with samples, the report warns that figures undercount
NO_PROCESS_LIST = 20  # jobs listed under "held GPUs with no process"
RELIABILITY_LIST = 5  # the costliest interruptions the report names


@dataclass(frozen=True)
class Headline:
    figure: str  # Totals field
    label: str
    unit: str  # gpu_h | pct | usd
    current: float | None
    previous: float | None
    change: float | None
    change_pct: float | None
    missing: str | None = None  # why current is not shown: "no data", "not measured", "no price", "unknown" (GPU counts)
    previous_missing: str | None = None
    change_missing: str | None = None  # why change is not shown: "no data" (no comparable last week), or why a side is missing
    reason: str | None = None  # why a cost moved against its GPU-hours (gpufleet.analytics.trends.price_mix_reason)


@dataclass(frozen=True)
class TeamRow:
    account: str
    entitled_share: float | None
    used_share: float | None
    ratio: float | None
    fairshare_factor: float | None
    allocated_gpu_h: float | None  # None: no job of the team has a known GPU count
    busy_gpu_h: float
    data_gpu_h: float
    utilization_pct: float | None
    idle_gpu_h: float
    idle_cost: float | None
    no_process_gpu_h: float
    wait_p50_s: float | None
    wait_p95_s: float | None
    started_jobs: int | None
    pending_jobs: int | None


@dataclass(frozen=True)
class JobRow:
    cluster: str
    job_id: str
    name: str | None
    user_name: str | None
    account: str | None
    gpus: int | None
    runtime_h: float | None
    allocated_gpu_h: float | None
    gpu_h: float  # idle (wasteful jobs) or no-process (no-process jobs) GPU-hours in the window
    cost: float | None
    verdict: str | None


@dataclass(frozen=True)
class DailyPoint:
    day: date
    utilization_pct: float | None
    busy_gpu_h: float
    data_gpu_h: float
    allocated_gpu_h: float | None  # None: no job's GPU count is known
    future: bool = False  # the day had not begun when the report was made


@dataclass(frozen=True)
class MfuRow:
    """gpufleet.analytics.mfu.account_mfu(): one (cluster, account)."""
    cluster: str
    account: str
    mfu_pct: float | None  # None: unknown for every job of the team
    method: str
    jobs: int
    unknown_jobs: int
    gpu_h: float
    unknown_gpu_h: float
    reason: str | None  # why MFU is unknown (the most common reason among the team's unknown jobs)


@dataclass
class Method:
    max_gap_s: float
    idle_threshold_pct: float
    idle_min_duration_s: float
    prices: list[tuple[str, float | None, bool]]  # (model seen in the window, $/GPU-h or None, set in config)
    unpriced_models: tuple[str, ...]
    capacity_gpu_h: float
    data_gpu_h: float
    no_data_gpu_h: float
    no_data_hosts: list[tuple[str, float]]  # (host, no-data GPU-hours), most first
    process_counts: bool
    shares_source: str  # "config", "equal" or "unavailable"
    half_life_days: float | None
    filters: dict[str, str]


@dataclass
class Report:
    window: Window
    generated_at: datetime  # naive UTC
    as_of: datetime  # naive UTC: window end, or now if the window is not over
    status: str  # "ok" | "no_data"
    notices: list[str]
    totals: Totals
    previous: Totals | None
    headline: list[Headline]
    teams: list[TeamRow]
    wasteful_jobs: list[JobRow]
    no_process_jobs: list[JobRow]
    no_process_more: int  # jobs beyond the listed ones
    daily: list[DailyPoint]
    mfu: list[MfuRow]
    mfu_note: str
    jain_index: float | None
    gini_users: float | None
    method: Method
    team: str | None = None  # a team's own report
    top_n: int = 10
    config_path: str | None = None  # the configuration file the figures were made with (None: defaults)
    store: str | None = None  # the store they were read from
    extra: dict[str, Any] = field(default_factory=dict)
    # the fleet's reliability (gpufleet.analytics.reliability_store.report: gpufleet.reliability/v1); None without data
    reliability: dict[str, Any] | None = None
    # each team's GPUs shared with other jobs (gpufleet.analytics.shares.team_shares rows)
    shared_gpus: list[dict[str, Any]] = field(default_factory=list)
    # the fleet's goodput waterfall (gpufleet.analytics.goodput.compute: gpufleet.goodput/v1); None without data
    goodput: dict[str, Any] | None = None
    # what held each team's GPUs back: its three largest losses (gpufleet.analytics.window_states.WindowStates.team_causes rows)
    held_back: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return self.status != "no_data"


def _empty(t: Totals) -> bool:
    return t.capacity_gpu_h == 0 and t.allocated_gpu_h == 0


def headline_rows(cur: Totals, prev: Totals | None, *, processes: bool, prev_processes: bool,
                  no_comparison: str | None = None) -> list[Headline]:
    """gpufleet.analytics.trends.compare() rows, with the reason a figure is not shown where it is not
    (`no_comparison`: the trends rule's verdict on last week; set, every change is "no data")."""
    # (no last week: a stand-in no figure of which is shown, its jobs of unknown GPU count none)
    prev_t = prev if prev is not None else replace(cur, allocated_unknown_jobs=0)

    def why(key: str, t: Totals, procs: bool) -> str | None:
        if _empty(t):
            return "no data"
        if key in NEEDS_SAMPLES and t.data_gpu_h == 0:
            return "no data"
        if key in NEEDS_PROCESSES and not procs:
            return "not measured"
        if getattr(t, key) is None:
            return "no price" if words.kind(key) == "usd" else UNKNOWN if key in PARTIAL else "no data"
        return None

    rows = []
    for r in compare(cur, prev_t, NO_DATA if prev is None else no_comparison).to_dicts():
        key = r["figure"]
        missing = why(key, cur, processes)
        pmissing = "no data" if prev is None else why(key, prev, prev_processes)
        known = missing is None and pmissing is None
        rows.append(Headline(
            figure=key, label=LABELS.get(key, r["label"]), unit=UNITS.get(key, "gpu_h"),
            current=None if missing else r["current"], previous=None if pmissing else r["previous"],
            change=r["change"] if known else None, change_pct=r["change_pct"] if known else None,
            missing=missing, previous_missing=pmissing, change_missing=r["change_missing"] or (None if known else missing or pmissing),
            reason=r["reason"] if known or key in PARTIAL else None,  # (jobs of unknown GPU count: said either way)
        ))
    return rows


def _process_counts(a: Analysis) -> bool:
    """Does any sample in the window carry a compute-process count (gpufleet exporter)?"""
    return bool(a.q(sql.HAS_PROCESS_COUNTS)["n"][0])


def _by_account(df: pl.DataFrame, sums: list[str], cost: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-(cluster, account) analytics rows added up by account; money unknown if any part is, a
    figure unknown (allocated GPU-hours of jobs whose GPU count is unknown) if every part is."""
    if df.is_empty():
        return {}
    aggs = [pl.when(pl.col(c).is_null().all()).then(None).otherwise(pl.sum(c)).alias(c) for c in sums]
    if cost:
        aggs.append(pl.when(pl.col(cost).is_null().any()).then(None).otherwise(pl.sum(cost)).alias(cost))
    g = df.with_columns(pl.col("account").fill_null("")).group_by("account").agg(aggs)
    return {r["account"]: r for r in g.to_dicts()}


def _fairness(a: Analysis, shares: Mapping[str, float] | None, half_life: timedelta):
    try:
        from gpufleet.analytics.fairness import fairness
    except ImportError:  # pragma: no cover - fairness ships with analytics
        return None
    return fairness(a, shares, half_life)


def team_rows(a: Analysis, fair) -> list[TeamRow]:
    util = _by_account(a.utilization("account"), ["allocated_gpu_h", "data_gpu_h", "busy_gpu_h"])
    idle = _by_account(a.waste_by("account", "idle"), ["gpu_h"], "cost")
    nop = _by_account(a.waste_by("account", "no_process"), ["gpu_h"])
    fr = {r["account"]: r for r in fair.per_account.to_dicts()} if fair is not None else {}
    rows = []
    for acct in sorted(set(util) | set(idle) | set(fr)):
        u, i, f = util.get(acct, {}), idle.get(acct), fr.get(acct, {})
        data, busy = u.get("data_gpu_h", 0.0), u.get("busy_gpu_h", 0.0)
        rows.append(TeamRow(
            account=acct, entitled_share=f.get("entitled_share"), used_share=f.get("used_share"), ratio=f.get("ratio"),
            fairshare_factor=f.get("fairshare_factor"),
            allocated_gpu_h=u["allocated_gpu_h"] if u else 0.0, busy_gpu_h=busy, data_gpu_h=data,
            utilization_pct=busy / data * 100 if data > 0 else None,
            idle_gpu_h=i["gpu_h"] if i else 0.0, idle_cost=i["cost"] if i else 0.0,
            no_process_gpu_h=nop[acct]["gpu_h"] if acct in nop else 0.0,
            wait_p50_s=f.get("wait_p50_s"), wait_p95_s=f.get("wait_p95_s"),
            started_jobs=f.get("started_jobs"), pending_jobs=f.get("pending_jobs"),
        ))
    # sorted by cost of idle time, most first; unknown cost (unpriced model) after the known ones
    rows.sort(key=lambda r: (r.idle_cost is None, -(r.idle_cost or 0.0), -r.idle_gpu_h, -(r.allocated_gpu_h or 0.0), r.account))
    return rows


def _job_info(summaries: pl.DataFrame, listed: pl.DataFrame) -> dict[tuple, dict[str, Any]]:
    """The job list's rows (analytics.jobs.job_summaries) of the `listed` jobs, by key: only the
    few a table shows become Python rows (a week at 100,000 GPUs has millions of jobs)."""
    if summaries.is_empty() or listed.is_empty():
        return {}
    s = summaries.join(listed.select(JOB_KEY).unique(), on=JOB_KEY, how="semi")
    return {(r["cluster"], r["scheduler"], r["job_key"]): r for r in s.to_dicts()}


def _stretches(a: Analysis, kind: str, team: str | None) -> pl.DataFrame:
    """The window's idle (or no-process) stretches, of `team`'s jobs alone when given: a team's
    rows of the fleet's, which an analysis filtered to its account would give (an account filter
    narrows which jobs are seen, not how)."""
    rows = a.idle_stretches(kind)
    return rows if team is None else rows.filter(pl.col("account") == team)


def wasteful_jobs(a: Analysis, n: int, summaries: pl.DataFrame, team: str | None = None) -> list[JobRow]:
    out = []
    top = top_wasteful_jobs(_stretches(a, "idle", team), n, a.job_runtimes)
    info = _job_info(summaries, top)
    for r in top.to_dicts():
        j = info.get((r["cluster"], r["scheduler"], r["job_key"]), {})
        out.append(JobRow(cluster=r["cluster"], job_id=r["job_id"], name=j.get("name"), user_name=r["user_name"], account=r["account"],
                          gpus=r.get("gpus"), runtime_h=r.get("runtime_h"), allocated_gpu_h=r.get("allocated_gpu_h"),
                          gpu_h=r["idle_gpu_h"], cost=r["idle_cost"], verdict=j.get("verdict")))
    return out


def no_process_jobs(a: Analysis, summaries: pl.DataFrame, team: str | None = None) -> tuple[list[JobRow], int]:
    """The first NO_PROCESS_LIST jobs (of `team`, when given) that held GPUs with no process, most
    GPU-hours first, and how many such jobs there were."""
    w = waste_by(_stretches(a, "no_process", team), "job")
    if w.is_empty():
        return [], 0
    w = w.sort(["gpu_h", "job_key"], descending=[True, False])
    listed = w.head(NO_PROCESS_LIST)
    info = _job_info(summaries, listed)
    out = []
    for r in listed.to_dicts():
        j = info.get((r["cluster"], r["scheduler"], r["job_key"]), {})
        out.append(JobRow(cluster=r["cluster"], job_id=r["job_id"], name=j.get("name"), user_name=r["user_name"], account=r["account"],
                          gpus=j.get("gpus"), runtime_h=j.get("runtime_h"), allocated_gpu_h=j.get("allocated_gpu_h"),
                          gpu_h=r["gpu_h"], cost=r["cost"], verdict=j.get("verdict")))
    return out, w.height


def daily_points(a: Analysis, window: Window, now: datetime | None) -> list[DailyPoint]:
    """The trend chart's days: the fleet timeline of the window's own analysis
    (gpufleet.analytics.timeline) in buckets from the first day's local midnight that divide every
    local day - a day, or an hour in a week whose clocks change - summed per day. The window may
    start and end anywhere (`--last 7d`): its first and last days are clipped to it, and their
    sums are still the figures an analysis of each day gives (tests/test_report.py), from one
    analysis instead of one a day."""
    days = window.days()
    if not days:
        return []
    midnights = [local_midnight(d, window.zone) for d, _, _ in days] + [local_midnight(days[-1][0] + timedelta(days=1), window.zone)]
    step = math.gcd(*(round((b - m).total_seconds()) for m, b in zip(midnights, midnights[1:])))
    tl = timeline.utilization_timeline(a, "fleet", timedelta(seconds=step), origin=midnights[0])
    # each bucket's day: the last midnight at or before it (the buckets divide the days)
    starts = pl.DataFrame({"bucket": midnights[:-1], "day": list(range(len(days)))}).cast({"bucket": tl.schema["bucket"]})
    per_day = with_utilization(tl.join_asof(starts, on="bucket").group_by("day").agg(
        pl.sum("busy_gpu_h"), pl.sum("data_gpu_h"), timeline.known_sum("allocated_gpu_h")), ["day"])
    sums = {r["day"]: r for r in per_day.to_dicts()}
    out = []
    for i, (day, s, _) in enumerate(days):
        if now is not None and s >= now:
            out.append(DailyPoint(day=day, utilization_pct=None, busy_gpu_h=0.0, data_gpu_h=0.0, allocated_gpu_h=0.0, future=True))
            continue
        r = sums[i]
        out.append(DailyPoint(day=day, utilization_pct=r["utilization_pct"], busy_gpu_h=r["busy_gpu_h"], data_gpu_h=r["data_gpu_h"],
                              allocated_gpu_h=r["allocated_gpu_h"]))
    return out


def mfu_rows(a: Analysis, jobs: pl.DataFrame, team: str | None = None) -> tuple[list[MfuRow], str]:
    """MFU by team with its method (gpufleet.analytics.mfu.account_mfu over `jobs`, mfu.job_mfu's
    rows of `a`: the report reads them once, for this and the goodput waterfall), and a note when
    there is none."""
    from gpufleet.analytics.mfu import account_mfu

    if team is not None and not jobs.is_empty():
        jobs = jobs.filter(pl.col("account").fill_null("") == team)
    acct = account_mfu(a, jobs)
    reasons: dict[tuple, str] = {}
    unknown = jobs.filter(pl.col("mfu").is_null() & pl.col("reason").is_not_null()) if not jobs.is_empty() else jobs
    if not unknown.is_empty():
        top = unknown.group_by("cluster", "account", "reason").agg(pl.len().alias("n")).sort(["n", "reason"], descending=[True, False])
        for r in top.to_dicts():
            reasons.setdefault((r["cluster"], r["account"]), r["reason"])
    rows = [MfuRow(cluster=r["cluster"], account=r["account"] or "", mfu_pct=None if r["mfu"] is None else r["mfu"] * 100,
                   method=r["method"], jobs=int(r["jobs"]), unknown_jobs=int(r["unknown_jobs"]), gpu_h=r["gpu_h"],
                   unknown_gpu_h=r["unknown_gpu_h"], reason=reasons.get((r["cluster"], r["account"])) if r["unknown_jobs"] else None)
            for r in acct.to_dicts()]
    rows.sort(key=lambda r: (r.mfu_pct is None, -r.gpu_h, r.account, r.cluster))
    if not rows:
        return [], "No GPU job in this window: no MFU."
    if all(r.mfu_pct is None for r in rows):
        return rows, "MFU is unknown for every team this week: no job reported its throughput and no exporter reported tensor-core activity."
    return rows, ""


# a host's gap is listed from one GPU-second: capacity less data of a host without a gap is a float
# residue of two sums in different orders (~1e-12 h), shown as "0.0" in some runs and not others
GAP_LISTED_GPU_H = 1 / 3600


def _method(a: Analysis, t: Totals, processes: bool, shares_source: str, half_life: timedelta | None) -> Method:
    g = a.per_gpu()
    models = sorted({m for m in g["model"].to_list() if m}) if not g.is_empty() else []
    prices = [(m, a.prices.get(m), m in a.p.prices) for m in models]
    hosts = a.utilization("host")
    gaps = [] if hosts.is_empty() else [(r["host"], r["no_data_gpu_h"]) for r in
                                         hosts.filter(pl.col("no_data_gpu_h") >= GAP_LISTED_GPU_H).sort(["no_data_gpu_h", "host"], descending=[True, False]).head(10).to_dicts()]
    return Method(
        max_gap_s=a.p.max_gap.total_seconds(), idle_threshold_pct=a.p.idle_threshold, idle_min_duration_s=a.p.idle_min_duration.total_seconds(),
        prices=prices, unpriced_models=t.unpriced_models, capacity_gpu_h=t.capacity_gpu_h, data_gpu_h=t.data_gpu_h,
        no_data_gpu_h=t.no_data_gpu_h, no_data_hosts=gaps, process_counts=processes, shares_source=shares_source,
        half_life_days=half_life.total_seconds() / 86400 if half_life else None,
        filters={k: v for k, v in asdict(a.p.filters).items() if v is not None},
    )


def gather(con: duckdb.DuckDBPyConnection, params: Params, window: Window, *, shares: Mapping[str, float] | None = None,
           half_life: timedelta = timedelta(days=7), top_n: int = 10, now: datetime | None = None,
           reliability: Any = None, state_thresholds: Any = None) -> Report:
    """The whole fleet's report for `window` (params.start/end must be the window's);
    `state_thresholds`: [analytics.states]' (gpufleet.analytics.states.thresholds; None: the defaults)."""
    if (params.start, params.end) != (window.start, window.end):
        raise ValueError("params and window disagree on the window")
    with ThreadPoolExecutor(2, thread_name_prefix="report-read") as pool:
        return _gather(con, params, window, pool, shares=shares, half_life=half_life, top_n=top_n, now=now, reliability=reliability,
                       state_thresholds=state_thresholds)


def _previous(con: duckdb.DuckDBPyConnection, params: Params, now: datetime) -> tuple[Totals, bool]:
    """The previous window's totals and whether it has process counts (one analysis)."""
    a = Analysis(con, params, now=now)
    totals = a.totals()
    return totals, _process_counts(a) if not _empty(totals) else False


def _gather(con: duckdb.DuckDBPyConnection, params: Params, window: Window, pool: ThreadPoolExecutor, *, shares: Mapping[str, float] | None,
            half_life: timedelta, top_n: int, now: datetime | None, reliability: Any, state_thresholds: Any) -> Report:
    from gpufleet.analytics import reliability_store
    from gpufleet.analytics.reliability import Settings as ReliabilitySettings

    now_utc = now or utcnow()
    as_of = min(params.end, now_utc)
    rs = reliability or ReliabilitySettings()
    # read in worker threads beside the window's analysis (DuckDB runs a statement while Python
    # runs), each on cursors of its own: the previous window (the previous calendar week: across a
    # daylight-saving change not the same length), one analysis for its totals and process counts;
    # and the window's attempts, for the reliability section and the goodput waterfall's losses
    prev_params = replace(params, start=window.prev_start, end=window.prev_end)
    previous = pool.submit(_previous, con, prev_params, now_utc)
    attempts = pool.submit(reliability_store.read, con, params, rs, as_of, top=RELIABILITY_LIST)
    a = Analysis(con, params, now=now_utc)
    cur = a.totals()
    processes = _process_counts(a)
    prev, prev_processes = previous.result()
    base = baseline(con, params, prev_params, prev)
    notices: list[str] = []

    if _empty(cur):
        status = "no_data"
        if now_utc <= params.start:
            notices.append(f"{window.label} has not begun yet ({window.span}): there is nothing to report.")
        else:
            notices.append(f"No data for {window.label}: the store has no GPU samples and no jobs in "
                           f"{window.span}. Nothing here is a measurement of this week; check that the collector ran.")
    else:
        status = "ok"
        if now_utc < params.end:
            notices.append(f"This window is not over: figures cover it up to {window.local(now_utc):%a %Y-%m-%d %H:%M} ({window.tz}).")
        if cur.data_gpu_h == 0:
            notices.append("No GPU samples in this window: utilization, idle, no-process and stranded figures are unknown "
                           "(shown as \"no data\"), not zero. Allocated GPU-hours come from scheduler accounting.")
        elif cur.capacity_gpu_h > 0 and cur.data_gpu_h / cur.capacity_gpu_h < LOW_COVERAGE:
            notices.append(f"Samples cover {cur.data_gpu_h / cur.capacity_gpu_h * 100:.0f}% of the fleet's GPU time this week; "
                           f"{cur.no_data_gpu_h:,.1f} GPU-hours have no data and are counted as neither idle nor busy, "
                           "so idle and busy figures are lower bounds (see Data gaps).")
        if cur.unpriced_models:
            notices.append(f"No price for {', '.join(cur.unpriced_models)}: money on those GPUs is unknown, not $0 "
                           "(set it under [analytics.prices]).")
        notices += [words.sentence(w) for w in totals_warnings(cur)]
        if cur.data_gpu_h > 0 and not processes:
            notices.append("No exporter reported compute-process counts (dcgm-exporter does not; the gpufleet exporter does): "
                           "GPUs held with no process are not measured this week.")
    if status != "ok" and not attempts.cancel():  # (begun already: an error in the read is still this report's, never dropped)
        attempts.result()
    if _empty(prev) and status == "ok":
        notices.append(f"No data for last week ({window.previous_label}): changes against it are not shown.")
    elif base.no_comparison and status == "ok":
        notices.append(f"No comparison with last week ({window.previous_label}): {base.no_comparison}. "
                       "Its figures are shown; changes against it are \"no data\".")

    fair = None
    shares_source = "unavailable"
    if status == "ok":
        fair = _fairness(a, shares, half_life)
        if fair is not None:
            shares_source = fair.shares_source
    summaries = job_summaries(a) if status == "ok" else pl.DataFrame()
    nop, nop_jobs = no_process_jobs(a, summaries) if status == "ok" and processes else ([], 0)
    mfu_jobs = rel = rel_read = None
    mfu, mfu_note = [], ""
    if status == "ok":
        from gpufleet.analytics.mfu import job_mfu

        mfu_jobs = job_mfu(a)  # (read once: the MFU table, the goodput waterfall and each team's report)
        mfu, mfu_note = mfu_rows(a, mfu_jobs)
        rel_read = attempts.result()
        rel = reliability_store.report(con, params, rs, as_of=as_of, top=RELIABILITY_LIST, done=rel_read)
    fall = None
    held_back: list[dict[str, Any]] = []
    if status == "ok":
        from gpufleet.analytics import goodput
        from gpufleet.analytics.states import Thresholds
        from gpufleet.analytics.window_states import window_states

        states = window_states(a, state_thresholds or Thresholds.of(params, {}))
        fall = goodput.compute(a, con, params, reliability, as_of=as_of, mfu_jobs=mfu_jobs, states=states, reliability_read=rel_read)
        held_back = states.team_causes(3).to_dicts()
    return Report(
        window=window, generated_at=now_utc, as_of=as_of, status=status, notices=notices, totals=cur,
        previous=None if _empty(prev) else prev,
        headline=headline_rows(cur, None if _empty(prev) else prev, processes=processes, prev_processes=prev_processes,
                               no_comparison=base.no_comparison),
        teams=team_rows(a, fair) if status == "ok" else [],
        wasteful_jobs=wasteful_jobs(a, top_n, summaries) if status == "ok" else [],
        no_process_jobs=nop, no_process_more=nop_jobs - len(nop),
        daily=daily_points(a, window, now_utc) if status == "ok" else [],
        mfu=mfu, mfu_note=mfu_note,
        jain_index=fair.jain_index if fair is not None else None, gini_users=fair.gini_users if fair is not None else None,
        method=_method(a, cur, processes, shares_source, half_life if fair is not None else None),
        top_n=top_n,
        extra={"analysis": a, "processes": processes, "mfu_jobs": mfu_jobs, "summaries": summaries},
        reliability=rel,
        shared_gpus=team_shares(con, params).to_dicts() if status == "ok" else [],
        goodput=fall,
        held_back=held_back,
    )


def for_team(fleet: Report, team: str) -> Report:
    """A team's own report: the fleet headline for context, then only that team's row, jobs and MFU,
    each the team's rows of the fleet's figures (no analysis of its own: a filtered figure equals
    its row in the unfiltered table, so each team's report costs what it lists)."""
    a: Analysis = fleet.extra["analysis"]
    rows = [r for r in fleet.teams if r.account == team]
    notices = list(fleet.notices)
    wasteful: list[JobRow] = []
    nop: list[JobRow] = []
    nop_jobs = 0
    mfu: list[MfuRow] = []
    mfu_note = fleet.mfu_note
    if fleet.has_data:
        summaries = fleet.extra["summaries"]
        wasteful = wasteful_jobs(a, fleet.top_n, summaries, team)
        nop, nop_jobs = no_process_jobs(a, summaries, team) if fleet.extra.get("processes") else ([], 0)
        mfu, mfu_note = mfu_rows(a, fleet.extra["mfu_jobs"], team)
        if not rows:
            notices.append(f"Team {team} ran no GPU jobs in this window and has no share configured.")
    return replace(
        fleet, team=team, notices=notices, teams=rows, wasteful_jobs=wasteful, no_process_jobs=nop,
        no_process_more=nop_jobs - len(nop), mfu=mfu, mfu_note=mfu_note,
        shared_gpus=[g for g in fleet.shared_gpus if g["account"] == team],
        held_back=[c for c in fleet.held_back if c["account"] == team],
    )


__all__ = ["Report", "Headline", "TeamRow", "JobRow", "DailyPoint", "MfuRow", "Method", "gather", "for_team", "Filters"]
