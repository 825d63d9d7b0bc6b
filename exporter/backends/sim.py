"""The simulated backend: N GPUs of a named model driven by a scenario.

It answers the same questions as the NVML backend, so everything above the backend (poller,
mapping, rendering) runs unchanged on a machine with no GPU. Values are derived from the
scenario's traces and the model's envelope; a field the real board would not report is left out.

Live control: when the scenario names a `control_dir`, a file `<control_dir>/<index>.toml`
overrides that GPU's utilization and processes while it exists, e.g.

    utilization = 0
    processes = [ { pid = 1234, used_memory_mib = 20000 } ]
    tensor_active = 0.45                      # optional, 0..1
    instances = { 1 = 30, 2 = 0 }             # optional: MIG GPU_I_ID -> utilization
    fields = { DCGM_FI_PROF_PCIE_RX_BYTES = 1.1e10 }  # optional: profiling fields' values (whole GPU)

so a Slurm job script in a test can make "its" GPU busy, idle, or held with no process, and the
demo's simulated fleet can drive every GPU (and MIG slice) from its workload plan.

Profiling fields (DCGM_FI_PROF_*) follow the scenario's `profiling`: by default present on models
with GPM (H100, H200, B200: what the NVML backend reads through GPM) and absent on the others
(A100, L4, T4: a node without dcgm-exporter has none); `profiling = "dcgm"` publishes them on
any model, as dcgm-exporter would. They follow the load: engine activity is the utilization,
SM activity, occupancy, DRAM and FP32 pipe fixed shares of it, tensor activity the scenario's or
control file's `tensor_active` (else _TENSOR_SHARE of the utilization); FP64 and FP16 pipes 0.
PCIe and NVLink traffic are not modelled (absent) unless a scenario trace or a control file's
`fields` gives them; a control file's `fields` (DCGM_FI_PROF_* only) publish where profiling does:
the demo drives SM activity, PCIe RX and NVLink traffic through them, so its jobs show where their
time goes (gpufleet.analytics.states).
"""

from __future__ import annotations

import logging
import socket
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from gpufleet.config import ConfigError

from gpufleet.exporter.backends.sim_models import SimModel
from gpufleet.exporter.backends.sim_scenario import Scenario, SimGpuSpec, SimProcess, _Reader
from gpufleet.exporter.fields import FIELDS, Readers, plan, read_fields
from gpufleet.exporter.model import GpuError, GpuIdentity, GpuProcess, GpuReading, MigInstance, SourceHealth, XidEvent

log = logging.getLogger(__name__)

_IDLE_REASON = 0x1  # nvmlClocksEventReasonGpuIdle
_TENSOR_SHARE = 0.4  # tensor activity per unit of utilization where no trace drives it
_SW_THERMAL = 0x20  # nvmlClocksEventReasonSwThermalSlowdown


def _uuid(prefix: str, *parts: object) -> str:
    return prefix + str(uuid.uuid5(uuid.NAMESPACE_OID, "/".join(map(str, parts))))


def gpu_uuid(hostname: str, index: int) -> str:
    """The UUID the simulator gives GPU `index` of `hostname` (stable across runs)."""
    return _uuid("GPU-", hostname, index)


def mig_uuid(hostname: str, index: int, position: int) -> str:
    """The UUID of the MIG instance at `position` (0-based) on GPU `index` of `hostname`."""
    return _uuid("MIG-", hostname, index, position)


@dataclass(frozen=True)
class _Control:
    """A control file's overrides; None (or no instance key) leaves the scenario in charge."""

    utilization: float | None = None
    processes: tuple[SimProcess, ...] | None = None
    tensor_active: float | None = None
    instances: dict[int, float] = field(default_factory=dict)
    fields: dict[str, float] = field(default_factory=dict)  # DCGM_FI_PROF_* -> value (whole GPU)


_NO_CONTROL = _Control()


