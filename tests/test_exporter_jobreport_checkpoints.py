"""Checkpoints a job reports (issue #54): gpufleet.exporter.jobreport.checkpoint_saved -> the exporter's
exposition -> the collector's parse -> the store (job_checkpoints) -> the reliability figures, where an
interruption's lost work runs from the job's last checkpoint (measured) instead of the attempt's start
(an upper bound), and Young/Daly's advice uses the job's measured checkpoint cost."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.analytics import reliability as r, reliability_store
from gpufleet.analytics.params import Params
from gpufleet.analytics.reliability import Attempt
from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter
from gpufleet.exporter import jobreport
from gpufleet.exporter.backends import sim_scenario
from gpufleet.exporter.backends.sim import SimBackend
from gpufleet.exporter.jobreports import JobReportSource
from gpufleet.exporter.poller import Poller
from tests.support.fleet import Fleet


def T(h: int, m: int = 0, s: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m, s)


def unix(t: datetime) -> float:
    return t.replace(tzinfo=timezone.utc).timestamp()


def make_poller(directory: Path) -> Poller:
    return Poller(SimBackend(sim_scenario.parse({"hostname": "node-a", "gpus": 1})), hostname="node-a",
                  job_reports=JobReportSource(directory))


def exposition(p: Poller) -> str:
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    return p.exposition().decode()


def published(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


# --- the job API and the exporter ---


def test_checkpoint_saved_writes_its_own_file_beside_the_throughput_report(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    path = jobreport.checkpoint_saved(duration_seconds=95.5, saved_at=1.7e9, directory=tmp_path)
    jobreport.report(flops_per_second=1e15, directory=tmp_path, min_interval=0)
    assert path == tmp_path / "42.checkpoint.json" and sorted(p.name for p in tmp_path.iterdir()) == ["42.checkpoint.json", "42.json"]
    doc = json.loads(path.read_text())
    assert (doc["kind"], doc["scheduler"], doc["job_id"], doc["saved_at"], doc["duration_seconds"]) == ("checkpoint", "slurm", "42", 1.7e9, 95.5)
    assert jobreport.file_name(jobreport.build_checkpoint(job_id="ml/trainer-0")) == "ml_trainer-0.checkpoint.json"
    assert jobreport.build_checkpoint(job_id="1")["duration_seconds"] is None  # not measured: unknown, never 0
    for bad in (-1.0, math.nan, math.inf, "95"):
        with pytest.raises(ValueError, match="duration_seconds"):
            jobreport.build_checkpoint(bad, job_id="1")
    assert jobreport.checkpoint_saved(job_id="1", directory=tmp_path / "missing") is None  # logged, never raised


def test_checkpoint_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpufleet.exporter.jobreport", "--job-id", "7", "--dir", str(tmp_path), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    ok = run("--checkpoint-saved", "--checkpoint-seconds", "30")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "7.checkpoint.json").read_text())["duration_seconds"] == 30.0
    assert run("--checkpoint-seconds", "30").returncode == 2  # a duration of no checkpoint
    assert run("--checkpoint-saved", "--flops-per-second", "1e15").returncode == 2


def test_exporter_publishes_the_last_checkpoint_and_counts_bad_ones(tmp_path):
    jobreport.checkpoint_saved(60.0, saved_at=1.7e9, job_id="42", directory=tmp_path)
    jobreport.checkpoint_saved(None, saved_at=1.7e9 + 5, job_id="ml/trainer-0", directory=tmp_path)
    old = jobreport.checkpoint_saved(10.0, saved_at=1.6e9, job_id="43", directory=tmp_path)
    os.utime(old, (time.time() - 2 * 86400, time.time() - 2 * 86400))  # two days old: no longer published
    (tmp_path / "44.checkpoint.json").write_text(json.dumps({"version": 1, "kind": "checkpoint", "scheduler": "slurm", "job_id": "44"}))
    (tmp_path / "45.checkpoint.json").write_text(json.dumps({"version": 1, "scheduler": "slurm", "job_id": "45", "flops_per_second": 1}))
    ss = published(exposition(make_poller(tmp_path)))
    saved = {(lab.get("job_id"), lab.get("pod")): v for n, lab, v in ss if n == "gpufleet_job_checkpoint_timestamp_seconds"}
    assert saved == {("42", None): 1.7e9, (None, "trainer-0"): 1.7e9 + 5}
    assert [(lab["job_id"], v) for n, lab, v in ss if n == "gpufleet_job_checkpoint_duration_seconds"] == [("42", 60.0)]
    assert not [1 for n, *_ in ss if n == "gpufleet_job_reported_flops"]  # a checkpoint is no throughput report
    assert [v for n, lab, v in ss if n == "gpufleet_collector_problems_total" and lab["collector"] == "job_reports"] == [2]


# --- the collector ---


def test_collector_parses_checkpoints_and_rejects_impossible_ones():
    now = T(12)
    text = (
        f'gpufleet_job_checkpoint_timestamp_seconds{{Hostname="n3",scheduler="slurm",job_id="42"}} {unix(T(11, 30))!r}\n'
        'gpufleet_job_checkpoint_duration_seconds{Hostname="n3",scheduler="slurm",job_id="42"} 90\n'
        f'gpufleet_job_checkpoint_timestamp_seconds{{Hostname="n3",scheduler="kubernetes",namespace="ml",pod="p"}} {unix(T(11))!r}\n'
        'gpufleet_job_checkpoint_duration_seconds{Hostname="n3",scheduler="slurm",job_id="43"} 5\n'  # no time: nothing to store
        f'gpufleet_job_checkpoint_timestamp_seconds{{Hostname="n3",scheduler="slurm",job_id="44"}} {unix(T(13))!r}\n'  # the future
        'gpufleet_job_checkpoint_timestamp_seconds{Hostname="n3",scheduler="slurm",job_id="45"} 12\n'  # 1970
        'gpufleet_job_checkpoint_duration_seconds{Hostname="n3",scheduler="slurm",job_id="46"} -1\n'
        f'gpufleet_job_checkpoint_timestamp_seconds{{Hostname="n3",scheduler="slurm"}} {unix(T(11))!r}\n'  # no job
    )
    parsed = parse_exposition(text, ts=now, cluster="c1", target="n3:9402")
    assert sorted((c["scheduler"], c["job_key"], c["saved_at"], c["duration_s"]) for c in parsed.checkpoints) == [
        ("kubernetes", "ml/p", T(11), None), ("slurm", "42", T(11, 30), 90.0)]
    assert parsed.rejected == 4 and parsed.samples.num_rows == 0
    assert any("job_id=\"44\"" in p or "time before the scrape" in p for p in parsed.problems)


def test_store_keeps_each_checkpoint_once_and_a_known_duration(tmp_path):
    f = Fleet(tmp_path)
    f.write()
    obs = lambda seen, dur: {"seen": seen, "cluster": "c1", "scheduler": "slurm", "job_key": "42", "saved_at": T(11), "duration_s": dur}  # noqa: E731
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="a", checkpoints=[obs(T(11, 0, 15), None)]))
    w.commit(Batch(key="b", checkpoints=[obs(T(11, 0, 30), 90.0)]))  # the duration learnt later
    w.commit(Batch(key="c", checkpoints=[obs(T(11, 0, 45), None)]))  # and never lost again
    w.commit(Batch(key="b", checkpoints=[obs(T(11, 0, 30), 90.0)]))  # a batch read twice
    w.publish()
    w.close()
    rows = f.reader().sql("SELECT job_key, saved_at, duration_s, first_seen FROM job_checkpoints").fetchall()
    assert rows == [("42", T(11), 90.0, T(11, 0, 15))]


# --- end to end, by hand ---

CKPTS = [(T(11), 60.0), (T(12), 90.0), (T(13), 120.0)]


def build_store(tmp_path: Path) -> Fleet:
    """Job 42 (8 GPUs on node-a, user ann, "pretrain") saves checkpoints at 11:00, 12:00 and 13:00 (60, 90 and
    120 s to save) through the job API and dies of a node failure at 14:00; its resubmission 43 runs 14:30-16:00
    and completes. Each checkpoint goes the whole way: checkpoint_saved -> the exporter's exposition -> a scrape
    30 s later -> the collector's parse -> the store."""
    reports = tmp_path / "reports"
    reports.mkdir()
    f = Fleet(tmp_path / "store")
    f.job("42", account="ml", user="ann", name="pretrain", start=T(10), end=T(14), gpus=8, submit=T(10),
          placements=[("node-a", f"GPU-{i}") for i in range(8)], state="NODE_FAIL", state_raw="NODE_FAIL")
    f.job("43", account="ml", user="ann", name="pretrain", start=T(14, 30), end=T(16), gpus=8, submit=T(14, 10),
          placements=[("node-a", f"GPU-{i}") for i in range(8)], state="COMPLETED", exit_code="0:0")
    f.write()
    p = make_poller(reports)
    w = StoreWriter(f.root)
    for saved_at, took in CKPTS:
        jobreport.checkpoint_saved(took, saved_at=unix(saved_at), job_id="42", directory=reports)
        for k in range(2):  # two scrapes see the same checkpoint: stored once
            scraped = saved_at + timedelta(seconds=30 + 15 * k)
            parsed = parse_exposition(exposition(p), ts=scraped, cluster="c1", target="node-a:9402")
            w.commit(Batch(key=f"scrape:{scraped.isoformat()}", checkpoints=parsed.checkpoints))
    w.publish()
    w.close()
    return f


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("checkpoints"))


