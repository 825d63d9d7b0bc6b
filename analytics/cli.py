"""`gpufleet analyze`: the window's figures as a table for people or stable JSON for programs.

JSON schema "gpufleet.analyze/v1" is documented in README.md. Times are ISO 8601 UTC; GPU-hours are
hours x GPUs (a MIG instance counts as its share); money is US dollars, null where a model has no
price. Keys follow analytics.vocabulary; fairness.per_account's used_gpu_h and used_share are
deprecated aliases of allocated_gpu_h and allocated_share, kept for one release.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from datetime import date, datetime, timedelta
from typing import Any, TextIO

import polars as pl

from gpufleet.analytics import vocabulary as words
from gpufleet.config import ConfigError, command_error, load_config
from gpufleet.times import add_window_arguments, window_from_arguments

SCHEMA = "gpufleet.analyze/v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([analytics] and [collector] sections)")
    p.add_argument("--store", help="store directory (default: [analytics] store, else [collector] store)")
    add_window_arguments(p, week_zone="UTC")
    p.add_argument("--by", default="account", help=f"utilization by: {', '.join(BY_CHOICES)} (also user_name for user, team for account)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="a table for people, or JSON (a stable schema) for scripts")
    p.add_argument("--top", type=int, default=10, help="how many jobs each list shows: the most wasteful, those that waited while they would have fit, "
                   "those still pending")
    p.add_argument("--job", help="also print the efficiency report of this job id")
    p.add_argument("--reliability", action="store_true",
                   help="reliability instead: how attempts ended, interruptions, MTTF by job size, lemon nodes "
                        "(JSON schema gpufleet.reliability/v1)")
    for name in ("cluster", "account", "user", "model", "partition"):
        aliases = ("--team",) if name == "account" else ()  # the report's word for it
        p.add_argument(f"--{name}", *aliases, dest=name, help=f"only this {name}" + (" (or --team)" if aliases else ""))


# --by: the filters' word for a dimension -> its analytics name
BY_ALIASES = {"user": "user_name", "team": "account"}
BY_CHOICES = ("gpu", "host", "model", "cluster", "partition", "account", "user", "job", "fleet")


def dimension(by: str) -> str:
    """--by's value as the analytics name it (BY_ALIASES); a ConfigError naming the choices."""
    from gpufleet.analytics.params import DIMENSIONS

    name = BY_ALIASES.get(by, by)
    if name not in DIMENSIONS:
        raise ConfigError(f"--by {by!r}: expected one of {', '.join(BY_CHOICES)}")
    return name


def _plain(v: Any) -> Any:
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as JSON-ready dicts by _plain's rule, converting only the columns whose type needs it."""
    floats = [c for c, t in df.schema.items() if t.is_float()]
    dates = [c for c, t in df.schema.items() if isinstance(t, pl.Datetime) or t == pl.Date]
    out = df.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats).to_dicts()
    if dates:
        for r in out:
            for c in dates:
                if r[c] is not None:
                    r[c] = r[c].isoformat()
    return out


def _plain_share(gpu: dict[str, Any]) -> dict[str, Any]:
    """A shared GPU of analytics.jobs.gpu_shares as JSON: times ISO, the other jobs' too."""
    return {k: [{x: _plain(y) for x, y in o.items()} for o in v] if k == "others" else _plain(v) for k, v in gpu.items()}


def utilization_rows(a, by: str) -> pl.DataFrame:
    """Utilization by `by`; by a job dimension with idle allocated and no-process GPU-hours and cost (0 without
    stretches), by account with the MFU too: every figure of the report's team table."""
    from gpufleet.analytics.core import JOB_DIMS

    out = a.utilization(by)
    if by not in JOB_DIMS or out.is_empty():
        return out
    keys = list(JOB_DIMS[by])
    for kind, name in (("idle", "idle_allocated"), ("no_process", "no_process")):
        w = a.waste_by(by, kind).select(*keys, pl.col("gpu_h").alias(f"{name}_gpu_h"), pl.col("cost").alias(f"{name}_cost"))
        out = out.join(w, on=keys, how="left", nulls_equal=True).with_columns(
            pl.when(pl.col(f"{name}_gpu_h").is_null()).then(0.0).otherwise(pl.col(f"{name}_cost")).alias(f"{name}_cost"),
            pl.col(f"{name}_gpu_h").fill_null(0.0))
    if by == "account":
        from gpufleet.analytics.mfu import account_mfu

        m = account_mfu(a).select("cluster", "account", (pl.col("mfu") * 100).alias("mfu_pct"), pl.col("method").alias("mfu_method"),
                                  pl.col("unknown_gpu_h").alias("mfu_unknown_gpu_h"))
        out = out.join(m, on=["cluster", "account"], how="left", nulls_equal=True)
    return out


