"""Reliability (contract 7): every attempt's end classified once with its evidence, the window's
figures by hand, exact Poisson intervals, lemons (planted found, homogeneous fleet within the
stated false-positive rate), and the real sacct files through the classifier."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from gpufleet.analytics import reliability as r, reliability_store
from gpufleet.analytics.reliability import Attempt, Event, Settings
from gpufleet.collector.sources.slurm_parse import KNOWN_STATES, parse_sacct
from tests.support.shared_data import shared_glob

T0 = datetime(2026, 3, 2)
H = timedelta(hours=1)
GPU0, GPU1 = ("n1", "GPU-a"), ("n1", "GPU-b")


def attempt(state: str, *, raw: str | None = None, exit_code: str | None = None, gpus: int = 2, hours: float = 1.0,
            start: datetime = T0, job: str = "1", held=(GPU0, GPU1), **kw) -> Attempt:
    return Attempt("c", "slurm", job, job, state, start, start + hours * H, gpus=gpus, state_raw=raw or state,
                   exit_code=exit_code, gpus_held=tuple(held), **kw)


def xid(code: int, at: datetime, gpu=GPU1) -> Event:
    return Event(at, gpu[0], gpu[1], "xid", code, gpu=1)


END = T0 + H


@pytest.mark.parametrize("a, events, policy, cause", [
    (attempt("COMPLETED", exit_code="0:0"), [xid(79, END - timedelta(minutes=1))], False, "completed"),
    (attempt("FAILED", exit_code="1:0"), [], False, "user_error"),
    (attempt("OUT_OF_MEMORY", exit_code="0:125"), [], False, "user_error"),
    (attempt("FAILED", exit_code="1:0"), [xid(79, END - timedelta(minutes=2))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(48, END - timedelta(minutes=5))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(94, END)], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(95, END + timedelta(minutes=1))], False, "hardware"),  # within the grace
    (attempt("FAILED", exit_code="1:0"), [xid(63, END - timedelta(minutes=9))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(64, END - timedelta(minutes=9))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(74, END - timedelta(minutes=1))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(119, END - timedelta(minutes=1))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [xid(120, END - timedelta(minutes=1))], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [Event(END - timedelta(minutes=1), "n1", "GPU-a", "ecc_dbe")], False, "hardware"),
    (attempt("FAILED", exit_code="1:0"), [Event(END - timedelta(minutes=1), "n1", "GPU-a", "row_remap_failure")], False, "hardware"),
    (attempt("NODE_FAIL"), [Event(END - timedelta(seconds=30), "n1", "GPU-b", "gpu_lost")], False, "hardware"),
    # an application XID (13: graphics exception) is not hardware evidence
    (attempt("FAILED", exit_code="1:0"), [xid(13, END - timedelta(minutes=1))], False, "user_error"),
    # an event outside the window before the end, or on a GPU the attempt did not hold, is not its cause
    (attempt("FAILED", exit_code="1:0"), [xid(79, END - timedelta(minutes=11))], False, "user_error"),
    (attempt("FAILED", exit_code="1:0"), [xid(79, END - timedelta(minutes=1), gpu=("n2", "GPU-z"))], False, "user_error"),
    (attempt("FAILED", exit_code="1:0"), [xid(79, END + timedelta(minutes=3))], False, "user_error"),
    (attempt("NODE_FAIL"), [], False, "node_failure"),
    (attempt("BOOT_FAIL"), [], False, "node_failure"),
    (attempt("TIMEOUT", exit_code="0:0"), [xid(79, END - timedelta(minutes=1))], False, "timeout"),
    (attempt("DEADLINE"), [], False, "timeout"),
    (attempt("PREEMPTED"), [], False, "preempted"),
    (attempt("REQUEUED"), [], False, "requeued"),
    (attempt("REQUEUED"), [xid(79, END - timedelta(minutes=1))], False, "hardware"),
    (attempt("CANCELLED", raw="CANCELLED by 1000"), [], False, "cancelled_user"),
    (attempt("CANCELLED", raw="CANCELLED by 1000"), [xid(79, END - timedelta(minutes=3))], False, "hardware"),
    (attempt("CANCELLED", raw="CANCELLED by 0"), [], False, "cancelled_admin"),
    (attempt("CANCELLED", raw="CANCELLED by 0"), [], True, "cancelled_policy"),
    (attempt("CANCELLED", raw="CANCELLED by 1000"), [], True, "cancelled_policy"),
    (attempt("CANCELLED", raw="CANCELLED"), [], False, "cancelled_unknown"),
    (attempt("UNKNOWN"), [], False, "unknown"),
    (attempt("RUNNING"), [], False, "not_ended"),
    (attempt("PENDING"), [], False, "not_ended"),
])
def test_each_cause_by_hand(a, events, policy, cause):
    c = r.classify(a, events, policy)
    assert c.cause == cause, c.reason
    if cause == "hardware":
        assert c.evidence and all(e.hardware for e in c.evidence)
        assert "on n1" in c.reason  # which GPU, which event, when: kept with the row
    else:
        assert c.evidence == ()


def test_admin_uids_and_window_are_settings():
    s = Settings(hardware_window=timedelta(minutes=30), admin_uids=frozenset({"0", "64030"}))
    assert r.classify(attempt("CANCELLED", raw="CANCELLED by 64030"), s=s).cause == "cancelled_admin"
    assert r.classify(attempt("FAILED", exit_code="1:0"), [xid(79, END - timedelta(minutes=20))], s=s).cause == "hardware"


def test_requeues_are_attempts_of_one_job():
    first = attempt("REQUEUED", start=T0)
    second = attempt("NODE_FAIL", start=T0 + 2 * H)
    third = attempt("COMPLETED", start=T0 + 4 * H)
    numbered = r.number_requeues([third, first, second, attempt("COMPLETED", job="2")])
    by = {(a.job_key, a.start): a.attempt for a in numbered}
    assert by[("1", T0)] == 1 and by[("1", T0 + 2 * H)] == 2 and by[("1", T0 + 4 * H)] == 3 and by[("2", T0)] == 1


states = st.sampled_from(sorted(KNOWN_STATES | {"UNKNOWN", "garbage"}))


# attempts_and_events' draws, built once: a strategy built inside a draw is validated and labelled
# again at every draw
_BY = st.sampled_from(["", " by 0", " by 1000"])
_HOLDS = st.lists(st.sampled_from([("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-c")]), max_size=3, unique=True)
_EXITS = st.sampled_from([None, "0:0", "1:0", "0:9"])
_EVENT_GPUS = st.sampled_from([("n1", "GPU-a"), ("n2", "GPU-c")])
_EVENT_KINDS, _EVENT_CODES = st.sampled_from(["xid", "ecc_dbe", "ecc_sbe", "gpu_lost"]), st.sampled_from([13, 48, 79, 31])


@st.composite
def attempts_and_events(draw):
    n = draw(st.integers(1, 30))
    out = []
    for i in range(n):
        state = draw(states)
        by = draw(_BY)
        start = T0 + timedelta(minutes=draw(st.integers(0, 600)))
        hold = draw(_HOLDS)
        out.append(Attempt("c", "slurm", str(i), str(i), state, start, start + timedelta(minutes=draw(st.integers(0, 300))),
                           gpus=len(hold), state_raw=state + by, exit_code=draw(_EXITS), gpus_held=tuple(hold)))
    events = [Event(T0 + timedelta(minutes=draw(st.integers(0, 900))), *draw(_EVENT_GPUS), draw(_EVENT_KINDS), draw(_EVENT_CODES))
              for _ in range(draw(st.integers(0, 10)))]
    cancels = draw(st.sets(st.sampled_from([("c", "slurm", str(i)) for i in range(n)])))
    return out, events, cancels


@given(attempts_and_events())
@hsettings(max_examples=200, deadline=None)
def test_each_attempt_classified_exactly_once(data):
    attempts, events, cancels = data
    got = r.classify_all(attempts, events, cancels)
    assert [c.attempt for c in got] == attempts  # one each, none invented, none lost
    assert all(c.cause in r.CAUSES for c in got)
    for c in got:  # evidence only on hardware, and only the attempt's own GPUs
        assert (c.cause == "hardware") == bool(c.evidence)
        assert all((e.host, e.gpu_uuid) in c.attempt.gpus_held for e in c.evidence)
    f = r.figures(got, T0, T0 + timedelta(days=1))
    assert sum(f["causes"].values()) == len(attempts)
    # interruption GPU-hours never exceed allocated
    assert f["lost_gpu_hours"] <= f["allocated_gpu_hours"] + 1e-9
    assert sum(row["failures"] for row in f["mttf_by_size"]) == f["failures"]


@pytest.mark.parametrize("path", shared_glob("slurm/sacct", "*.psv"))
def test_real_sacct_rows_each_classified_once(path):
    text = path.read_text()
    header = path.parent / "xdmod_FORMAT_header.txt"
    fields = header.read_text().strip().split("|") if path.name.startswith("xdmod") else None
    jobs, rejected, problems = parse_sacct(text, fields=fields)
    assert jobs and rejected == 0, problems
    attempts = [Attempt.from_job(j) for j in jobs]
    got = r.classify_all(attempts)
    assert [c.attempt.job_id for c in got] == [j["job_id"] for j in jobs]
    expected = {"COMPLETED": "completed", "TIMEOUT": "timeout", "FAILED": "user_error", "RUNNING": "not_ended"}
    for c in got:
        if c.attempt.state in expected:
            assert c.cause == expected[c.attempt.state], (c.attempt.job_id, c.reason)
        elif c.attempt.state == "CANCELLED":  # "CANCELLED by 2166" / "by 102216": a user's uid, not root
            assert c.cause == "cancelled_user", c.reason
        assert c.cause != "hardware"  # no telemetry: no hardware evidence invented


def test_real_sacct_file_causes_by_hand():
    [path] = [p for p in shared_glob("slurm/sacct", "*.psv") if p.name.startswith("torchx_sacct_parsable2_failed")] or [
        shared_glob("slurm/sacct", "absent")[0]]
    jobs, _, _ = parse_sacct(path.read_text())
    got = {j["job_id"]: c.cause for j, c in zip(jobs, r.classify_all([Attempt.from_job(j) for j in jobs]))}
    assert got == {"1902": "user_error", "54": "not_ended", "89": "cancelled_user"}


# --- Poisson ---


@pytest.mark.parametrize("k, lo, hi", [(0, 0.0, 3.688879), (1, 0.025318, 5.571643), (2, 0.242209, 7.224688),
                                       (10, 4.795389, 18.390356), (100, 81.3640, 121.6268)])
def test_exact_poisson_interval(k, lo, hi):  # Garwood's table (chi-square quantiles / 2)
    got = r.poisson_interval(k)
    assert got[0] == pytest.approx(lo, abs=1e-4) and got[1] == pytest.approx(hi, abs=1e-4)
    assert r.poisson_sf(k, got[0]) == pytest.approx(0.025 if k else 1.0) and r.poisson_cdf(k, got[1]) == pytest.approx(0.025)


@given(st.integers(0, 400), st.floats(0.01, 500))
@hsettings(max_examples=200, deadline=None)
def test_poisson_tails_match_the_sum(k, mu):
    direct = sum(math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1)) for i in range(k + 1))
    assert r.poisson_cdf(k, mu) == pytest.approx(min(1.0, direct), abs=1e-9)
    assert r.poisson_sf(k + 1, mu) == pytest.approx(max(0.0, 1 - direct), abs=1e-9)


# --- figures by hand ---


def test_figures_by_hand():
    day = timedelta(days=1)
    s, e = T0, T0 + 2 * day
    runs = [
        # 8 GPUs x 24 h completed; 8 GPUs x 12 h hardware; 1 GPU x 6 h node failure; 64 GPUs x 3 h preempted
        r.classify(attempt("COMPLETED", gpus=8, hours=24, job="a")),
        r.classify(attempt("FAILED", gpus=8, hours=12, job="b", exit_code="1:0"), [xid(79, T0 + 12 * H - timedelta(minutes=1))]),
        r.classify(attempt("NODE_FAIL", gpus=1, hours=6, job="c", held=(GPU0,))),
        r.classify(attempt("PREEMPTED", gpus=64, hours=3, job="d")),
        r.classify(replace(attempt("RUNNING", gpus=4, job="e", start=T0 + 40 * H), end=None)),
    ]
    f = r.figures(runs, s, e, as_of=T0 + 42 * H)
    allocated = 8 * 24 + 8 * 12 + 1 * 6 + 64 * 3 + 4 * 2  # a running attempt: up to as_of
    assert f["allocated_gpu_hours"] == pytest.approx(allocated)
    assert f["interruptions"] == 3 and f["hardware_interruptions"] == 1 and f["failures"] == 2
    assert f["interruptions_per_1000_gpu_days"] == pytest.approx(3 / (allocated / 24) * 1000)
    assert f["hardware_interruptions_per_1000_gpu_days"] == pytest.approx(1 / (allocated / 24) * 1000)
    # lost: without checkpoints each interrupted attempt's whole run (an upper bound)
    assert f["lost_gpu_hours"] == pytest.approx(8 * 12 + 6 + 64 * 3) and f["lost_is_upper_bound"]
    assert f["lost_share_of_allocated"] == pytest.approx((8 * 12 + 6 + 64 * 3) / allocated)
    sizes = {row["size"]: row for row in f["mttf_by_size"]}  # 2-8: a (24 h), b (12 h), e (2 h so far)
    assert sizes["2-8"]["failures"] == 1 and sizes["2-8"]["job_hours"] == pytest.approx(38) and sizes["2-8"]["mttf_h"] == pytest.approx(38)
    assert sizes["2-8"]["mttf_ci_low_h"] == pytest.approx(38 / 5.571643, rel=1e-5)
    assert sizes["2-8"]["mttf_ci_high_h"] == pytest.approx(38 / 0.025318, rel=1e-4)
    assert sizes["1"]["mttf_h"] == pytest.approx(6)
    assert sizes["9-64"]["failures"] == 0 and sizes["9-64"]["mttf_h"] is None and sizes["9-64"]["mttf_ci_high_h"] is None
    assert sizes["9-64"]["mttf_ci_low_h"] == pytest.approx(3 / 3.688879, rel=1e-5)
    rate = 2 / allocated
    assert f["gpu_failure_rate_per_gpu_hour"] == pytest.approx(rate)
    assert {p["gpus"]: p["mttf_h"] for p in f["projection"]}[16384] == pytest.approx(1 / (16384 * rate))
    # checkpoints: the hardware-failed job saved one 2 h before it died: it lost 2 h x 8 GPUs
    f2 = r.figures(runs, s, e, as_of=T0 + 42 * H, checkpoints={("c", "slurm", "b"): [T0 + 10 * H]})
    assert f2["lost_gpu_hours"] == pytest.approx(8 * 2 + 6 + 64 * 3)
    # the cause mix in the window's timeline buckets (2 days: hours), or in buckets asked for
    mix = {(m["bucket"], m["cause"]): m["attempts"] for m in f["cause_mix"]}
    assert f["mix_bucket_s"] == 3600 and mix == {(T0 + 3 * H, "preempted"): 1, (T0 + 6 * H, "node_failure"): 1, (T0 + 12 * H, "hardware"): 1,
                                                 (T0 + 24 * H, "completed"): 1}
    daily = r.figures(runs, s, e, as_of=T0 + 42 * H, bucket=day)
    mix = {(m["bucket"], m["cause"]): m["attempts"] for m in daily["cause_mix"]}
    assert mix == {(T0, "hardware"): 1, (T0, "node_failure"): 1, (T0, "preempted"): 1, (T0 + day, "completed"): 1}


def test_unknown_gpu_counts_are_unknown_gpu_hours_never_0():
    """Issue #51: an attempt whose GPU count is unknown (accounting without gres/gpu, nothing else
    said it) has unknown GPU-hours - allocated and lost - never 0; the known part is a lower bound,
    counted beside it, and the rates per GPU-day count the attempts of known GPU count."""
    s, e = T0, T0 + timedelta(days=1)
    known = [r.classify(attempt("COMPLETED", gpus=8, hours=10, job="a")),
             r.classify(attempt("PREEMPTED", gpus=2, hours=3, job="b"))]
    unknown = [r.classify(attempt("PREEMPTED", gpus=None, hours=5, job="u")),
               r.classify(attempt("NODE_FAIL", gpus=None, hours=2, job="v"))]
    f = r.figures(known + unknown, s, e)
    assert f["allocated_gpu_hours"] == pytest.approx(8 * 10 + 2 * 3) and f["allocated_unknown_attempts"] == 2  # at least
    assert f["lost_gpu_hours"] == pytest.approx(2 * 3) and f["lost_unknown_interruptions"] == 2
    assert f["interruptions"] == 3 and f["interruptions_per_1000_gpu_days"] == pytest.approx(1 / (86 / 24) * 1000)
    assert {row["size"]: row["gpu_hours"] for row in f["mttf_by_size"]}["unknown"] is None
    # nothing known: unknown, not 0 GPU-hours (and no share, no rate)
    f = r.figures(unknown, s, e)
    assert f["allocated_gpu_hours"] is None and f["lost_gpu_hours"] is None and f["lost_share_of_allocated"] is None
    assert f["interruptions"] == 2 and f["interruptions_per_1000_gpu_days"] is None
    # a chain of unknown GPU count weighs nothing it does not know: counted apart, not as 0 GPUs
    chain = r.link_chains(unknown[:1])
    assert chain[0].gpus is None and r.goodput(chain)["unknown_gpu_chains"] == 1 and r.goodput(chain)["wall_gpu_hours"] == 0


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 4]), st.sampled_from(["COMPLETED", "PREEMPTED", "NODE_FAIL"]),
                          st.integers(1, 12)), min_size=1, max_size=8))
def test_gpu_hours_are_the_known_attempts_and_unknown_where_none_is(runs):
    classified = [r.classify(attempt(state, gpus=n, hours=h, job=str(i))) for i, (n, state, h) in enumerate(runs)]
    f = r.figures(classified, T0, T0 + timedelta(days=1))
    known_h = [n * h for n, _, h in runs if n is not None]
    lost_h = [n * h for n, state, h in runs if n is not None and state != "COMPLETED"]
    unknown = sum(1 for n, _, _ in runs if n is None)
    lost_unknown = sum(1 for n, state, _ in runs if n is None and state != "COMPLETED")
    assert f["allocated_unknown_attempts"] == unknown and f["lost_unknown_interruptions"] == lost_unknown
    assert f["allocated_gpu_hours"] == (None if not known_h else pytest.approx(sum(known_h)))  # never 0 for unknown
    assert f["lost_gpu_hours"] == (None if lost_unknown and not lost_h else pytest.approx(sum(lost_h)))
    # the known parts add up: lost by cause sums to lost; sizes' GPU-hours (the unknown row's unknown) to allocated
    assert sum(f["lost_gpu_hours_by_cause"].values()) == pytest.approx(f["lost_gpu_hours"] or 0.0)
    sizes = {row["size"]: row["gpu_hours"] for row in f["mttf_by_size"]}
    assert sum(v for k, v in sizes.items() if k != "unknown") == pytest.approx(f["allocated_gpu_hours"] or 0.0)
    assert (sizes.get("unknown", 0) is None) == bool(unknown)


# --- lemons ---


def _fleet(seed: int, nodes: int = 200, hours: float = 1000.0, rate: float = 2e-3, lemon: str | None = None, factor: float = 5.0):
    rng = random.Random(seed)
    exposure = {f"n{i:03d}": hours for i in range(nodes)}
    failures = {}
    for n, h in exposure.items():
        mu = rate * h * (factor if n == lemon else 1.0)
        # Poisson by inversion (standard library only)
        k, p, u = 0, math.exp(-mu), rng.random()
        cdf = p
        while u > cdf:
            k += 1
            p *= mu / k
            cdf += p
        failures[n] = k
    return failures, exposure


def test_planted_lemon_found():
    found = 0
    for seed in range(50):
        failures, exposure = _fleet(seed, lemon="n007", factor=8.0)
        got = r.lemons(failures, exposure, fp_rate=0.01, min_failures=3)
        found += any(x.node == "n007" for x in got)
        assert all(x.failures >= 3 for x in got)
    assert found >= 45  # 16 expected failures against 2: found nearly always


def test_homogeneous_fleet_stays_within_the_false_positive_rate():
    fp_rate, seeds = 0.05, 400
    named = sum(bool(r.lemons(*_fleet(seed), fp_rate=fp_rate, min_failures=1)) for seed in range(seeds))
    # family-wise: a fleet with no lemon names one in at most fp_rate of the seeds (3 sigma of slack)
    assert named <= fp_rate * seeds + 3 * math.sqrt(fp_rate * (1 - fp_rate) * seeds)


def test_node_failures_attributed_by_evidence():
    b = r.classify(attempt("FAILED", exit_code="1:0", job="b"), [xid(79, END - timedelta(minutes=1), gpu=GPU1)])
    multi = r.classify(attempt("NODE_FAIL", job="m", held=(GPU0, ("n2", "GPU-c"))))
    single = r.classify(attempt("NODE_FAIL", job="s", held=(("n3", "GPU-d"),)))
    got = r.node_failures([b, multi, single], T0, T0 + 2 * H)
    assert {h: [c.attempt.job_key for c in cs] for h, cs in got.items()} == {"n1": ["b"], "n3": ["s"]}


# --- from a store, through the real writer and reader ---


def _t(h: int, m: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("reliability"))


def build_store(tmp_path):
    """Six jobs on three GPUs, [01:00, 09:00) on 2026-11-16 (as_of 09:00): 1 FAILED on n1 GPU-A+B with
    XID 79 on GPU-B from 02:58 (hardware), 2 NODE_FAIL, 3 COMPLETED, 4 cancelled by the policy, 5 FAILED
    with XID 13 (an application fault: user error), 6 running. (Also the dashboard's Reliability page's.)"""
    from gpufleet.collector.store import StoreWriter
    from tests.support.fleet import Fleet

    f = Fleet(tmp_path)
    xid79 = lambda t: {"xid_last": 79 if _t(2, 58) <= t < _t(3, 10) else 0, "gpu_up": 1.0}  # noqa: E731
    f.gpu_series("n1", "GPU-A", _t(1), _t(7), util=90.0, health=lambda t: {"xid_last": 0, "gpu_up": 1.0})
    f.gpu_series("n1", "GPU-B", _t(1), _t(7), util=90.0, gpu=1, health=xid79)
    f.gpu_series("n2", "GPU-C", _t(1), _t(9), util=90.0, health=lambda t: {"xid_last": 13 if t >= _t(5, 59) else 0})
    f.job("1", account="ml", user="ann", start=_t(1), end=_t(3), gpus=2, placements=[("n1", "GPU-A"), ("n1", "GPU-B")],
          state="FAILED", state_raw="FAILED", exit_code="1:0")
    f.job("2", account="ml", user="ann", start=_t(1), end=_t(2), gpus=1, placements=[("n2", "GPU-C")], state="NODE_FAIL", state_raw="NODE_FAIL")
    f.job("3", account="ml", user="bo", start=_t(4), end=_t(6), gpus=1, placements=[("n1", "GPU-A")], state="COMPLETED", exit_code="0:0")
    f.job("4", account="bio", user="cy", start=_t(3), end=_t(4), gpus=1, placements=[("n2", "GPU-C")], state="CANCELLED",
          state_raw="CANCELLED by 1000")
    f.job("5", account="bio", user="cy", start=_t(5), end=_t(6), gpus=1, placements=[("n2", "GPU-C")], state="FAILED", exit_code="1:0")
    f.job("6", account="bio", user="cy", start=_t(8), end=None, gpus=1, placements=[("n2", "GPU-C")])
    f.write()
    w = StoreWriter(tmp_path)
    w.record_policy([dict(ts=_t(4), cluster="c1", scheduler="slurm", job_key="4", job_id="4", user_name="cy", account="bio",
                          action="cancel", rule="idle", reason="idle 2 h", enforce=True, result="ok", attempt=1)])
    w.publish()
    w.close()
    return f


def test_store_attempts_classified_with_evidence(store):
    from gpufleet.analytics.params import Filters, Params

    f = store
    got = reliability_store.report(f.reader(), Params(_t(0), _t(12)), as_of=_t(9))
    causes = {a["job_id"]: (a["cause"], a["evidence"]) for a in got["interrupted_attempts"]}
    assert got["schema"] == "gpufleet.reliability/v1"
    assert causes["1"][0] == "hardware" and [(e["host"], e["gpu_uuid"], e["code"]) for e in causes["1"][1]] == [("n1", "GPU-B", 79)]
    assert causes["1"][1][0]["ts"] == _t(2, 58)
    assert causes["2"] == ("node_failure", [])
    fig = got["figures"]
    assert {k: v for k, v in fig["causes"].items() if v} == {"hardware": 1, "node_failure": 1, "completed": 1,
                                                             "cancelled_policy": 1, "user_error": 1, "not_ended": 1}
    assert fig["allocated_gpu_hours"] == pytest.approx(2 * 2 + 1 + 2 + 1 + 1 + 1)
    assert fig["failures"] == 2 and fig["lost_gpu_hours"] == pytest.approx(2 * 2 + 1)
    # a filter narrows to its account's attempts; an account's figures are the fleet's of its rows
    # the interrupted chains, most GPU-hours first: job 1 (2 GPUs x 2 h, hardware), job 2 (node failure); job 2
    # ended at 02:00 but job 1 had started at 01:00, so it is no resubmission of it
    assert [(c["job_ids"], c["causes"], c["ettr"]) for c in got["chains"]] == [(["1"], ["hardware"], 0), (["2"], ["node_failure"], 0)]
    assert got["chains"][0]["lost_is_upper_bound"] and got["chains"][0]["checkpoint_advice"]["advised_interval_s"] is None
    assert fig["lost_gpu_hours_by_cause"] == {"hardware": pytest.approx(4), "node_failure": pytest.approx(1)}
    # goodput over every chain: 1, 2 and 4 then 5 (cy's "job" resubmitted an hour after the cancel: one chain, 1 h
    # waiting) did not complete (7 GPU-h of work lost): the 3 chains with an attempt that did not; 3 completed
    # (2 GPU-h) and 6 runs (1 GPU-h; cy's "job" again, but 2 h after 5 failed: a chain of its own) at their first try
    g = got["goodput"]
    assert (g["chains"], g["interrupted_chains"]) == (3, 2)
    assert [g[k] for k in ("wall_gpu_hours", "productive_gpu_hours", "lost_gpu_hours", "requeue_wait_gpu_hours")] == pytest.approx([11, 3, 7, 1])
    assert g["ettr"] == pytest.approx(3 / 11) and g["lost_is_upper_bound"] and "upper bound" in g["checkpoints"]
    bio = reliability_store.report(f.reader(), Params(_t(0), _t(12), filters=Filters(account="bio")), as_of=_t(9))
    assert {k: v for k, v in bio["figures"]["causes"].items() if v} == {"cancelled_policy": 1, "user_error": 1, "not_ended": 1}


def test_evidence_is_read_from_the_facts_of_whole_hours(tmp_path):
    """On a store whose upkeep built every hour's facts, the attempts' health events are read over
    the whole hours around their evidence windows (10 minutes before the window, 2 after): from the
    facts alone, no raw edge minutes (a cut 5-minute bucket's samples, holds and parts: most of the
    report's time at 1,024 GPUs); the same causes and evidence."""
    from gpufleet.analytics import raw_reads
    from gpufleet.analytics.params import Params
    from gpufleet.collector.maintenance import compact
    from gpufleet.collector.store import StoreWriter

    f = build_store(tmp_path)
    w = StoreWriter(f.root)
    compact(w, _t(12), facts_hours=None)
    w.close()
    mark = raw_reads.READS.mark()
    got = reliability_store.report(f.reader(), Params(_t(1), _t(9)), as_of=_t(9))
    hour_us = 3600 * 1_000_000
    edges = [r for r in raw_reads.READS.since(mark) if r.kind == "edge"]  # (an hour without samples has no facts: read, empty)
    assert all(r.lo_us % hour_us == 0 == r.hi_us % hour_us and not r.rows for r in edges), edges
    causes = {a["job_id"]: (a["cause"], [(e["host"], e["gpu_uuid"], e["code"], e["ts"]) for e in a["evidence"]])
              for a in got["interrupted_attempts"]}
    assert causes["1"] == ("hardware", [("n1", "GPU-B", 79, _t(2, 58))]) and causes["2"] == ("node_failure", [])


def analyze_reliability(root, start: str, end: str, *args: str):
    """`gpufleet analyze --reliability` on the store at `root` over [start, end), as a person runs it."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "analyze", "--store", str(root), "--from", start, "--to", end,
                           "--reliability", *args], capture_output=True, text=True, timeout=120)


def test_cli_reliability_json_and_table(store):
    import json

    from gpufleet.analytics.params import Filters
    from gpufleet.analytics.scope import reliability_model_note

    run = lambda *a: analyze_reliability(store.root, "2026-11-16T00:00:00Z", "2026-11-16T09:00:00Z", *a)  # noqa: E731
    j = run("--format", "json")
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert doc["schema"] == "gpufleet.reliability/v1" and doc["figures"]["failures"] == 2
    assert doc["interrupted_attempts"][0]["evidence"][0]["ts"] == "2026-11-16T02:58:00"
    t = run()
    assert t.returncode == 0, t.stderr
    assert "hardware" in t.stdout and "XID 79 (GPU fell off the bus) on n1 GPU 1" in t.stdout and "Job MTTF by size" in t.stdout
    # a chain's job ids as the pages list them, never a Python list
    chains = t.stdout.split("Job chains that lost most", 1)[1]
    assert doc["chains"] and doc["chains"][0]["job_ids"][0] in chains and "['" not in t.stdout
    # a GPU model filter does not narrow the attempts (all of a job's GPUs count, whatever their model): the JSON and the
    # table say so, and the figures are the fleet's
    assert doc["model_note"] is None
    m = run("--format", "json", "--model", "A100")
    assert m.returncode == 0, m.stderr
    by_model = json.loads(m.stdout)
    assert by_model["filters"] == {"model": "A100"} and by_model["figures"] == doc["figures"]
    assert by_model["model_note"] == reliability_model_note(Filters(model="A100"))
    assert "the filter model=A100 does not narrow it" in by_model["model_note"]
    assert f"  {by_model['model_note']}\n" in run("--model", "A100").stdout
    # the filters said as they were asked (a job filter's key, not the list SQL binds)
    from gpufleet.analytics.params import Params
    from gpufleet.collector.store import open_reader

    one_job = Params(datetime(2026, 11, 16), datetime(2026, 11, 16, 9), filters=Filters(job_key="1"))
    assert reliability_store.report(open_reader(store.root), one_job)["filters"] == {"job_key": "1"}
    # a window without a job attempt says its zeros measure nothing, and where the store's jobs are (it read as a fleet
    # without failures); one with attempts says nothing of the kind
    assert doc["warnings"] == []
    empty = analyze_reliability(store.root, "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z", "--format", "json")
    assert empty.returncode == 0, empty.stderr
    said = json.loads(empty.stdout)["warnings"]
    assert len(said) == 1 and said[0].startswith("no job attempts in this window: its figures measure nothing (the store's "
                                                 "jobs run from 2026-11-16 ") and f"warning: {said[0]}" in empty.stderr
    assert f"WARNING: {said[0]}\n" in analyze_reliability(store.root, "2026-03-02T00:00:00Z", "2026-03-09T00:00:00Z").stdout


# --- chains and goodput ---


def _run(job: str, state: str, start_h: float, end_h: float | None, *, name: str = "train", user: str = "ann",
         submit_h: float | None = None, gpus: int = 8, raw: str | None = None) -> Attempt:
    return Attempt("c", "slurm", job, job, state, T0 + start_h * H, None if end_h is None else T0 + end_h * H, gpus=gpus,
                   state_raw=raw or state, user_name=user, account="ml", name=name,
                   submit=None if submit_h is None else T0 + submit_h * H)


def test_chain_by_hand():
    s = Settings(resubmit_window=H)
    runs = r.classify_all([
        _run("7", "REQUEUED", 0, 2), _run("7", "NODE_FAIL", 2.5, 5),          # a requeue, then a node failure
        _run("9", "COMPLETED", 6, 10, submit_h=5.2),                          # resubmitted 12 min later: continues
        _run("11", "COMPLETED", 10.5, 11, submit_h=10.2),                     # after a completion: a new chain
        _run("12", "FAILED", 0, 1, name="other", raw="FAILED"),
        _run("13", "COMPLETED", 3, 4, name="other", submit_h=2.5),            # 1.5 h after the failure: too late
    ], s=s)
    chains = r.link_chains(runs, checkpoints={("c", "slurm", "7"): [T0 + 1.5 * H, T0 + 0.5 * H]}, s=s)
    by_first = {ch.attempts[0].attempt.job_key: ch for ch in chains}
    assert sorted(by_first) == ["11", "12", "13", "7"]
    ch = by_first["7"]
    assert [c.attempt.job_key for c in ch.attempts] == ["7", "7", "9"]
    assert ch.wall_s == 10 * 3600 and ch.run_s == 8.5 * 3600 and ch.gap_s == 1.5 * 3600
    # lost: attempt 1 since its 1.5 h checkpoint (0.5 h); attempt 2 reported none: all 2.5 h (an upper bound)
    assert ch.lost_s == 3 * 3600 and ch.lost_upper_bound and ch.productive_s == 5.5 * 3600
    assert ch.ettr == pytest.approx(0.55) and ch.interruptions == 2
    advice = r.checkpoint_advice(ch, gpu_failure_rate_per_h=1 / (8 * 8), checkpoint_save_s=60, used_interval_s=3600)
    assert advice["mttf_h"] == pytest.approx(8) and advice["advised_interval_s"] == pytest.approx(math.sqrt(2 * 60 * 8 * 3600))
    assert r.young_daly_interval_s(60, 28800) == pytest.approx(1859.0319, rel=1e-6)
    assert r.checkpoint_advice(ch, None, 60, None)["advised_interval_s"] is None  # no rate: unknown, not 0


# attempt_histories' draws, built once: a strategy built inside a draw is validated and labelled
# again at every draw (two thirds of these properties' time was hypothesis building strategies)
_STARTS = {h: st.floats(0, h) | st.sampled_from([0.0, 1.0, 1.5]) for h in (6, 12, 48)}  # hours (ties: attempts starting together, or as one ends)
_LENGTHS = st.floats(0, 6) | st.sampled_from([0.0, 0.5, 1.0])
_STATES = st.sampled_from(["COMPLETED", "FAILED", "NODE_FAIL", "REQUEUED", "RUNNING"])
_USERS, _NAMES = st.sampled_from(["u", "v"]), st.sampled_from(["a", "b", None])


@st.composite
def attempt_histories(draw, hours: float = 48):
    """Attempts of jobs; a job's attempts share its user and name, as the store's do (its
    earlier attempts take them from the job's record: sql.RELIABILITY_ATTEMPTS)."""
    out, whose = [], {}
    for i in range(draw(st.integers(1, 25))):
        start = draw(_STARTS[hours])
        job = str(draw(st.integers(0, 8)))
        job = job + f".{i}" if draw(st.booleans()) else job
        user, name = whose.setdefault(job, (draw(_USERS), draw(_NAMES)))
        out.append(_run(job, draw(_STATES), start, None if draw(st.integers(0, 9)) == 0 else start + draw(_LENGTHS),
                        name=name, user=user, submit_h=start - draw(st.floats(0, 3))))
    return out


def broken_chains(chains, key=id) -> list[tuple]:
    """The chains with an attempt that did not complete, as their attempts (`key` of each), sorted."""
    return sorted(tuple(key(c) for c in ch.attempts) for ch in chains if any(c.broken for c in ch.attempts))


@given(attempt_histories())
@hsettings(max_examples=200, deadline=None)
def test_chain_wall_is_attempts_plus_gaps(attempts):
    as_of = T0 + 60 * H
    classified = r.classify_all(attempts)
    chains = r.link_chains(classified, as_of=as_of)
    linked = [c.attempt for ch in chains for c in ch.attempts]
    assert sorted(map(id, linked)) == sorted(id(c.attempt) for c in classified)  # each attempt in exactly one chain
    # the report links only the chains with an attempt that did not complete: the same chains as linking all
    assert broken_chains(r.link_chains(r.chain_candidates(classified), as_of=as_of)) == broken_chains(chains)
    for ch in chains:
        assert ch.wall_s == pytest.approx(ch.run_s + ch.gap_s, abs=1e-6)
        assert 0 <= ch.lost_s <= ch.run_s + 1e-6 and ch.gap_s >= 0
        assert ch.ettr is None or 0 <= ch.ettr <= 1 + 1e-9


def test_a_failure_of_no_length_is_continued_by_the_next_attempt_not_by_itself():
    """(Hypothesis' find) An attempt that failed as it started ends where it starts: it is no
    attempt that can continue it, so the window of its name's attempts reaches the resubmission."""
    s = Settings(resubmit_window=H / 2)
    runs = r.classify_all([_run("0", "FAILED", 3.5, 3.5, name="a", submit_h=3.5), _run("2", "COMPLETED", 4, None, name="a", submit_h=4)], s=s)
    assert [c.attempt.job_key for c in r.chain_candidates(runs, s)] == ["0", "2"]
    assert [[c.attempt.job_key for c in ch.attempts] for ch in r.link_chains(runs, s=s)] == [["0", "2"]]
    few, _, linked = _listed_and_every([c.attempt for c in runs], s, T0 + 10 * H)  # (the store's listing too)
    assert sorted(c.attempt.job_key for c in few) == sorted(c.attempt.job_key for c in linked) == ["0-0", "2-1"]


@given(st.sampled_from([6, 12, 48]).flatmap(attempt_histories), st.sampled_from([0.5, 1, 3]))
@hsettings(max_examples=300, deadline=None)
def test_the_candidates_link_the_broken_chains_as_linking_all_does(attempts, window_h):
    """chain_candidates (and sql.RELIABILITY_ATTEMPTS' listing, its mirror) leaves out a name's
    attempts far from its failures: the chains with an attempt that did not complete are those of
    linking every attempt, whatever the resubmit window and however dense the history (queue waits
    of up to 3 h: an attempt submitted in the window may start after others of its name)."""
    s = Settings(resubmit_window=window_h * H)
    as_of = T0 + 60 * H
    classified = r.classify_all(attempts, s=s)
    candidates = r.chain_candidates(classified, s)
    every = r.link_chains(classified, s=s, as_of=as_of)
    assert broken_chains(r.link_chains(candidates, s=s, as_of=as_of)) == broken_chains(every)
    # and goodput, the report's (candidates linked, the rest counted whole), is that of linking every attempt
    picked = {id(c) for c in candidates}
    got = r.goodput_of(r.link_chains(candidates, s=s, as_of=as_of), [c for c in classified if id(c) not in picked], as_of)
    want = r.goodput_of(every, [], as_of)
    assert got.keys() == want.keys()
    for k, v in want.items():  # (sums in another order: equal to float dust)
        assert got[k] == (pytest.approx(v, rel=1e-12, abs=1e-9) if isinstance(v, float) else v), k


def test_goodput_counts_a_job_whose_every_attempt_completed_whole_linked_or_not():
    """Two attempts of one job, both completed, 2 h apart: no failure, so no requeue wait and nothing lost - the same
    figures whether the report linked them as a chain (the candidate after a failure, say) or left them unlinked."""
    s, as_of = Settings(), T0 + 10 * H
    runs = r.classify_all([_run("7", "COMPLETED", 1, 2, name="a"), _run("7", "COMPLETED", 4, 5, name="a")], s=s)
    chains = r.link_chains(runs, s=s, as_of=as_of)
    assert [len(ch.attempts) for ch in chains] == [2] and chains[0].gap_s == 2 * 3600  # linked by job: one chain, a 2 h gap
    linked, alone = r.goodput_of(chains, [], as_of), r.goodput_of([], runs, as_of)
    assert linked == alone
    assert linked["wall_gpu_hours"] == linked["productive_gpu_hours"] == 2 * runs[0].attempt.equiv and linked["ettr"] == 1.0
    assert linked["requeue_wait_gpu_hours"] == 0 and linked["chains"] == 0


def _listed_and_every(attempts: list[Attempt], s: Settings, as_of: datetime) -> tuple[list, list, list]:
    """The attempts stored (each a job of its own), read_store's listed ones (no largest), every one, and the
    chains' candidates the store marks among every one."""
    import tempfile

    from gpufleet.analytics.params import Params
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter, open_reader

    rows = [_job_row(job_key=f"{a.job_key}-{i}", job_id=f"{a.job_key}-{i}", state=a.state, state_raw=a.state_raw, start=a.start, end=a.end,
                     submit=a.submit, gpus=a.gpus, user_name=a.user_name, account=a.account, name=a.name) for i, a in enumerate(attempts)]
    with tempfile.TemporaryDirectory() as tmp:
        w = StoreWriter(tmp)
        w.commit(Batch(key="attempts", jobs=rows))
        w.publish()
        w.close()
        con = open_reader(tmp)
        p = Params(T0 - 10 * H, as_of)
        few, _, _, _ = reliability_store.read_store(con, p, s, as_of=as_of, top=0)
        every, linked, _, _ = reliability_store.read_store(con, p, s, as_of=as_of, top=10**6)
    return few, every, linked


@given(st.sampled_from([6, 12, 48]).flatmap(attempt_histories), st.sampled_from([0.5, 1, 3]))
@hsettings(max_examples=25, deadline=None)
def test_the_store_lists_the_attempts_chain_candidates_names(attempts, window_h):
    """sql.RELIABILITY_ATTEMPTS' listing mirrors chain_candidates: stored (each attempt a job of
    its own), the attempts the store lists (no largest ones) are the candidates among every
    attempt listed, and link the same chains with an attempt that did not complete."""
    s, as_of = Settings(resubmit_window=window_h * H), T0 + 60 * H
    few, every, linked = _listed_and_every(attempts, s, as_of)
    assert len(every) == len(attempts)
    candidates = sorted(c.attempt.job_key for c in r.chain_candidates(every, s))
    # (listed alone, or among every attempt listed: the store marks the candidates the report links)
    assert sorted(c.attempt.job_key for c in few) == sorted(c.attempt.job_key for c in linked) == candidates
    key = lambda c: c.attempt.job_key  # noqa: E731 - (two reads of one store: the same attempts, other objects)
    assert broken_chains(r.link_chains(r.chain_candidates(few, s), s=s, as_of=as_of), key) == broken_chains(r.link_chains(every, s=s, as_of=as_of), key)


def test_the_largest_chains_are_the_longest_of_the_most_gpus_however_few_are_linked(tmp_path):
    """The report's checkpoint advice goes to the `top` largest chains, GPUs then wall time: among jobs that ran once
    on as many GPUs, the longest, not the first by job key (the store's listing and the report order them alike)."""
    from gpufleet.analytics.params import Params
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter, open_reader

    hours = [1, 5, 2, 7, 3, 6, 4]  # job i ran hours[i] on 8 GPUs; a 1-GPU job ran longest of all
    rows = [_job_row(job_key=f"j{i}", job_id=f"j{i}", state="COMPLETED", state_raw="COMPLETED", start=T0, end=T0 + h * H, submit=T0,
                     gpus=8, user_name="ann", account="ml", name=f"n{i}") for i, h in enumerate(hours)]
    rows.append(_job_row(job_key="small", job_id="small", state="COMPLETED", state_raw="COMPLETED", start=T0, end=T0 + 9 * H, submit=T0,
                         gpus=1, user_name="ann", account="ml", name="small"))
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="jobs", jobs=rows))
    w.publish()
    w.close()
    rel = reliability_store.report(open_reader(tmp_path), Params(T0, T0 + 10 * H), as_of=T0 + 10 * H, top=3)
    assert [x["job_ids"] for x in rel["checkpoint_advice"]] == [["j3"], ["j5"], ["j1"]]


