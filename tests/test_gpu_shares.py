"""The per-job split of a shared GPU (issue #55): parsed from the gpufleet exporter's
gpufleet_gpu_job_sm_utilization_ratio / _memory_used_bytes, stored hourly in gpu_job_shares
(schema 8), read back per job (gpufleet.analytics.jobs.gpu_shares) and shown on the job page."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("STREAMLIT_GLOBAL_DEVELOPMENT_MODE", "false")

from gpufleet.analytics.jobs import gpu_shares, share_sentence  # noqa: E402
from gpufleet.analytics.params import Filters, Params  # noqa: E402
from gpufleet.analytics.shares import team_shares  # noqa: E402
from gpufleet.collector import schema, store  # noqa: E402
from gpufleet.collector.exposition_parse import parse_exposition  # noqa: E402
from gpufleet.collector.schema import Batch  # noqa: E402
from gpufleet.collector.store import StoreWriter, open_reader  # noqa: E402
from gpufleet.exporter.jobmap.base import JobBinding  # noqa: E402
from tests.test_exporter_output import StaticSource, make_poller  # noqa: E402

TS = datetime(2026, 11, 16, 10, 0)
CAPTURE = Path(__file__).parent / "data" / "nvml-h200" / "two_jobs_shared.prom"
H200_UUID = "GPU-4c919a5b-5eab-04aa-d767-dc3c38acd6e9"


def parse(text: str):
    return parse_exposition(text, ts=TS, cluster="c1", target="vm:9400")


def line(name: str, job: str, value: str, gpu: str = "0", uuid: str = "GPU-a") -> str:
    return f'{name}{{gpu="{gpu}",UUID="{uuid}",Hostname="n1",job_id="{job}"}} {value}\n'


SM, MEM = "gpufleet_gpu_job_sm_utilization_ratio", "gpufleet_gpu_job_memory_used_bytes"


def obs(ts: datetime, job: str, sm: float | None, mem: float | None = None, uuid: str = "GPU-a") -> dict:
    return {"ts": ts, "cluster": "c1", "host": "n1", "gpu_uuid": uuid, "gpu_instance": -1, "scheduler": "slurm",
            "job_key": job, "sm_ratio": sm, "memory_bytes": mem}


# --- parsing ---


def test_the_real_h200_capture_of_two_jobs_on_one_gpu_gives_their_split():
    """The exporter on a real H200 with two jobs' processes on GPU 0: job 5001's SM ratio and both
    jobs' memory; 5002's SM ratio was not published (NVML had no sample of its process): unknown."""
    r = parse(CAPTURE.read_text())
    shares = sorted((s["gpu_uuid"], s["job_key"], s["sm_ratio"], s["memory_bytes"]) for s in r.shares)
    assert shares == [(H200_UUID, "5001", 0.99, 916455424.0), (H200_UUID, "5002", None, 668991488.0)]
    assert {s["host"] for s in r.shares} == {"vm"} and {s["gpu_instance"] for s in r.shares} == {-1}


def test_what_our_exporter_publishes_for_a_shared_gpu_parses_back():
    """Two jobs' processes on GPU 0 of the simulated exporter, one job alone on GPU 1: the
    shared GPU's split comes back, the lone job's GPU is not stored (it is no split)."""
    p, _ = make_poller({"gpus": 2, "gpu": [
        {"index": 0, "processes": [{"pid": 100, "used_memory_mib": 1024, "sm_util": 30}, {"pid": 200, "used_memory_mib": 512, "sm_util": 20}]},
        {"index": 1, "processes": [{"pid": 300, "used_memory_mib": 256, "sm_util": 70}]}]})
    p.sources = [StaticSource("cgroup", [JobBinding("slurm", "cgroup", job_id="501", gpu_index=0, pid=100),
                                         JobBinding("slurm", "cgroup", job_id="777", gpu_index=0, pid=200),
                                         JobBinding("slurm", "cgroup", job_id="900", gpu_index=1, pid=300)])]
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    text = p.exposition().decode()
    assert f'{SM}{{' in text and 'job_id="900"' in text
    r = parse(text)
    got = sorted((s["job_key"], s["sm_ratio"], s["memory_bytes"]) for s in r.shares)
    assert got == [("501", pytest.approx(0.3), 1024 * 2**20), ("777", pytest.approx(0.2), 512 * 2**20)]
    assert {s["host"] for s in r.shares} == {"node-a"} and r.rejected == 0


def test_a_split_that_is_no_split_is_rejected_loudly_and_the_rest_kept():
    text = (line(SM, "1", "0.7") + line(SM, "2", "0.6") + line(MEM, "1", "100")  # GPU-a: 1.3 in sum
            + line(SM, "3", "0.5", gpu="1", uuid="GPU-b") + line(SM, "4", "0.25", gpu="1", uuid="GPU-b")
            + line(SM, "5", "1.5", gpu="2", uuid="GPU-c") + line(MEM, "6", "-1", gpu="2", uuid="GPU-c"))
    r = parse(text)
    assert sorted((s["gpu_uuid"], s["job_key"], s["sm_ratio"]) for s in r.shares) == [("GPU-b", "3", 0.5), ("GPU-b", "4", 0.25)]
    assert r.rejected == 5
    assert any("GPU GPU-a sum to 1.300, more than 1" in p for p in r.problems)
    assert any("value 1.5 is not a ratio in 0-1" in p for p in r.problems)
    assert any("value -1 is not a byte count" in p for p in r.problems)


# --- the store ---


def test_shares_round_trip_hourly_and_a_batch_stored_twice_counts_once(tmp_path):
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="a", shares=[obs(TS, "1", 0.6, 100.0), obs(TS, "2", 0.3, None)]))
    later = [obs(TS + timedelta(seconds=15), "1", 0.5, 200.0), obs(TS + timedelta(seconds=15), "3", None, 50.0)]
    w.commit(Batch(key="b", shares=later))
    assert w.commit(Batch(key="b", shares=later)).duplicate
    w.publish()
    w.close()
    con = open_reader(tmp_path)
    assert con.execute("SELECT job_key, ts, shared_scrapes, reports, sm_reports, sm_sum, memory_max_bytes FROM gpu_job_shares "
                       "ORDER BY job_key").fetchall() == [
        ("1", TS, 2, 2, 2, pytest.approx(1.1), 200.0), ("2", TS, 2, 1, 1, pytest.approx(0.3), None), ("3", TS, 2, 1, 0, None, 50.0)]
    p = Params(TS, TS + timedelta(hours=1))
    [g] = gpu_shares(con, p, "c1", "slurm", "1")
    assert (g["host"], g["gpu_uuid"], g["gi"], g["shared_scrapes"], g["memory_max_bytes"]) == ("n1", "GPU-a", -1, 2, 200.0)
    assert g["sm_share"] == pytest.approx(0.55)
    assert [(o["job_key"], o["sm_share"]) for o in g["others"]] == [("2", pytest.approx(0.15)), ("3", None)]
    assert share_sentence(g) == "shared with job 2, job 3: this job 55.0 % of the SM time, job 2 15.0 %, job 3 unknown"
    [g3] = gpu_shares(con, p, "c1", "slurm", "3")
    assert g3["sm_share"] is None and g3["memory_max_bytes"] == 50.0  # unknown stays unknown, never 0
    assert gpu_shares(con, p, "c1", "slurm", "4") == []
    assert gpu_shares(con, Params(TS + timedelta(hours=1), TS + timedelta(hours=2)), "c1", "slurm", "1") == []


def test_a_store_of_schema_7_is_migrated_and_keeps_shares_from_then_on(tmp_path):
    """Schema 7 had no gpu_job_shares: the upgrade adds it, the old rows read the same, and the
    split is unknown before the upgrade (no rows), stored after it."""
    db = duckdb.connect(str(tmp_path / store.STATE_DB))
    db.execute(schema.STATE_DDL[0])
    for version in range(1, 8):
        for stmt in schema.MIGRATIONS[version]:
            db.execute(stmt)
        db.execute("INSERT INTO schema_version VALUES (?, ?)", [version, TS])
    db.execute("INSERT INTO jobs (cluster, scheduler, job_key, job_id, state, \"end\", source, updated_at) VALUES "
               "('c1', 'slurm', '1', '1', 'COMPLETED', ?, 'sacct', ?)", [TS, TS])
    assert "gpu_job_shares" not in {r[0] for r in db.execute("SHOW TABLES").fetchall()}
    db.close()
    w = StoreWriter(tmp_path)
    assert w.schema_version() == schema.SCHEMA_VERSION >= 8  # (later migrations ran too)
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT job_key FROM jobs").fetchall() == [("1",)]
    assert con.execute("SELECT count(*) FROM gpu_job_shares").fetchone() == (0,)
    w.commit(Batch(key="s", shares=[obs(TS, "1", 0.4), obs(TS, "2", 0.5)]))
    w.publish()
    w.close()
    [g] = gpu_shares(open_reader(tmp_path), Params(TS, TS + timedelta(hours=1)), "c1", "slurm", "1")
    assert g["sm_share"] == pytest.approx(0.4) and [o["sm_share"] for o in g["others"]] == [pytest.approx(0.5)]


# --- the invariant ---

JOBS = ("1", "2", "3")


@st.composite
def scrapes(draw):
    """Scrapes of one GPU over two hours: each names 2-3 jobs whose SM ratios sum to at most 1
    (some unknown), split into batches in any way that keeps a scrape whole (as a scrape round
    and a TSDB window do)."""
    out: list[list[dict]] = []
    for i in range(draw(st.integers(1, 12))):
        ts = TS + timedelta(minutes=draw(st.integers(0, 119)), seconds=i)  # distinct moments
        jobs = draw(st.lists(st.sampled_from(JOBS), min_size=2, max_size=3, unique=True))
        weights = draw(st.lists(st.integers(0, 100), min_size=len(jobs), max_size=len(jobs)))
        total = max(100, sum(weights))
        unknown = draw(st.sets(st.sampled_from(jobs), max_size=1))
        out.append([obs(ts, j, None if j in unknown else w / total) for j, w in zip(jobs, weights)])
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(out) - 1)), max_size=3)) - {len(out)})
    return [r for scrape in out for r in scrape], [sum(out[a:b], []) for a, b in zip([0, *cuts], [*cuts, len(out)])]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scrapes())
def test_the_shares_of_one_gpu_never_exceed_1_and_unknown_stays_unknown(tmp_path_factory, drawn):
    rows, batches = drawn
    root = tmp_path_factory.mktemp("shares")
    w = StoreWriter(root)
    for n, b in enumerate(batches):
        w.commit(Batch(key=f"b{n}", shares=b))
    w.publish()
    w.close()
    con = open_reader(root)
    p = Params(TS, TS + timedelta(hours=2))
    moments = {r["ts"] for r in rows}
    for job in {r["job_key"] for r in rows}:
        [g] = gpu_shares(con, p, "c1", "slurm", job)
        known = [s for s in [g["sm_share"], *(o["sm_share"] for o in g["others"])] if s is not None]
        assert sum(known) <= 1 + 1e-9
        # over the hours this job was on the GPU, against every scrape of the GPU in them
        hours = {r["ts"].replace(minute=0, second=0) for r in rows if r["job_key"] == job}
        in_hours = [t for t in moments if t.replace(minute=0, second=0) in hours]
        assert g["shared_scrapes"] == len(in_hours)
        for j, share in [(job, g["sm_share"]), *((o["job_key"], o["sm_share"]) for o in g["others"])]:
            mine = [r["sm_ratio"] for r in rows if r["job_key"] == j and r["ts"] in in_hours]
            if None in mine:
                assert share is None  # unknown stays unknown, never a guess or 0
            else:
                assert share == pytest.approx(sum(mine) / len(in_hours))
    # the team's (every job here is of no known account: one team): all its jobs' SM over every
    # scrape of the GPU's shared hours, at most 1; unknown where any report lacked its SM ratio
    [team] = team_shares(con, p).to_dicts()
    assert (team["account"], team["gpus"], team["jobs"], team["shared_with"]) == ("", 1, len({r["job_key"] for r in rows}), "")
    assert team["shared_hours"] == len({t.replace(minute=0, second=0) for t in moments})
    ratios = [r["sm_ratio"] for r in rows]
    assert team["sm_share"] is None if None in ratios else team["sm_share"] == pytest.approx(sum(ratios) / len(moments))
    assert team["sm_share"] is None or team["sm_share"] <= 1 + 1e-9


# --- the job page ---


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory) -> Path:
    """The dashboards' fleet (tests.test_dashboard_analytics.build), with job 102's processes beside
    job 101's on GPU-A for two scrapes: 101 60 % of the SM time, 102 30 % (memory unknown)."""
    from tests.test_dashboard_analytics import T, build

    root = Path(build(tmp_path_factory.mktemp("shared")).root)
    w = StoreWriter(root)
    for n, (ts, mem) in enumerate([(T(10, 20), 3 * 2**30), (T(10, 21), 2 * 2**30)]):
        w.commit(Batch(key=f"shares{n}", shares=[obs(ts, "101", 0.6, mem, uuid="GPU-A"), obs(ts, "102", 0.3, None, uuid="GPU-A")]))
    w.publish()
    w.close()
    return root


