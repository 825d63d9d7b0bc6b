"""Every GPU's sample intervals as arrays: read once, put in order once, then linear passes - the
raw path the tests hold the facts' figures to (tests/support/raw_analysis.py RawAnalysis).

Why: the weekly figures need each sample once (per-GPU data and busy time), each allocation once
(its data and busy time) and the idle runs once. Sorting and window-scanning tens of millions of
rows with text keys in SQL did that several times over (those row-by-row queries, INTERVALS,
PIECES and ISLANDS, are now the tests' reference: tests/support/oracle_sql.py); here:

- the samples come out of DuckDB with a 64-bit hash naming the GPU (no strings), in file order;
  the store's files already hold each GPU's samples in time order, so putting them in GPU-time
  order is a sort of the runs of rows ("segments"), not of the rows (a full sort if they overlap);
- an interval is a sample's time until the next sample of that GPU, at most max_gap - exactly
  oracle_sql.INTERVALS' rule;
- cumulative data and busy integrals make the time of any [a, b) on a GPU (an allocation, a
  merged holding) two look-ups, which replaces joining every sample with every allocation;
- runs: maximal chains of back-to-back intervals where a predicate holds (idle, no process).
  A job's idle stretch on a GPU is a run intersected with the job's allocation there, so only
  runs at least idle_min_duration long can make one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import polars as pl

from gpufleet.analytics import raw_reads, sql
from gpufleet.collector.schema import LINE_COLUMNS, LINE_DETAIL_COLUMNS
from gpufleet.times import epoch_us

# A GPU variant - the GPU (cluster, host, gpu_uuid, MIG instance) with its gpu index, model and
# MIG profile - named by one 64-bit hash, so 40M samples leave DuckDB without a string each.
GPU_HASH = "hash(cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::INTEGER, gpu::INTEGER, model, mig_profile)"
_VARIANT_COLS = "cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, gpu, model, mig_profile"
# ... and the GPU itself (its key) hashed the same way from a table with a gi column (al, the
# line's ids)
GPU_KEY_HASH = "hash(cluster, host, gpu_uuid, gi::INTEGER)"

# the rows oracle_sql.INTERVALS reads, in the store's file order (which keeps each
# GPU's samples in time order), as narrow as they go: NaN stands for a NULL utilization (so the
# columns reach numpy without a copy), nop is "held with no compute process"
# (oracle_sql.NO_PROCESS_PRED)
_SAMPLE_ARRAYS = f"""
SELECT {GPU_HASH} AS h, epoch_us(ts) AS ts,
       {LINE_COLUMNS.format(s="")}{{detail}}
FROM gpu_samples
WHERE ts >= $xstart - to_seconds($max_gap) AND ts < $xend
  AND {sql._FILTERS}