@pytest.mark.parametrize("window_s", [3600.0, 1234.567891, 0.5])
@pytest.mark.parametrize("after_us, links", [(0, True), ("window", True), ("window+1", False)])
def test_the_store_meets_a_resubmission_at_the_window_s_edges(window_s, after_us, links):
    """A resubmission exactly at a failed attempt's end, exactly its resubmit window after, and a microsecond past that,
    whatever the window (whole seconds or not): the store lists the first two as chain candidates, as chain_candidates
    does, and not the third (RELIABILITY_ATTEMPTS meets them on the window's steps); the report links the first two to
    the failure, as linking every attempt does."""
    window = timedelta(seconds=window_s)
    end = T0 + 10 * H
    offset = {0: timedelta(0), "window": window, "window+1": window + timedelta(microseconds=1)}[after_us]
    failed = Attempt("c", "slurm", "f", "f", "FAILED", T0 + 9 * H, end, gpus=8, state_raw="FAILED", user_name="ann", account="ml",
                     name="train", submit=T0 + 8 * H)
    again = Attempt("c", "slurm", "g", "g", "COMPLETED", end + offset, end + offset + H, gpus=8, state_raw="COMPLETED", user_name="ann",
                    account="ml", name="train", submit=end + offset)
    s, as_of = Settings(resubmit_window=window), T0 + 60 * H
    few, every, linked = _listed_and_every([failed, again], s, as_of)
    assert sorted(c.attempt.job_key for c in few) == sorted(c.attempt.job_key for c in r.chain_candidates(every, s))
    assert sorted(c.attempt.job_key for c in few) == (["f-0", "g-1"] if links else ["f-0"])
    chains = [[c.attempt.job_key for c in ch.attempts] for ch in r.link_chains(linked, s=s, as_of=as_of)]
    assert sorted(chains) == ([["f-0", "g-1"]] if links else [["f-0"]])