def test_the_job_page_says_who_shared_the_gpu_and_how(shared_fleet, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.test_dashboard_pages import APP, WINDOW, clean

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(shared_fleet))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update(WINDOW)
    at = clean(clean(at.run()).switch_page("views/jobs.py").run())
    at.text_input(key="job").set_value("101").run()
    texts = [t.value for t in clean(at).text]
    shared = [t for t in texts if t.startswith("GPU GPU-A on n1")]
    assert len(shared) == 1, texts
    assert "shared with job 102 (bob): this job 60.0 % of the SM time, job 102 30.0 %" in shared[0]
    assert "this job's memory high-water 3,072 MiB" in shared[0]
    at.text_input(key="job").set_value("103").run()  # a job that shared no GPU: no such section
    assert not [t for t in clean(at).text if t.value.startswith("GPU GPU-")]
    assert "Shared GPUs" not in [s.value for s in at.subheader]


def test_each_team_has_the_share_of_the_gpus_it_shared_and_who_with(shared_fleet):
    """Job 101 (physics) and 102 (biology) on GPU-A for two scrapes of the 10:00 hour: physics had
    60 % of its SM time, biology 30 %; a team filter gives its row of the fleet's."""
    con = open_reader(shared_fleet)
    p = Params(datetime(2026, 11, 16, 10), datetime(2026, 11, 16, 12))
    teams = {r["account"]: r for r in team_shares(con, p).to_dicts()}
    assert set(teams) == {"physics", "biology"}
    assert (teams["physics"]["gpus"], teams["physics"]["jobs"], teams["physics"]["shared_hours"], teams["physics"]["shared_with"]) == (1, 1, 1.0, "biology")
    assert teams["physics"]["sm_share"] == pytest.approx(0.6) and teams["biology"]["sm_share"] == pytest.approx(0.3)
    assert team_shares(con, Params(p.start, p.end, filters=Filters(account="biology"))).to_dicts() == [teams["biology"]]
    assert team_shares(con, Params(datetime(2026, 11, 16, 11), p.end)).is_empty()


