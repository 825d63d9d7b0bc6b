"""Where a job's GPU time goes (gpufleet.analytics.states): each detector on synthetic samples
with a known answer, and the invariants: the states partition the time with data, no state moves
when a field it does not read changes, a planted checkpoint period and straggler are found."""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.analytics import states as S
from gpufleet.analytics.states import GpuSamples, Thresholds, job_states

STEP = 15.0  # a scrape interval
T = Thresholds(idle_threshold=5.0, idle_min_s=1800.0, max_gap_s=30.0)


def gpu(util, *, name="n1:0", step=STEP, procs=1.0, sm=0.9, tensor=0.6, rx=1e8, nvl=1e9, a0=0.0, a1=None) -> GpuSamples:
    """A GPU sampled every `step` s from 0 with these utilizations; the other columns constant
    or per sample (None: the GPU does not publish the field)."""
    util = np.asarray(util, dtype=float)
    n = len(util)

    def c(v):
        if v is None:
            return None
        return np.full(n, float(v)) if np.isscalar(v) else np.asarray(v, dtype=float)

    return GpuSamples(gpu=name, a0=a0, a1=n * step if a1 is None else a1, ts=np.arange(n) * step, util=util,
                      procs=c(procs), sm_active=c(sm), tensor_active=c(tensor), pcie_rx=c(rx), nvlink=c(nvl))


def minutes(m: float) -> int:
    return int(round(m * 60 / STEP))


def test_a_busy_gpu_is_all_compute():
    js = job_states([gpu([90.0] * minutes(60))], T)
    assert js.data_s == 3600 and js.seconds["compute"] == 3600
    assert js.largest_loss is None and "tensor active 60 %" in js.evidence["compute"]


def test_startup_is_the_time_before_the_first_sustained_busy_stretch():
    # 20 minutes of loading (a blip of 30 s busy inside it is not sustained), then training
    util = [1.0] * minutes(10) + [80.0] * 2 + [1.0] * (minutes(10) - 2) + [90.0] * minutes(40)
    js = job_states([gpu(util)], T)
    assert js.seconds["startup"] == 20 * 60 and js.seconds["compute"] == 40 * 60
    assert js.largest_loss == "startup"
    # durations in the vocabulary's words: a startup shorter than a minute read "0 min per GPU"
    assert js.evidence["startup"].endswith(": 20 min per GPU before the first 2 min busy"), js.evidence["startup"]


def test_a_gpu_never_busy_has_no_startup_but_idle_and_no_process():
    util = [0.0] * minutes(60)
    procs = [0.0] * minutes(20) + [1.0] * minutes(40)
    js = job_states([gpu(util, procs=procs)], T)
    assert (js.seconds["startup"], js.seconds["no_process"], js.seconds["idle"]) == (0, 20 * 60, 40 * 60)
    # the evidence says the rule and how long, not the share alone ("idle 67%" was all the job page said)
    assert js.evidence["idle"] == f"idle 67 %: below {T.idle_threshold:g} % utilization in stretches of at least 30 min, 40 min per GPU"
    assert js.evidence["no_process"] == "no process 33 %: no compute process on its GPUs, 20 min per GPU"


def test_checkpoints_every_30_minutes_costing_90_s():
    period, cost = minutes(30), minutes(1.5)
    util = []
    for _ in range(6):
        util += [95.0] * (period - cost) + [0.0] * cost
    util += [95.0] * minutes(5)
    js = job_states([gpu(util)], T)
    c = js.checkpoints
    assert c is not None and c.count == 6
    assert c.period_s == pytest.approx(1800, rel=0.05) and c.cost_s == pytest.approx(90, rel=0.05)
    assert js.seconds["checkpoint"] == 6 * 90 and js.seconds["pause"] == 0
    assert "every 30 min, 1 min 30 s each" in js.evidence["checkpoint"]
    assert js.evidence["checkpoint"].startswith("checkpoint stalls ")  # (the state in the vocabulary's words)


def test_a_state_with_time_is_never_said_to_be_0_percent():
    """A short no-process start beside a long busy run: its evidence reads "<1 %", not "0 %" beside its GPU-hours."""
    n = minutes(300)
    js = job_states([gpu([95.0] * n, procs=[0.0] * minutes(1) + [1.0] * (n - minutes(1)))], T)
    assert js.seconds["no_process"] == 60 and js.evidence["no_process"] == "no process <1 %: no compute process on its GPUs, 1 min per GPU"
    assert js.evidence["compute"].startswith("compute 100 %")