@given(attempt_histories())
@hsettings(max_examples=200, deadline=None)
def test_goodput_and_lost_hours_add_up(attempts):
    as_of = T0 + 60 * H
    classified = r.classify_all(attempts)
    f = r.figures(classified, T0 - H, as_of, as_of=as_of)
    # the causes of lost GPU-hours sum to the total, each an interruption's, none more than allocated
    assert sum(f["lost_gpu_hours_by_cause"].values()) == pytest.approx(f["lost_gpu_hours"])
    assert set(f["lost_gpu_hours_by_cause"]) <= set(r.INTERRUPTION_CAUSES)
    assert f["lost_gpu_hours"] <= f["allocated_gpu_hours"] + 1e-9
    g = r.goodput(r.link_chains(classified, as_of=as_of))
    assert 0 <= g["productive_gpu_hours"] <= g["wall_gpu_hours"] + 1e-9
    assert g["productive_gpu_hours"] + g["lost_gpu_hours"] + g["requeue_wait_gpu_hours"] == pytest.approx(g["wall_gpu_hours"], abs=1e-6)
    assert g["ettr"] is None or 0 <= g["ettr"] <= 1 + 1e-9


# --- every attempt stored ---


def _job_row(**kw):
    from gpufleet.collector.schema import JOB_COLUMNS

    row = dict.fromkeys(JOB_COLUMNS)
    row.update(cluster="c", scheduler="slurm", job_key="7", job_id="7", source="sacct", updated_at=T0, gpus=8, user_name="u",
               account="a", name="n", partition="p")
    return {**row, **kw}


