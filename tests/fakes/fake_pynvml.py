"""A configurable stand-in for the `pynvml` module, for testing the NVML backend without a GPU.

It raises the *real* pynvml error classes the real way (`NVMLError(code)` maps to the
`NVMLError_*` subclass) and exposes the real constants, so the backend cannot tell the
difference. Handles are plain objects; MIG handles are distinct objects tied to their parent.

Usage:
    gpu = FakeGpu(uuid="GPU-...", name="NVIDIA H100 80GB HBM3", ...)
    nv = FakeNvml([gpu])
    backend = NvmlBackend(nvml=nv)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

MIB = 1 << 20
GIB = 1 << 30


@dataclass
class FakeMig:
    """One MIG device (a compute instance inside GPU instance `gi_id`)."""

    gi_id: int
    uuid: str
    name: str  # e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    memory: dict[str, int] = field(default_factory=dict)  # total/free/used/reserved bytes
    slot: int | None = None  # index for nvmlDeviceGetMigDeviceHandleByIndex; default: list order


@dataclass
class FakeGpu:
    """One fake GPU. Values are what NVML would return, in NVML's units."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    minor: int = 0
    pci_bus_id: str = "00000000:37:00.0"
    util: tuple[int, int] = (87, 41)  # (gpu %, memory %)
    enc: tuple[int, int] = (3, 167000)  # (util %, sampling period us)
    dec: tuple[int, int] = (5, 167000)
    memory: dict[str, int] = field(
        default_factory=lambda: {"total": 80 * GIB, "reserved": 512 * MIB, "free": 60 * GIB, "used": 20 * GIB - 512 * MIB}
    )
    power_mw: int = 68244
    energy_mj: int = 123456789
    temp_gpu: int = 41
    memory_temp: int = 38
    sm_clock: int = 1980
    mem_clock: int = 2619
    pcie_replay: int = 2
    ecc: dict[tuple[int, int], int] = field(
        default_factory=lambda: {
            (_real.NVML_MEMORY_ERROR_TYPE_CORRECTED, _real.NVML_VOLATILE_ECC): 1,
            (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _real.NVML_VOLATILE_ECC): 0,
            (_real.NVML_MEMORY_ERROR_TYPE_CORRECTED, _real.NVML_AGGREGATE_ECC): 17,
            (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _real.NVML_AGGREGATE_ECC): 3,
        }
    )
    remapped_rows: tuple[int, int, int, int] = (4, 1, 0, 0)  # corr, unc, pending, failure
    clocks_event_reasons: int = 0x4  # SW power cap
    violation_ns: dict[int, int] = field(
        default_factory=lambda: {_real.NVML_PERF_POLICY_POWER: 5_000_000, _real.NVML_PERF_POLICY_THERMAL: 7_000}
    )
    # Functions that answer NotSupported on this GPU (by pynvml function name).
    unsupported: set[str] = field(default_factory=set)
    # Any other NVML error code to raise from a function: {function name: NVML_ERROR_*}.
    errors: dict[str, int] = field(default_factory=dict)
    # nvmlDeviceGetFieldValues: field id -> value; ids not here answer NotSupported in nvmlReturn.
    field_values: dict[int, int] | None = None
    mig_enabled: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    max_mig_devices: int = 7
    processes: list[Any] = field(default_factory=list)  # SimpleNamespace(pid, usedGpuMemory, ...)
    proc_samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timeStamp us, smUtil)
    lost: bool = False
    xid_supported: bool = True

    def __post_init__(self) -> None:
        if self.field_values is None:
            self.field_values = {_real.NVML_FI_DEV_MEMORY_TEMP: self.memory_temp}


class FakeHandle:
    """Opaque device handle; `mig` is set for MIG device handles."""

    def __init__(self, index: int, mig: FakeMig | None = None):
        self.index = index
        self.mig = mig

    def __repr__(self) -> str:
        return f"FakeHandle({self.index}{', mig gi=%d' % self.mig.gi_id if self.mig else ''})"


def _err(code: int) -> Exception:
    return _real.NVMLError(code)  # the real class maps the code to NVMLError_<Name>


