"""Golden scenario for the core figures, with every expected number worked out by hand below.

Window W = [10:00, 12:00) on 2026-11-16; max_gap 30 s; idle threshold 5 %; idle minimum 30 min.
Samples every 15 s. Prices (analytics/data/prices.csv): H100 $3.00, A100-SXM4-80GB $1.80.

GPU   host gpu model        samples (util)                                   holders
A     n1   0   H100         09:00-13:00: 80, but 0 in [10:30, 11:15)        job 101 physics/alice [10:30, 11:30)
B     n1   1   H100         10:00-10:30 and 11:00-12:00: 50 (a 30 min gap)   -
C     n2   1   H100         10:00-12:00: 0, no compute process              job 103 physics/carol [10:00, 11:00)
D     n2   0   H100         09:00-12:00: 0 until 10:40, then 80             job 104 biology/bob [09:00, 10:40) (crosses W's start)
F/1   n4   0   A100 MIG 3g  10:00-12:00: 60 (engine active 0.6)             pod ml/p1 [10:00, 12:00)
F/2   n4   0   A100 MIG 3g  10:00-12:00: 0                                   pod ml/p2 [10:00, 11:00)  (one MIG GPU, two pods)
G1    n5   0   H100         10:00-12:00: 90                                  job 106 physics/alice, 2 GPUs on n5+n6 [10:00, 12:00)
G2    n6   0   H100         10:00-12:00: 90                                  (multi-node)
H1    n7   0   H100         10:00-12:00: 0                                   array 200_1 (key 201) [10:00, 10:45), 200_2 (202) [10:45, 11:15)
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from tests.support.fleet import Fleet

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
MIG = 3 / 7  # a 3g.40gb instance is 3 of the A100's 7 compute slices


def T(h: int, m: int = 0, s: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m, s)


def between(a, b, inside, outside):
    return lambda t: inside if a <= t < b else outside


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return build_golden(tmp_path_factory.mktemp("golden"))


def build_golden(root) -> Fleet:
    """The scenario of this file's docstring, written into a store at `root`."""
    f = Fleet(root)
    f.gpu_series("n1", "GPU-A", T(9), T(13), util=between(T(10, 30), T(11, 15), 0.0, 80.0))
    f.gpu_series("n1", "GPU-B", T(10), T(10, 30), util=50.0, gpu=1)
    f.gpu_series("n1", "GPU-B", T(11), T(12), util=50.0, gpu=1)
    f.gpu_series("n2", "GPU-C", T(10), T(12), util=0.0, procs=0, gpu=1)
    f.gpu_series("n2", "GPU-D", T(9), T(12), util=between(T(9), T(10, 40), 0.0, 80.0))
    f.gpu_series("n4", "GPU-F", T(10), T(12), util=60.0, model=A100, gi=1, mig_profile="3g.40gb")
    f.gpu_series("n4", "GPU-F", T(10), T(12), util=0.0, model=A100, gi=2, mig_profile="3g.40gb")
    f.gpu_series("n5", "GPU-G1", T(10), T(12), util=90.0)
    f.gpu_series("n6", "GPU-G2", T(10), T(12), util=90.0)
    f.gpu_series("n7", "GPU-H1", T(10), T(12), util=0.0)
    f.job("101", account="physics", user="alice", start=T(10, 30), end=T(11, 30), gpus=1, placements=[("n1", "GPU-A")])
    f.job("103", account="physics", user="carol", start=T(10), end=T(11), gpus=1, placements=[("n2", "GPU-C")])
    f.job("104", account="biology", user="bob", start=T(9), end=T(10, 40), gpus=1, placements=[("n2", "GPU-D")])
    f.job("ml/p1", account="ml", user="", start=T(10), end=T(12), gpus=1, gpu_type="mig-3g.40gb", scheduler="kubernetes",
          partition="ml", job_id="p1", placements=[("n4", "GPU-F", 1)])
    f.job("ml/p2", account="ml", user="", start=T(10), end=T(11), gpus=1, gpu_type="mig-3g.40gb", scheduler="kubernetes",
          partition="ml", job_id="p2", placements=[("n4", "GPU-F", 2)])
    f.job("106", account="physics", user="alice", start=T(10), end=T(12), gpus=2, placements=[("n5", "GPU-G1"), ("n6", "GPU-G2")])
    f.job("201", job_id="200_1", account="biology", user="erin", start=T(10), end=T(10, 45), gpus=1, placements=[("n7", "GPU-H1")])
    f.job("202", job_id="200_2", account="biology", user="erin", start=T(10, 45), end=T(11, 15), gpus=1, placements=[("n7", "GPU-H1")])
    f.write()
    return f


