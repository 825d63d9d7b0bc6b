"""Where a whole window's GPU time went, per job, per team and for the fleet, from the store's facts.

`states.job_breakdown` splits one job's time from its raw samples; this module splits every job's
time with data from the window's fact parts (core.Analysis' FactWindow) by rules the facts decide
exactly at their grain: a part's time-weighted sums and the idle runs the facts keep (runs touching
a part's edges, chained across parts as the idle figure chains them, and runs inside a part reaching
idle_min_duration). Each GPU's time with data in a job's allocation goes to exactly one state, in
this order (thresholds: the analysis' and `[analytics.states]`, as states.py has them):

  startup             the low run (below idle_threshold) starting at the first part of a hold (an
                      allocation: each run of a requeued job is one) when the hold's start is seen and
                      ending before its last part's end: to the first busy sample. A GPU never busy
                      has none (idle, as states.py); where a hold ends as the next begins, the second
                      has none of its own (the low run across both is one chain).
  no_process          a part's time with no compute process less its startup time (0 at least): exact
                      where that time lies in its startup run or the part has none (the job page's
                      order: a GPU held without a process is "no process" whether idle or not).
  idle                the other time of low runs of at least idle_min_duration (contract 4b; chained
                      across parts, judged by their whole length): a part's less its no-process time,
                      exact where that lies in such runs or the part has none.
  input_bound         the rest of a part whose mean SM active is below `input_sm_active_max` while
                      its mean PCIe RX is at least `input_pcie_rx_min_bytes_per_s`
  communication_bound (jobs of several GPUs) the rest of a part whose mean NVLink RX + TX is at least
                      `communication_nvlink_min_bytes_per_s` while its tensor and SM active means
                      are below `communication_tensor_max` and `communication_sm_active_max`
  compute             the rest of a part whose fields tell neither
  busy_unresolved     the rest of a part that lacks a field the two rules above read

They sum to the job's time with data exactly. A state none of a job's busy parts has the fields for is
None (unknown, never 0); where some have them, `unknown` names the fields the others lack. No process
is None for the window when no sample carries a compute-process count (dcgm-exporter has none).
Checkpoint stalls, pauses and stragglers are NOT_AT_GRAIN: a part's sums hide dips shorter than
idle_min_duration and each GPU's utilization over its busy time, so they stay in the busy states.

Against states.job_breakdown (tests/test_window_states.py has a window both agree on): startup ends
at the first busy sample, not the first `startup_busy_seconds` stretch; input- and communication-bound
are judged on a part's means, all or nothing per part; no process and idle split a part by its sums (the same order, exact
where its no-process time lies in its startup and idle runs, or it has none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.states import FIXES, LOSSES, Thresholds

# the states the facts tell (in rule order); NOT_AT_GRAIN those they do not, and where their time went: short dips and a
# straggler's shortfall lie inside parts the busy states take whole (a reader must not take "busy" there for busy time)
STATES = ("startup", "no_process", "idle", "input_bound", "communication_bound", "compute", "busy_unresolved")
_IN_BUSY = "unknown at this grain, their time inside the busy states (input-bound to busy, not resolved): open the job"
NOT_AT_GRAIN = {"checkpoint": _IN_BUSY, "pause": _IN_BUSY, "straggler": _IN_BUSY}
WINDOW_LOSSES = tuple(s for s in LOSSES if s in STATES)
# what a breakdown of the facts says beside it: a state's hours are not the figure of the same name
ORDER_NOTE = (words.first_state_matches(STATES) + ": no process is held time with no compute process outside startup, of any length "
              "(the no process figure counts its stretches of at least idle_min_duration), and idle is the idle allocated figure less "
              "the stretches that begin an allocation (startup) and its time with no process")
JOB_KEYS = ["cluster", "scheduler", "job_key"]
TEAM_KEYS = ["cluster", "account"]
# the exporters' fields a missing column stands for (states.FIELDS' names)
_MISSING = {"sm_missing": "DCGM_FI_PROF_SM_ACTIVE", "rx_missing": "DCGM_FI_PROF_PCIE_RX_BYTES",
            "nvl_missing": "DCGM_FI_PROF_NVLINK_RX_BYTES, DCGM_FI_PROF_NVLINK_TX_BYTES", "tensor_missing": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}


@dataclass
class WindowStates:
    """A window's states in GPU-hours (None: unknown): per job (with its largest loss and unknown_fields),
    per team (cluster, account; each state's GPU-hours and cost) and the fleet (one row as a team's)."""

    jobs: pl.DataFrame
    teams: pl.DataFrame
    fleet: dict[str, Any]
    not_at_grain: dict[str, str] = field(default_factory=lambda: dict(NOT_AT_GRAIN))

    def not_at_grain_note(self) -> str:
        """The states the facts do not tell, grouped by why: "checkpoint stalls, pauses and straggler shortfall: unknown at this
        grain: open the job"."""
        why: dict[str, list[str]] = {}
        for s, reason in self.not_at_grain.items():
            why.setdefault(reason, []).append(words.state(s))
        return "; ".join(f"{words.listing(states)}: {reason}" for reason, states in why.items())

    def team_causes(self, n: int = 3) -> pl.DataFrame:
        """Each team's `n` largest losses (WINDOW_LOSSES) of those that show (vocabulary.shows_gpu_h): rank, state, gpu_h,
        share_pct of its data time, cost, fix."""
        rows = []
        for r in self.teams.iter_rows(named=True):
            losses = sorted(((r[f"{s}_gpu_h"], s) for s in WINDOW_LOSSES if words.shows_gpu_h(r[f"{s}_gpu_h"])), reverse=True)[:n]
            for rank, (h, s) in enumerate(losses, 1):
                rows.append({"cluster": r["cluster"], "account": r["account"], "rank": rank, "state": s, "gpu_h": h,
                             "share_pct": 100 * h / r["data_gpu_h"] if r["data_gpu_h"] else None, "cost": r[f"{s}_cost"], "fix": FIXES[s]})
        return pl.DataFrame(rows, schema={"cluster": pl.String, "account": pl.String, "rank": pl.Int64, "state": pl.String, "gpu_h": pl.Float64,
                                          "share_pct": pl.Float64, "cost": pl.Float64, "fix": pl.String})

    def with_largest_loss(self, jobs: pl.DataFrame) -> pl.DataFrame:
        """`jobs` (keyed by JOB_KEYS) with `largest_loss` in words ("idle 25.0 %"; None: no loss or no data), written for
        those jobs alone: a page asks for the rows it shows, not for the window's every job (words are Python's, per row)."""
        named = self.jobs.join(jobs.select(JOB_KEYS), on=JOB_KEYS, how="semi", nulls_equal=True).filter(pl.col("largest_loss").is_not_null())
        label = named.select(*JOB_KEYS, pl.Series("largest_loss", [f"{words.state(s)} {words.pct(x)}" for s, x in
                                                                  zip(named["largest_loss"], named["largest_loss_share_pct"])], pl.String))
        return jobs.drop("largest_loss", strict=False).join(label, on=JOB_KEYS, how="left", nulls_equal=True, maintain_order="left")

    def team_shares(self) -> pl.DataFrame:
        """Each team's states with time, long, share_pct of its data time (the Teams page's stacked bar)."""
        rows = [{"cluster": r["cluster"], "account": r["account"], "state": words.state(s), "gpu_h": r[f"{s}_gpu_h"],
                 "share_pct": 100 * r[f"{s}_gpu_h"] / r["data_gpu_h"]}
                for r in self.teams.iter_rows(named=True) for s in STATES if r[f"{s}_gpu_h"] and r["data_gpu_h"]]
        return pl.DataFrame(rows, schema={"cluster": pl.String, "account": pl.String, "state": pl.String, "gpu_h": pl.Float64, "share_pct": pl.Float64})

    def team_rows(self) -> list[dict[str, Any]]:
        """`teams` as JSON-ready rows, each with its states: [{state, gpu_h, share, cost}] (`gpufleet analyze --by account`)."""
        out = []
        for r in self.teams.iter_rows(named=True):
            out.append({"cluster": r["cluster"], "account": r["account"], "data_gpu_h": r["data_gpu_h"], "states": [
                {"state": s, "gpu_h": r[f"{s}_gpu_h"], "share": r[f"{s}_gpu_h"] / r["data_gpu_h"] if r[f"{s}_gpu_h"] is not None and r["data_gpu_h"] else None,
                 "cost": r[f"{s}_cost"]} for s in STATES] + [{"state": s, "gpu_h": None, "share": None, "cost": None, "unknown": why}
                                                             for s, why in NOT_AT_GRAIN.items()]})
        return out


