"""Facts carry MFU's and health's inputs (collector/facts.py's profiling, clock, XID, ECC and
throttle columns), and their figures over a window equal the current paths' over the same window.

On test_facts' random fleets (MIG slices, gaps, samples over several files, allocations starting
and ending mid-bucket), with samples that also report SM and DRAM activity, SM occupancy, PCIe and NVLink RX/TX bytes/s, XID codes, the
volatile ECC counters and clock-event reasons (each with gaps, some GPUs none of them), a store
whose upkeep wrote facts at a random time gives, for windows on and off the grid:
- per GPU, gpufleet.analytics.health.gpu_health's samples, XID codes, first XID, new ECC errors
  and shares of samples throttled per reason, from its raw path and from the facts (its own
  query over the same parts: tests/test_health_from_facts.py holds all its figures to the raw);
- per job, analytics.mfu.job_mfu's figures, methods and reasons (its tensor sums from the facts'
  parts) as the raw path gives them;
- per GPU, the seconds throttled per reason and the profiling fields' known seconds and mean
  activity, as a row-by-row SQL oracle over the raw samples (contract 4's interval rule) has them.
Joining parts with these columns in any grouping gives the same parts; unknown stays NULL.
"""

from __future__ import annotations

import random
from datetime import datetime

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_analytics_properties import MAX_GAP, TOL, at, fleets, scratch
from tests.support.random_stores import detail_fields, split
from test_facts import FACT_SETTINGS, five_minute_parts, params, rows, upkeep_params, windows

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.facts import FactWindow
from gpufleet.analytics.health import gpu_health
from gpufleet.analytics.mfu import job_mfu
from gpufleet.analytics.params import Filters
from gpufleet.collector import facts as cf
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.raw_analysis import RawAnalysis
from tests.support.raw_health import raw_health

GPU = ("cluster", "host", "gpu_uuid", "gi")
CODES = [13, 31, 43, 48, 79, 94]
REASONS = [0, 0, 0, 0x1, 0x04, 0x08, 0x20, 0x40, 0x80, 0x24, 0x48]


def health_fields(seed: int):
    """detail_fields plus SM and DRAM activity, SM occupancy, PCIe and NVLink RX/TX bytes/s, XID
    codes, volatile ECC counters and clock-event reasons, each missing on some samples; one GPU in
    three (by seed) reports none of them (the NVLink fields: only one in three reports them)."""
    def fields(g, t) -> dict:
        d = detail_fields(g, t)
        kind = (seed + g["gpu"]) % 3
        if kind == 0:
            return d
        r = random.Random(f"{seed}/{g['gpu']}/{t}")
        d.update(sm_active=None if r.random() < 0.2 else r.random(), dram_active=r.random() if kind == 2 else None,
                 xid_last=None if r.random() < 0.1 else r.choice(CODES) if r.random() < 0.05 else 0,
                 ecc_sbe_vol=None if r.random() < 0.1 else t // 97 + seed % 5, ecc_dbe_vol=t // 1000 if kind == 2 else None,
                 clocks_event_reasons=None if r.random() < 0.15 else r.choice(REASONS),
                 sm_occupancy=None if r.random() < 0.2 else r.random(),
                 pcie_rx_bytes_per_s=None if r.random() < 0.1 else r.random() * 2e10, pcie_tx_bytes_per_s=r.random() * 1e9,
                 **({f"nvlink_{d}_bytes_per_s": None if r.random() < 0.1 else r.random() * 3e11 for d in ("rx", "tx")} if kind == 2 else {}))
        return d
    return fields


def store(root, fleet, seed: int, upkeep_at: int | None) -> None:
    w = StoreWriter(root)
    for batch in split(fleet, 2, True, fields=health_fields(seed)):
        w.commit(batch)
    if upkeep_at is not None:
        compact(w, at(upkeep_at), upkeep_params(fleet), facts_hours=None)
    w.publish()
    w.close()


