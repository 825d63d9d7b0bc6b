"""The catalogue walk both backends read through, and what it publishes, pinned line by line.

The pinned expositions were taken before the backends moved from hand-written per-field blocks
to reader tables (issue #12), and must not change while only the reading code does. Each line is
a published DCGM (or gpufleet_gpu_up) sample in exposition order, with its exact value text and
only the labels that tell rows apart; the other labels come from the GPU's identity, not from the
reading, and are covered by test_exporter_output.py.
"""

from __future__ import annotations

import re

import pynvml
import pytest

from gpufleet.exporter.backends import sim_scenario
from gpufleet.exporter.backends.nvml import NvmlBackend
from gpufleet.exporter.backends.sim import SimBackend
from gpufleet.exporter.fields import FIELDS, plan, read_fields
from gpufleet.exporter.poller import Poller
from tests.fakes.fake_pynvml import GIB, MIB, FakeGpu, FakeMig, FakeNvml

# --- the walk --------------------------------------------------------------------------------


def test_plan_follows_the_catalogue_and_its_scopes():
    readers = {name: (lambda name=name: name) for name in reversed(list(FIELDS))}
    whole = plan(readers, ("device", "instance", "non_mig"))
    assert [name for _source, name in whole] == list(FIELDS)
    mig_gpu = plan(readers, ("device", "instance"))
    assert [name for _source, name in mig_gpu] == [n for n, f in FIELDS.items() if f.scope != "non_mig"]
    assert [name for _source, name in plan(readers, ("instance",))] == [n for n, f in FIELDS.items() if f.scope == "instance"]


def test_plan_refuses_a_field_outside_the_catalogue():
    with pytest.raises(ValueError, match="DCGM_FI_DEV_GPU_UTILIZATION"):
        plan({"DCGM_FI_DEV_GPU_UTILIZATION": lambda: 1}, ("device",))


def test_none_is_absent_never_zero_and_a_shared_source_is_asked_once():
    asked = []

    def memory(gpu):
        asked.append(gpu)
        return {"total": 80, "used": 20, "reserved": None}

    readers = {
        "DCGM_FI_DEV_FB_TOTAL": (memory, lambda m: m["total"]),
        "DCGM_FI_DEV_FB_USED": (memory, lambda m: m["used"]),
        "DCGM_FI_DEV_FB_RESERVED": (memory, lambda m: m["reserved"]),  # a pick answering None
        "DCGM_FI_DEV_GPU_TEMP": lambda gpu: None,  # a source answering None
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda gpu: 0,  # a real zero stays
    }
    fields = read_fields(plan(readers, ("device", "instance")), "gpu0")
    assert fields == {"DCGM_FI_DEV_FB_TOTAL": 80, "DCGM_FI_DEV_FB_USED": 20, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0}
    assert asked == ["gpu0"]


# --- what the backends publish ---------------------------------------------------------------

_KEEP = ("gpu", "GPU_I_ID", "reason")


