"""The NVML backend against a fake pynvml that raises the real pynvml error classes."""

from __future__ import annotations

import logging
import sys

import pynvml
import pytest

from gpufleet.exporter.backends.nvml import NvmlBackend, mig_profile_from_name, normalize_pci_bus_id
from gpufleet.exporter.fields import FIELDS
from gpufleet.exporter.model import BackendUnavailable, GpuError, GpuIdentity, GpuProcess
from tests.fakes.fake_pynvml import GIB, MIB, FakeGpu, FakeMig, FakeNvml, process  # noqa: E402

UUID0 = "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"
UUID1 = "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"
UUID2 = "GPU-5022ce43-b44a-987b-71c3-dee05378a618"


def make(*gpus: FakeGpu, **kw) -> tuple[NvmlBackend, FakeNvml]:
    nv = FakeNvml(list(gpus), **kw)
    b = NvmlBackend(nvml=nv)
    b.open()
    return b, nv


def a100_mig() -> FakeGpu:
    """A100 40GB in MIG mode: two 1g.5gb instances and one 2g.10gb, with an empty slot between."""
    return FakeGpu(
        uuid=UUID2,
        name="NVIDIA A100-SXM4-40GB",
        minor=2,
        pci_bus_id="00000000:53:00.0",
        mig_enabled=True,
        memory={"total": 40 * GIB, "reserved": 0, "free": 39 * GIB, "used": 1 * GIB},
        migs=[
            FakeMig(7, "MIG-aaaaaaaa-1111-5dbc-a76e-26cc100d9b55", "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                    {"total": 4864 * MIB, "reserved": 0, "free": 4000 * MIB, "used": 864 * MIB}, slot=0),
            FakeMig(3, "MIG-bbbbbbbb-2222-5e6d-8c7b-6a5f4e3d2c1b", "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
                    {"total": 9728 * MIB, "reserved": 0, "free": 1728 * MIB, "used": 8000 * MIB}, slot=2),
            FakeMig(8, "MIG-cccccccc-3333-4798-8a9b-0c1d2e3f4a5b", "NVIDIA A100-SXM4-40GB MIG 1c.1g.5gb",
                    {"total": 4864 * MIB, "reserved": 0, "free": 4864 * MIB, "used": 0}, slot=5),
        ],
    )


# --- open / close ----------------------------------------------------------------------------


def test_library_missing_is_backend_unavailable_with_hint():
    nv = FakeNvml([FakeGpu(uuid=UUID0)], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(BackendUnavailable) as ei:
        NvmlBackend(nvml=nv).open()
    msg = str(ei.value)
    assert "NVML library not found (libnvidia-ml.so.1)" in msg
    assert "NVIDIA driver installed" in msg


def _real_nvml_loadable() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_real_nvml_loadable(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_driver_is_backend_unavailable():
    b = NvmlBackend()  # the real pynvml, imported lazily in open()
    with pytest.raises(BackendUnavailable, match=r"NVML library not found \(libnvidia-ml.so.1\)"):
        b.open()
    assert b.driver_version() == ""
    b.close()


def test_driver_not_loaded_and_other_init_errors_are_backend_unavailable():
    nv = FakeNvml([FakeGpu(uuid=UUID0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable, match="driver not loaded.*lsmod"):
        NvmlBackend(nvml=nv).open()
    nv = FakeNvml([FakeGpu(uuid=UUID0)], init_error=pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendUnavailable, match="nvmlInit failed .*Unknown Error"):
        NvmlBackend(nvml=nv).open()


def test_missing_pynvml_module_is_backend_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(BackendUnavailable, match="nvidia-ml-py"):
        NvmlBackend().open()


def test_module_imports_without_pynvml(monkeypatch):
    """Importing the backend module must not need pynvml (nor a driver): only open() does."""
    import importlib

    import gpufleet.exporter.backends.nvml as mod

    monkeypatch.setitem(sys.modules, "pynvml", None)
    importlib.reload(mod)
    assert mod.NvmlBackend.name == "nvml"


def test_device_count_failure_is_backend_unavailable_and_shuts_down():
    nv = FakeNvml([FakeGpu(uuid=UUID0)])
    nv.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    with pytest.raises(BackendUnavailable, match="nvmlDeviceGetCount failed"):
        NvmlBackend(nvml=nv).open()
    assert nv.shutdown_count == 1


def test_close_frees_event_set_and_shuts_down_and_ignores_errors():
    b, nv = make(FakeGpu(uuid=UUID0))
    b.close()
    assert nv.event_sets_freed == 1
    assert nv.shutdown_count == 1
    assert not nv.initialized
    b.close()  # second close: nothing to do, no error
    b2, nv2 = make(FakeGpu(uuid=UUID0))
    nv2.hidden.add("nvmlEventSetFree")  # an error inside close is swallowed
    b2.close()
    assert nv2.shutdown_count == 1


def test_driver_version_str_and_bytes():
    b, _ = make(FakeGpu(uuid=UUID0), driver="550.90.07")
    assert b.driver_version() == "550.90.07"
    b, _ = make(FakeGpu(uuid=UUID0), driver="535.129.03", bytes_strings=True)
    assert b.driver_version() == "535.129.03"


# --- devices -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_bytes", [False, True])
def test_devices_identity_str_and_bytes(as_bytes):
    g0 = FakeGpu(uuid=UUID0, name="NVIDIA H100 80GB HBM3", minor=3, pci_bus_id="00000000:37:00.0")
    g1 = FakeGpu(uuid=UUID1, name="Tesla T4", minor=0, pci_bus_id="0000:ca:00.0")
    b, _ = make(g0, g1, bytes_strings=as_bytes)
    devs = b.devices()
    assert devs == [
        GpuIdentity(index=0, uuid=UUID0, model="NVIDIA H100 80GB HBM3", minor_number=3, pci_bus_id="00000000:37:00.0"),
        GpuIdentity(index=1, uuid=UUID1, model="Tesla T4", minor_number=0, pci_bus_id="00000000:CA:00.0"),
    ]
    assert all(isinstance(d.uuid, str) and isinstance(d.model, str) for d in devs)


def test_devices_static_identity_read_once():
    b, nv = make(FakeGpu(uuid=UUID0))
    b.devices()
    b.devices()
    b.devices()
    assert nv.calls[("nvmlDeviceGetUUID", 0)] == 1
    assert nv.calls[("nvmlDeviceGetPciInfo", 0)] == 1
    assert nv.calls[("nvmlDeviceGetHandleByIndex", None)] == 1


def test_minor_number_unsupported_is_none():
    b, _ = make(FakeGpu(uuid=UUID0, unsupported={"nvmlDeviceGetMinorNumber"}))
    assert b.devices()[0].minor_number is None


@pytest.mark.parametrize(
    "raw, want",
    [
        ("00000000:37:00.0", "00000000:37:00.0"),
        (b"00000000:b9:00.0", "00000000:B9:00.0"),
        ("0000:ca:00.0", "00000000:CA:00.0"),
        ("0001:3b:00.1", "00000001:3B:00.1"),
        ("3b:00.0", "00000000:3B:00.0"),
        (b"00000000:1A:00.0\x00", "00000000:1A:00.0"),
    ],
)
def test_pci_bus_id_normalised_like_dcgm_exporter(raw, want):
    assert normalize_pci_bus_id(raw) == want


@pytest.mark.parametrize(
    "name, profile",
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        (b"NVIDIA A800-SXM4-80GB MIG 2g.20gb", "2g.20gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb", "2g.10gb"),
        ("NVIDIA H200 MIG 7g.141gb", "7g.141gb"),
    ],
)
def test_mig_profile_from_name(name, profile):
    assert mig_profile_from_name(name) == profile


def test_mig_instances_discovered_with_profile_gi_and_uuid():
    b, nv = make(FakeGpu(uuid=UUID0), a100_mig())
    devs = b.devices()
    assert devs[0].mig_instances == ()
    mig = devs[1].mig_instances
    assert [(m.gpu_instance_id, m.profile, m.uuid) for m in mig] == [
        (3, "2g.10gb", "MIG-bbbbbbbb-2222-5e6d-8c7b-6a5f4e3d2c1b"),
        (7, "1g.5gb", "MIG-aaaaaaaa-1111-5dbc-a76e-26cc100d9b55"),
        (8, "1g.5gb", "MIG-cccccccc-3333-4798-8a9b-0c1d2e3f4a5b"),
    ]
    # Empty slots (NotFound) and out-of-range (InvalidArgument) were skipped, not fatal.
    assert nv.calls[("nvmlDeviceGetMigDeviceHandleByIndex", 1)] == 7


def test_mig_bytes_names():
    b, _ = make(a100_mig(), bytes_strings=True)
    mig = b.devices()[0].mig_instances
    assert {m.profile for m in mig} == {"1g.5gb", "2g.10gb"}
    assert all(isinstance(m.uuid, str) and m.uuid.startswith("MIG-") for m in mig)


# --- read ----------------------------------------------------------------------------------


def test_read_all_fields_with_dcgm_units():
    g = FakeGpu(
        uuid=UUID0,
        util=(87, 41),
        enc=(3, 167000),
        dec=(5, 167000),
        memory={"total": 81559 * MIB, "reserved": 527 * MIB, "free": 60000 * MIB + 123, "used": 21032 * MIB},
        power_mw=68244,
        energy_mj=123456789,
        temp_gpu=41,
        memory_temp=38,
        sm_clock=1980,
        mem_clock=2619,
        pcie_replay=2,
        remapped_rows=(4, 1, 1, 1),
        clocks_event_reasons=0x4,
    )
    b, _ = make(g)
    gpu = b.devices()[0]
    r = b.read(gpu)
    assert r.fields == {
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 41,
        "DCGM_FI_DEV_ENC_UTIL": 3,
        "DCGM_FI_DEV_DEC_UTIL": 5,
        "DCGM_FI_DEV_FB_TOTAL": 81559,
        "DCGM_FI_DEV_FB_FREE": 60000,  # floored, as DCGM
        "DCGM_FI_DEV_FB_USED": 21032,
        "DCGM_FI_DEV_FB_RESERVED": 527,
        "DCGM_FI_DEV_POWER_USAGE": pytest.approx(68.244),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789,
        "DCGM_FI_DEV_GPU_TEMP": 41,
        "DCGM_FI_DEV_MEMORY_TEMP": 38,
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 2,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 1,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 17,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 3,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 4,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 4,
        "DCGM_FI_DEV_POWER_VIOLATION": 5_000_000,
        "DCGM_FI_DEV_THERMAL_VIOLATION": 7_000,
        "DCGM_FI_DEV_XID_ERRORS": 0,
    }
    assert r.instance_fields == {}
    assert set(r.fields) <= set(FIELDS), "every name must be in the field catalogue"


def test_unsupported_fields_absent_not_zero_and_not_retried():
    g = FakeGpu(
        uuid=UUID1,
        name="Tesla T4",
        unsupported={
            "nvmlDeviceGetPcieReplayCounter",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetEncoderUtilization",
        },
        field_values={},  # memory temperature: nvmlReturn NotSupported inside the field value
    )
    b, nv = make(g)
    gpu = b.devices()[0]
    for _ in range(5):
        f = b.read(gpu).fields
        for name in (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "DCGM_FI_DEV_ENC_UTIL",
            "DCGM_FI_DEV_MEMORY_TEMP",
        ):
            assert name not in f
        assert f["DCGM_FI_DEV_GPU_UTIL"] == 87
        assert f["DCGM_FI_DEV_DEC_UTIL"] == 5
    # Each unsupported call was made once, not once per poll; supported ones every poll.
    assert nv.calls[("nvmlDeviceGetPcieReplayCounter", 0)] == 1
    assert nv.calls[("nvmlDeviceGetRemappedRows", 0)] == 1
    assert nv.calls[("nvmlDeviceGetTotalEnergyConsumption", 0)] == 1
    assert nv.calls[("nvmlDeviceGetTotalEccErrors", 0)] == 4  # four counters, once each
    assert nv.calls[("nvmlDeviceGetFieldValues", 0)] == 1
    assert nv.calls[("nvmlDeviceGetPowerUsage", 0)] == 5


def test_no_permission_and_not_found_are_absent_but_retried():
    g = FakeGpu(uuid=UUID0, errors={
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetPcieReplayCounter": pynvml.NVML_ERROR_NOT_FOUND,
    })
    b, nv = make(g)
    gpu = b.devices()[0]
    f = b.read(gpu).fields
    assert "DCGM_FI_DEV_POWER_USAGE" not in f and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" not in f
    del g.errors["nvmlDeviceGetPowerUsage"]
    f = b.read(gpu).fields
    assert f["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(68.244)
    assert nv.calls[("nvmlDeviceGetPcieReplayCounter", 0)] == 2


def test_old_pynvml_without_functions_leaves_fields_out():
    """An old nvidia-ml-py lacks some functions entirely (AttributeError)."""
    b, nv = make(FakeGpu(uuid=UUID0), hidden={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEnergyConsumption"})
    f = b.read(b.devices()[0]).fields
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" not in f
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" not in f
    assert f["DCGM_FI_DEV_GPU_TEMP"] == 41


@pytest.mark.parametrize("how", ["hidden", "function_not_found"])
def test_clock_reasons_fall_back_to_throttle_reasons(how):
    g = FakeGpu(uuid=UUID0, clocks_event_reasons=0x20)
    kw = {}
    if how == "hidden":
        kw["hidden"] = {"nvmlDeviceGetCurrentClocksEventReasons"}
    else:
        g.errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    b, nv = make(g, **kw)
    gpu = b.devices()[0]
    assert b.read(gpu).fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x20
    assert b.read(gpu).fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x20
    assert nv.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 2
    assert nv.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] <= 1


def test_clock_reasons_not_supported_does_not_fall_back():
    g = FakeGpu(uuid=UUID0, unsupported={"nvmlDeviceGetCurrentClocksEventReasons"})
    b, nv = make(g)
    gpu = b.devices()[0]
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in b.read(gpu).fields
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in b.read(gpu).fields
    assert nv.calls[("nvmlDeviceGetCurrentClocksThrottleReasons", 0)] == 0
    assert nv.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 1


def test_memory_v1_fallback_has_no_reserved():
    g = FakeGpu(uuid=UUID0, errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND},
                memory={"total": 16 * GIB, "reserved": 256 * MIB, "free": 15 * GIB, "used": 768 * MIB})
    b, nv = make(g)
    gpu = b.devices()[0]
    for _ in range(3):
        f = b.read(gpu).fields
        assert "DCGM_FI_DEV_FB_RESERVED" not in f
        assert (f["DCGM_FI_DEV_FB_TOTAL"], f["DCGM_FI_DEV_FB_FREE"], f["DCGM_FI_DEV_FB_USED"]) == (16384, 15360, 1024)
    assert nv.calls[("nvmlDeviceGetMemoryInfo_v2", 0)] == 1
    assert nv.calls[("nvmlDeviceGetMemoryInfo", 0)] == 3


def test_gpu_lost_mid_run_fails_only_that_gpu():
    g0, g1 = FakeGpu(uuid=UUID0), FakeGpu(uuid=UUID1, minor=1, pci_bus_id="00000000:B9:00.0")
    b, nv = make(g0, g1)
    devs = b.devices()
    assert b.read(devs[0]).fields["DCGM_FI_DEV_GPU_TEMP"] == 41
    g0.lost = True
    with pytest.raises(GpuError) as ei:
        b.read(devs[0])
    assert ei.value.reason == "gpu_lost"
    assert b.read(devs[1]).fields["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(68.244)
    with pytest.raises(GpuError) as ei:
        b.processes(devs[0])
    assert ei.value.reason == "gpu_lost"
    # The lost GPU keeps its identity so it can keep reporting its error state.
    assert [d.uuid for d in b.devices()] == [UUID0, UUID1]
    with pytest.raises(GpuError):
        b.read(devs[0])


@pytest.mark.parametrize(
    "code, reason",
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "gpu_lost"),
        (pynvml.NVML_ERROR_GPU_NOT_FOUND, "gpu_not_found"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, "reset_required"),
        (pynvml.NVML_ERROR_IRQ_ISSUE, "irq_issue"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded"),
        (pynvml.NVML_ERROR_UNINITIALIZED, "nvml_uninitialized"),
        (pynvml.NVML_ERROR_UNKNOWN, "unknown_error"),
    ],
)
def test_fatal_errors_map_to_reason_words(code, reason):
    g = FakeGpu(uuid=UUID0)
    b, nv = make(g)
    gpu = b.devices()[0]
    g.errors["nvmlDeviceGetTemperature"] = code
    with pytest.raises(GpuError) as ei:
        b.read(gpu)
    assert ei.value.reason == reason
    assert "GPU 0" in str(ei.value)


def test_fatal_error_in_field_value_return_is_gpu_error():
    g = FakeGpu(uuid=UUID0)
    b, nv = make(g)
    gpu = b.devices()[0]
    orig = nv.nvmlDeviceGetFieldValues

    def lost_field(handle, ids):
        vals = orig(handle, ids)
        vals[0].nvmlReturn = pynvml.NVML_ERROR_GPU_IS_LOST
        return vals

    nv.nvmlDeviceGetFieldValues = lost_field
    with pytest.raises(GpuError) as ei:
        b.read(gpu)
    assert ei.value.reason == "gpu_lost"


def test_gpu_lost_at_open_is_skipped_until_it_answers(caplog):
    g0, g1 = FakeGpu(uuid=UUID0, lost=True), FakeGpu(uuid=UUID1)
    with caplog.at_level(logging.WARNING):
        b, _ = make(g0, g1)
        devs = b.devices()
    assert [d.index for d in devs] == [1]
    with pytest.raises(GpuError) as ei:
        b.read(GpuIdentity(index=0, uuid=UUID0, model="x"))
    assert ei.value.reason == "gpu_lost"


# --- MIG -----------------------------------------------------------------------------------


def test_mig_gpu_has_no_gpu_util_and_per_instance_fb():
    b, nv = make(FakeGpu(uuid=UUID0), a100_mig())
    devs = b.devices()
    r = b.read(devs[1])
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"):
        assert name not in r.fields
    assert nv.calls[("nvmlDeviceGetUtilizationRates", 1)] == 0
    # Device-level values are still there.
    assert r.fields["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(68.244)
    assert r.fields["DCGM_FI_DEV_FB_TOTAL"] == 40960
    assert r.instance_fields == {
        3: {"DCGM_FI_DEV_FB_TOTAL": 9728, "DCGM_FI_DEV_FB_FREE": 1728, "DCGM_FI_DEV_FB_USED": 8000,
            "DCGM_FI_DEV_FB_RESERVED": 0},
        7: {"DCGM_FI_DEV_FB_TOTAL": 4864, "DCGM_FI_DEV_FB_FREE": 4000, "DCGM_FI_DEV_FB_USED": 864,
            "DCGM_FI_DEV_FB_RESERVED": 0},
        8: {"DCGM_FI_DEV_FB_TOTAL": 4864, "DCGM_FI_DEV_FB_FREE": 4864, "DCGM_FI_DEV_FB_USED": 0,
            "DCGM_FI_DEV_FB_RESERVED": 0},
    }
    for fields in r.instance_fields.values():
        assert all(FIELDS[n].scope == "instance" for n in fields)
    # The non-MIG GPU still has utilization.
    assert b.read(devs[0]).fields["DCGM_FI_DEV_GPU_UTIL"] == 87


def test_mig_enabled_without_instances_still_skips_gpu_util():
    g = a100_mig()
    g.migs = []
    b, nv = make(g)
    gpu = b.devices()[0]
    assert gpu.mig_instances == ()
    r = b.read(gpu)
    assert "DCGM_FI_DEV_GPU_UTIL" not in r.fields and r.instance_fields == {}


def test_mig_layout_change_is_seen_on_next_devices_call():
    g = a100_mig()
    b, _ = make(g)
    assert len(b.devices()[0].mig_instances) == 3
    g.migs = g.migs[:1]
    gpu = b.devices()[0]
    assert [m.gpu_instance_id for m in gpu.mig_instances] == [7]
    assert set(b.read(gpu).instance_fields) == {7}


# --- processes -----------------------------------------------------------------------------


def test_processes_sentinels_and_sm_util():
    g = FakeGpu(
        uuid=UUID0,
        processes=[
            process(1111, 20 * GIB),
            process(2222, None),  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None (WDDM, no permission)
            process(3333, pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value, gi=3, ci=0),
        ],
        proc_samples=[(1111, 1_000, 40), (1111, 2_000, 55), (3333, 1_500, 7)],
    )
    b, nv = make(g)
    gpu = b.devices()[0]
    assert b.processes(gpu) == [
        GpuProcess(pid=1111, used_memory_bytes=20 * GIB, gpu_instance_id=None, sm_utilization=55.0),
        GpuProcess(pid=2222, used_memory_bytes=None, gpu_instance_id=None, sm_utilization=None),
        GpuProcess(pid=3333, used_memory_bytes=None, gpu_instance_id=3, sm_utilization=7.0),
    ]
    # Next poll: no sample newer than the last timestamp (NotFound) -> None, not 0, not stale.
    procs = b.processes(gpu)
    assert [p.sm_utilization for p in procs] == [None, None, None]
    g.proc_samples.append((2222, 3_000, 90))
    procs = b.processes(gpu)
    assert {p.pid: p.sm_utilization for p in procs} == {1111: None, 2222: 90.0, 3333: None}


def test_no_processes_does_not_ask_for_utilization():
    b, nv = make(FakeGpu(uuid=UUID0))
    assert b.processes(b.devices()[0]) == []
    assert nv.calls[("nvmlDeviceGetProcessUtilization", 0)] == 0


def test_process_utilization_unsupported_leaves_util_none():
    g = FakeGpu(uuid=UUID0, processes=[process(42, 1024)], unsupported={"nvmlDeviceGetProcessUtilization"})
    b, nv = make(g)
    gpu = b.devices()[0]
    assert b.processes(gpu) == [GpuProcess(pid=42, used_memory_bytes=1024)]
    b.processes(gpu)
    assert nv.calls[("nvmlDeviceGetProcessUtilization", 0)] == 1


# --- XID -----------------------------------------------------------------------------------


def test_xid_events_drained_and_last_code_kept():
    g0, g1 = FakeGpu(uuid=UUID0), FakeGpu(uuid=UUID1)
    b, nv = make(g0, g1)
    devs = b.devices()
    assert b.xid_events() == []
    assert b.read(devs[1]).fields["DCGM_FI_DEV_XID_ERRORS"] == 0
    nv.pending_xids += [(1, 79), (0, 13), (1, 48)]
    events = b.xid_events()
    assert [(e.gpu_index, e.xid) for e in events] == [(1, 79), (0, 13), (1, 48)]
    assert all(e.timestamp > 0 for e in events)
    assert b.xid_events() == []  # drained
    assert b.read(devs[0]).fields["DCGM_FI_DEV_XID_ERRORS"] == 13
    assert b.read(devs[1]).fields["DCGM_FI_DEV_XID_ERRORS"] == 48


def test_xid_field_absent_where_registration_unsupported():
    g0, g1 = FakeGpu(uuid=UUID0, xid_supported=False), FakeGpu(uuid=UUID1)
    b, nv = make(g0, g1)
    devs = b.devices()
    assert "DCGM_FI_DEV_XID_ERRORS" not in b.read(devs[0]).fields
    assert b.read(devs[1]).fields["DCGM_FI_DEV_XID_ERRORS"] == 0


def test_xid_field_absent_when_event_set_cannot_be_created():
    b, nv = make(FakeGpu(uuid=UUID0), hidden={"nvmlEventSetCreate"})
    assert "DCGM_FI_DEV_XID_ERRORS" not in b.read(b.devices()[0]).fields
    assert b.xid_events() == []


def test_xid_event_resolves_ctypes_handles_by_address():
    """Real handles are ctypes pointers; the event's handle is a new object for the same device."""
    import ctypes

    from gpufleet.exporter.backends.nvml import _handle_key

    a = pynvml.c_nvmlDevice_t(ctypes.cast(0x1234, pynvml.c_nvmlDevice_t).contents)
    a2 = ctypes.cast(0x1234, pynvml.c_nvmlDevice_t)
    assert a is not a2 and _handle_key(a) == _handle_key(a2) == 0x1234


# --- cost ----------------------------------------------------------------------------------


def test_poll_cost_is_small():
    """8 GPUs, read + processes + xid drain, must stay far below 0.5% of a core at 15 s (75 ms)."""
    import time

    gpus = [FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", unsupported={"nvmlDeviceGetPcieReplayCounter"})
            for i in range(8)]
    b, nv = make(*gpus)
    devs = b.devices()
    t0 = time.perf_counter()
    for _ in range(20):
        b.xid_events()
        for d in devs:
            b.read(d)
            b.processes(d)
    per_poll = (time.perf_counter() - t0) / 20
    assert per_poll < 0.075
