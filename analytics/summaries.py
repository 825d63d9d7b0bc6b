"""A window's sample intervals from per-GPU bucket summaries, raw samples only where they must be.

gpufleet.collector.summaries writes, for every closed hour, one row per GPU and bucket (5 min)
with the sums the figures need and the idle / no-process runs touching the bucket's edges. An
analysis (core.Analysis) asks the arrays of gputime.GpuTime four things: data and busy time of
[a, b) on a GPU (integrals), whether a sample interval overlaps [a, b) (overlaps), per-GPU
totals (per_gpu) and the idle and no-process runs (runs). SummaryTime answers them exactly on a
line per GPU made of two kinds of segment, in time order:

- a whole summarised segment [s0, s1): a bucket, or the part of one between the allocation
  edges the summary was cut at (gpufleet.collector.summaries): its sums, and its runs as pieces -
  the run touching its start, the one touching its end (one piece if it is idle throughout) and
  the runs inside it long enough to matter;
- a raw piece: a sample interval (gputime's rule: until the next sample, at most max_gap) cut at
  bucket edges, in every bucket a summary cannot answer: one cut by the window's edges (start,
  end, and the extended read window), one where an allocation on that GPU starts or ends inside
  a segment (the summary was written before the store knew of it), one of an hour with no
  current summary for these parameters (late data), one after the end of an open hour's summary
  (the newest minutes: upkeep summarises the open hour up to its settled buckets), or one the
  summary marks inexact.

Consecutive whole segments of a GPU are joined into one entry of the line between the times the
analysis will look up (its allocations' edges, the window's, its timeline's bucket edges from the
window's start: `grid_us`), so the line holds a few entries per GPU and timeline bucket, not one
per 5 minutes. Every look-up the analysis makes falls on an entry's edge or inside a raw bucket,
so the sums of whole segments are never split; look-ups inside an entry (a timeline on other
edges) are answered by the line built again with the buckets they fall in read raw for every
GPU (exact; a few buckets per look-up time).
Reads: the summary rows of the window (GPUs x buckets) and the raw samples of the raw buckets and
their neighbours (a bucket's intervals depend on samples up to max_gap either side), never the
window's samples. An hour none of whose buckets is read raw and inside which no look-up falls
for every GPU (the grid, the window's edges) is read from its joined segments instead
(gpufleet.collector.summaries.coarsen: the hour's segments joined at write time between the
allocation edges the writer knew; a few rows per GPU-hour instead of 12+); an allocation edge
that falls inside one (learnt of later) is found on the built line as for the buckets, and its
hour read from the buckets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from gpufleet.analytics import sql
from gpufleet.analytics.gputime import GpuTime, _side_by_side, _variants, per_gpu_cumsum, search
from gpufleet.times import epoch_us, from_epoch_us
from gpufleet.collector import summaries as cs

KEY = ["cluster", "host", "gpu_uuid", "gi"]
HOUR_US = 3_600_000_000


# What the line keeps of a summary row (sql.summary_rows), with detail also what allocation_detail
# adds up
_SEGMENT = ("h", "gh", "s0", "s1", "data_s", "busy_s")
_DETAIL = ("covered_us", "fb_max", "tensor_known_s", "clocked_s", "tensor_clock_s", "tensor_clocked_s", "tensor_unclocked_s")
# allocation_detail's entry sums of a whole segment (SummaryTime._entry_detail): its column and
# what to divide it by (and "uk", whether a utilization is known: data_s > 0)
_DETAIL_ENTRY = {"any": ("covered_us", 1e6), "tk": ("tensor_known_s", 1.0), "ck": ("clocked_s", 1.0),
                 "tcl": ("tensor_clock_s", 1.0), "tcd": ("tensor_clocked_s", 1.0), "tun": ("tensor_unclocked_s", 1.0),
                 "fb": ("fb_max", 1.0)}
_NUMPY = {"h": np.uint64, "gh": np.uint64, "s0": np.int64, "s1": np.int64, "covered_us": np.int64}  # their dtypes; the rest: float64
_BATCH_ROWS = 125_000  # summary rows per batch: the batch in flight is the peak at 1,024 GPUs (0.43 GiB; 0.50 at 250,000)


def _q(con: Any, query: str, bind: dict[str, Any]) -> pl.DataFrame:
    return pl.from_arrow(con.sql(query, params=sql.bound(query, bind)).to_arrow_table())


def _batches(con: Any, query: str, bind: dict[str, Any]) -> Iterator[pl.DataFrame]:
    """The query's rows about _BATCH_ROWS at a time, in the order DuckDB streams them (no
    particular one). DuckDB hands its parallel plan's small chunks on as they come (~1,800 rows
    each, whatever batch size is asked): gathered here, or each batch's fixed cost (a few dozen
    array and frame operations) is paid ~60 times as often."""
    reader = con.sql(query, params=sql.bound(query, bind)).to_arrow_reader(_BATCH_ROWS)
    chunks: list[pa.RecordBatch] = []
    rows = 0
    for chunk in reader:
        if chunk.num_rows:
            chunks.append(chunk)
            rows += chunk.num_rows
        if rows >= _BATCH_ROWS:
            yield pl.from_arrow(pa.Table.from_batches(chunks))
            chunks, rows = [], 0
    if rows:
        yield pl.from_arrow(pa.Table.from_batches(chunks))


def _index_of(hashes: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Where each of `h` is in `hashes` (sorted; every one of h among them): np.searchsorted's
    answer by a hash look-up, ~4x faster for the millions of rows of a fleet's week."""
    return pl.Series(h, dtype=pl.UInt64).replace_strict(
        pl.Series(hashes, dtype=pl.UInt64), pl.Series(np.arange(len(hashes)), dtype=pl.Int64)).to_numpy()


