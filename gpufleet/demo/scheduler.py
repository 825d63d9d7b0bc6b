"""The demo's scheduler accounting source: the simulated fleet's jobs as sacct and Kubernetes
would report them, for the collector (the gpufleet.collector.sources.base.Source interface).

A real site runs collector/sources/slurm.py (sacct) and kubernetes.py; the demo has no Slurm
or API server, so this source reads the plan instead and reports each job when its state
changes (submitted, started, ended), exactly the rows those sources would upsert.
"""

from __future__ import annotations

from datetime import datetime
from typing import Iterable

from gpufleet.collector.schema import Batch
from gpufleet.demo.fleet import Fleet
from gpufleet.demo.history import job_row


class SimSchedulerSource:
    name = "scheduler-sim"

    def __init__(self, fleet: Fleet, reported_at: datetime):
        """`reported_at`: when the jobs were last stored (the backfill's "now")."""
        self.fleet = fleet
        self.reported = {j.job_key: j.state_at(reported_at) for j in fleet.jobs}

    def run(self, now: datetime) -> Iterable[Batch]:
        rows = []
        for j in self.fleet.jobs:
            state = j.state_at(now)
            if state is not None and state != self.reported.get(j.job_key):
                rows.append(job_row(j, state, now))
                self.reported[j.job_key] = state
        if rows:
            yield Batch(key=f"demo-scheduler:{now.isoformat()}", jobs=rows)