def test_the_teams_page_shows_each_teams_shared_gpus(shared_fleet, monkeypatch):
    from tests.test_dashboard_pages import frame, goto, open_app

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(shared_fleet))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    shared = frame(goto(open_app(), "teams"), "fair_shared_gpus")
    assert shared["account"].tolist() == ["biology", "physics"] and shared["shared_with"].tolist() == ["physics", "biology"], shared


def test_the_weekly_report_and_a_teams_own_say_who_shared_gpus(shared_fleet):
    from gpufleet.report import pipeline
    from gpufleet.report.window import week_window
    from tests.test_report import NOW, Figures, settings_for

    fleet, team = pipeline.make(settings_for(shared_fleet), week_window(2026, 47, "UTC"), now=NOW, pdf=False, teams=["physics"])
    figs = Figures(fleet.html)
    assert figs.one("shared.c1/physics.sm_share") == "60.0 %" and figs.one("shared.c1/biology.sm_share") == "30.0 %"
    assert figs.one("shared.c1/physics.shared_hours") == "1" and figs.one("shared.c1/physics.gpus") == "1"
    assert "SHARED GPUS" in fleet.text and "physics" in fleet.text.split("SHARED GPUS")[1]
    assert [g["account"] for g in team.report.shared_gpus] == ["physics"]
    assert "shared.c1/biology.sm_share" not in Figures(team.html).figs


def test_analyze_job_json_and_table_include_the_shared_gpus(shared_fleet):
    import json

    from tests.test_analytics_jobs_cli import analyze

    window = ("--store", str(shared_fleet), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T12:00:00Z")
    r = analyze(*window, "--format", "json", "--job", "102")
    assert r.returncode == 0, r.stderr
    [g] = json.loads(r.stdout)["job"]["shared_gpus"]
    assert (g["host"], g["gpu_uuid"], g["gi"], g["shared_scrapes"], g["memory_max_bytes"]) == ("n1", "GPU-A", -1, 2, None)
    assert g["sm_share"] == pytest.approx(0.3) and g["first_hour"] == "2026-11-16T10:00:00"
    assert [(o["job_id"], o["user_name"], o["memory_max_bytes"]) for o in g["others"]] == [("101", "alice", 3 * 2**30)]
    assert g["others"][0]["sm_share"] == pytest.approx(0.6)
    r = analyze(*window, "--job", "102")
    assert "GPU GPU-A on n1: shared with job 101 (alice): this job 30.0 % of the SM time, job 101 60.0 %" in r.stdout
    assert json.loads(analyze(*window, "--format", "json", "--job", "103").stdout)["job"]["shared_gpus"] == []
