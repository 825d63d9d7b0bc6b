"""Queue gaps (issue #55, gpufleet.analytics.queue_gaps): capacity left free while pending jobs that
would have fit waited, per partition and GPU model - hand-computed scenarios on the store's tables
and hypothesis invariants (the gap never exceeds the free capacity nor the waiting jobs' demand; a
job that would never have fit never counts; a filter's pool equals its row unfiltered)."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.prices import price_table
from gpufleet.analytics.queue_gaps import queue_gaps
from gpufleet.collector.schema import ALLOCATIONS_DDL, GPUS_DDL, JOB_ATTEMPTS_DDL, JOBS_DDL

T0 = datetime(2026, 11, 16)
H = timedelta(hours=1)


def T(h: float) -> datetime:
    return T0 + h * H


def tables(gpus, jobs) -> duckdb.DuckDBPyConnection:
    """A connection with the store's jobs, allocations and gpus tables. gpus: (host, uuid, model),
    seen from T(-24) to T(24); jobs: (job_key, partition, gpus, eligible h, start h or None, end h
    or None, [gpus rows] held from start to end)."""
    con = duckdb.connect()
    for ddl in (JOBS_DDL, ALLOCATIONS_DDL, GPUS_DDL, JOB_ATTEMPTS_DDL):
        con.execute(ddl)
    for host, uuid, model in gpus:
        con.execute("INSERT INTO gpus (cluster, host, gpu_uuid, gpu, model, first_seen, last_seen) VALUES ('c', ?, ?, 0, ?, ?, ?)",
                    [host, uuid, model, T(-24), T(24)])
    for key, part, n, elig, start, end, held in jobs:
        con.execute("INSERT INTO jobs (cluster, scheduler, job_key, job_id, account, partition, submit, eligible, start, \"end\", gpus, "
                    "source, updated_at) VALUES ('c', 'slurm', ?, ?, 'team', ?, ?, ?, ?, ?, ?, 'sacct', ?)",
                    [key, key, part, T(elig), T(elig), None if start is None else T(start), None if end is None else T(end), n, T(0)])
        for host, uuid, _ in held:
            con.execute("INSERT INTO allocations VALUES ('c', 'slurm', ?, ?, ?, -1, 0, ?, ?, 'exporter')",
                        [key, host, uuid, T(start), T(end if end is not None else 24)])
    return con


def params(lo: float = 0, hi: float = 10, **f) -> Params:
    return Params(start=T(lo), end=T(hi), filters=Filters(**f), prices={"H100": 2.0})


FOUR = [("n1", f"G{i}", "H100") for i in range(4)]


def pool(g, partition="p"):
    [row] = [r for r in g.pools.iter_rows(named=True) if r["partition"] == partition]
    return row


def test_a_job_that_fits_on_free_gpus_counts_from_eligible_to_its_start():
    """4 H100s in partition p; job A holds 2 of them 0-10 h; job B (2 GPUs) eligible at 2 h starts
    at 5 h on the other two: 2 GPUs free 0-5 h (10 GPU-h), B waited 3 h while it fit: 6 GPU-h, $12."""
    con = tables(FOUR, [("A", "p", 2, 0, 0, 10, FOUR[:2]), ("B", "p", 2, 2, 5, 10, FOUR[2:])])
    g = queue_gaps(con, params())
    p = pool(g)
    assert (p["model"], p["gpus"], p["free_gpu_h"], p["gap_gpu_h"], p["gap_cost"], p["jobs_waited"], p["jobs_fit"]) == (
        "H100", 4, pytest.approx(10), pytest.approx(6), pytest.approx(12), 1, 1)
    [j] = g.jobs.to_dicts()
    assert (j["job_id"], j["waited_h"], j["fit_h"], j["fit_gpu_h"]) == ("B", pytest.approx(3), pytest.approx(3), pytest.approx(6))


def test_a_job_that_would_not_have_fit_never_counts():
    """Job C asks for 3 GPUs while at most 1 of p's is free: it waits, no gap; a 1-GPU job D waiting
    beside it fits, and the gap is its 1 GPU x its wait."""
    con = tables(FOUR, [("A", "p", 2, 0, 0, 10, FOUR[:2]), ("C", "p", 3, 1, None, None, []), ("D", "p", 1, 4, 6, 10, FOUR[2:3])])
    g = queue_gaps(con, params())
    p = pool(g)
    assert p["jobs_waited"] == 2 and p["jobs_fit"] == 1
    assert p["gap_gpu_h"] == pytest.approx(2)  # D: 1 GPU x 4-6 h
    assert p["gpus"] == 3 and p["free_gpu_h"] == pytest.approx(6)  # G2 0-6 h (G3 never served p: not in its pool)
    assert [j["job_id"] for j in g.jobs.to_dicts()] == ["D"]


def test_the_gap_is_capped_by_the_free_gpus_and_a_gpu_held_by_another_partition_is_not_free():
    """Two 2-GPU jobs wait 0-4 h while 2 GPUs are free: the gap is 2 GPUs, not 4; each job fit all
    along. G3 is held by partition q's job: p's pool has G0-G2 free but the q job holds G3."""
    con = tables(FOUR, [("A", "p", 1, 0, 0, 10, FOUR[:1]), ("Q", "q", 1, 0, 0, 10, FOUR[3:]),
                        ("B", "p", 2, 0, 4, 10, FOUR[1:3]), ("C", "p", 2, 0, 4, 10, FOUR[1:3])])
    g = queue_gaps(con, params())
    p = pool(g)
    assert p["gpus"] == 3  # G3 never served p
    assert p["free_gpu_h"] == pytest.approx(2 * 4) and p["gap_gpu_h"] == pytest.approx(2 * 4)
    assert sorted(j["fit_gpu_h"] for j in g.jobs.to_dicts()) == [pytest.approx(8), pytest.approx(8)]
    assert pool(g, "q")["gap_gpu_h"] == 0


def test_unknown_sizes_and_pools_are_counted_apart_and_an_unpriced_model_has_unknown_money():
    gpus = [("n1", "G0", "H100"), ("n2", "X0", "X9"), ("n3", "Y0", "Y9")]
    con = tables(gpus, [("A", "p", None, 0, 2, 10, gpus[:1]), ("B", "mixed", 1, 0, 1, 10, gpus[1:2]),
                        ("C", "mixed", 1, 0, 1, 10, gpus[2:3]), ("D", "mixed", 1, 2, None, None, []), ("E", "x", 1, 0, None, None, [])])
    g = queue_gaps(con, params())
    assert g.not_counted["GPUs requested unknown"] == 1
    assert g.not_counted["pool unknown (no GPU of the partition seen, or several models and the job never ran)"] == 2  # D, E
    x9 = [r for r in g.pools.iter_rows(named=True) if r["model"] == "X9"][0]
    assert x9["gap_cost"] is None and x9["gap_gpu_h"] == pytest.approx(1)  # B waited 0-1 h with X0 free


def test_a_still_pending_job_waits_until_now_and_a_filter_gives_its_row_unfiltered():
    """P (2 GPUs, never started) waits from 3 h to now on p's two free GPUs (G1, G2: p's job X ran on
    them the day before, within retire_after)."""
    con = tables(FOUR, [("X", "p", 2, -20, -20, -18, FOUR[1:3]), ("A", "p", 1, 0, 0, 10, FOUR[:1]), ("P", "p", 2, 3, None, None, [])])
    g = queue_gaps(con, params(), now=T(5))
    assert pool(g)["gap_gpu_h"] == pytest.approx(2 * 2)  # 3 h -> now (5 h)
    assert pool(queue_gaps(con, params(partition="p", model="H100", account="other"), now=T(5))) == pool(g)
    assert queue_gaps(con, params(model="A100")).pools.height == 0


def test_sessions_sharing_one_reader_connection_get_their_own_gaps_at_once():
    """The dashboard's sessions share one reader connection; DuckDB refuses a second call on a connection while one runs (or
    hands a call another's rows), so queue_gaps reads on a cursor of its own: four threads at once, each its window's answer."""
    from concurrent.futures import ThreadPoolExecutor

    con = tables(FOUR, [("A", "p", 1, 0, 0, 10, FOUR[:1]), ("P", "p", 2, 3, None, None, [])])
    windows = [(0, 10), (0, 5), (3, 4), (4, 10)]
    alone = {w: pool(queue_gaps(con, params(*w), now=T(10)))["gap_gpu_h"] for w in windows}
    with ThreadPoolExecutor(4) as threads:
        got = list(threads.map(lambda w: (w, pool(queue_gaps(con, params(*w), now=T(10)))["gap_gpu_h"]), windows * 25))
    assert all(gap == pytest.approx(alone[w]) for w, gap in got)


def test_a_requeued_job_waits_from_its_earlier_attempts_end_not_through_its_own_run():
    """R (1 GPU) ran on G1 0-3 h, failed and was requeued, and ran again 5-10 h: the jobs table has
    its latest record (start 5 h), job_attempts the first; it waited 3-5 h, with G1 and G2 free."""
    con = tables(FOUR, [("A", "p", 1, 0, 0, 10, FOUR[:1]), ("X", "p", 1, -20, -20, -18, FOUR[2:3]), ("R", "p", 1, 0, 5, 10, FOUR[1:2])])
    con.execute("INSERT INTO job_attempts (cluster, scheduler, job_key, start, \"end\", state, source, updated_at) "
                "VALUES ('c', 'slurm', 'R', ?, ?, 'REQUEUED', 'sacct', ?)", [T(0), T(3), T(3)])
    [j] = queue_gaps(con, params()).jobs.to_dicts()
    assert (j["job_id"], j["waited_h"], j["fit_h"]) == ("R", pytest.approx(2), pytest.approx(2))


@st.composite
def queues(draw):
    """GPUs of two models; jobs of partitions p and q, on whole hours, that ran on GPUs of one model
    (so each one's pool is plain) or never started (waiting to the end, or cancelled)."""
    n = draw(st.integers(1, 6))
    gpus = [("n1", f"G{i}", draw(st.sampled_from(["H100", "A100"]))) for i in range(n)]
    jobs, k = [], 0
    for _ in range(draw(st.integers(0, 10))):
        part = draw(st.sampled_from(["p", "q"]))
        need = draw(st.integers(1, n + 1))
        elig = draw(st.integers(-2, 11))
        model = draw(st.sampled_from(["H100", "A100"]))
        same = [g for g in gpus if g[2] == model]
        ran = draw(st.booleans()) and need <= len(same)
        start = elig + draw(st.integers(0, 6)) if ran else None
        end = start + draw(st.integers(1, 8)) if ran else draw(st.sampled_from([None, elig + 3]))
        held = draw(st.permutations(same))[:need] if ran else []
        jobs.append((f"j{k}", part, need, elig, start, end, held))
        k += 1
    return gpus, jobs


def hour_by_hour(gpus, jobs, hi: int) -> tuple[dict, dict]:
    """The oracle: every event is on a whole hour, so the rule evaluated hour by hour over [0, hi)
    is exact - per pool (partition, model) its free and gap GPU-hours, per job its hours fit."""
    pool = {}  # (partition, model) -> the GPUs its jobs held before the window's end
    for _, part, _, _, start, _, held in jobs:
        for g in held if start is not None and start < hi else ():
            pool.setdefault((part, g[2]), set()).add(g[1])
    models = {part: {m for (p, m) in pool if p == part} for part in ("p", "q")}
    holds = [(g[1], start, end if end is not None else 24) for *_, start, end, held in jobs for g in held]
    figures, fit = {k: [0, 0] for k in pool}, {}
    for h in range(hi):
        held_now = {g for g, a, b in holds if a <= h < b}
        waiting = {}
        for key, part, need, elig, start, end, held in jobs:
            w1 = start if start is not None else end if end is not None else hi
            model = held[0][2] if held else (next(iter(models[part])) if len(models[part]) == 1 else None)
            if elig <= h < w1 and model is not None:
                waiting.setdefault((part, model), []).append((key, need))
        for k, gs in pool.items():
            free = len(gs - held_now)
            fitting = [(key, need) for key, need in waiting.get(k, []) if need <= free]
            figures[k][0] += free
            figures[k][1] += min(free, sum(need for _, need in fitting))
            for key, _ in fitting:
                fit[key] = fit.get(key, 0) + 1
    return figures, fit


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queues(), st.integers(1, 10))
def test_the_gap_is_the_rule_hour_by_hour_never_above_the_free_capacity_and_oversized_jobs_never_count(q, hi):
    gpus, jobs = q
    con = tables(gpus, jobs)
    g = queue_gaps(con, params(0, hi))
    figures, fit = hour_by_hour(gpus, jobs, hi)
    assert {(p["partition"], p["model"]): [pytest.approx(p["free_gpu_h"]), pytest.approx(p["gap_gpu_h"])]
            for p in g.pools.iter_rows(named=True)} == figures
    assert {j["job_id"]: pytest.approx(j["fit_h"]) for j in g.jobs.iter_rows(named=True)} == fit
    for p in g.pools.iter_rows(named=True):
        assert -1e-9 <= p["gap_gpu_h"] <= p["free_gpu_h"] + 1e-9
        assert p["free_gpu_h"] <= p["gpus"] * hi + 1e-9
        fits = g.jobs.filter((g.jobs["partition"] == p["partition"]) & (g.jobs["model"] == p["model"]))
        assert p["gap_gpu_h"] <= fits["fit_gpu_h"].sum() + 1e-9
        assert (p["gap_gpu_h"] > 0) == (fits.height > 0)
    for j in g.jobs.iter_rows(named=True):
        assert 0 < j["fit_h"] <= j["waited_h"] + 1e-9
        [p] = g.pools.filter((g.pools["partition"] == j["partition"]) & (g.pools["model"] == j["model"])).to_dicts()
        assert j["gpus"] <= p["gpus"]
    for part in ("p", "q"):
        one = queue_gaps(con, params(0, hi, partition=part))
        assert one.pools.to_dicts() == g.pools.filter(g.pools["partition"] == part).to_dicts()