def test_split_attempts_keeps_the_latest_record_per_job():
    from gpufleet.collector.sources.slurm_parse import split_attempts

    rows = [_job_row(start=T0, end=T0 + 2 * H, state="REQUEUED"), _job_row(job_key="8", job_id="8", start=T0, end=T0 + H, state="COMPLETED"),
            _job_row(start=None, end=None, state="PENDING"), _job_row(start=T0 + H / 2, end=T0 + H / 2, state="REQUEUED")]
    latest, earlier = split_attempts(rows)
    assert sorted((j["job_key"], j["state"]) for j in latest) == [("7", "PENDING"), ("8", "COMPLETED")]  # not ended: the latest
    assert sorted((a["start"], a["state"]) for a in earlier) == [(T0, "REQUEUED"), (T0 + H / 2, "REQUEUED")]
    again, _ = split_attempts([_job_row(start=T0, end=T0 + 2 * H, state="REQUEUED"), _job_row(start=T0 + 3 * H, end=None, state="RUNNING")])
    assert [j["start"] for j in again] == [T0 + 3 * H]


def test_store_keeps_every_attempt_in_any_order(tmp_path):
    """A requeued job read record by record, in any order (a listing without --duplicates shows
    the new record only; a backfill of an old window the old one): the jobs table keeps the latest,
    job_attempts the earlier one, filled as more of it is read; reliability classifies both."""
    from itertools import permutations

    from gpufleet.analytics.params import Params
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter, open_reader

    reads = [_job_row(start=T0, state="RUNNING"), _job_row(start=T0, end=T0 + 2 * H, state="REQUEUED", state_raw="REQUEUED"),
             _job_row(start=T0 + 3 * H, state="RUNNING"), _job_row(start=T0 + 3 * H, end=T0 + 5 * H, state="COMPLETED")]
    for n, order in enumerate(p for p in permutations(range(4)) if p.index(0) < p.index(1) and p.index(2) < p.index(3)):
        w = StoreWriter(tmp_path / str(n))
        for i in order:
            w.commit(Batch(key=str(i), jobs=[reads[i]]))
        w.publish()
        assert w.db.sql('SELECT start, "end", state FROM job_attempts').fetchall() == [(T0, T0 + 2 * H, "REQUEUED")], order
        assert w.db.sql('SELECT start, "end", state FROM jobs').fetchall() == [(T0 + 3 * H, T0 + 5 * H, "COMPLETED")], order
        w.close()
        rel = reliability_store.report(open_reader(tmp_path / str(n)), Params(T0 - H, T0 + 10 * H), as_of=T0 + 10 * H)
        assert [(a["attempt"], a["cause"]) for a in rel["interrupted_attempts"]] == [(1, "requeued")]
        [chain] = rel["chains"]
        assert chain["causes"] == ["requeued", "completed"] and chain["wall_h"] == 5 and chain["requeue_wait_h"] == 1
        assert chain["ettr"] == pytest.approx(2 / 5)  # 2 h of the first attempt lost (no checkpoint: an upper bound)


