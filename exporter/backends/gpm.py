"""DCGM's profiling fields (DCGM_FI_PROF_*) from NVML's GPM API, without DCGM.

GPM (GPU Performance Monitoring, `nvmlGpm*`, Hopper and later) measures over the window between
two samples what dcgm-exporter's DCP fields measure: SM activity and occupancy, tensor, FP64/32/16
pipe and DRAM activity, PCIe and NVLink traffic. On a real H100 (../shared/data/nvml-h100/) under
a bf16 matmul it gave SM 96.2 %, tensor 93.4 %, DRAM 25.5 %; a sample cost 0.05-0.8 ms and the
metrics call 1.5-6 ms.

How the NVML backend uses it: one sample per telemetry poll per GPU (or per MIG instance, through
`nvmlGpmMigSampleGet`), and the metrics of the window since the previous poll's sample,
published in dcgm-exporter's names and units (ratios 0-1, bytes per second). Two samples per GPU
are allocated once and swapped, so a poll costs one sample and one metrics call.

What never happens: a GPM problem failing the GPU's reading or the scrape. A GPU without GPM
(`nvmlGpmQueryDeviceSupport` says no, an old driver or pynvml lacks it: Ampere and older, vGPU)
publishes none of these fields (absent, never 0). A failing call leaves the fields out for that
poll and is counted by reason (`gpufleet_collector_problems_total{collector="nvml_gpm",reason}`),
the next poll starts a fresh window.

Which GPM metric answers which field: tensor activity is ANY_TENSOR_UTIL (every tensor pipe,
HMMA, IMMA and DMMA: what DCP's PIPE_TENSOR_ACTIVE counts on Hopper; equal to HMMA_TENSOR_UTIL
under a bf16 load on the H100), graphics-engine activity is GRAPHICS_UTIL, DRAM activity is
DRAM_BW_UTIL. GPM gives percentages and MiB/s; dcgm-exporter publishes ratios and bytes/s.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from gpufleet.exporter.model import SourceHealth

log = logging.getLogger(__name__)

COLLECTOR = "nvml_gpm"  # the health metrics' collector label

_PERCENT = 0.01  # GPM percent -> DCGM ratio
_MIB_PER_S = float(1 << 20)  # GPM MiB/s -> DCGM bytes/s

# DCGM field -> (pynvml constant, its NVML C value for a pynvml that lacks the name, scale).
GPM_FIELDS: tuple[tuple[str, str, int, float], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "NVML_GPM_METRIC_GRAPHICS_UTIL", 1, _PERCENT),
    ("DCGM_FI_PROF_SM_ACTIVE", "NVML_GPM_METRIC_SM_UTIL", 2, _PERCENT),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "NVML_GPM_METRIC_SM_OCCUPANCY", 3, _PERCENT),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, _PERCENT),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10, _PERCENT),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "NVML_GPM_METRIC_FP64_UTIL", 11, _PERCENT),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "NVML_GPM_METRIC_FP32_UTIL", 12, _PERCENT),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "NVML_GPM_METRIC_FP16_UTIL", 13, _PERCENT),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, _MIB_PER_S),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, _MIB_PER_S),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, _MIB_PER_S),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, _MIB_PER_S),
)

_SUCCESS = 0
_ERR_NOT_SUPPORTED = 3
_ERR_FUNCTION_NOT_FOUND = 13
_NO_GPM = {_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND}  # the GPU (or driver) has no GPM: not a problem

Key = Hashable  # (GPU index, GPU instance id or None)


def reason_of(e: BaseException) -> str:
    """A short word for a metric label: NVMLError_NoPermission -> "no_permission"."""
    name = type(e).__name__.removeprefix("NVMLError_").removeprefix("NVMLError")
    if not name:  # a bare NVMLError(code) pynvml has no subclass for
        return f"nvml_error_{getattr(e, 'value', 'unknown')}"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@dataclass
class _Window:
    """Two GPM samples of one GPU or MIG instance, swapped every poll."""

    prev: Any
    spare: Any
    have_prev: bool = False
    unsupported: set[int] = field(default_factory=set)  # metric ids this GPU answers NotSupported


class GpmReader:
    """GPM sampling for every GPU of one NVML session (see the module docstring)."""

    def __init__(self, nv: Any):
        self._nv = nv
        self._metrics = tuple((name, int(getattr(nv, const, default)), scale) for name, const, default, scale in GPM_FIELDS)
        self._support: dict[int, bool] = {}
        self._windows: dict[Key, _Window] = {}
        self._by_gpu: dict[int, set[Key]] = {}  # GPU index -> its windows' keys
        self._no_gpm: set[Key] = set()  # GPUs / MIG instances whose sampling answered NotSupported
        self._request: Any = None  # one c_nvmlGpmMetricsGet_t, reused (polls are sequential)
        self.problems: Counter[str] = Counter()
        self._logged: set[tuple[Key, str]] = set()
        self._poll_ok = True
        self._poll_seconds = 0.0
        self._asked = False  # some GPU had GPM this poll

    # --- support ---

    def supported(self, index: int, handle: Any) -> bool:
        """Whether GPU `index` has GPM; asked once per GPU (a transient error is asked again)."""
        known = self._support.get(index)
        if known is not None:
            return known
        fn = getattr(self._nv, "nvmlGpmQueryDeviceSupport", None)
        if fn is None:  # pynvml older than GPM
            self._support[index] = False
            return False
        try:
            ok = bool(fn(handle).isSupportedDevice)
        except Exception as e:  # noqa: BLE001 - GPM must never fail a reading
            if getattr(e, "value", None) in _NO_GPM:
                self._support[index] = False
                return False
            self._problem((index, None), "nvmlGpmQueryDeviceSupport", e)
            return False
        self._support[index] = ok
        log.info("GPU %d: GPM %s", index, "supported: publishing DCGM_FI_PROF_* from NVML" if ok else "not supported")
        return ok

    # --- one window ---

    def read(self, key: Key, sample_get: Callable[[Any], Any]) -> dict[str, float]:
        """Take this poll's sample of `key` with `sample_get(sample)`; the fields of the window
        since the previous poll's sample (empty on the first poll, or after an error)."""
        t0 = time.perf_counter()
        self._asked = True
        try:
            return self._read(key, sample_get)
        finally:
            self._poll_seconds += time.perf_counter() - t0

    def _read(self, key: Key, sample_get: Callable[[Any], Any]) -> dict[str, float]:
        nv = self._nv
        w = self._windows.get(key)
        if w is None:
            if key in self._no_gpm:
                return {}
            try:
                first = nv.nvmlGpmSampleAlloc()
            except Exception as e:  # noqa: BLE001
                self._problem(key, "nvmlGpmSampleAlloc", e)
                return {}
            try:
                w = _Window(first, nv.nvmlGpmSampleAlloc())
            except Exception as e:  # noqa: BLE001
                self._free(first)
                self._problem(key, "nvmlGpmSampleAlloc", e)
                return {}
            self._windows[key] = w
            self._by_gpu.setdefault(key[0], set()).add(key)
        try:
            sample_get(w.spare)
        except Exception as e:  # noqa: BLE001
            w.have_prev = False  # the next poll starts a fresh window
            if getattr(e, "value", None) in _NO_GPM:  # e.g. a MIG instance GPM cannot sample
                log.info("GPU %d%s: GPM sampling not supported (%s); profiling fields left out", key[0],
                         "" if key[1] is None else f" instance {key[1]}", e)
                self._drop(key)
                self._no_gpm.add(key)
                return {}
            self._problem(key, "nvmlGpmSampleGet", e)
            return {}
        new, old, had = w.spare, w.prev, w.have_prev
        w.prev, w.spare, w.have_prev = new, old, True
        if not had:
            return {}
        return self._metrics_of(key, w, old, new)

    def _metrics_of(self, key: Key, w: _Window, first: Any, second: Any) -> dict[str, float]:
        nv = self._nv
        wanted = [m for m in self._metrics if m[1] not in w.unsupported]
        if not wanted:
            return {}
        mg = self._request
        if mg is None:
            mg = self._request = nv.c_nvmlGpmMetricsGet_t()
        mg.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        mg.numMetrics = len(wanted)
        mg.sample1, mg.sample2 = first, second
        for i, (_name, metric_id, _scale) in enumerate(wanted):
            mg.metrics[i].metricId = metric_id
        try:
            nv.nvmlGpmMetricsGet(mg)
        except Exception as e:  # noqa: BLE001
            self._problem(key, "nvmlGpmMetricsGet", e)
            return {}
        out: dict[str, float] = {}
        for i, (name, metric_id, scale) in enumerate(wanted):
            m = mg.metrics[i]
            ret = int(m.nvmlReturn)
            if ret == _SUCCESS:
                out[name] = float(m.value) * scale
            elif ret in _NO_GPM:
                w.unsupported.add(metric_id)  # e.g. NVLink on a PCIe board: never asked again
            else:
                cls = getattr(nv, "NVMLError", None)
                self._problem(key, f"GPM metric {metric_id}", cls(ret) if cls else RuntimeError(ret))
        return out

    # --- bookkeeping ---

    def keep_only(self, index: int, keys: set[Key]) -> None:
        """Free the windows of GPU `index` that are not in `keys` (MIG instances that went away)."""
        held = self._by_gpu.get(index)
        if held and not held <= keys:
            for key in held - keys:
                self._drop(key)

    def _drop(self, key: Key) -> None:
        w = self._windows.pop(key, None)
        self._by_gpu.get(key[0], set()).discard(key)
        if w is not None:
            self._free(w.prev)
            self._free(w.spare)

    def _free(self, sample: Any) -> None:
        try:
            self._nv.nvmlGpmSampleFree(sample)
        except Exception as e:  # noqa: BLE001 - freeing must not fail a poll
            log.debug("nvmlGpmSampleFree failed: %s", e)

    def _problem(self, key: Key, what: str, e: BaseException) -> None:
        reason = reason_of(e)
        self.problems[reason] += 1
        self._poll_ok = False
        if (key, reason) not in self._logged:
            self._logged.add((key, reason))
            where = f"GPU {key[0]}" + (f" instance {key[1]}" if key[1] is not None else "")
            log.warning("%s: %s failed (%s); profiling fields left out this poll", where, what, e)

    def health(self) -> SourceHealth | None:
        """GPM's health over the poll since the last call; None while no GPU has GPM."""
        if not self._asked and not self.problems:
            return None
        h = SourceHealth(self._poll_ok, self._poll_seconds, dict(self.problems))
        self._poll_ok, self._poll_seconds, self._asked = True, 0.0, False
        return h

    def close(self) -> None:
        for key in list(self._windows):
            self._drop(key)
        self._windows = {}
        self._by_gpu = {}
        self._support = {}
        self._no_gpm = set()