def with_states(a, by: str, out: list[dict[str, Any]], t: Any) -> list[dict[str, Any]]:
    """By account, each row with where its GPU time went (window_states; None: unknown); other dimensions as they are."""
    if by != "account":
        return out
    from gpufleet.analytics.window_states import window_states

    teams = {(r["cluster"], r["account"]): r for r in window_states(a, t).team_rows()}
    for r in out:
        team = teams.get((r.get("cluster"), r.get("account")))
        r["states"] = None if team is None else [{k: _plain(v) for k, v in s.items()} for s in team["states"]]
    return out


def build_report(con, params, by: str, top: int, job: str | None, now: datetime | None = None,
                 shares: dict[str, float] | None = None, half_life: timedelta = timedelta(days=7),
                 state_thresholds: Any = None) -> dict[str, Any]:
    from gpufleet.analytics.trends import previous_baseline

    # the previous window's totals, then the queue gaps (neither reads the window's analysis), in a worker thread
    # beside the analysis, each on a cursor of its own: DuckDB runs a statement while Python runs
    previous_cur, gaps_cur = con.cursor(), con.cursor()
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="analyze-read") as pool:
            previous = pool.submit(previous_baseline, previous_cur, params, now=now)
            gaps = pool.submit(queue_gap_report, gaps_cur, params, now, top)
            return _report(con, params, by, top, job, now, shares, half_life, state_thresholds, previous, gaps)
    finally:
        previous_cur.close()
        gaps_cur.close()


def _report(con, params, by: str, top: int, job: str | None, now: datetime | None, shares: dict[str, float] | None,
            half_life: timedelta, state_thresholds: Any, previous: Future, gaps: Future) -> dict[str, Any]:
    from gpufleet.analytics.core import Analysis, totals_warnings, unknown_filter_values, unknown_gpu_jobs
    from gpufleet.analytics.fairness import SHARES_SOURCES, fairness
    from gpufleet.analytics.jobs import job_report
    from gpufleet.analytics.states import Thresholds

    a = Analysis(con, params, now=now)
    totals = a.totals()
    base = previous.result()
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "window": {"from": params.start.isoformat(), "to": params.end.isoformat(), "hours": params.seconds / 3600},
        "parameters": {
            "max_gap_s": params.max_gap.total_seconds(), "idle_threshold_pct": params.idle_threshold,
            "idle_min_duration_s": params.idle_min_duration.total_seconds(), "prices_usd_per_gpu_hour": a.prices,
            "gpu_retire_after_s": params.retire_after.total_seconds(),
        },
        "filters": {k: v for k, v in asdict(params.filters).items() if v is not None},
        "warnings": (unknown_filter_values(con, params.filters) + a.empty_warnings(totals) + a.edge_warnings() + unknown_gpu_jobs(a)
                     + totals_warnings(totals)),
        "totals": {k: _plain(v) for k, v in asdict(totals).items()},
        "trend": rows(base.compare(totals)),
        "previous_window": {"from": base.start.isoformat(), "to": base.end.isoformat(), "comparable": base.no_comparison is None,
                            "no_comparison": base.no_comparison},
        "utilization": {"by": by, "rows": with_states(a, by, rows(utilization_rows(a, by)), state_thresholds or Thresholds.of(params, {}))},
        "top_wasteful_jobs": rows(a.top_wasteful_jobs(top).drop(["scheduler"], strict=False)),
    }
    fair = fairness(a, shares, half_life)
    report["fairness"] = {
        "shares": fair.shares_source, "shares_description": SHARES_SOURCES[fair.shares_source],
        "half_life_days": half_life.total_seconds() / 86400, "jain_index": fair.jain_index, "gini_users": fair.gini_users,
        "per_account": [words.with_new_keys(r) for r in rows(fair.per_account)],  # used_* deprecated, kept one release
        "wait_by_size": rows(fair.wait_by_size),
        # the `top` longest waits and how many wait (not all: the answer would grow with the queue)
        "pending": rows(fair.pending.head(max(top, 0))), "pending_jobs": fair.pending.height,
        "without_share": list(fair.without_share), "unknown_demand": list(fair.unknown_demand), "compared_across": fair.compared_across, "shown": fair.shown,
        "model_note": fair.model_note,
    }
    report["queue_gaps"] = gaps.result()
    if job:
        r = job_report(a, job)
        if r is None:
            from gpufleet.analytics.jobs import job_not_in_window

            report["job_missing"] = job_not_in_window(con, params, job)
            report["warnings"].append(report["job_missing"])
        report["job"] = None if r is None else {
            "job": {k: _plain(v) for k, v in r.job.items()}, "runtime_h": r.runtime_h, "allocated_gpu_h": r.allocated_gpu_h,
            "mean_utilization_pct": r.mean_utilization_pct, "idle_gpu_h": r.idle_gpu_h, "no_process_gpu_h": r.no_process_gpu_h,
            "verdict": r.verdict, "rule": r.rule, "per_gpu": rows(r.per_gpu), "idle_stretches": rows(r.idle_stretches),
        }
        if report["job"] is not None:
            from gpufleet.analytics.states import job_breakdown

            breakdown = job_breakdown(con, params, r.job["job_key"], state_thresholds or Thresholds.of(params, {}))
            report["job"]["where_time_goes"] = None if breakdown is None else breakdown.to_json()
            from gpufleet.analytics.jobs import gpu_shares

            report["job"]["shared_gpus"] = [_plain_share(g) for g in gpu_shares(con, params, r.job["cluster"], r.job["scheduler"], r.job["job_key"])]
    return report


