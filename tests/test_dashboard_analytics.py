"""The analytics the dashboards added: the fleet at a moment (analytics/fleet_now.py), GPU
health over a window (analytics/health.py) and utilization over time (analytics/timeline.py).

Scenario (also used by tests/test_dashboard_pages.py), window W = [10:00, 12:00) on 2026-11-16,
samples every 15 s, H100 $3.00/GPU-h and A100-SXM4-80GB $1.80/GPU-h (analytics/data/prices.csv):

GPU    host gpu model  samples                                         holder
A      n1   0   H100   10:00-12:00: 80 %, 1 process, 40 GiB used       job 101 physics/alice [10:00, 13:00)
B      n1   1   H100   10:00-12:00: 0 %, no process                    job 102 biology/bob [10:00, running)
C      n2   0   H100   10:00-11:00: 50 % (exporter silent after)       job 103 physics/carol [10:00, 11:30)
D      n2   1   H100   60 % to 10:40, then lost (gpu_up 0, no util);   -
                       XID 79 and 2 double-bit ECC errors from 10:30;
                       85 °C with HW thermal slowdown 10:10-10:20
E      n3   0   A100   10:00-12:00: 30 %, 1 process                    job 105 'acct"quote'' / eve [10:00, running)
F/1    n4   0   A100   MIG 3g.40gb 10:00-12:00: 60 %                   pod ml/p1 [10:00, 13:00)
Job names are hostile on purpose: HTML, SQL, pipes, newlines and Markdown.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.analytics import fleet_now as fn
from gpufleet.analytics import health, timeline
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.collector.facts import FactParams
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.fleet import Fleet
from tests.test_analytics_properties import MAX_GAP, SETTINGS, at, fleets, scratch
from tests.test_analytics_properties import build as build_store
from tests.support.random_stores import mig_some
from tests.support.raw_analysis import RawAnalysis

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
MIG = 3 / 7

HOSTILE = {
    "101": '<script>alert("pwned")</script><img src=x onerror=alert(1)>',
    "102": "'; DROP TABLE jobs; --",
    "103": "a|b|c\nsecond line\twith a tab",
    "105": "| pipe | table |\n# heading **bold** [link](javascript:alert(1))",
}
EVE = "eve **bold** <b>x</b>"
QUOTE_ACCOUNT = "acct\"quote'"


def T(h: int, m: int = 0, s: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m, s)


def build(root) -> Fleet:
    f = Fleet(root)
    f.gpu_series("n1", "GPU-A", T(10), T(12), util=80.0, procs=1, fb_used=40960.0)
    f.gpu_series("n1", "GPU-B", T(10), T(12), util=0.0, procs=0, gpu=1)
    f.gpu_series("n2", "GPU-C", T(10), T(11), util=50.0, procs=1)
    f.gpu_series("n2", "GPU-D", T(10), T(12), util=lambda t: 60.0 if t < T(10, 40) else None, gpu=1)
    f.gpu_series("n3", "GPU-E", T(10), T(12), util=30.0, procs=1, model=A100)
    f.gpu_series("n4", "GPU-F", T(10), T(12), util=60.0, model=A100, gi=1, mig_profile="3g.40gb")
    for s in f._samples:  # health fields, straight into the sample rows
        s.update(gpu_temp_c=50.0, power_w=300.0, gpu_up=1.0, xid_last=0, ecc_dbe_vol=0, clocks_event_reasons=0)
        if s["gpu_uuid"] == "GPU-A" and T(10, 20) <= s["ts"] < T(10, 25):  # another job's processes on job 101's GPU
            s.update(foreign_processes=2.0 if s["ts"] >= T(10, 22) else 1.0)
        if s["gpu_uuid"] == "GPU-D":
            t = s["ts"]
            if T(10, 10) <= t < T(10, 20):
                s.update(gpu_temp_c=85.0, clocks_event_reasons=0x40)
            if t >= T(10, 30):
                s.update(xid_last=79, ecc_dbe_vol=2)
            if t >= T(10, 40):
                s.update(gpu_up=0.0, gpu_temp_c=None, power_w=None)
    f.job("101", account="physics", user="alice", start=T(10), end=T(13), gpus=1, placements=[("n1", "GPU-A")], name=HOSTILE["101"])
    f.job("102", account="biology", user="bob", start=T(10), end=None, gpus=1, placements=[("n1", "GPU-B")], name=HOSTILE["102"])
    f.job("103", account="physics", user="carol", start=T(10), end=T(11, 30), gpus=1, placements=[("n2", "GPU-C")], name=HOSTILE["103"])
    f.job("105", account=QUOTE_ACCOUNT, user=EVE, start=T(10), end=None, gpus=1, placements=[("n3", "GPU-E")], name=HOSTILE["105"],
          partition="a100")
    f.job("ml/p1", account="ml", user="", start=T(10), end=T(13), gpus=1, gpu_type="mig-3g.40gb", scheduler="kubernetes",
          partition="ml", job_id="p1", placements=[("n4", "GPU-F", 1)], name="trainer")
    # running jobs: the exporters kept seeing them on their GPUs to the end of the samples
    for a in [x for x in f._allocs if x["job_key"] in ("102", "105")]:
        f._allocs.append(dict(a, ts=T(11, 59, 45)))
    f.write()
    return f


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dash-fleet"))


@pytest.fixture(scope="module")
def con(fleet):
    return open_reader(fleet.root)


W = Params(T(10), T(12))


def states_at(con, as_of, params=W):
    return {(r["host"], r["gpu_uuid"], r["gi"]): r for r in fn.gpu_states(con, params, as_of).to_dicts()}


def test_fleet_now_at_the_window_end(con):
    s = states_at(con, T(12))
    a, b, c, d, e, f1 = (s[k] for k in [("n1", "GPU-A", -1), ("n1", "GPU-B", -1), ("n2", "GPU-C", -1), ("n2", "GPU-D", -1),
                                         ("n3", "GPU-E", -1), ("n4", "GPU-F", 1)])
    assert a["status"] == "ok" and a["held"] and a["job_ids"] == "101" and a["job_names"] == HOSTILE["101"] and a["util"] == 80
    assert a["age_s"] == 15 and a["fresh"] and not a["idle_allocated"]
    # B: 0 % in every sample looked at (06:00-12:00), none busy: idle since before its first sample, 10:00
    assert b["held"] and b["idle_allocated"] and b["no_process"] and b["idle_since"] == T(10) and b["idle_since_capped"]
    assert c["status"] == "no data" and not c["fresh"] and c["age_s"] == 3600 + 15 and not c["held"]  # job 103 ended 11:30
    assert d["status"] == "lost" and d["fresh"] and not d["held"]
    assert e["held"] and e["accounts"] == QUOTE_ACCOUNT and e["user_names"] == EVE and e["usd_per_gpu_hour"] == 1.80
    assert f1["held"] and f1["job_ids"] == "p1" and f1["schedulers"] == "kubernetes" and f1["equiv"] == pytest.approx(MIG)
    assert d["last_xid"] == 79 and d["last_xid_at"] == T(11, 59, 45) and d["xid_last"] == 79
    assert a["last_xid"] is None and a["compute_processes"] == 1 and isinstance(a["compute_processes"], int)
    summary = fn.summarize(fn.gpu_states(con, W, T(12)), W, T(12))
    # 6 physical GPUs (F's MIG instance is part of GPU-F); reporting: A, B, E, F - C is silent, D is lost
    assert (summary.gpus, summary.reporting, summary.no_data, summary.lost, summary.error) == (6, 4, 1, 1, 0)
    assert summary.gpus == summary.reporting + summary.no_data + summary.lost
    # GPU equivalents: held A + B + E + F's 3g.40gb (3/7); free: nothing (D is lost, not free)
    assert summary.held == pytest.approx(3 + MIG) and summary.free == 0 and summary.held_no_process == 1
    assert summary.idle_allocated == 1 and summary.idle_allocated_gpus == 1
    assert summary.idle_allocated_usd_per_h == pytest.approx(3.00)  # GPU B, an H100
    assert summary.idle_allocated_long == 1  # idle since 10:00, the minimum is 30 min
    # mean over reporting GPUs (D is lost: no utilization), MIG at its share
    assert summary.mean_utilization_pct == pytest.approx((80 + 0 + 30 + 60 * MIG) / (3 + MIG))


def test_fleet_now_earlier_moments_and_filters(con):
    s = states_at(con, T(10, 35))
    assert s[("n2", "GPU-D", -1)]["status"] == "error"  # XID 79 and ECC errors, still up
    assert s[("n2", "GPU-C", -1)]["held"] and s[("n2", "GPU-C", -1)]["status"] == "ok"
    # the account filter keeps only GPUs its jobs hold; quotes in the value are data, not SQL
    only = fn.gpu_states(con, Params(T(10), T(12), filters=Filters(account=QUOTE_ACCOUNT)), T(12))
    assert only["gpu_uuid"].to_list() == ["GPU-E"]
    assert fn.gpu_states(con, Params(T(10), T(12), filters=Filters(account="x' OR '1'='1")), T(12)).is_empty()
    hosts = fn.host_freshness(fn.gpu_states(con, W, T(12)))
    assert hosts.row(0, named=True)["host"] == "n2" or hosts.filter(~pl.col("fresh")).is_empty()
    assert hosts.filter(pl.col("host") == "n2").row(0, named=True)["reporting"] == 1  # D still reports (lost), C is silent
    # before anything was seen: nothing known
    assert fn.gpu_states(con, W, T(9)).is_empty()


def test_fleet_now_idle_since_is_after_the_last_busy_sample_across_a_gap(tmp_path):
    """Idle since = the first sample after the last busy one, wherever the samples came from: a
    10-minute gap (a collector restart, the demo's switch from history to live scrapes) does not
    move it to the first sample after the gap."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-X", T(9), T(10, 20), util=lambda t: 90.0 if t < T(9, 30) else 0.0)  # busy until 09:29:45
    f.gpu_series("n1", "GPU-X", T(10, 30), T(11), util=0.0)  # 10 min without data in between
    f.gpu_series("n1", "GPU-Y", T(10), T(10, 20), util=0.0, gpu=1)  # never busy in the look-back
    f.gpu_series("n1", "GPU-Y", T(10, 30), T(11), util=0.0, gpu=1)
    f.job("1", account="a", user="u", start=T(9), end=None, gpus=2, placements=[("n1", "GPU-X"), ("n1", "GPU-Y")])
    f.write()
    s = {r["gpu_uuid"]: r for r in fn.gpu_states(f.reader(), W, T(10, 59, 45)).to_dicts()}
    x, y = s["GPU-X"], s["GPU-Y"]
    assert x["idle_allocated"] and x["idle_since"] == T(9, 30) and not x["idle_since_capped"]
    # no busy sample known: "idle since before 10:00" - never the first sample after the gap (10:30)
    assert y["idle_allocated"] and y["idle_since"] == T(10) and y["idle_since_capped"]
    # a shorter look-back that starts after X's last busy sample: X too is idle since before it.
    # It starts on the hour: 59 min before 10:59:45 falls in 10:00's hour; 60 min, in 09:00's
    x2 = fn.gpu_states(f.reader(), W, T(10, 59, 45), lookback=timedelta(minutes=59)).filter(pl.col("gpu_uuid") == "GPU-X").row(0, named=True)
    assert x2["idle_since"] == T(10) and x2["idle_since_capped"]
    x3 = fn.gpu_states(f.reader(), W, T(10, 59, 45), lookback=timedelta(hours=1)).filter(pl.col("gpu_uuid") == "GPU-X").row(0, named=True)
    assert x3["idle_since"] == T(9, 30) and not x3["idle_since_capped"]
    # what the idle policy acts on: the run within the current stretch of data, which the gap ends
    assert x["idle_with_data_since"] == y["idle_with_data_since"] == T(10, 30)
    assert x["no_process_with_data_since"] is None or x["no_process_with_data_since"] >= T(10, 30)


