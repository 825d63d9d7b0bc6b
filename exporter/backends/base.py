"""The one small interface every GPU backend implements; everything above it is shared."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from gpufleet.exporter.model import GpuIdentity, GpuProcess, GpuReading, SourceHealth, XidEvent


class Backend(Protocol):
    """A source of GPU telemetry.

    `open` raises BackendUnavailable when the backend cannot be used at all (the poller
    retries); `read` and `processes` raise GpuError for one GPU without affecting the others.
    A field the GPU does not support is left out of the reading, never reported as zero.
    """

    name: str

    def open(self) -> None: ...

    def driver_version(self) -> str: ...

    def devices(self) -> Sequence[GpuIdentity]: ...

    def read(self, gpu: GpuIdentity) -> GpuReading: ...

    def processes(self, gpu: GpuIdentity) -> Sequence[GpuProcess]: ...

    def xid_events(self) -> Sequence[XidEvent]:
        """XID events since the last call; never blocks."""
        ...

    def health(self) -> Mapping[str, SourceHealth]:
        """Health of the backend's optional sources (e.g. "nvml_gpm") over the poll since the
        last call, by collector name; the poller publishes it with the other sources'."""
        ...

    def close(self) -> None: ...
