"""DCGM's profiling fields from NVML GPM (issue #14), against the fake pynvml and the replay of a
real H100 (../shared/data/nvml-h100/): on, off, MIG, failing mid-run, and what the exporter
publishes (promtool-clean)."""

from __future__ import annotations

import re
import subprocess

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.exporter.backends.gpm import GPM_FIELDS, reason_of
from gpufleet.exporter.backends.nvml import NvmlBackend
from gpufleet.exporter.fields import FIELDS
from gpufleet.exporter.poller import Poller
from tests.fakes.fake_pynvml import CAPTURE, GIB, FakeGpu, FakeMig, FakeNvml, h100_capture
from tests.realstack.prometheus import promtool_path

PROF = [name for name, *_ in GPM_FIELDS]
G = pynvml  # metric ids


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def poller(nv: FakeNvml) -> Poller:
    return Poller(NvmlBackend(nvml=nv), hostname="vm", clock=Clock())


def rows(p: Poller, prefix: str) -> dict[str, float]:
    """`name{labels}` -> value for the published lines starting with `prefix`."""
    out = {}
    for line in p.exposition().decode().splitlines():
        if line.startswith(prefix):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def prof(p: Poller, gpu: int = 0, gi: int | None = None) -> dict[str, float]:
    """The DCGM_FI_PROF_* values of one GPU (or MIG instance) row."""
    out = {}
    for key, v in rows(p, "DCGM_FI_PROF_").items():
        name, labels = key.split("{", 1)
        if f'gpu="{gpu}"' in labels and (gi is None) == ("GPU_I_ID" not in labels) and (gi is None or f'GPU_I_ID="{gi}"' in labels):
            out[name] = v
    return out


def health(p: Poller) -> dict[str, float]:
    """nvml_gpm's success and problem rows (duration and timestamps vary)."""
    return {k: v for k, v in rows(p, "gpufleet_collector_").items()
            if "nvml_gpm" in k and k.startswith(("gpufleet_collector_success", "gpufleet_collector_problems"))}


def test_every_gpm_field_is_a_per_instance_gauge_of_the_catalogue():
    assert len(PROF) == len(set(PROF)) == len([n for n in FIELDS if n.startswith("DCGM_FI_PROF_")])
    assert all(FIELDS[n].scope == "instance" and FIELDS[n].kind == "gauge" for n in PROF)


# --- on: the real H100 -----------------------------------------------------------------------