@dataclass(slots=True)
class _Now:
    """What one read derived from the scenario: of the whole GPU, or of one MIG instance.

    Plain slots, not frozen: it is built on every read and never kept.
    """

    model: SimModel
    util: float  # percent
    temp: float  # C
    power: float  # W
    energy_mj: float
    last_xid: int
    fb_total: int  # MiB
    fb_used: int
    fb_reserved: int
    tensor: float = 0.0  # 0..1
    profiling: bool = False  # DCGM_FI_PROF_* are published (GPM, or dcgm-exporter's)

    def instance(self, util: float, fb_total: int, fb_used: int) -> _Now:
        """The same GPU seen from one MIG instance: its own utilization and framebuffer."""
        return _Now(self.model, util, self.temp, self.power, self.energy_mj, self.last_xid,
                    fb_total=fb_total, fb_used=fb_used, fb_reserved=0, tensor=util / 100 * _TENSOR_SHARE,
                    profiling=self.profiling)


def _zero(_now: _Now) -> int:
    """Counters and rates a healthy simulated GPU never moves."""
    return 0


def _profiled(share: float | None) -> Callable[[_Now], float | None]:
    """A profiling ratio: `share` of the utilization (None: the tensor activity), where profiled."""
    if share is None:
        return lambda now: round(now.tensor, 6) if now.profiling else None
    return lambda now: round(now.util / 100 * share, 6) if now.profiling else None


def _row_remap(now: _Now) -> int | None:
    return 0 if now.model.supports_row_remap else None


# Field -> its value from what one read derived (None: the simulated board does not report it).
_READERS: Readers = {
    "DCGM_FI_DEV_SM_CLOCK": lambda now: now.model.max_sm_mhz if now.util > 0 else now.model.idle_sm_mhz,
    "DCGM_FI_DEV_MEM_CLOCK": lambda now: now.model.mem_mhz,
    "DCGM_FI_DEV_MEMORY_TEMP": lambda now: round(now.temp + 4) if now.model.supports_memory_temp else None,
    "DCGM_FI_DEV_GPU_TEMP": lambda now: round(now.temp),
    "DCGM_FI_DEV_POWER_USAGE": lambda now: round(now.power, 3),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda now: round(now.energy_mj),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _zero,
    "DCGM_FI_DEV_GPU_UTIL": lambda now: round(now.util),
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda now: round(now.util * 0.4),
    "DCGM_FI_DEV_ENC_UTIL": _zero,
    "DCGM_FI_DEV_DEC_UTIL": _zero,
    "DCGM_FI_DEV_XID_ERRORS": lambda now: now.last_xid,
    "DCGM_FI_DEV_POWER_VIOLATION": _zero,
    "DCGM_FI_DEV_THERMAL_VIOLATION": _zero,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda now: (
        (_IDLE_REASON if now.util == 0 else 0) | (_SW_THERMAL if now.temp >= 85 else 0)
    ),
    "DCGM_FI_DEV_FB_TOTAL": lambda now: now.fb_total,
    "DCGM_FI_DEV_FB_FREE": lambda now: now.fb_total - now.fb_reserved - now.fb_used,
    "DCGM_FI_DEV_FB_USED": lambda now: now.fb_used,
    "DCGM_FI_DEV_FB_RESERVED": lambda now: now.fb_reserved,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _zero,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _zero,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _zero,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _zero,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _row_remap,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _row_remap,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _row_remap,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _profiled(1.0),
    "DCGM_FI_PROF_SM_ACTIVE": _profiled(0.9),
    "DCGM_FI_PROF_SM_OCCUPANCY": _profiled(0.15),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _profiled(None),
    "DCGM_FI_PROF_DRAM_ACTIVE": _profiled(0.3),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": _profiled(0.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": _profiled(0.05),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": _profiled(0.0),
}
_WHOLE_GPU = plan(_READERS, ("device", "instance", "non_mig"))
_MIG_GPU = plan(_READERS, ("device",))  # per-instance fields live on the instance rows
_MIG_INSTANCE = plan(_READERS, ("instance",))


