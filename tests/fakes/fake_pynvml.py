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

import itertools
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real
from tests.support.shared_data import SHARED_DATA

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
    # GPM (Hopper and later). None: nvmlGpmQueryDeviceSupport says no. Else the metrics of every
    # window, by GPM metric id, in NVML's units (percent, MiB/s); ids not here answer
    # NotSupported in their nvmlReturn. `gpm_windows`, when given, are successive windows
    # (replayed in order, the last one held); `gpm_mig` the windows of each MIG GPU instance
    # (an instance not there: nvmlGpmMigSampleGet answers NotSupported).
    gpm: dict[int, float] | None = None
    gpm_windows: list[dict[int, float]] = field(default_factory=list)
    gpm_mig: dict[int, dict[int, float]] = field(default_factory=dict)

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


class FakeGpmSample:
    """What nvmlGpmSampleAlloc hands out: which GPU (and instance) it sampled, and when."""

    def __init__(self) -> None:
        self.key: tuple[int, int | None] | None = None
        self.seq = 0
        self.freed = False


class FakeGpmMetricsGet:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t: the same fields, plain Python values."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(_real.NVML_GPM_METRIC_MAX)]


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
        latency_us: dict[str, float] | None = None,
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
        # Function name -> microseconds each call sleeps (a recorded latency; sleeping costs
        # wall time, not CPU, as a driver call mostly waits on the GPU).
        self.latency_us = dict(latency_us or {})
        self.c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet
        self._gpm_seq = itertools.count(1)
        self._gpm_windows_used: Counter[tuple[int, int | None]] = Counter()
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
        if self.latency_us:
            us = self.latency_us.get(fname)
            if us:
                time.sleep(us / 1e6)
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

    # ---------------------------------------------------------------- GPM

    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._check("nvmlGpmQueryDeviceSupport", handle)
        return SimpleNamespace(version=_real.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._check("nvmlGpmSampleAlloc")
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self._check("nvmlGpmSampleFree")
        if sample.freed:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        sample.freed = True

    def _gpm_sample(self, fname: str, handle: FakeHandle, gi: int | None, sample: FakeGpmSample) -> FakeGpmSample:
        gpu = self._check(fname, handle)
        if sample.freed or handle.mig is not None:
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.gpm is None or (gi is not None and gi not in gpu.gpm_mig):
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        sample.key, sample.seq = (handle.index, gi), next(self._gpm_seq)
        return sample

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        return self._gpm_sample("nvmlGpmSampleGet", handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: FakeHandle, gpu_instance_id: int, sample: FakeGpmSample) -> FakeGpmSample:
        return self._gpm_sample("nvmlGpmMigSampleGet", handle, gpu_instance_id, sample)

    def nvmlGpmMetricsGet(self, mg: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        s1, s2 = mg.sample1, mg.sample2
        if not isinstance(s1, FakeGpmSample) or not isinstance(s2, FakeGpmSample) or s1.key is None:
            self._check("nvmlGpmMetricsGet")
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._check("nvmlGpmMetricsGet", self._handles[s1.key[0]])
        if (mg.version != _real.NVML_GPM_METRICS_GET_VERSION or s1.freed or s2.freed or s1.key != s2.key
                or s2.seq <= s1.seq or not 0 < mg.numMetrics <= _real.NVML_GPM_METRIC_MAX):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        _index, gi = s1.key
        if gi is not None:
            window = gpu.gpm_mig[gi]
        elif gpu.gpm_windows:
            used = self._gpm_windows_used[s1.key]
            window = gpu.gpm_windows[min(used, len(gpu.gpm_windows) - 1)]
            self._gpm_windows_used[s1.key] += 1
        else:
            window = gpu.gpm or {}
        for m in mg.metrics[: mg.numMetrics]:
            ok = m.metricId in window
            m.nvmlReturn = _real.NVML_SUCCESS if ok else _real.NVML_ERROR_NOT_SUPPORTED
            m.value = float(window[m.metricId]) if ok else 0.0
        return mg

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


# ---------------------------------------------------------------------- the real H100 capture

CAPTURE = SHARED_DATA / "nvml-h100"
# gpm_probe.py's names -> GPM metric ids
_GPM_PROBE_IDS = {
    "SM_OCCUPANCY": _real.NVML_GPM_METRIC_SM_OCCUPANCY, "SM_UTIL": _real.NVML_GPM_METRIC_SM_UTIL,
    "ANY_TENSOR_UTIL": _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "HMMA_TENSOR_UTIL": _real.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    "GRAPHICS_UTIL": _real.NVML_GPM_METRIC_GRAPHICS_UTIL, "DRAM_BW_UTIL": _real.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "FP16_UTIL": _real.NVML_GPM_METRIC_FP16_UTIL, "FP32_UTIL": _real.NVML_GPM_METRIC_FP32_UTIL,
}
# nvml_probe.py's names -> the pynvml functions they called (the latencies' keys)
_PROBE_FUNCTIONS = {
    "GetUtilizationRates": "nvmlDeviceGetUtilizationRates", "GetEncoderUtilization": "nvmlDeviceGetEncoderUtilization",
    "GetDecoderUtilization": "nvmlDeviceGetDecoderUtilization", "GetMemoryInfo": "nvmlDeviceGetMemoryInfo",
    "GetMemoryInfo_v2": "nvmlDeviceGetMemoryInfo_v2", "GetPowerUsage": "nvmlDeviceGetPowerUsage",
    "GetTotalEnergyConsumption": "nvmlDeviceGetTotalEnergyConsumption", "GetTemperature_GPU": "nvmlDeviceGetTemperature",
    "GetClockInfo_SM": "nvmlDeviceGetClockInfo", "GetPcieReplayCounter": "nvmlDeviceGetPcieReplayCounter",
    "GetTotalEccErrors_vol_corr": "nvmlDeviceGetTotalEccErrors", "GetRemappedRows": "nvmlDeviceGetRemappedRows",
    "GetCurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "GetViolationStatus_power": "nvmlDeviceGetViolationStatus",
    "GetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses",
    "GetProcessUtilization": "nvmlDeviceGetProcessUtilization", "GetFieldValues_memtemp_energy": "nvmlDeviceGetFieldValues",
    "GetMigMode": "nvmlDeviceGetMigMode", "GetName": "nvmlDeviceGetName", "GetUUID": "nvmlDeviceGetUUID",
    "GetPciInfo": "nvmlDeviceGetPciInfo", "GetMinorNumber": "nvmlDeviceGetMinorNumber",
}


def _smi(xml: str, path: str) -> int:
    """An integer from nvidia-smi -q -x: the first <tag> under the given parents ("a/b/c")."""
    pos = 0
    for tag in path.split("/"):
        pos = xml.index(f"<{tag}>", pos)
    m = re.match(r"\s*(\d+)", xml[pos + xml[pos:].index(">") + 1:])
    assert m, path
    return int(m.group(1))


def h100_capture(*, gpus: int = 1, load: bool = True, latencies: bool = False) -> FakeNvml:
    """The H100 of ../shared/data/nvml-h100/, replayed: every value nvml_probe.py read (the rest
    from nvidia-smi -q -x of the same GPU at rest), its errors (no process: ProcessUtilization
    answers NotFound; GetMemoryInfo_v2 says used 0 beside 480 MiB reserved), and GPM windows from
    gpm_load.json (`load`) or gpm_idle.json. `latencies`: each call sleeps what it took there
    (GPM: the median of the recorded sample and metrics calls). `gpus` copies of it (UUIDs
    differ after the first) make an 8-GPU node for the exporter bench."""
    probe = json.loads((CAPTURE / "nvml_probe.json").read_text())
    xml = (CAPTURE / "nvidia-smi-q.xml").read_text()
    windows = json.loads((CAPTURE / ("gpm_load.json" if load else "gpm_idle.json")).read_text())
    v = lambda name: probe[name]["value"]  # noqa: E731
    mem = v("GetMemoryInfo_v2")
    ecc = {
        (_real.NVML_MEMORY_ERROR_TYPE_CORRECTED, _real.NVML_VOLATILE_ECC): v("GetTotalEccErrors_vol_corr"),
        (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _real.NVML_VOLATILE_ECC): _smi(xml, "ecc_errors/volatile/dram_uncorrectable"),
        (_real.NVML_MEMORY_ERROR_TYPE_CORRECTED, _real.NVML_AGGREGATE_ECC): _smi(xml, "ecc_errors/aggregate/dram_correctable"),
        (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _real.NVML_AGGREGATE_ECC): v("GetTotalEccErrors_agg_unc"),
    }
    assert probe["GetProcessUtilization"]["value"].startswith("NVMLError_NotFound")
    assert probe["GpmQueryDeviceSupport"]["value"] == 1

    def one(i: int) -> FakeGpu:
        uuid = v("GetUUID") if i == 0 else v("GetUUID")[:-2] + f"{i:02x}"
        return FakeGpu(
            uuid=uuid, name=v("GetName"), minor=v("GetMinorNumber") + i, pci_bus_id=v("GetPciInfo")["busId"],
            util=(v("GetUtilizationRates")["gpu"], v("GetUtilizationRates")["memory"]),
            enc=tuple(v("GetEncoderUtilization")), dec=tuple(v("GetDecoderUtilization")),
            memory={k: mem[k] for k in ("total", "reserved", "free", "used")},
            power_mw=v("GetPowerUsage"), energy_mj=v("GetTotalEnergyConsumption"), temp_gpu=v("GetTemperature_GPU"),
            memory_temp=_smi(xml, "temperature/memory_temp"),  # the probe kept no field value, only its repr
            sm_clock=v("GetClockInfo_SM"), mem_clock=v("GetClockInfo_MEM"), pcie_replay=v("GetPcieReplayCounter"),
            ecc=ecc, remapped_rows=tuple(v("GetRemappedRows")), clocks_event_reasons=v("GetCurrentClocksEventReasons"),
            violation_ns={_real.NVML_PERF_POLICY_POWER: v("GetViolationStatus_power")["violationTime"],
                          _real.NVML_PERF_POLICY_THERMAL: v("GetViolationStatus_thermal")["violationTime"]},
            mig_enabled=bool(v("GetMigMode")[0]), max_mig_devices=v("GetMaxMigDeviceCount"),
            gpm={}, gpm_windows=[{_GPM_PROBE_IDS[k]: x for k, x in w.items() if k in _GPM_PROBE_IDS} for w in windows],
        )

    latency = {}
    if latencies:
        latency = {fn: probe[name]["us"] for name, fn in _PROBE_FUNCTIONS.items() if "us" in probe[name]}
        for name, key in (("nvmlGpmSampleGet", "sample_get_us"), ("nvmlGpmMetricsGet", "metrics_get_us")):
            recorded = sorted(w[key] for w in json.loads((CAPTURE / "gpm_load.json").read_text())
                              + json.loads((CAPTURE / "gpm_idle.json").read_text()))
            latency[name] = recorded[len(recorded) // 2]
        latency["nvmlGpmMigSampleGet"] = latency["nvmlGpmSampleGet"]
    return FakeNvml([one(i) for i in range(gpus)], driver=probe["_driver"], latency_us=latency)
