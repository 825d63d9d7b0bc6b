"""NVML backend: reads real GPUs through nvidia-ml-py (`pynvml`) and names everything the DCGM way.

Why NVML and not DCGM: NVML ships with every driver, so a bare-metal Slurm node needs nothing but
`nvidia-ml-py` to publish the same series as a Kubernetes node running dcgm-exporter.

Design points:
- `pynvml` is imported lazily in `open()` so importing this module never needs a driver, and tests
  can inject a fake module (`NvmlBackend(nvml=fake)`).
- What each DCGM field reads (NVML call, unit conversion) is declared once, in `_field_readers`; the
  catalogue loop in `fields.read_fields` fills the reading, so a field has no hand-written block.
- Every field is read in its own guarded call: one unsupported counter never hides the others,
  and an unsupported field is *absent*, never 0. Calls that answered NotSupported /
  FunctionNotFound (or that an old pynvml lacks) are remembered per GPU and not repeated, so a
  poll costs only the calls that can succeed.
- Errors that mean "this GPU is unusable" (lost, reset required, ...) become `GpuError` for that
  GPU only; the caller keeps polling the others.
- DCGM's profiling fields (DCGM_FI_PROF_*) come from GPM on GPUs that have it (Hopper and
  later), one sample per poll (`gpm.py`); GPM problems never fail a reading, they show in
  `health()` under the collector name "nvml_gpm".
"""

from __future__ import annotations

import ctypes
import logging
import re
import time
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Sequence

from gpufleet.exporter.backends.gpm import COLLECTOR as GPM_COLLECTOR
from gpufleet.exporter.backends.gpm import GpmReader
from gpufleet.exporter.fields import Plan, Readers, Source, plan, read_fields
from gpufleet.exporter.model import (
    BackendUnavailable,
    GpuError,
    GpuIdentity,
    GpuProcess,
    GpuReading,
    MigInstance,
    SourceHealth,
    XidEvent,
)

log = logging.getLogger(__name__)

# NVML return codes (part of NVML's stable C ABI; spelled out here so an old pynvml that lacks a
# constant still classifies correctly).
_SUCCESS = 0
_ERR_UNINITIALIZED = 1
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_TIMEOUT = 10
_ERR_IRQ_ISSUE = 11
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_LIB_RM_VERSION_MISMATCH = 18
_ERR_ARGUMENT_VERSION_MISMATCH = 25
_ERR_GPU_NOT_FOUND = 28
_ERR_UNKNOWN = 999

# Errors after which the GPU cannot answer anything: report the GPU as failed (reason word is the
# `GpuError.reason`, used as a metric label).
_FATAL_REASONS = {
    _ERR_GPU_IS_LOST: "gpu_lost",
    _ERR_GPU_NOT_FOUND: "gpu_not_found",
    _ERR_RESET_REQUIRED: "reset_required",
    _ERR_IRQ_ISSUE: "irq_issue",
    _ERR_DRIVER_NOT_LOADED: "driver_not_loaded",
    _ERR_UNINITIALIZED: "nvml_uninitialized",
    _ERR_UNKNOWN: "unknown_error",
}
# Errors that will answer the same way on every poll: stop asking.
_PERMANENT_ABSENT = {_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND}

_MIB = 1 << 20
_NOT_AVAILABLE_U64 = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong
_NOT_AVAILABLE_U32 = 0xFFFFFFFF  # "no GPU instance" in process info
_MAX_XID_DRAIN = 10_000  # safety bound for one xid_events() call

_MIG_PROFILE_RE = re.compile(r"\bMIG\s+(?:\d+c\.)?(\d+g\.\d+gb\S*)", re.IGNORECASE)


