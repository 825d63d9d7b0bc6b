"""The goodput waterfall (issue #54): where a window's GPU capacity went, fleet and per team, in GPU-hours and money.

capacity -> allocated -> with data -> busy -> not lost to interruptions -> useful, each step from figures other functions give
(core.Analysis totals and utilization by account, the reliability figures' lost GPU-hours, mfu.account_mfu), with no path of
its own over samples. Each step is a choice:

- capacity: GPU-hours the inventory had (the fleet's only: nobody owns unallocated time);
- allocated: the jobs' GPU-hours from scheduler accounting (the known GPU counts);
- with data: of it, the time the job mapping saw the jobs' GPUs with samples, at most allocated (time seen beyond
  accounting's GPU count is not allocated time);
- busy: utilization-weighted time with data (scaled with it where with data was capped);
- not lost to interruptions: busy x (1 - lost / allocated), at the team's own utilization (lost from each interruption's last
  reported checkpoint, else its start: then an upper bound, and this step a lower bound);
- useful: not lost x MFU (model FLOPs over the GPUs' dense peak) over the team's jobs whose MFU is known (where that is part
  of its GPU-hours, that part: at least).

A team is a (cluster, account). The fleet's steps after capacity are its teams' sums, so the teams add up to the fleet; a
team's unknown step stays unknown and makes the fleet's a lower bound (`unknown_teams`). Money: a team's GPU-hours at its own
GPUs' prices, weighted by its time with data on each as the Teams page has it (team_prices; window_states' teams), so a team
on H100s costs H100 prices; the fleet's steps after capacity are its teams' money summed, capacity at the fleet's
capacity-weighted price (`prices_differ`: an average). Unknown where a GPU it counts has no price (a team with no mapped GPU
seen: the fleet's price where all GPUs have one, else unknown).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

import polars as pl

STEPS = ("capacity", "allocated", "with_data", "busy", "not_lost", "useful")
STEP_LABELS = {"capacity": "capacity", "allocated": "allocated", "with_data": "with data", "busy": "busy",
               "not_lost": "not lost to interruptions", "useful": "useful (MFU)"}
SCHEMA = "gpufleet.goodput/v1"
Team = tuple[str, "str | None"]


def team_steps(allocated: float | None, data: float, busy: float, lost: float | None,
               mfu: float | None, mfu_share: float) -> dict[str, float | None]:
    """One team's steps after capacity (module docstring), in GPU-hours; None where unknown.
    `mfu_share`: the share (0-1) of its jobs' GPU-hours whose MFU is known."""
    with_data = min(data, allocated) if allocated is not None else None
    busy_step = busy * (with_data / data) if with_data is not None and data > 0 else (0.0 if with_data is not None else None)
    not_lost = None
    if busy_step is not None and lost is not None and allocated is not None:
        not_lost = busy_step * (1 - min(1.0, lost / allocated)) if allocated > 0 else busy_step
    useful = not_lost * mfu_share * min(1.0, mfu) if not_lost is not None and mfu is not None and mfu_share > 0 else None
    return {"allocated": allocated, "with_data": with_data, "busy": busy_step, "not_lost": not_lost, "useful": useful}


def _priced(h: float | None, price: float | None) -> float | None:
    return None if h is None or price is None else h * price