# The raw oracle of the time-weighted columns: each sample holds until its GPU's next one, at most
# max_gap (contract 4), clipped to the window; per GPU its seconds with each reason's bits set and
# with reasons known, and each profiling field's known seconds and mean activity over them
RAW_TIME_WEIGHTED = f"""
WITH s AS (
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, clocks_event_reasons AS reasons,
           {", ".join(cf.PROFILING)},
           greatest(0, epoch(least(least(lead(ts) OVER w, ts + to_microseconds($gap_us)), $end)) - epoch(greatest(ts, $start))) AS sec
    FROM gpu_samples
    WHERE ts >= $start - to_microseconds($gap_us) AND ts < $end
    WINDOW w AS (PARTITION BY cluster, host, gpu_uuid, coalesce(gpu_instance, -1) ORDER BY ts)
)
SELECT cluster, host, gpu_uuid, gi, sum(CASE WHEN reasons IS NOT NULL THEN sec ELSE 0 END) AS reasons_known_s,
       {", ".join(f"sum(CASE WHEN (reasons & {bits}) <> 0 THEN sec ELSE 0 END) FILTER (WHERE reasons IS NOT NULL AND sec > 0) AS {r}_s"
                  for r, bits in cf.THROTTLE_REASONS.items())},
       {", ".join(f"sum(CASE WHEN {f} IS NOT NULL THEN sec ELSE 0 END) AS {f}_known_s, "
                  f"sum({f} * sec) FILTER (WHERE sec > 0) / nullif(sum(CASE WHEN {f} IS NOT NULL THEN sec ELSE 0 END), 0) AS {f}_mean"
                  for f in cf.PROFILING)}
FROM s GROUP BY ALL
"""


def by_gpu(df, cols) -> dict:
    return {tuple(r[c] for c in GPU): {c: r[c] for c in cols} for r in df.iter_rows(named=True)}


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (datetime, list)):
        return a == b
    return b == pytest.approx(a, **TOL)


def compare(want: dict, got: dict, what: str) -> list[str]:
    bad = []
    for k in set(want) | set(got):
        w, g = want.get(k), got.get(k)
        if w is None or g is None:
            bad.append(f"{what} {k}: only in {'facts' if w is None else 'the current path'}")
            continue
        bad += [f"{what} {k} {c}: current {w[c]} facts {g[c]}" for c in w if not close(w[c], g[c])]
    return bad


HEALTH_COLS = ("samples", "xids", "first_xid", "ecc_sbe_new", "ecc_dbe_new", "thermal_throttle_pct", "power_throttle_pct", "hw_slowdown_pct")


def health_mismatches(con, p, fw: FactWindow) -> list[str]:
    facts = by_gpu(fw.health().filter(fw.health()["samples"] > 0), HEALTH_COLS)
    bad = []
    for name, rows_ in (("raw", raw_health(con, p, ("gpus",))["gpus"]), ("facts", gpu_health(con, p))):
        bad += compare(by_gpu(rows_, HEALTH_COLS), facts, f"health ({name})")
    cols = ("reasons_known_s", *(f"{r}_s" for r in cf.THROTTLE_REASONS), *(c for f in cf.PROFILING for c in (f"{f}_known_s", f"{f}_mean")))
    raw = con.sql(RAW_TIME_WEIGHTED, params={"start": p.start, "end": p.end, "gap_us": round(MAX_GAP * 1e6)}).pl()
    want = by_gpu(raw, cols)
    got = by_gpu(fw.health(), cols)
    for k in set(want) - set(got):  # a GPU without a piece inside the window (its samples' time all outside it)
        assert all(v in (0.0, None) for v in want.pop(k).values()), k
    for k in set(got) - set(want):
        assert all(v in (0.0, None) for v in got.pop(k).values()), k
    return bad + compare(want, got, "time-weighted")


JOB = ("cluster", "scheduler", "job_key")
MFU_NUMBERS = ("gpus", "gpu_h", "mfu", "peak_tflops", "tflops_per_gpu")
MFU_TEXT = ("job_id", "account", "user_name", "model", "method", "reason")


def mfu_mismatches(con, p, now) -> list[str]:
    """Per job, analytics.mfu.job_mfu of the analysis from facts (its tensor sums added up in
    sql.MFU_JOBS from Analysis.detail_numbers) against the raw oracle's: the same jobs, methods,
    reasons and figures."""
    want, got = job_mfu(RawAnalysis(con, p, now=now, detail=True)), job_mfu(Analysis(con, p, now=now))
    key = lambda df: {tuple(r[c] for c in JOB): {c: r[c] for c in MFU_NUMBERS + MFU_TEXT} for r in df.iter_rows(named=True)}  # noqa: E731
    w, g = key(want), key(got)
    bad = [f"job {k}: raw {w.get(k)} facts {g.get(k)}" for k in set(w) ^ set(g)]
    for k in set(w) & set(g):
        bad += [f"job {k} {c}: raw {w[k][c]} facts {g[k][c]}" for c in MFU_TEXT if w[k][c] != g[k][c]]
        bad += [f"job {k} {c}: raw {w[k][c]} facts {g[k][c]}" for c in MFU_NUMBERS
                if (w[k][c] is None) != (g[k][c] is None) or (w[k][c] is not None and g[k][c] != pytest.approx(w[k][c], **TOL))]
    return bad


