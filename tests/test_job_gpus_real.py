"""The real single-node Slurm (tests/realstack/slurm.py) configured WITHOUT gres/gpu in
AccountingStorageTRES, the common site (issue #51): slurmdbd records no GPU of any job. A 2-GPU
job's count comes from slurmctld (through the real slurmrestd) while it knows the job, and
survives the job's end and every later accounting read (slurmrestd's slurmdbd list, sacct); the
collector says so with the fix, and the Health page shows it."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import httpx
import pytest

from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.slurm import SacctSource
from gpufleet.collector.sources.slurmrestd import SlurmrestdSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.realstack.slurm import start_slurm
from tests.test_sacct_real import TZ, utcnow
from tests.test_slurmrestd_real import serving_slurmrestd

pytestmark = pytest.mark.realstack
FIX = "add gres/gpu to AccountingStorageTRES in slurm.conf"


@pytest.fixture(scope="module")
def untracked(tmp_path_factory):
    """A cluster of its own: the session's (slurm_cluster) accounts gres/gpu."""
    cluster = start_slurm(tmp_path_factory.mktemp("slurm-no-gpu-tres"), accounting_tres=None)
    yield cluster
    cluster.stop()


def test_a_jobs_gpus_survive_accounting_that_does_not_track_them(untracked, tmp_path, caplog, monkeypatch):
    c = untracked
    job = c.sbatch("sleep 6\n", account="physics", gpus=2)
    c.wait_running(job)
    store = tmp_path / "s"
    w = StoreWriter(store)
    with serving_slurmrestd(c, tmp_path) as sock:
        def restd(**kw) -> SlurmrestdSource:
            return SlurmrestdSource(url="http://slurmrestd", transport=httpx.HTTPTransport(uds=str(sock)), cluster="gpufleet",
                                    tz=TZ, initial_lookback=timedelta(hours=2), **kw)
        live, accounting = restd(), restd(current_jobs=False, name="slurmdbd")
        sacct = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2))
        col = Collector(w, [ScheduledSource(s, 60) for s in (live, accounting, sacct)])
        with caplog.at_level(logging.WARNING):
            assert col.run_source(live) is True  # running: slurmdbd has it without a GPU, slurmctld with 2
        key = str(job)
        row = lambda: open_reader(store).execute("SELECT gpus, gpus_source, state FROM jobs WHERE job_key = ?", [key]).fetchone()  # noqa: E731
        assert row()[:2] == (2, "slurmctld")
        assert c.wait_job(job) == "COMPLETED"
        assert "gres/gpu" not in c.sacct("-X", "-n", "-P", "-j", key, "--format=AllocTRES")  # really no GPU recorded
        assert col.run_source(live) is True  # ended: slurmctld still keeps it (MinJobAge)
        assert col.run_source(accounting) is True  # slurmdbd alone, as after slurmctld forgot it
        assert col.run_source(sacct) is True  # and sacct's text
    assert row() == (2, "slurmctld", "COMPLETED")
    assert live.tracks_gpus is False  # slurmrestd's /slurmdb/v0.0.38/tres has no gres/gpu
    warned = [r.getMessage() for r in caplog.records if "accounting_without_gpus" in r.getMessage()]
    assert warned and FIX in warned[0]  # at start, in the log
    manifest = json.loads((store / "manifest.json").read_text())["unrecognized"]
    assert {u["source"] for u in manifest if u["kind"] == "accounting_without_gpus" and FIX in u["detail"]} >= {"slurmrestd", "sacct"}
    col.count_job_gpu_sources()  # as upkeep does
    assert col.metrics.registry.get_sample_value("gpufleet_collect_jobs_gpus_fallback",
                                                 {"cluster": "gpufleet", "gpus_source": "slurmctld"}) >= 1
    w.close()

    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from tests.test_dashboard_pages import frame, goto, open_app

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(store))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = goto(open_app(), "health")
    assert any(FIX in wn.value for wn in at.warning), [wn.value for wn in at.warning]
    shown = frame(at, "health_job_gpus")
    assert shown[shown["gpus_source"] == "slurmctld"]["ended"].tolist() == [1]


def test_an_sacct_only_site_says_it_and_fills_the_count_from_the_job_mapping(untracked, tmp_path, monkeypatch):
    """A site that reads accounting through sacct alone (no slurmrestd, so no slurmctld record): no
    record of the read names a gres/gpu TRES, so the count is unknown (never 0) and the read says
    why with the fix; the exporters' job mapping, which saw the job hold 2 GPUs, fills it (job_map);
    the Health page warns."""
    from gpufleet.collector.schema import Batch

    c = untracked
    job = c.sbatch("sleep 2\n", account="physics", gpus=2)
    assert c.wait_job(job) == "COMPLETED"
    key = str(job)
    assert "gres/gpu" not in c.sacct("-X", "-n", "-P", "-j", key, "--format=AllocTRES")  # really no GPU recorded
    store = tmp_path / "s"
    w = StoreWriter(store)
    sacct = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2))
    col = Collector(w, [ScheduledSource(sacct, 60)])
    assert col.run_source(sacct) is True
    row = lambda: open_reader(store).execute("SELECT gpus, gpus_source, state FROM jobs WHERE job_key = ?", [key]).fetchone()  # noqa: E731
    assert row() == (None, None, "COMPLETED")  # unknown, not 0
    manifest = json.loads((store / "manifest.json").read_text())["unrecognized"]
    said = [u["detail"] for u in manifest if u["kind"] == "accounting_without_gpus" and u["source"] == "sacct"]
    assert said and FIX in said[0] and "no job record of this read names a gres/gpu TRES" in said[0]
    # the exporters' job mapping saw the job on two GPUs of the node
    now = utcnow()
    seen = [dict(ts=now - timedelta(seconds=s), cluster="gpufleet", scheduler="slurm", job_key=key, host="node1", gpu_uuid=f"GPU-{i}",
                 gpu_instance=-1, gpu=i, source="exporter") for i in (0, 1) for s in (60, 30)]
    w.commit(Batch(key="jobmap", allocations=seen))
    w.publish()
    assert row() == (2, "job_map", "COMPLETED")
    col.count_job_gpu_sources()  # as upkeep does
    assert col.metrics.registry.get_sample_value("gpufleet_collect_jobs_gpus_fallback", {"cluster": "gpufleet", "gpus_source": "job_map"}) == 1
    w.close()

    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from tests.test_dashboard_pages import frame, goto, open_app

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(store))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = goto(open_app(), "health")
    assert any(FIX in wn.value and "no job record of this read" in wn.value for wn in at.warning), [wn.value for wn in at.warning]
    shown = frame(at, "health_job_gpus")
    assert shown[shown["gpus_source"] == "job_map"]["ended"].tolist() == [1]
