"""Fairness of one window: who was entitled to the GPUs, who got them, and who waited for them.

Contract 4. The definitions, each a choice that could be made differently:
- GPU jobs only (gpus > 0). Jobs of unknown GPU count are counted apart (gpus_unknown_jobs,
  `unknown_demand`, the wait size "unknown").
- Demand: a GPU job whose life (submit to end, or to as_of) overlaps the window. Only accounts with
  demand get a ratio: one that asked for nothing cannot have been treated unfairly.
- Used: allocated GPU-hours in the window from scheduler accounting (sql.JOB_ALLOCATED).
- Entitled share: the account's weight over all weights (sshare's NormShares). The ratio compares the
  used share with the entitled share renormalised over the accounts with demand (`active_share`), so
  an idle account's share goes to the others, as in Slurm (Jain's index is scale-free). Without shares
  every account with demand is entitled equally; one with demand but no share is in `without_share`.
- Queue wait: start - submit of the jobs that STARTED in the window (percentiles: Hyndman-Fan type 7).
  Jobs pending at as_of are in `pending`, with their wait so far: leaving them out flatters a stuck queue.
- Teams are compared across the cluster (and model) filters select. A job filter does not narrow whom a
  team is compared with: it picks the rows shown (its jobs' accounts, pending jobs and waits by size),
  each its row of the unfiltered table; Jain's index and the Gini stay the whole's (`compared_across`).
  A job without an account or user is grouped under "".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Iterable, Mapping

import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.scope import JOB_FILTER_NAMES, fairness_model_note, filter_scope, not_attributable_reason
from gpufleet.config import Option, number

OPTIONS = (
    Option("shares", {}, "a table of account -> share weight > 0 (empty: equal shares)",
           lambda v: isinstance(v, dict) and all(isinstance(k, str) and number(0)(x) for k, x in v.items())),
    Option("half_life_days", 7.0, "a number of days > 0 (Slurm's PriorityDecayHalfLife)", number(0)),
)


def settings(opts: Mapping[str, Any]) -> tuple[dict[str, float] | None, timedelta]:
    """Validated [analytics] options -> (shares or None for equal shares, decay half-life)."""
    shares = {str(k): float(v) for k, v in opts["shares"].items()} or None
    return shares, timedelta(days=opts["half_life_days"])


# --- the measures ---


def jain_index(xs: Iterable[float]) -> float | None:
    """(sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one takes everything."""
    xs = list(xs)
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if xs and sq > 0 else None


def gini(xs: Iterable[float]) -> float | None:
    """Sorted formula sum_i (2i - n - 1) x_i / (n sum x), i from 1: 0 = equal, (n-1)/n = one has all."""
    xs = sorted(xs)
    n, total = len(xs), sum(xs)
    if not n or total <= 0:
        return None
    return sum((2 * i - n - 1) * x for i, x in enumerate(xs, 1)) / (n * total)


def fairshare_factor(usage: float, share: float | None) -> float | None:
    """Slurm's classic fair-share factor F = 2^(-U/S) (PriorityFlags=NO_FAIR_TREE, FairShareDampeningFactor=1).

    U: the account's share of all decayed usage (GPU-seconds here, not Slurm's billing TRES); S: its
    normalised share. 1 = no recent usage, 0.5 = exactly its share, no share gives 0. Under Fair Tree
    sshare's FairShare is a rank: compare orderings only.
    """
    if share is None:
        return None
    return 2.0 ** (-usage / share) if share > 0 else 0.0


# --- sshare ---


@dataclass(frozen=True)
class SshareRow:
    account: str
    user: str  # "" on an account row
    depth: int  # sshare indents names by one space per level of the association tree
    raw_shares: str  # a number, or "parent"
    norm_shares: float | None
    raw_usage: float | None
    effective_usage: float | None
    fairshare: float | None  # empty on account rows under Fair Tree


def _num(v: str) -> float | None:
    try:
        return float(v) if v.strip() else None
    except ValueError:
        return None


def parse_sshare(text: str) -> list[SshareRow]:
    """`sshare -P -a -o Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare` (or -p).

    Columns are found by the header (no -n); lines without '|' (-M's "CLUSTER: name") are skipped."""
    rows: list[SshareRow] = []
    cols: list[str] | None = None
    for line in text.splitlines():
        if "|" not in line:
            continue
        if cols is None:
            cols = [c.strip() for c in line.split("|")]
            continue
        f = dict(zip(cols, line.split("|")))
        name = f.get("Account", "")
        rows.append(SshareRow(account=name.strip(), user=f.get("User", "").strip(), depth=len(name) - len(name.lstrip(" ")),
                              raw_shares=f.get("RawShares", "").strip(), norm_shares=_num(f.get("NormShares", "")),
                              raw_usage=_num(f.get("RawUsage", "")), effective_usage=_num(f.get("EffectvUsage", "")),
                              fairshare=_num(f.get("FairShare", ""))))
    return rows


def sshare_shares(rows: list[SshareRow]) -> dict[str, float]:
    """Entitled share of each leaf account: the product of NormShares (relative to siblings) down its path.
    Parents are left out: jobs are charged to leaves. fairness() renormalises."""
    accounts = [r for r in rows if not r.user and r.depth > 0]  # depth 0: root
    path: list[float] = []
    out: dict[str, float] = {}
    for i, r in enumerate(accounts):
        path = path[: r.depth - 1] + [r.norm_shares or 0.0]
        leaf = i + 1 == len(accounts) or accounts[i + 1].depth <= r.depth
        if leaf:
            out[r.account] = math.prod(path)
    return out


# --- one window (the queries: analytics/sql.py, FAIRNESS_*) ---

BUCKETS = ("1", "2-4", "5-8", "9+")  # job sizes in GPUs, as the queries label them
UNKNOWN_SIZE = "unknown"  # a job of unknown GPU count (a wait_by_size row only where there is one)


def _waits(df: pl.DataFrame, key: str) -> pl.DataFrame:
    return df.group_by(key).agg(
        pl.len().cast(pl.Int64).alias("started_jobs"),
        pl.col("wait_s").quantile(0.5, "linear").alias("wait_p50_s"),
        pl.col("wait_s").quantile(0.95, "linear").alias("wait_p95_s"),
    )


@dataclass(frozen=True)
class FairnessReport:
    per_account: pl.DataFrame  # ACCOUNT_SCHEMA, one row per account with a share, demand or past usage
    jain_index: float | None  # over `ratio` of the accounts with demand and a share
    gini_users: float | None  # allocated GPU-hours of the users with demand
    wait_by_size: pl.DataFrame  # gpus_bucket, started_jobs, wait_p50_s, wait_p95_s, pending_jobs
    pending: pl.DataFrame  # one row per job still pending at as_of, with its wait so far
    without_share: tuple[str, ...]  # accounts with demand that no share entitles
    shares_source: str  # a key of SHARES_SOURCES
    # whom the figures compare ("fleet", "cluster=hpc"); `shown`: the job filter picking the rows ("account=nlp")
    compared_across: str = "fleet"
    shown: str | None = None
    # accounts whose jobs all have an unknown GPU count: demand unknown, so no ratio - said, never dropped silently
    unknown_demand: tuple[str, ...] = ()
    model_note: str | None = None  # under a GPU model filter: it does not apply here (scope.fairness_model_note)


# where the entitled shares came from, worded once for every output: it changes every ratio, so it is never silent
SHARES_SOURCES = {
    "config": "share weights from [analytics] shares in the configuration",
    "equal": "equal for every account with demand (no [analytics] shares configured)",
}


ACCOUNT_SCHEMA = {
    "account": pl.Utf8, "entitled_share": pl.Float64, "active_share": pl.Float64, "used_gpu_h": pl.Float64,
    "used_share": pl.Float64, "ratio": pl.Float64, "decayed_gpu_h": pl.Float64, "fairshare_factor": pl.Float64,
    "wait_p50_s": pl.Float64, "wait_p95_s": pl.Float64, "jobs": pl.Int64, "started_jobs": pl.Int64, "pending_jobs": pl.Int64,
    "gpus_unknown_jobs": pl.Int64,
}


def fairness(analysis: Any, shares: Mapping[str, float] | None, half_life: timedelta = timedelta(days=7)) -> FairnessReport:
    """Fairness figures of the analysis' window, as the module docstring defines them."""
    if half_life <= timedelta(0):
        raise ValueError(f"half_life {half_life} must be positive")
    f = analysis.p.filters
    unselected = {k: None for k in JOB_FILTER_NAMES}
    # teams are compared across the cluster, whatever model the GPUs are: a GPU model filter weighs a job's allocated
    # GPU-hours by its GPUs on that model (sql.JOB_ALLOCATED), which would compare a team's A100 hours with its entitlement
    # to the whole cluster and its decayed usage on every model
    across = filter_scope(replace(f, model=None, **unselected))
    if not_attributable_reason(f) is None and f.model is None:
        return _fairness(analysis, shares, half_life, across)
    whole = analysis.job_window(replace(f, model=None, **unselected))
    try:
        fleet = _fairness(whole, shares, half_life, across)
    finally:
        whole.close()
    fleet = replace(fleet, model_note=fairness_model_note(f))
    if not_attributable_reason(f) is None:  # a model filter alone selects no team: every row
        return fleet
    # the rows shown: its jobs' accounts (with demand, usage, decayed usage or unknown demand), and the filtered account
    mine = set(analysis.q(sql.FAIRNESS_USERS)["account"].to_list())
    mine |= set(analysis.q(sql.FAIRNESS_DECAYED, half_life=half_life.total_seconds())["account"].to_list())
    mine |= {a or "" for a, _, n in analysis.q(sql.job_allocated_by(["account"])).iter_rows() if n}
    if f.account is not None:
        mine.add(f.account)
    started, pending = analysis.q(sql.FAIRNESS_STARTED), analysis.q(sql.FAIRNESS_PENDING)
    return replace(
        fleet,
        per_account=fleet.per_account.filter(pl.col("account").is_in(sorted(mine))),
        wait_by_size=_wait_by_size(started, pending),
        pending=pending,
        without_share=tuple(a for a in fleet.without_share if a in mine),
        unknown_demand=tuple(a for a in fleet.unknown_demand if a in mine),
        shown=filter_scope(replace(f, cluster=None, model=None)),
    )


def _wait_by_size(started: pl.DataFrame, pending: pl.DataFrame) -> pl.DataFrame:
    """started_jobs, wait_p50_s, wait_p95_s, pending_jobs per BUCKETS (and UNKNOWN_SIZE where there is one)."""
    sizes = BUCKETS + ((UNKNOWN_SIZE,) if UNKNOWN_SIZE in set(started["gpus_bucket"]) | set(pending["gpus_bucket"]) else ())
    by_size = pl.DataFrame({"gpus_bucket": sizes}).join(_waits(started, "gpus_bucket"), on="gpus_bucket", how="left").join(
        pending.group_by("gpus_bucket").agg(pl.len().cast(pl.Int64).alias("pending_jobs")), on="gpus_bucket", how="left",
    ).with_columns(pl.col("started_jobs", "pending_jobs").fill_null(0))
    return by_size.select("gpus_bucket", "started_jobs", "wait_p50_s", "wait_p95_s", "pending_jobs")


def _fairness(analysis: Any, shares: Mapping[str, float] | None, half_life: timedelta, compared_across: str) -> FairnessReport:
    """fairness() over every job the analysis' window selects."""
    users = analysis.q(sql.FAIRNESS_USERS)
    decayed = dict(analysis.q(sql.FAIRNESS_DECAYED, half_life=half_life.total_seconds()).iter_rows())
    started, pending = analysis.q(sql.FAIRNESS_STARTED), analysis.q(sql.FAIRNESS_PENDING)

    # jobs of unknown GPU count add no demand or usage; an account with only those has unknown usage, never 0
    unknown = {a or "": n for a, _, n in analysis.q(sql.job_allocated_by(["account"])).iter_rows()}
    acct = users.group_by("account").agg(pl.sum("jobs"), pl.sum("used_gpu_h"))
    jobs, used = dict(acct.select("account", "jobs").iter_rows()), dict(acct.select("account", "used_gpu_h").iter_rows())
    demand = {a for a, n in jobs.items() if n > 0}
    weights = {a: float(w) for a, w in shares.items() if w > 0} if shares else {a: 1.0 for a in demand}
    total_w = sum(weights.values())
    active_w = sum(w for a, w in weights.items() if a in demand)
    total_used, total_decayed = sum(used.values()), sum(decayed.values())
    waits = {r["account"]: r for r in _waits(started, "account").iter_rows(named=True)}
    pend = dict(pending.group_by("account").len().iter_rows())

    rows = []
    for a in sorted(set(weights) | demand | set(decayed) | {a for a, n in unknown.items() if n}):
        w, u, has_demand = weights.get(a), used.get(a, 0.0), a in demand
        if not has_demand and not u and unknown.get(a):
            u = None
        entitled = w / total_w if w and total_w else (0.0 if shares else None)
        active = w / active_w if w and has_demand else None
        used_share = u / total_used if has_demand and total_used > 0 else None
        wt = waits.get(a, {})
        rows.append(dict(
            account=a, entitled_share=entitled, active_share=active, used_gpu_h=u, used_share=used_share,
            ratio=used_share / active if used_share is not None and active else None,
            decayed_gpu_h=decayed.get(a, 0.0),
            fairshare_factor=fairshare_factor(decayed.get(a, 0.0) / total_decayed if total_decayed > 0 else 0.0, entitled),
            wait_p50_s=wt.get("wait_p50_s"), wait_p95_s=wt.get("wait_p95_s"),
            jobs=jobs.get(a, 0), started_jobs=wt.get("started_jobs", 0), pending_jobs=pend.get(a, 0),
            gpus_unknown_jobs=unknown.get(a, 0),
        ))
    per_account = pl.DataFrame(rows, schema=ACCOUNT_SCHEMA)

    demand_users = users.filter(pl.col("jobs") > 0)
    return FairnessReport(
        per_account=per_account,
        jain_index=jain_index(per_account["ratio"].drop_nulls().to_list()),
        gini_users=gini(demand_users.group_by("user_name").agg(pl.sum("used_gpu_h"))["used_gpu_h"].to_list()),
        wait_by_size=_wait_by_size(started, pending),
        pending=pending,
        without_share=tuple(sorted(a for a in demand if a not in weights)),
        unknown_demand=tuple(sorted(a for a, n in unknown.items() if n and a not in demand)),
        shares_source="config" if shares else "equal",
        compared_across=compared_across,
    )
