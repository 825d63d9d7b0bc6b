"""The raw path: a window's figures from every sample, read into arrays - the tests' oracle.

`RawAnalysis(con, params)` is a gpufleet.analytics.core.Analysis whose window is not read from the
facts' parts but from every sample of it (tests/support/gputime.py GpuTime: each GPU's sample
intervals, a sample holding until the next, at most max_gap); each allocation's data and busy time,
the idle runs and the timelines are look-ups in those arrays (tests/support/stretches.py meets the
runs with the allocations). Every other figure runs the product's own queries over what it
registers (alv, variants, gpu_use), so the facts path is held to an independent reading of the
samples, not to itself. No surface reads it: the product has one path (the facts').
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from gpufleet.analytics import sql
from gpufleet.analytics.core import DETAIL_NUMBERS, Analysis
from gpufleet.analytics.timeline import JOB_TIMELINE_SCHEMA
from gpufleet.times import epoch_us
from tests.support.gputime import GPU_KEY_HASH, GpuTime
from tests.support.stretches import NAMED_BY_ALLOCATION, stretches

# al's rows (to which the analysis adds each allocation's look-ups: the table alv) with their GPU's
# hash, and the GPUs of the line (_line_ids: cluster, host, gpu_uuid, gi, gid) hashed alike: each
# allocation finds its gid by the hash. Numbers only: al's row number (rowid: its insertion order,
# the order a scan gives), GPU hash and times; its text stays in al, read for the rows a figure names
ALLOCATION_ROWS = f"SELECT rowid AS i, {GPU_KEY_HASH} AS gh, a0, a1 FROM al"
LINE_ID_HASHES = f"SELECT {GPU_KEY_HASH} AS gh, gid FROM _line_ids"
# the row numbers of one job's allocations in al
JOB_ALLOCATION_ROWS = """SELECT rowid AS i FROM al
WHERE cluster = $of_cluster AND scheduler = $of_scheduler AND job_key = $of_job_key ORDER BY rowid"""
# the allocations (alv) the timelines' held-data time is read for
TIMELINE_HELD = "SELECT cluster, host, gpu_uuid, gi, partition, account, user_name, a0, a1 FROM alv"


def line_variants(gt: GpuTime) -> pl.DataFrame:
    """gid, gpu, model, equiv, variants: each GPU id of the line named by its first variant (by
    vid) - its gpu index, its first known model, its MIG share - and how many variants it has:
    what its allocations' detail is named by (RawAnalysis.allocation_detail)."""
    return gt.gpus.sort("vid").group_by("gid", maintain_order=True).agg(
        pl.first("gpu"), pl.col("model").drop_nulls().first(), pl.first("equiv"), pl.len().alias("variants"))


