"""Facts: the store's one derived tier (DESIGN.md contract 3) - exact, composable parts of buckets.

A part is a stretch [p0, p1) of one GPU's (or MIG instance's) bucket held by one allocation (scheduler, job_key) or by
none (job_key NULL); buckets are cut at every allocation edge. A stretch several allocations hold is one row per holder,
exactly one of them its `lead` (the first holder, or the unheld row): GPU figures sum lead rows, job figures held rows.
Seconds are not yet times the MIG share (readers take it from model and mig_profile); *_us are microseconds; NULL: never
known. Columns:

  covered_s, data_s, busy_s, nop_s  seconds covered by a sample interval; of them with a utilization; those x utilization / 100;
                                    with no compute process
  first_ts, last_ts                 the first and last sample interval's start in the part
  energy_j, fb_max_mib, temp_max_c  power x seconds where known; memory and temperature high-waters
  idle_head_us, idle_tail_us        the idle run touching the part's start / end (its length in the part)
  idle_whole, idle_inner_us         one idle run is the whole part (head = tail = p1 - p0); runs touching neither edge, each
                                    at least idle_min long; nop_*: the same for "held with no compute process"
  <field>_known_s, <field>_s        per PROFILING field, the seconds it is known and value x seconds over them (a mean composes)
  clocked_s, tensor_clock_s, tensor_clocked_s  MFU's inputs (analytics.mfu): seconds with tensor activity and SM clock known,
                                    tensor x clock (MHz) x seconds and tensor x seconds over them
  samples_n, xid_n                  samples whose time lies in the part (each counted once); of them, those showing an XID
  xid_codes                         per XID code its first and last sample time and count (NULL: none): a window's last XID
                                    is the code of the latest last time
  reasons_known_s, reasons_known_n  seconds and samples with clock-event reasons known; <reason>_s, <reason>_n per
                                    THROTTLE_REASONS: the seconds and samples with its bits set
  Health, of the samples whose time lies in the part (as gpufleet.analytics.health reads them):
  first_sample_ts, last_sample_ts   the first and last one's time
  temp_n, temp_sum                  samples with a GPU temperature, and their sum; sample_temp_max_c, mem_temp_max_c,
                                    power_max_w: high-waters
  lost_n, lost_ts                   samples with gpufleet_gpu_up = 0, and the first one's time
  remap_failure_n, remap_failure_ts samples with a row-remap failure, and the first one's time; LIFETIME_MAXES: largest values
  <counter>_first/_last             per COUNTERS, the first and last value (a window's new ECC errors: its latest part's last
                                    minus its earliest part's first; per-part rises would miss those between parts)
  <counter>_min/_max/_n/_first_ts   per EVENT_COUNTERS, least and largest value, samples reporting it, the first one's time
                                    (a rise above a window's first value is an event: gpufleet.analytics.health.events)

Sample intervals follow contract 4 (oracle: tests/support/gputime.py): a sample holds until its GPU's next, at most
max_gap. A part depends on its own samples and the one before them, never on a neighbour's facts, so joining adjacent
parts is associative (join_parts) and runs crossing parts are resolved when a window is summed (gpufleet.analytics.facts).
Grains: 5 minutes from samples; 1 hour and 1 day from the finer grain by join_parts, never from samples. Every file
records the parameters baked in (FactParams.tag).

Layout: an hour's 5-minute facts in facts/5m/date=D/hour-HH-<inputs>.parquet, a closed day's hour and day facts in
facts/day/date=D-<inputs>.parquet; the manifest ("facts") lists each with the digest of its inputs (sample files and
allocation edges; a day's: its hours' files), so upkeep rebuilds exactly the changed buckets and their parents
(gpufleet.collector.maintenance.build_facts).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from gpufleet.collector.schema import (ALLOCATION_END, ALLOCATION_RUNS, ALLOCATION_START, HW_SLOWDOWN_BITS, LINE_COLUMNS, POWER_BITS, THERMAL_BITS,
                                      allocations_ending_after, empty_table)
from gpufleet.collector.intervals import distinct, intervals, positions_within, segments, split
from gpufleet.collector.reading import query_rows, seen_floor
from gpufleet.times import from_epoch_us

FORMAT_VERSION = 5  # bump with any change to the parts: readers skip files of another format, upkeep rebuilds them
# an open hour's file of its settled 5-minute buckets (maintenance._open_hour_tasks), marked apart so that a reader from
# before such files, which would take it for the whole hour, does not list it
OPEN_FORMAT = f"{FORMAT_VERSION}+open"
GRAIN_5M, GRAIN_1H, GRAIN_1D = 300, 3600, 86400
HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US


@dataclass(frozen=True)
class FactParams:
    """What facts bake in (recorded with every file: tag); defaults as gpufleet.analytics.params'."""

    max_gap_s: float = 30.0
    idle_threshold: float = 5.0
    idle_min_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.max_gap_s <= 0 or self.max_gap_s * 1_000_000 != round(self.max_gap_s * 1_000_000):
            raise ValueError(f"max_gap {self.max_gap_s} s must be a positive whole number of microseconds")
        if self.max_gap_s > GRAIN_5M:
            raise ValueError(f"max_gap {self.max_gap_s} s must be at most the 5-minute bucket ({GRAIN_5M} s)")
        if self.idle_min_s <= 0:
            raise ValueError(f"idle_min_duration {self.idle_min_s} s must be positive")

    @property
    def gap_us(self) -> int:
        return round(self.max_gap_s * 1_000_000)

    @property
    def idle_min_us(self) -> int:
        return round(self.idle_min_s * 1_000_000)

    def tag(self) -> str:
        text = json.dumps({"v": FORMAT_VERSION, **{k: float(v) for k, v in asdict(self).items()}}, sort_keys=True)  # (300 = 300.0)
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