def test_collector_status_and_filter_values(fleet, con, tmp_path):
    st = fn.collector_status(fleet.root)
    assert st["version"] >= 1 and st["published_at"] is not None and st["age_s"] >= 0
    assert fn.collector_status(tmp_path / "nothing")["published_at"] is None
    v = fn.filter_values(con)
    assert v["cluster"] == ["c1"] and v["model"] == [A100, H100]
    assert QUOTE_ACCOUNT in v["account"] and EVE in v["user"] and v["partition"] == ["a100", "gpu", "ml"]


def test_health_per_gpu_and_events(con):
    g = {r["gpu_uuid"]: r for r in health.gpu_health(con, W).to_dicts() if r["gi"] == -1}
    d = g["GPU-D"]
    assert d["gpu_temp_max_c"] == 85 and d["xids"] == [79] and d["first_xid"] == T(10, 30)
    assert d["ecc_dbe_new"] == 2 and d["lost_samples"] == 80 * 4 and d["first_lost"] == T(10, 40)
    assert d["thermal_throttle_pct"] == pytest.approx(40 / 480 * 100)  # 10 min of 2 h of samples
    assert d["power_throttle_pct"] == 0 and g["GPU-A"]["thermal_throttle_pct"] == 0
    ev = health.events(con, W)
    got = {(r["kind"], r["gpu_uuid"]): r for r in ev.to_dicts()}
    assert set(got) == {("xid", "GPU-D"), ("ecc_dbe", "GPU-D"), ("gpu_lost", "GPU-D")}
    assert got[("xid", "GPU-D")]["ts"] == T(10, 30) and got[("xid", "GPU-D")]["code"] == 79
    assert got[("ecc_dbe", "GPU-D")]["ts"] == T(10, 30) and got[("ecc_dbe", "GPU-D")]["detail"].endswith("+2")
    assert got[("gpu_lost", "GPU-D")]["ts"] == T(10, 40)
    assert ev["ts"].to_list() == sorted(ev["ts"].to_list(), reverse=True)
    temp = health.temperature(con, W, timedelta(hours=1))
    # n2 after 11:00: C is silent and D, lost, reports no temperature - no row, not a 0
    assert temp.filter(pl.col("host") == "n2")["gpu_temp_max_c"].to_list() == [85.0]
    assert temp.filter(pl.col("host") == "n1")["bucket"].to_list() == [T(10), T(11)]
    # the cluster filter is a bound value too
    assert health.events(con, Params(T(10), T(12), filters=Filters(cluster="c1' --"))).is_empty()