def test_a_store_of_schema_6_gains_job_attempts(tmp_path):
    from gpufleet.collector import schema
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter

    w = StoreWriter(tmp_path)
    w.commit(Batch(key="1", jobs=[_job_row(start=T0, state="RUNNING")]))
    w.db.execute("DROP TABLE job_attempts")
    w.db.execute("DELETE FROM schema_version WHERE version >= 7")
    w.close()
    w = StoreWriter(tmp_path)
    assert w.schema_version() == schema.SCHEMA_VERSION >= 7  # (later migrations ran too)
    w.commit(Batch(key="2", jobs=[_job_row(start=T0 + H, state="RUNNING")]))  # a requeue: the stored record is an earlier attempt
    assert w.db.sql("SELECT start, state FROM job_attempts").fetchall() == [(T0, "RUNNING")]
    w.close()


def test_pod_restarts_are_earlier_attempts():
    from gpufleet.collector.sources.kubernetes import pod_restarts, pod_to_job

    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "k1", "containers": [{"name": "train", **gpu}, {"name": "side"}]},
           "status": {"phase": "Running", "startTime": "2026-03-02T00:00:00Z", "containerStatuses": [
               {"name": "train", "restartCount": 1, "state": {"running": {"startedAt": "2026-03-02T01:05:00Z"}},
                "lastState": {"terminated": {"startedAt": "2026-03-02T00:00:10Z", "finishedAt": "2026-03-02T01:00:00Z",
                                             "exitCode": 137, "reason": "OOMKilled"}}},
               {"name": "side", "restartCount": 3, "lastState": {"terminated": {"startedAt": "2026-03-02T00:00:10Z", "exitCode": 1}}}]}}
    job = pod_to_job(pod, "k", T0)
    [a] = pod_restarts(pod, job)  # the sidecar holds no GPU: its restarts are not the job's
    assert (a["job_key"], a["start"], a["end"], a["state"], a["exit_code"], a["gpus"]) == (
        "ns/p", T0 + timedelta(seconds=10), T0 + H, "OUT_OF_MEMORY", "137:0", 1)
    assert r.classify(Attempt.from_job({**job, **a})).cause == "user_error"