def test_a_checkpoint_travels_from_the_job_to_the_lost_work(store):
    assert store.reader().sql("SELECT saved_at, duration_s FROM job_checkpoints ORDER BY saved_at").fetchall() == CKPTS
    got = reliability_store.report(store.reader(), Params(T(10), T(16)), as_of=T(16))
    fig = got["figures"]
    # 42's node failure lost the hour since its 13:00 checkpoint on 8 GPUs (measured), not its 4 h run (the upper bound)
    assert fig["interruptions"] == 1 and fig["lost_gpu_hours"] == pytest.approx(8.0)
    assert (fig["lost_measured_interruptions"], fig["lost_measured_gpu_hours"], fig["lost_is_upper_bound"]) == (1, pytest.approx(8.0), False)
    [a] = got["interrupted_attempts"]
    assert (a["job_id"], a["lost_since"], a["lost_basis"], a["lost_gpu_h"]) == ("42", T(13), "measured", pytest.approx(8.0))
    # the chain 42 -> 43: wall 10:00-16:00 (6 h) = run 4 + 1.5 h + a 0.5 h wait; lost 1 h; productive 4.5 h
    [ch] = got["chains"]
    assert ch["job_ids"] == ["42", "43"] and ch["lost_basis"] == "measured"
    assert [ch[k] for k in ("wall_h", "run_h", "requeue_wait_h", "lost_h", "productive_h", "ettr")] == pytest.approx([6, 5.5, 0.5, 1, 4.5, 0.75])
    g = got["goodput"]
    assert not g["lost_is_upper_bound"] and g["checkpoints"].startswith("every interrupted attempt's job reported checkpoints")
    # Young/Daly: r = 1 failure / (8 x 4 + 8 x 1.5) GPU-h; MTTF_8 = 44 / 8 = 5.5 h; C = median(60, 90, 120) = 90 s;
    # advised sqrt(2 x 90 x 5.5 x 3600) s; the job used a checkpoint every 3600 s
    advice = ch["checkpoint_advice"]
    assert advice["mttf_h"] == pytest.approx(5.5) and advice["checkpoint_save_s"] == 90.0 and advice["checkpoints"] == 3
    assert advice["advised_interval_s"] == pytest.approx(math.sqrt(2 * 90 * 5.5 * 3600)) and advice["used_interval_s"] == 3600.0
    assert advice["no_advice"] is None and advice["verdict"] == "checkpoint more often"  # 3600 s > 1.25 x 1888 s
    [largest] = got["checkpoint_advice"]  # the largest chains: here the only one
    assert largest["job_ids"] == ["42", "43"] and largest["advised_interval_s"] == advice["advised_interval_s"]