_GPU = ("cluster", "host", "gpu_uuid", "gi")
_HOLDER = ("scheduler", "job_key")
# Profiling fields (gpu_samples columns: ratios 0-1, then bytes/s) whose known seconds and value x seconds parts carry
PROFILING = ("tensor_active", "sm_active", "dram_active", "fp64_active", "fp32_active", "fp16_active", "sm_occupancy",
             "pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s")
# Clock-event reason columns and their DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits (schema's)
THROTTLE_REASONS = {"thermal_throttle": THERMAL_BITS, "power_throttle": POWER_BITS, "hw_slowdown": HW_SLOWDOWN_BITS}
ECC_COUNTERS = ("ecc_sbe", "ecc_dbe")  # the volatile counters (gpu_samples' ecc_sbe_vol, ecc_dbe_vol)
# Counters whose first and last value a window takes (SAMPLES' names); EVENT_COUNTERS: those whose rise is a health event
COUNTERS = (*ECC_COUNTERS, "remap_unc", "pcie_replay", "thermal_viol", "power_viol")
EVENT_COUNTERS = (*ECC_COUNTERS, "remap_unc")
# Lifetime counters whose largest value a window reports: fact column -> SAMPLES' name
LIFETIME_MAXES = {"ecc_dbe_agg_max": "ecc_dbe_agg", "remap_correctable_max": "remap_corr", "remap_uncorrectable_max": "remap_unc",
                  "remap_failure_max": "remap_fail"}
_SUMS = ("covered_s", "data_s", "busy_s", "nop_s", "energy_j", "samples_n", "clocked_s", "reasons_known_s", "reasons_known_n",
         *(f"{f}_known_s" for f in PROFILING), "temp_n", "temp_sum", "lost_n", "remap_failure_n", *(f"{c}_n" for c in EVENT_COUNTERS))
# sums that are NULL where nothing in the part was known (a NULL part adds nothing; all NULL stays NULL)
_KNOWN_SUMS = ("tensor_clock_s", "tensor_clocked_s", "xid_n", *(f"{f}_s" for f in PROFILING),
               *(f"{r}_{u}" for r in THROTTLE_REASONS for u in ("s", "n")))
_MAXES = ("fb_max_mib", "temp_max_c", "sample_temp_max_c", "mem_temp_max_c", "power_max_w")
# integer columns joined by their least / largest value (NULL: none in any part)
_INT_MINS = ("first_sample_ts", "lost_ts", "remap_failure_ts", *(f"{c}_min" for c in EVENT_COUNTERS), *(f"{c}_first_ts" for c in EVENT_COUNTERS))
_INT_MAXES = ("last_sample_ts", *LIFETIME_MAXES, *(f"{c}_max" for c in EVENT_COUNTERS))
# Fleet now's run marks of the samples whose time lies in the part (sample times, epoch us; NULL: none;
# gpufleet.analytics.fleet_now composes them). Per kind - "idle" (idle: utilization below the idle threshold), "noproc"
# (idle: no compute process) - the last busy sample, the first idle one after it, the first idle one, and the first idle
# one from the last sample after a gap on (none: the first idle one); last_gap_ts: that sample (a GPU's first, or one
# more than max_gap after the one before it)
RUN_KINDS = {"idle": ("last_busy_ts", "idle_after_busy_ts", "first_idle_ts", "idle_in_stretch_ts"),
             "noproc": ("last_proc_ts", "noproc_after_proc_ts", "first_noproc_ts", "noproc_in_stretch_ts")}
RUN_MARKS = (*(c for cs in RUN_KINDS.values() for c in cs), "last_gap_ts")
XID_CODES = pa.list_(pa.struct([("code", pa.int64()), ("first_ts", pa.int64()), ("last_ts", pa.int64()), ("n", pa.int64())]))
SCHEMA = pa.schema([
    ("cluster", pa.string()), ("host", pa.string()), ("gpu_uuid", pa.string()), ("gi", pa.int16()),
    ("gpu", pa.int16()), ("model", pa.string()), ("mig_profile", pa.string()),
    ("grain_s", pa.int32()), ("bucket", pa.timestamp("us")), ("p0", pa.int64()), ("p1", pa.int64()),
    ("scheduler", pa.string()), ("job_key", pa.string()), ("lead", pa.bool_()),
    ("covered_s", pa.float64()), ("data_s", pa.float64()), ("busy_s", pa.float64()), ("nop_s", pa.float64()),
    ("energy_j", pa.float64()), ("fb_max_mib", pa.float64()), ("temp_max_c", pa.float64()),
    ("first_ts", pa.int64()), ("last_ts", pa.int64()),
    ("idle_head_us", pa.int64()), ("idle_tail_us", pa.int64()), ("idle_whole", pa.bool_()), ("idle_inner_us", pa.int64()),
    ("nop_head_us", pa.int64()), ("nop_tail_us", pa.int64()), ("nop_whole", pa.bool_()), ("nop_inner_us", pa.int64()),
    *((c, pa.float64()) for f in PROFILING for c in (f"{f}_known_s", f"{f}_s")),
    ("clocked_s", pa.float64()), ("tensor_clock_s", pa.float64()), ("tensor_clocked_s", pa.float64()),
    ("samples_n", pa.int64()), ("xid_n", pa.int64()), ("xid_codes", XID_CODES),
    *((f"{e}_{end}", pa.int64()) for e in ECC_COUNTERS for end in ("first", "last")),
    ("reasons_known_s", pa.float64()), ("reasons_known_n", pa.int64()),
    *((f"{r}_{u}", pa.float64() if u == "s" else pa.int64()) for r in THROTTLE_REASONS for u in ("s", "n")),
    ("first_sample_ts", pa.int64()), ("last_sample_ts", pa.int64()), ("temp_n", pa.int64()), ("temp_sum", pa.float64()),
    ("sample_temp_max_c", pa.float64()), ("mem_temp_max_c", pa.float64()), ("power_max_w", pa.float64()),
    ("lost_n", pa.int64()), ("lost_ts", pa.int64()), ("remap_failure_n", pa.int64()), ("remap_failure_ts", pa.int64()),
    *((c, pa.int64()) for c in LIFETIME_MAXES),
    *((f"{c}_{end}", pa.int64()) for c in COUNTERS if c not in ECC_COUNTERS for end in ("first", "last")),
    *((f"{c}_{x}", pa.int64()) for c in EVENT_COUNTERS for x in ("min", "max", "n", "first_ts")),
    *((c, pa.int64()) for c in RUN_MARKS),
])

