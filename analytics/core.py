"""One analysis of one window: utilization, allocation, idle-time waste and its cost.

`Analysis(con, params)` reads the window's fact parts once (facts.FactWindow) and materializes
sql.py's small tables; every surface's figures are queries over them. Same store and parameters,
same figures (oracle: tests/support/raw_analysis.py). Results are polars DataFrames (GPU-hours,
percentages, dollars); money is null, never 0, where a model has no price.
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
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.params import Params
from gpufleet.analytics.scope import JOB_FILTER_NAMES, filter_scope, not_attributable_reason  # noqa: F401 - core's names too
from gpufleet.analytics.timeline import bucketed_parts, clock_origin, job_gpu_parts, timeline_bucket
from gpufleet.analytics.window import JOB_FILTER_DIMS, allocated_total, by_job_dimension, register_prices, window_bind  # noqa: F401
from gpufleet.collector.facts import FLOOR_AT_LO
from gpufleet.collector.intervals import distinct
from gpufleet.collector.reading import query_rows, seen_floor
from gpufleet.times import epoch_us, from_epoch_us, utcnow

GPU_DIMS = {"gpu": ("cluster", "host", "gpu", "gpu_uuid", "gi"), "host": ("cluster", "host"), "model": ("model",), "cluster": ("cluster",), "fleet": ()}
JOB_KEY = ["cluster", "scheduler", "job_key"]  # what names a job
# table a query names -> what Analysis._make builds on first read: allocations ("al"), their sums over the parts ("use")
_MADE_BY_TABLE = {"al": "al", "alv": "use", "wgpu": "use"}
_LAZY_TABLES = re.compile(rf"\b({'|'.join(_MADE_BY_TABLE)})\b")
_ALLOCATION_USE = ("_alv", "_detail")
# an idle (or no-process) stretch's row (facts.STRETCH_ROWS), with its GPU-hours and cost
STRETCH_SCHEMA = {"cluster": pl.String, "scheduler": pl.String, "job_key": pl.String, "host": pl.String, "gpu_uuid": pl.String,
                  "gi": pl.Int16, "job_id": pl.String, "user_name": pl.String, "account": pl.String,
                  "partition": pl.String, "model": pl.String, "gpu": pl.Int16, "equiv": pl.Float64,
                  "s0": pl.Datetime("us"), "s1": pl.Datetime("us"), "in_window_s": pl.Float64, "gpu_h": pl.Float64,
                  "usd_per_gpu_hour": pl.Float64, "cost": pl.Float64}
DETAIL_NUMBERS = ("has_piece", "any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")
JOB_DIMS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name"),
            "job": ("cluster", "scheduler", "job_key", "job_id", "user_name", "account", "partition")}


@dataclass(frozen=True)
class Totals:
    """Headline figures of a window, in GPU-hours and dollars; None: unknown, or not attributable (`not_attributable_reason`).

    `scope`: "fleet" or the filters ("account=datasci"). Under a job filter the figures are the selected jobs' allocations';
    capacity and stranded time have no owner (None). `allocated_gpu_h` is a lower bound when `allocated_unknown_jobs` is not 0."""

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
    # under a GPU model filter: jobs no exporter mapped to a GPU of known model (so of unknown model), left out of every figure,
    # and their allocated GPU-hours on whatever model they held (None: none of their GPU counts is known)
    model_unknown_jobs: int = 0
    model_unknown_gpu_h: float | None = None


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
    """The `n` jobs with the most idle allocated GPU-hours, with `runtimes` (sql.JOB_RUNTIMES' rows of the jobs given)."""
    idle = waste_by(idle, "job").rename({"gpus": "idle_gpus", "gpu_h": "idle_gpu_h", "cost": "idle_cost"})
    if idle.is_empty():
        return idle
    order = dict(by=["idle_gpu_h", "idle_cost", "job_key"], descending=[True, True, False], nulls_last=True)
    top = idle.sort(**order).head(n)  # runtimes of these alone
    return top.join(runtimes(top.select(*JOB_KEY)), on=JOB_KEY, how="left").sort(**order)


def stretch_totals(idle: pl.DataFrame, nop: pl.DataFrame) -> dict[str, float | None]:
    """Totals' idle allocated and no-process GPU-hours and cost, from their stretches' rows."""
    return {"idle_allocated_gpu_h": float(idle["gpu_h"].sum()) if not idle.is_empty() else 0.0, "idle_allocated_cost": money(idle, "gpu_h"),
            "no_process_gpu_h": float(nop["gpu_h"].sum()) if not nop.is_empty() else 0.0, "no_process_cost": money(nop, "gpu_h")}


def fleet_totals(g: pl.DataFrame, allocated: pl.DataFrame, idle: pl.DataFrame, nop: pl.DataFrame, filters: Any) -> Totals:
    """A window's Totals with no job filter (per_gpu rows, sql.ALLOCATED_GPU_H_TOTAL's row, stretches' rows)."""
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
    """A warning for each filter value the store has never seen (sql.FILTER_VALUES): an empty page
    must not pass for a quiet team. The figures still apply the filter."""
    cur = con.cursor()
    try:
        out = []
        for field_name, value in asdict(filters).items():
            if value is None:
                continue
            key = FILTER_KEYS[field_name]
            if key == "job":  # too many to list: is each known?
                unknown = [k for k in filters.values("job_key") if not cur.execute(sql.JOB_KEY_KNOWN, {"job_key": k}).fetchone()[0]]
                out += [f"unknown job {k!r}: neither the accounting nor the job-to-GPU mapping has a job of that key, so no figure "
                        "matches it" for k in unknown]
                continue
            known = {r[0] for r in cur.execute(sql.FILTER_VALUES[key]).fetchall()}
            if value not in known:
                out.append(f"unknown {key} {value!r}: the store has no {key} of that name, so no figure matches it "
                           f"(known: {', '.join(sorted(known)[:10]) or 'none'}{', ...' if len(known) > 10 else ''})")
        return out
    finally:
        cur.close()


def unknown_gpu_jobs(a: "Analysis") -> list[str]:
    """A warning when jobs of the window have an unknown GPU count: their allocated GPU-hours are
    unknown, not 0, and left out of the allocated figures."""
    n, first = a.q(sql.UNKNOWN_GPU_JOBS).row(0)
    if not n:
        return []
    more = f" and {n - len(first)} more" if n > len(first) else ""
    return [f"{words.quantity(n, 'job')} of this window ({', '.join(first)}{more}) {words.have(n)} an unknown GPU "
            "count: the accounting names no GPU for them (add gres/gpu to AccountingStorageTRES in slurm.conf) and neither "
            "slurmctld nor the exporters' job mapping said it; their allocated GPU-hours are unknown and not in the allocated figures"]


def model_unknown_warnings(t: Totals) -> list[str]:
    """A warning, under a GPU model filter, for the window's jobs the filter cannot place: no exporter mapped them to a GPU
    of known model, so their allocated GPU-hours are in no model's figures (sql.MODEL_UNKNOWN_JOBS)."""
    if not t.model_unknown_jobs:
        return []
    n = t.model_unknown_jobs
    held = f" ({words.gpu_h(t.model_unknown_gpu_h)} GPU-h allocated)" if t.model_unknown_gpu_h is not None else ""
    return [f"{words.quantity(n, 'job')} of this window{held} {words.have(n)} no GPU of known model in the job mapping "
            "(seen by no exporter on a GPU): a GPU model filter cannot place such a job, so its GPU-hours are in no model's figures"]


def totals_warnings(t: Totals) -> list[str]:
    """What a reader of the totals must be told beside them, on every surface: capacity_warnings, model_unknown_warnings."""
    return capacity_warnings(t) + model_unknown_warnings(t)


def capacity_warnings(t: Totals) -> list[str]:
    """A warning when accounting's allocated GPU-hours exceed the inventory's capacity (no job filter: capacity is then the
    fleet's): jobs held GPUs no exporter reports, so capacity, stranded and no data count only the reported GPUs' time - said
    on every surface of the totals, never left for a reader to find in allocated > capacity."""
    cap, alloc = t.capacity_gpu_h, t.allocated_gpu_h
    if cap is None or alloc is None or alloc <= cap + 1e-9:
        return []
    return [f"allocated ({words.gpu_h(alloc)} GPU-h, from scheduler accounting) exceeds capacity ({words.gpu_h(cap)} GPU-h, the GPUs "
            "the exporters reported): jobs held GPUs no exporter reports, so capacity, stranded and no data count only the "
            "reported GPUs' time"]


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
    """(bucket, origin) in microseconds of the default timeline, where its edges fall on the facts'
    5-minute grid; else None (cut off the grid, every bucket would be read raw)."""
    bucket = timeline_bucket(p)
    b_us, origin_us = round(bucket.total_seconds() * 1_000_000), epoch_us(clock_origin(p.start, bucket))
    return (b_us, origin_us) if origin_us % facts.FIVE_US == 0 and b_us % facts.FIVE_US == 0 else None


def _job_window(self: Any, filters: Any) -> "JobWindow":
    """This window's job table under other `filters`: fairness compares every team, whatever a job filter selects."""
    return JobWindow(self.con, replace(self.p, filters=filters), self.bind["as_of"])


class JobWindow:
    """A window's job table (sql.JOB_TABLE, ja) on its own cursor, for figures that read no sample (fairness)."""

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
        """Every figure from the window's fact parts (facts.FactWindow), read on their coarsest
        tiling; a filter is a WHERE clause on the parts. `timeline`: cut the parts at the default
        timeline's buckets (on_the_grid) so it is their sums, for a surface drawing it (a job's page)."""
        # own cursor: the temp tables are private, so this window and the previous one share a connection
        self.con = con.cursor()
        self.p = params
        self.bind = window_bind(params, now or utcnow())
        self.prices = register_prices(self.con, params)
        for stmt in (sql.CAPACITY, sql.JOB_TABLE):
            self._exec(stmt)
        # al and its sums: made on first read (totals never read them); al at once for a job filter's GPUs
        self._unbuilt = {"al", "use"}
        self._floor: Any = FLOOR_AT_LO  # the allocations' $seen_floor of al and the parts' holds (_seen_floor)
        if self.job_filtered:
            self._make("al")
        self.held_gpus = [u for (u,) in self.con.execute(sql.HELD_GPU_UUIDS).fetchall()] if self.job_filtered else None
        held_hosts = [h for (h,) in self.con.execute(sql.HELD_HOSTS).fetchall()] if self.job_filtered else None
        self.fw = self._read(now, timeline, held_hosts)
        # per_gpu() and idle_stretches() of data fixed from here: computed once, handed out as copies
        self._memo: dict[tuple[str, ...], pl.DataFrame] = {}

    def _read(self, now: datetime | None, timeline: bool, held_hosts: list[str] | None) -> facts.FactWindow | None:
        """Read the window's parts (FactWindow); the tests' oracle (raw_analysis.py) reads every sample here instead."""
        grid = on_the_grid(self.p) if timeline else None
        fw = facts.FactWindow(self.con, self.p, now=now, cursor=self.con, grid_us=grid and grid[0], grid_origin_us=grid and grid[1],
                              gpus=self.held_gpus, hosts=held_hosts, columns=facts.ANALYSIS_COLUMNS,
                              allocations=lambda: self._make("al"), floor=self._seen_floor)
        self.bind = {**self.bind, **{k: fw.bind[k] for k in ("start_us", "end_us", "idle_min_us")}}
        return fw

    def __getattr__(self, name: str) -> Any:
        """_alv and _detail, built on first read: a window asked only for its totals never sums its parts per allocation."""
        if name in _ALLOCATION_USE and "use" in self.__dict__.get("_unbuilt", ()):
            self._make("use")
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def job_filtered(self) -> bool:
        """Narrowed to some jobs (account, user, partition)? Then capacity and stranded time are not attributable."""
        return not_attributable_reason(self.p.filters) is not None

    def edge_warnings(self) -> list[str]:
        """facts.edge_warnings of this window."""
        return facts.edge_warnings(self.con, self.p)

    def empty_warnings(self, t: Totals) -> list[str]:
        """A warning when the window holds no GPU sample (of its scope): its zeros measure nothing, so they are said to
        be so, with where the store's samples lie (`analyze` of a mistyped week answered 0.0 GPU-h and exited 0)."""
        if t.data_gpu_h > 0:
            return []
        first, last = self.fw.extent()
        return [words.nothing_measured("GPU samples" + ("" if t.scope == "fleet" else f" of {t.scope}"), "GPU samples",
                                       None if first is None else from_epoch_us(first), None if last is None else from_epoch_us(last))]

    def _make(self, what: str) -> None:
        """Make "al" (sql.ALLOCATIONS) or "use" (_allocation_parts, after al) unless made already."""
        if what in self._unbuilt:
            self._unbuilt.discard(what)
            if what == "use":
                self._make("al")
                self._allocation_parts()
            else:
                self.bind["seen_floor"] = self._seen_floor()
                self._exec(sql.ALLOCATIONS)

    def _seen_floor(self) -> Any:
        """The allocations' $seen_floor of every read of the window's (al at $xstart, its parts' holds from their reach
        before it): reading.seen_floor at facts.read_from, found once."""
        if self._floor is FLOOR_AT_LO:
            self._floor = seen_floor(self.con, facts.read_from(self.p), self.p.max_gap.total_seconds())
        return self._floor

    def _allocation_parts(self) -> None:
        """alv from the held parts (facts.ALLOCATION_PARTS, over wheld); the detail sums kept for allocation_detail."""
        self.fw.linked()
        self._exec(facts.GPU_IDS)
        use = self.q(facts.ALLOCATION_PARTS)
        self._detail = use.select("fb_max", "any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock", "has_util")
        self._alv = use.select("a0", "a1", "gid", "data_s", "busy_s", "has_piece")
        self.con.register("_alv_use", self._alv.select("gid", "data_s", "busy_s", "has_piece").to_arrow())
        self.con.execute(sql.ALLOCATION_USE)

    def allocation_text(self, rows: np.ndarray, columns: Sequence[str] = ("*",)) -> pl.DataFrame:
        """al's `columns` at positions `rows` (in that order; repeats allowed), read for those alone:
        names the few rows a figure kept as numbers (detail_numbers) shows."""
        text = self.q(sql.allocation_text(columns), tables={"_rows": pl.DataFrame({"i": distinct(rows)}, schema={"i": pl.Int64})})
        if not text["i"].is_sorted():
            text = text.sort("i")
        return text.drop("i")[np.searchsorted(text["i"].to_numpy(), rows)]

    def _allocations(self, rows: np.ndarray | None = None) -> pl.DataFrame:
        """al's columns beside alv's: all rows, or those at positions `rows` (as allocation_text)."""
        use = self._alv.select("gid", "data_s", "busy_s", "has_piece")
        if rows is not None:
            return self.allocation_text(rows).hstack(use[rows])
        text = self.q(sql.ALLOCATION_ALL)
        return (text if text["i"].is_sorted() else text.sort("i")).drop("i").hstack(use)

    def _with_piece(self) -> np.ndarray:
        """The positions of the allocations with a piece inside the window (alv's has_piece)."""
        return np.flatnonzero(self._alv["has_piece"].to_numpy())

    def allocation_use(self) -> pl.DataFrame:
        """Each allocation with its GPU id, data and busy seconds in the window, and has_piece."""
        return self._allocations()

    def allocation_detail(self) -> pl.DataFrame:
        """allocation_use with the sums of each allocation's parts in the window (facts.ALLOCATION_PARTS)
        and its GPU's index and model."""
        if ("detail",) not in self._memo:
            named = self.q("SELECT gid, gpu, model, equiv FROM wgpu")
            self._memo[("detail",)] = self._allocations().hstack(self._detail).join(named, on="gid", how="left", maintain_order="left")
        return self._memo[("detail",)].clone()

    def detail_numbers(self) -> pl.DataFrame:
        """allocation_detail's DETAIL_NUMBERS and model, in al's row order without al's text: what MFU sums per job beside al."""
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
        job filter, of the GPUs the selected jobs hold (every hour of theirs)."""
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
        """Time-weighted utilization by one of params.DIMENSIONS: GPU dimensions cover all capacity,
        job dimensions the time jobs held GPUs."""
        if by in GPU_DIMS and self.job_filtered:
            out = self._held_use(list(GPU_DIMS[by]))
            if out.is_empty():
                return out
            keys = list(GPU_DIMS[by])
            if not keys:  # the selection's one row: its no data as its totals have it (allocated less data), not unknown
                out = out.with_columns(pl.lit(self._selection_no_data(), pl.Float64).alias("no_data_gpu_h"))
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
        """Utilization by GPU dimension under a job filter: the selected jobs' data and busy time per GPU;
        capacity, no data and stranded time null (not attributable)."""
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
        """Per-bucket sums for timeline.compose_timelines: "pc" held parts by job dimension and model;
        "iv" every part by model (GPU dimensions only)."""
        queries = {**({"iv": facts.timeline_parts(False)} if gpu_dims else {}), "pc": facts.timeline_parts(True)}
        return bucketed_parts(self, queries, bsec, origin_us)

    def job_gpu_use(self, cluster: str, scheduler: str, job_key: str, bsec: float, origin: datetime) -> pl.DataFrame:
        """timeline.job_gpu_timeline's rows: the job's parts summed per GPU and bucket."""
        return job_gpu_parts(self, cluster, scheduler, job_key, bsec, origin)

    # --- waste ---

    def idle_stretches(self, kind: str = "idle") -> pl.DataFrame:
        """Allocated stretches of at least idle_min_duration, idle (below the threshold) or with no
        compute process ("no_process"), with their in-window GPU-hours and cost."""
        if kind not in ("idle", "no_process"):
            raise KeyError(kind)
        if ("idle_stretches", kind) not in self._memo:
            self._memo[("idle_stretches", kind)] = self._islands(kind)
        return self._memo[("idle_stretches", kind)].clone()

    def _islands(self, kind: str) -> pl.DataFrame:
        rows = self.fw.runs("nop" if kind == "no_process" else kind)  # both kinds in one statement
        return rows.select([pl.col(c).cast(t) for c, t in STRETCH_SCHEMA.items()])

    def waste_by(self, by: str = "account", kind: str = "idle") -> pl.DataFrame:
        return waste_by(self.idle_stretches(kind), by)

    def top_wasteful_jobs(self, n: int = 10) -> pl.DataFrame:
        """The jobs with the most idle allocated GPU-hours in the window."""
        return top_wasteful_jobs(self.idle_stretches("idle"), n, self.job_runtimes)

    def job_runtimes(self, jobs: pl.DataFrame) -> pl.DataFrame:
        """sql.JOB_RUNTIMES' rows of the window's `jobs` (rows of JOB_KEY)."""
        return self.q(sql.JOB_RUNTIMES, tables={"_jobs": jobs})

    def totals(self) -> Totals:
        t = self._job_totals() if self.job_filtered else fleet_totals(
            self.per_gpu(), self.q(sql.ALLOCATED_GPU_H_TOTAL), self.idle_stretches("idle"), self.idle_stretches("no_process"), self.p.filters)
        if self.p.filters.model is None:
            return t
        n, gpu_h = self.q(sql.MODEL_UNKNOWN_JOBS).row(0)
        return replace(t, model_unknown_jobs=n, model_unknown_gpu_h=gpu_h)

    def _selection_no_data(self) -> float:
        """A job filter's no data: allocated minus data, clipped at 0 per row of the filter's own dimension
        (window.JOB_FILTER_DIMS), summed."""
        rows = self.utilization(next(d for k, d in JOB_FILTER_DIMS.items() if getattr(self.p.filters, k) is not None))
        return float(rows["no_data_gpu_h"].sum()) if not rows.is_empty() else 0.0

    def _job_totals(self) -> Totals:
        """totals() under a job filter: the sums of the selected jobs' rows of utilization."""
        used = self._allocations(self._with_piece())
        data = float(used["data_s"].sum()) / 3600 if not used.is_empty() else 0.0
        busy = float(used["busy_s"].sum()) / 3600 if not used.is_empty() else 0.0
        idle, nop = self.idle_stretches("idle"), self.idle_stretches("no_process")
        g = self.per_gpu()
        held = g.join(used.select("cluster", "host", "gpu_uuid", "gi").unique(), on=["cluster", "host", "gpu_uuid", "gi"], how="semi") if not g.is_empty() else g
        unpriced = sorted({m for m in held.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m} if not held.is_empty() else set())
        no_data = self._selection_no_data()
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
