"""Plain data passed between backends, mapping sources, the poller and the renderer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance. dcgm-exporter names it by (parent gpu, GPU_I_ID)."""

    gpu_instance_id: int
    profile: str  # e.g. "2g.20gb"
    uuid: str  # "MIG-..." as the device plugin and pod-resources report it


@dataclass(frozen=True)
class GpuIdentity:
    """What never changes while a GPU is present.

    `index` is NVML's enumeration order (dcgm-exporter's `gpu` label); `minor_number` is the N of
    /dev/nvidiaN, the device gres.conf lists. They can differ, and both differ from the GRES index
    in SLURM_JOB_GPUS (the device's position in gres.conf); the Slurm prolog translates.
    """

    index: int
    uuid: str
    model: str
    minor_number: int | None = None
    pci_bus_id: str | None = None
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"


@dataclass(frozen=True)
class GpuReading:
    """One poll of one GPU: DCGM field name -> value, only for fields the GPU supports.

    `instance_fields` holds per-MIG-instance values (framebuffer, engine activity) keyed by
    GPU instance id; device-level values live in `fields`.
    """

    fields: dict[str, float]
    instance_fields: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU. Unknown values are None, never 0."""

    pid: int
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None
    sm_utilization: float | None = None  # percent, from NVML per-process utilization


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int
    timestamp: float


@dataclass(frozen=True)
class SourceHealth:
    """How an optional part of a backend did over one poll (see Backend.health)."""

    success: bool
    duration_seconds: float
    problems: dict[str, int]  # reason -> count since the exporter started


class BackendUnavailable(Exception):
    """The whole backend cannot be used (NVML missing, driver not loaded)."""


class GpuError(Exception):
    """One GPU failed to answer. `reason` is a short machine-readable word for the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