# The samples parts are built from, each GPU's in time order over [$lo - max_gap, $hi) (epoch us); {source}: gpu_samples
# (a reader's view) or an hour's files (upkeep). Unknown: NaN for measures, -1 for codes and counters (never negative).
SAMPLES = f"""
SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, gpu, model, mig_profile, epoch_us(ts) AS ts,
       {LINE_COLUMNS.format(s="")}, coalesce(round(compute_processes)::DOUBLE, 'NaN'::DOUBLE) AS procs,
       coalesce(power_w::DOUBLE, 'NaN'::DOUBLE) AS power, coalesce(fb_used_mib::DOUBLE, 'NaN'::DOUBLE) AS fb,
       coalesce(gpu_temp_c::DOUBLE, 'NaN'::DOUBLE) AS temp,
       {", ".join(f"coalesce({f}::DOUBLE, 'NaN'::DOUBLE) AS {f}" for f in PROFILING)},
       coalesce(sm_clock_mhz::DOUBLE, 'NaN'::DOUBLE) AS clock,
       coalesce(xid_last, -1) AS xid, coalesce(ecc_sbe_vol, -1) AS ecc_sbe, coalesce(ecc_dbe_vol, -1) AS ecc_dbe,
       coalesce(clocks_event_reasons, -1) AS reasons,
       coalesce(mem_temp_c::DOUBLE, 'NaN'::DOUBLE) AS mem_temp, coalesce(gpu_up::DOUBLE, 'NaN'::DOUBLE) AS up,
       coalesce(remap_uncorrectable, -1) AS remap_unc, coalesce(pcie_replay, -1) AS pcie_replay,
       coalesce(thermal_violation_ns, -1) AS thermal_viol, coalesce(power_violation_ns, -1) AS power_viol,
       coalesce(ecc_dbe_agg, -1) AS ecc_dbe_agg, coalesce(remap_correctable, -1) AS remap_corr, coalesce(remap_failure, -1) AS remap_fail
FROM {{source}}
WHERE ts >= make_timestamp($lo - $gap_us) AND ts < make_timestamp($hi) {{where}}
ORDER BY cluster, host, gpu_uuid, gi, ts
"""

def only_gpus(uuid: str = "gpu_uuid", host: str = "host") -> str:
    """SQL condition: only the GPUs $gpus names (by uuid; NULL: all) and those without a uuid, on the hosts $hosts names
    (sorted; NULL: all): reads of some GPUs' samples, holds and parts (analytics.facts.FactWindow's `gpus`). A semi-join
    (list_contains would scan the list per row); $host_lo, $host_hi (gpu_binds): constants DuckDB skips row groups and
    files by, as compaction sorts by host - a uuid list alone skips nothing."""
    return (f"($gpus IS NULL OR {uuid} IS NULL OR {uuid} IN (SELECT unnest($gpus)))"
            f" AND ($hosts IS NULL OR ({host} >= $host_lo AND {host} <= $host_hi AND {host} IN (SELECT unnest($hosts))))")


def gpu_binds(gpus: list[str] | None, hosts: list[str] | None) -> dict[str, Any]:
    """only_gpus' parameters: `gpus` (uuids) and `hosts` (sorted), each None for all."""
    return {"gpus": gpus, "hosts": hosts, "host_lo": hosts[0] if hosts else None, "host_hi": hosts[-1] if hosts else None}


# Who held each GPU when: every allocation overlapping [$lo, $hi) with its whole extent (epoch us), by the accounting's
# start and end where known (the analytics' al, unclipped); only those of only_gpus' GPUs.
HOLDS = f"""
SELECT a.cluster, a.host, a.gpu_uuid, a.gpu_instance AS gi, a.scheduler, a.job_key,
       epoch_us({ALLOCATION_START}) AS a0, epoch_us({ALLOCATION_END}) AS a1
FROM {allocations_ending_after("make_timestamp($lo)", only_gpus())} a
LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
{ALLOCATION_RUNS}
WHERE {ALLOCATION_END} > make_timestamp($lo) AND {ALLOCATION_START} < make_timestamp($hi)
  AND {ALLOCATION_END} > {ALLOCATION_START}
ORDER BY a.cluster, a.host, a.gpu_uuid, a.gpu_instance, a0, a.scheduler, a.job_key
"""


FLOOR_AT_LO = object()  # holds' `floor` unless given: reading.seen_floor at lo_us


def holds(con: duckdb.DuckDBPyConnection, lo_us: int, hi_us: int, p: FactParams, gpus: list[str] | None = None,
          hosts: list[str] | None = None, floor: Any = FLOOR_AT_LO) -> pa.Table:
    """HOLDS over [lo_us, hi_us) on a connection with allocations and jobs (the writer's, a reader's);
    `gpus`, `hosts`: only these GPUs' on these hosts (a read of their parts alone, analytics.facts.FactWindow's);
    `floor`: the read's $seen_floor (reading.seen_floor at lo_us or earlier: a reader of many spans finds one for all)."""
    if floor is FLOOR_AT_LO:
        floor = seen_floor(con, from_epoch_us(lo_us), p.max_gap_s)
    return query_rows(con, HOLDS, {"lo": lo_us, "hi": hi_us, "max_gap": p.max_gap_s, **gpu_binds(gpus, hosts), "seen_floor": floor})


