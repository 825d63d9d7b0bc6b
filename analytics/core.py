"""One analysis of one window: utilization, allocation, idle-time waste and its cost.

`Analysis(con, params)` reads the window's fact parts once (analytics/facts.py FactWindow) and
materializes the small tables of analytics/sql.py (capacity, allocations); each figure is then a
query over them: the one path of every surface. The tests' oracle, every sample read into arrays,
is tests/support/raw_analysis.py's RawAnalysis. Pure in the sense that matters: the same store and
parameters give the same figures. Results are polars DataFrames (GPU-hours, percentages,
dollars) so the CLI, dashboards and report share them. Money is null when a model has no price:
unknown, not 0.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any, Callable, Sequence

import duckdb
import numpy as np
import polars as pl

from gpufleet.analytics import facts, sql
from gpufleet.analytics.params import Params
from gpufleet.analytics.scope import JOB_FILTER_NAMES, filter_scope, not_attributable_reason  # noqa: F401 - core's names too
from gpufleet.analytics.timeline import bucketed_parts, clock_origin, job_gpu_parts, timeline_bucket
# (the window's helpers facts.py shares live in window.py; core's names too)
from gpufleet.analytics.window import JOB_FILTER_DIMS, allocated_total, by_job_dimension, register_prices, window_bind  # noqa: F401
from gpufleet.collector.intervals import distinct
from gpufleet.collector.reading import query_rows
from gpufleet.times import epoch_us, utcnow

GPU_DIMS = {"gpu": ("cluster", "host", "gpu", "gpu_uuid", "gi"), "host": ("cluster", "host"), "model": ("model",), "cluster": ("cluster",), "fleet": ()}
JOB_KEY = ["cluster", "scheduler", "job_key"]  # what names a job
# What an Analysis makes when a figure first reads it (Analysis._make): the window's allocations
# ("al") and their sums over the parts ("use"), by the tables a query names (as FactWindow makes
# cap and ja) and by the attributes _allocation_parts sets
_MADE_BY_TABLE = {"al": "al", "alv": "use", "wgpu": "use"}
_LAZY_TABLES = re.compile(rf"\b({'|'.join(_MADE_BY_TABLE)})\b")
_ALLOCATION_USE = ("_alv", "_detail")
# an idle (or no-process) stretch's row: the part of one run of idle pieces (facts.STRETCH_ROWS)
# inside one allocation lasting at least idle_min_duration, with its GPU-hours and cost
STRETCH_SCHEMA = {"cluster": pl.String, "scheduler": pl.String, "job_key": pl.String, "host": pl.String, "gpu_uuid": pl.String,
                  "gi": pl.Int16, "job_id": pl.String, "user_name": pl.String, "account": pl.String,
                  "partition": pl.String, "model": pl.String, "gpu": pl.Int16, "equiv": pl.Float64,
                  "s0": pl.Datetime("us"), "s1": pl.Datetime("us"), "in_window_s": pl.Float64, "gpu_h": pl.Float64,
                  "usd_per_gpu_hour": pl.Float64, "cost": pl.Float64}
# an allocation's detail sums over its pieces inside the window (allocation_detail's numbers)
DETAIL_NUMBERS = ("has_piece", "any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")
JOB_DIMS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name"),
            "job": ("cluster", "scheduler", "job_key", "job_id", "user_name", "account", "partition")}


# (JOB_FILTER_DIMS, in analytics/window.py: the utilization dimension whose rows a job filter
# selects, finest first: a filtered analysis' no-data time is the sum of its rows there)


@dataclass(frozen=True)
class Totals:
    """Headline figures of a window, in GPU-hours and dollars (None = unknown, or under a job
    filter, not attributable: see `not_attributable_reason`).

    `scope` says whose figures they are: "fleet", or the filters ("account=datasci"). Under a job
    filter (account, user, partition) data, busy, utilization, no data, idle and no-process time
    and their costs are those of the selected jobs' allocations (the matching rows of
    Analysis.utilization by account, user or partition); capacity and stranded time have no
    owner, so they are None with the reason.

    `allocated_gpu_h` (scheduler accounting) sums the jobs whose GPU count is known: None
    (unknown, never 0) when jobs ran but none has a known count; a lower bound when
    `allocated_unknown_jobs` (the jobs of unknown GPU count) is not 0."""

    capacity_gpu_h: float | None
    data_gpu_h: float
    no_data_gpu_h: float
    busy_gpu_h: float
    utilization_pct: float | None
    allocated_gpu_h: float | None  # scheduler accounting; None: no job's GPU count is known
    idle_allocated_gpu_h: float
    idle_allocated_cost: float | None
    no_process_gpu_h: float
    no_process_cost: float | None
    stranded_gpu_h: float | None
    stranded_cost: float | None
    unpriced_models: tuple[str, ...]
    scope: str = "fleet"
    not_attributable_reason: str | None = None
    allocated_unknown_jobs: int = 0  # jobs of unknown GPU count, left out of allocated_gpu_h


def money(df: pl.DataFrame, hours: str, price: str = "usd_per_gpu_hour") -> float | None:
    """Sum of hours x price; None (unknown) if any hours are on a GPU model without a price."""
    if df.is_empty():
        return 0.0
    if df.filter((pl.col(hours) > 0) & pl.col(price).is_null()).height:
        return None
    return float((df[hours] * df[price].fill_null(0.0)).sum())


def waste_by(stretches: pl.DataFrame, by: str) -> pl.DataFrame:
    """Idle (or no-process) stretches' rows (Analysis.idle_stretches) summed by a job dimension
    (JOB_DIMS): the GPUs they were on, their GPU-hours and cost (unknown where any is)."""
    keys = list(JOB_DIMS[by])
    if stretches.is_empty():
        return pl.DataFrame(schema={**{k: pl.Utf8 for k in keys}, "gpus": pl.UInt32, "gpu_h": pl.Float64, "cost": pl.Float64})
    return (
        stretches.group_by(keys)
        .agg(
            pl.struct("host", "gpu_uuid", "gi").n_unique().alias("gpus"),
            pl.sum("gpu_h"),
            pl.when(pl.col("cost").is_null().any()).then(None).otherwise(pl.sum("cost")).alias("cost"),
        )
        .sort("gpu_h", descending=True)
    )


def top_wasteful_jobs(idle: pl.DataFrame, n: int, runtimes: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """The `n` jobs with the most idle allocated GPU-hours, from the window's idle stretches' rows,
    with `runtimes` (sql.JOB_RUNTIMES' rows of the jobs - cluster, scheduler, job_key - it is given)."""
    idle = waste_by(idle, "job").rename({"gpus": "idle_gpus", "gpu_h": "idle_gpu_h", "cost": "idle_cost"})
    if idle.is_empty():
        return idle
    order = dict(by=["idle_gpu_h", "idle_cost", "job_key"], descending=[True, True, False], nulls_last=True)
    top = idle.sort(**order).head(n)  # (then their runtimes: not every job's)
    return top.join(runtimes(top.select(*JOB_KEY)), on=JOB_KEY, how="left").sort(**order)


def stretch_totals(idle: pl.DataFrame, nop: pl.DataFrame) -> dict[str, float | None]:
    """Totals' idle allocated and no-process GPU-hours and cost, from the window's idle and
    no-process stretches' rows (Analysis.idle_stretches)."""
    return {"idle_allocated_gpu_h": float(idle["gpu_h"].sum()) if not idle.is_empty() else 0.0, "idle_allocated_cost": money(idle, "gpu_h"),
            "no_process_gpu_h": float(nop["gpu_h"].sum()) if not nop.is_empty() else 0.0, "no_process_cost": money(nop, "gpu_h")}


def fleet_totals(g: pl.DataFrame, allocated: pl.DataFrame, idle: pl.DataFrame, nop: pl.DataFrame, filters: Any) -> Totals:
    """A window's Totals with no job filter: from its per-GPU rows (Analysis.per_gpu), its
    allocated GPU-hours (sql.ALLOCATED_GPU_H_TOTAL's row) and its idle and no-process stretches' rows."""
    data = float(g["data_gpu_h"].sum()) if not g.is_empty() else 0.0
    busy = float(g["busy_gpu_h"].sum()) if not g.is_empty() else 0.0
    unpriced = sorted({m for m in g.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m} if not g.is_empty() else set())
    return Totals(
        capacity_gpu_h=float(g["capacity_gpu_h"].sum()) if not g.is_empty() else 0.0,
        data_gpu_h=data,
        no_data_gpu_h=float(g["no_data_gpu_h"].sum()) if not g.is_empty() else 0.0,
        busy_gpu_h=busy,
        utilization_pct=busy / data * 100 if data > 0 else None,
        **allocated_total(allocated),
        **stretch_totals(idle, nop),
        stranded_gpu_h=float(g["stranded_gpu_h"].sum()) if not g.is_empty() else 0.0,
        stranded_cost=money(g, "stranded_gpu_h"),
        unpriced_models=tuple(unpriced),
        scope=filter_scope(filters),
    )


def unknown_filter_values(con: duckdb.DuckDBPyConnection, filters: Any) -> list[str]:
    """A warning for each filter value the store has never seen (sql.FILTER_VALUES), so an unknown
    account gives a visible warning, not an empty page taken for a quiet team or, worse, the
    whole fleet. The figures still apply the filter (they are then empty)."""
    cur = con.cursor()
    try:
        out = []
        for field_name, value in asdict(filters).items():
            if value is None:
                continue
            key = FILTER_KEYS[field_name]
            if key == "job":  # too many to list: is this one known?
                if not cur.execute(sql.JOB_KEY_KNOWN, {"job_key": value}).fetchone()[0]:
                    out.append(f"unknown job {value!r}: neither the accounting nor the job-to-GPU mapping has a job of that key, "
                               "so no figure matches it")
                continue
            known = {r[0] for r in cur.execute(sql.FILTER_VALUES[key]).fetchall()}
            if value not in known:
                out.append(f"unknown {key} {value!r}: the store has no {key} of that name, so no figure matches it "
                           f"(known: {', '.join(sorted(known)[:10]) or 'none'}{', ...' if len(known) > 10 else ''})")
        return out
    finally:
        cur.close()


def unknown_gpu_jobs(a: "Analysis") -> list[str]:
    """A warning when jobs of the window have an unknown GPU count (their accounting does not
    track GPUs and neither slurmctld nor the exporters' job mapping said it): their allocated
    GPU-hours are unknown, not 0, and the allocated figures leave them out."""
    n, first = a.q(sql.UNKNOWN_GPU_JOBS).row(0)
    if not n:
        return []
    more = f" and {n - len(first)} more" if n > len(first) else ""
    return [f"{n} job{'s' if n != 1 else ''} of this window ({', '.join(first)}{more}) ha{'ve' if n != 1 else 's'} an unknown GPU "
            "count: the accounting names no GPU for them (add gres/gpu to AccountingStorageTRES in slurm.conf) and neither "
            "slurmctld nor the exporters' job mapping said it; their allocated GPU-hours are unknown and not in the allocated figures"]


# Filters field -> its sql.FILTER_VALUES query
FILTER_KEYS = {"cluster": "cluster", "account": "account", "user_name": "user", "model": "model", "partition": "partition",
               "job_key": "job"}


_GPU_USE_COLS = ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h", "stranded_gpu_h")


def by_gpu_dimension(g: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per-GPU figures (Analysis.per_gpu) summed by GPU dimension keys (none: the fleet's row)."""
    cols = [pl.sum(c) for c in _GPU_USE_COLS]
    return g.group_by(keys).agg(cols) if keys else g.select(cols)


def with_utilization(out: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Rows of a utilization table with utilization_pct (busy / data; null without data), in key order."""
    return out.with_columns(
        pl.when(pl.col("data_gpu_h") > 0).then(pl.col("busy_gpu_h") / pl.col("data_gpu_h") * 100).otherwise(None).alias("utilization_pct")
    ).sort(keys or [pl.lit(0)])


def on_the_grid(p: Params) -> tuple[int, int] | None:
    """(bucket, origin), microseconds: the analysis' parts are cut at its default timeline's bucket
    edges (from timeline.clock_origin, the start floored on the clock) where those fall on the
    5-minute grid of the facts; else not: cut there, every bucket of the window would be read
    raw, for a timeline asked or not (a timeline then reads the window's parts again, cut at its
    buckets' edges: timeline.bucketed_parts)."""
    bucket = timeline_bucket(p)
    b_us, origin_us = round(bucket.total_seconds() * 1_000_000), epoch_us(clock_origin(p.start, bucket))
    return (b_us, origin_us) if origin_us % facts.FIVE_US == 0 and b_us % facts.FIVE_US == 0 else None


def _job_window(self: Any, filters: Any) -> "JobWindow":
    """The job table of this window (Analysis or JobWindow) under other `filters`, on a cursor of
    its own: fairness compares every team of the fleet, whatever a job filter selects."""
    return JobWindow(self.con, replace(self.p, filters=filters), self.bind["as_of"])


class JobWindow:
    """A window's job table (sql.JOB_TABLE, ja) on a cursor of its own, asked as Analysis.q asks:
    what the figures that read no sample (fairness) need, without the window's line."""

    job_window = _job_window

    def __init__(self, con: duckdb.DuckDBPyConnection, params: Params, now: datetime):
        self.con = con.cursor()
        self.p = params
        self.bind = window_bind(params, now)
        self.con.execute(sql.JOB_TABLE, sql.bound(sql.JOB_TABLE, self.bind))

    def q(self, query: str, **extra: Any) -> pl.DataFrame:
        return pl.from_arrow(query_rows(self.con, query, sql.bound(query, {**self.bind, **extra})))

    def close(self) -> None:
        self.con.close()


class Analysis:
    job_window = _job_window

    def __init__(self, con: duckdb.DuckDBPyConnection, params: Params, *, now: datetime | None = None, timeline: bool = False):
        """Every figure from the window's fact parts (analytics/facts.py FactWindow: the store's
        facts where it has them, the rest cut from raw samples by the same rule), on this
        analysis' own cursor; a filter is a WHERE clause on the parts. The window is read on its
        coarsest tiling - a week's day facts, not its hours - and a timeline asked of it reads the
        parts again, cut at its buckets (timeline.bucketed_parts). `timeline`: the parts are cut at
        the default timeline's bucket edges instead where they lie on the facts' grid
        (on_the_grid), so that timeline is their sums: for a surface that draws it from this
        analysis' own parts (a job's page); every other figure then reads up to 8x the parts."""
        # a cursor of its own: the temp tables below are private to this analysis, so two
        # analyses (this window and the previous one) can share one reader connection
        self.con = con.cursor()
        self.p = params
        self.bind = window_bind(params, now or utcnow())
        self.prices = register_prices(self.con, params)
        for stmt in (sql.CAPACITY, sql.JOB_TABLE):
            self._exec(stmt)
        # the window's allocations (al) and their sums over the parts: made by the first figure that
        # reads them (a window's totals never do), al at once where a job filter's GPUs need it
        self._unbuilt = {"al", "use"}
        if self.job_filtered:
            self._make("al")
        # under a job filter its figures are its allocations': only the GPUs they hold are read
        # (a filtered window costs what it selects: one job's page reads its GPUs, not the fleet's)
        self.held_gpus = [u for (u,) in self.con.execute(sql.HELD_GPU_UUIDS).fetchall()] if self.job_filtered else None
        held_hosts = [h for (h,) in self.con.execute(sql.HELD_HOSTS).fetchall()] if self.job_filtered else None
        self.fw = self._read(now, timeline, held_hosts)
        # per_gpu() and idle_stretches() read only the data above, which never changes after
        # this point: computed once each, then handed out as copies (totals, utilization by GPU
        # dimensions, waste and the top jobs all start from them)
        self._memo: dict[tuple[str, ...], pl.DataFrame] = {}

    def _read(self, now: datetime | None, timeline: bool, held_hosts: list[str] | None) -> facts.FactWindow | None:
        """Read the window: its parts (FactWindow) on this analysis' cursor. (The tests' oracle,
        tests/support/raw_analysis.py, reads every sample here instead.)"""
        grid = on_the_grid(self.p) if timeline else None
        fw = facts.FactWindow(self.con, self.p, now=now, cursor=self.con, grid_us=grid and grid[0], grid_origin_us=grid and grid[1],
                              gpus=self.held_gpus, hosts=held_hosts, columns=facts.ANALYSIS_COLUMNS)
        self.bind = {**self.bind, **{k: fw.bind[k] for k in ("start_us", "end_us", "idle_min_us")}}
        return fw

    def __getattr__(self, name: str) -> Any:
        """The allocations' use from the parts (_allocation_parts: _alv, _detail), built
        when a figure first reads it: a window asked only for its totals (the previous window's,
        for the trend) never sums its parts per allocation (facts.ALLOCATION_PARTS)."""
        if name in _ALLOCATION_USE and "use" in self.__dict__.get("_unbuilt", ()):
            self._make("use")
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def job_filtered(self) -> bool:
        """Is the analysis narrowed to some jobs (account, user, partition)? Then figures are
        those jobs' share and capacity and stranded time are not attributable."""
        return not_attributable_reason(self.p.filters) is not None

    def edge_warnings(self) -> list[str]:
        """facts.edge_warnings of this window (a window edge in a bucket whose raw samples
        retention retired: its minutes there have no data)."""
        return facts.edge_warnings(self.con, self.p)

    def _make(self, what: str) -> None:
        """Make "al" (sql.ALLOCATIONS) or "use" (_allocation_parts, after al) unless made already."""
        if what in self._unbuilt:
            self._unbuilt.discard(what)
            if what == "use":
                self._make("al")
                self._allocation_parts()
            else:
                self._exec(sql.ALLOCATIONS)

    def _allocation_parts(self) -> None:
        """alv from the parts (facts.ALLOCATION_PARTS): each allocation's data and busy seconds
        and whether it has a piece in the window; the detail sums kept for allocation_detail."""
        self._exec(facts.GPU_IDS)
        use = self.q(facts.ALLOCATION_PARTS)
        self._detail = use.select("fb_max", "any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock", "has_util")
        self._alv = use.select("a0", "a1", "gid", "data_s", "busy_s", "has_piece")
        self.con.register("_alv_use", self._alv.select("gid", "data_s", "busy_s", "has_piece").to_arrow())
        self.con.execute(sql.ALLOCATION_USE)

    def allocation_text(self, rows: np.ndarray, columns: Sequence[str] = ("*",)) -> pl.DataFrame:
        """al's `columns` of the allocations at positions `rows` (in that order; repeats allowed),
        read for those alone: how a figure kept as numbers in al's order (detail_numbers) names
        the few rows it shows."""
        text = self.q(sql.allocation_text(columns), tables={"_rows": pl.DataFrame({"i": distinct(rows)}, schema={"i": pl.Int64})})
        if not text["i"].is_sorted():
            text = text.sort("i")
        return text.drop("i")[np.searchsorted(text["i"].to_numpy(), rows)]

    def _allocations(self, rows: np.ndarray | None = None) -> pl.DataFrame:
        """alv's rows, al's columns beside each allocation's look-ups: all of them, or those at
        positions `rows` (in that order; repeats allowed), al's text read for those alone."""
        use = self._alv.select("gid", "data_s", "busy_s", "has_piece")
        if rows is not None:
            return self.allocation_text(rows).hstack(use[rows])
        text = self.q(sql.ALLOCATION_ALL)
        return (text if text["i"].is_sorted() else text.sort("i")).drop("i").hstack(use)

    def _with_piece(self) -> np.ndarray:
        """The positions of the allocations with a piece inside the window (alv's has_piece)."""
        return np.flatnonzero(self._alv["has_piece"].to_numpy())

    def allocation_use(self) -> pl.DataFrame:
        """alv (see _allocation_use): each allocation with its GPU id, data and busy seconds in
        the window and whether it has a piece there."""
        return self._allocations()

    def allocation_detail(self) -> pl.DataFrame:
        """alv with what each allocation's parts inside the window add up to (facts.ALLOCATION_PARTS:
        has_piece, has_util, fb_max, any_s, tensor_s, clocked_s, tclock, tw_clocked, tnoclock) and
        its GPU's gpu index and model."""
        if ("detail",) not in self._memo:
            named = self.q("SELECT gid, gpu, model, equiv FROM wgpu")
            self._memo[("detail",)] = self._allocations().hstack(self._detail).join(named, on="gid", how="left", maintain_order="left")
        return self._memo[("detail",)].clone()

    def detail_numbers(self) -> pl.DataFrame:
        """allocation_detail's sums (DETAIL_NUMBERS) and its GPU's model, a row per allocation in
        al's row order and nothing of al's text: what MFU adds up per job in SQL beside al (a
        16,384-GPU week's allocation_detail, text and all, was 1.3 s and a GiB of it)."""
        named = self.q("SELECT gid, model FROM wgpu")
        return (self._alv.select("gid", "has_piece").hstack(self._detail.select(*DETAIL_NUMBERS[1:]))
                .join(named, on="gid", how="left", maintain_order="left").select(*DETAIL_NUMBERS, "model"))

    def _exec(self, query: str) -> None:
        self.con.execute(query, sql.bound(query, self.bind))

    def q(self, query: str, tables: dict[str, pl.DataFrame] | None = None, **extra: Any) -> pl.DataFrame:
        """Run a query with this analysis' bound parameters (plus `extra` ones), with `tables`
        (name -> frame) registered for it alone."""
        for table in set(_LAZY_TABLES.findall(query)):
            self._make(_MADE_BY_TABLE[table])
        names = sql.bound(query, {**self.bind, **extra})
        for name, frame in (tables or {}).items():
            self.con.register(name, frame.to_arrow())
        try:
            return pl.from_arrow(query_rows(self.con, query, names))
        finally:
            for name in tables or {}:
                self.con.unregister(name)

    # --- per GPU ---

    def per_gpu(self) -> pl.DataFrame:
        """Capacity, data, busy, allocated and stranded GPU-hours per GPU (or MIG instance); under a
        job filter of the GPUs the selected jobs hold (held_gpus: those read), every hour of theirs."""
        if ("per_gpu",) not in self._memo:
            g = self._per_gpu()
            if self.held_gpus is not None:
                g = g.filter(pl.col("gpu_uuid").is_in(self.held_gpus) | pl.col("gpu_uuid").is_null())
            self._memo[("per_gpu",)] = g
        return self._memo[("per_gpu",)].clone()

    def _per_gpu(self) -> pl.DataFrame:
        return self.fw.per_gpu()

    # --- utilization by a dimension ---

    def utilization(self, by: str = "fleet") -> pl.DataFrame:
        """Time-weighted utilization grouped by one of gpufleet.analytics.params.DIMENSIONS.

        GPU dimensions (gpu, host, model, cluster, fleet) cover all capacity; job dimensions
        (partition, account, user_name, job) cover the time jobs held GPUs.
        """
        if by in GPU_DIMS and self.job_filtered:
            out = self._held_use(list(GPU_DIMS[by]))
            if out.is_empty():
                return out
            keys = list(GPU_DIMS[by])
        elif by in GPU_DIMS:
            keys = [k for k in GPU_DIMS[by]]
            g = self.per_gpu()
            if g.is_empty():
                return g
            out = by_gpu_dimension(g, keys)
        elif by in JOB_DIMS:
            keys = list(JOB_DIMS[by])
            out = by_job_dimension(self.q(sql.job_allocated_by(keys)), self.q(sql.job_use(keys)), keys)
        else:
            raise ValueError(f"unknown dimension {by!r}: expected one of {', '.join([*GPU_DIMS, *JOB_DIMS])}")
        return with_utilization(out, keys)

    def _held_use(self, keys: list[str]) -> pl.DataFrame:
        """Utilization by GPU dimension under a job filter: the selected jobs' data and busy time on
        each GPU (the allocations' look-ups, as the job dimensions count them); capacity, no data
        and stranded time are not attributable to jobs (null)."""
        g = self.per_gpu().select("cluster", "host", "gpu", "gpu_uuid", "gi", "model")
        al = self._allocations(self._with_piece()).select("cluster", "host", "gpu_uuid", "gi", "data_s", "busy_s")
        al = al.join(g, on=["cluster", "host", "gpu_uuid", "gi"], how="inner")
        if al.is_empty():
            return al
        aggs = [(pl.sum("data_s") / 3600).alias("data_gpu_h"), (pl.sum("busy_s") / 3600).alias("busy_gpu_h")]
        out = al.group_by(keys).agg(aggs) if keys else al.select(aggs)
        return out.with_columns(pl.lit(None, dtype=pl.Float64).alias("capacity_gpu_h"), pl.lit(None, dtype=pl.Float64).alias("no_data_gpu_h"),
                                pl.col("data_gpu_h").alias("allocated_data_gpu_h"), pl.lit(None, dtype=pl.Float64).alias("stranded_gpu_h")).select(
            *keys, "capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h", "stranded_gpu_h")

    # --- over time ---

    def timeline_use(self, gpu_dims: bool, bsec: float, origin_us: int) -> dict[str, pl.DataFrame]:
        """The per-bucket sums a timeline composes (timeline.compose_timelines): "pc", the held
        parts' by job dimensions and model; "iv", every part's by model, where GPU dimensions are drawn."""
        queries = {**({"iv": facts.timeline_parts(False)} if gpu_dims else {}), "pc": facts.timeline_parts(True)}
        return bucketed_parts(self, queries, bsec, origin_us)

    def job_gpu_use(self, cluster: str, scheduler: str, job_key: str, bsec: float, origin: datetime) -> pl.DataFrame:
        """timeline.job_gpu_timeline's rows: the job's parts summed per GPU and bucket."""
        return job_gpu_parts(self, cluster, scheduler, job_key, bsec, origin)

    # --- waste ---

    def idle_stretches(self, kind: str = "idle") -> pl.DataFrame:
        """Stretches of allocated time at least idle_min_duration long where the GPU was idle
        (kind "idle": utilization below the threshold) or held with no compute process
        (kind "no_process"), with their in-window GPU-hours and cost."""
        if kind not in ("idle", "no_process"):
            raise KeyError(kind)
        if ("idle_stretches", kind) not in self._memo:
            self._memo[("idle_stretches", kind)] = self._islands(kind)
        return self._memo[("idle_stretches", kind)].clone()

    def _islands(self, kind: str) -> pl.DataFrame:
        rows = self.fw.runs("nop" if kind == "no_process" else kind)  # (both kinds in one statement, once)
        return rows.select([pl.col(c).cast(t) for c, t in STRETCH_SCHEMA.items()])

    def waste_by(self, by: str = "account", kind: str = "idle") -> pl.DataFrame:
        return waste_by(self.idle_stretches(kind), by)

    def top_wasteful_jobs(self, n: int = 10) -> pl.DataFrame:
        """The jobs with the most idle allocated GPU-hours in the window."""
        return top_wasteful_jobs(self.idle_stretches("idle"), n, lambda jobs: self.q(sql.JOB_RUNTIMES, tables={"_jobs": jobs}))

    def totals(self) -> Totals:
        if self.job_filtered:
            return self._job_totals()
        return fleet_totals(self.per_gpu(), self.q(sql.ALLOCATED_GPU_H_TOTAL), self.idle_stretches("idle"), self.idle_stretches("no_process"),
                            self.p.filters)

    def _job_totals(self) -> Totals:
        """totals() under a job filter: the selected jobs' figures (the sums of their rows in
        utilization by account, user or partition), capacity and stranded time not attributable."""
        used = self._allocations(self._with_piece())
        data = float(used["data_s"].sum()) / 3600 if not used.is_empty() else 0.0
        busy = float(used["busy_s"].sum()) / 3600 if not used.is_empty() else 0.0
        idle, nop = self.idle_stretches("idle"), self.idle_stretches("no_process")
        g = self.per_gpu()
        held = g.join(used.select("cluster", "host", "gpu_uuid", "gi").unique(), on=["cluster", "host", "gpu_uuid", "gi"], how="semi") if not g.is_empty() else g
        unpriced = sorted({m for m in held.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m} if not held.is_empty() else set())
        # no data is allocated minus data (clipped at 0) per row of the filter's own dimension: the
        # sum of the rows it selects in the unfiltered utilization by that dimension
        rows = self.utilization(next(d for k, d in JOB_FILTER_DIMS.items() if getattr(self.p.filters, k) is not None))
        no_data = float(rows["no_data_gpu_h"].sum()) if not rows.is_empty() else 0.0
        return Totals(
            capacity_gpu_h=None,
            data_gpu_h=data,
            no_data_gpu_h=no_data,
            busy_gpu_h=busy,
            utilization_pct=busy / data * 100 if data > 0 else None,
            **allocated_total(self.q(sql.ALLOCATED_GPU_H_TOTAL)),
            **stretch_totals(idle, nop),
            stranded_gpu_h=None,
            stranded_cost=None,
            unpriced_models=tuple(unpriced),
            scope=filter_scope(self.p.filters),
            not_attributable_reason=not_attributable_reason(self.p.filters),
        )