def test_hardware_xids_are_the_alert_rules_xid_hardware():
    import yaml
    from pathlib import Path

    thresholds = yaml.safe_load((Path(__file__).resolve().parents[1] / "alerts" / "thresholds.yml").read_text())
    assert sorted(r.HARDWARE_XIDS) == sorted(thresholds["xid_hardware"])


@pytest.mark.parametrize("state", r.NO_EVIDENCE_STATES)
def test_states_whose_gpus_the_store_does_not_read_need_no_evidence(state):
    # the store reads an attempt's GPUs only when evidence can decide its cause
    a = attempt(state, exit_code="1:0")
    assert r.classify(a, [xid(79, END - timedelta(minutes=1))]).cause == r.classify(a).cause


def test_summed_attempts_count_as_listed_ones(store):
    """The store sums the attempts the report needs no row of (completed or running, in no chain
    with a broken attempt, not among the largest): the figures are those of every attempt listed."""
    from gpufleet.analytics.params import Params

    p = Params(_t(0), _t(12))
    few, _, summed, _ = reliability_store.read_store(store.reader(), p, as_of=_t(9), top=0)
    every, _, none, _ = reliability_store.read_store(store.reader(), p, as_of=_t(9), top=10**6)
    assert summed and not none and len(few) < len(every)
    assert sum(x.attempts for x in summed) + len(few) == len(every)
    got = r.figures(few, p.start, p.end, as_of=_t(9), summed=summed)
    want = r.figures(every, p.start, p.end, as_of=_t(9))
    assert got == want
    # read for the figures alone (the policy's): only the jobs with a broken attempt listed, the same figures
    broken, linked, summed_more, _ = reliability_store.read_store(store.reader(), p, as_of=_t(9), top=0, chains=False)
    assert linked is None and len(broken) <= len(few) and sum(x.attempts for x in summed_more) + len(broken) == len(every)
    assert any(c.broken for c in every) and {c.attempt.job_key for c in every if c.broken} <= {c.attempt.job_key for c in broken}
    assert r.figures(broken, p.start, p.end, as_of=_t(9), summed=summed_more) == want