class SimBackend:
    name = "sim"

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time):
        self.scenario = scenario
        self.clock = clock
        self.hostname = scenario.hostname or socket.gethostname()
        self._start = 0.0
        self._devices: list[GpuIdentity] = []
        self._energy_mj: dict[int, float] = {}
        self._last_read: dict[int, float] = {}
        self._last_xid: dict[int, int] = {}
        self._xid_cursor = 0.0
        self._bad_control: dict[Path, str] = {}

    def open(self) -> None:
        self._start = self.clock()
        self._xid_cursor = -1.0
        sc = self.scenario
        self._devices = []
        for i in range(sc.gpus):
            spec = sc.spec(i)
            migs = tuple(
                MigInstance(gpu_instance_id=_gi_id(k), profile=m.profile, uuid=mig_uuid(self.hostname, i, k))
                for k, m in enumerate(spec.mig)
            )
            self._devices.append(
                GpuIdentity(
                    index=i,
                    uuid=gpu_uuid(self.hostname, i),
                    model=sc.model.name,
                    minor_number=sc.minor(i),
                    pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0" if i < 14 else f"00000001:{i:02X}:00.0",
                    mig_instances=migs,
                )
            )
            self._energy_mj[i] = 1.0e9  # energy "since boot", as a real counter starts
            self._last_xid[i] = 0

    def driver_version(self) -> str:
        return self.scenario.driver_version

    def devices(self) -> Sequence[GpuIdentity]:
        return list(self._devices)

    def elapsed(self) -> float:
        return self.clock() - self._start

    def _check_alive(self, gpu: GpuIdentity, t: float) -> SimGpuSpec:
        spec = self.scenario.spec(gpu.index)
        if spec.lost_at_s is not None and t >= spec.lost_at_s:
            raise GpuError("gpu_lost", f"GPU {gpu.index} ({gpu.uuid}) is lost: it fell off the bus (simulated)")
        return spec

    def _control(self, index: int) -> _Control:
        """Live override from the control directory (all None when there is none)."""
        if not self.scenario.control_dir:
            return _NO_CONTROL
        path = Path(self.scenario.control_dir) / f"{index}.toml"
        try:
            text = path.read_text()
        except OSError:
            return _NO_CONTROL
        try:
            doc = tomllib.loads(text)
            r = _Reader(str(path))
            util = r.number(doc, "utilization", "utilization", None, minimum=0)
            tensor = r.number(doc, "tensor_active", "tensor_active", None, minimum=0)
            procs = doc.get("processes")
            parsed = None if procs is None else tuple(r.process(p, f"processes[{i}]") for i, p in enumerate(procs))
            instances = {int(k): r.number(doc["instances"], k, "instances", None, minimum=0) for k in doc.get("instances", {})}
            fields = {k: r.number(doc["fields"], k, "fields", None, minimum=0) for k in doc.get("fields", {})}
            unknown = sorted(k for k in fields if not k.startswith("DCGM_FI_PROF_") or k not in FIELDS)
            if unknown:
                raise ValueError(f"fields: {', '.join(unknown)} not a profiling field of the catalogue (DCGM_FI_PROF_*)")
        except (tomllib.TOMLDecodeError, ConfigError, AttributeError, TypeError, ValueError) as e:
            if self._bad_control.get(path) != text:
                self._bad_control[path] = text
                log.warning("ignoring simulator control file %s: %s", path, e)
            return _NO_CONTROL
        return _Control(util, parsed, tensor, instances, fields)

    def _utilization(self, spec: SimGpuSpec, t: float, control: _Control) -> float:
        if control.utilization is not None:
            return min(100.0, control.utilization)
        return _clip(spec.utilization.at(t), 0, 100) if spec.utilization else 0.0

    def _live_processes(self, spec: SimGpuSpec, t: float, control: _Control) -> list[SimProcess]:
        procs = control.processes if control.processes is not None else spec.processes
        return [p for p in procs if p.alive(t)]

    def read(self, gpu: GpuIdentity) -> GpuReading:
        """One poll: derive the GPU's state from the scenario, then walk the catalogue (`_READERS`)."""
        t = self.elapsed()
        spec = self._check_alive(gpu, t)
        m = self.scenario.model
        control = self._control(spec.index)
        util = self._utilization(spec, t, control)
        if gpu.mig_instances:
            inst_utils = {
                inst.gpu_instance_id: _clip(control.instances[inst.gpu_instance_id], 0, 100) if inst.gpu_instance_id in control.instances
                else (_clip(mig.utilization.at(t), 0, 100) if mig.utilization else util)
                for inst, mig in zip(gpu.mig_instances, spec.mig)
            }
            util = sum(inst_utils.values()) / len(inst_utils)
        procs = self._live_processes(spec, t, control)
        power = m.idle_w + (m.tdp_w - m.idle_w) * 0.9 * util / 100
        dt = max(0.0, t - self._last_read.get(gpu.index, t))
        self._last_read[gpu.index] = t
        self._energy_mj[gpu.index] += power * dt * 1000
        reserved = round(m.memory_mib * 0.006)
        used = sum(p.used_memory_mib for p in procs) + (spec.memory_used_mib.at(t) if spec.memory_used_mib else 0)
        if control.tensor_active is not None or spec.tensor_active is not None:
            tensor = _clip(control.tensor_active if control.tensor_active is not None else spec.tensor_active.at(t), 0, 1)
        else:
            tensor = util / 100 * _TENSOR_SHARE
        now = _Now(
            model=m,
            util=util,
            temp=30 + util * 0.45,
            power=power,
            energy_mj=self._energy_mj[gpu.index],
            last_xid=self._last_xid.get(gpu.index, 0),
            fb_total=m.memory_mib,
            fb_used=_clip(round(used), 0, m.memory_mib - reserved),
            fb_reserved=reserved,
            tensor=tensor,
            profiling=self.scenario.profiling != "none",
        )
        instance_fields: dict[int, dict[str, float]] = {}
        if gpu.mig_instances:
            fields = read_fields(_MIG_GPU, now)
            for inst, _mig in zip(gpu.mig_instances, spec.mig):
                gi = inst.gpu_instance_id
                total = m.mig_profiles[inst.profile]
                inst_used = _clip(round(sum(p.used_memory_mib for p in procs if p.gpu_instance_id == gi)), 0, total)
                instance_fields[gi] = read_fields(_MIG_INSTANCE, now.instance(inst_utils[gi], total, inst_used))
        else:
            fields = read_fields(_WHOLE_GPU, now)
            if now.profiling:
                fields.update(control.fields)
        for name, trace in spec.fields:  # the scenario's own traces win
            fields[name] = trace.at(t)
        return GpuReading(fields=fields, instance_fields=instance_fields)

    def processes(self, gpu: GpuIdentity) -> Sequence[GpuProcess]:
        t = self.elapsed()
        spec = self._check_alive(gpu, t)
        return [
            GpuProcess(
                pid=p.pid,
                used_memory_bytes=int(p.used_memory_mib * 1024 * 1024),
                gpu_instance_id=p.gpu_instance_id,
                sm_utilization=p.sm_util,
            )
            for p in self._live_processes(spec, t, self._control(spec.index))
        ]

    def xid_events(self) -> Sequence[XidEvent]:
        t = self.elapsed()
        events = []
        for spec in self.scenario.gpu_specs:
            for at, code in spec.xid:
                if self._xid_cursor < at <= t:
                    events.append(XidEvent(gpu_index=spec.index, xid=code, timestamp=self._start + at))
                    self._last_xid[spec.index] = code
        self._xid_cursor = t
        return sorted(events, key=lambda e: e.timestamp)

    def health(self) -> dict[str, SourceHealth]:
        """No optional sources: the simulated profiling fields cannot fail."""
        return {}

    def close(self) -> None:
        self._devices = []


def _gi_id(position: int) -> int:
    """GPU instance ids as NVIDIA hands them out for the first placements (1, 2, 3, ...)."""
    return position + 1


def _clip(v: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, v))