@pytest.fixture(scope="module")
def a(fleet):
    return Analysis(fleet.reader(), Params(T(10), T(12)), now=T(20))


# GPU B: samples 10:00:00..10:29:45, the last holds 30 s (max_gap) to 10:30:15 -> 1815 s;
# then 11:00:00..11:59:45, the last clipped at W's end 12:00 -> 3600 s. Data 5415 s of 7200.
B_DATA_S = 1815 + 3600


def test_per_gpu_data_no_data_and_busy(a):
    g = {(r["host"], r["gpu_uuid"], r["gi"]): r for r in a.per_gpu().to_dicts()}
    b = g[("n1", "GPU-B", -1)]
    assert b["capacity_gpu_h"] == pytest.approx(2.0)
    assert b["data_gpu_h"] == pytest.approx(B_DATA_S / 3600)
    assert b["no_data_gpu_h"] == pytest.approx((7200 - B_DATA_S) / 3600)  # the gap: never idle, never busy
    assert b["busy_gpu_h"] == pytest.approx(0.5 * B_DATA_S / 3600)
    # A: 80 % for 120 - 45 = 75 min
    assert g[("n1", "GPU-A", -1)]["busy_gpu_h"] == pytest.approx(0.8 * 75 / 60)
    # D: 80 % from 10:40 to 12:00 = 80 min
    assert g[("n2", "GPU-D", -1)]["busy_gpu_h"] == pytest.approx(0.8 * 80 / 60)
    # each MIG instance is 3/7 of a GPU: 2 h x 3/7 capacity, busy 0.6 x that for instance 1
    assert g[("n4", "GPU-F", 1)]["capacity_gpu_h"] == pytest.approx(2 * MIG)
    assert g[("n4", "GPU-F", 1)]["busy_gpu_h"] == pytest.approx(0.6 * 2 * MIG)


CAPACITY = 7 * 2.0 + 2 * 2 * MIG  # A B C D G1 G2 H1 whole, F's two 3/7 instances
DATA = CAPACITY - (7200 - B_DATA_S) / 3600
BUSY = 0.8 * 75 / 60 + 0.5 * B_DATA_S / 3600 + 0.8 * 80 / 60 + 0.6 * 2 * MIG + 2 * 0.9 * 2
# accounting: 101 1h; 103 1h; 104 10:00-10:40 (clipped) 40 min; p1 2h x 3/7; p2 1h x 3/7;
# 106 2 GPUs x 2 h; 201 45 min; 202 30 min
ALLOCATED = 1 + 1 + 40 / 60 + 2 * MIG + 1 * MIG + 4 + 0.75 + 0.5
# idle stretches >= 30 min: 101 45 min; 103 1 h; 104 09:00-10:40 is 100 min long, 40 of it in W;
# p2 1 h x 3/7; 201 45 min; 202 30 min (exactly the minimum counts)
IDLE = 0.75 + 1 + 40 / 60 + MIG + 0.75 + 0.5
IDLE_COST = 0.75 * 3 + 1 * 3 + 40 / 60 * 3 + MIG * 1.80 + 0.75 * 3 + 0.5 * 3
# stranded = data time no job held: A 1 h, B all of its data, C 1 h, D 2 h - 40 min, F/2 1 h x 3/7, H1 2 h - 75 min
STRANDED = 1 + B_DATA_S / 3600 + 1 + (2 - 40 / 60) + MIG + 0.75
STRANDED_COST = (1 + B_DATA_S / 3600 + 1 + (2 - 40 / 60) + 0.75) * 3 + MIG * 1.80


