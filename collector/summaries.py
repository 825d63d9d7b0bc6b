"""Exact, composable per-GPU summaries of the samples: one row per GPU (or MIG instance) and bucket.

A weekly analysis that reads every sample costs as much as there are samples. The figures need
far less: per GPU and bucket, the sums of the sample intervals that fall inside it, and enough
about the idle (and no-process) runs to join them across buckets exactly. So compaction writes,
for every closed hour (and for the open hour up to its settled buckets, again at each upkeep
pass: gpufleet.collector.maintenance.summarize), one row per GPU and bucket (BUCKET_S, 5
minutes) with

  covered_us   microseconds covered by a sample interval (any, with or without a utilization)
  data_s       seconds with a utilization; busy_s: utilization / 100 x seconds over them
  nop_s        seconds held with no compute process (compute_processes = 0)
  tensor_s, tensor_known_s   tensor activity x seconds, and the seconds it is known
  energy_j, power_known_s    power x seconds (joules), and the seconds it is known
  fb_max_mib   the most GPU memory used by a sample over the segment (null: none known)
  clocked_s    seconds with tensor activity and an SM clock known; tensor_clock_s: tensor
               activity x SM clock (MHz) x seconds over them, tensor_clocked_s: tensor activity
               x seconds over them, tensor_unclocked_s: tensor activity x seconds where the
               clock is not known (a job's MFU estimate, gpufleet.analytics.mfu)
  idle_head_us the idle run (utilization < the threshold) touching the bucket's start: its
               length inside the bucket (0: none; = the bucket: the whole bucket is idle)
  idle_tail_us the idle run touching the bucket's end: its length inside the bucket
  idle_runs    idle runs inside the bucket touching neither edge, at least `keep_s` long
               (start and end offsets in us from the bucket start): with the bucket 5 minutes
               and idle_min_duration 30 minutes there are none
  nop_head_us, nop_tail_us, nop_runs: the same for "held with no compute process"
  exact        false when the row cannot stand for its samples (two variants of the GPU in the
               bucket, two samples at one time): readers take such a bucket from the raw samples
  seg0_us, seg1_us  the segment of the bucket the row covers, as offsets from the bucket start

A bucket is one row, or several when allocations start or end inside it (`cuts`: the times the
analysis will look up on each GPU, sql ALLOCATION_EDGES): the bucket is cut there into segments,
one row each, with head and tail runs at the segment's edges. An analysis then answers a job's
edges from summaries too; a cut the summary does not have (an allocation learnt of after the
hour was summarised) makes the reader take that bucket from raw samples, as before.

Sample intervals follow the analytics' rule (gpufleet.analytics.gputime): a sample holds until
the next sample of its GPU, at most max_gap. A bucket's intervals depend on the samples from
max_gap before it to max_gap after it, so an hour's summary reads the samples of
[hour - max_gap, hour + 1 h + max_gap) and records the sample files it read (`sources`): it is
current while exactly those files hold samples of that range (the writer drops it when a batch
lands there, and the next upkeep pass rebuilds it).

A closed hour's rows are also written joined (coarsen: consecutive segments of a GPU variant as
one row, broken at every allocation edge the writer knows, its inner runs listed down to keep_s),
beside the hour's file ("coarse" in its manifest entry): what an analysis whose look-ups fall on
hour edges reads instead of the buckets.

Parameters baked in (max_gap, the idle threshold, keep_s, the bucket) are recorded with every
hour's summary; an analysis asking for others reads raw samples, and upkeep with other
parameters rebuilds the summaries from raw.

The same functions cut raw samples into bucket pieces for the readers (the buckets an analysis
must read raw), so both sides apply one rule.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import duckdb
import numpy as np
import pyarrow as pa

from gpufleet.collector.intervals import intervals, segments, split

FORMAT_VERSION = 3
# The format an open hour's summary (one that ends before its hour: its manifest entry's "to") is
# listed with: a reader older than such summaries would take it for a whole hour, and skips it
# (reads the hour raw) for a format it does not know
OPEN_FORMAT = f"{FORMAT_VERSION}-open"
BUCKET_S = 300
# A rebuild's task outputs (one per day and GPU shard, gpufleet.collector.maintenance) until they
# become the hours' files: kept across a restart, so a killed rebuild resumes
PARTS_DIR = "summaries/parts"


@dataclass(frozen=True)
class SummaryParams:
    """What a summary bakes in. Defaults: gpufleet.analytics.params' defaults (max_gap 30 s,
    idle threshold 5 %, idle_min_duration 30 min kept as keep_s)."""

    max_gap_s: float = 30.0
    idle_threshold: float = 5.0
    keep_s: float = 1800.0  # internal runs at least this long are listed
    bucket_s: int = BUCKET_S

    def __post_init__(self) -> None:
        if self.bucket_s <= 0 or 3600 % self.bucket_s:
            raise ValueError(f"summary bucket {self.bucket_s} s must divide an hour")
        if self.max_gap_s <= 0 or self.max_gap_s * 1_000_000 != round(self.max_gap_s * 1_000_000):
            raise ValueError(f"max_gap {self.max_gap_s} s must be a positive whole number of microseconds")

    @property
    def gap_us(self) -> int:
        return round(self.max_gap_s * 1_000_000)

    @property
    def bucket_us(self) -> int:
        return self.bucket_s * 1_000_000

    def tag(self) -> str:
        text = json.dumps({"v": FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _runs(grp: np.ndarray, p0: np.ndarray, p1: np.ndarray, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximal chains of back-to-back hit pieces within each group: (group, r0, r1)."""
    n = len(hit)
    linked = np.zeros(n, dtype=bool)  # piece i continues a chain from piece i - 1
    if n > 1:
        linked[1:] = (grp[1:] == grp[:-1]) & (p1[:-1] == p0[1:]) & hit[:-1]
    first = hit & ~linked
    nxt = np.zeros(n, dtype=bool)
    if n > 1:
        nxt[:-1] = linked[1:] & hit[1:]
    last = hit & ~nxt
    i0, i1 = np.flatnonzero(first), np.flatnonzero(last)
    return grp[i0], p0[i0], p1[i1]