def holds_digest(h: pa.Table, lo_us: int, hi_us: int) -> str:
    """The digest of the holds' edges that matter to [lo_us, hi_us): what its parts are cut by."""
    if not h.num_rows:
        return ""
    a0, a1 = h["a0"].to_numpy(), h["a1"].to_numpy()
    keep = np.flatnonzero((a1 > lo_us) & (a0 < hi_us))
    if not len(keep):
        return ""
    sub = h.take(pa.array(keep)).to_pydict()
    rows = sorted(zip(*(sub[c] for c in ("cluster", "host", "gpu_uuid", "gi", "scheduler", "job_key")),
                      np.clip(a0[keep], lo_us, hi_us).tolist(), np.clip(a1[keep], lo_us, hi_us).tolist()), key=repr)
    return hashlib.blake2b(repr(rows).encode(), digest_size=8).hexdigest()


def samples_query(source: str, where: str = "") -> str:
    """SAMPLES over `source`, with more conditions `where` ("AND ...")."""
    return SAMPLES.format(source=source, where=where)


def build_parts(samples: pa.Table, hold: pa.Table, lo_us: int, hi_us: int, p: FactParams, grain_s: int = GRAIN_5M,
                cuts_us: Sequence[int] = ()) -> pa.Table:
    """The 5-minute parts of [lo_us, hi_us) (a few hours at most; edges may be off the grid) from `samples` (SAMPLES' rows
    over [lo_us - max_gap, hi_us)) and `hold` (HOLDS' rows): sample intervals clipped to the range, cut at bucket and
    allocation edges, summed per stretch, one row per holder. `cuts_us`: more cuts for every GPU (a timeline's off-grid
    bucket edges); the parts between them equal a call's for that stretch alone (a sample counts where its time lies)."""
    if not samples.num_rows:
        return empty_table(SCHEMA)
    key = pa.table({c: samples[c] for c in _GPU})
    gk = _gpu_numbers(key)
    ts = samples["ts"].to_numpy().astype(np.int64)
    util = samples["util"].to_numpy(zero_copy_only=False).astype(np.float64)
    nop = samples["nop"].to_numpy(zero_copy_only=False)
    power, fb, temp = (samples[c].to_numpy(zero_copy_only=False).astype(np.float64) for c in ("power", "fb", "temp"))
    t1 = intervals(gk, ts, p.gap_us)
    bucket_us = grain_s * 1_000_000
    i, k, p0, p1 = split(ts, t1, lo_us, hi_us, bucket_us)
    # the GPUs' allocation edges inside the range: where stretches end inside a bucket
    if hold.num_rows:  # (each GPU's key from its first row only: a dict over every sample costs CPU)
        first = pa.array(np.flatnonzero(np.diff(gk, prepend=-1)))
        names = {tuple(r): n for n, r in zip(gk[first.to_numpy()].tolist(), zip(*(key[c].take(first).to_pylist() for c in _GPU)))}
    else:
        names = {}
    hg = np.array([names.get(r, -1) for r in zip(*(hold[c].to_pylist() for c in _GPU))], dtype=np.int64) if hold.num_rows else np.zeros(0, np.int64)
    ha0, ha1 = (hold[c].to_numpy().astype(np.int64) for c in ("a0", "a1")) if hold.num_rows else (np.zeros(0, np.int64),) * 2
    cut_g = np.concatenate([hg[hg >= 0]] * 2)
    cut_t = np.concatenate([ha0[hg >= 0], ha1[hg >= 0]])
    inside = (cut_t > lo_us) & (cut_t < hi_us)
    cut_g, cut_t = cut_g[inside], cut_t[inside]
    read = distinct(gk[i])
    extra = np.array([c for c in cuts_us if lo_us < c < hi_us], dtype=np.int64)
    # (a range start off the grid, and the extra cuts: every GPU read is cut there)
    cut_g = np.concatenate([cut_g, read, np.repeat(read, len(extra))])
    cut_t = np.concatenate([cut_t, np.full(len(read), lo_us), np.tile(extra, len(read))])
    j, p0, p1, s0, s1 = segments(gk[i], k, p0, p1, cut_g, cut_t, lo_us - p.gap_us, bucket_us)
    i, k = i[j], k[j]
    s0, s1 = np.maximum(s0, lo_us), np.minimum(s1, hi_us)
    brk = np.ones(len(i), dtype=bool)
    brk[1:] = (gk[i][1:] != gk[i][:-1]) | (s0[1:] != s0[:-1])
    starts = np.flatnonzero(brk)
    grp = np.cumsum(brk) - 1
    sec = (p1 - p0) / 1e6
    u = util[i]
    known = ~np.isnan(u)
    total = lambda x: np.add.reduceat(x, starts)  # noqa: E731 - one sum per stretch
    pk = ~np.isnan(power[i])
    seg0, seg1 = s0[starts], s1[starts]
    idle = _edge_runs(grp, p0, p1, u < np.float64(p.idle_threshold), seg0, seg1, p.idle_min_us)
    nops = _edge_runs(grp, p0, p1, nop[i], seg0, seg1, p.idle_min_us)
    fb_max, temp_max = np.fmax.reduceat(fb[i], starts), np.fmax.reduceat(temp[i], starts)
    first = samples.select(["cluster", "host", "gpu_uuid", "gi", "gpu", "model", "mig_profile"]).take(pa.array(i[starts]))
    stretch = {c: first[c] for c in first.column_names}
    stretch.update(
        grain_s=pa.array(np.full(len(starts), grain_s, dtype=np.int32)), bucket=pa.array(k[starts] * bucket_us, pa.timestamp("us")),
        p0=pa.array(seg0), p1=pa.array(seg1),
        covered_s=pa.array(total(sec)), data_s=pa.array(total(np.where(known, sec, 0.0))),
        busy_s=pa.array(total(np.where(known, u / 100 * sec, 0.0))), nop_s=pa.array(total(np.where(nop[i], sec, 0.0))),
        energy_j=pa.array(total(np.where(pk, power[i] * sec, 0.0))),
        fb_max_mib=pa.array(fb_max, mask=np.isnan(fb_max)), temp_max_c=pa.array(temp_max, mask=np.isnan(temp_max)),
        first_ts=pa.array(np.minimum.reduceat(p0, starts)), last_ts=pa.array(np.maximum.reduceat(p0, starts)),
        **{f"idle_{c}": v for c, v in idle.items()}, **{f"nop_{c}": v for c, v in nops.items()},
        **_profiling_and_health(samples, i, ts[i] == p0, sec, grp, starts),
        **_run_marks(gk, ts, util, samples["procs"].to_numpy(zero_copy_only=False).astype(np.float64), i, ts[i] == p0, grp, starts, p),
    )
    return _with_holders(pa.table(stretch), gk[i[starts]], hg, ha0, ha1, hold)


