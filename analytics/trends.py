"""Each headline figure against the previous window of the same length.

Every surface takes no_comparison_reason from here, so an empty or partial previous window says
"no data" everywhere, never a delta.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.core import Analysis, Totals
from gpufleet.analytics.params import Params

HEADLINES = (
    ("allocated_gpu_h", "GPU-hours allocated"),
    ("busy_gpu_h", "GPU-hours busy"),
    ("utilization_pct", "utilization %"),
    ("idle_allocated_gpu_h", "idle allocated GPU-hours"),
    ("idle_allocated_cost", "cost of idle allocated time $"),
    ("no_process_gpu_h", "GPU-hours held with no process"),
    ("stranded_gpu_h", "stranded (unallocated) GPU-hours"),
    ("stranded_cost", "cost of stranded capacity $"),
    ("no_data_gpu_h", "GPU-hours with no data"),
)

# each money figure beside the GPU-hours it prices: when the two move apart, the change says why
PRICED = {"idle_allocated_cost": "idle_allocated_gpu_h", "stranded_cost": "stranded_gpu_h"}

# each figure summed over the jobs whose GPU count is known, beside how many jobs are not (core.Totals)
PARTIAL = {"allocated_gpu_h": "allocated_unknown_jobs"}

NO_DATA = "no data"  # what every output shows instead of a change against an empty or partial window
# a side is unknown or a lower bound (some job's GPU count unknown: a difference of lower bounds bounds nothing)
UNKNOWN = "unknown"
ZERO_BASE = "zero base"  # the previous value is 0: a percent change against nothing is not a number
ZERO = 1e-6  # |previous| below this (GPU-hours, $, %) is float dust: a zero base


def no_comparison_reason(previous: Totals, previous_start: datetime, history_start: datetime | None) -> str | None:
    """Why the previous window cannot be compared against, or None when it can (naive UTC times).

    - empty: no GPU samples (data_gpu_h == 0); allocated hours alone do not say the collector watched.
    - partial: the store's first GPU sighting (within the cluster/model filters) is after the previous
      window's start, so its figures undercount. Gaps inside the history are no_data_gpu_h, not "partial".
    """
    if previous.data_gpu_h <= 0:
        return "empty: no GPU samples in the previous window"
    if history_start is None or history_start > previous_start:
        since = "has no GPU sightings" if history_start is None else f"starts {history_start:%Y-%m-%d %H:%M} UTC"
        return f"partial: the store's history {since}, inside the previous window from {previous_start:%Y-%m-%d %H:%M} UTC"
    return None


def _sign(x: float) -> int:
    return 0 if abs(x) < ZERO else (1 if x > 0 else -1)


def price_mix_reason(cost: tuple[float, float], gpu_h: tuple[float, float]) -> str | None:
    """Why a cost moved against its GPU-hours ((current, previous) of each): the mean price per GPU-hour
    moved. None when they moved the same way."""
    dc, dh = cost[0] - cost[1], gpu_h[0] - gpu_h[1]
    if _sign(dc) == 0 or _sign(dc) == _sign(dh):
        return None
    rate = [f"${c / h:,.2f}" if h >= ZERO else "none" for c, h in zip(cost, gpu_h)]
    hours = "did not change" if _sign(dh) == 0 else f"went {'up' if dh > 0 else 'down'} {abs(dh):,.2f}"
    return (f"the GPU-hours {hours} while the cost went {'up' if dc > 0 else 'down'} ${abs(dc):,.2f}: the time moved to "
            f"{'dearer' if dc > 0 else 'cheaper'} GPU models (mean price per GPU-hour {rate[1]} before, {rate[0]} now)")


def unknown_jobs_reason(current: int, previous: int) -> str:
    """Why allocated is unknown or a lower bound: jobs of unknown GPU count in either window."""
    said = [f"{words.quantity(n, 'job')} of {w} window" for n, w in ((current, "this"), (previous, "the previous")) if n]
    return (f"{' and '.join(said)} {words.have(current + previous)} an unknown GPU count: allocated sums the jobs "
            "whose count is known (at least that much; unknown where none is), so the change is unknown")


def compare(current: Totals, previous: Totals, no_comparison: str | None = None) -> pl.DataFrame:
    """figure, label, current, previous, change, change_pct, why either is null (change_missing: NO_DATA
    when `no_comparison` is set, else UNKNOWN; change_pct_missing: ZERO_BASE; current_missing /
    previous_missing: "not attributable" under a job filter), the PARTIAL figures' unknown jobs, and
    `reason` (price_mix_reason or unknown_jobs_reason)."""
    cur, prev = asdict(current), asdict(previous)
    rows = []
    for key, label in HEADLINES:
        c, p = cur[key], prev[key]
        unknown_jobs = (cur.get(PARTIAL[key], 0), prev.get(PARTIAL[key], 0)) if key in PARTIAL else (0, 0)
        change = pct = change_missing = None
        if no_comparison is not None:
            change_missing = NO_DATA
        elif c is None or p is None or any(unknown_jobs):
            change_missing = UNKNOWN
        else:
            change = c - p
            pct = change / p * 100 if abs(p) >= ZERO else None
        pct_missing = change_missing or (ZERO_BASE if pct is None else None)
        hours = PRICED.get(key)
        reason = None
        if change is not None and hours and cur[hours] is not None and prev[hours] is not None:
            reason = price_mix_reason((c, p), (cur[hours], prev[hours]))
        if any(unknown_jobs):
            reason = unknown_jobs_reason(*unknown_jobs)
        rows.append({"figure": key, "label": label, "current": c, "previous": p, "change": change, "change_pct": pct,
                     "change_missing": change_missing, "change_pct_missing": pct_missing, "reason": reason,
                     "current_unknown_jobs": unknown_jobs[0], "previous_unknown_jobs": unknown_jobs[1],
                     "current_missing": words.NOT_ATTRIBUTABLE if c is None and current.not_attributable_reason else None,
                     "previous_missing": words.NOT_ATTRIBUTABLE if p is None and previous.not_attributable_reason else None})
    return pl.DataFrame(rows, schema={"figure": pl.Utf8, "label": pl.Utf8, "current": pl.Float64, "previous": pl.Float64, "change": pl.Float64, "change_pct": pl.Float64,
                                      "change_missing": pl.Utf8, "change_pct_missing": pl.Utf8, "reason": pl.Utf8,
                                      "current_unknown_jobs": pl.Int64, "previous_unknown_jobs": pl.Int64, "current_missing": pl.Utf8,
                                      "previous_missing": pl.Utf8})


@dataclass(frozen=True)
class Baseline:
    """The previous window as the base of a comparison: its totals, and why it is no base (None: it is one)."""

    start: datetime
    end: datetime
    totals: Totals
    history_start: datetime | None
    no_comparison: str | None

    def compare(self, current: Totals) -> pl.DataFrame:
        return compare(current, self.totals, self.no_comparison)


def people_rows(cmp) -> list[dict[str, str]]:
    """compare's rows (a frame or dicts) as the pages and the CLI show them: each figure in its unit, and
    why where a figure or change is missing (never a 0 beside "no data")."""
    out = []
    for r in (cmp.iter_rows(named=True) if isinstance(cmp, pl.DataFrame) else cmp):
        k, why = r["figure"], r["change_missing"]
        if k in PARTIAL:  # "at least" where jobs are left out
            now, before = words.known_gpu_h(r["current"], r["current_unknown_jobs"]), words.known_gpu_h(r["previous"], r["previous_unknown_jobs"])
        else:  # (under a job filter capacity and stranded time are not attributable: said so, not "unknown")
            now = r.get("current_missing") or words.figure(k, r["current"])
            before = r.get("previous_missing") or words.figure(k, r["previous"])
        out.append({"figure": r["label"], "this window": now, "previous window": why if why == NO_DATA else before,
                    "change": why or words.signed(k, r["change"]),
                    "change %": r["change_pct_missing"] or f"{words.signed('_pct', r['change_pct'])[:-3]} %"})
    return out


def history_start(con: duckdb.DuckDBPyConnection, params: Params) -> datetime | None:
    """The store's first GPU sighting within the window's cluster and model filters (None: none)."""
    f = params.filters
    return con.cursor().execute(sql.HISTORY_START, {"cluster": f.cluster, "model": f.model}).fetchone()[0]


def baseline(con: duckdb.DuckDBPyConnection, params: Params, previous: Params, totals: Totals) -> Baseline:
    """The Baseline for `previous` (the window before `params`), given its already computed totals."""
    first = history_start(con, params)
    return Baseline(previous.start, previous.end, totals, first, no_comparison_reason(totals, previous.start, first))


def previous_totals(con: duckdb.DuckDBPyConnection, params: Params, now=None) -> Totals:
    """The totals of the window of the same length before `params`: its analysis'."""
    return Analysis(con, params.previous(), now=now).totals()


def previous_baseline(con: duckdb.DuckDBPyConnection, params: Params, now=None) -> Baseline:
    """The window of the same length just before `params`, with the verdict of no_comparison_reason()."""
    return baseline(con, params, params.previous(), previous_totals(con, params, now=now))