def window_states(a: Any, t: Thresholds) -> WindowStates:
    """The window's states of core.Analysis `a` (its filters apply) under thresholds `t` (states.thresholds)."""
    if getattr(a, "fw", None) is None:
        raise ValueError("the window's states are read from its facts: expected a core.Analysis of the window's parts, got one without (the tests' raw path)")
    a.fw.linked()  # wheld, wlinked: held parts and their idle pieces chained
    query = sql.WINDOW_STATE_JOBS
    rows = a.q(query, input_sm_active_max=t.input_sm_active_max, input_pcie_rx_min=t.input_pcie_rx_min_bytes_per_s,
               comm_nvlink_min=t.communication_nvlink_min_bytes_per_s, comm_tensor_max=t.communication_tensor_max,
               comm_sm_active_max=t.communication_sm_active_max)
    procs_known = bool(a.q(sql.HAS_PROCESS_COUNTS)["n"][0])
    return _assemble(rows, dict(a.prices), procs_known)


def _assemble(rows: pl.DataFrame, prices: dict[str, float], procs_known: bool) -> WindowStates:
    """WINDOW_STATE_JOBS' rows (per job and model, seconds, in the jobs' order) as jobs, teams and the fleet."""
    # a job's rows are consecutive: numbered (_job: 1, 2, ... in row order, so sorted: polars groups sorted keys without
    # hashing) where its key changes, to group on one number, not three strings
    starts = pl.any_horizontal([pl.col(c) != pl.col(c).shift(1) for c in JOB_KEYS]).fill_null(True)
    rows = rows.with_columns(_job=starts.cum_sum().set_sorted())
    # a job of several GPUs (holders) takes its rows' sums by communication-bound's rule; then the rows with no part inside
    # the window go (they told the job's GPUs only), and the jobs are numbered again
    multi = pl.col("hk_max").max().over("_job") != pl.col("hk_min").min().over("_job")
    rows = rows.with_columns(multi=multi).filter("any_inside").with_columns(
        pl.when("multi").then(pl.col("communication_bound_s")).otherwise(0.0).alias("communication_bound_s"),
        pl.when("multi").then(pl.col("compute_multi_s")).otherwise(pl.col("compute_s")).alias("compute_s"),
        pl.when("multi").then(pl.col("busy_unresolved_multi_s")).otherwise(pl.col("busy_unresolved_s")).alias("busy_unresolved_s"),
        _job=starts.cum_sum().set_sorted())
    hours = [(pl.col(f"{s}_s") / 3600).alias(f"{s}_gpu_h") for s in STATES]
    told = (pl.col("busy_s") <= 0) | (pl.col("input_told_s") > 0)
    comm_told = ~pl.col("multi") | (pl.col("busy_s") <= 0) | (pl.col("comm_told_s") > 0)
    names = [pl.col(c).drop_nulls().first().alias(c) for c in ("job_id", "user_name", "account", "partition")]
    jobs = rows.group_by("_job", maintain_order=True).agg(
        *[pl.first(c) for c in JOB_KEYS], *names, (pl.sum("data_s") / 3600).alias("data_gpu_h"), *[pl.sum(f"{s}_s") for s in STATES], pl.sum("busy_s"),
        pl.sum("input_told_s"), pl.sum("comm_told_s"), pl.col("multi").any(), *[pl.col(c).any() for c in _MISSING])
    jobs = jobs.with_columns(hours).with_columns(
        pl.when(told).then(pl.col("input_bound_gpu_h")).otherwise(None).alias("input_bound_gpu_h"),
        pl.when(comm_told).then(pl.col("communication_bound_gpu_h")).otherwise(None).alias("communication_bound_gpu_h"),
        pl.col("no_process_gpu_h") if procs_known else pl.lit(None, pl.Float64).alias("no_process_gpu_h"),
        pl.when(pl.col("busy_unresolved_s") > 0).then(pl.concat_str(
            [pl.when(pl.col(c)).then(pl.lit(f)) for c, f in _MISSING.items()], separator=", ", ignore_nulls=True)).alias("unknown_fields"))
    jobs = _with_largest_loss(jobs).select("_job", *JOB_KEYS, "job_id", "user_name", "account", "partition", "data_gpu_h",
                                           *[f"{s}_gpu_h" for s in STATES], "largest_loss", "largest_loss_share_pct", "unknown_fields")
    # the teams and fleet: a job's unknown state is left out of the sums (None where every job's is); its flags taken to its
    # rows by position (job n is row n - 1 of `jobs`), not by a join
    unknown = jobs.select(*[pl.col(f"{s}_gpu_h").is_null().alias(f"{s}_unknown") for s in STATES])
    by_model = rows.hstack(unknown[(rows["_job"] - 1).to_numpy()].get_columns())
    jobs = jobs.drop("_job")
    per_model = _known_sums(by_model).with_columns(
        pl.col("model").replace_strict(prices, default=None, return_dtype=pl.Float64).alias("usd_per_gpu_hour"))
    teams = _sums(per_model, TEAM_KEYS)
    fleet = _sums(per_model.with_columns(pl.lit("fleet").alias("_all")), ["_all"]).drop("_all")
    return WindowStates(jobs=jobs, teams=teams.sort(TEAM_KEYS),
                        fleet=fleet.row(0, named=True) if fleet.height else {"data_gpu_h": 0.0, "data_cost": 0.0, **{f"{s}_{u}": None for s in STATES for u in ("gpu_h", "cost")}})