def queue_gap_report(con, params, now: datetime | None, top: int) -> dict[str, Any]:
    """queue_gaps as JSON: the pools, the `top` jobs that waited while they fit and how many did (not all: the
    answer would grow with the queue), the waiting jobs left out by why."""
    from gpufleet.analytics.queue_gaps import queue_gaps

    g = queue_gaps(con, params, now=now)
    return {"pools": rows(g.pools), "jobs": rows(g.jobs.head(max(top, 0))), "jobs_fit": g.jobs.height, "not_counted": g.not_counted,
            "note": g.note}


def print_queue_gaps(q: dict[str, Any], out: TextIO) -> None:
    """The pools with a gap and the jobs that waited longest while they fit (gpufleet.analytics.queue_gaps)."""
    table("Queue gaps (free GPUs while pending jobs that would have fit waited, by partition and model)",
          [r for r in q["pools"] if r["gap_gpu_h"] > 0], out, ["cluster", "partition", "model", "gpus", "free_gpu_h", "gap_gpu_h", "gap_cost", "jobs_fit"])
    if q.get("note"):
        out.write(f"  {q['note']}\n")
    if q["jobs"]:
        table(f"  jobs that waited while they would have fit (top {len(q['jobs'])} of {q['jobs_fit']})", q["jobs"], out,
              ["job_id", "account", "user_name", "partition", "model", "gpus", "waited_h", "fit_h", "fit_gpu_h"])
    for why, n in q["not_counted"].items():
        if n:
            out.write(f"  not counted: {words.quantity(n, 'waiting job')}, {why}\n")


def fmt(v: Any, key: str = "") -> str:
    """A cell as the pages write it (analytics.vocabulary: its kind by the column's name); a missing figure "unknown",
    missing text a dash."""
    if key == "verdict":
        return words.verdict(v)
    if key == "state" and isinstance(v, str):
        return words.state(v)
    if key == "gi" and isinstance(v, int) and v < 0:
        return words.NONE  # a whole GPU, not a MIG instance
    kind = words.kind(key)
    if v is None:
        return words.UNKNOWN if kind or key == "gpus" else words.NONE
    if isinstance(v, (list, tuple)):  # (a chain's job ids: as the pages list them, not a Python list)
        return ", ".join(fmt(x) for x in v) if v else words.NONE
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if kind == "usd":
        return words.usd(v)
    if kind in ("pct", "fraction"):
        return words.pct(v * 100 if kind == "fraction" else v)
    if kind == "gpu_h":
        return words.gpu_h(v)
    if kind == "p_value":
        return f"{v:.2g}"
    if kind == "mib":
        return f"{v:,.0f}"
    if kind == "duration":
        return words.duration(v * words.duration_unit_s(key))
    if isinstance(v, float):
        return f"{v:,.2f}"
    return str(v)