def test_totals(a):
    t = a.totals()
    assert t.capacity_gpu_h == pytest.approx(CAPACITY)
    assert t.data_gpu_h == pytest.approx(DATA)
    assert t.no_data_gpu_h == pytest.approx(CAPACITY - DATA)
    assert t.busy_gpu_h == pytest.approx(BUSY)
    assert t.utilization_pct == pytest.approx(BUSY / DATA * 100)
    assert t.allocated_gpu_h == pytest.approx(ALLOCATED)
    assert t.idle_allocated_gpu_h == pytest.approx(IDLE)
    assert t.idle_allocated_cost == pytest.approx(IDLE_COST)
    assert t.no_process_gpu_h == pytest.approx(1.0)  # only GPU C reports process counts: job 103's hour
    assert t.no_process_cost == pytest.approx(3.0)
    assert t.stranded_gpu_h == pytest.approx(STRANDED)
    assert t.stranded_cost == pytest.approx(STRANDED_COST)
    assert t.unpriced_models == ()
    assert t.idle_allocated_gpu_h <= t.allocated_gpu_h <= t.capacity_gpu_h


def test_utilization_by_account(a):
    u = {r["account"]: r for r in a.utilization("account").to_dicts()}
    # physics: 101 (1 h, busy 0.8 x 15 min), 103 (1 h, 0), 106 (4 h, 0.9 x 4 h)
    assert u["physics"]["allocated_gpu_h"] == pytest.approx(6.0)
    assert u["physics"]["busy_gpu_h"] == pytest.approx(0.8 * 0.25 + 3.6)
    assert u["physics"]["utilization_pct"] == pytest.approx((0.2 + 3.6) / 6 * 100)
    # biology: 104's 40 min in W, 201 45 min, 202 30 min, all at 0 %
    assert u["biology"]["allocated_gpu_h"] == pytest.approx(40 / 60 + 0.75 + 0.5)
    assert u["biology"]["utilization_pct"] == pytest.approx(0.0)
    # ml: p1 2 h x 3/7 at 60 %, p2 1 h x 3/7 at 0 %
    assert u["ml"]["allocated_gpu_h"] == pytest.approx(3 * MIG)
    assert u["ml"]["utilization_pct"] == pytest.approx(0.6 * 2 * MIG / (3 * MIG) * 100)