def at(h: int, m: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m)


@pytest.fixture(scope="module")
def queued(tmp_path_factory):
    """Partition gpu's GPUs A, B, C (H100) 10:00-12:00: job 1 holds A all along, job 2 C until
    10:30; job 3 (2 GPUs) waits 10:15-11:00, fitting from 10:30 (B and C free): 1 GPU-h of gap of
    1.5 free; job 4 (3 GPUs, still pending) never fits."""
    from tests.support.fleet import Fleet

    f = Fleet(tmp_path_factory.mktemp("queued"))
    for uuid in ("GPU-A", "GPU-B", "GPU-C"):
        f.gpu_series("n1", uuid, at(10), at(12))
    f.job("1", account="physics", user="alice", start=at(10), end=at(12), gpus=1, placements=[("n1", "GPU-A")])
    f.job("2", account="physics", user="alice", start=at(10), end=at(10, 30), gpus=1, placements=[("n1", "GPU-C")])
    f.job("3", account="biology", user="bob", submit=at(10, 15), start=at(11), end=at(12), gpus=2, placements=[("n1", "GPU-B"), ("n1", "GPU-C")])
    f.job("4", account="biology", user="bob", submit=at(10), start=None, end=None, gpus=3, placements=[])
    f.write()
    return f.root


def test_analyze_json_and_table_carry_the_queue_gaps(queued):
    import json

    from tests.test_analytics_jobs_cli import analyze

    window = ("--store", str(queued), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T12:00:00Z")
    r = analyze(*window, "--format", "json")
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)["queue_gaps"]
    [p] = q["pools"]
    price = price_table({})["NVIDIA H100 80GB HBM3"]
    assert (p["partition"], p["gpus"], p["free_gpu_h"], p["gap_gpu_h"], p["gap_cost"], p["jobs_waited"], p["jobs_fit"]) == (
        "gpu", 3, pytest.approx(1.5), pytest.approx(1.0), pytest.approx(price), 2, 1)
    assert [(j["job_id"], j["account"], j["fit_h"], j["fit_gpu_h"]) for j in q["jobs"]] == [("3", "biology", 0.5, 1.0)]
    assert q["jobs_fit"] == 1 and set(q["not_counted"].values()) == {0}
    # --top lists that many jobs; the count stays the whole (the answer does not grow with the queue)
    r = analyze(*window, "--format", "json", "--top", "0")
    assert json.loads(r.stdout)["queue_gaps"] | {"jobs": None} == q | {"jobs": None} and json.loads(r.stdout)["queue_gaps"]["jobs"] == []
    table = analyze(*window).stdout
    assert "Queue gaps" in table and "jobs that waited while they would have fit" in table
    assert [line for line in table.splitlines() if line.strip().startswith("3 ")], table