def table(title: str, data: list[dict[str, Any]], out: TextIO, columns: list[str] | None = None, labels: dict[str, str] | None = None) -> None:
    """Rows as a plain-text table headed in the vocabulary's words (the pages' headers; `labels`: a column's own)."""
    out.write(f"\n{title}\n")
    if not data:
        out.write("  (none in this window)\n")
        return
    cols = columns or list(data[0])
    heads = [(labels or {}).get(c) or words.header(c) for c in cols]
    cells = [[fmt(r.get(c), c) for c in cols] for r in data]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
    out.write("  " + "  ".join(h.ljust(w) for h, w in zip(heads, widths)) + "\n")
    for row in cells:
        out.write("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)) + "\n")


def print_table(report: dict[str, Any], out: TextIO) -> None:
    w = report["window"]
    out.write(f"gpufleet analysis {w['from']} .. {w['to']} ({w['hours']:.1f} h)\n")
    if report["filters"]:
        out.write("filters: " + ", ".join(f"{k}={v}" for k, v in report["filters"].items()) + "\n")
    for warning in report.get("warnings", []):
        out.write(f"WARNING: {warning}\n")
    scope = report.get("totals", {})
    if scope.get("scope", "fleet") != "fleet":
        out.write(f"figures for {scope['scope']} only\n")
    if scope.get("not_attributable_reason"):
        out.write(f"  not shown: {scope['not_attributable_reason']}\n")
    from gpufleet.analytics.trends import people_rows

    table("Headline (vs the previous window)", people_rows(report["trend"]), out)
    for r in report["trend"]:
        if r.get("reason"):
            out.write(f"  {r['label']}: {r['reason']}\n")
    no_comparison = report.get("previous_window", {}).get("no_comparison")
    if no_comparison:
        out.write(f"  no data to compare against: {no_comparison}\n")
    u = report["utilization"]
    hidden = ("scheduler", "gpu_uuid", "states") if u["by"] == "cluster" else ("cluster", "scheduler", "gpu_uuid", "states")  # the key of --by stays
    cols = [c for c in (u["rows"][0] if u["rows"] else {}) if c not in hidden]
    table(f"Utilization by {u['by']}", u["rows"], out, cols or None)
    if u["rows"] and "states" in u["rows"][0]:
        from gpufleet.analytics.window_states import ORDER_NOTE, STATES, NOT_AT_GRAIN

        # (an account without time with data has no states: unknown, as a row of them all)
        every = (*STATES, *NOT_AT_GRAIN)
        table("Where the GPU time went by account (GPU-hours; unknown: the facts cannot tell it)", [
            {"account": r["account"], **{f"{s}_gpu_h": None for s in every}, **{f"{s['state']}_gpu_h": s["gpu_h"] for s in r["states"] or []}}
            for r in u["rows"]], out, labels=words.state_headers(every))
        out.write(textwrap.fill(ORDER_NOTE + ".", 110, initial_indent="  ", subsequent_indent="  ") + "\n")
    table("Most wasteful jobs (idle allocated GPU-hours)", report["top_wasteful_jobs"], out,
          ["job_id", "user_name", "account", "gpus", "runtime_h", "idle_gpu_h", "idle_cost"])
    f = report["fairness"]
    table(f"Fair share (Jain's index {fmt(f['jain_index'])}, Gini over users {fmt(f['gini_users'])})", f["per_account"], out,
          ["account", "entitled_share", "allocated_gpu_h", "allocated_share", "ratio", "fairshare_factor", "wait_p50_s", "wait_p95_s"])
    if f.get("shown"):
        out.write(f"  {f['shown']}'s row of the fairness of the {f['compared_across']} (Jain's index and Gini: "
                  f"the {f['compared_across']}'s; fairness compares teams, a filter only picks the rows shown)\n")
    if f.get("model_note"):
        out.write(f"  {f['model_note']}\n")
    out.write(f"  entitled shares: {f['shares_description']}\n")
    if "queue_gaps" in report:
        print_queue_gaps(report["queue_gaps"], out)
    t = report["totals"]
    if t["unpriced_models"]:
        out.write(f"\nno price for: {', '.join(t['unpriced_models'])} (set [analytics.prices]); their money is unknown\n")
    if "job" in report:
        j = report["job"]
        if j is None:
            out.write(f"\n{report['job_missing']}\n")
        else:
            out.write(f"\nJob {j['job']['job_id']}: {words.verdict(j['verdict'])} - {j['rule']}\n")
            table("  per GPU", j["per_gpu"], out)
            print_states(j.get("where_time_goes"), out)
            from gpufleet.analytics.jobs import share_sentence

            for g in j.get("shared_gpus") or ():
                out.write(f"  GPU {g['gpu_uuid']} on {g['host']}: {share_sentence(g)}\n")
    p = report["parameters"]
    out.write(f"\nmethod: samples hold {p['max_gap_s']:g} s at most; idle = utilization < {p['idle_threshold_pct']:g}% "
              f"for >= {p['idle_min_duration_s'] / 60:g} min; no-data time is neither idle nor busy\n")


def _rate(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.3g}"


def print_reliability(rel: dict[str, Any], out: TextIO) -> None:
    """gpufleet.reliability/v1 for people: the headline, MTTF by job size beside the projection, lemons, costly interruptions."""
    from gpufleet.analytics import reliability_store
    from gpufleet.analytics.reliability import CAUSE_LABELS

    w, f = rel["window"], rel["figures"]
    share = f["lost_share_of_allocated"]
    share_text = "unknown" if share is None else f"{100 * share:.1f}%"
    bound = ("; an upper bound where no checkpoint was reported" if f["lost_is_upper_bound"]
             else "; measured from the jobs' last checkpoints" if f["lost_measured_interruptions"] else "")
    out.write(f"gpufleet reliability {w['from']} .. {w['to']}\n")
    for warning in rel.get("warnings", []):
        out.write(f"WARNING: {warning}\n")
    if rel["filters"]:
        out.write("filters: " + ", ".join(f"{k}={v}" for k, v in rel["filters"].items()) + "\n")
    if rel.get("model_note"):
        out.write(f"  {rel['model_note']}\n")
    out.write(f"attempts {f['attempts']}, ended in the window {f['ended_in_window']}; "
              f"allocated {fmt(f['allocated_gpu_hours'], 'allocated_gpu_h')} GPU-h\n"
              f"interruptions {f['interruptions']} ({fmt(f['interruptions_per_1000_gpu_days'])} per 1,000 GPU-days), "
              f"hardware {f['hardware_interruptions']} ({fmt(f['hardware_interruptions_per_1000_gpu_days'])} per 1,000 GPU-days)\n"
              f"GPU-hours lost to interruptions {fmt(f['lost_gpu_hours'], 'lost_gpu_h')} ({share_text} of allocated{bound})\n")
    if f["allocated_unknown_attempts"] or f["lost_unknown_interruptions"]:
        out.write(f"  {f['allocated_unknown_attempts']} attempts ({f['lost_unknown_interruptions']} of them interrupted) have an unknown "
                  "GPU count: their GPU-hours are unknown, left out of allocated and lost (at least those figures); the rates "
                  "per GPU-day count the attempts of known GPU count\n")
    table("How attempts ended", [{"cause": CAUSE_LABELS[k], "attempts": v} for k, v in f["causes"].items() if v], out)
    table("Job MTTF by size (failures: hardware and node failures; 95% exact Poisson interval)", f["mttf_by_size"], out,
          ["size", "attempts", "failures", "job_hours", "mttf_h", "mttf_ci_low_h", "mttf_ci_high_h"])
    table(f"Projection from the per-GPU failure rate {_rate(f['gpu_failure_rate_per_gpu_hour'])} per GPU-hour (MTTF_N = 1 / (N r))",
          f["projection"], out)
    for d in f["projection_disagreements"]:
        out.write(f"  the fleet's own jobs disagree: {d}\n")
    table("Lemon nodes (improbably many failures for their GPU-hours)", rel["lemons"], out,
          ["node", "failures", "gpu_hours", "expected_failures", "p_value"])
    table("Costliest interruptions", rel["interrupted_attempts"], out, ["job_id", "user_name", "gpus", "end", "cause", "reason"])
    g = rel["goodput"]
    h = {k: fmt(g[k], k) for k in ("wall_gpu_hours", "productive_gpu_hours", "lost_gpu_hours", "requeue_wait_gpu_hours")}
    out.write(f"\nGoodput: fleet ETTR {fmt(g['ettr'], 'ettr')} (productive / wall GPU-hours of the window's work: {g['chains']} job "
              f"chains with an attempt that did not complete, {g['interrupted_chains']} of them interrupted, and the rest): wall "
              f"{h['wall_gpu_hours']} GPU-h, productive {h['productive_gpu_hours']}, work lost in attempts that did not complete "
              f"{h['lost_gpu_hours']}, waiting for a requeue {h['requeue_wait_gpu_hours']}\n")
    out.write(f"  lost work: {g['checkpoints']}\n")
    if f["lost_gpu_hours_by_cause"]:
        out.write("  lost GPU-hours by cause: " + ", ".join(f"{CAUSE_LABELS[k]} {fmt(v, 'gpu_h')}" for k, v in f["lost_gpu_hours_by_cause"].items()) + "\n")
    table("Job chains that lost most (ETTR = productive / wall time)", rel["chains"], out,
          ["job_ids", "user_name", "gpus", "attempts", "interruptions", "wall_h", "lost_h", "lost_basis", "requeue_wait_h", "ettr"])
    table("Checkpoint advice for the largest chains (Young/Daly: sqrt(2 x checkpoint cost x MTTF for the chain's size))",
          reliability_store.advice_rows(rel["checkpoint_advice"]), out,
          ["job_ids", "user_name", "gpus", "checkpoints", "checkpoint_save_s", "used_interval_s", "mttf_h", "advised_interval_s", "advice"])
    s = rel["settings"]
    out.write(f"\nmethod: hardware = a hardware XID/ECC/remap/lost-GPU event on the attempt's GPUs within {s['hardware_window_s']:g} s "
              f"before its end; lemons at a {s['lemon_false_positive_rate']:g} false-positive rate, >= {s['lemon_min_failures']} failures\n")


def print_states(w: dict[str, Any] | None, out: TextIO) -> None:
    """Where the job's GPU time went (gpufleet.analytics.states), largest first, with the fix to try."""
    if w is None:
        out.write("\n  where the time went: unknown (no GPU of this job mapped in the window)\n")
        return
    from gpufleet.analytics.states import state_rows

    shown = state_rows({s["state"]: s["seconds"] for s in w["states"]}, w["data_s"], {s["state"]: s["evidence"] for s in w["states"]})
    table(f"  where the time went ({fmt(w['data_s'] / 3600, 'gpu_h')} GPU-hours with data)", shown, out, ["state", "gpu_h", "share_pct", "evidence", "fix"])
    for s in w["states"]:
        if s["unknown_on"]:
            out.write(f"  {words.state(s['state'])} unknown on {'; '.join(s['unknown_on'])}\n")
    from gpufleet.analytics.states import ORDER_NOTE

    out.write(textwrap.fill(ORDER_NOTE + ".", 110, initial_indent="  ", subsequent_indent="  ") + "\n")


def run(args: argparse.Namespace, out=None) -> int:
    import sys

    from gpufleet.analytics.fairness import settings
    from gpufleet.analytics.params import Filters, analytics_options, from_config, store_path
    from gpufleet.analytics.states import thresholds
    from gpufleet.collector.store import STORE_FIX, NoStoreError, StoreError, open_reader
    from gpufleet.times import utcnow

    out = out or sys.stdout
    try:
        doc = load_config(args.config)
        by = dimension(args.by)
        filters = Filters(cluster=args.cluster, account=args.account, user_name=args.user, model=args.model, partition=args.partition)
        start, end, _ = window_from_arguments(args)
        params = from_config(doc, args.config, start, end, filters)
        shares, half_life = settings(analytics_options(doc, args.config))
        state_thresholds = thresholds(doc, args.config, params)
        root = store_path(doc, args.config, args.store)
    except ConfigError as e:
        return command_error("analyze", e)
    try:
        con = open_reader(root)
    except NoStoreError as e:
        return command_error("analyze", f"{e}: {STORE_FIX}")
    except StoreError as e:
        return command_error("analyze", e, 1)
    if getattr(args, "reliability", False):
        from gpufleet.analytics import reliability, reliability_store

        report = reliability_store.report(con, params, reliability.settings(analytics_options(doc, args.config)),
                                          as_of=min(utcnow(), params.end), top=args.top)
        printer = print_reliability
    else:
        report = build_report(con, params, by, args.top, args.job, shares=shares, half_life=half_life,
                              state_thresholds=state_thresholds)
        printer = print_table
    if args.format == "json":
        for warning in report.get("warnings", []):  # the table prints them itself
            sys.stderr.write(f"gpufleet analyze: warning: {warning}\n")
        # one write: json.dump writes each token apart, a system call each under PYTHONUNBUFFERED
        out.write(json.dumps(report, indent=2, default=_plain) + "\n")
    else:
        printer(report, out)
    return 0