def _known_sums(by_model: pl.DataFrame) -> pl.DataFrame:
    """Per team and model (a price each, taken after: the rows are the window's jobs, the groups a handful): data seconds,
    and each state's seconds over the jobs that know it, whether any does, and whether any of those has time in it."""
    aggs = [pl.sum("data_s"), (pl.col("data_s") > 0).any().alias("data_any")]
    for s in STATES:
        known = ~pl.col(f"{s}_unknown") & pl.col(f"{s}_s").is_not_null()
        aggs += [pl.col(f"{s}_s").filter(known).sum(), known.any().alias(f"{s}_known"), (known & (pl.col(f"{s}_s") > 0)).any().alias(f"{s}_any")]
    return by_model.group_by([*TEAM_KEYS, "model"]).agg(aggs)


def _sums(per_model: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Each state's GPU-hours (None where every job's is unknown) and cost over `keys`, and data_cost (the
    goodput waterfall's team prices), from _known_sums' rows; a cost is None where a model with time in it has no price."""
    unpriced = pl.col("usd_per_gpu_hour").is_null()
    aggs = [(pl.sum("data_s") / 3600).alias("data_gpu_h"),
            pl.when((pl.col("data_any") & unpriced).any()).then(None).otherwise((pl.col("data_s") / 3600 * pl.col("usd_per_gpu_hour")).sum())
            .alias("data_cost")]
    for s in STATES:
        unknown = ~pl.col(f"{s}_known").any()
        aggs += [pl.when(unknown).then(None).otherwise(pl.col(f"{s}_s").sum() / 3600).alias(f"{s}_gpu_h"),
                 pl.when(unknown | (pl.col(f"{s}_any") & unpriced).any()).then(None)
                 .otherwise((pl.col(f"{s}_s") / 3600 * pl.col("usd_per_gpu_hour")).sum()).alias(f"{s}_cost")]
    return per_model.group_by(keys).agg(aggs)


def _with_largest_loss(jobs: pl.DataFrame) -> pl.DataFrame:
    """Each job's largest loss (the loss state with the most time; None: none) and its share (%) of its time with data."""
    cols = [f"{s}_gpu_h" for s in WINDOW_LOSSES]
    if jobs.is_empty():
        return jobs.with_columns(pl.lit(None, pl.String).alias("largest_loss"), pl.lit(None, pl.Float64).alias("largest_loss_share_pct"))
    most = pl.max_horizontal([pl.col(c).fill_null(0.0) for c in cols])
    pick = pl.coalesce([pl.when((pl.col(c).fill_null(0.0) == most) & (most > 0)).then(pl.lit(s)) for s, c in zip(WINDOW_LOSSES, cols)])
    return jobs.with_columns(pick.alias("largest_loss"),
                             pl.when((most > 0) & (pl.col("data_gpu_h") > 0)).then(100 * most / pl.col("data_gpu_h")).alias("largest_loss_share_pct"))