def waterfall(capacity: float | None, teams: Mapping[Team, Mapping[str, float | None]], price: float | None,
              prices_differ: bool = False, team_price: Mapping[Team, float | None] | None = None) -> dict[str, Any]:
    """The fleet's waterfall from its capacity and its teams' steps (team_steps): capacity's money
    at the fleet's `price` $/GPU-hour, each team's at its own (`team_price`; default: `price`), the
    fleet's steps after capacity the teams' money summed (None: unknown, where a team's is)."""
    prices = {t: (price if team_price is None else team_price.get(t)) for t in teams}
    fleet: list[dict[str, Any]] = [{"step": "capacity", "label": STEP_LABELS["capacity"], "gpu_h": capacity,
                                    "cost": _priced(capacity, price), "unknown_teams": 0}]
    for step in STEPS[1:]:
        known = {t: v[step] for t, v in teams.items() if v[step] is not None}
        unknown = len(teams) - len(known)
        h = sum(known.values()) if known or not teams else None
        costs = [_priced(v, prices[t]) for t, v in known.items()]
        cost = None if h is None or any(c is None for c in costs) or (not teams and price is None) else sum(costs)
        fleet.append({"step": step, "label": STEP_LABELS[step], "gpu_h": h, "cost": cost, "unknown_teams": unknown})
    rows = [{"cluster": c, "account": acct, **{f"{k}_gpu_h": v for k, v in t.items()},
             **{f"{k}_cost": _priced(v, prices[(c, acct)]) for k, v in t.items()}, "usd_per_gpu_hour": prices[(c, acct)]}
            for (c, acct), t in sorted(teams.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
    return {"schema": SCHEMA, "fleet": fleet, "teams": rows, "usd_per_gpu_hour": price, "prices_differ": prices_differ}


def team_prices(held: pl.DataFrame, teams: Sequence[Team], fleet: float | None, prices_differ: bool) -> dict[Team, float | None]:
    """Each team's $/GPU-hour: its time with data priced at its GPUs' prices over that time (`held`:
    window_states' teams, data_gpu_h and data_cost); None where a GPU it held has no price. A team
    with no time with data pays `fleet` where every GPU has that one price."""
    out: dict[Team, float | None] = {t: (fleet if not prices_differ else None) for t in teams}
    for r in held.iter_rows(named=True):
        if r["data_gpu_h"] > 0:
            out[(r["cluster"], r["account"])] = None if r["data_cost"] is None else r["data_cost"] / r["data_gpu_h"]
    return out


def fleet_price(per_gpu: pl.DataFrame) -> tuple[float | None, bool]:
    """The fleet's $/GPU-hour weighted by capacity over its GPUs (core.Analysis.per_gpu), and whether
    its GPUs' prices differ; None when a GPU with capacity has no price (or there is none)."""
    if per_gpu.is_empty() or per_gpu["capacity_gpu_h"].sum() <= 0:
        return None, False
    held = per_gpu.filter(pl.col("capacity_gpu_h") > 0)
    if held["usd_per_gpu_hour"].null_count():
        return None, False
    price = float((held["capacity_gpu_h"] * held["usd_per_gpu_hour"]).sum() / held["capacity_gpu_h"].sum())
    return price, held["usd_per_gpu_hour"].n_unique() > 1


def compute(a: Any, con: Any, params: Any, reliability_settings: Any = None, as_of: datetime | None = None,
            mfu_jobs: pl.DataFrame | None = None, states: Any = None, reliability_read: Any = None) -> dict[str, Any]:
    """The window's goodput waterfall (schema SCHEMA) from an unfiltered core.Analysis `a` over `con` and `params`. Passed
    where the caller has them: `reliability_read` (reliability_store.read's), `mfu_jobs` (mfu.job_mfu's rows), `states`
    (window_states.window_states of `a`)."""
    from gpufleet.analytics import mfu, reliability, reliability_store
    from gpufleet.analytics.core import capacity_warnings
    from gpufleet.analytics.states import Thresholds
    from gpufleet.analytics.window_states import window_states

    s = reliability_settings or reliability.Settings()
    totals = a.totals()
    util = a.utilization("account")
    lost = reliability_store.lost_by_team(con, params, s, as_of, done=reliability_read)
    acct_mfu = mfu.account_mfu(a, mfu_jobs)
    mfus = {(r["cluster"], r["account"]): r for r in acct_mfu.iter_rows(named=True)}
    rows = {(r["cluster"], r["account"]): r for r in util.iter_rows(named=True)}
    teams: dict[Team, dict[str, float | None]] = {}
    for team in sorted(rows.keys() | lost.keys(), key=lambda t: (t[0], t[1] or "")):
        r = rows.get(team) or {"allocated_gpu_h": None, "data_gpu_h": 0.0, "busy_gpu_h": 0.0}  # (accounting lacks it)
        m = mfus.get(team)
        share = 0.0
        if m is not None and m["mfu"] is not None and m["gpu_h"]:
            share = max(0.0, (m["gpu_h"] - (m["unknown_gpu_h"] or 0.0)) / m["gpu_h"])
        teams[team] = team_steps(r["allocated_gpu_h"], r["data_gpu_h"] or 0.0, r["busy_gpu_h"] or 0.0,
                                 lost.get(team, (0.0, True))[0], None if m is None else m["mfu"], share)
    per_gpu = a.per_gpu()
    price, differ = fleet_price(per_gpu)
    held = (states if states is not None else window_states(a, Thresholds.of(params, {}))).teams  # (thresholds split states, not data)
    out = waterfall(totals.capacity_gpu_h, teams, price, differ, team_prices(held, list(teams), price, differ))
    # lost counted from an attempt's start (its job reported no checkpoint): "not lost" is then a lower bound
    out["lost_is_upper_bound"] = any(not measured for _, measured in lost.values())
    out["notes"] = capacity_warnings(totals)
    if differ:
        out["notes"].append("capacity's money at the fleet's mean price per GPU-hour (capacity-weighted: its GPU models' prices "
                            "differ); each team's at the prices of the GPUs it held")
    return out


def chart_rows(fleet: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The fleet's steps as a waterfall chart draws them: each step's bar, and what went between it
    and the one before (None where either is unknown)."""
    out, prev = [], None
    for r in fleet:
        out.append({"step": r["label"], "gpu_h": r["gpu_h"], "cost": r["cost"],
                    "dropped_gpu_h": None if prev is None or r["gpu_h"] is None else prev - r["gpu_h"]})
        prev = r["gpu_h"]
    return out