def test_figures_and_lemons_are_the_report_s(store):
    """The policy's figures_and_lemons (a read for the figures alone) gives the report's figures and lemons; the report
    refuses such a read (it has no chains to link)."""
    from gpufleet.analytics.params import Params

    p = Params(_t(0), _t(12))
    got = reliability_store.figures_and_lemons(store.reader(), p, as_of=_t(9))
    want = reliability_store.report(store.reader(), p, as_of=_t(9))
    assert want["figures"]["attempts"] and got == {"figures": want["figures"], "lemons": want["lemons"]}
    with pytest.raises(ValueError, match="linked the chains"):
        reliability_store.report(store.reader(), p, as_of=_t(9), done=reliability_store.read(store.reader(), p, as_of=_t(9), chains=False))


def test_listed_rows_make_the_attempts_attempt_makes(store):
    """RELIABILITY_LISTED's columns are Attempt's fields in order (then share, the GPUs held, linked): the attempts
    read_store makes from its rows without Attempt's __init__ equal, and hash as, those the __init__ makes."""
    from dataclasses import fields

    from gpufleet.analytics import sql
    from gpufleet.analytics.params import Params

    p, s = Params(_t(0), _t(12)), Settings()
    binds = {"start": p.start, "end": p.end, "as_of": _t(9), "max_gap": p.max_gap.total_seconds(), "top": 10**6, "chains": True,
             "no_evidence_states": list(r.NO_EVIDENCE_STATES), "ended_states": sorted(r.ENDED_STATES),
             "resubmit_s": s.resubmit_window.total_seconds(), **p.filters.bind()}
    cur = store.reader().cursor()
    cur.execute(sql.RELIABILITY_ATTEMPTS, sql.bound(sql.RELIABILITY_ATTEMPTS, binds))
    found = cur.execute(sql.RELIABILITY_LISTED, sql.bound(sql.RELIABILITY_LISTED, binds))
    names = [d[0] for d in found.description]
    rows = found.fetchall()
    assert names == [f.name for f in fields(Attempt)][:16] + ["share", "held_hosts", "held_uuids", "linked"]
    assert rows and any(row[17] for row in rows)  # (some attempt with its GPUs held)
    for row in rows:
        made = Attempt(*row[:16], share=row[16], gpus_held=tuple(zip(row[17], row[18])) if row[17] else ())
        got = reliability_store.listed_attempt(row)
        assert got == made and hash(got) == hash(made) and repr(got) == repr(made)


def test_retention_deletes_checkpoints_older_than_facts_days(tmp_path):
    """Checkpoints are job reports: kept facts_days, like job throughput and the hour facts."""
    from gpufleet.collector.maintenance import apply_retention
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter, open_reader

    t = datetime(2026, 11, 1)
    w = StoreWriter(tmp_path, clock=lambda: t)
    saved = lambda at: {"seen": at, "cluster": "c1", "scheduler": "slurm", "job_key": "42", "saved_at": at, "duration_s": 30.0}  # noqa: E731
    w.commit(Batch(key="a", checkpoints=[saved(t), saved(t + timedelta(days=10))]))
    w.publish()
    assert apply_retention(w, t + timedelta(days=12), raw_days=35, facts_days=11) == 1  # 12 days old > 11: gone
    w.publish()
    w.close()
    assert open_reader(tmp_path).execute("SELECT saved_at FROM job_checkpoints").fetchall() == [(t + timedelta(days=10),)]
