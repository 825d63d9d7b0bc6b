"""End to end on the demo fleet (issue #14): a Slurm job with no job report gets an MFU estimate
from the tensor activity our own exporter publishes (GPM on the simulated H100s), labelled as an
estimate and equal to a hand calculation on its stored samples.

The path is the product's: the demo's live driver writes the plan's load into the simulator's
control files and the Slurm job-map directory; each node's exporter polls and renders; the
collector's parser turns the exposition into sample and allocation rows; the store keeps them;
analytics.mfu decides the method and the figure.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pyarrow as pa
import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.mfu import gpu_peaks, job_mfu
from gpufleet.analytics.params import Params
from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter
from gpufleet.demo import fleet as fleet_mod
from gpufleet.demo import history
from gpufleet.demo.live import LiveFleet
from tests.support.fleet import Fleet

NOW = datetime(2026, 11, 21, 9, 30, 7)
STEPS = 12  # 15 s apart: 3 minutes of scrapes
H100 = "NVIDIA H100 80GB HBM3"


def test_a_slurm_job_without_a_report_gets_an_estimate_from_our_exporters_tensor_activity(tmp_path):
    fleet = fleet_mod.build(NOW)
    end_by = fleet.now + timedelta(seconds=15 * STEPS + 60)
    job = next(j for j in fleet.jobs if j.scheduler == "slurm" and j.profile == "train" and j.start < fleet.now and j.end > end_by)
    hosts = sorted({s.node.host for s in job.slots})
    sub = dataclasses.replace(fleet, nodes=tuple(n for n in fleet.nodes if n.host in hosts))
    assert {n.model for n in sub.nodes} == {H100} and all(n.cluster == "hpc" for n in sub.nodes)
    t = [fleet.now]
    live = LiveFleet(sub, tmp_path / "nodes", clock=lambda: (t[0] - datetime(1970, 1, 1)).total_seconds(), tick_seconds=3600)
    f = Fleet(tmp_path / "store")
    f.write()
    w = StoreWriter(f.root)
    stored = []
    try:
        for k in range(STEPS):
            t[0] = fleet.now + timedelta(seconds=15 * k)
            live.tick()  # the plan's load -> control files; the job -> the Slurm job-map files
            for host in hosts:
                p = live.nodes[host].poller
                p.poll_telemetry()
                p.poll_processes_and_jobs()
                text = p.exposition().decode()
                assert "gpufleet_job_reported_flops{" not in text  # the demo's jobs report nothing
                parsed = parse_exposition(text, ts=t[0], cluster="hpc", target=f"{host}:9402")
                assert parsed.rejected == 0, parsed.problems
                w.commit(Batch(key=f"scrape:{host}:{k}", samples=parsed.samples, allocations=parsed.allocations, gpus=parsed.gpus))
                stored.append(parsed.samples)
    finally:
        live.stop()
    assert not live._sockets.exists()  # (a fleet never started leaves no directory behind either)
    w.commit(Batch(key="jobs", jobs=[history.job_row(job, "RUNNING", t[0])]))
    w.publish()
    w.close()

    window_end = t[0]  # the last scrape's sample covers nothing inside the window
    [row] = [r for r in job_mfu(Analysis(f.reader(), Params(fleet.now, window_end), now=window_end)).to_dicts()
             if r["job_key"] == job.job_key]
    assert row["method"] == "estimate (tensor_active x clock / boost, dtype=bf16)"
    assert row["reason"] is None and row["model"] == H100

    # by hand: every sample of the job's GPUs but the last stands for 15 s; each gives
    # tensor_active x SM clock / boost clock, and the estimate is their time-weighted mean
    boost = gpu_peaks().filter((gpu_peaks()["model"] == H100) & (gpu_peaks()["dtype"] == "bf16"))["boost_clock_mhz"][0]
    mine = {(s.node.host, s.gpu) for s in job.slots}
    samples = pa.concat_tables(stored).to_pylist()
    terms = [r["tensor_active"] * r["sm_clock_mhz"] / boost for r in samples
             if (r["host"], r["gpu"]) in mine and r["ts"] < window_end]
    assert len(terms) == len(mine) * (STEPS - 1) and all(r["tensor_active"] is not None for r in samples if (r["host"], r["gpu"]) in mine)
    hand = sum(terms) / len(terms)
    assert 0 < hand < 1
    assert row["mfu"] == pytest.approx(hand, rel=1e-6)