def bucket_facts(grp: np.ndarray, starts: np.ndarray, s0: np.ndarray, s1: np.ndarray, b0: np.ndarray, p0: np.ndarray, p1: np.ndarray,
                 hit: np.ndarray, keep_us: int) -> tuple[np.ndarray, np.ndarray, list]:
    """For groups (GPU x segment [s0, s1) of the bucket starting b0) of pieces in time order: the
    hit run touching the segment's start (its length), the one touching its end, and the runs
    touching neither edge at least keep_us long (as [start, end) offsets from the bucket start)."""
    ng = len(starts)
    head = np.zeros(ng, dtype=np.int64)
    tail = np.zeros(ng, dtype=np.int64)
    rg, r0, r1 = _runs(grp, p0, p1, hit)
    at_start = r0 == s0[rg]
    at_end = r1 == s1[rg]
    head[rg[at_start]] = (r1 - r0)[at_start]
    tail[rg[at_end]] = (r1 - r0)[at_end]
    inner = ~at_start & ~at_end & ((r1 - r0) >= keep_us)
    lists: list = [None] * ng
    for g, a, b in zip(rg[inner].tolist(), (r0 - b0[rg])[inner].tolist(), (r1 - b0[rg])[inner].tolist()):
        lists[g] = (lists[g] or []) + [{"r0_us": a, "r1_us": b}]
    return head, tail, lists


RUN_TYPE = pa.list_(pa.struct([("r0_us", pa.int64()), ("r1_us", pa.int64())]))
SCHEMA = pa.schema([
    ("cluster", pa.string()), ("host", pa.string()), ("gpu_uuid", pa.string()), ("gi", pa.int16()),
    ("gpu", pa.int32()), ("model", pa.string()), ("mig_profile", pa.string()),
    ("bucket", pa.timestamp("us")), ("exact", pa.bool_()), ("covered_us", pa.int64()),
    ("data_s", pa.float64()), ("busy_s", pa.float64()), ("nop_s", pa.float64()),
    ("tensor_s", pa.float64()), ("tensor_known_s", pa.float64()), ("energy_j", pa.float64()), ("power_known_s", pa.float64()),
    ("idle_head_us", pa.int64()), ("idle_tail_us", pa.int64()), ("idle_runs", RUN_TYPE),
    ("nop_head_us", pa.int64()), ("nop_tail_us", pa.int64()), ("nop_runs", RUN_TYPE),
    ("seg0_us", pa.int64()), ("seg1_us", pa.int64()),
    ("fb_max_mib", pa.float64()), ("clocked_s", pa.float64()), ("tensor_clock_s", pa.float64()),
    ("tensor_clocked_s", pa.float64()), ("tensor_unclocked_s", pa.float64()),
])
VARIANT_COLUMNS = ("cluster", "host", "gpu_uuid", "gi", "gpu", "model", "mig_profile")
# An hour's file: SCHEMA's rows with each row's GPU variant (h) and GPU (gh) hashed as the
# analytics hash samples (gpufleet.analytics.sql.GPU_HASH), so a reader of millions of rows
# joins integers and hashes no string. DuckDB's hash is not promised across its versions: the
# hour records the version that hashed it (hash_by) and readers of another version read raw.
HASH_BY = f"duckdb {duckdb.__version__}"
FILE_SCHEMA = SCHEMA.append(pa.field("h", pa.uint64())).append(pa.field("gh", pa.uint64()))