def test_h100_capture_publishes_the_profiling_fields_from_the_second_poll():
    nv = h100_capture()
    p = poller(nv)
    p.poll_telemetry()
    assert prof(p) == {}  # one sample is not a window yet: absent, not 0
    p.poll_telemetry()
    got = prof(p)
    w = nv.gpus[0].gpm_windows[0]  # the first window the H100 measured under load
    assert got == {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": pytest.approx(w[G.NVML_GPM_METRIC_GRAPHICS_UTIL] / 100),
        "DCGM_FI_PROF_SM_ACTIVE": pytest.approx(w[G.NVML_GPM_METRIC_SM_UTIL] / 100),
        "DCGM_FI_PROF_SM_OCCUPANCY": pytest.approx(w[G.NVML_GPM_METRIC_SM_OCCUPANCY] / 100),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": pytest.approx(w[G.NVML_GPM_METRIC_ANY_TENSOR_UTIL] / 100),
        "DCGM_FI_PROF_DRAM_ACTIVE": pytest.approx(w[G.NVML_GPM_METRIC_DRAM_BW_UTIL] / 100),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.0,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.0,
    }  # FP64, PCIe and NVLink were not captured: NotSupported in the replay, so absent
    assert got["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(0.935, abs=5e-4)
    assert got["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.963, abs=5e-4)
    assert health(p) == {
        'gpufleet_collector_success{collector="nvml_gpm"}': 1.0,
        'gpufleet_collector_problems_total{collector="nvml_gpm"}': 0.0,
    }
    # metrics a GPU answered NotSupported are not asked again; one sample per poll
    p.poll_telemetry()
    assert prof(p)["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(nv.gpus[0].gpm_windows[1][G.NVML_GPM_METRIC_ANY_TENSOR_UTIL] / 100)
    assert nv.calls[("nvmlGpmSampleGet", 0)] == 3 and nv.calls[("nvmlGpmMetricsGet", 0)] == 2
    assert nv.calls[("nvmlGpmQueryDeviceSupport", 0)] == 1


def test_h100_capture_idle_is_zero_not_absent():
    p = poller(h100_capture(load=False))
    p.poll_telemetry()
    p.poll_telemetry()
    got = prof(p)
    assert got["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.0 and got["DCGM_FI_PROF_SM_ACTIVE"] == 0.0
    assert 0 < got["DCGM_FI_PROF_DRAM_ACTIVE"] < 1e-5


def _dev_rows(text: str) -> dict[str, str]:
    """DCGM_FI_DEV_* lines of an exposition: name -> value text (one GPU)."""
    return {ln.split("{", 1)[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_")}


def test_replay_of_the_capture_publishes_what_the_exporter_published_on_the_h100():
    """Every DCGM_FI_DEV row of metrics_idle.prom (our exporter on that H100, at rest) comes out
    of the replay with the same value and labels, except the readings the probe took at another
    moment than the exporter: power, the energy counter, and the memory temperature (the probe
    kept no field value; the replay takes nvidia-smi's, read at a third moment)."""
    p = poller(h100_capture())
    p.poll_telemetry()
    ours = p.exposition().decode()
    real = (CAPTURE / "metrics_idle.prom").read_text()
    moments = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_MEMORY_TEMP"}
    a, b = _dev_rows(ours), _dev_rows(real)
    assert set(a) == set(b)
    assert {k: v for k, v in a.items() if k not in moments} == {k: v for k, v in b.items() if k not in moments}
    assert float(a["DCGM_FI_DEV_POWER_USAGE"]) == pytest.approx(float(b["DCGM_FI_DEV_POWER_USAGE"]), rel=0.01)
    assert abs(float(a["DCGM_FI_DEV_MEMORY_TEMP"]) - float(b["DCGM_FI_DEV_MEMORY_TEMP"])) <= 2
    assert 0 < float(b["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]) - float(a["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]) < 1e6
    label_sets = lambda t: {re.sub(r"^\w+", "", ln.rsplit(" ", 1)[0]) for ln in t.splitlines() if ln.startswith("DCGM_FI_DEV_")}  # noqa: E731
    assert label_sets(ours) == label_sets(real)
    # the behaviours seen there: no process in the window, and `used` 0 beside `reserved`
    p.poll_processes_and_jobs()
    assert 'gpufleet_gpu_compute_processes{gpu="0",UUID="GPU-ddd410c6-7d9d-a975-abed-7cedd4847d44",Hostname="vm"} 0' in p.exposition().decode()
    assert a["DCGM_FI_DEV_FB_USED"] == "0" and a["DCGM_FI_DEV_FB_RESERVED"] == "480"


# --- off ---------------------------------------------------------------------------------------


def test_a_gpu_without_gpm_publishes_no_profiling_field_and_no_gpm_health():
    t4 = FakeGpu(uuid="GPU-11111111-1111-4111-8111-111111111111", name="Tesla T4")  # gpm=None
    nv = FakeNvml([t4])
    p = poller(nv)
    for _ in range(3):
        p.poll_telemetry()
    assert rows(p, "DCGM_FI_PROF_") == {} and health(p) == {}
    assert rows(p, "DCGM_FI_DEV_GPU_UTIL")  # the rest flows
    assert nv.calls[("nvmlGpmSampleGet", 0)] == 0 and nv.calls[("nvmlGpmQueryDeviceSupport", 0)] == 1


@pytest.mark.parametrize("how", ["old_pynvml", "old_driver"])
def test_no_gpm_api_is_no_profiling_field(how):
    gpu = FakeGpu(uuid="GPU-00000000-0000-4000-8000-000000000000", gpm={G.NVML_GPM_METRIC_SM_UTIL: 50.0})
    if how == "old_pynvml":
        nv = FakeNvml([gpu], hidden={"nvmlGpmQueryDeviceSupport"})
    else:
        gpu.errors["nvmlGpmQueryDeviceSupport"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        nv = FakeNvml([gpu])
    p = poller(nv)
    p.poll_telemetry()
    p.poll_telemetry()
    assert rows(p, "DCGM_FI_PROF_") == {} and health(p) == {}


# --- MIG ---------------------------------------------------------------------------------------


def test_mig_instances_get_their_own_gpm_window():
    gpu = FakeGpu(
        uuid="GPU-22222222-2222-4222-8222-222222222222", mig_enabled=True,
        memory={"total": 80 * GIB, "reserved": 0, "free": 79 * GIB, "used": 1 * GIB},
        migs=[FakeMig(1, "MIG-1", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", {"total": 40 * GIB, "reserved": 0, "free": 40 * GIB, "used": 0}),
              FakeMig(2, "MIG-2", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", {"total": 40 * GIB, "reserved": 0, "free": 39 * GIB, "used": 1 * GIB})],
        gpm={},
        gpm_mig={1: {G.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0, G.NVML_GPM_METRIC_SM_UTIL: 80.0},
                 2: {G.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0, G.NVML_GPM_METRIC_SM_UTIL: 5.0}},
    )
    nv = FakeNvml([gpu])
    p = poller(nv)
    p.poll_telemetry()
    p.poll_telemetry()
    assert prof(p, 0, 1) == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.4, "DCGM_FI_PROF_SM_ACTIVE": 0.8}
    assert prof(p, 0, 2) == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0, "DCGM_FI_PROF_SM_ACTIVE": 0.05}
    assert prof(p, 0, None) == {}  # no whole-GPU row on a MIG GPU
    assert nv.calls[("nvmlGpmSampleGet", 0)] == 0 and nv.calls[("nvmlGpmMigSampleGet", 0)] == 4
    # an instance GPM cannot sample is left out, without a problem, and not asked again
    del gpu.gpm_mig[2]
    p.poll_telemetry()
    p.poll_telemetry()
    assert prof(p, 0, 2) == {} and prof(p, 0, 1)["DCGM_FI_PROF_SM_ACTIVE"] == 0.8
    assert health(p)['gpufleet_collector_problems_total{collector="nvml_gpm"}'] == 0
    assert nv.calls[("nvmlGpmMigSampleGet", 0)] == 4 + 2 + 1
    assert rows(p, "DCGM_FI_DEV_FB_USED")  # the instances' other fields flow


# --- failing mid-run ---------------------------------------------------------------------------


def two_h100s() -> FakeNvml:
    window = {G.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 50.0, G.NVML_GPM_METRIC_SM_UTIL: 90.0, G.NVML_GPM_METRIC_DRAM_BW_UTIL: 20.0}
    return FakeNvml([FakeGpu(uuid=f"GPU-{i}0000000-0000-4000-8000-000000000000", minor=i, gpm=dict(window)) for i in range(2)])


@pytest.mark.parametrize("call, code, reason", [
    ("nvmlGpmMetricsGet", pynvml.NVML_ERROR_UNKNOWN, "unknown"),
    ("nvmlGpmSampleGet", pynvml.NVML_ERROR_NO_PERMISSION, "no_permission"),
    ("nvmlGpmSampleGet", pynvml.NVML_ERROR_GPU_IS_LOST, "gpu_is_lost"),
])
def test_a_gpm_call_failing_mid_run_leaves_everything_else_flowing(call, code, reason):
    nv = two_h100s()
    p = poller(nv)
    p.poll_telemetry()
    p.poll_telemetry()
    assert prof(p, 0) and prof(p, 1)
    nv.gpus[0].errors[call] = code
    p.poll_telemetry()
    assert prof(p, 0) == {}  # absent, never 0 and never stale
    assert prof(p, 1) == {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.5, "DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_DRAM_ACTIVE": 0.2}
    up = rows(p, "gpufleet_gpu_up")
    assert list(up.values()) == [1.0, 1.0]  # GPM is not the GPU: both GPUs answer
    assert len(rows(p, "DCGM_FI_DEV_GPU_UTIL")) == 2
    assert health(p) == {
        'gpufleet_collector_success{collector="nvml_gpm"}': 0.0,
        f'gpufleet_collector_problems_total{{collector="nvml_gpm",reason="{reason}"}}': 1.0,
    }
    assert rows(p, 'gpufleet_collector_success{collector="nvml"}') == {'gpufleet_collector_success{collector="nvml"}': 1.0}
    del nv.gpus[0].errors[call]
    p.poll_telemetry()
    if call == "nvmlGpmSampleGet":
        assert prof(p, 0) == {}  # the failed sample broke the window: a fresh one starts
        p.poll_telemetry()
    assert prof(p, 0) == prof(p, 1)
    assert health(p)['gpufleet_collector_success{collector="nvml_gpm"}'] == 1.0
    assert health(p)[f'gpufleet_collector_problems_total{{collector="nvml_gpm",reason="{reason}"}}'] == 1.0


def test_samples_are_freed_at_close_and_reason_words():
    nv = two_h100s()
    b = NvmlBackend(nvml=nv)
    b.open()
    for _ in range(2):
        for g in b.devices():
            b.read(g)
    b.close()
    assert nv.calls[("nvmlGpmSampleAlloc", None)] == 4 and nv.calls[("nvmlGpmSampleFree", None)] == 4
    assert reason_of(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)) == "insufficient_size"
    assert reason_of(RuntimeError("x")) == "runtime_error"


# --- what the exporter publishes ---------------------------------------------------------------


@pytest.mark.realstack
def test_promtool_check_metrics_is_clean_on_the_gpufleet_families():
    nv = two_h100s()
    p = poller(nv)
    p.poll_telemetry()
    p.poll_telemetry()
    nv.gpus[1].errors["nvmlGpmMetricsGet"] = pynvml.NVML_ERROR_UNKNOWN
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    text = p.exposition()
    assert b'reason="unknown"' in text and b"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in text
    r = subprocess.run([promtool_path(), "check", "metrics"], input=text, capture_output=True, timeout=30)
    complaints = [ln for ln in (r.stdout + r.stderr).decode().splitlines() if ln.strip()]
    assert not any("error while linting" in ln or "parsing" in ln for ln in complaints), complaints
    assert [ln for ln in complaints if ln.startswith("gpufleet_")] == []
    # DCGM rows draw only the complaint dcgm-exporter's own label names (modelName) draw
    assert {ln.split(" ", 1)[1] for ln in complaints if ln.startswith("DCGM_FI_PROF")} <= {
        "label names should be written in 'snake_case' not 'camelCase'"}


_STATES = {"ok": None, "metrics": ("nvmlGpmMetricsGet", pynvml.NVML_ERROR_UNKNOWN), "sample": ("nvmlGpmSampleGet", pynvml.NVML_ERROR_TIMEOUT)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_STATES)), st.sampled_from(sorted(_STATES))), min_size=1, max_size=8))
def test_gpm_failures_only_ever_remove_that_gpus_profiling_fields(plan):
    """Whatever GPM does poll by poll: a GPU publishes the window's fields exactly when this poll's
    sample and metrics worked and the previous poll took a sample; every GPU stays up with its
    other fields; each failure is counted once."""
    nv = two_h100s()
    p = poller(nv)
    took_sample = [False, False]
    failures = 0
    for states in plan:
        for g, state in enumerate(states):
            nv.gpus[g].errors = dict([_STATES[state]]) if _STATES[state] else {}
        p.poll_telemetry()
        for g, state in enumerate(states):
            expect = state == "ok" and took_sample[g]
            assert bool(prof(p, g)) == expect, (plan, g)
            # a metrics call is made (and can fail) only when there is a window to measure
            failures += state == "sample" or (state == "metrics" and took_sample[g])
            took_sample[g] = state != "sample"
        assert list(rows(p, "gpufleet_gpu_up").values()) == [1.0, 1.0]
        assert len(rows(p, "DCGM_FI_DEV_GPU_UTIL")) == 2
    counted = sum(v for k, v in rows(p, "gpufleet_collector_problems_total").items() if "nvml_gpm" in k)
    assert counted == failures


def test_a_failing_health_report_does_not_stop_telemetry(caplog):
    nv = two_h100s()
    b = NvmlBackend(nvml=nv)

    def broken() -> dict:
        raise RuntimeError("health exploded")

    b.health = broken  # type: ignore[method-assign]
    p = Poller(b, hostname="vm", clock=Clock())
    p.poll_telemetry()
    p.poll_telemetry()
    assert prof(p, 0) and list(rows(p, "gpufleet_gpu_up").values()) == [1.0, 1.0]
    assert "backend health report failed: health exploded" in caplog.text
    assert health(p) == {}


def test_windows_of_a_gpu_that_changes_mig_mode_are_freed():
    gpu = FakeGpu(uuid="GPU-33333333-3333-4333-8333-333333333333", gpm={G.NVML_GPM_METRIC_SM_UTIL: 50.0},
                  migs=[FakeMig(1, "MIG-1", "NVIDIA H100 80GB HBM3 MIG 7g.80gb", {"total": 80 * GIB, "reserved": 0, "free": 80 * GIB, "used": 0})],
                  gpm_mig={1: {G.NVML_GPM_METRIC_SM_UTIL: 25.0}})
    nv = FakeNvml([gpu])
    b = NvmlBackend(nvml=nv)
    b.open()
    for _ in range(2):
        [g] = b.devices()
        r = b.read(g)
    assert r.fields["DCGM_FI_PROF_SM_ACTIVE"] == 0.5
    gpu.mig_enabled = True
    for _ in range(2):
        [g] = b.devices()
        r = b.read(g)
    assert r.instance_fields[1]["DCGM_FI_PROF_SM_ACTIVE"] == 0.25 and "DCGM_FI_PROF_SM_ACTIVE" not in r.fields
    assert nv.calls[("nvmlGpmSampleFree", None)] == 2  # the whole GPU's pair
    b.close()
    assert nv.calls[("nvmlGpmSampleFree", None)] == 4 == nv.calls[("nvmlGpmSampleAlloc", None)]
