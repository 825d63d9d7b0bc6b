"""Build small stores by hand for golden tests: GPU sample series, jobs and allocations.

Everything goes through the real StoreWriter, so tests read the store the way dashboards do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable

import pyarrow as pa

from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader


@dataclass
class Fleet:
    root: object
    cluster: str = "c1"
    _samples: list[dict] = field(default_factory=list)
    _gpus: list[dict] = field(default_factory=list)
    _jobs: list[dict] = field(default_factory=list)
    _allocs: list[dict] = field(default_factory=list)

    def gpu_series(self, host: str, uuid: str, start: datetime, end: datetime, *, step: int = 15,
                   util: Callable[[datetime], float | None] | float | None = 0.0, procs: Callable[[datetime], float | None] | float | None = None,
                   model: str = "NVIDIA H100 80GB HBM3", gpu: int = 0, gi: int | None = None, mig_profile: str | None = None,
                   tensor: Callable[[datetime], float | None] | float | None = None, sm_clock: float | None = None, fb_used: float | None = None,
                   health: Callable[[datetime], dict] | None = None) -> None:
        """Samples every `step` s in [start, end); util/procs/tensor may be functions of time;
        `health`: more sample columns at a time (xid_last, gpu_up, ...)."""
        val = lambda f, t: f(t) if callable(f) else f  # noqa: E731
        t = start
        while t < end:
            self._samples.append(dict(ts=t, cluster=self.cluster, host=host, gpu=gpu, gpu_uuid=uuid, gpu_instance=gi, mig_profile=mig_profile,
                                      model=model, source="scrape", gpu_util=val(util, t) if gi is None else None,
                                      gr_engine_active=(val(util, t) / 100 if val(util, t) is not None else None) if gi is not None else None,
                                      compute_processes=val(procs, t), tensor_active=val(tensor, t), sm_clock_mhz=sm_clock, fb_used_mib=fb_used,
                                      **(health(t) if health else {})))
            t += timedelta(seconds=step)
        self._gpus.append(dict(ts=start, cluster=self.cluster, host=host, gpu_uuid=uuid, gpu_instance=-1 if gi is None else gi, gpu=gpu,
                               mig_profile=mig_profile, model=model, fb_total_mib=None, driver_version=None))
        self._gpus.append(dict(self._gpus[-1], ts=t - timedelta(seconds=step)))

    def job(self, job_key: str, *, account: str, user: str, start: datetime | None, end: datetime | None, gpus: int,
            placements: list[tuple[str, str]] | list[tuple[str, str, int]], job_id: str | None = None, scheduler: str = "slurm",
            partition: str = "gpu", submit: datetime | None = None, state: str | None = None, name: str = "job",
            gpu_type: str | None = None, held_from: datetime | None = None, **accounting) -> None:
        """A job and its allocations (the job map saw them from `held_from`, default `start`, to its end); `accounting`: more
        job columns (state_raw, exit_code, ...)."""
        if start is None and placements:
            raise ValueError("a job that has not started holds no GPUs: give no placements")
        row = {c: None for c in schema.JOB_COLUMNS}
        row.update(cluster=self.cluster, scheduler=scheduler, job_key=job_key, job_id=job_id or job_key, name=name, user_name=user,
                   account=account, partition=partition, submit=submit or start, start=start, end=end,
                   state=state or ("PENDING" if start is None else "RUNNING" if end is None else "COMPLETED"),
                   gpus=gpus, gpu_type=gpu_type, source="test", updated_at=start or submit, **accounting)
        self._jobs.append(row)
        for place in placements:
            host, uuid, gi = (place + (-1,))[:3] if len(place) == 2 else place
            self._allocs.append(dict(ts=held_from or start, cluster=self.cluster, scheduler=scheduler, job_key=job_key, host=host, gpu_uuid=uuid,
                                     gpu_instance=gi, gpu=None, source="exporter"))
            self._allocs.append(dict(self._allocs[-1], ts=end or start))

    def batch(self, key: str = "fleet") -> Batch:
        """Everything added so far as one batch, as a collector would commit it."""
        cols = {f.name: [r.get(f.name) for r in self._samples] for f in schema.SAMPLE_SCHEMA}
        return Batch(key=key, samples=pa.Table.from_pydict(cols, schema=schema.SAMPLE_SCHEMA) if self._samples else None,
                     jobs=self._jobs, allocations=self._allocs, gpus=self._gpus)

    def write(self) -> None:
        w = StoreWriter(self.root)
        w.commit(self.batch())
        w.publish()
        w.close()

    def reader(self):
        return open_reader(self.root)
