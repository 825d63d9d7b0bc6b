"""MFU: the three methods (reported, tensor-activity estimate, unknown), the peak table, and the
path a job's report takes: jobreport.report() -> exporter -> exposition -> collector -> store.

Golden numbers, worked out here (window [10:00, 12:00), every job runs the whole window):
- job 1, H100, tensor_active 0.45, SM clock 1980 MHz = boost:  0.45 x 1980/1980 = 0.45
- job 2, H100, tensor_active 0.45, SM clock 1485 MHz:          0.45 x 1485/1980 = 0.3375
- job 3, 8 x H100 bf16, reports 3000 tokens/s of a 7e9-parameter model (gpus=8):
         6 x 7e9 x 3000 / (8 x 989e12) = 1.26e14 / 7.912e15 = 0.015925...
         (its tensor_active 0.9 is ignored: a report wins over the estimate)
- job 4, unknown model, tensor_active 0.5:                     unknown (no peak)
- job 5, H100 with GPU_UTIL 95 % only:                         unknown (no tensor data), never 0.95
- job 6, 2 x H100, reports 989e12 FLOP/s without a GPU count:  989e12 / (2 x 989e12) = 0.5
- job 7, H100 PCIe (no boost clock recorded), tensor 0.3:      0.3, without clock scaling
- job 8, V100 SXM2 (no bf16 on Volta), tensor 0.4:             unknown for bf16; 0.4 x 1377/1530 = 0.36 for fp16
Accounts, weighted by GPU-hours (1 GPU x 2 h = 2 GPU-h):
- physics: jobs 1, 2 (2 GPU-h each): (0.45 x 2 + 0.3375 x 2) / 4 = 0.39375, one method
- bio: job 3 (16 GPU-h, reported) + job 5 (2 GPU-h, unknown): 0.015925..., 1 unknown job
- chem: job 6 (4 GPU-h, 0.5) + job 7 (2 GPU-h, 0.3): (2 + 0.6) / 6 = 0.4333..., "mixed"
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from test_analytics_properties import CLUSTER, MAX_GAP, SETTINGS, at, batches, fleets, scratch

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.mfu import DTYPES, NO_TENSOR, account_mfu, gpu_peaks, job_mfu
from gpufleet.analytics.params import Filters, Params
from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.exporter import jobreport
from gpufleet.exporter.backends import sim_scenario
from gpufleet.exporter.backends.sim import SimBackend
from gpufleet.exporter.jobreports import JobReportSource
from gpufleet.exporter.poller import Poller
from tests.support.fleet import Fleet
from tests.support.raw_analysis import RawAnalysis

H100, H100_PCIE, V100 = "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "Tesla V100-SXM2-16GB"
MYSTERY = "NVIDIA Imaginary X1"
JOB3 = 6 * 7e9 * 3000 / (8 * 989e12)


def T(h: int, m: int = 0) -> datetime:
    return datetime(2026, 11, 16, h, m)


# --- the peak table ---


def peak_rows() -> list[dict]:
    with resources.files("gpufleet.analytics.data").joinpath("gpu_peaks.csv").open() as f:
        return list(csv.DictReader(f))


def test_every_peak_has_a_source_and_sane_values():
    rows = peak_rows()
    assert rows
    for r in rows:
        assert r["source"].strip(), r
        assert r["dtype"] in DTYPES, r
        assert 0 < float(r["dense_tflops"]) < 10000, r
        assert "~" not in r["dense_tflops"]
    assert len({(r["model"], r["dtype"]) for r in rows}) == len(rows)  # one peak per model and dtype
    boosts: dict[str, set[str]] = {}
    for r in rows:
        boosts.setdefault(r["model"], set()).add(r["boost_clock_mhz"])
    assert all(len(b) == 1 for b in boosts.values())  # a model has one boost clock (or none)


def test_peaks_hold_the_reference_figures():
    p = {(r["model"], r["dtype"]): (r["dense_tflops"], r["boost_clock_mhz"]) for r in gpu_peaks().iter_rows(named=True)}
    assert p[(H100, "bf16")] == (989.0, 1980.0)
    assert p[(H100, "fp8")] == (1979.0, 1980.0)
    assert p[("NVIDIA A100-SXM4-80GB", "bf16")] == (312.0, 1410.0)
    assert p[("NVIDIA L4", "bf16")] == (121.0, 2040.0)
    assert p[("Tesla T4", "fp16")] == (65.0, 1590.0)
    assert p[(H100_PCIE, "bf16")] == (756.0, None)  # boost clock not recorded: no clock scaling
    assert (V100, "bf16") not in p  # Volta has no bf16 tensor cores
    assert ("NVIDIA A10G", "bf16") not in p  # unverified figure: left out


# --- analytics over a store ---


def report_batch(key: str, job_key: str, flops: float, gpus: int | None, basis: str, times, host: str = "n3") -> Batch:
    return Batch(key=key, throughput=[
        dict(ts=t, cluster="c1", scheduler="slurm", job_key=job_key, host=host, flops=flops, gpus=gpus, basis=basis) for t in times
    ])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("mfu"))
    f.gpu_series("n1", "GPU-1", T(10), T(12), util=90.0, tensor=0.45, sm_clock=1980)
    f.gpu_series("n1", "GPU-2", T(10), T(12), util=90.0, tensor=0.45, sm_clock=1485, gpu=1)
    for i in range(8):
        f.gpu_series("n3", f"GPU-3{i}", T(10), T(12), util=99.0, tensor=0.9, sm_clock=1980, gpu=i)
    f.gpu_series("n4", "GPU-4", T(10), T(12), util=90.0, tensor=0.5, sm_clock=1500, model=MYSTERY)
    f.gpu_series("n5", "GPU-5", T(10), T(12), util=95.0)  # NVML-only: GPU_UTIL, no tensor activity
    f.gpu_series("n6", "GPU-60", T(10), T(12), util=80.0)
    f.gpu_series("n6", "GPU-61", T(10), T(12), util=80.0, gpu=1)
    f.gpu_series("n7", "GPU-7", T(10), T(12), util=70.0, tensor=0.3, sm_clock=1500, model=H100_PCIE)
    f.gpu_series("n8", "GPU-8", T(10), T(12), util=70.0, tensor=0.4, sm_clock=1377, model=V100)
    f.gpu_series("n10", "GPU-10a", T(10), T(12), util=70.0, tensor=0.3, sm_clock=1500, model=H100_PCIE)
    f.gpu_series("n10", "GPU-10b", T(10), T(12), util=70.0, tensor=0.3, sm_clock=1500, model=MYSTERY, gpu=1)
    job = lambda key, account, gpus, placements: f.job(key, account=account, user="u" + key, start=T(10), end=T(12), gpus=gpus, placements=placements)  # noqa: E731
    job("1", "physics", 1, [("n1", "GPU-1")])
    job("2", "physics", 1, [("n1", "GPU-2")])
    job("3", "bio", 8, [("n3", f"GPU-3{i}") for i in range(8)])
    job("4", "other", 1, [("n4", "GPU-4")])
    job("5", "bio", 1, [("n5", "GPU-5")])
    job("6", "chem", 2, [("n6", "GPU-60"), ("n6", "GPU-61")])
    job("7", "chem", 1, [("n7", "GPU-7")])
    job("8", "other", 1, [("n8", "GPU-8")])
    job("10", "mixed", 2, [("n10", "GPU-10a"), ("n10", "GPU-10b")])  # two models, one without a peak
    f.write()
    w = StoreWriter(f.root)
    times = [T(10, m) for m in range(0, 60, 5)] + [T(11, m) for m in range(0, 60, 5)]
    w.commit(report_batch("r3", "3", 6 * 7e9 * 3000, 8, "6N_tokens", times))
    w.commit(report_batch("r6", "6", 989e12, None, "flops", times, host="n6"))
    w.commit(report_batch("r9", "9", 1e15, 8, "flops", times, host="n9"))  # a report from a job the store has no GPU of
    w.publish()
    w.close()
    return f


def analysis(store, dtype: str = "bf16") -> Analysis:
    return Analysis(store.reader(), Params(T(10), T(12), mfu_dtype=dtype), now=T(20))


@pytest.fixture(scope="module")
def jobs(store):
    return {r["job_id"]: r for r in job_mfu(analysis(store)).to_dicts()}


def test_estimate_from_tensor_activity_at_boost_clock(jobs):
    j = jobs["1"]
    assert j["mfu"] == pytest.approx(0.45)
    assert j["method"] == "estimate (tensor_active x clock / boost, dtype=bf16)"
    assert j["reason"] is None
    assert j["model"] == H100 and j["gpus"] == 1 and j["gpu_h"] == pytest.approx(2.0)
    assert j["tflops_per_gpu"] == pytest.approx(0.45 * 989)


def test_estimate_scales_by_sm_clock_over_boost(jobs):
    assert jobs["2"]["mfu"] == pytest.approx(0.45 * 1485 / 1980)
    assert jobs["2"]["mfu"] == pytest.approx(0.3375)


def test_reported_tokens_per_second_wins_over_the_estimate(jobs):
    j = jobs["3"]
    assert j["mfu"] == pytest.approx(JOB3) and j["mfu"] == pytest.approx(0.0159, abs=5e-5)
    assert j["method"] == "reported (6N x tokens/s, dtype=bf16)"
    assert "attention FLOPs excluded" in j["reason"]
    assert j["gpus"] == 8 and j["account"] == "bio"


def test_reported_flops_without_gpu_count_uses_the_jobs_gpus(jobs):
    assert jobs["6"]["mfu"] == pytest.approx(0.5)
    assert jobs["6"]["method"] == "reported (FLOP/s, dtype=bf16)"


def test_unknown_model_is_unknown_with_reason(jobs):
    j = jobs["4"]
    assert j["mfu"] is None and j["method"] == "unknown"
    assert j["reason"] == f"unknown GPU model '{MYSTERY}' for dtype bf16: no peak in gpu_peaks.csv"


def test_a_job_on_two_models_names_both_and_the_one_without_a_peak(jobs):
    j = jobs["10"]
    assert j["model"] == ", ".join(sorted([H100_PCIE, MYSTERY])) and j["gpus"] == 2
    assert j["mfu"] is None and j["method"] == "unknown"
    assert j["reason"] == f"unknown GPU model '{MYSTERY}' for dtype bf16: no peak in gpu_peaks.csv"


def test_gpu_util_alone_never_gives_an_mfu(jobs):
    j = jobs["5"]
    assert j["mfu"] is None and j["method"] == "unknown"
    assert j["reason"] == NO_TENSOR


def test_missing_boost_clock_skips_clock_scaling_and_says_so(jobs):
    j = jobs["7"]
    assert j["mfu"] == pytest.approx(0.3)
    assert j["method"] == "estimate (tensor_active, no clock scaling, dtype=bf16)"
    assert j["reason"] == f"no clock scaling: no spec boost clock for '{H100_PCIE}' in gpu_peaks.csv"


def test_dtype_the_gpu_lacks_is_unknown_and_the_configured_dtype_is_used(store, jobs):
    assert jobs["8"]["method"] == "unknown" and "no dense bf16 peak" in jobs["8"]["reason"]
    fp16 = {r["job_id"]: r for r in job_mfu(analysis(store, "fp16")).to_dicts()}
    assert fp16["8"]["mfu"] == pytest.approx(0.4 * 1377 / 1530)
    assert fp16["8"]["method"] == "estimate (tensor_active x clock / boost, dtype=fp16)"
    assert fp16["3"]["mfu"] == pytest.approx(JOB3)  # same peak for fp16 on H100
    fp8 = {r["job_id"]: r for r in job_mfu(analysis(store, "fp8")).to_dicts()}
    assert fp8["3"]["mfu"] == pytest.approx(6 * 7e9 * 3000 / (8 * 1979e12))


def test_report_for_a_job_without_gpus_in_the_store_is_unknown(jobs):
    j = jobs["9"]
    assert j["method"] == "unknown" and "GPU model is unknown" in j["reason"]


def test_columns(store):
    df = job_mfu(analysis(store))
    assert df.columns[:10] == ["cluster", "job_key", "job_id", "account", "user_name", "model", "gpus", "mfu", "method", "reason"]
    assert df["method"].null_count() == 0


def test_account_rollup_weighted_by_gpu_hours(store):
    acc = {r["account"]: r for r in account_mfu(analysis(store)).to_dicts()}
    assert acc["physics"]["mfu"] == pytest.approx((0.45 * 2 + 0.3375 * 2) / 4)
    assert acc["physics"]["method"] == "estimate (tensor_active x clock / boost, dtype=bf16)"
    assert acc["physics"]["unknown_jobs"] == 0
    assert acc["bio"]["mfu"] == pytest.approx(JOB3)
    assert acc["bio"]["method"] == "reported (6N x tokens/s, dtype=bf16)"
    assert (acc["bio"]["jobs"], acc["bio"]["unknown_jobs"], acc["bio"]["unknown_gpu_h"]) == (2, 1, pytest.approx(2.0))
    assert acc["chem"]["mfu"] == pytest.approx((0.5 * 4 + 0.3 * 2) / 6)
    assert acc["chem"]["method"] == "mixed"
    assert acc["other"]["mfu"] is None and acc["other"]["method"] == "unknown" and acc["other"]["unknown_jobs"] == 2


def test_account_filter(store):
    a = Analysis(store.reader(), Params(T(10), T(12), filters=Filters(account="chem")), now=T(20))
    assert sorted(job_mfu(a)["job_id"].to_list()) == ["6", "7"]


# --- the store: hourly rows, idempotent ---


def test_a_job_s_mfu_on_its_own_run_is_its_row_of_the_window_s(tmp_path):
    """The Jobs page's report computes a job on its run inside the window (dashboards/data.py
    job_report: the window narrowed to the run, filtered to the job); with the window's
    throughput reports (reports_in) its MFU is its row of the window's - a report written at the
    job's exit, after its accounted end, counts in both."""
    f = Fleet(tmp_path / "store")
    f.gpu_series("n1", "GPU-1", T(10), T(12), util=90.0, tensor=0.45, sm_clock=1980)
    f.gpu_series("n2", "GPU-2", T(10), T(12), util=90.0, tensor=0.5, sm_clock=1980)
    f.job("1", account="physics", user="ann", start=T(10), end=T(11), gpus=1, placements=[("n1", "GPU-1")])
    f.job("2", account="physics", user="ann", start=T(10), end=T(12), gpus=1, placements=[("n2", "GPU-2")])
    f.write()
    w = StoreWriter(f.root)
    w.commit(report_batch("r1", "1", 400e12, 1, "flops", [T(10, 30)], host="n1"))
    w.commit(report_batch("r1-exit", "1", 200e12, 1, "flops", [T(11, 1)], host="n1"))  # written at its exit
    w.publish()
    w.close()
    window = analysis(f)
    rows = {r["job_id"]: r for r in job_mfu(window).to_dicts()}
    assert rows["1"]["method"].startswith("reported")
    narrowed = RawAnalysis(f.reader(), Params(T(10), T(11), filters=Filters(cluster="c1", account="physics", user_name="ann", job_key="1")),
                           now=T(20), detail=True)
    got = job_mfu(narrowed, reports_in=(T(10), T(12))).filter(pl.col("job_key") == "1").to_dicts()
    assert got == [pytest.approx(rows["1"])]
    alone = job_mfu(narrowed).filter(pl.col("job_key") == "1").row(0, named=True)
    assert alone["mfu"] != pytest.approx(rows["1"]["mfu"])  # (its own window would miss the report at its exit)