@settings(FACT_SETTINGS, max_examples=12)
@given(fleets(), st.integers(0, 2**16), st.data())
def test_facts_give_the_health_and_mfu_paths_figures(fleet, seed, data):
    upkeep_at = data.draw(st.sampled_from([None, 2 * 86400]) | st.integers(3600, 4 * 3600), label="upkeep_at")
    now = at(max(fleet["now"], (upkeep_at or 0) + 1))
    with scratch() as tmp:
        store(tmp, fleet, seed, upkeep_at)
        con = open_reader(tmp)
        for lo, hi in windows(fleet, data):
            for f in (Filters(), Filters(account="alpha")) if (lo, hi) == tuple(fleet["cuts"][::2]) else (Filters(),):
                p = params(fleet, lo, hi, filters=f)
                fw = FactWindow(con, p, now=now)
                bad = mfu_mismatches(con, p, now)
                if f == Filters():
                    bad += health_mismatches(con, p, fw)
                fw.close()
                assert not bad, (lo, hi, f, fw.tiles, "\n".join(bad))
        con.close()


@FACT_SETTINGS
@given(fleets(), st.integers(0, 2**16), st.sampled_from([600, 900, 1800]))
def test_joining_parts_with_health_columns_in_any_grouping_gives_the_same_parts(fleet, seed, mid):
    with scratch() as tmp:
        store(tmp, fleet, seed, 2 * 86400)
        fine = five_minute_parts(tmp)
        fp = cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=fleet["idle_min"])
        hour = cf.join_parts(fine, cf.GRAIN_1H, fp)
        assert rows(cf.join_parts(cf.join_parts(fine, mid, fp), cf.GRAIN_1H, fp)) == rows(hour)
        assert rows(cf.join_parts(fine, cf.GRAIN_1D, fp)) == rows(cf.join_parts(hour, cf.GRAIN_1D, fp))


def test_unknown_stays_null_and_known_zero_stays_zero(tmp_path):
    """A GPU that reports none of the fields: its parts' sums over them are NULL (its known seconds
    0); one that reports them with nothing to count: 0 XIDs, no throttling, ECC unchanged."""
    def fields(g, t):
        return {} if g["gpu"] == 0 else {"xid_last": 0, "ecc_sbe_vol": 7, "ecc_dbe_vol": 0, "clocks_event_reasons": 0,
                                         "tensor_active": 0.0, "sm_clock_mhz": 1000.0}
    fleet = {"gpus": [{"gpu": g, "host": "h0", "uuid": f"GPU-prop-{g}", "samples": [(t, 30.0, 1.0) for t in range(0, 3600, 15)]}
                      for g in range(2)], "jobs": [], "cuts": [0, 1800, 3600], "now": 2 * 86400, "idle_min": 300}
    w = StoreWriter(tmp_path)
    for b in split(fleet, 1, False, fields=fields):
        w.commit(b)
    compact(w, at(2 * 86400), upkeep_params(fleet), facts_hours=None)
    w.publish()
    w.close()
    parts = pa.Table.to_pylist(five_minute_parts(tmp_path))
    assert {r["gpu_uuid"] for r in parts} == {"GPU-prop-0", "GPU-prop-1"}
    for r in parts:
        if r["gpu_uuid"] == "GPU-prop-0":
            assert r["tensor_active_known_s"] == 0 and r["clocked_s"] == 0 and r["reasons_known_n"] == 0
            assert all(r[c] is None for c in ("tensor_active_s", "tensor_clock_s", "xid_n", "xid_codes", "ecc_sbe_first", "ecc_dbe_last",
                                              "thermal_throttle_s", "power_throttle_n"))
        elif r["samples_n"]:  # (not the next hour's part of the last sample's interval: no sample of its own to count)
            assert r["tensor_active_s"] == 0 and r["xid_n"] == 0 and r["xid_codes"] is None and r["thermal_throttle_s"] == 0
            assert r["ecc_sbe_first"] == r["ecc_sbe_last"] == 7 and r["reasons_known_n"] == r["samples_n"] == 20
        else:
            assert r["xid_n"] is None and r["ecc_sbe_first"] is None and r["thermal_throttle_s"] == 0
    con = open_reader(tmp_path)
    fw = FactWindow(con, params(fleet, 0, 3600), now=at(fleet["now"]))
    h = {r["gpu_uuid"]: r for r in fw.health().iter_rows(named=True)}
    assert fw.tiles and fw.raw_us == 0
    assert h["GPU-prop-0"]["xid_samples"] is None and h["GPU-prop-0"]["ecc_sbe_new"] is None and h["GPU-prop-0"]["thermal_throttle_pct"] is None
    assert h["GPU-prop-1"]["xid_samples"] == 0 and h["GPU-prop-1"]["ecc_sbe_new"] == 0 and h["GPU-prop-1"]["thermal_throttle_pct"] == 0
    assert h["GPU-prop-1"]["samples"] == 240 and h["GPU-prop-1"]["tensor_active_mean"] == 0.0