def _profiling_and_health(samples: pa.Table, i: np.ndarray, own: np.ndarray, sec: np.ndarray, grp: np.ndarray,
                          starts: np.ndarray) -> dict[str, pa.Array]:
    """The profiling, MFU-clock, XID, ECC and throttle columns of the stretches (pieces of samples
    i, `sec` long, grouped by grp from `starts`). Time-weighted columns add every piece; sample
    counts and counter values only a sample's own piece (`own`: the one starting at its time)."""
    col = lambda c: samples[c].to_numpy(zero_copy_only=False)[i]  # noqa: E731
    total = lambda x: np.add.reduceat(x, starts)  # noqa: E731 - one sum per stretch
    anyof = lambda x: np.logical_or.reduceat(x, starts)  # noqa: E731

    def known_sum(x: np.ndarray, known: np.ndarray) -> pa.Array:
        return pa.array(total(np.where(known, x, 0)), mask=~anyof(known))

    out: dict[str, pa.Array] = {}
    for f in PROFILING:
        x = col(f).astype(np.float64)
        k = ~np.isnan(x)
        out[f"{f}_known_s"], out[f"{f}_s"] = pa.array(total(np.where(k, sec, 0.0))), known_sum(x * sec, k)
    tensor, clock = col("tensor_active").astype(np.float64), col("clock").astype(np.float64)
    clocked = ~np.isnan(tensor) & ~np.isnan(clock)
    out["clocked_s"] = pa.array(total(np.where(clocked, sec, 0.0)))
    out["tensor_clock_s"], out["tensor_clocked_s"] = known_sum(tensor * clock * sec, clocked), known_sum(tensor * sec, clocked)
    out["samples_n"] = pa.array(total(own.astype(np.int64)))
    xid = col("xid").astype(np.int64)
    out["xid_n"] = known_sum((xid > 0).astype(np.int64), own & (xid >= 0))
    out["xid_codes"] = _xid_codes(grp, own & (xid > 0), xid, col("ts").astype(np.int64), len(starts))
    at = np.arange(len(i))
    ts = col("ts").astype(np.int64)
    for e in COUNTERS:
        v = col(e).astype(np.int64)
        k = own & (v >= 0)
        first, last = np.minimum.reduceat(np.where(k, at, len(at)), starts), np.maximum.reduceat(np.where(k, at, -1), starts)
        has = last >= 0
        out[f"{e}_first"] = pa.array(v[np.where(has, first, 0)], mask=~has)
        out[f"{e}_last"] = pa.array(v[np.where(has, last, 0)], mask=~has)
        if e in EVENT_COUNTERS:
            out[f"{e}_min"], out[f"{e}_max"] = _int_extreme(np.minimum, v, k, starts), _int_extreme(np.maximum, v, k, starts)
            out[f"{e}_n"] = pa.array(total(k.astype(np.int64)))
            out[f"{e}_first_ts"] = pa.array(ts[np.where(has, first, 0)], mask=~has)
    for c, name in LIFETIME_MAXES.items():
        v = col(name).astype(np.int64)
        out[c] = _int_extreme(np.maximum, v, own & (v >= 0), starts)
    out["first_sample_ts"], out["last_sample_ts"] = _int_extreme(np.minimum, ts, own, starts), _int_extreme(np.maximum, ts, own, starts)
    temp, mem_temp, power, up = (col(c).astype(np.float64) for c in ("temp", "mem_temp", "power", "up"))
    tk = own & ~np.isnan(temp)
    out["temp_n"], out["temp_sum"] = pa.array(total(tk.astype(np.int64))), pa.array(total(np.where(tk, temp, 0.0)))
    for c, x in (("sample_temp_max_c", temp), ("mem_temp_max_c", mem_temp), ("power_max_w", power)):
        m = np.fmax.reduceat(np.where(own, x, np.nan), starts)
        out[c] = pa.array(m, mask=np.isnan(m))
    for c, hit in (("lost", own & (up == 0)), ("remap_failure", own & (col("remap_fail").astype(np.int64) > 0))):
        out[f"{c}_n"], out[f"{c}_ts"] = pa.array(total(hit.astype(np.int64))), _int_extreme(np.minimum, ts, hit, starts)
    reasons = col("reasons").astype(np.int64)
    rk = reasons >= 0
    out["reasons_known_s"], out["reasons_known_n"] = pa.array(total(np.where(rk, sec, 0.0))), pa.array(total((own & rk).astype(np.int64)))
    for r, bits in THROTTLE_REASONS.items():
        hit = rk & ((reasons & bits) != 0)
        out[f"{r}_s"], out[f"{r}_n"] = known_sum(np.where(hit, sec, 0.0), rk), known_sum(hit.astype(np.int64), own & rk)
    return out


