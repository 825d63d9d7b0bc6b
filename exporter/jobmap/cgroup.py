"""Process-based job mapping: NVML process -> /proc/<pid>/cgroup -> Slurm job id.

The fallback when no prolog writes mapping files, and the way to find a process running on a
GPU its job does not own. Slurm puts every task in a cgroup whose path names the job:

    cgroup v1: 7:devices:/slurm/uid_1000/job_123/step_0/task_0
    cgroup v2: 0::/system.slice/slurmstepd.scope/job_123/step_batch/user/task_0
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

from gpufleet.exporter.jobmap.base import JobBinding
from gpufleet.exporter.model import GpuIdentity, GpuProcess

_JOB_IN_PATH = re.compile(r"/job_(\d+)(?:/|$)")


def job_from_cgroup(text: str) -> str | None:
    """The Slurm job id named by a /proc/<pid>/cgroup file, or None for a non-Slurm process."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        m = _JOB_IN_PATH.search(parts[2])
        if m:
            return m.group(1)
    return None


class CgroupProcessSource:
    name = "cgroup"

    def __init__(self, proc_root: str | Path = "/proc"):
        self.proc_root = Path(proc_root)
        self._problems: list[str] = []

    @property
    def problems(self) -> list[str]:
        return self._problems

    def collect(
        self,
        gpus: Sequence[GpuIdentity],
        processes: Mapping[int, Sequence[GpuProcess]],
    ) -> list[JobBinding]:
        self._problems = []
        bindings = []
        for gpu in gpus:
            for proc in processes.get(gpu.index, ()):
                try:
                    text = (self.proc_root / str(proc.pid) / "cgroup").read_text(errors="replace")
                except FileNotFoundError:
                    continue  # the process ended between NVML's list and now
                except OSError as e:
                    self._problems.append(f"pid {proc.pid}: cannot read cgroup: {e}")
                    continue
                job = job_from_cgroup(text)
                if job:
                    bindings.append(
                        JobBinding(
                            scheduler="slurm",
                            source=self.name,
                            job_id=job,
                            gpu_index=gpu.index,
                            gpu_instance_id=proc.gpu_instance_id,
                            pid=proc.pid,
                        )
                    )
        return bindings
