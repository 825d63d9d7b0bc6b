"""The live demo's training jobs report checkpoints through the real job API (issue #54): the
driver calls gpufleet.exporter.jobreport.checkpoint_saved for each running job that reports them
(demo/checkpoints.py), the node's exporter publishes it, and the collector's parse reads it."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.demo import checkpoints, fleet as fleet_mod
from gpufleet.demo.live import LiveFleet

NOW = datetime(2026, 11, 21, 9, 30, 7)
EPOCH = datetime(1970, 1, 1)


def test_live_training_jobs_report_their_checkpoints(tmp_path):
    fleet = fleet_mod.build(NOW)
    job = next(j for j in fleet.jobs if checkpoints.reports(j) and j.start < fleet.now < j.end
               and (j.requeue is None or not j.requeue.failed_at <= fleet.now < j.requeue.restarted_at)
               and checkpoints.saved(j, j.start, fleet.now))
    last_at, took = checkpoints.saved(job, job.start, fleet.now + timedelta(microseconds=1))[-1]
    host = job.slots[0].node.host
    sub = dataclasses.replace(fleet, nodes=tuple(n for n in fleet.nodes if n.host == host))
    t = [fleet.now]
    live = LiveFleet(sub, tmp_path / "nodes", clock=lambda: (t[0] - EPOCH).total_seconds(), tick_seconds=3600)
    try:
        live.tick()
        p = live.nodes[host].poller
        p.poll_telemetry()
        p.poll_processes_and_jobs()
        text = p.exposition().decode()
        line = next(x for x in text.splitlines() if x.startswith("gpufleet_job_checkpoint_timestamp_seconds{")
                    and f'job_id="{job.job_id}"' in x)
        assert float(line.rsplit(" ", 1)[1]) == (last_at - EPOCH).total_seconds()
        parsed = parse_exposition(text, ts=t[0], cluster="hpc", target=f"{host}:9402")
        mine = [c for c in parsed.checkpoints if c["job_key"] == job.job_key]
        assert [(c["saved_at"], c["duration_s"]) for c in mine] == [(last_at, took)]
        # a later tick past the job's next checkpoint reports that one; none is reported twice
        period = job.params[0]
        t[0] = last_at + timedelta(seconds=int(period) + 2)  # (the driver ticks on whole seconds)
        if t[0] < job.end and (job.requeue is None or t[0] < job.requeue.failed_at):
            live.tick()
            nxt = checkpoints.saved(job, last_at, t[0] + timedelta(microseconds=1))[-1][0]
            assert nxt > last_at and live._checkpointed[job.job_key] == nxt
    finally:
        live.stop()
    assert not live._sockets.exists()  # (a fleet never started leaves no directory behind either)