def _unique_variants(seen: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The (h, gh) pairs of `seen`, each variant hash h once."""
    h, gh = (np.concatenate([x[j] for x in seen]) if seen else np.zeros(0, np.uint64) for j in (0, 1))
    # a variant's GPU is the same wherever it is seen; by a hash table (np.unique sorts them all:
    # 0.3 s of the 16,384-GPU week's millions of batch-variant pairs)
    pairs = pl.DataFrame({"h": h, "gh": gh}, schema={"h": pl.UInt64, "gh": pl.UInt64}).unique("h", keep="any").sort("h")
    return pairs["h"].to_numpy(), pairs["gh"].to_numpy()


def _outside(gk: pl.DataFrame, gh: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Which rows (GPU hash gh, bucket k) are not among gk's GPU-buckets."""
    keep = np.ones(len(gh), dtype=bool)
    if len(gh) and not gk.is_empty():
        rows = pl.DataFrame({"gh": gh, "k": k}, schema={"gh": pl.UInt64, "k": pl.Int64}).with_row_index("i")
        keep[rows.join(gk, on=["gh", "k"], how="semi")["i"].to_numpy()] = False
    return keep


def _cut_key(gh: np.ndarray, t: np.ndarray) -> np.ndarray:
    """One 64-bit key for a (GPU hash, time) pair, to find a segment's start among the look-ups
    in one hash probe. Two pairs may share a key (~1 in 2^64): a segment then starts an entry of
    the line it need not have - more entries, the same sums."""
    return gh.astype(np.uint64, copy=False) ^ (t.astype(np.int64, copy=False).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def _stable_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.argsort(keys, kind="stable") and the keys in that order, by numpy's quicksort when no two
    keys tie - then every sort gives the stable order; else by numpy's stable sort. (Polars'
    arg_sort, used before, took 1.1 GiB beside a line of 29M keys - the peak of the 100,000-GPU
    week - where the quicksort takes its answer's 0.22 GiB, in 2.1 s against 4.0 s.)"""
    order = np.argsort(keys)
    ordered = keys[order]
    if len(keys) > 1 and not (ordered[1:] > ordered[:-1]).all():
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
    return order, ordered


def _laid_out(raw: np.ndarray, seg: np.ndarray, share: np.ndarray | None, order: np.ndarray) -> np.ndarray:
    """`raw` then `seg` x `share` (None: 1) as one float64 column, in `order`."""
    out = np.empty(len(raw) + len(seg))
    out[:len(raw)] = raw
    if share is None:
        out[len(raw):] = seg
    else:
        np.multiply(seg, share, out=out[len(raw):])
    return out[order]


def _chain(k0: np.ndarray, k1: np.ndarray, *carried: np.ndarray, gpu: np.ndarray | None = None,
           in_order: bool = False) -> tuple[np.ndarray, ...]:
    """Pieces [k0, k1) chained where one ends as the next starts - of the same `gpu` when given
    (line keys carry their GPU): each chain's start and end and the `carried` arrays' values at
    its first piece, in order. `in_order`: only pieces next to each other as given are chained
    (no sort; pieces in row order, each chain still whole or in a few parts that a later
    chaining of all of them joins)."""
    order = None
    if not in_order and gpu is None:
        order, k0 = _stable_order(k0)
        k1 = k1[order]
    elif not in_order:
        order = np.lexsort((k0, gpu))
        k0, k1 = k0[order], k1[order]
    linked = np.zeros(len(k0), dtype=bool)
    linked[1:] = k1[:-1] == k0[1:]
    if gpu is not None:
        g = gpu if order is None else gpu[order]
        linked[1:] &= g[1:] == g[:-1]
    i0 = np.flatnonzero(~linked)
    i1 = np.append(i0[1:] - 1, len(k0) - 1) if len(i0) else i0
    first = i0 if order is None else order[i0]
    return (k0[i0], k1[i1], *(c[first] for c in carried))


_SPANS = {"gh": pl.UInt64, "kf": pl.Int64, "kl": pl.Int64}  # a joined segment's GPU hash, first and last bucket


def _merge(seg: dict[str, np.ndarray], starts: np.ndarray, b: int) -> tuple[dict[str, np.ndarray], pl.DataFrame]:
    """Consecutive segments of one GPU variant that follow each other without a gap joined into
    one (their sums added, memory high-water the larger), except where `starts` says a segment
    must begin one (a look-up will fall on its start). Rows come from hour files sorted by GPU and
    time, so most neighbours are consecutive. Also: the GPU hash and first and last bucket of
    each joined segment (a bucket another batch sends to the raw samples must not lie inside one)."""
    gh, h, s0, s1 = seg["gh"], seg["h"], seg["s0"], seg["s1"]
    n = len(s0)
    new = starts.copy()
    if n:
        new[0] = True
        new[1:] |= (gh[1:] != gh[:-1]) | (h[1:] != h[:-1]) | (s0[1:] != s1[:-1])
    at = np.flatnonzero(new)
    if len(at) == n:
        return seg, pl.DataFrame(schema=_SPANS)
    last = np.append(at[1:] - 1, n - 1)
    out = {}
    for c, v in seg.items():
        out[c] = (v[at] if c in ("h", "gh", "s0") else v[last] if c == "s1" else
                  np.fmax.reduceat(v, at) if c == "fb_max" else np.add.reduceat(v, at))
    joined = last > at
    return out, pl.DataFrame({"gh": out["gh"][joined], "kf": out["s0"][joined] // b, "kl": (out["s1"][joined] - 1) // b}, schema=_SPANS)


def _run_pieces(rows: pl.DataFrame, keep: np.ndarray, seg: dict[str, np.ndarray], kind: str,
                skip: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The run pieces (h, a0, a1; epoch us) the summary rows `keep` of `rows` (their
    segments: `seg`) record for kind "idle" or "nop": the whole segment when it is in the run
    throughout, else the run touching its start, the one touching its end, and the runs inside
    it (gpufleet.collector.summaries.bucket_facts) - none of the segments `skip` leaves out (in
    GPU-buckets read raw). In row order - each row's head, its inner runs, its tail - so the
    pieces of rows in time order chain in one pass (_chain in_order), no sort."""
    head, tail = rows[f"{kind}_head_us"].to_numpy(), rows[f"{kind}_tail_us"].to_numpy()
    if not keep.all():
        head, tail = head[keep], tail[keep]
    h, s0, s1 = seg["h"], seg["s0"], seg["s1"]
    # the rows with a run at their start, and those with one at their end (a whole segment is its head)
    has_h, has_t = head > 0, (tail > 0) & (head != s1 - s0)
    if skip is not None:
        has_h &= ~skip
        has_t &= ~skip
    ih, it = np.flatnonzero(has_h), np.flatnonzero(has_t)
    # the runs inside a row, by row (no lists where the bucket is not longer than what a run must
    # last; the hours' joined segments have them)
    ri = np.zeros(0, dtype=np.int64)
    n_in = None
    runs = rows[f"{kind}_runs"] if f"{kind}_runs" in rows.columns else None
    if runs is not None:
        if not keep.all():
            runs = runs.filter(pl.Series(keep))
        lens = runs.list.len().fill_null(0).to_numpy()
        if lens.any():
            flat = runs.filter(pl.Series(lens > 0)).explode().struct
            ri = np.repeat(np.arange(len(lens)), lens)
            b0 = rows["b0"].to_numpy()
            b0 = (b0 if keep.all() else b0[keep])[ri]
            r0, r1 = b0 + flat.field("r0_us").to_numpy(), b0 + flat.field("r1_us").to_numpy()
            if skip is not None and skip[ri].any():
                m = ~skip[ri]
                ri, r0, r1 = ri[m], r0[m], r1[m]
            n_in = np.bincount(ri, minlength=len(lens))
    per_row = has_h.astype(np.int64) + has_t
    if n_in is not None:
        per_row += n_in
    first = np.cumsum(per_row)
    first -= per_row  # a row's first piece: after the pieces of the rows before it
    at_h = first[ih]
    at_t = first[it] + has_h[it] + (n_in[it] if n_in is not None else 0)
    out = {}
    cols = [("h", h[ih], h[it], np.uint64), ("a0", s0[ih], s1[it] - tail[it], np.int64), ("a1", s0[ih] + head[ih], s1[it], np.int64)]
    for c, x_h, x_t, t in cols:
        v = np.empty(int(first[-1] + per_row[-1]) if len(per_row) else 0, dtype=t)
        v[at_h], v[at_t] = x_h, x_t
        out[c] = v
    if len(ri):
        j = np.arange(len(ri)) - (np.cumsum(n_in) - n_in)[ri]  # its place among its row's inner runs
        at_i = first[ri] + has_h[ri] + j
        out["h"][at_i], out["a0"][at_i], out["a1"][at_i] = h[ri], r0, r1
    return out


def summary_time(con: Any, bind: dict[str, Any], cuts: pl.DataFrame, detail: bool = False,
                 grid_us: int | None = None, held: np.ndarray | None = None) -> "SummaryTime | None":
    """The window's line from summaries, or None when no summarised hour with these parameters
    meets the read window (then the raw arrays, GpuTime, are the way). `cuts`: cluster, host,
    gpu_uuid, gi, t (epoch us) - the times the analysis will look up on each GPU. `detail`: also
    what allocation_detail adds up (memory, tensor activity, clock). `grid_us`: the step of the
    times every GPU will be looked up at from the window's start on (a timeline's bucket edges):
    segments are joined between those and the cuts (None: each segment stays one entry).
    `held`: only these GPUs (their hashes, as `cuts` names them: gh) - under a job filter, the
    GPUs the selected jobs held (Analysis held_only); None: every GPU."""
    hours = _q(con, sql.SUMMARY_HOURS, {**bind, "hash_by": cs.HASH_BY})
    if hours.is_empty():
        return None
    bucket_s = int(hours["bucket_s"].mode().sort()[0])
    return SummaryTime(con, bind, cuts, hours.filter(pl.col("bucket_s") == bucket_s).select("hour", "ends", "coarse", "files", "coarse_files"),
                       bucket_s, detail=detail, held=held, grid_us=grid_us)


def _coarse_hours(hours: pl.DataFrame, b: int, raw_ks: np.ndarray, known_k: np.ndarray, grid0: int | None, grid_us: int | None,
                  edges: list[int]) -> np.ndarray:
    """Which of `hours` (hour, ends, coarse) to read as joined segments: those that have them, hold
    no bucket read raw (raw_ks for every GPU, known_k for one) and no look-up made on every GPU
    strictly inside (the window's `edges`, the grid's points from grid0 every grid_us)."""
    h0 = hours["hour"].dt.epoch("us").to_numpy().astype(np.int64, copy=False)
    ok = hours["coarse"].to_numpy().astype(bool) & (hours["ends"].dt.epoch("us").to_numpy() == h0 + HOUR_US)
    for ks in (raw_ks, known_k):
        if len(ks):
            ok &= ~np.isin(h0 // HOUR_US, np.unique(ks * b // HOUR_US))
    for t in edges:
        ok &= ~((h0 < t) & (t < h0 + HOUR_US))
    if grid_us:
        after = grid0 + -((grid0 - h0 - 1) // grid_us) * grid_us  # the first grid point after the hour's start
        ok &= ~(after < h0 + HOUR_US)
    return ok


class SummaryTime(GpuTime):
    """GpuTime's interface (gpus, ids, integrals, overlaps, per_gpu, runs) over summaries."""

    def __init__(self, con: Any, bind: dict[str, Any], cuts: pl.DataFrame, hours: pl.DataFrame, bucket_s: int,
                 detail: bool = False, held: np.ndarray | None = None, also_raw: frozenset[int] = frozenset(),
                 grid_us: int | None = None, bad: pl.DataFrame | None = None, known_raw: pl.DataFrame | None = None):
        """`also_raw`: more buckets (k: [k x bucket, (k + 1) x bucket) since the epoch) to read raw
        for every GPU - those a look-up fell inside (see _answering). `detail`: also keep, per
        segment and raw piece, what allocation_detail adds up. `held`, `grid_us`: see summary_time.
        `bad`: the GPU-buckets (gh, k) where a cut falls inside a segment (an allocation the
        summary's writer did not know of yet), to read raw on that GPU; None: not known yet -
        the line built is checked for them, and built again with them when there are any.
        `known_raw`: more GPU-buckets (gh, k) read raw on one GPU, known before the rows are read:
        those a first build found (an inexact row) after another batch of rows had joined the
        bucket's other segments or chained its run pieces - the line built again with them."""
        self.fb = self.tensor = self.clock = None  # no per-sample detail arrays (GpuTime's bucket_detail reads raw)
        self.has_detail = detail
        self._con, self._bind, self._refined = con, bind, None
        self._args = (con, bind, cuts, hours, bucket_s, detail, held)
        self.also_raw, self.grid_us, self._bad, self._known_raw = also_raw, grid_us, bad, known_raw
        xs, xe = epoch_us(bind["xstart"]), epoch_us(bind["xend"])
        gap = round(bind["max_gap"] * 1_000_000)
        b = bucket_s * 1_000_000
        self.bucket_us = b
        self.base = xs - gap - 1
        self.span = (xe - self.base) + 2 * gap + 1
        kx0, kx1 = xs // b, (xe - 1) // b
        every = np.arange(kx0, kx1 + 1, dtype=np.int64)
        # (an open hour's summary ends before the hour does: the buckets after it are read raw)
        h_us, to_us = (hours[c].dt.epoch("us").to_numpy().astype(np.int64, copy=False) for c in ("hour", "ends"))
        in_hour = h_us[:, None] // b + np.arange(HOUR_US // b)[None, :]
        summarised = np.unique(in_hour[in_hour < (to_us // b)[:, None]])
        # buckets read raw for every GPU: not summarised, or cut by the window's edges
        k_all = set(every[~np.isin(every, summarised)].tolist()) | {k for k in also_raw if kx0 <= k <= kx1}
        for t in (epoch_us(bind["start"]), epoch_us(bind["end"]), xs, xe):
            if t % b and kx0 <= t // b <= kx1:
                k_all.add(t // b)
        read_all = sorted(k_all | {k + d for k in k_all for d in (-1, 1)})

        # the summary rows a batch at a time, each cut down at once to what the line needs (no
        # run lists, no DataFrame of the window's rows): 48 bytes a segment instead of ~250; then
        # consecutive segments joined (_merge) except where a look-up falls: a cut (the writer's,
        # off the bucket edges, or an allocation edge on one), the window's edges, the grid
        edge_cuts = cuts.filter(pl.col("t") % b == 0).select(pl.col("gh").cast(pl.UInt64), s0=pl.col("t").cast(pl.Int64)).unique().sort("s0")
        edge_t = edge_cuts["s0"].to_numpy()  # (a batch looks up the edges of its own buckets only)
        edge_key = pl.Series(_cut_key(edge_cuts["gh"].to_numpy(), edge_t))
        # the window's buckets whose start a look-up falls on for every GPU: the grid, the window's edges
        grid0, bucket_at = epoch_us(bind["start"]), np.arange(kx0, kx1 + 1, dtype=np.int64) * b
        on_grid = np.isin(bucket_at, [epoch_us(bind["start"]), epoch_us(bind["end"]), xs, xe])
        if grid_us:
            on_grid |= (bucket_at - grid0) % grid_us == 0
        spans = []
        every_cut = cuts.with_columns(k=pl.col("t") // b)  # (one on a bucket's start may fall inside a joined segment)
        cuts = cuts.filter((pl.col("t") % b != 0)).with_columns(k=pl.col("t") // b).filter(
            (pl.col("k") >= kx0) & (pl.col("k") <= kx1) & ~pl.col("k").is_in(list(k_all)))
        raw_ks = np.array(sorted(k_all), dtype=np.int64)
        # the GPU-buckets known to be read raw on one GPU before the rows are read, by bucket
        known = [x.select(pl.col("gh").cast(pl.UInt64), pl.col("k").cast(pl.Int64)) for x in (bad, known_raw) if x is not None]
        known_gk = pl.concat(known).unique().sort("k") if known else pl.DataFrame(schema={"gh": pl.UInt64, "k": pl.Int64})
        known_k = known_gk["k"].to_numpy()
        # the hours whose joined segments (gpufleet.collector.summaries.coarsen) stand for their
        # buckets: written, and no bucket of the hour read raw nor a look-up for every GPU inside it
        # (those come from the buckets' rows); a look-up on one GPU inside a joined segment (an
        # allocation edge the writer did not know) is found after the build, as for the buckets
        coarse = _coarse_hours(hours, b, raw_ks, known_k, grid0 if grid_us else None, grid_us,
                               [epoch_us(bind["start"]), epoch_us(bind["end"]), xs, xe])
        # (one query per level, over exactly its hours' files)
        by_level = [(level, files) for level, files in ((False, hours.filter(~pl.Series(coarse))["files"].explode().to_list()),
                                                        (True, hours.filter(pl.Series(coarse))["coarse_files"].explode().to_list()))
                    if files]
        self.coarse_hours = int(coarse.sum())
        columns = _SEGMENT + (_DETAIL if detail else ())
        segs: list[dict[str, np.ndarray]] = []
        gks: list[pl.DataFrame] = []
        seen: list[tuple[np.ndarray, np.ndarray]] = []  # (h, gh) of the rows' variants, made unique now and then
        is_raw = np.zeros(kx1 - kx0 + 1, dtype=bool)
        is_raw[raw_ks - kx0] = True
        pieces: dict[str, list[dict[str, np.ndarray]]] = {"idle": [], "nop": []}
        held_list = None if held is None else [int(x) for x in held]
        for batch in (batch for level, files in by_level
                      for batch in _batches(con, sql.summary_rows(inner_runs=level or bucket_s > bind["min_idle"], detail=detail),
                                            {**bind, "bucket_s": bucket_s, "files": files, "held": held_list})):
            k = batch["b0"].to_numpy() // b
            use = (k >= kx0) & (k <= kx1) & ~is_raw[np.clip(k - kx0, 0, kx1 - kx0)]
            if not use.all():
                batch, k = batch.filter(pl.Series(use)), k[use]
            if not len(k):
                continue
            batch = batch.with_columns(k=pl.Series(k, dtype=pl.Int64))
            # buckets read raw on one GPU: an allocation starts or ends inside a segment (`bad`,
            # found by a first build: the summary was written before the allocation was known),
            # or the summary is inexact
            k_lo, k_hi = int(k.min()), int(k.max()) + 1
            lo, hi = np.searchsorted(known_k, [k_lo, k_hi])
            raw_here = [known_gk.slice(int(lo), int(hi - lo))] if hi > lo else []
            exact = batch["exact"].to_numpy()
            if not exact.all():
                raw_here.append(batch.filter(~pl.col("exact")).select("gh", "k"))
            gks.extend(raw_here)
            h = batch["h"].to_numpy()
            first = np.flatnonzero(np.append(True, h[1:] != h[:-1]))  # rows come by GPU: its variants' first rows
            seen.append((h[first], batch["gh"].to_numpy()[first]))
            if len(seen) == 64:
                seen = [_unique_variants(seen)]
            keep = exact & (batch["covered_us"].to_numpy() > 0)
            every = keep.all()  # most batches: then no copy of each column
            seg = {c: batch[c].to_numpy() if every else batch[c].to_numpy()[keep] for c in columns}
            alone = ~_outside(pl.concat(raw_here, how="vertical_relaxed").unique(), seg["gh"], seg["s0"] // b) if raw_here else None
            # the run pieces of segments the line takes whole, chained at once where one follows the
            # next in row order (mostly a GPU's hour: its pieces are then a few, not one a bucket)
            for kind in pieces:
                p = _run_pieces(batch, keep, seg, kind, skip=alone)
                pieces[kind].append(_chain(p["a0"], p["a1"], p["h"], gpu=p["h"], in_order=True))
            if grid_us:
                s0, ks = seg["s0"], k if every else k[keep]
                starts = (s0 != ks * b) | on_grid[ks - kx0]  # off its bucket's start (a writer's cut), or on the grid
                e_lo, e_hi = np.searchsorted(edge_t, [k_lo * b, k_hi * b])
                if e_hi > e_lo:  # on an allocation's edge on this GPU
                    starts |= pl.Series(_cut_key(seg["gh"], s0)).is_in(edge_key.slice(int(e_lo), int(e_hi - e_lo)).implode()).to_numpy()
                if alone is not None:  # a GPU-bucket this batch sends to the raw samples: each of its segments alone
                    starts |= alone
                    starts[1:] |= alone[:-1]
                seg, joined = _merge(seg, starts, b)
                spans.append(joined)
            segs.append(seg)
            del batch
        gk = pl.concat(gks, how="vertical_relaxed").unique() if gks else pl.DataFrame(schema={"gh": pl.UInt64, "k": pl.Int64})
        gk = gk.with_columns(pl.col("gh").cast(pl.UInt64), pl.col("k").cast(pl.Int64))
        if spans and not gk.is_empty():
            joined = pl.concat(spans).join(gk, on="gh", how="inner").filter((pl.col("kf") <= pl.col("k")) & (pl.col("k") <= pl.col("kl")))
            if not joined.is_empty():
                # a bucket one batch sends to the raw samples lies inside segments another batch
                # joined (a GPU-bucket's rows split between batches): build the line again with
                # every such bucket known to each batch
                self.__init__(*self._args, also_raw=also_raw, grid_us=grid_us, bad=bad, known_raw=gk)
                return
        del spans
        need = pl.concat([gk.with_columns(pl.col("k") + d) for d in (-1, 0, 1)]).unique()
        need = need.filter(~pl.col("k").is_in(read_all))

        ks = {"bucket_us": b, "held": held_list}
        # every (held) GPU's raw buckets, a run of consecutive buckets per query (window edges, hours not summarised)
        runs = np.split(np.array(read_all, dtype=np.int64), np.flatnonzero(np.diff(read_all) > 1) + 1) if read_all else []
        parts = [_q(con, sql.RAW_BUCKETS_ALL_DETAIL if detail else sql.RAW_BUCKETS_ALL,
                    {**bind, **ks, "raw_lo": from_epoch_us(int(r[0]) * b), "raw_hi": from_epoch_us((int(r[-1]) + 1) * b)})
                 for r in runs]
        raw = pl.concat(parts, how="vertical_relaxed") if parts else None
        if not need.is_empty():  # ... and one GPU's (none of read_all: need leaves those out; held GPUs' only, as the rows)
            con.register("_raw_gk", need.to_arrow())
            try:
                more = _q(con, sql.RAW_BUCKETS_GPU_DETAIL if detail else sql.RAW_BUCKETS_GPU, {**bind, **ks})
            finally:
                con.unregister("_raw_gk")
            raw = more if raw is None else pl.concat([raw, more], how="vertical_relaxed")
        if raw is None:
            raw = pl.DataFrame(schema={"h": pl.UInt64, "gh": pl.UInt64, "ts": pl.Int64, "util": pl.Float32, "nop": pl.Boolean,
                                       **({"fb": pl.Float32, "tensor": pl.Float32, "clock": pl.Float32} if detail else {})})

        # GPU variants over both sources, named as the raw path names them (gputime._variants: vid
        # = index into the sorted variant hashes, gid per GPU, equiv by sql.gpu_equiv); rows carry
        # the hashes only, so placing millions of them is integer work, not string joins
        raw_h = raw.select("h", "gh").unique("h")  # (a hash pass: millions of raw rows, a few variants each GPU)
        hashes, seen_gh = _unique_variants([*seen, (raw_h["h"].to_numpy(), raw_h["gh"].to_numpy())])  # (sorted by h: vid order)
        self.gpus = _variants(con, bind, hashes)
        equiv = self.gpus["equiv"].to_numpy().astype(np.float64)
        gid_of = self.gpus["gid"].to_numpy().astype(np.int64, copy=False)
        raw = raw.with_columns(vid=pl.Series(_index_of(hashes, raw["h"].to_numpy()), dtype=pl.Int64))
        raw = raw.with_columns(gid=pl.Series(gid_of[raw["vid"].to_numpy()], dtype=pl.Int64))
        gh_gid = pl.DataFrame({"gh": seen_gh, "gid": gid_of}, schema={"gh": pl.UInt64, "gid": pl.Int64}).unique("gh")

        # the runs' pieces the summaries record, those of GPU-buckets read raw left out, chained a
        # batch at a time (above: by variant), then all batches (a GPU's variants' pieces joined),
        # as runs() chains them with the raw pieces
        self._pieces = {}
        for kind, chains in pieces.items():
            a0, a1, h = (np.concatenate([c[j] for c in chains]) if chains else np.zeros(0, t)
                         for j, t in enumerate((np.int64, np.int64, np.uint64)))
            chains.clear()  # (the arrays of every step freed as soon as done: the peak of a 16,384-GPU week)
            pv = _index_of(hashes, h)
            del h
            at = gid_of[pv] * self.span - self.base  # line keys: gid x span + (t - base)
            a0 += at
            a1 += at
            del at
            self._pieces[kind] = _chain(a0, a1, pv)
            del a0, a1, pv
        del pieces
        if self._touches_pieces(gk, gh_gid):
            # a bucket one batch sends to the raw samples holds run pieces another batch chained (a
            # GPU-bucket's rows split between batches): the line again, every such bucket known
            self.__init__(*self._args, also_raw=also_raw, grid_us=grid_us, bad=bad, known_raw=gk)
            return

        # raw pieces, in the raw buckets only
        raw = raw.sort(["gid", "ts"], maintain_order=True)
        g, ts = raw["gid"].to_numpy().astype(np.int64, copy=False), raw["ts"].to_numpy().astype(np.int64, copy=False)
        i, k, p0, p1 = cs.split(ts, cs.intervals(g, ts, gap), xs, xe, b)
        nk = kx1 - kx0 + 3
        gkc = gk.join(gh_gid, on="gh", how="inner")
        codes = gkc["gid"].to_numpy().astype(np.int64, copy=False) * nk + (gkc["k"].to_numpy().astype(np.int64, copy=False) - kx0 + 1)
        keep = np.isin(k, raw_ks) | np.isin(g[i] * nk + (k - kx0 + 1), codes)
        i, p0, p1 = i[keep], p0[keep], p1[keep]
        rg, rv = g[i], raw["vid"].to_numpy().astype(np.int64, copy=False)[i]
        util = raw["util"].to_numpy()[i]
        self._raw_util, self._raw_nop = util, raw["nop"].to_numpy()[i]
        sec = (p1 - p0) / 1e6 * equiv[rv]
        known = ~np.isnan(util)
        self._rk0 = rg * self.span + (p0 - self.base)
        self._rk1 = rg * self.span + (p1 - self.base)
        self._rv = rv

        # the whole summarised segments (those of no GPU-bucket gk sends to the raw samples) after
        # the raw pieces: one ordered line, keys gid x span + (t - base) as GpuTime, built a column
        # at a time, each taken out of the batches as it goes (the peak is the batches plus a column)
        whole_rows = [_outside(gk, seg.pop("gh"), seg["s0"] // b) for seg in segs]

        def column(c: str) -> np.ndarray:
            parts = [seg.pop(c) if w.all() else seg.pop(c)[w] for seg, w in zip(segs, whole_rows)]
            return np.concatenate(parts) if parts else np.zeros(0, _NUMPY.get(c, np.float64))

        sv = _index_of(hashes, column("h"))
        sg = gid_of[sv]
        nr, ns = len(rg), len(sv)
        t0 = np.concatenate([self._rk0, sg * self.span + (column("s0") - self.base)])
        order, self.t0 = _stable_order(t0)
        del t0
        self.t1 = np.concatenate([self._rk1, sg * self.span + (column("s1") - self.base)])[order]
        del sg
        self._whole = order >= nr  # entry i of the line came from position order[i]: raw pieces first
        self._seg_vid = np.concatenate([rv, sv])[order]
        # (x times 1.0 is x: a fleet without MIG instances scales nothing)
        seg_equiv = None if (equiv == 1.0).all() else equiv[sv]
        del sv
        seg_data = column("data_s")
        seg_known = seg_data > 0 if detail else None
        # data and busy seconds of each entry: the raw pieces', then the segments' scaled by their
        # share in place, taken in the line's order (one column of temporaries at a time: the
        # products and concatenations of the line's columns were the 100,000-GPU week's peak)
        cdata = _laid_out(np.where(known, sec, 0.0), seg_data, seg_equiv, order)
        del seg_data
        cbusy = _laid_out(np.where(known, np.divide(util, 100, dtype=np.float64) * sec, 0.0), column("busy_s"), seg_equiv, order)
        del seg_equiv
        self.cdata, self.cbusy = per_gpu_cumsum(self.t0, self.span, cdata, cbusy)
        self.raw_pieces, self.summary_buckets = nr, ns
        if detail:
            self._detail = self._entry_detail(raw, i, (p1 - p0) / 1e6, util, column, seg_known, order)
        segs.clear()
        if bad is None:
            # the cuts off the bucket edges that fall inside a whole segment (a cut the writer knew
            # starts one): rare - then the line again, those GPU-buckets read raw
            at = (every_cut if self.coarse_hours else cuts).join(gh_gid, on="gh", how="inner")
            inside = self._inside_whole(at["gid"].to_numpy(), at["t"].to_numpy())
            self._bad = at.filter(pl.Series(inside)).select("gh", "k").unique()
            if inside.any():
                del raw, at, order, i, k, p0, p1, util, sec, known
                self.__init__(*self._args, also_raw=also_raw, grid_us=grid_us, bad=self._bad, known_raw=known_raw)

    def _touches_pieces(self, gk: pl.DataFrame, gh_gid: pl.DataFrame) -> bool:
        """Does a run piece of the line overlap one of the GPU-buckets gk reads raw? (It then came
        from a batch of rows that did not know the bucket was read raw.)"""
        at = gk.join(gh_gid, on="gh", how="inner")
        if at.is_empty():
            return False
        g = at["gid"].to_numpy().astype(np.int64)
        b0 = g * self.span + at["k"].to_numpy().astype(np.int64) * self.bucket_us - self.base
        lo, hi = np.maximum(b0, g * self.span), b0 + self.bucket_us
        for a0, a1, _ in self._pieces.values():  # (line keys in order; a GPU's keys lie in [gid x span, (gid + 1) x span))
            if len(a0):
                j = np.searchsorted(a0, hi) - 1  # the last piece starting before the bucket ends ...
                reach = np.maximum.accumulate(a1)  # ... and the furthest any piece up to it reaches
                if ((j >= 0) & (reach[np.maximum(j, 0)] > lo)).any():
                    return True
        return False

    # --- look-ups: exact on segment edges and in raw buckets; elsewhere a line with those buckets raw answers ---

    def _inside_whole(self, gid: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which look-ups (gid, t) fall strictly inside a whole summarised segment."""
        if not len(self.t0):
            return np.zeros(len(np.asarray(t)), dtype=bool)
        gid = np.asarray(gid, dtype=np.int64)
        k = self.key(gid, t)
        j = search(self.t0, k, side="right") - 1
        jj = np.maximum(j, 0)
        return (j >= 0) & (gid >= 0) & self._whole[jj] & (self.t0[jj] < k) & (k < self.t1[jj])

    def _answering(self, gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple["SummaryTime", np.ndarray] | None:
        """None when this line answers every look-up; else, when some fall inside whole segments
        (a timeline's buckets off the summaries' edges), the line that answers them all: this one
        built again with the buckets they fall in read raw for every GPU - a few buckets per
        look-up time, not the window - and the GPUs' ids on it."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        inside_a, inside_b = self._inside_whole(gid, a), self._inside_whole(gid, b)
        if not (inside_a.any() or inside_b.any()):
            return None
        ks = frozenset(np.unique(np.concatenate([a[inside_a], b[inside_b]]) // self.bucket_us).tolist())
        if self._refined is None or not ks <= self._refined[0].also_raw:
            have = self._refined[0].also_raw if self._refined is not None else frozenset()
            line = SummaryTime(*self._args, also_raw=self.also_raw | have | ks, grid_us=self.grid_us, bad=self._bad,
                               known_raw=self._known_raw)
            m = self.ids.join(line.ids.rename({"gid": "their_gid"}), on=KEY, how="left", nulls_equal=True).sort("gid")
            to_line = np.full(int(self.gpus["gid"].max() or 0) + 1, -1, dtype=np.int64)
            to_line[m["gid"].to_numpy()] = m["their_gid"].fill_null(-1).to_numpy()
            self._refined = (line, to_line)
        line, to_line = self._refined
        gid = np.asarray(gid, dtype=np.int64)
        return line, np.where(gid >= 0, to_line[np.maximum(gid, 0)] if len(to_line) else -1, -1)

    def integrals(self, gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        other = self._answering(gid, a, b)
        return other[0].integrals(other[1], a, b) if other else super().integrals(gid, a, b)

    def overlaps(self, gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        other = self._answering(gid, a, b)
        return other[0].overlaps(other[1], a, b) if other else super().overlaps(gid, a, b)

    @staticmethod
    def _entry_detail(raw: pl.DataFrame, i: np.ndarray, sec: np.ndarray, util: np.ndarray, column: Any,
                      seg_known: np.ndarray, order: np.ndarray) -> dict[str, np.ndarray]:
        """Per entry of the line (raw pieces, then whole segments - their columns by `column`,
        _DETAIL_ENTRY's - put in line order): what allocation_detail adds up, in seconds not yet
        scaled by a MIG share - all of it (any), with tensor activity known (tk), with a clock too
        (ck), tensor x clock x s (tcl), tensor x s with a clock (tcd) and without (tun) - the
        memory high-water (fb, NaN: unknown) and whether a utilization is known (uk)."""
        fb, tensor, clock = (raw[c].to_numpy()[i].astype(np.float64) for c in ("fb", "tensor", "clock"))
        tk = ~np.isnan(tensor)
        ck = tk & ~np.isnan(clock)
        ts = np.where(tk, tensor * sec, 0.0)
        parts = {
            "any": sec, "tk": np.where(tk, sec, 0.0), "ck": np.where(ck, sec, 0.0), "tcl": np.where(ck, ts * clock, 0.0),
            "tcd": np.where(ck, ts, 0.0), "tun": np.where(tk & ~ck, ts, 0.0), "fb": fb,
        }
        out = {k: np.concatenate([r, column(c) / div])[order] for k, r in parts.items() for c, div in [_DETAIL_ENTRY[k]]}
        out["uk"] = np.concatenate([~np.isnan(util), seg_known])[order]
        return out

    def allocation_detail(self, gid: np.ndarray, a0: np.ndarray, a1: np.ndarray, equiv: np.ndarray,
                          start: int, end: int) -> dict[str, np.ndarray]:
        """GpuTime.allocation_detail's sums, maxima and flags (has_piece, has_util; no piece
        counts) from this line's entries: a whole segment lies inside an allocation's part of
        the window or outside it (its edges are segment edges or in raw buckets), a raw piece is
        clipped to it as the raw path clips its interval. Needs detail=True."""
        if not self.has_detail:
            raise ValueError("this line was read without the detail columns (summary_time(..., detail=True))")
        n = len(gid)
        gid = np.asarray(gid, dtype=np.int64)
        a0, a1 = np.asarray(a0, dtype=np.int64), np.asarray(a1, dtype=np.int64)
        s, e = np.full(n, start, dtype=np.int64), np.full(n, end, dtype=np.int64)
        other = self._answering(np.concatenate([gid, gid]), np.concatenate([a0, s]), np.concatenate([a1, e]))
        if other:
            return other[0].allocation_detail(other[1][:n], a0, a1, equiv, start, end)
        out = {k: np.full(n, np.nan) for k in ("fb_max", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")}
        out.update(has_piece=np.zeros(n, dtype=bool), has_util=np.zeros(n, dtype=bool), any_s=np.zeros(n))
        if n and len(self.t0):
            self._allocation_detail(gid, a0, a1, equiv, start, end, out)  # GpuTime's slicing and chunks, our _detail_chunk
        return out

    def _detail_chunk(self, rows: np.ndarray, j0: np.ndarray, j1: np.ndarray, hi: np.ndarray, lo: np.ndarray,
                      equiv: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """allocation_detail for allocations `rows`: their entries [j0, j1) side by side, each
        weighed by the part of it inside [lo, hi), summed per allocation."""
        at, owner, idx = _side_by_side(j0, j1)
        t0, t1 = self.t0[idx], self.t1[idx]
        frac = np.clip(np.minimum(t1, hi[owner]) - np.maximum(t0, lo[owner]), 0, None) / (t1 - t0) * equiv[owner]
        pos = frac > 0
        d = {k: v[idx] for k, v in self._detail.items()}
        has_t = pos & (d["tk"] > 0)
        total = lambda x: np.add.reduceat(x, at)  # noqa: E731 - one sum per allocation
        out["has_piece"][rows] = True
        out["has_util"][rows] = np.logical_or.reduceat(d["uk"], at)
        out["any_s"][rows] = total(frac * d["any"])
        out["fb_max"][rows] = np.fmax.reduceat(np.where(pos, d["fb"], np.nan), at)
        with_t = np.logical_or.reduceat(has_t, at)
        for k, x in (("tensor_s", "tk"), ("clocked_s", "ck"), ("tclock", "tcl"), ("tw_clocked", "tcd"), ("tnoclock", "tun")):
            out[k][rows[with_t]] = total(np.where(has_t, frac * d[x], 0.0))[with_t]

    def bucket_detail(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        raise NotImplementedError("a job's timeline reads the raw arrays (Analysis.detail_time)")

    def runs(self, kind: str, thr: float, min_us: int) -> pl.DataFrame:
        """GpuTime.runs on this line: the hit raw pieces and, of each whole bucket, the run pieces
        its summary records, chained where one ends as the next starts."""
        if thr != self._bind["thr"]:
            raise ValueError(f"the summaries were read for idle threshold {self._bind['thr']}, not {thr}")
        hit = (self._raw_util < np.float64(thr)) if kind == "idle" else self._raw_nop
        pk0, pk1, pv = self._pieces["idle" if kind == "idle" else "nop"]
        r0, r1, rv = _chain(np.concatenate([self._rk0[hit], pk0]), np.concatenate([self._rk1[hit], pk1]),
                            np.concatenate([self._rv[hit], pv]))
        long = (r1 - r0) >= min_us
        r0, r1, rv = r0[long], r1[long], rv[long]
        gid = r0 // self.span
        return pl.DataFrame({"gid": gid, "vid": rv, "r0": r0 - gid * self.span + self.base, "r1": r1 - gid * self.span + self.base},
                            schema={"gid": pl.Int64, "vid": pl.Int64, "r0": pl.Int64, "r1": pl.Int64})