def test_irregular_dips_are_pauses_not_checkpoints():
    util = []
    for busy in (minutes(3), minutes(40), minutes(7), minutes(25)):
        util += [95.0] * busy + [0.0] * minutes(1)
    util += [95.0] * minutes(5)
    js = job_states([gpu(util)], T)
    assert js.checkpoints is None and js.seconds["checkpoint"] == 0 and js.seconds["pause"] == 4 * 60


def test_input_bound_is_low_sm_activity_with_host_to_device_traffic():
    n = minutes(60)
    sm = [0.18] * (n // 2) + [0.9] * (n - n // 2)
    js = job_states([gpu([60.0] * n, sm=sm, rx=11e9)], T)
    assert js.seconds["input_bound"] == 1800 and js.seconds["compute"] == 1800
    assert js.evidence["input_bound"] == "input-bound 50 %: PCIe RX 11.0 GB/s while SM active 18 %"


def test_communication_bound_needs_several_gpus():
    kw = dict(sm=0.4, tensor=0.05, nvl=2e11)
    one = job_states([gpu([70.0] * minutes(30), **kw)], T)
    assert one.seconds["communication_bound"] == 0 and one.seconds["compute"] == 1800
    two = job_states([gpu([70.0] * minutes(30), name=f"n1:{i}", **kw) for i in range(2)], T)
    assert two.seconds["communication_bound"] == 3600
    assert "NVLink 200 GB/s while tensor active 5 %" in two.evidence["communication_bound"]


def test_a_straggler_is_named_and_costs_the_others_their_shortfall():
    gpus = [gpu([95.0] * minutes(60), name=f"n1:{i}") for i in range(7)] + [gpu([60.0] * minutes(60), name="n1:7")]
    js = job_states(gpus, T)
    assert js.straggler["gpu"] == "n1:7"
    assert js.seconds["straggler"] == pytest.approx(3600 * (95 - 60) / 95)
    assert "GPU n1:7 at 60 % busy" in js.evidence["straggler"]


def test_missing_profiling_fields_leave_busy_time_unresolved_and_say_which():
    js = job_states([gpu([90.0] * minutes(30), sm=None, rx=None, procs=None)], T)
    assert js.seconds["busy_unresolved"] == 1800 and js.seconds["compute"] == 0
    assert js.unknown["input_bound"] == ["n1:0: DCGM_FI_PROF_PCIE_RX_BYTES, DCGM_FI_PROF_SM_ACTIVE"]
    assert js.unknown["no_process"] == ["n1:0: gpufleet_gpu_compute_processes"]
    assert "busy, not split without" in js.evidence["busy_unresolved"]


def test_time_with_data_follows_max_gap_and_the_allocation():
    g = gpu([90.0] * 4, step=60.0, a0=10.0, a1=200.0)  # samples at 0, 60, 120, 180; each holds 30 s
    js = job_states([g], T)
    assert js.data_s == 20 + 30 + 30 + 20


# --- invariants ---

_COLUMNS = ("util", "procs", "sm_active", "tensor_active", "pcie_rx", "nvlink")


@functools.cache
def _n_of(values: tuple, n: int, optional: bool = False) -> st.SearchStrategy:
    """n draws of `values` (an array; or None, `optional`), built once per (values, n): a strategy
    built inside a draw is validated and labelled again at every draw."""
    many = st.lists(st.sampled_from(values), min_size=n, max_size=n).map(np.array)
    return st.one_of(st.none(), many) if optional else many


_STEPS, _STARTS = st.sampled_from([10.0, 15.0, 45.0]), st.sampled_from([0.0, 7.0])


@st.composite
def jobs(draw):
    n_gpus = draw(st.integers(1, 3))
    n = draw(st.integers(1, 60))
    out = []
    for k in range(n_gpus):
        step = draw(_STEPS)
        util = draw(_n_of((0.0, 3.0, 20.0, 95.0, float("nan")), n))

        def col(values):
            return draw(_n_of(tuple(values), n, optional=True))

        out.append(GpuSamples(gpu=f"h:{k}", a0=draw(_STARTS), a1=draw(st.sampled_from([n * step, n * step / 2])),
                              ts=np.arange(n) * step, util=util, procs=col([0.0, 1.0, float("nan")]),
                              sm_active=col([0.1, 0.9, float("nan")]), tensor_active=col([0.05, 0.7]),
                              pcie_rx=col([1e6, 5e9]), nvlink=col([0.0, 5e10])))
    return out


SMALL = dataclasses.replace(T, idle_min_s=300.0, startup_busy_seconds=30.0, checkpoint_min_seconds=10.0)


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_states_partition_the_time_with_data(gpus):
    js = job_states(gpus, SMALL)
    assert all(v >= -1e-9 for v in js.seconds.values())
    assert sum(js.seconds.values()) == pytest.approx(js.data_s, abs=1e-6)
    for g in js.gpus:
        assert sum(g.seconds.values()) == pytest.approx(g.data_s, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(jobs(), st.sampled_from(_COLUMNS[1:]), st.randoms(use_true_random=False))
def test_no_state_moves_when_a_field_it_does_not_read_changes(gpus, column, rnd):
    before = job_states(gpus, SMALL)
    changed = []
    for g in gpus:
        values = rnd.choice([None, np.array([rnd.choice([0.0, 0.2, 1.0, 3e10, float("nan")]) for _ in g.ts])])
        changed.append(dataclasses.replace(g, **{column: values}))
    after = job_states(changed, SMALL)
    for state in S.STATES:
        if column not in S.READS[state]:
            assert after.seconds[state] == before.seconds[state], state


@settings(max_examples=60, deadline=None)
@given(st.integers(10, 90), st.integers(2, 8), st.integers(6, 12))
def test_a_planted_checkpoint_period_is_found_within_5_percent(period_min, cost_samples, count):
    period = minutes(period_min)
    util = []
    for _ in range(count):
        util += [95.0] * (period - cost_samples) + [0.0] * cost_samples
    util += [95.0] * minutes(3)
    js = job_states([gpu(util)], T)
    assert js.checkpoints is not None
    assert js.checkpoints.period_s == pytest.approx(period_min * 60, rel=0.05)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.data())
def test_a_planted_straggler_is_named(n_gpus, data):
    slow = data.draw(st.integers(0, n_gpus - 1))
    fast, lag = data.draw(st.floats(70, 100)), data.draw(st.floats(0.2, 0.6))
    gpus = [gpu([fast * (1 - lag) if i == slow else fast] * minutes(20), name=f"n{i}:0") for i in range(n_gpus)]
    js = job_states(gpus, T)
    assert js.straggler is not None and js.straggler["gpu"] == f"n{slow}:0"


# --- the vectorised walk against a plain one ---

def _plain_intervals(s: GpuSamples, max_gap_s: float) -> tuple[list[int], list[float], list[float]]:
    """Each sample's interval with data inside [a0, a1), one at a time: it holds until the next sample in time, at
    most max_gap; (its sample, start, end) for those with a utilization and a length."""
    order = sorted(range(len(s.ts)), key=lambda i: s.ts[i])
    util, kept = s.column("util"), ([], [], [])
    for n, i in enumerate(order):
        nxt = s.ts[order[n + 1]] if n + 1 < len(order) else float("inf")
        start, end = max(s.ts[i], s.a0), min(nxt, s.ts[i] + max_gap_s, s.a1)
        if end > start and not np.isnan(util[i]):
            for out, v in zip(kept, (i, start, end)):
                out.append(v)
    return kept


def _walk_low_states(s: GpuSamples, t: Thresholds) -> tuple[dict[str, float], S.Checkpoints | None]:
    """The oracle: startup, no process, idle, checkpoint and pause by the module doc's rules, as a
    walk over the intervals one at a time (gpu_states does it with whole-array operations)."""
    idx, start, end = _plain_intervals(s, t.max_gap_s)
    util, procs, dur, n = s.column("util")[idx], s.column("procs")[idx], np.array(end) - np.array(start), len(idx)

    def runs(flag):
        found, i = [], 0
        while i < n:
            j = i + 1
            while flag[i] and j < n and flag[j] and start[j] == end[j - 1]:
                j += 1
            if flag[i]:
                found.append((i, j))
            i = j
        return found

    low = [u < t.idle_threshold for u in util]
    state: list[str | None] = [None] * n
    for i, j in runs([not x for x in low]):
        if sum(dur[i:j]) >= t.startup_busy_seconds:
            state[:i] = ["startup"] * i
            break
    state = [x or ("no_process" if procs[k] == 0 else None) for k, x in enumerate(state)]
    dips = []
    for i, j in runs(low):
        length = sum(dur[i:j])
        for k in range(i, j):
            state[k] = state[k] or ("idle" if length >= t.idle_min_s else "pause")
        bounded = 0 < i and j < n and start[i] == end[i - 1] and end[j - 1] == start[j] and state[i - 1] != "startup"
        if bounded and t.checkpoint_min_seconds <= length < t.idle_min_s:
            dips.append((i, j, start[i], length))
    rhythm = None
    if len(dips) >= t.checkpoint_min_count:
        gaps = np.diff([d[2] for d in dips])
        period = np.median(gaps)
        regular = np.abs(gaps - period) <= t.checkpoint_period_tolerance * period
        if period > 0 and regular.sum() * 2 >= len(gaps):
            rhythm = S.Checkpoints(count=len(dips), period_s=float(np.median(gaps[regular])), cost_s=float(np.mean([d[3] for d in dips])))
            for i, j, _, _ in dips:
                state[i:j] = ["checkpoint" if x == "pause" else x for x in state[i:j]]
    names = ("startup", "no_process", "idle", "checkpoint", "pause")
    return {name: float(sum(d for d, x in zip(dur, state) if x == name)) for name in names}, rhythm


_RHYTHM_KINDS = {"busy": 90.0, "low": 0.0, "low3": 3.0, "nan": float("nan")}
_RHYTHM_PARTS = st.lists(st.tuples(st.sampled_from([*_RHYTHM_KINDS, "gap"]), st.integers(1, 50)), max_size=12)
_DIPS = st.sampled_from([1, 2, 4, 6, 19, 20])


@st.composite
def rhythmic_gpus(draw):
    """A GPU of stretches (busy, low, unreported, unsampled) with a recurring dip pattern planted
    among them half the time; whole seconds, so every sum is exact whatever its order."""
    kinds = _RHYTHM_KINDS
    parts = draw(_RHYTHM_PARTS)
    if draw(st.booleans()):
        busy, dip = draw(st.integers(2, 30)), draw(_DIPS)  # 20 x 15 s: idle_min_s
        at = draw(st.integers(0, len(parts)))
        parts[at:at] = [("busy", busy), ("low", dip)] * draw(st.integers(2, 8))
    ts, util, t = [], [], 0
    for kind, count in parts:
        for _ in range(count):
            if kind != "gap":
                ts.append(t)
                util.append(kinds[kind])
            t += 15
    n = len(ts)
    procs = draw(_n_of((1.0, 1.0, 1.0, 0.0, float("nan")), n))
    return GpuSamples(gpu="n1:0", a0=float(draw(st.integers(0, 40))), a1=float(t - draw(st.integers(0, 40))), ts=np.array(ts, dtype=float),
                      util=np.array(util), procs=procs, sm_active=np.full(n, 0.9), tensor_active=np.full(n, 0.6),
                      pcie_rx=np.full(n, 1e8), nvlink=np.full(n, 1e9))


@settings(max_examples=300, deadline=None)
@given(rhythmic_gpus(), st.sampled_from([30.0, 300.0]))
def test_the_low_stretches_are_those_of_a_plain_walk(g, startup_s):
    t = dataclasses.replace(SMALL, startup_busy_seconds=startup_s, checkpoint_min_seconds=15.0)
    seconds, rhythm = _walk_low_states(g, t)
    got = job_states([g], t).gpus[0]
    assert {k: got.seconds[k] for k in seconds} == seconds
    assert got.checkpoints == rhythm


@settings(max_examples=150, deadline=None)
@given(st.lists(rhythmic_gpus(), min_size=2, max_size=4), st.sampled_from([30.0, 300.0]), st.booleans())
def test_each_gpu_of_a_job_has_the_low_stretches_of_its_own_walk(gpus, startup_s, end_to_end):
    """Each of a job's GPUs is split as it would be alone: none's runs, startup or rhythm reach into the next's, even
    where one GPU's allocation starts exactly where the previous one's ends (end_to_end)."""
    t = dataclasses.replace(SMALL, startup_busy_seconds=startup_s, checkpoint_min_seconds=15.0)
    if end_to_end:
        shifted, end = [], 0.0
        for g in gpus:  # this GPU's allocation starts where the previous one's ends
            at = end - g.a0
            shifted.append(dataclasses.replace(g, a0=g.a0 + at, a1=g.a1 + at, ts=g.ts + at))
            end = g.a1 + at
        gpus = shifted
    gpus = [dataclasses.replace(g, gpu=f"n{i}:0") for i, g in enumerate(gpus)]
    got = job_states(gpus, t).gpus
    for g, mine in zip(gpus, got):
        seconds, rhythm = _walk_low_states(g, t)
        assert {k: mine.seconds[k] for k in seconds} == seconds, g.gpu
        assert mine.checkpoints == rhythm, g.gpu


# --- one job from the store ---

from gpufleet.analytics.core import Analysis  # noqa: E402
from gpufleet.analytics.jobs import job_report, job_summaries  # noqa: E402
from gpufleet.analytics.params import Params  # noqa: E402
from gpufleet.analytics.states import job_breakdown  # noqa: E402
from tests.support.fleet import Fleet  # noqa: E402
from tests.test_analytics_golden import T as GT, fleet  # noqa: E402, F401 - the golden store fixture


def test_a_stored_jobs_breakdown_covers_its_time_with_data_as_the_job_report_counts_it(fleet):  # noqa: F811
    """The breakdown reads only the job's GPUs and window, and its time with data is the job
    report's (one rule for a sample's reach), for every golden job."""
    p = Params(GT(10), GT(12))
    a = Analysis(fleet.reader(), p, now=GT(20))
    t = Thresholds.of(p, {o.key: o.default for o in S.STATE_OPTIONS})
    jobs = job_summaries(a)
    assert not jobs.is_empty()
    for job_id in jobs["job_id"].to_list():
        r = job_report(a, job_id)
        b = job_breakdown(fleet.reader(), p, job_id, t)
        data_h = r.per_gpu["data_h"].sum() if not r.per_gpu.is_empty() else 0.0
        if b is None:
            assert data_h == 0, job_id
            continue
        assert b.data_s / 3600 == pytest.approx(data_h, abs=1e-9), job_id
        assert sum(b.seconds.values()) == pytest.approx(b.data_s)
    b101 = job_breakdown(fleet.reader(), p, "101", t)  # 45 min at 0 %, then 15 min at 80 %
    assert b101.seconds["idle"] == pytest.approx(45 * 60) or b101.seconds["startup"] == pytest.approx(45 * 60)
    assert job_breakdown(fleet.reader(), p, "nope", t) is None


_B = datetime(2026, 5, 4, 10)  # the stored jobs' window: [_B, _B + 3 h)
_STORED_FIELDS = {"gpu_util": [0.0, 3.0, 50.0, 90.0, None], "compute_processes": [1.0, 1.0, 0.0, None], "sm_active": [0.125, 0.75, None],
                  "tensor_active": [0.125, 0.5], "pcie_rx_bytes_per_s": [1e8, 2e9, None], "nvlink_tx_bytes_per_s": [0.0, 2e10, None],
                  "nvlink_rx_bytes_per_s": [1e8, None], "foreign_processes": [None, None, 2.0]}  # float32-exact


@st.composite
def stored_jobs(draw):
    """Job 77 on 1-3 GPUs (one per host, the mapping without their index) and job 88 beside it on
    the first host, each GPU sampled in stretches with gaps, written out of time order."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    start = _B + timedelta(seconds=draw(st.integers(0, 3600)))
    job = (start, start + timedelta(seconds=draw(st.integers(600, 9000))))  # may end past the window
    gpus = []
    for k in range(draw(st.integers(1, 3)) + 1):  # the last one is job 88's
        step = draw(st.sampled_from([15, 60]))
        t, stretches = _B - timedelta(minutes=20), []
        for count, gap in draw(st.lists(st.tuples(st.integers(1, 200), st.integers(0, 40)), min_size=1, max_size=4)):
            stretches.append({t + timedelta(seconds=step * i): {c: v[rng.integers(len(v))] for c, v in _STORED_FIELDS.items()}
                              for i in range(count)})
            t += timedelta(seconds=step * (count + gap))
        gpus.append(("n1" if k == 0 else f"n{k}", f"GPU-{k}", k, step, stretches[::-1]))
    return job, gpus


@settings(max_examples=25, deadline=None)
@given(stored_jobs())
def test_a_stored_job_breaks_down_as_its_samples_do(tmp_path_factory, drawn):
    """The oracle of the store path: job_breakdown (one query, the rows unordered, a slice per
    GPU) equals job_states over the job's GPUs' samples as they were written."""
    (start, end), gpus = drawn
    f = Fleet(tmp_path_factory.mktemp("stored"))
    for host, uuid, index, step, stretches in gpus[::-1]:  # the job's last GPU's rows first
        for samples in stretches:
            f.gpu_series(host, uuid, min(samples), max(samples) + timedelta(seconds=step), step=step, gpu=index,
                         util=lambda ts, s=samples: s[ts]["gpu_util"], procs=lambda ts, s=samples: s[ts]["compute_processes"],
                         tensor=lambda ts, s=samples: s[ts]["tensor_active"],
                         health=lambda ts, s=samples: {c: v for c, v in s[ts].items() if c not in ("gpu_util", "compute_processes", "tensor_active")})
    f.job("j77", job_id="77", account="a", user="u", start=start, end=end, gpus=len(gpus) - 1, placements=[(h, u) for h, u, *_ in gpus[:-1]])
    f.job("j88", job_id="88", account="a", user="u", start=_B, end=_B + timedelta(hours=3), gpus=1, placements=[gpus[-1][:2]])
    f.write()
    p = Params(_B, _B + timedelta(hours=3))
    t = dataclasses.replace(Thresholds.of(p, {o.key: o.default for o in S.STATE_OPTIONS}), idle_min_s=300.0, startup_busy_seconds=30.0)
    epoch = datetime(1970, 1, 1)
    a0, a1 = ((max(start, p.start) - epoch).total_seconds(), (min(end, p.end) - epoch).total_seconds())
    oracle = []
    for host, uuid, index, _, stretches in gpus[:-1]:
        rows = [(ts, v) for samples in stretches for ts, v in samples.items()]
        ts = np.array([(t_ - epoch).total_seconds() for t_, _ in rows])

        def col(*names):
            got = [[v[n] for n in names] for _, v in rows]
            return np.array([np.nan if all(x is None for x in g) else sum(x or 0.0 for x in g) for g in got])

        seen = ((ts >= a0 - t.max_gap_s) & (ts < a1)).any()  # the mapping has no index: the samples in reach give it
        oracle.append(GpuSamples(gpu=f"{host}:{index if seen else uuid}", a0=a0, a1=a1, ts=ts, util=col("gpu_util"),
                                 procs=col("compute_processes"), sm_active=col("sm_active"), tensor_active=col("tensor_active"),
                                 pcie_rx=col("pcie_rx_bytes_per_s"), nvlink=col("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
                                 equiv=np.ones(len(rows)), foreign=col("foreign_processes")))
    got = job_breakdown(f.reader(), p, "77", t)
    assert got is not None and got.to_json() == job_states(oracle, t).to_json()


def test_analyze_job_prints_and_emits_the_breakdown(fleet, tmp_path):  # noqa: F811
    from tests.test_analytics_jobs_cli import analyze

    window = ("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00", "--job", "101")
    r = analyze(*window, "--format", "json")
    assert r.returncode == 0, r.stderr
    w = json.loads(r.stdout)["job"]["where_time_goes"]
    assert [s["state"] for s in w["states"]] == list(S.STATES)
    assert sum(s["seconds"] for s in w["states"]) == pytest.approx(w["data_s"])
    assert w["largest_loss"] in S.LOSSES
    table = analyze(*window)
    assert table.returncode == 0, table.stderr
    assert "where the time went (1.0 GPU-hours with data)" in table.stdout
    shown = table.stdout.split("where the time went", 1)[1]
    assert "busy, not resolved  0.2" in shown and "input-bound unknown on" in shown  # the states in words, as the job page writes them
    assert not any(key in shown for key in ("no_process", "input_bound", "communication_bound", "busy_unresolved"))
    # what sets the states' no process and idle apart from the job's figures, under the table
    assert "counts once, in the first state that matches (startup, no process, idle," in " ".join(shown.split())
    cfg = tmp_path / "g.toml"
    cfg.write_text("[analytics.states]\nstartup_busy_seconds = -1\n")
    bad = analyze("--config", str(cfg), *window)
    assert bad.returncode == 2 and "[analytics.states]: startup_busy_seconds = -1: expected a number of seconds > 0" in bad.stderr


def test_foreign_processes_are_reported_per_gpu_and_move_no_state():
    n = minutes(30)
    plain = job_states([gpu([90.0] * n)], T)
    foreign = np.full(n, np.nan)
    foreign[10:20] = [1.0] * 5 + [3.0] * 5
    seen = job_states([dataclasses.replace(gpu([90.0] * n), foreign=foreign)], T)
    assert plain.gpus[0].foreign_max is None and seen.gpus[0].foreign_max == 3.0
    assert seen.seconds == plain.seconds
    assert seen.to_json()["gpus"][0]["foreign_processes_max"] == 3.0