def summarize(samples: pa.Table, lo_us: int, hi_us: int, p: SummaryParams,
              cuts: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """The summary rows of [lo_us, hi_us) (whole buckets) from `samples`: the rows of
    schema.SUMMARY_SAMPLES over [lo_us - max_gap, hi_us + max_gap), ordered by GPU (g) and time.
    `cuts`: (g, time in us) where segments end inside a bucket (an allocation's start or end)."""
    if not samples.num_rows:
        return SCHEMA.empty_table()
    g = samples["g"].to_numpy().astype(np.int64)
    v = samples["v"].to_numpy().astype(np.int64)
    ts = samples["ts"].to_numpy().astype(np.int64)
    util = samples["util"].to_numpy(zero_copy_only=False)
    nop = samples["nop"].to_numpy(zero_copy_only=False)
    tensor = samples["tensor"].to_numpy(zero_copy_only=False).astype(np.float64)
    power = samples["power"].to_numpy(zero_copy_only=False).astype(np.float64)
    fb = samples["fb"].to_numpy(zero_copy_only=False).astype(np.float64)
    clock = samples["clock"].to_numpy(zero_copy_only=False).astype(np.float64)
    t1 = intervals(g, ts, p.gap_us)
    dup = np.zeros(len(ts), dtype=bool)  # a sample at the time of the one before: order decides, so no summary
    dup[1:] = (g[1:] == g[:-1]) & (ts[1:] == ts[:-1])
    dup[:-1] |= dup[1:]
    i, k, p0, p1 = split(ts, t1, lo_us, hi_us, p.bucket_us)
    cut_g, cut_t = cuts if cuts is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    inside = (cut_t > lo_us) & (cut_t < hi_us) & (cut_t % p.bucket_us != 0)
    j, p0, p1, s0, s1 = segments(g[i], k, p0, p1, np.asarray(cut_g)[inside], np.asarray(cut_t)[inside], lo_us - p.gap_us, p.bucket_us)
    i, k = i[j], k[j]
    gk = g[i] * (1 << 32) + k  # groups: (GPU, segment), in order
    brk = np.ones(len(gk), dtype=bool)
    brk[1:] = (gk[1:] != gk[:-1]) | (s0[1:] != s0[:-1])
    starts = np.flatnonzero(brk)
    grp = np.cumsum(brk) - 1
    b0 = k[starts] * p.bucket_us
    sec = (p1 - p0) / 1e6
    u = util[i].astype(np.float64)
    known = ~np.isnan(u)
    total = lambda x: np.add.reduceat(x, starts)  # noqa: E731 - one sum per group
    vv = v[i]
    mixed = np.maximum.reduceat(vv, starts) != np.minimum.reduceat(vv, starts)
    exact = ~(mixed | (total(dup[i].astype(np.int64)) > 0))
    tk, pk = ~np.isnan(tensor[i]), ~np.isnan(power[i])
    ck = tk & ~np.isnan(clock[i])
    tsec = np.where(tk, tensor[i] * sec, 0.0)
    fb_max = np.fmax.reduceat(fb[i], starts)  # NaN: no memory known in the segment
    seg = (grp, starts, s0[starts], s1[starts], b0, p0, p1)
    ih, it, ir = bucket_facts(*seg, util[i] < np.float64(p.idle_threshold), round(p.keep_s * 1e6))
    nh, nt, nr = bucket_facts(*seg, nop[i], round(p.keep_s * 1e6))
    first = samples.select(list(VARIANT_COLUMNS)).take(pa.array(i[starts]))
    cols = {c: first[c] for c in VARIANT_COLUMNS}
    cols.update(
        bucket=pa.array(b0, pa.timestamp("us")), exact=pa.array(exact), covered_us=pa.array(total(p1 - p0)),
        data_s=pa.array(total(np.where(known, sec, 0.0))), busy_s=pa.array(total(np.where(known, u / 100 * sec, 0.0))),
        nop_s=pa.array(total(np.where(nop[i], sec, 0.0))),
        tensor_s=pa.array(total(tsec)), tensor_known_s=pa.array(total(np.where(tk, sec, 0.0))),
        energy_j=pa.array(total(np.where(pk, power[i] * sec, 0.0))), power_known_s=pa.array(total(np.where(pk, sec, 0.0))),
        idle_head_us=pa.array(ih), idle_tail_us=pa.array(it), idle_runs=pa.array(ir, RUN_TYPE),
        nop_head_us=pa.array(nh), nop_tail_us=pa.array(nt), nop_runs=pa.array(nr, RUN_TYPE),
        seg0_us=pa.array(s0[starts] - b0), seg1_us=pa.array(s1[starts] - b0),
        fb_max_mib=pa.array(fb_max, mask=np.isnan(fb_max)), clocked_s=pa.array(total(np.where(ck, sec, 0.0))),
        tensor_clock_s=pa.array(total(np.where(ck, tsec * clock[i], 0.0))), tensor_clocked_s=pa.array(total(np.where(ck, tsec, 0.0))),
        tensor_unclocked_s=pa.array(total(np.where(tk & ~ck, tsec, 0.0))),
    )
    return pa.table(cols).cast(SCHEMA)


# --- the hour level: an hour's segments joined where no look-up can fall ---

# What a joined segment adds up (the rest: the first segment's, or below)
_SUMMED = ("covered_us", "data_s", "busy_s", "nop_s", "tensor_s", "tensor_known_s", "energy_j", "power_known_s",
           "clocked_s", "tensor_clock_s", "tensor_clocked_s", "tensor_unclocked_s")


def coarsen(rows: pa.Table, p: SummaryParams, aligned: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """An hour's summary rows (FILE_SCHEMA, by GPU, bucket and segment) with consecutive segments
    joined into one row, as an analysis joins them between its look-ups
    (gpufleet.analytics.summaries._merge): same GPU variant (h), back to back, both exact and
    covered, never across a cut the writer made (a segment starting off its bucket's start), an
    allocation edge on a bucket's start (`aligned`: GPU hash gh and time in us) or a GPU-bucket
    holding an inexact row (a reader takes that one raw, so it stays as written). A joined row
    keeps the first one's bucket (seg0_us / seg1_us are offsets from it, up to the hour) and the
    idle and no-process runs in the form bucket_facts gives, over the joined segment: the run
    touching its start, the one touching its end, the runs inside at least keep_s long.
    A weekly analysis whose look-ups fall on hour edges and allocation edges reads these rows:
    ~7x fewer than the buckets (16,384 GPUs' week: 4.8M rather than 35M)."""
    n = rows.num_rows
    if not n:
        return rows
    b = p.bucket_us
    col = lambda c: rows[c].to_numpy(zero_copy_only=False)  # noqa: E731
    h, gh = col("h"), col("gh")
    b0 = rows["bucket"].cast(pa.int64()).to_numpy()
    s0, s1 = b0 + col("seg0_us"), b0 + col("seg1_us")
    exact, covered = col("exact"), col("covered_us")
    k = b0 // b
    gpu_bucket = gh.astype(np.uint64) ^ (k.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    inexact = np.isin(gpu_bucket, gpu_bucket[~exact])  # every segment of a GPU-bucket holding an inexact row
    joinable = exact & (covered > 0) & ~inexact
    joins = np.zeros(n, dtype=bool)  # row i continues the row before it
    joins[1:] = (joinable[1:] & joinable[:-1] & (gh[1:] == gh[:-1]) & (h[1:] == h[:-1]) & (s0[1:] == s1[:-1])
                 & (s0[1:] % b == 0))
    if aligned is not None and len(aligned[1]):
        edge = aligned[0].astype(np.uint64) ^ (np.asarray(aligned[1], dtype=np.int64).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        joins &= ~np.isin(gh.astype(np.uint64) ^ (s0.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)), edge)  # (a shared key: one break more)
    if not joins.any():
        return rows
    at = np.flatnonzero(~joins)
    last = np.append(at[1:] - 1, n - 1)
    grp = np.cumsum(~joins) - 1
    g0, g1 = s0[at], s1[last]
    out = {c: rows[c].take(pa.array(at)) for c in rows.column_names}
    for c in _SUMMED:
        out[c] = pa.array(np.add.reduceat(col(c), at), rows.schema.field(c).type)
    fb = rows["fb_max_mib"].to_numpy(zero_copy_only=False).astype(np.float64)  # null -> NaN
    fb = np.fmax.reduceat(fb, at)
    out["fb_max_mib"] = pa.array(fb, pa.float64(), mask=np.isnan(fb))
    out["seg1_us"] = pa.array(g1 - b0[at], pa.int64())
    for kind in ("idle", "nop"):
        head, tail, inner = _joined_runs(rows, kind, grp, s0, s1, b0, g0, g1, round(p.keep_s * 1e6))
        out[f"{kind}_head_us"], out[f"{kind}_tail_us"] = pa.array(head, pa.int64()), pa.array(tail, pa.int64())
        out[f"{kind}_runs"] = pa.array([None if not r else [{"r0_us": a - b0[at[g]], "r1_us": z - b0[at[g]]} for a, z in r]
                                        for g, r in enumerate(inner)], RUN_TYPE) if any(inner) else pa.nulls(len(at), RUN_TYPE)
    return pa.table(out, schema=rows.schema)


def _joined_runs(rows: pa.Table, kind: str, grp: np.ndarray, s0: np.ndarray, s1: np.ndarray, b0: np.ndarray,
                 g0: np.ndarray, g1: np.ndarray, keep_us: int) -> tuple[np.ndarray, np.ndarray, list]:
    """The runs of `kind` over each joined segment [g0, g1) of the rows (group grp): its rows'
    run pieces (head, inner runs, tail) chained where one ends as the next starts, then in
    bucket_facts' form (inner runs by absolute time; empty lists: none)."""
    head = rows[f"{kind}_head_us"].to_numpy()
    tail = rows[f"{kind}_tail_us"].to_numpy()
    whole = head == s1 - s0
    ih, it = np.flatnonzero(head > 0), np.flatnonzero((tail > 0) & ~whole)
    pg = [grp[ih], grp[it]]
    pa0, pa1 = [s0[ih], s1[it] - tail[it]], [s0[ih] + head[ih], s1[it]]
    order_key = [ih * 4, it * 4 + 2]  # a row's head, its inner runs, its tail
    runs = rows[f"{kind}_runs"]
    lens = runs.combine_chunks().value_lengths().fill_null(0).to_numpy() if runs.null_count < len(runs) else None
    if lens is not None and lens.sum():
        flat = pa.concat_arrays([c.flatten() for c in runs.chunks if len(c)]) if runs.num_chunks > 1 else runs.chunks[0].flatten()
        ri = np.repeat(np.arange(len(lens)), lens)
        pg.append(grp[ri])
        pa0.append(b0[ri] + flat.field("r0_us").to_numpy())
        pa1.append(b0[ri] + flat.field("r1_us").to_numpy())
        order_key.append(ri * 4 + 1)
    pg_, a0, a1, ok = (np.concatenate(x) for x in (pg, pa0, pa1, order_key))
    o = np.lexsort((a0, ok))
    pg_, a0, a1 = pg_[o], a0[o], a1[o]
    linked = np.zeros(len(a0), dtype=bool)
    linked[1:] = (pg_[1:] == pg_[:-1]) & (a1[:-1] == a0[1:])
    c0 = np.flatnonzero(~linked)
    c1 = np.append(c0[1:] - 1, len(a0) - 1) if len(c0) else c0
    cg, r0, r1 = pg_[c0], a0[c0], a1[c1]
    ng = len(g0)
    h_out, t_out = np.zeros(ng, dtype=np.int64), np.zeros(ng, dtype=np.int64)
    at_start, at_end = r0 == g0[cg], r1 == g1[cg]
    h_out[cg[at_start]] = (r1 - r0)[at_start]
    t_out[cg[at_end]] = (r1 - r0)[at_end]
    inner: list = [None] * ng
    keep = ~at_start & ~at_end & ((r1 - r0) >= keep_us)
    for g, a, z in zip(cg[keep].tolist(), r0[keep].tolist(), r1[keep].tolist()):
        inner[g] = (inner[g] or []) + [(a, z)]
    return h_out, t_out, inner