def test_cli_shows_the_measured_loss_and_the_advice(store):
    from tests.test_reliability import analyze_reliability

    run = lambda *a: analyze_reliability(store.root, "2026-11-16T10:00:00Z", "2026-11-16T16:00:00Z", *a)  # noqa: E731
    j = run("--format", "json")
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert doc["checkpoint_advice"][0]["advised_interval_s"] == pytest.approx(math.sqrt(2 * 90 * 5.5 * 3600))
    assert doc["interrupted_attempts"][0]["lost_basis"] == "measured"
    t = run()
    assert t.returncode == 0, t.stderr
    assert "measured from the jobs' last checkpoints" in t.stdout and "Checkpoint advice for the largest chains" in t.stdout
    assert "checkpoint more often" in t.stdout and "31 min 28 s" in t.stdout  # sqrt(2 x 90 x 19800) = 1888 s


def test_without_checkpoint_reports_the_loss_is_the_upper_bound_and_no_advice_is_given(tmp_path):
    f = Fleet(tmp_path)
    f.job("42", account="ml", user="ann", name="pretrain", start=T(10), end=T(14), gpus=8,
          placements=[("node-a", f"GPU-{i}") for i in range(8)], state="NODE_FAIL", state_raw="NODE_FAIL")
    f.write()
    got = reliability_store.report(f.reader(), Params(T(10), T(16)), as_of=T(16))
    fig = got["figures"]
    assert fig["lost_gpu_hours"] == pytest.approx(32.0) and fig["lost_is_upper_bound"] and fig["lost_measured_interruptions"] == 0
    assert got["interrupted_attempts"][0]["lost_basis"] == "upper bound" and "upper bound" in got["goodput"]["checkpoints"]
    advice = got["chains"][0]["checkpoint_advice"]
    assert advice["advised_interval_s"] is None and advice["checkpoint_save_s"] is None
    assert advice["no_advice"] == r.NO_ADVICE["no_checkpoints"]