def test_an_account_filter_keeps_everyones_pools_and_lists_its_own_waiting_jobs(queued):
    """`analyze --team physics` listed biology's job 3 as one that waited while it fit, with no word that the pools are
    everyone's: now the pools are the same (the gap is everyone's), the jobs listed the filter's, and the note says so."""
    import json

    from tests.test_analytics_jobs_cli import analyze

    window = ("--store", str(queued), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T12:00:00Z", "--format", "json")
    fleet = json.loads(analyze(*window).stdout)["queue_gaps"]
    assert fleet["note"] is None
    for team, listed in (("physics", []), ("biology", ["3"])):
        q = json.loads(analyze(*window, "--team", team).stdout)["queue_gaps"]
        assert q["pools"] == fleet["pools"] and [j["job_id"] for j in q["jobs"]] == listed and q["jobs_fit"] == len(listed)
        assert q["note"] == (f"the pools are everyone's free GPUs and queue (account filters do not narrow them); "
                             f"the jobs listed are account={team}'s")
    table = analyze(*window[:-2], "--team", "physics").stdout
    assert "the jobs listed are account=physics's" in table and "jobs that waited while they would have fit" not in table


def test_the_waste_page_shows_the_queue_gaps_and_the_jobs_that_waited(queued, monkeypatch):
    from tests.test_dashboard_pages import frame, goto, open_app, opened

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(queued))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    app = opened(goto(open_app(), "waste"), "waste_queue_jobs")
    pools, jobs = frame(app, "waste_queue_gaps"), frame(app, "waste_queue_jobs")
    assert pools["partition"].tolist() == ["gpu"] and pools["gap_gpu_h"].tolist() == [pytest.approx(1.0)], pools
    assert jobs["job_id"].tolist() == ["3"], jobs
    # under a team filter the pools stay everyone's and the caption says whose jobs are listed
    app.selectbox(key="account").set_value("physics").run()
    assert frame(app, "waste_queue_gaps")["gap_gpu_h"].tolist() == [pytest.approx(1.0)]
    assert any("the jobs listed are account=physics's" in c.value for c in app.caption)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-50, 50), st.integers(1, 30)), max_size=40), st.booleans())
def test_holds_are_ordered_by_gpu_then_start_with_each_gpu_s_running_reach_also_by_time_ranks(holds, ranks):
    """_ordered_reach's one-key sort and running maximum equal a per-GPU sort and maximum, also where
    the key would pass its limit and the times are replaced by their ranks (forced here by a tiny limit)."""
    import numpy as np

    from gpufleet.analytics.queue_gaps import _ordered_reach

    r, a, b = (np.array(c, dtype=np.int64) for c in zip(*holds)) if holds else (np.zeros(0, np.int64),) * 3
    b = a + b if holds else b
    got = _ordered_reach(r, a, b, key_limit=1 if ranks else 2 ** 62)
    rows = list(zip(*(x.tolist() for x in got[:3])))
    assert sorted(rows) == sorted(zip(r.tolist(), a.tolist(), b.tolist()))  # the same holds,
    assert [(g, s) for g, s, _ in rows] == sorted((g, s) for g, s, _ in rows)  # by GPU, then start,
    reach = [max(e for g2, _, e in rows[:i + 1] if g2 == g) for i, (g, _, _) in enumerate(rows)]
    assert got[3].tolist() == reach  # each with its GPU's latest end so far