class FakeNvml:
    """An object standing in for the `pynvml` module.

    Knobs: `gpus`, `init_error` (NVML code raised by nvmlInit, e.g. NVML_ERROR_LIBRARY_NOT_FOUND),
    `driver`, `bytes_strings` (old pynvml returned bytes), `hidden` (function names an old
    pynvml does not have: AttributeError), `pending_xids` [(gpu index, xid)], `calls` (Counter of
    (function, gpu index) for asserting what was asked).
    """

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        driver: str = "550.90.07",
        bytes_strings: bool = False,
        hidden: set[str] | None = None,
    ):
        # Copy the real error classes and constants, so `isinstance(e, nv.NVMLError_GpuIsLost)`
        # and `nv.NVML_CLOCK_SM` behave exactly as with pynvml.
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")) or name == "nvmlMemory_v2":
                object.__setattr__(self, name, getattr(_real, name))
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver = driver
        self.bytes_strings = bytes_strings
        self.hidden = set(hidden or ())
        self.pending_xids: list[tuple[int, int]] = []
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.initialized = False
        self.shutdown_count = 0
        self.event_sets_freed = 0
        self._handles = [FakeHandle(i) for i in range(len(self.gpus))]
        self._mig_handles: dict[tuple[int, int], FakeHandle] = {}
        self._registered: set[int] = set()

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "hidden"):
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
        return object.__getattribute__(self, name)

    # ---------------------------------------------------------------- helpers

    def _s(self, text: str) -> Any:
        return text.encode() if self.bytes_strings else text

    def _check(self, fname: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        """Common checks: initialised, GPU not lost, per-function errors; returns the GPU."""
        self.calls[(fname, handle.index if handle is not None else None)] += 1
        if not self.initialized:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        if fname in gpu.errors:
            raise _err(gpu.errors[fname])
        if fname in gpu.unsupported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # ---------------------------------------------------------------- init / system

    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialized = False
        self.shutdown_count += 1

    def nvmlSystemGetDriverVersion(self) -> Any:
        self._check("nvmlSystemGetDriverVersion")
        return self._s(self.driver)

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetIndex", handle)
        return handle.index

    # ---------------------------------------------------------------- identity

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> Any:
        gpu = self._check("nvmlDeviceGetUUID", handle)
        return self._s(handle.mig.uuid if handle.mig else gpu.uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> Any:
        gpu = self._check("nvmlDeviceGetName", handle)
        return self._s(handle.mig.name if handle.mig else gpu.name)

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._check("nvmlDeviceGetPciInfo", handle)
        # The real struct's char arrays are bytes; newer pynvml decodes some of them.
        bus = gpu.pci_bus_id.encode() if self.bytes_strings else gpu.pci_bus_id
        return SimpleNamespace(busId=bus, busIdLegacy=bus[-12:], domain=0, bus=0, device=0, pciDeviceId=0)

    # ---------------------------------------------------------------- MIG

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        gpu = self._check("nvmlDeviceGetMigMode", handle)
        mode = _real.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else _real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetMaxMigDeviceCount", handle).max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        gpu = self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not gpu.mig_enabled or index >= gpu.max_mig_devices:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        for pos, mig in enumerate(gpu.migs):
            if (mig.slot if mig.slot is not None else pos) == index:
                key = (handle.index, index)
                if key not in self._mig_handles or self._mig_handles[key].mig is not mig:
                    self._mig_handles[key] = FakeHandle(handle.index, mig)
                return self._mig_handles[key]
        raise _err(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gi_id

    # ---------------------------------------------------------------- telemetry

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._check("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_enabled:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1])

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeHandle) -> list[int]:
        return list(self._check("nvmlDeviceGetEncoderUtilization", handle).enc)

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeHandle) -> list[int]:
        return list(self._check("nvmlDeviceGetDecoderUtilization", handle).dec)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> SimpleNamespace:
        fname = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        gpu = self._check(fname, handle)
        mem = handle.mig.memory if handle.mig else gpu.memory
        if version:
            if version != _real.nvmlMemory_v2:
                raise _err(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return SimpleNamespace(version=version, total=mem["total"], reserved=mem.get("reserved", 0),
                                   free=mem["free"], used=mem["used"])
        # v1 counts reserved memory as used.
        return SimpleNamespace(total=mem["total"], free=mem["free"], used=mem["used"] + mem.get("reserved", 0))

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._check("nvmlDeviceGetTemperature", handle)
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_gpu

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._check("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in field_ids:
            ok = fid in gpu.field_values
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=0,
                    timestamp=0,
                    latencyUsec=0,
                    valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlReturn=_real.NVML_SUCCESS if ok else _real.NVML_ERROR_NOT_SUPPORTED,
                    value=SimpleNamespace(uiVal=gpu.field_values.get(fid, 0), ullVal=0, dVal=0.0,
                                          ulVal=0, sllVal=0, siVal=0, usVal=0),
                )
            )
        return out

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._check("nvmlDeviceGetClockInfo", handle)
        if clock_type == _real.NVML_CLOCK_SM:
            return gpu.sm_clock
        if clock_type == _real.NVML_CLOCK_MEM:
            return gpu.mem_clock
        raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        gpu = self._check("nvmlDeviceGetTotalEccErrors", handle)
        return gpu.ecc[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        return tuple(self._check("nvmlDeviceGetRemappedRows", handle).remapped_rows)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_event_reasons

    def nvmlDeviceGetViolationStatus(self, handle: FakeHandle, policy: int) -> SimpleNamespace:
        gpu = self._check("nvmlDeviceGetViolationStatus", handle)
        return SimpleNamespace(referenceTime=1_700_000_000_000_000, violationTime=gpu.violation_ns[policy])

    # ---------------------------------------------------------------- processes

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return list(gpu.processes)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timestamp: int) -> list[SimpleNamespace]:
        gpu = self._check("nvmlDeviceGetProcessUtilization", handle)
        samples = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in gpu.proc_samples
            if ts > timestamp
        ]
        if not samples:
            raise _err(_real.NVML_ERROR_NOT_FOUND)
        return samples

    # ---------------------------------------------------------------- events

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        return SimpleNamespace(kind="fake-event-set")

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: object) -> None:
        gpu = self._check("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_supported:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if event_types & _real.nvmlEventTypeXidCriticalError:
            self._registered.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait_v2")
        while self.pending_xids:
            index, xid = self.pending_xids.pop(0)
            if index in self._registered:
                return SimpleNamespace(
                    device=self._handles[index],
                    eventType=_real.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise _err(_real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")
        self.event_sets_freed += 1


def process(pid: int, used: int | None, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> SimpleNamespace:
    """A process entry shaped like pynvml's friendly c_nvmlProcessInfo_v3_t object."""
    return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)