# --- invariants ---

T0 = datetime(2026, 11, 16)
H = timedelta(hours=1)
STATES = ["COMPLETED", "NODE_FAIL", "PREEMPTED", "REQUEUED", "FAILED", "RUNNING", "CANCELLED by 0"]


@st.composite
def histories(draw):
    """Attempts of a few jobs in a day, and checkpoint times anywhere in it (some inside the attempts, some not)."""
    attempts, t = [], 0.0
    for i in range(draw(st.integers(1, 8))):
        t += draw(st.floats(0, 3))
        run = draw(st.floats(0.01, 5))
        state = draw(st.sampled_from(STATES))
        attempts.append(Attempt("c", "slurm", str(draw(st.integers(1, 3))), str(i), state.split()[0], T0 + t * H,
                                None if state == "RUNNING" else T0 + (t + run) * H, gpus=draw(st.sampled_from([1, 8, None])),
                                state_raw=state, user_name="ann", account="ml", name="train"))
        t += run
    ckpts = {("c", "slurm", k): sorted(T0 + x * H for x in draw(st.lists(st.floats(0, 30), max_size=6))) for k in "123"}
    return attempts, ckpts


@hsettings(max_examples=200, deadline=None)
@given(histories())
def test_lost_work_with_checkpoints_is_at_most_the_upper_bound(h):
    attempts, ckpts = h
    classified = r.classify_all(r.number_requeues(attempts))
    end = T0 + 40 * H
    with_ck, without = r.figures(classified, T0, end, ckpts), r.figures(classified, T0, end)
    if without["lost_gpu_hours"] is None:
        assert with_ck["lost_gpu_hours"] is None
    else:
        assert 0 <= with_ck["lost_gpu_hours"] <= without["lost_gpu_hours"] + 1e-9
        assert 0 <= with_ck["lost_measured_gpu_hours"] <= with_ck["lost_gpu_hours"] + 1e-9
        for cause, v in with_ck["lost_gpu_hours_by_cause"].items():
            assert v <= without["lost_gpu_hours_by_cause"][cause] + 1e-9
    chains_ck = {ch.attempts[0].attempt.job_id: ch for ch in r.link_chains(classified, ckpts, as_of=end)}
    for ch in r.link_chains(classified, None, as_of=end):
        c = chains_ck[ch.attempts[0].attempt.job_id]
        assert 0 <= c.lost_s <= ch.lost_s + 1e-6 and ch.lost_upper_bound == any(x.cause not in ("completed", "not_ended") for x in ch.attempts)
        assert c.productive_s >= ch.productive_s - 1e-6 and c.wall_s == ch.wall_s
        n, cost, used = r.checkpoint_habits(c, {k: [(t, 1.0) for t in v] for k, v in ckpts.items()})
        assert (cost is None) == (n == 0) and (used is None or used >= 0)


def test_a_store_of_schema_8_gains_job_checkpoints(tmp_path):
    """Schema 8 kept no checkpoints: the upgrade adds the table; interruptions before it stay upper bounds."""
    import duckdb

    from gpufleet.collector import schema, store as store_mod

    db = duckdb.connect(str(tmp_path / store_mod.STATE_DB))
    db.execute(schema.STATE_DDL[0])
    for version in range(1, 9):
        for stmt in schema.MIGRATIONS[version]:
            db.execute(stmt)
        db.execute("INSERT INTO schema_version VALUES (?, ?)", [version, T(0)])
    db.close()
    w = StoreWriter(tmp_path)
    assert w.schema_version() == schema.SCHEMA_VERSION >= 9
    w.publish()
    w.close()
    assert store_mod.open_reader(tmp_path).execute("SELECT count(*) FROM job_checkpoints").fetchone() == (0,)
