"""The goodput waterfall (gpufleet.analytics.goodput, issue #54): capacity -> allocated -> with data ->
busy -> not lost to interruptions -> useful, fleet and per team, from the figures other functions give."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, strategies as st
from test_analytics_properties import CLUSTER, MAX_GAP, SETTINGS, at, batches, fleets, scratch

from gpufleet.analytics import goodput
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.fleet import Fleet

TOL = 1e-6


def T(h: int, m: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m)


def test_team_steps_by_hand():
    # 10 GPU-h allocated, 8 with data, 6 busy; 2 GPU-h lost (20 % of allocated) -> 4.8 not lost; MFU 0.4 on
    # half its GPU-hours -> at least 0.96 useful
    s = goodput.team_steps(10.0, 8.0, 6.0, 2.0, 0.4, 0.5)
    assert s == pytest.approx({"allocated": 10, "with_data": 8, "busy": 6, "not_lost": 4.8, "useful": 0.96})
    # the mapping saw more than accounting allocated: with data is capped at allocated, busy scaled with it
    assert goodput.team_steps(4.0, 8.0, 6.0, 0.0, None, 0.0) == pytest.approx(
        {"allocated": 4, "with_data": 4, "busy": 3, "not_lost": 3, "useful": None})
    # unknown stays unknown: no GPU count (allocated), a loss of unknown GPU count, no MFU
    assert goodput.team_steps(None, 8.0, 6.0, 0.0, 0.5, 1.0) == {"allocated": None, "with_data": None, "busy": None,
                                                                 "not_lost": None, "useful": None}
    assert goodput.team_steps(10.0, 8.0, 6.0, None, 0.5, 1.0)["not_lost"] is None
    # lost more than allocated (an upper bound counted from the start): nothing busy is left, never negative
    assert goodput.team_steps(1.0, 1.0, 1.0, 3.0, None, 0.0)["not_lost"] == 0.0


def test_waterfall_sums_teams_and_prices_the_steps():
    teams = {("c", "a"): goodput.team_steps(10.0, 8.0, 6.0, 2.0, 0.4, 0.5), ("c", "b"): goodput.team_steps(5.0, 5.0, 5.0, 0.0, None, 0.0)}
    w = goodput.waterfall(20.0, teams, 2.0)
    fleet = {r["step"]: (r["gpu_h"], r["cost"], r["unknown_teams"]) for r in w["fleet"]}
    assert fleet == {"capacity": (20.0, 40.0, 0), "allocated": (15.0, 30.0, 0), "with_data": (13.0, 26.0, 0), "busy": (11.0, 22.0, 0),
                     "not_lost": (pytest.approx(9.8), pytest.approx(19.6), 0), "useful": (pytest.approx(0.96), pytest.approx(1.92), 1)}
    assert goodput.waterfall(20.0, teams, None)["fleet"][0]["cost"] is None  # a GPU model without a price: money unknown
    rows = goodput.chart_rows(w["fleet"])
    assert [r["step"] for r in rows] == ["capacity", "allocated", "with data", "busy", "not lost to interruptions", "useful (MFU)"]
    assert rows[0]["dropped_gpu_h"] is None and rows[1]["dropped_gpu_h"] == 5.0


def test_store_waterfall_by_hand(tmp_path):
    """One H100 ($ from prices.csv) 10:00-14:00: team ml's job 1 holds it 10:00-12:00 at 100 % and dies of a
    node failure at 12:00 after a checkpoint at 11:30 (0.5 GPU-h lost, measured); team bio's job 2 holds it
    12:00-13:00 at 50 %; 13:00-14:00 nobody holds it."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(10), T(14), util=lambda t: 100.0 if t < T(12) else 50.0, procs=1)
    f.job("1", account="ml", user="ann", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-A")], state="NODE_FAIL", state_raw="NODE_FAIL")
    f.job("2", account="bio", user="bo", start=T(12), end=T(13), gpus=1, placements=[("n1", "GPU-A")], state="COMPLETED", exit_code="0:0")
    f.write()
    w = StoreWriter(tmp_path)
    from gpufleet.collector.schema import Batch
    w.commit(Batch(key="ck", checkpoints=[{"seen": T(11, 31), "cluster": "c1", "scheduler": "slurm", "job_key": "1",
                                           "saved_at": T(11, 30), "duration_s": 30.0}]))
    w.publish()
    w.close()
    con = f.reader()
    p = Params(T(10), T(14))
    a = Analysis(con, p, now=T(15))
    out = goodput.compute(a, con, p, as_of=T(15))
    price = out["usd_per_gpu_hour"]
    fleet = {r["step"]: r["gpu_h"] for r in out["fleet"]}
    assert [fleet[k] for k in ("capacity", "allocated", "with_data", "busy")] == pytest.approx([4, 3, 3, 2.5], abs=1e-3)
    # ml: busy 2 x (1 - 0.5 lost / 2 allocated) = 1.5; bio: 0.5, nothing lost
    teams = {r["account"]: r for r in out["teams"]}
    assert teams["ml"]["not_lost_gpu_h"] == pytest.approx(1.5, abs=1e-3) and teams["bio"]["not_lost_gpu_h"] == pytest.approx(0.5, abs=1e-3)
    assert fleet["not_lost"] == pytest.approx(2.0, abs=1e-3) and fleet["useful"] is None  # no MFU known: unknown, never 0
    assert not out["lost_is_upper_bound"] and price is not None and out["fleet"][0]["cost"] == pytest.approx(4 * price)


@SETTINGS
@given(fleets(), st.data())
def test_waterfall_invariants(fleet, data):
    """Each step at most the one before (allocated at most capacity unless the note says why); the
    teams add up to the fleet at every step after capacity; a step unknown for a team stays unknown."""
    states = ["COMPLETED", "NODE_FAIL", "PREEMPTED", "FAILED"]
    bs = batches(fleet)
    for row in bs[-1].jobs:
        if row["end"] is not None:
            row["state"] = row["state_raw"] = data.draw(st.sampled_from(states))
    ck = [{"seen": at(j["start"] + 1), "cluster": CLUSTER, "scheduler": "slurm", "job_key": j["key"], "saved_at": at(j["start"] + 1),
           "duration_s": None} for j in fleet["jobs"] if data.draw(st.booleans())]
    a0, b0 = fleet["cuts"][0], fleet["cuts"][2]
    with scratch() as root:
        w = StoreWriter(root)
        for b in bs + [replace(bs[-1], key="ck", jobs=[], allocations=[], checkpoints=ck)]:
            w.commit(b)
        w.publish()
        w.close()
        con = open_reader(root)
        p = Params(at(a0), at(b0), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
        an = Analysis(con, p, now=at(fleet["now"]))
        out = goodput.compute(an, con, p, as_of=at(fleet["now"]))
        totals = an.totals()
    # the teams' allocated GPU-hours are the fleet's (accounting's sum), capacity the inventory's
    assert out["fleet"][1]["gpu_h"] == pytest.approx(totals.allocated_gpu_h, abs=TOL) or out["fleet"][1]["unknown_teams"]
    assert out["fleet"][0]["gpu_h"] == totals.capacity_gpu_h
    steps = goodput.STEPS
    for row in [{f"{s}_gpu_h": r["gpu_h"] for s, r in zip(steps, out["fleet"])}] + out["teams"]:
        vals = [row.get(f"{s}_gpu_h") for s in steps]
        for i in range(2, len(steps)):  # (capacity is the fleet's alone: checked below)
            prev, cur = vals[i - 1], vals[i]
            assert cur is None or cur >= -TOL
            if prev is not None and cur is not None:
                assert cur <= prev + TOL, (steps[i], row)
    cap, alloc = out["fleet"][0]["gpu_h"], out["fleet"][1]["gpu_h"]
    assert alloc is None or alloc <= cap + TOL or out["notes"] and "exceeds capacity" in out["notes"][0]
    for i, s in enumerate(steps[1:], start=1):
        team_vals = [t[f"{s}_gpu_h"] for t in out["teams"]]
        fleet_row = out["fleet"][i]
        assert fleet_row["unknown_teams"] == sum(v is None for v in team_vals)
        known = [v for v in team_vals if v is not None]
        if known or not team_vals:
            assert fleet_row["gpu_h"] == pytest.approx(sum(known), abs=TOL)
        else:
            assert fleet_row["gpu_h"] is None
    assert all(t["useful_gpu_h"] is None for t in out["teams"])  # no job reported throughput or tensor activity
    assert not math.isnan(cap)


def test_teams_money_at_their_own_gpus_prices(tmp_path):
    """Two models at $4 (H100) and $1.5 (A100) a GPU-hour, 10:00-14:00: team ml's job holds the H100
    10:00-12:00 at 100 %, team bio's the A100 10:00-13:00 at 50 %. Each team's GPU-hours cost its
    own GPUs' price (not the fleet's mean, $2.75); the fleet's steps are the teams' money summed."""
    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(10), T(14), util=100.0, procs=1, model=h100)
    f.gpu_series("n2", "GPU-B", T(10), T(14), util=50.0, procs=1, model=a100)
    f.job("1", account="ml", user="ann", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-A")], state="COMPLETED", exit_code="0:0")
    f.job("2", account="bio", user="bo", start=T(10), end=T(13), gpus=1, placements=[("n2", "GPU-B")], state="COMPLETED", exit_code="0:0")
    f.write()
    con = f.reader()
    p = Params(T(10), T(14), prices={h100: 4.0, a100: 1.5})
    out = goodput.compute(Analysis(con, p, now=T(15)), con, p, as_of=T(15))
    teams = {r["account"]: r for r in out["teams"]}
    assert teams["ml"]["usd_per_gpu_hour"] == pytest.approx(4.0) and teams["bio"]["usd_per_gpu_hour"] == pytest.approx(1.5)
    assert teams["ml"]["allocated_cost"] == pytest.approx(2 * 4.0, abs=1e-3) and teams["bio"]["allocated_cost"] == pytest.approx(3 * 1.5, abs=1e-3)
    assert teams["ml"]["busy_cost"] == pytest.approx(2 * 4.0, abs=1e-3) and teams["bio"]["busy_cost"] == pytest.approx(1.5 * 1.5, abs=1e-3)
    fleet = {r["step"]: r["cost"] for r in out["fleet"]}
    assert fleet["capacity"] == pytest.approx(4 * 4.0 + 4 * 1.5)  # capacity at the fleet's capacity-weighted price ($2.75)
    assert fleet["allocated"] == pytest.approx(8.0 + 4.5, abs=1e-3)  # not 5 GPU-h x $2.75 = 13.75
    assert fleet["busy"] == pytest.approx(8.0 + 2.25, abs=1e-3)
    assert out["prices_differ"] and out["usd_per_gpu_hour"] == pytest.approx(2.75)


def test_team_price_unknown_where_a_gpu_it_held_has_none():
    import polars as pl

    # window_states' teams: ml's 2 GPU-h with data at $4; bio's 2, one of them on a GPU with no price
    held = pl.DataFrame({"cluster": ["c", "c"], "account": ["ml", "bio"], "data_gpu_h": [2.0, 2.0], "data_cost": [8.0, None]})
    got = goodput.team_prices(held, [("c", "ml"), ("c", "bio"), ("c", "ops")], None, True)
    assert got == {("c", "ml"): 4.0, ("c", "bio"): None, ("c", "ops"): None}
    # one price fleet-wide: a team with no time with data pays it
    assert goodput.team_prices(held.head(1), [("c", "ml"), ("c", "ops")], 4.0, False) == {("c", "ml"): 4.0, ("c", "ops"): 4.0}


def test_a_teams_price_weights_are_the_teams_pages_hours(tmp_path):
    """Team ml holds an H100 ($4) 10:00-12:00 and an A100 ($1.5) 10:00-11:00 with data, and an A100
    12:00-13:00 with none (the exporter down): its price is its time with data by GPU price, (2 x 4
    + 1 x 1.5) / 3, the same hours as the Teams page's (window_states' teams), not the mapping's 4
    held hours ((2 x 4 + 2 x 1.5) / 4)."""
    from gpufleet.analytics.states import Thresholds
    from gpufleet.analytics.window_states import window_states

    h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(10), T(12), util=100.0, procs=1, model=h100)
    f.gpu_series("n2", "GPU-B", T(10), T(11), util=50.0, procs=1, model=a100)
    f.gpu_series("n3", "GPU-C", T(10), T(11), util=50.0, procs=1, model=a100)
    f.job("1", account="ml", user="ann", start=T(10), end=T(12), gpus=2, placements=[("n1", "GPU-A"), ("n2", "GPU-B")],
          state="COMPLETED", exit_code="0:0")
    f.job("2", account="ml", user="ann", start=T(12), end=T(13), gpus=1, placements=[("n3", "GPU-C")], state="COMPLETED", exit_code="0:0")
    f.write()
    con = f.reader()
    p = Params(T(10), T(14), prices={h100: 4.0, a100: 1.5})
    a = Analysis(con, p, now=T(15))
    ws = window_states(a, Thresholds.of(p, {}))
    ml = ws.teams.row(0, named=True)
    assert ml["data_gpu_h"] == pytest.approx(3.0, abs=0.01) and ml["data_cost"] == pytest.approx(9.5, abs=0.05)  # (a sample's 15 s)
    out = goodput.compute(a, con, p, as_of=T(15), states=ws)
    assert out["teams"][0]["usd_per_gpu_hour"] == pytest.approx(ml["data_cost"] / ml["data_gpu_h"], rel=1e-12)
    assert out["teams"][0]["usd_per_gpu_hour"] == pytest.approx(9.5 / 3, abs=0.01)
    # without the states handed in, compute reads the same ones
    again = goodput.compute(Analysis(con, p, now=T(15)), con, p, as_of=T(15))
    assert again["teams"][0]["usd_per_gpu_hour"] == pytest.approx(out["teams"][0]["usd_per_gpu_hour"], rel=1e-12)