@pytest.mark.parametrize("by", timeline.TIMELINE_DIMS)
@pytest.mark.parametrize("bucket", [None, timedelta(minutes=7), timedelta(hours=1)])
def test_timeline_buckets_add_up_to_the_window(con, by, bucket):
    a = Analysis(con, W, now=T(20))
    tl = timeline.utilization_timeline(a, by, bucket)
    u = a.utilization(by)
    keys = [k for k in ("cluster", "model", "partition", "account", "user_name") if k in u.columns and k in tl.columns]
    cols = [c for c in ("data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "capacity_gpu_h") if c in u.columns and tl[c].is_not_null().any()]
    sums = tl.group_by(keys).agg([pl.sum(c) for c in cols]) if keys else tl.select([pl.sum(c) for c in cols])
    joined = u.join(sums, on=keys, suffix="_tl", nulls_equal=True) if keys else pl.concat([u, sums.rename(lambda c: c + "_tl")], how="horizontal")
    assert joined.height == u.height
    for c in cols:
        assert joined[c].to_list() == pytest.approx(joined[c + "_tl"].to_list(), abs=1e-9), (by, c)
    n = int(-(-7200 // (bucket or timeline.default_bucket(timedelta(hours=2))).total_seconds()))
    assert tl.height == n * max(1, u.height)  # every bucket of every group, empty ones as 0


def test_timeline_fleet_series(con):
    a = Analysis(con, W, now=T(20))
    tl = timeline.utilization_timeline(a, "fleet", timedelta(hours=1))
    t = a.totals()
    assert tl["allocated_gpu_h"].sum() == pytest.approx(t.allocated_gpu_h)
    assert tl["capacity_gpu_h"].sum() == pytest.approx(t.capacity_gpu_h)
    assert tl["no_data_gpu_h"].sum() == pytest.approx(t.no_data_gpu_h)
    # 10:00-11:00 every GPU reports except D after 10:40 (lost: no utilization); 11:00-12:00 D again,
    # and C, last seen 10:59:45: its sample holds to 11:00:15 (max_gap 30 s), then it is silent until
    # the window end but still capacity (retire_after 7 d): 12:00 - 11:00:15 = 59.75 min of no data
    first, second = tl.row(0, named=True), tl.row(1, named=True)
    assert first["no_data_gpu_h"] == pytest.approx(20 / 60)
    assert second["no_data_gpu_h"] == pytest.approx(1.0 + 59.75 / 60)
    with pytest.raises(ValueError):
        timeline.utilization_timeline(a, "gpu")


def test_silent_gpu_counts_as_no_data_until_retired(con):
    """C, last seen 10:59:45, holds its last sample to 11:00:15; with retire_after = 10 min it is
    capacity (no data) until 11:09:45, then taken as removed: 9.5 min of no data in 11:00-12:00."""
    from dataclasses import replace

    a = Analysis(con, replace(W, retire_after=timedelta(minutes=10)), now=T(20))
    second = timeline.utilization_timeline(a, "fleet", timedelta(hours=1)).row(1, named=True)
    assert second["no_data_gpu_h"] == pytest.approx(1.0 + 9.5 / 60)  # D's hour + C's 9.5 min
    assert a.totals().no_data_gpu_h == pytest.approx(20 / 60 + 1.0 + 9.5 / 60)


def test_job_gpu_timeline(con):
    a = Analysis(con, W, now=T(20))
    tl = timeline.job_gpu_timeline(a, "c1", "slurm", "101", timedelta(minutes=30))
    assert tl["bucket"].to_list() == [T(10), T(10, 30), T(11), T(11, 30)]
    assert tl["utilization_pct"].to_list() == pytest.approx([80.0] * 4)
    assert tl["fb_used_max_mib"].to_list() == [40960.0] * 4
    assert tl["data_h"].sum() == pytest.approx(2.0)
    assert timeline.job_gpu_timeline(a, "c1", "slurm", "nope").is_empty()


def test_a_job_timeline_of_a_window_typed_to_the_second_has_its_buckets_on_the_clock(con):
    """Buckets from 10:00 for a window from 10:07:13 (the job page narrows its window to the job's
    run): the first bucket holds the window's 22 min 47 s of it, the rest whole, on both paths."""
    from dataclasses import replace

    for raw in (False, True):
        p = replace(W, start=T(10, 7, 13))
        a = RawAnalysis(con, p, now=T(20), detail=True) if raw else Analysis(con, p, now=T(20))
        tl = timeline.job_gpu_timeline(a, "c1", "slurm", "101", timedelta(minutes=30))
        assert tl["bucket"].to_list() == [T(10), T(10, 30), T(11), T(11, 30)], raw
        assert tl["data_h"].to_list() == pytest.approx([(30 * 60 - 433) / 3600, 0.5, 0.5, 0.5]), raw
        assert tl["utilization_pct"].to_list() == pytest.approx([80.0] * 4), raw


def test_empty_store(tmp_path):
    StoreWriter(tmp_path).close()
    con = open_reader(tmp_path)
    assert fn.gpu_states(con, W, T(12)).is_empty()
    assert fn.summarize(fn.gpu_states(con, W, T(12)), W, T(12)).gpus == 0
    assert health.gpu_health(con, W).is_empty() and health.events(con, W).is_empty()
    a = Analysis(con, W, now=T(20))
    assert timeline.utilization_timeline(a, "fleet")["capacity_gpu_h"].sum() == 0


# --- issue #13.6: Fleet now counts physical GPUs; held/free/no-process in GPU equivalents ---

_device = st.fixed_dictionaries({
    "fresh": st.booleans(), "lost": st.booleans(), "error": st.booleans(), "held": st.booleans(), "nop": st.booleans(),
})


@given(st.lists(st.tuples(st.sampled_from([None, "1g.10gb", "2g.20gb", "3g.40gb"]), st.lists(_device, min_size=1, max_size=7)),
                min_size=1, max_size=12))
def test_summary_counts_physical_gpus_and_gpu_equivalents(gpus):
    """Random GPUs, some split into MIG instances: the GPUs counted are the physical ones (the UUIDs),
    whatever their instances; reporting + lost + no data = GPUs; held, free and no-process add up
    the instances' shares; free + held never exceed the reporting GPUs' equivalents."""
    rows = []
    for i, (profile, devices) in enumerate(gpus):
        devices = devices if profile else devices[:1]
        share = 1.0 if profile is None else int(profile[0]) / 7
        devices = devices[: int(1 / share)] if profile else devices  # no more slices than the GPU has
        for gi, d in enumerate(devices):
            status = "no data" if not d["fresh"] else "lost" if d["lost"] else "error" if d["error"] else "ok"
            held = d["held"]
            rows.append(dict(cluster="c", host=f"h{i // 4}", gpu=i % 4, gpu_uuid=f"GPU-{i}", gi=gi if profile else -1, model="m",
                             mig_profile=profile, equiv=share, fresh=d["fresh"], status=status, util=None if status == "lost" else 0.0,
                             held=held, no_process=held and d["fresh"] and d["nop"], idle_allocated=False, idle_since=None,
                             usd_per_gpu_hour=1.0))
    states = pl.DataFrame(rows, schema_overrides={"idle_since": pl.Datetime("us")})
    s = fn.summarize(states, W, T(12))
    assert s.gpus == len(gpus) <= states.height
    assert s.reporting + s.lost + s.no_data == s.gpus and s.error <= s.reporting
    eq = lambda rs: sum(r["equiv"] for r in rs)  # noqa: E731
    assert s.held == pytest.approx(eq(r for r in rows if r["held"]))
    assert s.held_no_process == pytest.approx(eq(r for r in rows if r["no_process"])) and s.held_no_process <= s.held + 1e-9
    reporting_uuids = {u for u in {r["gpu_uuid"] for r in rows}
                       if any(r["fresh"] for r in rows if r["gpu_uuid"] == u) and not any(r["status"] == "lost" for r in rows if r["gpu_uuid"] == u)}
    assert s.free == pytest.approx(eq(r for r in rows if r["fresh"] and not r["held"] and r["gpu_uuid"] in reporting_uuids))
    assert s.reporting == len(reporting_uuids)
    assert s.free <= len(reporting_uuids) + 1e-9  # free capacity is on reporting GPUs only


def _runs_oracle(samples: list, as_of: int, lookback: int, stale: int, max_gap: int, thr: float) -> dict:
    """What gpu_states says of one GPU's samples [(t, util, processes)], by the module's rules
    written out one sample at a time (t in seconds, ascending from BASE, which is on the hour)."""
    look_from = (as_of - lookback) // 3600 * 3600  # the look-back starts on the hour as_of - lookback falls in
    looked = [(t, u, p) for t, u, p in samples if look_from <= t <= as_of]
    if not looked:
        return {"ts": None, "idle_since": None, "idle_since_capped": False, "no_process_since": None,
                "idle_with_data_since": None, "no_process_with_data_since": None}
    first = lambda xs: min(xs, default=None)  # noqa: E731
    last = lambda xs: max(xs, default=None)  # noqa: E731
    last_busy = last(t for t, u, _ in looked if u is not None and u >= thr)
    last_proc = last(t for t, _, p in looked if p is not None and p > 0)
    data_from = last(t for i, (t, _, _) in enumerate(looked) if i == 0 or t - looked[i - 1][0] > max_gap)
    idle = [t for t, u, _ in looked if u is not None and u < thr and (last_busy is None or t > last_busy)]
    noproc = [t for t, _, p in looked if p == 0 and (last_proc is None or t > last_proc)]
    t, u, p = looked[-1]
    fresh = as_of - t <= stale
    idle_now = fresh and u is not None and u < thr
    noproc_now = fresh and p == 0
    return {"ts": t, "idle_since": first(idle) if idle_now else None, "idle_since_capped": idle_now and last_busy is None,
            "no_process_since": first(noproc) if noproc_now else None,
            "idle_with_data_since": first(x for x in idle if x >= data_from) if idle_now else None,
            "no_process_with_data_since": first(x for x in noproc if x >= data_from) if noproc_now else None}


@SETTINGS
@given(fleets(), st.integers(0, 3599), st.integers(-400, 400), st.sampled_from([60, 600, 1800, 4000, 10**6]),
       st.sampled_from([None, 2 * 86400]) | st.integers(3600, 5 * 3600))
def test_fleet_now_runs_follow_the_rules_sample_by_sample(fleet, shift, after, lookback, upkeep_at):
    """Random GPUs (some MIG slices; gaps longer and shorter than max_gap; utilization and
    processes unknown now and then; the samples shifted so that an hour's end falls anywhere
    among them: the runs are composed hour by hour) at a moment around the last sample and a
    random look-back, the store's upkeep run at a random time (the facts' parts give the runs up
    to their newest bucket, raw samples after it): each GPU's newest sample, idle and no-process
    run starts, with and without the current stretch of data, equal the rules applied one
    sample at a time."""
    fleet = {**fleet, "gpus": [{**g, "samples": [(t + shift, u, p) for t, u, p in g["samples"]]} for g in fleet["gpus"]]}
    check_runs(fleet, max(g["samples"][-1][0] for g in fleet["gpus"]) + after, lookback, upkeep_at)


def _series(*runs) -> list:
    """Samples from runs (start s, end s, step s, utilization, processes)."""
    return [(t, u, p) for t0, t1, step, u, p in runs for t in range(t0, t1, step)]


def test_fleet_now_runs_whose_last_busy_sample_ends_an_hour_without_an_idle_one():
    """The hour of the last busy sample has an earlier busy sample with an idle one after it, but
    none after the last: the run starts in the next hour (likewise for processes and for a
    stretch of data whose last gap has no idle sample after it in its hour)."""
    busy_idle_busy = _series((600, 1200, 15, 90.0, 1), (1200, 1800, 15, 0.0, 0), (1800, 2400, 15, 90.0, 1), (2400, 3600, 15, None, None),
                             (3600, 4800, 15, 0.0, 0))
    gap_then_none = _series((0, 600, 15, 0.0, 0), (700, 1200, 15, 0.0, 0), (1300, 3600, 15, None, None), (3600, 4800, 15, 0.0, 0))
    fleet = {"gpus": [{"gpu": g, "host": "h0", "uuid": f"GPU-prop-{g}", "samples": s} for g, s in enumerate([busy_idle_busy, gap_then_none])],
             "jobs": []}
    for upkeep_at in (None, 2 * 86400):  # from raw samples; from the facts (the newest minutes raw)
        check_runs(fleet, 4800, 10**6, upkeep_at)


XID_CODES = st.sampled_from([0, 13, 31, 48, 79, 94, None])  # (0: none; None: the field not reported)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30 * 60 - 1), st.integers(1, 240), XID_CODES), min_size=1, max_size=12),
       st.integers(0, 8 * 3600).map(lambda s: 32 * 3600 - s),  # (mostly late: the forget window over the day's facts)
       st.sampled_from([None, 40 * 3600]) | st.integers(3600, 31 * 3600))
@example([(600, 100, 79), (1500, 3, 13)], 29 * 3600 + 7, 40 * 3600)  # a code held for 100 minutes, in one day's facts
def test_last_xid_is_the_newest_code_of_the_forget_window_from_facts_or_samples(events, as_of, upkeep_at):
    """A GPU sampled every minute for 30 hours, XID codes over random runs of minutes (a code
    repeated sample after sample, as DCGM's field holds it; codes replacing each other; not
    reported), the store's upkeep at a random time (facts
    of the hours settled by then, raw samples after them and where there are none): at a random
    moment its last XID and when are the newest non-zero code of the samples in
    (as_of - forget_after, as_of], one sample at a time; a GPU without any has none."""
    day = datetime(2026, 11, 16)
    codes = {m: c for start, n, c in events for m in range(start, start + n)}  # minute -> code (a later run wins)
    with scratch() as root:
        f = Fleet(root, cluster="c1")
        code_at = lambda t: {"xid_last": codes.get(int((t - day).total_seconds()) // 60, 0)}  # noqa: E731
        f.gpu_series("h0", "GPU-X", day, day + timedelta(hours=30), step=60, util=50.0, procs=1, health=code_at)
        f.gpu_series("h0", "GPU-Q", day, day + timedelta(hours=30), step=60, util=50.0, procs=1, gpu=1)
        f.write()
        if upkeep_at is not None:
            w = StoreWriter(root)
            compact(w, day + timedelta(seconds=upkeep_at), FactParams(), facts_hours=None)
            w.close()
        got = {r["gpu_uuid"]: r for r in fn.gpu_states(open_reader(root), Params(day, day + timedelta(hours=1)),
                                                        day + timedelta(seconds=as_of)).to_dicts()}
    forget = int(fn.FORGET_AFTER.total_seconds())
    seen = [(m * 60, c) for m, c in sorted(codes.items()) if c and as_of - forget < m * 60 <= as_of and m * 60 < 30 * 3600]
    want = (seen[-1][1], day + timedelta(seconds=seen[-1][0])) if seen else (None, None)
    assert (got["GPU-X"]["last_xid"], got["GPU-X"]["last_xid_at"]) == want
    assert got["GPU-Q"]["last_xid"] is None and got["GPU-Q"]["last_xid_at"] is None


@pytest.fixture(scope="module")
def with_facts(tmp_path_factory):
    """The scenario's store again, its upkeep run after every hour settled: its facts."""
    f = build(tmp_path_factory.mktemp("dash-fleet-facts"))
    w = StoreWriter(f.root)
    compact(w, T(15), FactParams(), facts_hours=None)
    w.close()
    con = open_reader(f.root)
    assert con.execute("SELECT count(*) FROM fact_files").fetchall()[0][0] > 0
    return con


@pytest.mark.parametrize("as_of", [T(10, 35), T(11, 30), T(12), T(13)])
def test_fleet_now_from_facts_equals_fleet_now_from_raw_samples(con, with_facts, as_of):
    """Every GPU's state, latest sample (a GPU silent for an hour too: its newest sample lies in
    the facts) and runs from the facts, the same as from the raw samples alone."""
    want, got = fn.gpu_states(con, W, as_of), fn.gpu_states(with_facts, W, as_of)
    assert got.equals(want), (got, want)


def check_runs(fleet: dict, as_of: int, lookback: int, upkeep_at: int | None = None) -> None:
    with scratch() as root:
        con = build_store(root, fleet, placement=mig_some)
        if upkeep_at is not None:  # facts of the hours settled by then (the rest is read raw)
            w = StoreWriter(root)
            compact(w, at(upkeep_at), FactParams(max_gap_s=MAX_GAP), facts_hours=None)
            w.close()
            con = open_reader(root)
        p = Params(at(0), at(1), max_gap=timedelta(seconds=MAX_GAP))
        got = {(r["host"], r["gpu_uuid"], r["gi"]): r
               for r in fn.gpu_states(con, p, at(as_of), lookback=timedelta(seconds=lookback)).to_dicts()}
        want = {}
        for g in fleet["gpus"]:
            where = mig_some(g)
            key = (where["host"], where["gpu_uuid"], -1 if where["gpu_instance"] is None else where["gpu_instance"])
            if g["samples"][0][0] <= as_of:  # known from its first sample on (the inventory)
                want[key] = _runs_oracle(g["samples"], as_of, lookback, int(fn.STALE_AFTER.total_seconds()), MAX_GAP, p.idle_threshold)
        assert set(got) == set(want)
        for key, w in want.items():
            seen = {k: got[key][k] for k in w}
            assert seen == {k: (at(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in w.items()}, key