"""
# ... and with what the per-job detail needs (memory high-water, MFU's tensor activity and clock)
_DETAIL_COLUMNS = ",\n       " + LINE_DETAIL_COLUMNS
SAMPLE_ARRAYS = _SAMPLE_ARRAYS.format(detail="")
SAMPLE_ARRAYS_DETAIL = _SAMPLE_ARRAYS.format(detail=_DETAIL_COLUMNS.format(s=""))

# the variants behind the hashes in _want_h: from the inventory, and (rarely) from the samples
INVENTORY_VARIANTS = f"""
SELECT DISTINCT {GPU_HASH} AS h, {_VARIANT_COLS}, {sql.gpu_equiv()} AS equiv
FROM gpus WHERE {GPU_HASH} IN (SELECT h FROM _want_h)
"""
SAMPLE_VARIANTS = f"""
SELECT DISTINCT {GPU_HASH} AS h, {_VARIANT_COLS}, {sql.gpu_equiv()} AS equiv
FROM gpu_samples
WHERE ts >= $xstart - to_seconds($max_gap) AND ts < $xend AND {GPU_HASH} IN (SELECT h FROM _want_h)
"""


class GpuTime:
    """The window's sample intervals, all GPUs in one ordered line.

    Times are "keys": gid * span + (t - base) in microseconds, so one int64 array is ordered by
    GPU and then time, and an interval that ends where the next one starts (t1[i] == t0[i + 1])
    is back-to-back on the same GPU. An interval that oracle_sql.INTERVALS drops (it would end
    before it starts: a duplicate timestamp, a sample before the window whose successor is too)
    stays here with zero length, which adds nothing to any sum.
    """

    def __init__(self, con: Any, bind: dict[str, Any], detail: bool = False):
        """`detail`: also keep memory, tensor activity and SM clock per interval (for
        allocation_detail: the per-job report and MFU), which costs three more arrays."""
        self.fb = self.tensor = self.clock = None
        self.has_detail = detail  # allocation_detail can answer
        with _no_hugepages():
            self._build(con, bind, detail)

    def _build(self, con: Any, bind: dict[str, Any], detail: bool) -> None:
        q = SAMPLE_ARRAYS_DETAIL if detail else SAMPLE_ARRAYS
        xstart, xend = epoch_us(bind["xstart"]), epoch_us(bind["xend"])
        tab = raw_reads.read(con, "raw path", q, sql.bound(q, bind), xstart, xend)
        gap = round(bind["max_gap"] * 1_000_000)
        self.base = xstart - gap - 1
        self.span = (xend - self.base) + 2 * gap + 1  # the last interval of a GPU ends before the next GPU's keys

        # segments: stretches of rows of one GPU variant in ascending time inside one Arrow chunk
        # (the file order gives them); numpy views of the chunks, nothing copied yet
        chunks = [[c.to_numpy(zero_copy_only=False) for c in batch.columns] for batch in tab.to_batches() if batch.num_rows]
        seg_c, seg_s, seg_n, seg_h, seg_t0, seg_t1 = [], [], [], [], [], []
        for i, (h, ts, *_) in enumerate(chunks):
            brk = np.ones(len(ts), dtype=bool)
            brk[1:] = (h[1:] != h[:-1]) | (ts[1:] < ts[:-1])
            st = np.flatnonzero(brk)
            ln = np.diff(np.append(st, len(ts)))
            seg_c.append(np.full(len(st), i))
            seg_s.append(st), seg_n.append(ln), seg_h.append(h[st]), seg_t0.append(ts[st]), seg_t1.append(ts[st + ln - 1])
        cat = lambda xs, t=np.int64: np.concatenate(xs) if xs else np.array([], dtype=t)
        seg_c, seg_s, seg_n, first, last = cat(seg_c), cat(seg_s), cat(seg_n), cat(seg_t0), cat(seg_t1)
        hashes, seg_v = np.unique(cat(seg_h, np.uint64), return_inverse=True)
        self.gpus = _variants(con, bind, hashes)
        seg_g = self.gpus["gid"].to_numpy()[seg_v]
        order = np.lexsort((first, seg_g))
        seg_c, seg_s, seg_n, seg_v, seg_g, first, last = (x[order] for x in (seg_c, seg_s, seg_n, seg_v, seg_g, first, last))
        # the rows in segment order: GPU-time order unless a GPU's segments overlap in time
        columns = ((1, np.int64), (2, np.float32), (3, np.bool_)) + (((4, np.float32), (5, np.float32), (6, np.float32)) if detail else ())
        t0, util, nop, *extra = (_gather([c[k] for c in chunks], seg_c, seg_s, seg_n).astype(t, copy=False) for k, t in columns)
        del chunks, tab
        lo = seg_n
        self.seg_at = np.cumsum(lo) - lo  # where each segment starts now
        if np.any((seg_g[1:] == seg_g[:-1]) & (last[:-1] > first[1:])):
            # overlapping files (late data not yet compacted): sort the rows
            rv = np.repeat(seg_v, seg_n)
            perm = np.lexsort((t0, np.repeat(seg_g, seg_n)))
            t0, util, nop, rv = t0[perm], util[perm], nop[perm], rv[perm]
            extra = [x[perm] for x in extra]
            del perm
            cut = np.flatnonzero(np.concatenate(([True], rv[1:] != rv[:-1]))) if len(rv) else np.array([], dtype=np.int64)
            seg_v, lo, self.seg_at = rv[cut], np.diff(np.append(cut, len(rv))), cut
            seg_g = self.gpus["gid"].to_numpy()[seg_v]
        self.seg_v = seg_v

        # oracle_sql.INTERVALS: a sample holds until the next sample of its GPU, at most max_gap,
        # inside [xstart, xend). In place: a pass over 40M rows costs more in memory traffic than arithmetic.
        t1 = np.add(t0, gap)
        np.minimum(t1, xend, out=t1)
        np.maximum(t0, xstart, out=t0)
        _add_per_segment((t0, t1), seg_g * self.span - self.base, self.seg_at, lo)
        np.minimum(t1[:-1], t0[1:], out=t1[:-1])
        np.maximum(t1, t0, out=t1)
        self.t0, self.t1, self.util, self.nop = t0, t1, util, nop
        if detail:
            self.fb, self.tensor, self.clock = extra

        # cumulative data and busy seconds (x MIG share) up to and including each interval
        sec = np.subtract(t1, t0, dtype=np.float64)
        np.divide(sec, 1e6, out=sec)
        equiv = self.gpus["equiv"].to_numpy()
        if np.any(equiv[seg_v] != 1.0):
            sec *= np.repeat(equiv[seg_v], lo)
        no_util = np.isnan(util)
        busy = np.divide(util, 100, dtype=np.float64)  # util::DOUBLE / 100, as SQL has it
        busy *= sec
        np.copyto(busy, 0.0, where=no_util)
        np.copyto(sec, 0.0, where=no_util)
        del no_util
        self.cdata, self.cbusy = per_gpu_cumsum(t0, self.span, sec, busy)

    @property
    def ids(self) -> pl.DataFrame:
        """cluster, host, gpu_uuid, gi -> gid: one row per GPU (its variants share the gid)."""
        return self.gpus.select("cluster", "host", "gpu_uuid", "gi", "gid").unique(["cluster", "host", "gpu_uuid", "gi"])

    def key(self, gid: np.ndarray, t: np.ndarray) -> np.ndarray:
        return gid.astype(np.int64) * self.span + (np.asarray(t, dtype=np.int64) - self.base)

    # --- figures ---

    def integrals(self, gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Data and busy seconds (x MIG share) of GPUs gid over [a, b) (epoch us, inside the read
        window), as summing the intervals' overlaps with [a, b) would give them."""
        gid = np.asarray(gid, dtype=np.int64)

        def at(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # the GPU's sums up to t: the last interval starting at or before t; if it is another
            # GPU's, t is before this GPU's first (its sums start again at 0 with each GPU)
            k = self.key(gid, t)
            if not len(self.t0):
                return np.zeros(len(k)), np.zeros(len(k))
            j = search(self.t0, k, side="right") - 1
            jj = np.maximum(j, 0)
            ok = (j >= 0) & (self.t0[jj] >= gid * self.span)
            part = np.where(ok, np.clip(k - self.t0[jj], 0, self.t1[jj] - self.t0[jj]), 0) / np.where(
                ok & (self.t1[jj] > self.t0[jj]), self.t1[jj] - self.t0[jj], 1)
            first = self.t0[np.maximum(jj - 1, 0)] < gid * self.span  # interval jj is the GPU's first
            out = []
            for c in (self.cdata, self.cbusy):
                before = np.where((jj > 0) & ~first, c[np.maximum(jj - 1, 0)], 0.0)  # the GPU's intervals before jj
                out.append(np.where(ok, before + part * (c[jj] - before), 0.0))
            return out[0], out[1]

        ad, ab = at(a)
        bd, bb = at(b)
        empty = np.asarray(b) <= np.asarray(a)
        return np.where(empty, 0.0, np.maximum(bd - ad, 0.0)), np.where(empty, 0.0, np.maximum(bb - ab, 0.0))

    def overlaps(self, gid: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Does an interval of GPU gid overlap [a, b), as a piece of oracle_sql.PIECES would? (Of the
        intervals starting before b, the last ends last.)"""
        if not len(self.t0):
            return np.zeros(len(a), dtype=bool)
        gid = np.asarray(gid, dtype=np.int64)
        j = search(self.t0, self.key(gid, b), side="left") - 1
        jj = np.maximum(j, 0)
        return (j >= 0) & (self.t0[jj] >= gid * self.span) & (self.t1[jj] > self.key(gid, a)) & (self.t1[jj] > self.t0[jj])

    def _slices(self, ka: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[j0, j1): the intervals overlapping each key range [ka, kb) (empty when j1 <= j0)."""
        return search(self.t1, ka, side="right"), search(self.t0, kb, side="left")  # t1 never decreases along the line

    def _vid_of(self, i: np.ndarray) -> np.ndarray:
        """The GPU variant of intervals i (the segment each lies in)."""
        return self.seg_v[np.searchsorted(self.seg_at, i, side="right") - 1]

    def allocation_detail(self, gid: np.ndarray, a0: np.ndarray, a1: np.ndarray, equiv: np.ndarray,
                          start: int, end: int) -> dict[str, np.ndarray]:
        """What oracle_sql.PIECES rows of each allocation (GPU gid held over [a0, a1), epoch us) add
        up to, per allocation, with w = the piece's seconds inside [start, end) x equiv:

          pieces    intervals (of positive length) overlapping [a0, a1); has_piece: any
          util_n    of them with a utilization, has_util: any; data_s / busy_s are in alv already
          fb_max    max memory used over pieces with w > 0 (NaN: none)
          any_s     sum of w (MFU's sampled time)
          tensor_s  sum of w where tensor activity is known (NaN: no such piece with w > 0)
          clocked_s sum of w over those with an SM clock too
          tclock    sum of tensor x clock x w over those, tw_clocked of tensor x w over those;
          tnoclock  sum of tensor x w over the pieces with tensor activity but no clock

        Needs detail=True. The allocations' slices side by side, a chunk at a time: no loop per job."""
        n = len(gid)
        out = {k: np.full(n, np.nan) for k in ("fb_max", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")}
        out.update(pieces=np.zeros(n, dtype=np.int64), util_n=np.zeros(n, dtype=np.int64), any_s=np.zeros(n))
        if len(self.t0):
            self._allocation_detail(np.asarray(gid, dtype=np.int64), a0, a1, equiv, start, end, out)
        return {**out, "has_piece": out["pieces"] > 0, "has_util": out["util_n"] > 0}

    def _allocation_detail(self, gid: np.ndarray, a0: np.ndarray, a1: np.ndarray, equiv: np.ndarray,
                           start: int, end: int, out: dict[str, np.ndarray]) -> None:
        """allocation_detail's sums into `out`, for the allocations with a slice of the line
        (_detail_chunk: this class's intervals)."""
        n = len(gid)
        ka, kb = self.key(gid, a0), self.key(gid, a1)
        ws, we = self.key(gid, np.full(n, start)), self.key(gid, np.full(n, end))
        j0, j1 = self._slices(ka, kb)
        rows = np.flatnonzero((j1 > j0) & (gid >= 0))
        # all allocations' slices at once, in chunks of about _PIECES_CHUNK intervals (memory)
        ends = np.cumsum(j1[rows] - j0[rows])
        cuts = np.searchsorted(ends, np.arange(_PIECES_CHUNK, ends[-1], _PIECES_CHUNK), side="left") + 1 if len(rows) else np.zeros(0, np.int64)
        equiv = np.asarray(equiv, dtype=np.float64)
        for chunk in np.split(rows, np.unique(cuts)):
            if len(chunk):
                self._detail_chunk(chunk, j0[chunk], j1[chunk], np.minimum(kb, we)[chunk], np.maximum(ka, ws)[chunk], equiv[chunk], out)

    def _detail_chunk(self, rows: np.ndarray, j0: np.ndarray, j1: np.ndarray, hi: np.ndarray, lo: np.ndarray,
                      equiv: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """allocation_detail for allocations `rows`: their slices [j0, j1) side by side, each piece's
        w clipped to [lo, hi), then summed per allocation (reduceat on the slice starts)."""
        at, owner, idx = _side_by_side(j0, j1)
        t0, t1 = self.t0[idx], self.t1[idx]
        real = t1 > t0
        w = np.clip(np.minimum(t1, hi[owner]) - np.maximum(t0, lo[owner]), 0, None) * (equiv[owner] / 1e6)
        w[~real] = 0.0
        pos = w > 0
        tensor, clock = self.tensor[idx], self.clock[idx]
        has_t = pos & ~np.isnan(tensor)
        clocked = has_t & ~np.isnan(clock)
        tw = tensor * w
        total = lambda x: np.add.reduceat(x, at)  # noqa: E731 - one sum per allocation
        out["pieces"][rows] = total(real.astype(np.int64))
        out["util_n"][rows] = total((real & ~np.isnan(self.util[idx])).astype(np.int64))
        out["any_s"][rows] = total(w)
        out["fb_max"][rows] = np.fmax.reduceat(np.where(pos, self.fb[idx], np.nan), at)  # NaN: no memory known
        with_t = total(has_t.astype(np.int64)) > 0  # the others keep NaN: no tensor activity known
        sums = {"tensor_s": np.where(has_t, w, 0.0), "clocked_s": np.where(clocked, w, 0.0),
                "tclock": np.where(clocked, tw * clock, 0.0), "tw_clocked": np.where(clocked, tw, 0.0),
                "tnoclock": np.where(has_t & ~clocked, tw, 0.0)}
        for k, x in sums.items():
            out[k][rows[with_t]] = total(x)[with_t]

    def bucket_detail(self, gid: np.ndarray, a0: np.ndarray, a1: np.ndarray, start: int, end: int, bucket: int,
                      origin: int | None = None) -> dict[str, np.ndarray]:
        """What oracle_sql.PIECES rows of each allocation (GPU gid held over [a0, a1), epoch us) add up to
        per time bucket, once clipped to [start, end) and cut at the bucket edges origin + k x bucket
        (us; origin: default start, at or before it): one row per allocation and bucket it has a piece in, with w = the part's seconds x
        its sample's MIG share (equiv of the interval's variant, as oracle_sql.INTERVALS has it):

          row     the allocation (an index into gid)
          k       the bucket
          vid     the variant of its first piece (gpu index, model)
          data_s  sum of w over the parts with a utilization; util_n: how many
          busy    sum of utilization (%) x w over those
          fb_max  max memory used over its parts (NaN: none known)

        Rows come by allocation, then k. Needs detail=True. One slice per allocation, as
        allocation_detail: no sample is copied for the whole window."""
        names = ("row", "k", "vid", "data_s", "busy", "util_n", "fb_max")
        parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
        n = len(gid)
        origin = start if origin is None else origin
        if n and len(self.t0):
            gid = np.asarray(gid, dtype=np.int64)
            lo_t, hi_t = np.maximum(np.asarray(a0, dtype=np.int64), start), np.minimum(np.asarray(a1, dtype=np.int64), end)
            ka, kb = self.key(gid, lo_t), self.key(gid, hi_t)
            j0, j1 = self._slices(ka, kb)
            equiv = self.gpus["equiv"].to_numpy().astype(np.float64)
            for i in np.flatnonzero((j1 > j0) & (gid >= 0) & (hi_t > lo_t)).tolist():
                lo = np.maximum(self.t0[j0[i]:j1[i]], ka[i])
                hi = np.minimum(self.t1[j0[i]:j1[i]], kb[i])
                idx = np.flatnonzero(hi > lo)  # zero-length intervals are no piece
                if not len(idx):
                    continue
                lo, hi, idx = lo[idx], hi[idx], idx + j0[i]
                # bucket edges on this GPU's keys; each piece is cut into the cnt buckets it crosses
                # (one or two: a piece is at most max_gap long, a bucket at least that)
                edge0 = int(gid[i]) * self.span + (origin - self.base)  # (the origin on this GPU's keys)
                k0, k1 = (lo - edge0) // bucket, (hi - 1 - edge0) // bucket
                cnt = k1 - k0 + 1
                rep = np.repeat(np.arange(len(lo)), cnt)
                k = np.repeat(k0, cnt) + (np.arange(len(rep)) - np.repeat(np.cumsum(cnt) - cnt, cnt))
                vid = self._vid_of(idx)[rep]
                w = (np.minimum(hi[rep], edge0 + (k + 1) * bucket) - np.maximum(lo[rep], edge0 + k * bucket)) / 1e6 * equiv[vid]
                util = self.util[idx][rep].astype(np.float64)
                has = ~np.isnan(util)
                first = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
                parts["row"].append(np.full(len(first), i, dtype=np.int64))
                parts["k"].append(k[first])
                parts["vid"].append(vid[first])
                parts["data_s"].append(np.add.reduceat(np.where(has, w, 0.0), first))
                parts["busy"].append(np.add.reduceat(np.where(has, util * w, 0.0), first))
                parts["util_n"].append(np.add.reduceat(has.astype(np.int64), first))
                parts["fb_max"].append(np.fmax.reduceat(self.fb[idx][rep].astype(np.float64), first))
        types = (np.int64, np.int64, np.int64, np.float64, np.float64, np.int64, np.float64)
        return {k: np.concatenate(parts[k]) if parts[k] else np.array([], dtype=t) for k, t in zip(names, types)}

    def per_gpu(self, start: int, end: int) -> pl.DataFrame:
        """Data and busy seconds (x MIG share) of each GPU inside [start, end)."""
        keys = self.gpus.group_by("gid").agg(pl.first("cluster", "host", "gpu_uuid", "gi")).sort("gid")
        gid = keys["gid"].to_numpy()
        data, busy = self.integrals(gid, np.full(len(gid), start), np.full(len(gid), end))
        return keys.with_columns(data_s=pl.Series(data, dtype=pl.Float64), busy_s=pl.Series(busy, dtype=pl.Float64))

    def runs(self, kind: str, thr: float, min_us: int) -> pl.DataFrame:
        """Maximal chains of back-to-back intervals where oracle_sql.IDLE_PRED (kind "idle") or
        oracle_sql.NO_PROCESS_PRED holds, at least min_us long: gid, vid (of its first interval), r0, r1."""
        hit = (self.util < np.float64(thr)) if kind == "idle" else self.nop  # NaN compares false: no data, no hit
        zero = np.flatnonzero(self.t1 == self.t0)
        zero = zero[zero > 0]
        if np.any((self.t1[zero - 1] == self.t0[zero]) & (self.t1[zero - 1] > self.t0[zero - 1])):
            # a zero-length interval inside a chain does not exist for oracle_sql.INTERVALS: it takes the hit
            # of the interval before it. (Leading ones, before the window, start where their successor
            # does, so whatever they take changes no run.)
            idx = np.arange(len(hit))
            idx[zero] = 0
            np.maximum.accumulate(idx, out=idx)
            hit = hit[idx]
        chained = np.zeros(len(hit), dtype=bool)  # interval i continues a hit run from interval i - 1
        chained[1:] = (self.t1[:-1] == self.t0[1:]) & hit[:-1]
        i0 = np.flatnonzero(hit & ~chained)
        nxt = np.zeros(len(hit), dtype=bool)
        nxt[:-1] = chained[1:] & hit[1:]
        i1 = np.flatnonzero(hit & ~nxt)
        r0, r1 = self.t0[i0], self.t1[i1]
        long = (r1 - r0) >= min_us
        i0, r0, r1 = i0[long], r0[long], r1[long]
        gid = r0 // self.span
        vid = self._vid_of(i0)
        return pl.DataFrame({"gid": gid, "vid": vid, "r0": r0 - gid * self.span + self.base, "r1": r1 - gid * self.span + self.base},
                            schema={"gid": pl.Int64, "vid": pl.Int64, "r0": pl.Int64, "r1": pl.Int64})


def per_gpu_cumsum(keys: np.ndarray, span: int, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Cumulative sums of each x along a line of keys (gid x span + t, in order) that start again
    at each GPU's first entry, in place: a look-up subtracts two sums of one GPU, so it rounds at
    the GPU's scale, not the fleet's (one sum over a week of 4,096 GPUs, ~2.5e9 s, moved a nearly
    idle job's busy seconds in their 8th digit)."""
    if not len(keys):
        return xs
    g = keys // span
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    ends = np.append(starts[1:], len(keys))
    for s, e in zip(starts.tolist(), ends.tolist()):
        for x in xs:
            np.cumsum(x[s:e], out=x[s:e])
    return xs


def search(line: np.ndarray, keys: np.ndarray, side: str = "left") -> np.ndarray:
    """np.searchsorted(line, keys, side), with the keys put in order first: numpy narrows each
    search from the last one when keys ascend, which on a line of millions is ~8x faster than
    keys in allocation order."""
    keys = np.asarray(keys)
    if len(keys) < 1024 or not (keys[1:] < keys[:-1]).any():  # few, or in order already
        return np.searchsorted(line, keys, side=side)  # type: ignore[call-overload]
    order = np.argsort(keys, kind="stable")
    out = np.empty(len(keys), dtype=np.intp)
    out[order] = np.searchsorted(line, keys[order], side=side)  # type: ignore[call-overload]
    return out


_PIECES_CHUNK = 2_000_000  # intervals per allocation_detail step: ~0.2 GB of temporaries


def _side_by_side(j0: np.ndarray, j1: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slices [j0, j1) of the line laid side by side: (where each slice starts in the result, the
    slice each position belongs to, the line index at each position)."""
    lens = j1 - j0
    at = np.cumsum(lens) - lens
    return at, np.repeat(np.arange(len(lens)), lens), np.repeat(j0 - at, lens) + np.arange(int(lens.sum()))


_LOOP_MAX = 50_000  # up to this many segments a Python loop over slices beats a row-long index array


def _gather(parts: list[np.ndarray], c: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Segments k = parts[c[k]][starts[k]:starts[k] + lens[k]] one after another, as a new array."""
    if not len(c):
        return np.array([], dtype=parts[0].dtype if parts else np.float64)
    if len(c) <= _LOOP_MAX:
        return np.concatenate([parts[i][s:s + n] for i, s, n in zip(c.tolist(), starts.tolist(), lens.tolist())])
    x = np.concatenate(parts)
    at = np.concatenate(([0], np.cumsum([len(p) for p in parts])))[c] + starts
    return x[np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens - at, lens)]


def _add_per_segment(arrays: tuple[np.ndarray, ...], off: np.ndarray, at: np.ndarray, lens: np.ndarray) -> None:
    """Add off[k] to segment k ([at[k], at[k] + lens[k])) of each array, in place."""
    if len(at) <= _LOOP_MAX:
        for a, n, o in zip(at.tolist(), lens.tolist(), off.tolist()):
            for x in arrays:
                x[a:a + n] += o
        return
    rep = np.repeat(off, lens)
    for x in arrays:
        x += rep


@contextmanager
def _no_hugepages() -> Iterator[None]:
    """numpy advises the kernel to back big arrays with huge pages; where the kernel then compacts
    memory synchronously on the first touch (THP defrag "madvise"), that costs several times the
    arithmetic on these ~300 MB arrays (measured: 2-3 s of system time of a 5 s weekly analysis).
    Off while the arrays are built, as before afterwards."""
    set_advice = getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)
    if set_advice is None:
        yield
        return
    before = set_advice(False)
    try:
        yield
    finally:
        set_advice(before)


def _variants(con: Any, bind: dict[str, Any], hashes: np.ndarray) -> pl.DataFrame:
    """Name the GPU variants behind the sample hashes: from the inventory, and for any the inventory
    lacks, from the samples themselves. vid = index into `hashes`; gid numbers (cluster, host, gpu_uuid, gi)
    in that order."""
    want = pl.DataFrame({"h": pl.Series(hashes, dtype=pl.UInt64)}).with_row_index("vid")
    con.register("_want_h", want.to_arrow())
    try:
        found = pl.from_arrow(con.sql(INVENTORY_VARIANTS).to_arrow_table())
        missing = want.join(found.select("h"), on="h", how="anti")
        if missing.height:
            q = SAMPLE_VARIANTS
            con.register("_want_h", missing.to_arrow())
            more = pl.from_arrow(raw_reads.read(con, "raw path", q, sql.bound(q, bind), epoch_us(bind["xstart"]), epoch_us(bind["xend"])))
            found = pl.concat([found, more], how="vertical_relaxed")
    finally:
        con.unregister("_want_h")
    out = want.join(found.unique("h", keep="first"), on="h", how="left").sort("vid")
    if out["gpu_uuid"].null_count() and out.filter(pl.col("gpu_uuid").is_null() & pl.col("cluster").is_null()).height:
        raise RuntimeError("a sample hash names no GPU")  # cannot happen: the hashes come from these rows
    # gid in the store files' order (cluster, host, GPU): the rows of a file, a batch of them, then
    # come in ascending keys, which the line's sorts and look-ups run over with better locality than
    # keys in the hashes' random order (the 16,384-GPU week: 10.0-12.3 s against 11.1-13.6 s)
    gid = out.select("cluster", "host", "gpu_uuid", "gi").unique().sort(
        ["cluster", "host", "gpu_uuid", "gi"], nulls_last=True).with_row_index("gid")
    out = out.join(gid, on=["cluster", "host", "gpu_uuid", "gi"], how="left", nulls_equal=True).sort("vid")
    return out.with_columns(pl.col("gid").cast(pl.Int64), pl.col("vid").cast(pl.Int64))