def _run_marks(gk: np.ndarray, ts: np.ndarray, util: np.ndarray, procs: np.ndarray, i: np.ndarray, own: np.ndarray,
               grp: np.ndarray, starts: np.ndarray, p: FactParams) -> dict[str, pa.Array]:
    """RUN_MARKS of the stretches (arguments as _profiling_and_health's); gk, ts: every sample read, those before the
    range too (a sample's gap is to the one before it)."""
    gap = np.ones(len(ts), dtype=bool)
    gap[1:] = (gk[1:] != gk[:-1]) | (ts[1:] - ts[:-1] > p.gap_us)
    t = ts[i]
    last_gap = _extreme(np.maximum, t, own & gap[i], starts)
    out = {"last_gap_ts": _masked(last_gap, _LEAST)}
    u, n = util[i], procs[i]
    for (last_c, after_c, first_c, stretch_c), busy, idle in ((RUN_KINDS["idle"], u >= p.idle_threshold, u < p.idle_threshold),
                                                              (RUN_KINDS["noproc"], n > 0, n == 0)):
        last = _extreme(np.maximum, t, own & busy, starts)
        idle = own & idle
        after = _extreme(np.minimum, t, idle & (t > last[grp]), starts)
        out[last_c], out[first_c] = _masked(last, _LEAST), _int_extreme(np.minimum, t, idle, starts)
        out[after_c] = pa.array(after, mask=(after == _MOST) | (last == _LEAST))  # no busy sample: none after it
        out[stretch_c] = _int_extreme(np.minimum, t, idle & ((last_gap[grp] == _LEAST) | (t >= last_gap[grp])), starts)
    return out