def _text(value: Any) -> str:
    """pynvml returns bytes before 11.5 and str after; callers want str."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return str(value).strip().rstrip("\x00")


def normalize_pci_bus_id(bus_id: Any) -> str:
    """NVML bus id -> dcgm-exporter's `pci_bus_id` form, e.g. "00000000:37:00.0".

    NVML may give a 4-digit (legacy) or 8-digit domain and either hex case; dcgm-exporter
    prints the 8-digit domain in upper case, and series from both exporters must match.
    """
    text = _text(bus_id)
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, devfn = parts
        if domain and all(c in "0123456789abcdefABCDEF" for c in domain):
            domain = domain.rjust(8, "0")[-8:]
        return f"{domain}:{bus}:{devfn}".upper()
    if len(parts) == 2:  # no domain at all
        return f"00000000:{text}".upper()
    return text.upper()


def mig_profile_from_name(name: Any) -> str:
    """"NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb" (GPU_I_PROFILE).

    A compute instance smaller than its GPU instance is named "MIG 1c.2g.10gb"; the GPU
    instance profile (what dcgm-exporter labels) is the part after "1c.".
    """
    text = _text(name)
    m = _MIG_PROFILE_RE.search(text)
    if m:
        return m.group(1)
    idx = text.upper().rfind("MIG ")
    return text[idx + 4 :].strip() if idx >= 0 else text


def _handle_key(handle: Any) -> Any:
    """A hashable key for an NVML device handle.

    Real handles are ctypes pointers, which compare by Python identity, not by address; the
    handle in an event is a new object, so compare addresses.
    """
    if isinstance(handle, ctypes._Pointer):  # type: ignore[attr-defined]
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class _Memory(NamedTuple):
    """Framebuffer sizes in MiB, floored as DCGM does; `reserved` is None from the v1 call."""

    total: int
    free: int
    used: int
    reserved: int | None


@dataclass
class _GpuState:
    """What the backend remembers about one GPU index between polls."""

    handle: Any = None
    static: tuple[str, str, int | None, str | None] | None = None  # uuid, model, minor, pci
    mig_enabled: bool = False
    mig_handles: dict[int, Any] = field(default_factory=dict)  # GPU instance id -> handle
    unsupported: set[str] = field(default_factory=set)
    logged: set[tuple[str, int]] = field(default_factory=set)
    proc_util_ts: int = 0
    xid_registered: bool = False
    last_xid: int = 0


class NvmlBackend:
    """Backend over NVML. See the module docstring for why it is shaped this way."""

    name = "nvml"

    def __init__(self, nvml: Any = None):
        self._nv = nvml
        self._open = False
        self._gpus: dict[int, _GpuState] = {}
        self._handle_index: dict[Any, int] = {}
        self._event_set: Any = None
        self._driver_version: str | None = None
        self._identities: dict[int, GpuIdentity] = {}
        self._plans: _Plans | None = None
        self._gpm: GpmReader | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Initialise NVML; BackendUnavailable (with what to check) when it cannot be used."""
        if self._open:
            return
        if self._nv is None:
            try:
                import pynvml  # noqa: PLC0415 - lazy on purpose: no driver needed at import
            except ImportError as e:
                raise BackendUnavailable(
                    f"Python module pynvml not importable ({e}): install the nvidia-ml-py package"
                ) from e
            self._nv = pynvml
        nv = self._nv
        try:
            nv.nvmlInit()
        except Exception as e:  # NVMLError, or NVMLLibraryMismatchError from the bindings
            raise BackendUnavailable(self._init_failure_message(e)) from e
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as e:
            self._safe(nv, "nvmlShutdown")
            raise BackendUnavailable(
                f"NVML initialised but nvmlDeviceGetCount failed ({e}): expected the NVIDIA "
                "driver to enumerate GPUs; check `nvidia-smi`"
            ) from e
        self._open = True
        self._driver_version = None
        self._plans = _Plans.of(self)
        self._gpm = GpmReader(nv)
        self._gpus = {i: _GpuState() for i in range(count)}
        self._handle_index = {}
        for i in range(count):
            try:
                self._handle(i)
            except GpuError as e:
                log.warning("GPU %d: no NVML handle at open: %s", i, e)
        self._setup_xid_events()
        log.info("NVML backend open: %d GPU(s), driver %s", count, self.driver_version() or "?")

    @staticmethod
    def _init_failure_message(e: Exception) -> str:
        code = getattr(e, "value", None)
        if code == _ERR_LIBRARY_NOT_FOUND:
            return (
                "NVML library not found (libnvidia-ml.so.1): is the NVIDIA driver installed? "
                "In a container, the NVIDIA container toolkit must mount the driver libraries."
            )
        if code == _ERR_DRIVER_NOT_LOADED:
            return (
                "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded): expected the nvidia "
                "kernel module to be loaded; check `lsmod | grep nvidia` and `nvidia-smi`."
            )
        if code == _ERR_NO_PERMISSION:
            return (
                "no permission to use NVML (nvmlInit: Insufficient Permissions): the exporter "
                "needs read/write access to /dev/nvidiactl and /dev/nvidia*."
            )
        if code == _ERR_LIB_RM_VERSION_MISMATCH:
            return (
                "NVML library and kernel driver versions differ (nvmlInit: RM version mismatch): "
                "expected matching versions; reload the nvidia module or reboot after a driver upgrade."
            )
        return f"nvmlInit failed ({type(e).__name__}: {e}): expected a working NVIDIA driver; check `nvidia-smi`."

    def close(self) -> None:
        """Free the event set and shut NVML down; errors are irrelevant at this point."""
        nv = self._nv
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None
        if nv is not None and self._event_set is not None:
            self._safe(nv, "nvmlEventSetFree", self._event_set)
        self._event_set = None
        if nv is not None and self._open:
            self._safe(nv, "nvmlShutdown")
        self._open = False
        self._gpus = {}
        self._handle_index = {}
        self._identities = {}
        self._driver_version = None

    @staticmethod
    def _safe(nv: Any, fname: str, *args: Any) -> None:
        try:
            getattr(nv, fname)(*args)
        except Exception as e:  # noqa: BLE001 - cleanup must not fail
            log.debug("ignored during close: %s", e)

    def driver_version(self) -> str:
        """The driver version string ("" when NVML will not say); cached: it cannot change."""
        if self._driver_version is None:
            if not self._open:
                return ""
            try:
                self._driver_version = _text(self._nv.nvmlSystemGetDriverVersion())
            except Exception as e:  # noqa: BLE001
                log.warning("nvmlSystemGetDriverVersion failed: %s", e)
                return ""
        return self._driver_version

    # ------------------------------------------------------------------ errors

    def _is_nvml_error(self, e: BaseException) -> bool:
        cls = getattr(self._nv, "NVMLError", None)
        return cls is not None and isinstance(e, cls)

    def _gpu_error(self, index: int, what: str, e: BaseException) -> GpuError | None:
        """The GpuError for an error that makes the GPU unusable, else None."""
        reason = _FATAL_REASONS.get(getattr(e, "value", None))
        if reason is None:
            return None
        return GpuError(reason, f"GPU {index}: {what} failed: {e}")

    def _state(self, index: int) -> _GpuState:
        st = self._gpus.get(index)
        if st is None:
            st = self._gpus[index] = _GpuState()
        return st

    def _handle(self, index: int) -> Any:
        """The NVML handle for a GPU index, looked up once (handles are stable while NVML is up)."""
        st = self._state(index)
        if st.handle is None:
            if not self._open:
                raise GpuError("nvml_uninitialized", f"GPU {index}: NVML backend is not open")
            try:
                st.handle = self._nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                raise self._gpu_error(index, "nvmlDeviceGetHandleByIndex", e) or GpuError(
                    "no_handle", f"GPU {index}: nvmlDeviceGetHandleByIndex failed: {e}"
                ) from e
            self._handle_index[_handle_key(st.handle)] = index
        return st.handle

    def _probe(self, index: int, st: _GpuState, key: str, fname: str, *args: Any, **kwargs: Any) -> Any:
        """Call one NVML function for one field; None when the GPU has no value for it.

        NotSupported / FunctionNotFound / missing in this pynvml: absent and never asked again.
        Lost-GPU class errors: GpuError. Anything else (NoPermission, NotFound, ...): absent
        this poll only.
        """
        if key in st.unsupported:
            return None
        fn = getattr(self._nv, fname, None)
        if fn is None:
            st.unsupported.add(key)
            log.debug("GPU %d: pynvml has no %s; field left out", index, fname)
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not self._is_nvml_error(e):
                raise
            return self._absent_or_raise(index, st, key, fname, e)

    def _absent_or_raise(self, index: int, st: _GpuState, key: str, what: str, e: BaseException) -> None:
        err = self._gpu_error(index, what, e)
        if err is not None:
            raise err from e
        code = getattr(e, "value", None)
        if code in _PERMANENT_ABSENT:
            st.unsupported.add(key)
            log.debug("GPU %d: %s not supported (%s); not asking again", index, key, e)
        elif (key, code) not in st.logged:
            st.logged.add((key, code))
            log.info("GPU %d: %s unavailable (%s); field left out", index, key, e)
        return None

    # ------------------------------------------------------------------ devices

    def devices(self) -> Sequence[GpuIdentity]:
        """Every GPU NVML enumerates. Static identity is read once; MIG layout on every call.

        A GPU that fails after it was first seen keeps its last identity, so `read` can report
        its error instead of the GPU silently disappearing.
        """
        out: list[GpuIdentity] = []
        for index in sorted(self._gpus):
            try:
                ident = self._identity(index)
            except GpuError as e:
                ident = self._identities.get(index)
                if ident is None:
                    log.warning("GPU %d: cannot read identity, skipped: %s", index, e)
                    continue
                log.debug("GPU %d: identity refresh failed (%s); keeping the last one", index, e)
            self._identities[index] = ident
            out.append(ident)
        return out

    def _identity(self, index: int) -> GpuIdentity:
        nv = self._nv
        st = self._state(index)
        h = self._handle(index)
        if st.static is None:
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                model = _text(nv.nvmlDeviceGetName(h))
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                raise self._gpu_error(index, "nvmlDeviceGetUUID/Name", e) or GpuError(
                    "no_identity", f"GPU {index}: cannot read UUID/name: {e}"
                ) from e
            minor = self._probe(index, st, "minor", "nvmlDeviceGetMinorNumber", h)
            pci = self._probe(index, st, "pci", "nvmlDeviceGetPciInfo", h)
            bus_id = None
            if pci is not None:
                raw = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
                bus_id = normalize_pci_bus_id(raw) if raw else None
            st.static = (uuid, model, None if minor is None else int(minor), bus_id)
        uuid, model, minor, bus_id = st.static
        return GpuIdentity(
            index=index,
            uuid=uuid,
            model=model,
            minor_number=minor,
            pci_bus_id=bus_id,
            mig_instances=self._mig_instances(index, st, h),
        )

    def _mig_instances(self, index: int, st: _GpuState, h: Any) -> tuple[MigInstance, ...]:
        nv = self._nv
        mode = self._probe(index, st, "mig_mode", "nvmlDeviceGetMigMode", h)
        enabled = mode is not None and int(mode[0]) == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        if enabled != st.mig_enabled:
            # MIG toggles need a GPU reset; what the GPU supports may have changed with it.
            st.unsupported.clear()
            st.mig_enabled = enabled
        if not enabled:
            st.mig_handles = {}
            return ()
        count = self._probe(index, st, "mig_count", "nvmlDeviceGetMaxMigDeviceCount", h)
        if count is None:
            return ()
        instances: list[MigInstance] = []
        handles: dict[int, Any] = {}
        for slot in range(int(count)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                if getattr(e, "value", None) in (_ERR_NOT_FOUND, _ERR_INVALID_ARGUMENT):
                    continue  # empty slot
                raise self._gpu_error(index, "nvmlDeviceGetMigDeviceHandleByIndex", e) or GpuError(
                    "mig_enumeration", f"GPU {index}: MIG slot {slot}: {e}"
                ) from e
            try:
                gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
                mig_uuid = _text(nv.nvmlDeviceGetUUID(mh))
                profile = mig_profile_from_name(nv.nvmlDeviceGetName(mh))
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                err = self._gpu_error(index, "MIG device query", e)
                if err is not None:
                    raise err from e
                log.info("GPU %d: MIG slot %d unreadable (%s); skipped", index, slot, e)
                continue
            if gi in handles:
                # Several compute instances in one GPU instance: dcgm-exporter names rows by
                # GPU instance, so the first compute instance stands for it.
                log.debug("GPU %d: GPU instance %d has several compute instances", index, gi)
                continue
            handles[gi] = mh
            instances.append(MigInstance(gpu_instance_id=gi, profile=profile, uuid=mig_uuid))
        st.mig_handles = handles
        instances.sort(key=lambda m: m.gpu_instance_id)
        return tuple(instances)

    # ------------------------------------------------------------------ read

    def read(self, gpu: GpuIdentity) -> GpuReading:
        """One poll of one GPU in DCGM names and dcgm-exporter units (see `_field_readers`)."""
        index = gpu.index
        h = self._handle(index)
        st = self._state(index)
        plans = self._plans
        gpm = self._gpm if self._gpm is not None and self._gpm.supported(index, h) else None
        if not (st.mig_enabled or gpu.mig_instances):
            fields = read_fields(plans.whole_gpu, index, st, h, "")
            if gpm is not None:
                fields.update(gpm.read((index, None), lambda sample: self._nv.nvmlGpmSampleGet(h, sample)))
                gpm.keep_only(index, {(index, None)})  # MIG instances that went with MIG mode
            return GpuReading(fields=fields)
        fields = read_fields(plans.mig_gpu, index, st, h, "")
        instance_fields: dict[int, dict[str, float]] = {}
        for inst in gpu.mig_instances:
            gi = inst.gpu_instance_id
            mh = st.mig_handles.get(gi)
            if mh is None:
                continue
            mf = read_fields(plans.mig_instance, index, st, mh, f"mig{gi}:")
            if gpm is not None:  # GPM samples a MIG instance through its parent's handle
                mf.update(gpm.read((index, gi), lambda sample, gi=gi: self._nv.nvmlGpmMigSampleGet(h, gi, sample)))
            if mf:
                instance_fields[gi] = mf
        if gpm is not None:
            gpm.keep_only(index, {(index, m.gpu_instance_id) for m in gpu.mig_instances})
        return GpuReading(fields=fields, instance_fields=instance_fields)

    def health(self) -> dict[str, SourceHealth]:
        """Health of the backend's optional sources since the last call (one telemetry poll):
        GPM, once some GPU has it."""
        h = self._gpm.health() if self._gpm is not None else None
        return {} if h is None else {GPM_COLLECTOR: h}

    def _memory(self, index: int, st: _GpuState, h: Any, prefix: str) -> _Memory | None:
        """Framebuffer sizes. v2 gives `reserved`; drivers/bindings without it use v1."""
        nv = self._nv
        key_v2 = prefix + "memory_v2"
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is None:
            st.unsupported.add(key_v2)
        if key_v2 not in st.unsupported:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h, version=version)
            except TypeError:  # pynvml without the `version` argument
                st.unsupported.add(key_v2)
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                err = self._gpu_error(index, "nvmlDeviceGetMemoryInfo", e)
                if err is not None:
                    raise err from e
                if getattr(e, "value", None) in (
                    _ERR_NOT_SUPPORTED,
                    _ERR_FUNCTION_NOT_FOUND,
                    _ERR_ARGUMENT_VERSION_MISMATCH,
                    _ERR_INVALID_ARGUMENT,
                ):
                    st.unsupported.add(key_v2)
                else:
                    return self._absent_or_raise(index, st, key_v2, "nvmlDeviceGetMemoryInfo_v2", e)
            else:
                return _Memory(mem.total // _MIB, mem.free // _MIB, mem.used // _MIB, mem.reserved // _MIB)
        mem = self._probe(index, st, prefix + "memory_v1", "nvmlDeviceGetMemoryInfo", h)
        if mem is None:
            return None
        return _Memory(mem.total // _MIB, mem.free // _MIB, mem.used // _MIB, None)

    def _field_value(self, index: int, st: _GpuState, h: Any, key: str, field_id: int) -> Any:
        """One nvmlDeviceGetFieldValues entry; its own nvmlReturn says whether it is data."""
        values = self._probe(index, st, key, "nvmlDeviceGetFieldValues", h, [field_id])
        if values is None:
            return None
        fv = values[0]
        ret = int(getattr(fv, "nvmlReturn", _SUCCESS))
        if ret != _SUCCESS:
            exc_cls = getattr(self._nv, "NVMLError")
            return self._absent_or_raise(index, st, key, f"field {field_id}", exc_cls(ret))
        return _typed_value(fv)

    def _clock_reasons(self, index: int, st: _GpuState, h: Any, _prefix: str = "") -> Any:
        """Clock event reasons; the pre-12.x name (ThrottleReasons) when the new one is missing.

        Only a missing function falls back; a GPU that answers NotSupported lacks the feature.
        """
        if "clocks_event_api_missing" not in st.unsupported:
            if "clocks_event" in st.unsupported:
                return None
            fn = getattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            if fn is not None:
                try:
                    return fn(h)
                except Exception as e:
                    if not self._is_nvml_error(e):
                        raise
                    if getattr(e, "value", None) != _ERR_FUNCTION_NOT_FOUND:
                        return self._absent_or_raise(
                            index, st, "clocks_event", "nvmlDeviceGetCurrentClocksEventReasons", e
                        )
            st.unsupported.add("clocks_event_api_missing")
        return self._probe(index, st, "clocks_throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", h)

    # ------------------------------------------------------------------ processes

    def processes(self, gpu: GpuIdentity) -> Sequence[GpuProcess]:
        """Compute processes with memory, GPU instance and (when NVML has samples) SM util."""
        index = gpu.index
        h = self._handle(index)
        st = self._state(index)
        procs = self._probe(index, st, "processes", "nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None:
            return []
        sm = self._process_sm_util(index, st, h) if procs else {}
        out: list[GpuProcess] = []
        for pr in procs:
            mem = getattr(pr, "usedGpuMemory", None)
            if mem is not None and int(mem) in (_NOT_AVAILABLE_U64, _NOT_AVAILABLE_U32):
                mem = None
            gi = getattr(pr, "gpuInstanceId", None)
            if gi is not None and int(gi) == _NOT_AVAILABLE_U32:
                gi = None
            pid = int(pr.pid)
            out.append(
                GpuProcess(
                    pid=pid,
                    used_memory_bytes=None if mem is None else int(mem),
                    gpu_instance_id=None if gi is None else int(gi),
                    sm_utilization=sm.get(pid),
                )
            )
        return out

    def _process_sm_util(self, index: int, st: _GpuState, h: Any) -> dict[int, float]:
        """Per-pid SM % from samples newer than the last poll's; no samples -> empty."""
        key = "process_util"
        if key in st.unsupported:
            return {}
        fn = getattr(self._nv, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            st.unsupported.add(key)
            return {}
        try:
            samples = fn(h, st.proc_util_ts)
        except Exception as e:
            if not self._is_nvml_error(e):
                raise
            # NotFound = no samples since the timestamp; pynvml also raises a bare
            # NVMLError(SUCCESS) when the driver reports zero samples.
            if getattr(e, "value", None) in (_ERR_NOT_FOUND, _SUCCESS):
                return {}
            self._absent_or_raise(index, st, key, "nvmlDeviceGetProcessUtilization", e)
            return {}
        best: dict[int, tuple[int, float]] = {}
        newest = st.proc_util_ts
        for s in samples:
            ts = int(s.timeStamp)
            newest = max(newest, ts)
            pid = int(s.pid)
            if pid not in best or ts >= best[pid][0]:
                best[pid] = (ts, float(s.smUtil))
        st.proc_util_ts = newest
        return {pid: util for pid, (_ts, util) in best.items()}

    # ------------------------------------------------------------------ XID events

    def _setup_xid_events(self) -> None:
        """Register every GPU for XID events; a GPU that cannot be registered has no XID field."""
        nv = self._nv
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except Exception as e:  # noqa: BLE001 - XIDs are optional, telemetry is not
            log.warning("nvmlEventSetCreate failed (%s): XID errors will not be reported", e)
            self._event_set = None
            return
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        for index, st in self._gpus.items():
            if st.handle is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(st.handle, xid_type, self._event_set)
            except Exception as e:  # noqa: BLE001
                level = logging.DEBUG if getattr(e, "value", None) == _ERR_NOT_SUPPORTED else logging.WARNING
                log.log(level, "GPU %d: XID event registration failed (%s); no XID field", index, e)
                continue
            st.xid_registered = True
            st.last_xid = 0

    def xid_events(self) -> Sequence[XidEvent]:
        """Drain pending XID events without blocking (timeout 0)."""
        if self._event_set is None:
            return []
        nv = self._nv
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or getattr(nv, "nvmlEventSetWait")
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        out: list[XidEvent] = []
        for _ in range(_MAX_XID_DRAIN):
            try:
                data = wait(self._event_set, 0)
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                if getattr(e, "value", None) != _ERR_TIMEOUT:
                    log.warning("nvmlEventSetWait failed: %s", e)
                break
            if int(getattr(data, "eventType", xid_type)) != xid_type:
                continue
            index = self._index_of(data.device)
            if index is None:
                log.warning("XID %s from an unknown device; dropped", data.eventData)
                continue
            xid = int(data.eventData)
            self._state(index).last_xid = xid
            out.append(XidEvent(gpu_index=index, xid=xid, timestamp=time.time()))
        return out

    def _index_of(self, handle: Any) -> int | None:
        index = self._handle_index.get(_handle_key(handle))
        if index is not None:
            return index
        try:
            return int(self._nv.nvmlDeviceGetIndex(handle))
        except Exception:  # noqa: BLE001
            return None


# ---------------------------------------------------------------------- what each field reads


def _field_readers(b: NvmlBackend) -> Readers:
    """Field -> the NVML call that answers it and, where the answer is not the value itself, how
    to get the value in DCGM units. No DCGM_FI_PROF_*: NVML has no DCP counters; those come from
    GPM where the GPU has it (gpm.py, added by `read`).

    Bound to one backend at open(), with pynvml's constants resolved then (an old pynvml that
    lacks a name gets NVML's C value), so a poll pays only for the calls. The keys given to
    `call` are what a GPU's "unsupported" memory and the log lines name.
    """
    nv = b._nv
    probe = b._probe

    def call(key: str, fname: str, *constants: tuple[str, int]) -> Source:
        if not constants:
            return lambda index, st, h, _prefix: probe(index, st, key, fname, h)
        args = tuple(getattr(nv, name, value) for name, value in constants)
        return lambda index, st, h, _prefix: probe(index, st, key, fname, h, *args)

    def field_id(key: str, constant: tuple[str, int]) -> Source:
        fid = getattr(nv, *constant)
        return lambda index, st, h, _prefix: b._field_value(index, st, h, key, fid)

    def ecc(key: str, error_type: tuple[str, int], counter_type: tuple[str, int]) -> Source:
        return call(key, "nvmlDeviceGetTotalEccErrors", error_type, counter_type)

    def last_xid(index: int, st: _GpuState, h: Any, _prefix: str) -> int | None:
        return st.last_xid if st.xid_registered else None

    utilization = call("util", "nvmlDeviceGetUtilizationRates")
    remapped_rows = call("remapped_rows", "nvmlDeviceGetRemappedRows")  # (corr, unc, pending, failure)
    memory = b._memory  # one call (v2, else v1) answers all four FB_* fields
    corrected, uncorrected = ("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile, aggregate = ("NVML_VOLATILE_ECC", 0), ("NVML_AGGREGATE_ECC", 1)
    return {
        "DCGM_FI_DEV_SM_CLOCK": call("sm_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM", 1)),
        "DCGM_FI_DEV_MEM_CLOCK": call("mem_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM", 2)),
        "DCGM_FI_DEV_MEMORY_TEMP": field_id("memory_temp", ("NVML_FI_DEV_MEMORY_TEMP", 82)),
        "DCGM_FI_DEV_GPU_TEMP": call("gpu_temp", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU", 0)),
        "DCGM_FI_DEV_POWER_USAGE": (call("power", "nvmlDeviceGetPowerUsage"), lambda mw: mw / 1000.0),  # mW -> W
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": call("energy", "nvmlDeviceGetTotalEnergyConsumption"),  # mJ
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": call("pcie_replay", "nvmlDeviceGetPcieReplayCounter"),
        "DCGM_FI_DEV_GPU_UTIL": (utilization, attrgetter("gpu")),
        "DCGM_FI_DEV_MEM_COPY_UTIL": (utilization, attrgetter("memory")),
        "DCGM_FI_DEV_ENC_UTIL": (call("enc", "nvmlDeviceGetEncoderUtilization"), itemgetter(0)),  # (%, period)
        "DCGM_FI_DEV_DEC_UTIL": (call("dec", "nvmlDeviceGetDecoderUtilization"), itemgetter(0)),
        "DCGM_FI_DEV_XID_ERRORS": last_xid,
        "DCGM_FI_DEV_POWER_VIOLATION": (
            call("DCGM_FI_DEV_POWER_VIOLATION", "nvmlDeviceGetViolationStatus", ("NVML_PERF_POLICY_POWER", 0)),
            attrgetter("violationTime"),  # ns
        ),
        "DCGM_FI_DEV_THERMAL_VIOLATION": (
            call("DCGM_FI_DEV_THERMAL_VIOLATION", "nvmlDeviceGetViolationStatus", ("NVML_PERF_POLICY_THERMAL", 1)),
            attrgetter("violationTime"),
        ),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": b._clock_reasons,
        "DCGM_FI_DEV_FB_TOTAL": (memory, attrgetter("total")),
        "DCGM_FI_DEV_FB_FREE": (memory, attrgetter("free")),
        "DCGM_FI_DEV_FB_USED": (memory, attrgetter("used")),
        "DCGM_FI_DEV_FB_RESERVED": (memory, attrgetter("reserved")),  # None from v1: absent
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ecc("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", corrected, volatile),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ecc("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", uncorrected, volatile),
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ecc("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", corrected, aggregate),
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ecc("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", uncorrected, aggregate),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (remapped_rows, itemgetter(1)),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (remapped_rows, itemgetter(0)),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": (remapped_rows, lambda rows: 1 if rows[3] else 0),
    }


@dataclass(frozen=True)
class _Plans:
    """The catalogue walks a backend makes: a whole GPU, a MIG GPU, and one GPU instance."""

    whole_gpu: Plan
    mig_gpu: Plan  # no utilization: NVML has none on MIG GPUs (nor does dcgm-exporter)
    mig_instance: Plan  # framebuffer sizes of one GPU instance, through its MIG handle

    @classmethod
    def of(cls, b: NvmlBackend) -> _Plans:
        readers = _field_readers(b)
        return cls(
            whole_gpu=plan(readers, ("device", "instance", "non_mig")),
            mig_gpu=plan(readers, ("device", "instance")),
            mig_instance=plan(readers, ("instance",)),
        )


def _typed_value(fv: Any) -> float:
    """The number in an nvmlFieldValue_t union, picked by its valueType."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(getattr(fv, "valueType", 1)), "uiVal"
    )
    return getattr(fv.value, member)