def test_throughput_rows_are_hourly_means_and_a_batch_counts_once(tmp_path):
    w = StoreWriter(tmp_path)
    w.commit(report_batch("a", "1", 100.0, 4, "flops", [T(10, 0), T(10, 30)]))
    w.commit(report_batch("a", "1", 100.0, 4, "flops", [T(10, 0), T(10, 30)]))  # the same batch again
    w.commit(report_batch("b", "1", 400.0, None, "flops", [T(10, 45), T(11, 5)]))
    rows = w.db.execute("SELECT ts, reports, flops, gpus, basis FROM job_throughput ORDER BY ts").fetchall()
    w.close()
    # 10:00 hour: 100, 100, 400 -> mean 200 over 3 reports (not 5); gpus kept from the reports that said
    assert rows == [(T(10), 3, pytest.approx(200.0), 4, "flops"), (T(11), 1, pytest.approx(400.0), None, "flops")]


# --- the job's side: writing reports ---


def test_report_writes_one_json_file_per_job(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_JOB_REPORT_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    path = jobreport.report(tokens_per_second=3000, parameters=7e9, gpus=8)
    assert path == tmp_path / "4242.json"
    doc = json.loads(path.read_text())
    assert (doc["scheduler"], doc["job_id"], doc["tokens_per_second"], doc["parameters"], doc["gpus"]) == ("slurm", "4242", 3000.0, 7e9, 8)
    assert jobreport.report(tokens_per_second=1, parameters=1) is None  # within min_interval: skipped
    assert json.loads(path.read_text())["tokens_per_second"] == 3000.0
    assert jobreport.report(flops_per_second=5e14, min_interval=0) == path
    assert json.loads(path.read_text())["flops_per_second"] == 5e14
    assert [p.name for p in tmp_path.iterdir()] == ["4242.json"]  # no temporary files left


def test_report_knows_a_kubernetes_pod(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("POD_NAME", "trainer-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    path = jobreport.report(flops_per_second=1e15, directory=tmp_path)
    assert path.name == "ml_trainer-0.json"
    doc = json.loads(path.read_text())
    assert (doc["scheduler"], doc["namespace"], doc["pod"]) == ("kubernetes", "ml", "trainer-0")


def test_report_refuses_bad_arguments_and_survives_a_missing_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    for kwargs in ({}, {"tokens_per_second": 10}, {"flops_per_second": 1.0, "parameters": 5},
                   {"flops_per_second": float("nan")}, {"flops_per_second": -1.0}, {"flops_per_second": 1.0, "gpus": 0},
                   {"flops_per_second": 1.0, "job_id": "../../etc/passwd"}):
        with pytest.raises(ValueError):
            jobreport.report(directory=tmp_path, **kwargs)
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="cannot tell which job"):
        jobreport.report(flops_per_second=1.0, directory=tmp_path)
    assert jobreport.report(flops_per_second=1.0, job_id="7", directory=tmp_path / "missing") is None  # logged, not raised


def test_report_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpufleet.exporter.jobreport", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=Path(__file__).resolve().parents[1], env={**os.environ, "SLURM_JOB_ID": ""})
    ok = run("--tokens-per-second", "3000", "--parameters", "7e9", "--job-id", "55", "--dir", str(tmp_path))
    assert ok.returncode == 0 and ok.stdout.strip() == str(tmp_path / "55.json")
    assert json.loads((tmp_path / "55.json").read_text())["parameters"] == 7e9
    bad = run("--tokens-per-second", "3000", "--job-id", "55", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "tokens_per_second and parameters" in bad.stderr
    assert run("--flops-per-second", "1e15", "--job-id", "55", "--dir", str(tmp_path / "nope")).returncode == 1


# --- the exporter publishes, the collector stores ---


def make_poller(directory: Path) -> Poller:
    return Poller(SimBackend(sim_scenario.parse({"hostname": "node-a", "gpus": 1})), hostname="node-a",
                  job_reports=JobReportSource(directory))


def published(p: Poller) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(p.exposition().decode()) for s in fam.samples]


def test_exporter_publishes_reported_flops_and_gpus(tmp_path):
    jobreport.report(tokens_per_second=3000, parameters=7e9, gpus=8, job_id="42", directory=tmp_path)
    jobreport.report(flops_per_second=2e15, job_id="ml/trainer-0", directory=tmp_path)
    p = make_poller(tmp_path)
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = published(p)
    flops = {(lab.get("job_id"), lab.get("pod")): (lab, v) for n, lab, v in ss if n == "gpufleet_job_reported_flops"}
    lab, v = flops[("42", None)]
    assert v == pytest.approx(6 * 7e9 * 3000) and lab == {"Hostname": "node-a", "scheduler": "slurm", "job_id": "42", "basis": "6N_tokens"}
    lab, v = flops[(None, "trainer-0")]
    assert v == 2e15 and lab == {"Hostname": "node-a", "scheduler": "kubernetes", "namespace": "ml", "pod": "trainer-0", "basis": "flops"}
    assert [(lab["job_id"], v) for n, lab, v in ss if n == "gpufleet_job_reported_gpus"] == [("42", 8)]  # the pod gave no count
    assert [v for n, lab, v in ss if n == "gpufleet_collector_success" and lab["collector"] == "job_reports"] == [1]


def test_stale_and_garbled_reports_are_dropped_and_counted(tmp_path):
    jobreport.report(flops_per_second=1e15, job_id="1", directory=tmp_path)
    old = jobreport.report(flops_per_second=1e15, job_id="2", directory=tmp_path)
    os.utime(old, (time.time() - 300, time.time() - 300))  # 5 minutes old: the job stopped reporting
    (tmp_path / "3.json").write_text("{not json")
    (tmp_path / "4.json").write_text(json.dumps({"version": 1, "scheduler": "slurm", "job_id": "4", "flops_per_second": "fast"}))
    (tmp_path / ".5.json.tmp").write_text("{half")  # a write in flight
    p = make_poller(tmp_path)
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = published(p)
    assert [lab["job_id"] for n, lab, v in ss if n == "gpufleet_job_reported_flops"] == ["1"]
    assert [v for n, lab, v in ss if n == "gpufleet_collector_problems_total" and lab["collector"] == "job_reports"] == [2]
    assert [v for n, lab, v in ss if n == "gpufleet_collector_success" and lab["collector"] == "job_reports"] == [1]


def test_missing_report_directory_is_no_reports_not_a_failure(tmp_path):
    p = make_poller(tmp_path / "nobody-reported-yet")
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = published(p)
    assert not [1 for n, *_ in ss if n.startswith("gpufleet_job_reported")]
    assert [v for n, lab, v in ss if n == "gpufleet_collector_success" and lab["collector"] == "job_reports"] == [1]


def test_collector_parses_reports_into_throughput_rows():
    text = (
        'gpufleet_job_reported_flops{Hostname="n3",scheduler="slurm",job_id="42",basis="6N_tokens"} 1.26e+14\n'
        'gpufleet_job_reported_gpus{Hostname="n3",scheduler="slurm",job_id="42"} 8\n'
        'gpufleet_job_reported_flops{Hostname="n3",scheduler="kubernetes",namespace="ml",pod="p",basis="flops"} 2e15\n'
        'gpufleet_job_reported_gpus{Hostname="n3",scheduler="slurm",job_id="43"} 2\n'  # no flops: nothing to store
        'gpufleet_job_reported_flops{Hostname="n3",scheduler="slurm"} 1\n'  # no job
        'gpufleet_job_reported_flops{Hostname="n3",scheduler="slurm",job_id="44"} NaN\n'
        'gpufleet_job_reported_gpus{Hostname="n3",scheduler="slurm",job_id="45"} 1.5\n'
    )
    parsed = parse_exposition(text, ts=T(10), cluster="c1", target="n3:9402")
    assert sorted((r["scheduler"], r["job_key"], r["host"], r["flops"], r["gpus"], r["basis"]) for r in parsed.throughput) == [
        ("kubernetes", "ml/p", "n3", 2e15, None, "flops"),
        ("slurm", "42", "n3", 1.26e14, 8, "6N_tokens"),
    ]
    assert parsed.rejected == 3 and parsed.samples.num_rows == 0


def test_a_report_travels_from_the_job_to_the_mfu(tmp_path):
    """report() -> exporter -> exposition -> collector parse -> store -> analytics: 8 H100s at
    3000 tokens/s of a 7e9-parameter model give MFU 6 x 7e9 x 3000 / (8 x 989e12)."""
    reports = tmp_path / "reports"
    reports.mkdir()
    jobreport.report(tokens_per_second=3000, parameters=7e9, gpus=8, job_id="42", directory=reports)
    p = make_poller(reports)
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    text = p.exposition().decode()
    f = Fleet(tmp_path / "store")
    for i in range(8):
        f.gpu_series("node-a", f"GPU-{i}", T(10), T(11), util=99.0, gpu=i)  # no tensor data: only the report can tell
    f.job("42", account="bio", user="u", start=T(10), end=T(11), gpus=8, placements=[("node-a", f"GPU-{i}") for i in range(8)])
    f.write()
    w = StoreWriter(f.root)
    for m in range(0, 60, 15):
        parsed = parse_exposition(text, ts=T(10, m), cluster="c1", target="node-a:9402")
        w.commit(Batch(key=f"scrape:{m}", samples=None, throughput=parsed.throughput))
    w.publish()
    w.close()
    [row] = job_mfu(Analysis(f.reader(), Params(T(10), T(11)), now=T(20))).to_dicts()
    assert row["mfu"] == pytest.approx(JOB3)
    assert row["method"] == "reported (6N x tokens/s, dtype=bf16)"


def test_empty_window_gives_empty_frames(tmp_path):
    f = Fleet(tmp_path)
    f.write()
    a = Analysis(f.reader(), Params(T(10), T(12)), now=T(20))
    jobs = job_mfu(a)
    assert jobs.is_empty() and jobs.columns[:10] == ["cluster", "job_key", "job_id", "account", "user_name", "model", "gpus", "mfu", "method", "reason"]
    assert account_mfu(a, jobs).is_empty()


def test_exporter_config_wires_the_report_directory(tmp_path):
    import argparse

    from gpufleet.exporter.cli import build, resolve_options

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[exporter]\nbackend = "sim"\ndevice_map_file = ""\nkubelet_socket = ""\njob_report_dir = "{tmp_path}"\njob_report_max_age = 30\n')
    opts = resolve_options(argparse.Namespace(config=str(cfg)))
    p = build(opts)
    assert p.job_reports.directory == tmp_path and p.job_reports.max_age == 30
    cfg.write_text('[exporter]\nbackend = "sim"\ndevice_map_file = ""\nkubelet_socket = ""\njob_report_dir = ""\n')
    assert build(resolve_options(argparse.Namespace(config=str(cfg)))).job_reports is None


MODELS = ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "it's \"odd\""]


def mfu_rows():
    """Rows as sql.MFU_JOBS gives them, every column null, zero or set where it can be."""
    from hypothesis import strategies as st

    num = st.none() | st.just(0.0) | st.floats(1e-6, 1e6)
    models = st.none() | st.lists(st.sampled_from(MODELS), max_size=2, unique=True)
    return st.fixed_dictionaries({
        "cluster": st.just("c"), "scheduler": st.just("slurm"), "job_key": st.text("0123", min_size=1, max_size=3),
        "job_id": st.just("1"), "account": st.none() | st.just("a"), "user_name": st.just("u"),
        "model": st.none() | st.sampled_from(MODELS), "gpus": st.none() | st.integers(0, 8), "gpu_h": st.floats(0, 100),
        "mapped": st.booleans(), "model_missing": st.none() | st.booleans(), "no_peak": models, "not_listed": models,
        "peak_tflops": st.none() | st.floats(1, 2000), "tensor_s": num, "est_s": num, "scaled_s": num, "no_boost": models,
        "data_s": num, "reports": st.none() | st.integers(0, 3), "flops_per_gpu": num, "gpus_known": st.none() | st.booleans(),
        "basis": st.none() | st.sampled_from(["flops", "6N_tokens", "6N_tokens,flops", ""]),
    })


def test_every_job_is_decided_as_the_row_by_row_rule_decides_it():
    """mfu.decide_all (columns at a time, the odd rows by _decide) gives, row for row, what
    _decide gives each row - methods, reasons (percentages rounded as Python rounds them), MFU."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gpufleet.analytics.mfu import SCHEMA, _decide, decide_all

    @settings(max_examples=300, deadline=None)
    @given(st.lists(mfu_rows(), max_size=12), st.sampled_from(DTYPES),
           st.sampled_from([0.0, 0.005, 0.125, 0.5, 0.995, 0.9989, 0.999, 1.0]))
    def check(rows, dtype, share):
        for r in rows:  # est_s is summed with tensor_s (sql.MFU_JOBS): known together
            r["est_s"] = None if r["tensor_s"] is None else r["est_s"] or 0.0
        for r in rows[:2]:  # a few at the rounding edges of "clock scaling on x %"
            if r["tensor_s"]:
                r["scaled_s"] = share * r["tensor_s"]
        schema = {"cluster": pl.Utf8, "scheduler": pl.Utf8, "job_key": pl.Utf8, "job_id": pl.Utf8, "account": pl.Utf8,
                  "user_name": pl.Utf8, "model": pl.Utf8, "gpus": pl.Int64, "gpu_h": pl.Float64, "mapped": pl.Boolean,
                  "model_missing": pl.Boolean, "no_peak": pl.List(pl.Utf8), "not_listed": pl.List(pl.Utf8),
                  "peak_tflops": pl.Float64, "tensor_s": pl.Float64, "est_s": pl.Float64, "scaled_s": pl.Float64,
                  "no_boost": pl.List(pl.Utf8), "data_s": pl.Float64, "reports": pl.Int64, "flops_per_gpu": pl.Float64,
                  "gpus_known": pl.Boolean, "basis": pl.Utf8}
        raw = pl.DataFrame(rows, schema=schema)
        want = []
        for r in raw.iter_rows(named=True):
            try:
                want.append(_decide(r, dtype))
            except TypeError:  # a reported throughput over an unknown peak: decide_all lets _decide raise it too
                with pytest.raises(TypeError):
                    decide_all(raw, dtype)
                return
        got = decide_all(raw, dtype)
        assert got.schema == pl.Schema(SCHEMA)
        assert got.rows() == want

    check()


def test_a_filtered_window_lists_its_jobs_rows_of_the_unfiltered_table(tmp_path):
    """Under a job filter (partition, account, user) MFU lists the filter's jobs only, each with
    its row of the unfiltered table: a job of another partition that reports its throughput is
    not shown as one "with its GPU model unknown" (it was, under a partition filter), and a job
    that only reports (no accounting, no GPU seen) belongs to no filter."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-1", T(10), T(12), util=90.0, tensor=0.45, sm_clock=1980)
    f.gpu_series("n1", "GPU-2", T(10), T(12), util=90.0, tensor=0.45, sm_clock=1980, gpu=1)
    f.job("1", account="x", user="u", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-1")], partition="a")
    f.job("2", account="y", user="v", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-2")], partition="b")
    f.write()
    w = StoreWriter(tmp_path)
    for job, flops in (("1", 4e14), ("2", 3e14), ("9", 2e14)):
        w.commit(report_batch(f"r{job}", job, flops, 1, "flops", [T(10), T(11)], host="n1"))
    w.publish()
    w.close()
    con = open_reader(tmp_path)

    def rows(filters: Filters) -> dict[str, dict]:
        a = Analysis(con, Params(T(10), T(12), filters=filters), now=T(13))
        try:
            return {r["job_key"]: r for r in job_mfu(a).iter_rows(named=True)}
        finally:
            a.con.close()

    every = rows(Filters())
    assert set(every) == {"1", "2", "9"} and every["2"]["method"].startswith("reported")
    for filters, jobs in ((Filters(partition="a"), {"1"}), (Filters(partition="b"), {"2"}), (Filters(account="y"), {"2"}),
                          (Filters(user_name="u"), {"1"})):
        got = rows(filters)
        assert set(got) == jobs, filters
        assert all(got[j] == every[j] for j in jobs), filters


@SETTINGS
@given(fleets(), st.lists(st.tuples(st.sampled_from(["100", "101", "102", "103", "999"]), st.integers(1, 4)), max_size=4))
def test_every_filtered_mfu_row_is_its_row_of_the_unfiltered_table(fleet, reports):
    """Invariant (random fleets: jobs mapped or not, running or ended, across the window's edges;
    each account its own partition; throughput reports of some jobs, and of a job the store has
    no other trace of, "999"): under an account's, a user's or a partition's filter, MFU lists
    exactly the filter's jobs that the unfiltered table lists, each with the same row."""
    with scratch() as root:
        w = StoreWriter(root)
        for b in batches(fleet):
            for row in b.jobs:
                row["partition"] = f"p-{row['account']}"
            w.commit(b)
        w.commit(Batch(key="reports", throughput=[
            dict(ts=at(0) + timedelta(hours=h), cluster=CLUSTER, scheduler="slurm", job_key=job, host="h0", flops=1e14 * (h + 1), gpus=None,
                 basis="flops") for job, hours in reports for h in range(hours)]))
        w.publish()
        w.close()
        con = open_reader(root)
        lo, hi = fleet["cuts"][0], fleet["cuts"][2]
        partition_of = {j["key"]: f"p-{j['account']}" for j in fleet["jobs"]}

        def rows(filters: Filters) -> dict[str, dict]:
            p = Params(at(lo), at(hi), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]),
                       filters=filters)
            a = Analysis(con, p, now=at(fleet["now"]))
            try:
                return {r["job_key"]: r for r in job_mfu(a).iter_rows(named=True)}
            finally:
                a.con.close()

        every = rows(Filters())
        for account in ("alpha", "beta"):
            for filters, mine in ((Filters(account=account), lambda r: r["account"] == account),
                                  (Filters(partition=f"p-{account}"), lambda r: partition_of.get(r["job_key"]) == f"p-{account}" and r["account"]),
                                  (Filters(account=account, user_name="u"), lambda r: r["account"] == account and r["user_name"] == "u")):
                got = rows(filters)
                want = {k: r for k, r in every.items() if mine(r)}
                assert got == want, filters
