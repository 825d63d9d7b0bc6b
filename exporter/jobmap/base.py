"""The interface of a job-mapping source and the binding it produces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from gpufleet.exporter.model import GpuIdentity, GpuProcess


@dataclass(frozen=True)
class JobBinding:
    """One job (or pod) holding one GPU or MIG instance.

    A source names the GPU the way it knows it: by NVML index (Slurm mapping files), by GPU
    or MIG UUID (kubelet), or by the GPU a process runs on (cgroups). The poller resolves
    every binding to a GpuIdentity before publishing.
    """

    scheduler: str  # "slurm" | "kubernetes"
    source: str  # the mapping source's name
    job_id: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    gpu_index: int | None = None
    gpu_uuid: str | None = None  # "GPU-..." or "MIG-..."
    gpu_instance_id: int | None = None
    pid: int | None = None  # set by process-based sources


class MappingError(Exception):
    """A mapping source could not be read at all (its metric goes to 0, the GPUs still flow)."""


class MappingSource(Protocol):
    """Reads who holds which GPU. Raises MappingError (or any exception) on failure.

    `problems` lists what was skipped during the last collect (junk lines, bad names) so the
    poller can count and log it without failing the source.
    """

    name: str

    def collect(
        self,
        gpus: Sequence[GpuIdentity],
        processes: Mapping[int, Sequence[GpuProcess]],
    ) -> list[JobBinding]: ...

    @property
    def problems(self) -> list[str]: ...