_LEAST, _MOST = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _extreme(f: np.ufunc, v: np.ndarray, known: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per stretch (from `starts`), the least (f np.minimum) or largest (np.maximum) of v where
    known; none: the largest / least int64."""
    return f.reduceat(np.where(known, v, _MOST if f is np.minimum else _LEAST), starts)


def _masked(x: np.ndarray, none: int) -> pa.Array:
    return pa.array(x, mask=x == none)


def _int_extreme(f: np.ufunc, v: np.ndarray, known: np.ndarray, starts: np.ndarray) -> pa.Array:
    """_extreme, NULL where none is known."""
    return _masked(_extreme(f, v, known, starts), _MOST if f is np.minimum else _LEAST)


def _xid_codes(grp: np.ndarray, hit: np.ndarray, code: np.ndarray, ts: np.ndarray, n: int) -> pa.Array:
    """Per group (n of them): each XID code its `hit` rows show, with the first and last time and count (NULL: none)."""
    by: dict[int, dict[int, list[int]]] = {}
    for g, c, t in zip(grp[hit].tolist(), code[hit].tolist(), ts[hit].tolist()):
        e = by.setdefault(g, {}).setdefault(c, [t, t, 0])
        e[0], e[1], e[2] = min(e[0], t), max(e[1], t), e[2] + 1
    return _codes_array(by, n)


def _codes_array(by: dict[int, dict[int, list[int]]], n: int) -> pa.Array:
    return pa.array([[{"code": c, "first_ts": t0, "last_ts": t1, "n": k} for c, (t0, t1, k) in sorted(by[g].items())] if g in by else None
                     for g in range(n)], XID_CODES)


def _gpu_numbers(key: pa.Table) -> np.ndarray:
    """One number per GPU of rows ordered by GPU: a new one wherever the key changes."""
    n = key.num_rows
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for c in key.column_names:
            x = key[c].to_numpy(zero_copy_only=False)
            change[1:] |= x[1:] != x[:-1]
    return np.cumsum(change) - 1


def _edge_runs(grp: np.ndarray, p0: np.ndarray, p1: np.ndarray, hit: np.ndarray, s0: np.ndarray, s1: np.ndarray,
               min_us: int) -> dict[str, pa.Array]:
    """Per stretch (grp: its pieces [p0, p1) in order; [s0, s1) its extent), the `hit` runs as the idle_* columns have
    them (module doc; inner runs of at least min_us)."""
    n = len(hit)
    linked = np.zeros(n, dtype=bool)
    if n > 1:
        linked[1:] = (grp[1:] == grp[:-1]) & (p1[:-1] == p0[1:]) & hit[:-1]
    nxt = np.zeros(n, dtype=bool)
    if n > 1:
        nxt[:-1] = linked[1:] & hit[1:]
    i0, i1 = np.flatnonzero(hit & ~linked), np.flatnonzero(hit & ~nxt)
    head, tail, inner = _by_edge(grp[i0], p0[i0], p1[i1], s0, s1, min_us)
    return {"head_us": pa.array(head), "tail_us": pa.array(tail), "whole": pa.array(head == s1 - s0), "inner_us": pa.array(inner)}


def _with_holders(stretch: pa.Table, g: np.ndarray, hg: np.ndarray, ha0: np.ndarray, ha1: np.ndarray, hold: pa.Table) -> pa.Table:
    """Each stretch once per allocation holding all of it (they are cut at every edge), the first
    holder (by start) its lead; a stretch nobody holds once, unheld, as its lead."""
    s0, s1 = stretch["p0"].to_numpy(), stretch["p1"].to_numpy()
    rows_a, who_a = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(hg):
        order = np.lexsort((ha0, hg))
        hg_s, ha0_s, ha1_s = hg[order], ha0[order], ha1[order]
        lo = np.searchsorted(hg_s, g, side="left")
        n = np.searchsorted(hg_s, g, side="right") - lo
        # every (stretch, hold of its GPU) pair, stretches in order and each one's holds by start
        r = np.repeat(np.arange(len(g)), n)
        q = lo[r] + positions_within(n)
        meets = (ha0_s[q] < s1[r]) & (ha1_s[q] > s0[r])
        rows_a, who_a = r[meets], order[q[meets]]
    unheld_mask = np.ones(stretch.num_rows, dtype=bool)  # (a mask, not np.setdiff1d: its np.unique hashing costs)
    unheld_mask[rows_a] = False
    unheld = np.flatnonzero(unheld_mask)
    take = np.concatenate([rows_a, unheld])
    lead = np.ones(len(take), dtype=bool)
    if len(rows_a) > 1:
        lead[1:len(rows_a)] = rows_a[1:] != rows_a[:-1]
    out = stretch.take(pa.array(take))
    h = hold.take(pa.array(who_a)) if len(who_a) else None
    for c in _HOLDER:
        held = h[c].combine_chunks() if h is not None else pa.array([], pa.string())
        out = out.append_column(c, pa.concat_arrays([held.cast(pa.string()), pa.nulls(len(unheld), pa.string())]))
    out = out.append_column("lead", pa.array(lead))
    return ordered_parts(out)


def conform(t: pa.Table) -> pa.Table:
    """`t`'s SCHEMA columns in SCHEMA's order and types, casting only those of another type (Table.cast casts every
    column, and parts come in many small tables)."""
    t = t.select(SCHEMA.names)
    if t.schema.equals(SCHEMA):
        return t
    return pa.Table.from_arrays([c if c.type == f.type else c.cast(f.type) for c, f in zip(t.columns, SCHEMA)], schema=SCHEMA)


def ordered_parts(t: pa.Table) -> pa.Table:
    """SCHEMA's columns, rows by GPU, holder and start: the order join_parts and readers chain in."""
    t = conform(t)
    return t.sort_by([(c, "ascending") for c in (*_GPU, *_HOLDER)] + [("lead", "descending"), ("p0", "ascending")])


def join_parts(parts: pa.Table, grain_s: int, p: FactParams) -> pa.Table:
    """Parts of a finer grain as parts of `grain_s` buckets: back-to-back parts of one GPU, holder (lead or not) and MIG
    share in one coarser bucket joined into one row (the monoid: sums add, high-waters take the max, runs at the
    junctions chain, and a chain touching neither end that reaches idle_min joins the inner runs)."""
    if not parts.num_rows:
        return empty_table(SCHEMA)
    parts = ordered_parts(parts)
    n = parts.num_rows
    col = lambda c: parts[c].to_numpy(zero_copy_only=False)  # noqa: E731
    p0, p1 = col("p0"), col("p1")
    kb = p0 // (grain_s * 1_000_000)
    same = np.zeros(n, dtype=bool)
    same[1:] = (p1[:-1] == p0[1:]) & (kb[1:] == kb[:-1])
    for c in (*_GPU, *_HOLDER, "lead", "model", "mig_profile"):
        x = parts[c].to_pylist()
        same[1:] &= np.array([a == b for a, b in zip(x[1:], x[:-1])], dtype=bool)
    at = np.flatnonzero(~same)
    last = np.append(at[1:] - 1, n - 1)
    grp = np.cumsum(~same) - 1
    out = {c: parts[c].take(pa.array(at)) for c in ("cluster", "host", "gpu_uuid", "gi", "gpu", "model", "mig_profile",
                                                     "scheduler", "job_key", "lead")}
    out.update(grain_s=pa.array(np.full(len(at), grain_s, dtype=np.int32)),
               bucket=pa.array(kb[at] * grain_s * 1_000_000, pa.timestamp("us")), p0=pa.array(p0[at]), p1=pa.array(p1[last]))
    for c in _SUMS:
        out[c] = pa.array(np.add.reduceat(col(c), at))
    for c in _MAXES:
        x = np.fmax.reduceat(parts[c].to_numpy(zero_copy_only=False).astype(np.float64), at)
        out[c] = pa.array(x, mask=np.isnan(x))
    out["first_ts"], out["last_ts"] = pa.array(np.minimum.reduceat(col("first_ts"), at)), pa.array(np.maximum.reduceat(col("last_ts"), at))
    for c in _KNOWN_SUMS:
        known = parts[c].is_valid().to_numpy(zero_copy_only=False)
        out[c] = pa.array(np.add.reduceat(parts[c].fill_null(0).to_numpy(), at), mask=~np.logical_or.reduceat(known, at))
    rows = np.arange(n)
    for c in _INT_MINS + _INT_MAXES:
        f = np.minimum if c in _INT_MINS else np.maximum
        out[c] = _int_extreme(f, parts[c].fill_null(0).to_numpy(), parts[c].is_valid().to_numpy(zero_copy_only=False), at)
    for c in (f"{e}_{end}" for e in COUNTERS for end in ("first", "last")):  # the earliest / latest part's that has one
        known = parts[c].is_valid().to_numpy(zero_copy_only=False)
        pick = (np.minimum.reduceat(np.where(known, rows, n), at) if c.endswith("_first")
                else np.maximum.reduceat(np.where(known, rows, -1), at))
        has = (pick >= 0) & (pick < n)
        out[c] = pa.array(parts[c].fill_null(0).to_numpy()[np.where(has, pick, 0)], mask=~has)
    out["xid_codes"] = _joined_codes(grp, parts["xid_codes"], len(at))
    for c in ("last_gap_ts", *(cs[0] for cs in RUN_KINDS.values())):
        out[c] = _int_extreme(np.maximum, parts[c].fill_null(0).to_numpy(), parts[c].is_valid().to_numpy(zero_copy_only=False), at)
    for last_c, after_c, first_c, stretch_c in RUN_KINDS.values():
        out[first_c] = _int_extreme(np.minimum, parts[first_c].fill_null(0).to_numpy(), parts[first_c].is_valid().to_numpy(zero_copy_only=False), at)
        out[after_c] = _after_last(parts, grp, at, last_c, after_c, first_c, unmarked_none=True)
        out[stretch_c] = _after_last(parts, grp, at, "last_gap_ts", stretch_c, first_c, unmarked_none=False)
    for kind in ("idle", "nop"):
        head, tail, inner = chain_runs(grp, p0, p1, col(f"{kind}_head_us"), col(f"{kind}_tail_us"), p.idle_min_us)
        g0, g1 = p0[at], p1[last]
        out[f"{kind}_head_us"], out[f"{kind}_tail_us"] = pa.array(head), pa.array(tail)
        out[f"{kind}_whole"] = pa.array(head == g1 - g0)
        out[f"{kind}_inner_us"] = pa.array(np.add.reduceat(col(f"{kind}_inner_us"), at) + inner)
    return ordered_parts(pa.table(out))


def _after_last(parts: pa.Table, grp: np.ndarray, at: np.ndarray, mark: str, val: str, first: str, unmarked_none: bool) -> pa.Array:
    """A run mark of joined parts (grp, from `at`; in time order): the `val` of the last part
    with a `mark`, else (none in it) the least `first` of the parts after it; no part with a
    mark: NULL (`unmarked_none`) or the least `first` of them all (the runs' monoid)."""
    n = parts.num_rows
    rows = np.arange(n)
    pick = np.maximum.reduceat(np.where(parts[mark].is_valid().to_numpy(zero_copy_only=False), rows, -1), at)
    f, fk = parts[first].fill_null(0).to_numpy(), parts[first].is_valid().to_numpy(zero_copy_only=False)
    later = np.minimum.reduceat(np.where(fk & (rows > pick[grp]), f, _MOST), at)
    v, vk = parts[val].fill_null(0).to_numpy(), parts[val].is_valid().to_numpy(zero_copy_only=False)
    has = pick >= 0
    at_pick = np.where(has, pick, 0)
    x = np.where(has & vk[at_pick], v[at_pick], later)
    return pa.array(x, mask=(x == _MOST) | (~has if unmarked_none else False))


def _joined_codes(grp: np.ndarray, codes: pa.ChunkedArray, n: int) -> pa.Array:
    """xid_codes of parts joined into n groups (grp): per code the earliest first time, latest last time, counts added."""
    by: dict[int, dict[int, list[int]]] = {}
    for r in np.flatnonzero(codes.is_valid().to_numpy(zero_copy_only=False)).tolist():
        for x in codes[r].as_py():
            e = by.setdefault(int(grp[r]), {}).setdefault(x["code"], [x["first_ts"], x["last_ts"], 0])
            e[0], e[1], e[2] = min(e[0], x["first_ts"]), max(e[1], x["last_ts"]), e[2] + x["n"]
    return _codes_array(by, n)


def chain_runs(grp: np.ndarray, p0: np.ndarray, p1: np.ndarray, head: np.ndarray, tail: np.ndarray,
               min_us: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edge runs of back-to-back parts (grp: the joined part each belongs to, in order) chained, as _by_edge gives
    them per joined part. A part's edge pieces: head [p0, p0 + head), tail [p1 - tail, p1) (one piece if it is whole)."""
    whole = head == p1 - p0
    hi_, ti = np.flatnonzero(head > 0), np.flatnonzero((tail > 0) & ~whole)
    g = np.concatenate([grp[hi_], grp[ti]])
    a0 = np.concatenate([p0[hi_], p1[ti] - tail[ti]])
    a1 = np.concatenate([p0[hi_] + head[hi_], p1[ti]])
    o = np.lexsort((a0, g))
    g, a0, a1 = g[o], a0[o], a1[o]
    linked = np.zeros(len(a0), dtype=bool)
    linked[1:] = (g[1:] == g[:-1]) & (a1[:-1] == a0[1:])
    c0 = np.flatnonzero(~linked)
    c1 = np.append(c0[1:] - 1, len(a0) - 1) if len(c0) else c0
    ng = int(grp.max()) + 1 if len(grp) else 0
    first_at = np.full(ng, np.iinfo(np.int64).max)
    np.minimum.at(first_at, grp, p0)
    last_at = np.full(ng, np.iinfo(np.int64).min)
    np.maximum.at(last_at, grp, p1)
    return _by_edge(g[c0], a0[c0], a1[c1], first_at, last_at, min_us)


def _by_edge(rg: np.ndarray, r0: np.ndarray, r1: np.ndarray, s0: np.ndarray, s1: np.ndarray,
             min_us: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs [r0, r1) of groups rg spanning [s0, s1) each: per group, the run touching its start,
    the one touching its end (their lengths) and the total of those touching neither that reach min_us."""
    ng = len(s0)
    head, tail, inner = np.zeros(ng, np.int64), np.zeros(ng, np.int64), np.zeros(ng, np.int64)
    at_start, at_end = r0 == s0[rg], r1 == s1[rg]
    head[rg[at_start]] = (r1 - r0)[at_start]
    tail[rg[at_end]] = (r1 - r0)[at_end]
    keep = ~at_start & ~at_end & ((r1 - r0) >= min_us)
    np.add.at(inner, rg[keep], (r1 - r0)[keep])
    return head, tail, inner


# --- the store's facts files (written by gpufleet.collector.maintenance.build_facts) ---

FILE_SCHEMA = SCHEMA.append(pa.field("tag", pa.string()))  # a file's rows with the parameters' tag
FACTS_DIR = "facts"