def test_utilization_by_other_dimensions_add_up(a):
    fleet = a.utilization("fleet").to_dicts()[0]
    assert fleet["busy_gpu_h"] == pytest.approx(BUSY)
    for dim in ("host", "model", "cluster", "gpu"):
        assert a.utilization(dim)["busy_gpu_h"].sum() == pytest.approx(BUSY), dim
    hosts = {r["host"]: r for r in a.utilization("host").to_dicts()}
    assert hosts["n1"]["no_data_gpu_h"] == pytest.approx((7200 - B_DATA_S) / 3600)
    users = {r["user_name"]: r for r in a.utilization("user_name").to_dicts()}
    assert users["alice"]["allocated_gpu_h"] == pytest.approx(1 + 4)  # 101 and multi-node 106
    jobs = {r["job_id"]: r for r in a.utilization("job").to_dicts()}
    assert jobs["106"]["busy_gpu_h"] == pytest.approx(2 * 2 * 0.9)
    assert jobs["200_2"]["allocated_gpu_h"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown dimension 'rack'"):
        a.utilization("rack")


def test_idle_stretches_and_worst_jobs(a):
    s = a.idle_stretches("idle")
    by_job = {r["job_id"]: r for r in s.to_dicts()}
    # judged beyond W's start: the analysis looks back idle minimum + max_gap (30 min 30 s), which
    # is all it needs to decide, so the stretch is seen from 09:29:30
    assert by_job["104"]["s0"] == T(9, 29, 30) and by_job["104"]["s1"] == T(10, 40)
    assert by_job["104"]["gpu_h"] == pytest.approx(40 / 60)  # counted inside W only
    assert by_job["p2"]["gpu_h"] == pytest.approx(MIG)
    assert by_job["p2"]["cost"] == pytest.approx(MIG * 1.80)
    assert "p1" not in by_job and "106" not in by_job
    top = a.top_wasteful_jobs(3).to_dicts()
    # 103 (1 h), then 101 and 200_1 tie at 0.75 h and $2.25: job_key breaks the tie
    assert [(r["job_id"], round(r["idle_gpu_h"], 6)) for r in top] == [("103", 1.0), ("101", 0.75), ("200_1", 0.75)]
    assert top[0]["idle_cost"] == pytest.approx(3.0) and top[0]["user_name"] == "carol"
    nop = a.idle_stretches("no_process")
    assert nop["job_id"].to_list() == ["103"]


def test_idle_stretch_crossing_the_window_start_counts_when_whole_is_long_enough(fleet):
    # W' = [10:20, 12:00): 104's idle stretch has only 20 min inside W', but is 100 min long
    a2 = Analysis(fleet.reader(), Params(T(10, 20), T(12)), now=T(20))
    by_job = {r["job_id"]: r["gpu_h"] for r in a2.idle_stretches().to_dicts()}
    assert by_job["104"] == pytest.approx(20 / 60)


def test_split_window_adds_up(fleet):
    whole = Analysis(fleet.reader(), Params(T(10), T(12)), now=T(20)).totals()
    halves = [Analysis(fleet.reader(), Params(lo, hi), now=T(20)).totals() for lo, hi in ((T(10), T(11)), (T(11), T(12)))]
    for field in ("capacity_gpu_h", "data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "idle_allocated_gpu_h", "no_process_gpu_h", "stranded_gpu_h"):
        assert sum(getattr(h, field) for h in halves) == pytest.approx(getattr(whole, field)), field


def test_filters_narrow_to_an_account_and_a_model(fleet):
    from gpufleet.analytics.params import Filters

    bio = Analysis(fleet.reader(), Params(T(10), T(12), filters=Filters(account="biology")), now=T(20)).totals()
    assert bio.allocated_gpu_h == pytest.approx(40 / 60 + 0.75 + 0.5)
    assert bio.idle_allocated_gpu_h == pytest.approx(40 / 60 + 0.75 + 0.5)
    a100 = Analysis(fleet.reader(), Params(T(10), T(12), filters=Filters(model=A100)), now=T(20)).totals()
    assert a100.capacity_gpu_h == pytest.approx(2 * 2 * MIG)


def test_unknown_model_keeps_hours_but_money_is_unknown(tmp_path):
    f = Fleet(tmp_path)
    f.gpu_series("z1", "GPU-Z", T(10), T(12), util=0.0, model="NVIDIA Z9000")
    f.job("900", account="physics", user="zed", start=T(10), end=T(11), gpus=1, placements=[("z1", "GPU-Z")])
    f.write()
    t = Analysis(f.reader(), Params(T(10), T(12)), now=T(20)).totals()
    assert t.idle_allocated_gpu_h == pytest.approx(1.0)
    assert t.idle_allocated_cost is None and t.stranded_cost is None
    assert t.unpriced_models == ("NVIDIA Z9000",)
    # a configured price makes it known
    t2 = Analysis(f.reader(), Params(T(10), T(12), prices={"NVIDIA Z9000": 10.0}), now=T(20)).totals()
    assert t2.idle_allocated_cost == pytest.approx(10.0)


def test_running_job_counts_until_now_not_the_future(tmp_path):
    f = Fleet(tmp_path)
    f.gpu_series("r1", "GPU-R", T(10), T(11), util=90.0)
    f.job("950", account="physics", user="ruth", start=T(10), end=None, gpus=4, placements=[("r1", "GPU-R")])
    f.write()
    # the window runs to 12:00 but "now" is 11:00: 4 GPUs x 1 h, not 2 h
    t = Analysis(f.reader(), Params(T(10), T(12)), now=T(11)).totals()
    assert t.allocated_gpu_h == pytest.approx(4.0)


def test_empty_store_gives_zeros_and_unknown_utilization(tmp_path):
    f = Fleet(tmp_path)
    f.write()
    a = Analysis(f.reader(), Params(T(10), T(12)), now=T(20))
    t = a.totals()
    assert (t.capacity_gpu_h, t.data_gpu_h, t.allocated_gpu_h, t.idle_allocated_gpu_h) == (0, 0, 0, 0)
    assert t.utilization_pct is None
    assert a.utilization("account").is_empty()
    assert a.top_wasteful_jobs().is_empty()


def test_allocation_rows_read_for_some_positions_are_those_of_the_whole_table(a):
    """alv is held as numbers and al's text read for the rows a figure names: any positions, in
    any order and repeated, give the rows of the whole table at them."""
    whole = a.allocation_use()
    assert whole.height == a.con.execute("SELECT count(*) FROM al").fetchall()[0][0] == 9
    rows = [7, 0, 3, 3, 8, 1]
    assert a._allocations(np.array(rows)).equals(whole[rows])
    assert a._allocations(np.array([], dtype=np.int64)).equals(whole.clear())