class RawAnalysis(Analysis):
    """core.Analysis read from every sample of the window (see the module docstring). `detail`:
    read the detail columns (memory, tensor activity, clock) at once, for an analysis that will
    ask for per-job detail anyway (one read of the window, not two)."""

    def __init__(self, con: Any, params: Any, *, now: datetime | None = None, detail: bool = False):
        self._read_detail = detail
        super().__init__(con, params, now=now)

    def _read(self, now: datetime | None, timeline: bool, held_hosts: list[str] | None) -> None:
        """The window's samples as arrays (every GPU's, under a job filter too) and each
        allocation's look-ups in them (alv)."""
        self._make("al")
        self._unbuilt.discard("use")  # (alv is made below, from the arrays)
        self.gt = GpuTime(self.con, self.bind, detail=self._read_detail)
        self.con.register("variants", self.gt.gpus.to_arrow())
        self._allocation_use()
        return None

    @property
    def ids(self) -> pl.DataFrame:
        return self.gt.ids

    def edge_warnings(self) -> list[str]:
        return []  # (it reads samples only: no bucket of facts to find retired)

    def _allocation_use(self) -> None:
        """alv: each allocation with its GPU id, data and busy seconds in the window, and whether
        any sample interval overlaps its part inside the window (then it has pieces there, as
        oracle_sql.PIECES would give). Held here as numbers (_alv: a0, a1 and the look-ups, a row
        per row of al, in its order); al's text columns stay in DuckDB, read for the rows a figure
        names (_allocations)."""
        al = self.q(ALLOCATION_ROWS)
        if not np.array_equal(al["i"].to_numpy(), np.arange(al.height)):
            # alv (SQL) sets the look-ups beside al's rows by position: a scan must give them in order
            raise RuntimeError("the window's allocations (al) were not read in their row order; expected a scan of a "
                               "DuckDB table to keep its insertion order (preserve_insertion_order)")
        ids = self.q(LINE_ID_HASHES, tables={"_line_ids": self.gt.ids})
        gid = al["gh"].replace_strict(ids["gh"], ids["gid"], default=None, return_dtype=pl.Int64)
        al = al.select("a0", "a1", gid=gid)
        g = gid.fill_null(-1).to_numpy()
        a0, a1 = al["a0"].dt.epoch("us").to_numpy(), al["a1"].dt.epoch("us").to_numpy()
        # looked up in the line's order (by GPU, then start; the ends mostly follow): the searches
        # need no sort of their keys then (gputime.search); the answers go back to the rows' order
        order = np.lexsort((a0, g))
        g, a0, a1 = g[order], a0[order], a1[order]
        s, e = epoch_us(self.p.start), epoch_us(self.p.end)
        c0, c1 = np.maximum(a0, s), np.minimum(a1, e)
        data, busy, has = np.empty(len(order)), np.empty(len(order)), np.empty(len(order), dtype=bool)
        data[order], busy[order] = self.gt.integrals(g, c0, c1)
        # a piece inside the window: an allocation of the reach only (a job that ended in the half
        # hour before the window) is no row of the window's utilization by job dimension
        has[order] = self.gt.overlaps(g, c0, c1) & (g >= 0) & (c1 > c0)
        self._alv = al.with_columns(data_s=pl.Series(data), busy_s=pl.Series(busy), has_piece=pl.Series(has))
        self._alv_order = order  # (held_data merges in that order)
        self.con.register("_alv_use", pa.table({"gid": gid.to_arrow(), "data_s": data, "busy_s": busy, "has_piece": has}))
        self.con.execute(sql.ALLOCATION_USE)

    def held_data(self, s: int, e: int) -> pl.DataFrame:
        """gid, alloc_data_s: each GPU's data seconds in [s, e) (epoch us) while any job held it -
        its allocations' union, overlapping or touching ones (a shared GPU, a mapping that outlives
        its job by max_gap) as one, so a second holder is not counted twice (the rule of
        tests/support/oracle_sql.HELD), merged in arrays: in the order the allocations were looked
        up in (_alv_order: by GPU, then start - the order of their starts is all the merge needs;
        the running maximum of the ends makes ties' order irrelevant)."""
        order = self._alv_order
        gid = self._alv["gid"].fill_null(-1).to_numpy().astype(np.int64)[order]  # (-1: a GPU with no sample holds no data)
        a0 = np.maximum(self._alv["a0"].dt.epoch("us").to_numpy()[order], s)
        a1 = np.minimum(self._alv["a1"].dt.epoch("us").to_numpy()[order], e)
        some = (gid >= 0) & (a1 > a0)  # the union of the clipped allocations is the clipped union
        width = e - s + 1  # keys gid x width + (t - s): one ascending line over every GPU
        k0, k1 = gid[some] * width + (a0[some] - s), gid[some] * width + (a1[some] - s)
        if not len(k0):
            return pl.DataFrame(schema={"gid": pl.Int64, "alloc_data_s": pl.Float64})
        reach = np.maximum.accumulate(k1)  # the furthest end so far (of this GPU: keys ascend by GPU)
        first = np.ones(len(k0), dtype=bool)
        first[1:] = k0[1:] > reach[:-1]  # starts a holding unless it meets one already open
        at = np.flatnonzero(first)
        m0, m1 = k0[at], np.maximum.reduceat(k1, at)
        g = m0 // width
        data, _ = self.gt.integrals(g, m0 - g * width + s, m1 - g * width + s)
        where = np.flatnonzero(np.diff(g, prepend=-1))  # (g ascends: each GPU's first holding)
        gids = g[where]
        return pl.DataFrame({"gid": gids, "alloc_data_s": np.add.reduceat(data, where)}, schema={"gid": pl.Int64, "alloc_data_s": pl.Float64})

    def detail_time(self) -> GpuTime:
        """The window's arrays with the detail columns (memory, tensor activity, SM clock): the
        first call reads the window's samples again with them, later ones hand out the same arrays."""
        if self.gt.fb is None:
            self.gt = None  # the plain arrays go first: the detail ones are a superset
            self.gt = GpuTime(self.con, self.bind, detail=True)
        return self.gt

    def job_allocations(self, cluster: str, scheduler: str, job_key: str) -> pl.DataFrame:
        """One job's allocations in the window (alv's rows) with the GPU ids of the current arrays
        (gid null: a GPU with no sample in the window)."""
        rows = self.q(JOB_ALLOCATION_ROWS, of_cluster=cluster, of_scheduler=scheduler, of_job_key=job_key)["i"].to_numpy()
        return self._current_ids(self._allocations(rows))

    def _current_ids(self, alv: pl.DataFrame) -> pl.DataFrame:
        """Rows of alv with the gid of the arrays now held (detail_time may have re-read them)."""
        return alv.drop("gid").join(self.ids, on=["cluster", "host", "gpu_uuid", "gi"], how="left", maintain_order="left")

    def allocation_detail(self) -> pl.DataFrame:
        """alv with what each allocation's pieces inside the window add up to
        (GpuTime.allocation_detail: has_piece, has_util, fb_max, any_s, tensor_s, clocked_s, tclock,
        tw_clocked, tnoclock) and its GPU's gpu index and model (line_variants). Unless the analysis
        read the detail columns up front (detail=True), the first call re-reads the window's
        samples with them (same intervals, ids)."""
        if ("detail",) not in self._memo:
            if not self.gt.has_detail:
                self.detail_time()
            al = self._current_ids(self._allocations()).join(line_variants(self.gt).drop("variants"), on="gid", how="left",
                                                             maintain_order="left")
            # each allocation's part inside the window (the one its pieces are counted in, as
            # has_piece in alv: an allocation of the reach only has none)
            s, e = epoch_us(self.p.start), epoch_us(self.p.end)
            c0 = np.maximum(al["a0"].dt.epoch("us").to_numpy(), s)
            c1 = np.minimum(al["a1"].dt.epoch("us").to_numpy(), e)
            gid = np.where(c1 > c0, al["gid"].fill_null(-1).to_numpy(), -1)
            d = self.gt.allocation_detail(gid, c0, np.maximum(c1, c0), al["equiv"].fill_null(1.0).to_numpy(), s, e)
            self._memo[("detail",)] = al.with_columns([pl.Series(k, v) for k, v in d.items()]).with_columns(
                pl.col("fb_max", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock").fill_nan(None))
        return self._memo[("detail",)].clone()

    def detail_numbers(self) -> pl.DataFrame:
        return self.allocation_detail().select(*DETAIL_NUMBERS, "model")

    def _per_gpu(self) -> pl.DataFrame:
        s, e = epoch_us(self.p.start), epoch_us(self.p.end)
        use = self.gt.per_gpu(s, e).join(self.held_data(s, e), on="gid", how="left")
        return self.q(sql.PER_GPU, tables={"gpu_use": use})

    def _islands(self, kind: str) -> pl.DataFrame:
        runs = self.gt.runs(kind, self.p.idle_threshold, round(self.p.idle_min_duration.total_seconds() * 1_000_000))
        held, first = self._holds()
        return stretches(runs, held, self.gt.gpus, self.prices, epoch_us(self.p.start), epoch_us(self.p.end),
                         self.p.idle_min_duration.total_seconds(), rows_of=lambda rows: self.allocation_text(first[rows], NAMED_BY_ALLOCATION))

    def _holds(self) -> tuple[pl.DataFrame, np.ndarray]:
        """The allocations as the idle runs meet them (contract 4b: the time a job held a GPU idle): a requeued job's runs on
        one GPU that follow each other with no time between (al's rows for each run) are one hold, its runs' union; and, per
        hold, its first row of al (its names). A hold per row of al everywhere else."""
        keys = self.allocation_text(np.arange(self._alv.height), ("cluster", "scheduler", "job_key"))
        rows = pl.concat([self._alv.select("gid", "a0", "a1"), keys], how="horizontal").with_row_index("row")
        rows = rows.sort("gid", "cluster", "scheduler", "job_key", "a0", nulls_last=True)
        same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(1)) for c in ("gid", "cluster", "scheduler", "job_key")])
        follows = same & pl.col("gid").is_not_null() & (pl.col("a0") == pl.col("a1").shift(1))
        holds = rows.with_columns(hold=(~follows.fill_null(False)).cum_sum()).group_by("hold", maintain_order=True).agg(
            pl.first("gid"), pl.min("a0"), pl.max("a1"), pl.first("row"))
        return holds.select("gid", "a0", "a1"), holds["row"].cast(pl.Int64).to_numpy()

    # --- over time ---

    def timeline_use(self, gpu_dims: bool, bsec: float, origin_us: int) -> dict[str, pl.DataFrame]:
        """The timelines' per-bucket sums (what Analysis.timeline_use sums from the parts) from the arrays."""
        out = {}
        # which model each GPU id is, as per_gpu() (and so utilization()) groups it
        models = self.per_gpu().select("cluster", "host", "gpu_uuid", "gi", "model").join(self.gt.ids, on=["cluster", "host", "gpu_uuid", "gi"])
        if gpu_dims:
            whole = models.select("cluster", "model", "gid", a0=pl.lit(self.p.start), a1=pl.lit(self.p.end))
            out["iv"] = self._bucket_use(whole, ["cluster", "model"], bsec, origin_us)
        held = pl.from_arrow(self.con.sql(TIMELINE_HELD).to_arrow_table())
        held = held.join(models, on=["cluster", "host", "gpu_uuid", "gi"])  # allocations of GPUs without samples hold no data
        out["pc"] = self._bucket_use(held, ["cluster", "model", "partition", "account", "user_name"], bsec, origin_us)
        return out

    def _bucket_use(self, spans: pl.DataFrame, keys: list[str], bsec: float, origin_us: int) -> pl.DataFrame:
        """Data and busy GPU-hours of each span (gid, a0, a1 plus `keys`) per bucket k it crosses:
        the span is cut at bucket edges (split_at_buckets) and each part is two look-ups in the
        arrays' cumulative sums, so no sample is joined with anything."""
        df = split_at_buckets(self, spans, bsec, origin_us)
        data, busy = self.gt.integrals(df["gid"].to_numpy(), df["_a"].to_numpy(), df["_b"].to_numpy())
        return df.select(*keys, "k", data_gpu_h=pl.Series(data) / 3600, busy_gpu_h=pl.Series(busy) / 3600)

    def job_gpu_use(self, cluster: str, scheduler: str, job_key: str, bsec: float, origin: datetime) -> pl.DataFrame:
        """timeline.job_gpu_timeline's rows from the detail arrays (GpuTime.bucket_detail: one slice per allocation)."""
        p = self.p
        if self.job_allocations(cluster, scheduler, job_key)["gid"].is_not_null().sum() == 0:
            return pl.DataFrame(schema=JOB_TIMELINE_SCHEMA)  # no such job, or no sample of its GPUs: no need of the detail arrays
        gt = self.detail_time()
        al = self.job_allocations(cluster, scheduler, job_key)  # the ids of the arrays now read
        d = gt.bucket_detail(al["gid"].fill_null(-1).to_numpy(), al["a0"].dt.epoch("us").to_numpy(), al["a1"].dt.epoch("us").to_numpy(),
                             epoch_us(p.start), epoch_us(p.end), round(bsec * 1_000_000), epoch_us(origin))
        if not len(d["row"]):
            return pl.DataFrame(schema=JOB_TIMELINE_SCHEMA)
        rows = al.select("host", "gpu_uuid", pl.col("gi").cast(pl.Int16))[d["row"]].with_columns(
            k=pl.Series(d["k"]), gpu=gt.gpus["gpu"].cast(pl.Int16).gather(d["vid"]),  # gpus: one row per vid, in order
            data_s=pl.Series(d["data_s"]), busy=pl.Series(d["busy"]), util_n=pl.Series(d["util_n"]),
            fb=pl.Series(d["fb_max"]).fill_nan(None))
        # a job holding a GPU twice (two allocations): its parts add up in the same rows, as in SQL
        out = rows.group_by("k", "host", "gpu_uuid", "gi", maintain_order=True).agg(
            pl.first("gpu"), pl.sum("data_s"), pl.sum("busy"), pl.sum("util_n"), pl.max("fb"))
        return out.select(
            (pl.lit(origin) + pl.duration(seconds=pl.col("k") * bsec)).alias("bucket"), "host", "gpu", "gpu_uuid", "gi",
            pl.when((pl.col("util_n") > 0) & (pl.col("data_s") > 0)).then(pl.col("busy") / pl.col("data_s")).alias("utilization_pct"),
            pl.col("fb").alias("fb_used_max_mib"),
            pl.when(pl.col("util_n") > 0).then(pl.col("data_s") / 3600).alias("data_h"),
        ).cast(JOB_TIMELINE_SCHEMA).sort("host", "gpu", "gi", "bucket", "gpu_uuid")


def split_at_buckets(a: Analysis, spans: pl.DataFrame, bsec: float, origin_us: int) -> pl.DataFrame:
    """Each span (a0, a1 and any other columns) clipped to the analysis' window and cut at its
    buckets' edges (bsec seconds apart from origin_us): a row per bucket k it crosses, with the
    part's edges _a and _b in epoch microseconds."""
    start, end = epoch_us(a.p.start), epoch_us(a.p.end)
    b_us = round(bsec * 1_000_000)
    df = spans.with_columns(
        pl.max_horizontal(pl.col("a0").dt.epoch("us"), pl.lit(start)).alias("_a"),
        pl.min_horizontal(pl.col("a1").dt.epoch("us"), pl.lit(end)).alias("_b"),
    ).filter(pl.col("_b") > pl.col("_a"))
    df = df.with_columns(pl.int_ranges((pl.col("_a") - origin_us) // b_us, (pl.col("_b") - origin_us - 1) // b_us + 1).alias("k")).explode("k")
    return df.with_columns(
        pl.max_horizontal("_a", pl.col("k") * b_us + origin_us).alias("_a"),
        pl.min_horizontal("_b", (pl.col("k") + 1) * b_us + origin_us).alias("_b"),
    )