def rows(exposition: bytes) -> str:
    """DCGM and gpu_up samples as `name{gpu=..,GPU_I_ID=..} value`, in exposition order."""
    out = []
    for line in exposition.decode().splitlines():
        if not line.startswith(("DCGM_FI_", "gpufleet_gpu_up")):
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("} ", 1)
        kept = ",".join(f"{k}={v}" for k, v in re.findall(r'(\w+)="([^"]*)"', labels) if k in _KEEP)
        out.append(f"{name}{{{kept}}} {value}")
    return "\n".join(out) + "\n"


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def nvml_fleet() -> FakeNvml:
    """An H100 with everything, a T4 that lacks or refuses much, a MIG A100, and an H100 to lose."""
    full = FakeGpu(uuid="GPU-00000000-0000-4000-8000-000000000000")
    sparse = FakeGpu(
        uuid="GPU-11111111-1111-4111-8111-111111111111",
        name="Tesla T4",
        minor=1,
        pci_bus_id="0000:ca:00.0",
        util=(0, 0),
        power_mw=27031,
        unsupported={
            "nvmlDeviceGetPcieReplayCounter",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetEncoderUtilization",
            "nvmlDeviceGetViolationStatus",
        },
        errors={
            "nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # v1: no reserved
            "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # throttle reasons
            "nvmlDeviceGetDecoderUtilization": pynvml.NVML_ERROR_NO_PERMISSION,  # absent this poll
        },
        memory={"total": 15 * GIB, "reserved": 256 * MIB, "free": 14 * GIB, "used": 768 * MIB},
        field_values={},  # memory temperature: NotSupported in the field value
        clocks_event_reasons=0x1,
        xid_supported=False,
    )
    mig = FakeGpu(
        uuid="GPU-22222222-2222-4222-8222-222222222222",
        name="NVIDIA A100-SXM4-40GB",
        minor=2,
        pci_bus_id="00000000:53:00.0",
        mig_enabled=True,
        memory={"total": 40 * GIB, "reserved": 0, "free": 39 * GIB, "used": 1 * GIB},
        migs=[
            FakeMig(7, "MIG-77777777-7777-4777-8777-777777777777", "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                    {"total": 4864 * MIB, "reserved": 0, "free": 4000 * MIB, "used": 864 * MIB}),
            FakeMig(3, "MIG-33333333-3333-4333-8333-333333333333", "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
                    {"total": 9728 * MIB, "reserved": 0, "free": 1728 * MIB, "used": 8000 * MIB}),
        ],
    )
    doomed = FakeGpu(uuid="GPU-33333333-3333-4333-8333-333333333333", minor=3, pci_bus_id="00000000:9A:00.0")
    return FakeNvml([full, sparse, mig, doomed])


NVML_ROWS = """\
DCGM_FI_DEV_SM_CLOCK{gpu=0} 1980
DCGM_FI_DEV_SM_CLOCK{gpu=1} 1980
DCGM_FI_DEV_SM_CLOCK{gpu=2,GPU_I_ID=3} 1980
DCGM_FI_DEV_SM_CLOCK{gpu=2,GPU_I_ID=7} 1980
DCGM_FI_DEV_MEM_CLOCK{gpu=0} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=1} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=2,GPU_I_ID=3} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=2,GPU_I_ID=7} 2619
DCGM_FI_DEV_MEMORY_TEMP{gpu=0} 38
DCGM_FI_DEV_MEMORY_TEMP{gpu=2,GPU_I_ID=3} 38
DCGM_FI_DEV_MEMORY_TEMP{gpu=2,GPU_I_ID=7} 38
DCGM_FI_DEV_GPU_TEMP{gpu=0} 41
DCGM_FI_DEV_GPU_TEMP{gpu=1} 41
DCGM_FI_DEV_GPU_TEMP{gpu=2,GPU_I_ID=3} 41
DCGM_FI_DEV_GPU_TEMP{gpu=2,GPU_I_ID=7} 41
DCGM_FI_DEV_POWER_USAGE{gpu=0} 68.244
DCGM_FI_DEV_POWER_USAGE{gpu=1} 27.031
DCGM_FI_DEV_POWER_USAGE{gpu=2,GPU_I_ID=3} 68.244
DCGM_FI_DEV_POWER_USAGE{gpu=2,GPU_I_ID=7} 68.244
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=0} 123456789
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=2,GPU_I_ID=3} 123456789
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=2,GPU_I_ID=7} 123456789
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=0} 2
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=2,GPU_I_ID=3} 2
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=2,GPU_I_ID=7} 2
DCGM_FI_DEV_GPU_UTIL{gpu=0} 87
DCGM_FI_DEV_GPU_UTIL{gpu=1} 0
DCGM_FI_DEV_MEM_COPY_UTIL{gpu=0} 41
DCGM_FI_DEV_MEM_COPY_UTIL{gpu=1} 0
DCGM_FI_DEV_ENC_UTIL{gpu=0} 3
DCGM_FI_DEV_DEC_UTIL{gpu=0} 5
DCGM_FI_DEV_XID_ERRORS{gpu=0} 79
DCGM_FI_DEV_XID_ERRORS{gpu=2,GPU_I_ID=3} 0
DCGM_FI_DEV_XID_ERRORS{gpu=2,GPU_I_ID=7} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=0} 5000000
DCGM_FI_DEV_POWER_VIOLATION{gpu=2,GPU_I_ID=3} 5000000
DCGM_FI_DEV_POWER_VIOLATION{gpu=2,GPU_I_ID=7} 5000000
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=0} 7000
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=2,GPU_I_ID=3} 7000
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=2,GPU_I_ID=7} 7000
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=0} 4
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=1} 1
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=2,GPU_I_ID=3} 4
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=2,GPU_I_ID=7} 4
DCGM_FI_DEV_FB_TOTAL{gpu=0} 81920
DCGM_FI_DEV_FB_TOTAL{gpu=1} 15360
DCGM_FI_DEV_FB_TOTAL{gpu=2,GPU_I_ID=3} 9728
DCGM_FI_DEV_FB_TOTAL{gpu=2,GPU_I_ID=7} 4864
DCGM_FI_DEV_FB_FREE{gpu=0} 61440
DCGM_FI_DEV_FB_FREE{gpu=1} 14336
DCGM_FI_DEV_FB_FREE{gpu=2,GPU_I_ID=3} 1728
DCGM_FI_DEV_FB_FREE{gpu=2,GPU_I_ID=7} 4000
DCGM_FI_DEV_FB_USED{gpu=0} 19968
DCGM_FI_DEV_FB_USED{gpu=1} 1024
DCGM_FI_DEV_FB_USED{gpu=2,GPU_I_ID=3} 8000
DCGM_FI_DEV_FB_USED{gpu=2,GPU_I_ID=7} 864
DCGM_FI_DEV_FB_RESERVED{gpu=0} 512
DCGM_FI_DEV_FB_RESERVED{gpu=2,GPU_I_ID=3} 0
DCGM_FI_DEV_FB_RESERVED{gpu=2,GPU_I_ID=7} 0
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=0} 1
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=2,GPU_I_ID=3} 1
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=2,GPU_I_ID=7} 1
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=2,GPU_I_ID=3} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=2,GPU_I_ID=7} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=0} 17
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=2,GPU_I_ID=3} 17
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=2,GPU_I_ID=7} 17
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=0} 3
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=2,GPU_I_ID=3} 3
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=2,GPU_I_ID=7} 3
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=0} 1
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=3} 1
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=7} 1
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=0} 4
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=3} 4
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=7} 4
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=0} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=2,GPU_I_ID=3} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=2,GPU_I_ID=7} 0
gpufleet_gpu_up{gpu=0} 1
gpufleet_gpu_up{gpu=1} 1
gpufleet_gpu_up{gpu=2} 1
gpufleet_gpu_up{gpu=3,reason=gpu_lost} 0
"""


def test_nvml_exposition_is_pinned():
    nv = nvml_fleet()
    poller = Poller(NvmlBackend(nvml=nv), hostname="node-a", clock=Clock())
    poller.poll_telemetry()
    nv.gpus[3].lost = True
    nv.pending_xids.append((0, 79))
    poller.poll_telemetry()
    assert rows(poller.exposition()) == NVML_ROWS


SIM_H100 = {
    "hostname": "node-a",
    "model": "h100",
    "gpus": 4,
    "gpu": [
        {"index": 0, "utilization": 87, "tensor_active": 0.4123456789,
         "processes": [{"pid": 9, "used_memory_mib": 2048.7}], "xid": [{"at_s": 5, "code": 48}]},
        {"index": 1, "fields": {"DCGM_FI_DEV_GPU_TEMP": {"kind": "constant", "value": 92.5}}},
        {"index": 2, "mig": [{"profile": "1g.10gb", "utilization": 30}, {"profile": "3g.40gb"}], "utilization": 60,
         "processes": [{"pid": 5, "used_memory_mib": 1000, "gpu_instance_id": 2}]},
        {"index": 3, "utilization": 100, "lost_at_s": 10},
    ],
}
SIM_T4 = {"hostname": "node-a", "model": "t4", "gpus": 1, "gpu": [{"index": 0, "utilization": 0}]}

# Issue #14 added lines only: profiling by GPU generation (every H100 row, MIG instances too; the
# new SM occupancy and FP pipe fields); every line taken before it is unchanged.
SIM_ROWS = """\
DCGM_FI_DEV_SM_CLOCK{gpu=0} 1980
DCGM_FI_DEV_SM_CLOCK{gpu=1} 345
DCGM_FI_DEV_SM_CLOCK{gpu=2,GPU_I_ID=1} 1980
DCGM_FI_DEV_SM_CLOCK{gpu=2,GPU_I_ID=2} 1980
DCGM_FI_DEV_MEM_CLOCK{gpu=0} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=1} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=2,GPU_I_ID=1} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu=2,GPU_I_ID=2} 2619
DCGM_FI_DEV_MEMORY_TEMP{gpu=0} 73
DCGM_FI_DEV_MEMORY_TEMP{gpu=1} 34
DCGM_FI_DEV_MEMORY_TEMP{gpu=2,GPU_I_ID=1} 54
DCGM_FI_DEV_MEMORY_TEMP{gpu=2,GPU_I_ID=2} 54
DCGM_FI_DEV_GPU_TEMP{gpu=0} 69
DCGM_FI_DEV_GPU_TEMP{gpu=1} 92.5
DCGM_FI_DEV_GPU_TEMP{gpu=2,GPU_I_ID=1} 50
DCGM_FI_DEV_GPU_TEMP{gpu=2,GPU_I_ID=2} 50
DCGM_FI_DEV_POWER_USAGE{gpu=0} 563.29
DCGM_FI_DEV_POWER_USAGE{gpu=1} 70
DCGM_FI_DEV_POWER_USAGE{gpu=2,GPU_I_ID=1} 325.15
DCGM_FI_DEV_POWER_USAGE{gpu=2,GPU_I_ID=2} 325.15
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=0} 1008449350
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=1} 1001050000
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=2,GPU_I_ID=1} 1004877250
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=2,GPU_I_ID=2} 1004877250
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=0} 0
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=1} 0
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_GPU_UTIL{gpu=0} 87
DCGM_FI_DEV_GPU_UTIL{gpu=1} 0
DCGM_FI_DEV_MEM_COPY_UTIL{gpu=0} 35
DCGM_FI_DEV_MEM_COPY_UTIL{gpu=1} 0
DCGM_FI_DEV_ENC_UTIL{gpu=0} 0
DCGM_FI_DEV_ENC_UTIL{gpu=1} 0
DCGM_FI_DEV_DEC_UTIL{gpu=0} 0
DCGM_FI_DEV_DEC_UTIL{gpu=1} 0
DCGM_FI_DEV_XID_ERRORS{gpu=0} 48
DCGM_FI_DEV_XID_ERRORS{gpu=1} 0
DCGM_FI_DEV_XID_ERRORS{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_XID_ERRORS{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=0} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=1} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=0} 0
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=1} 0
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=0} 0
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=1} 1
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_FB_TOTAL{gpu=0} 81559
DCGM_FI_DEV_FB_TOTAL{gpu=1} 81559
DCGM_FI_DEV_FB_TOTAL{gpu=2,GPU_I_ID=1} 9856
DCGM_FI_DEV_FB_TOTAL{gpu=2,GPU_I_ID=2} 40192
DCGM_FI_DEV_FB_FREE{gpu=0} 79021
DCGM_FI_DEV_FB_FREE{gpu=1} 81070
DCGM_FI_DEV_FB_FREE{gpu=2,GPU_I_ID=1} 9856
DCGM_FI_DEV_FB_FREE{gpu=2,GPU_I_ID=2} 39192
DCGM_FI_DEV_FB_USED{gpu=0} 2049
DCGM_FI_DEV_FB_USED{gpu=1} 0
DCGM_FI_DEV_FB_USED{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_FB_USED{gpu=2,GPU_I_ID=2} 1000
DCGM_FI_DEV_FB_RESERVED{gpu=0} 489
DCGM_FI_DEV_FB_RESERVED{gpu=1} 489
DCGM_FI_DEV_FB_RESERVED{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_FB_RESERVED{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=1} 0
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=1} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=1} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=1} 0
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=0} 0
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=1} 0
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=0} 0
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=1} 0
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu=2,GPU_I_ID=2} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=0} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=1} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=2,GPU_I_ID=1} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu=2,GPU_I_ID=2} 0
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=0} 0.87
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=1} 0
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=2,GPU_I_ID=1} 0.3
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=2,GPU_I_ID=2} 0.6
DCGM_FI_PROF_SM_ACTIVE{gpu=0} 0.783
DCGM_FI_PROF_SM_ACTIVE{gpu=1} 0
DCGM_FI_PROF_SM_ACTIVE{gpu=2,GPU_I_ID=1} 0.27
DCGM_FI_PROF_SM_ACTIVE{gpu=2,GPU_I_ID=2} 0.54
DCGM_FI_PROF_SM_OCCUPANCY{gpu=0} 0.1305
DCGM_FI_PROF_SM_OCCUPANCY{gpu=1} 0
DCGM_FI_PROF_SM_OCCUPANCY{gpu=2,GPU_I_ID=1} 0.045
DCGM_FI_PROF_SM_OCCUPANCY{gpu=2,GPU_I_ID=2} 0.09
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=0} 0.412346
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=1} 0
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=2,GPU_I_ID=1} 0.12
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=2,GPU_I_ID=2} 0.24
DCGM_FI_PROF_DRAM_ACTIVE{gpu=0} 0.261
DCGM_FI_PROF_DRAM_ACTIVE{gpu=1} 0
DCGM_FI_PROF_DRAM_ACTIVE{gpu=2,GPU_I_ID=1} 0.09
DCGM_FI_PROF_DRAM_ACTIVE{gpu=2,GPU_I_ID=2} 0.18
DCGM_FI_PROF_PIPE_FP64_ACTIVE{gpu=0} 0
DCGM_FI_PROF_PIPE_FP64_ACTIVE{gpu=1} 0
DCGM_FI_PROF_PIPE_FP64_ACTIVE{gpu=2,GPU_I_ID=1} 0
DCGM_FI_PROF_PIPE_FP64_ACTIVE{gpu=2,GPU_I_ID=2} 0
DCGM_FI_PROF_PIPE_FP32_ACTIVE{gpu=0} 0.0435
DCGM_FI_PROF_PIPE_FP32_ACTIVE{gpu=1} 0
DCGM_FI_PROF_PIPE_FP32_ACTIVE{gpu=2,GPU_I_ID=1} 0.015
DCGM_FI_PROF_PIPE_FP32_ACTIVE{gpu=2,GPU_I_ID=2} 0.03
DCGM_FI_PROF_PIPE_FP16_ACTIVE{gpu=0} 0
DCGM_FI_PROF_PIPE_FP16_ACTIVE{gpu=1} 0
DCGM_FI_PROF_PIPE_FP16_ACTIVE{gpu=2,GPU_I_ID=1} 0
DCGM_FI_PROF_PIPE_FP16_ACTIVE{gpu=2,GPU_I_ID=2} 0
gpufleet_gpu_up{gpu=0} 1
gpufleet_gpu_up{gpu=1} 1
gpufleet_gpu_up{gpu=2} 1
gpufleet_gpu_up{gpu=3,reason=gpu_lost} 0
DCGM_FI_DEV_SM_CLOCK{gpu=0} 300
DCGM_FI_DEV_MEM_CLOCK{gpu=0} 5000
DCGM_FI_DEV_GPU_TEMP{gpu=0} 30
DCGM_FI_DEV_POWER_USAGE{gpu=0} 10
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=0} 1000150000
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu=0} 0
DCGM_FI_DEV_GPU_UTIL{gpu=0} 0
DCGM_FI_DEV_MEM_COPY_UTIL{gpu=0} 0
DCGM_FI_DEV_ENC_UTIL{gpu=0} 0
DCGM_FI_DEV_DEC_UTIL{gpu=0} 0
DCGM_FI_DEV_XID_ERRORS{gpu=0} 0
DCGM_FI_DEV_POWER_VIOLATION{gpu=0} 0
DCGM_FI_DEV_THERMAL_VIOLATION{gpu=0} 0
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=0} 1
DCGM_FI_DEV_FB_TOTAL{gpu=0} 15360
DCGM_FI_DEV_FB_FREE{gpu=0} 15268
DCGM_FI_DEV_FB_USED{gpu=0} 0
DCGM_FI_DEV_FB_RESERVED{gpu=0} 92
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu=0} 0
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu=0} 0
gpufleet_gpu_up{gpu=0} 1
"""


def test_sim_exposition_is_pinned():
    published = []
    for doc in (SIM_H100, SIM_T4):
        clock = Clock()
        poller = Poller(SimBackend(sim_scenario.parse(doc), clock=clock), hostname="node-a", clock=clock)
        poller.poll_telemetry()
        clock.t = 15.0  # energy grows by power x 15 s; GPU 3 is lost by now; the XID has fired
        poller.poll_telemetry()
        published.append(rows(poller.exposition()))
    assert "".join(published) == SIM_ROWS
