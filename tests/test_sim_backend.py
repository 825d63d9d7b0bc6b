"""The simulated backend and its scenario files: values follow the traces; bad files fail clearly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.exporter.backends import sim_scenario
from gpufleet.exporter.fields import FIELDS
from gpufleet.exporter.backends.sim import SimBackend
from gpufleet.exporter.model import GpuError
from gpufleet.config import ConfigError


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(doc: dict, clock: Clock | None = None) -> SimBackend:
    b = SimBackend(sim_scenario.parse(doc), clock=clock or Clock())
    b.open()
    return b


def test_identity_minor_numbers_and_defaults():
    b = backend({"hostname": "n1", "model": "a100", "gpus": 4, "minor_numbers": [7, 5, 3, 1]})
    devs = b.devices()
    assert [d.index for d in devs] == [0, 1, 2, 3]
    assert [d.minor_number for d in devs] == [7, 5, 3, 1]
    assert {d.model for d in devs} == {"NVIDIA A100-SXM4-80GB"}
    assert len({d.uuid for d in devs}) == 4 and all(d.uuid.startswith("GPU-") for d in devs)
    # deterministic: same host and index give the same UUID
    assert backend({"hostname": "n1", "model": "a100", "gpus": 4}).devices()[2].uuid == devs[2].uuid


def test_steps_trace_power_and_energy_follow_utilization():
    clock = Clock(0.0)
    b = backend({"hostname": "n", "model": "h100", "gpus": 1, "gpu": [{"index": 0, "utilization": {"kind": "steps", "points": [[0, 0], [100, 100]]}}]}, clock)
    g = b.devices()[0]
    r0 = b.read(g).fields
    assert r0["DCGM_FI_DEV_GPU_UTIL"] == 0
    assert r0["DCGM_FI_DEV_POWER_USAGE"] == 70  # H100 idle watts
    clock.t = 100.0
    r1 = b.read(g).fields
    assert r1["DCGM_FI_DEV_GPU_UTIL"] == 100
    # 70 + (700 - 70) * 0.9 * 100/100 = 637 W
    assert r1["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(637.0)
    # energy grows by power at the read x elapsed: 637 W * 100 s = 63,700 J = 63,700,000 mJ
    assert r1["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] - r0["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 63_700_000


def test_memory_is_the_sum_of_live_processes():
    clock = Clock(0.0)
    procs = [{"pid": 1, "used_memory_mib": 1000, "end_s": 50}, {"pid": 2, "used_memory_mib": 2500, "start_s": 10}]
    b = backend({"model": "h100", "gpus": 1, "gpu": [{"index": 0, "processes": procs}]}, clock)
    g = b.devices()[0]
    clock.t = 20.0
    f = b.read(g).fields
    assert f["DCGM_FI_DEV_FB_USED"] == 3500
    # total 81559, reserved round(81559 * 0.006) = 489, free = 81559 - 489 - 3500
    assert f["DCGM_FI_DEV_FB_RESERVED"] == 489
    assert f["DCGM_FI_DEV_FB_FREE"] == 81559 - 489 - 3500
    assert [p.pid for p in b.processes(g)] == [1, 2]
    clock.t = 60.0
    assert [p.pid for p in b.processes(g)] == [2]
    assert b.processes(g)[0].used_memory_bytes == 2500 * 1024 * 1024


def test_unsupported_fields_are_absent_not_zero():
    t4 = backend({"model": "t4", "gpus": 1})
    f = t4.read(t4.devices()[0]).fields
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in f
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in f
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in f  # no GPM on a T4, and no dcgm-exporter
    h = backend({"model": "h100", "gpus": 1})
    assert "DCGM_FI_DEV_MEMORY_TEMP" in h.read(h.devices()[0]).fields


def test_xid_events_once_each_and_lost_gpu():
    clock = Clock(0.0)
    b = backend({"model": "h100", "gpus": 2, "gpu": [{"index": 1, "xid": [{"at_s": 10, "code": 48}, {"at_s": 30, "code": 79}], "lost_at_s": 30}]}, clock)
    g0, g1 = b.devices()
    assert b.xid_events() == []
    clock.t = 15.0
    assert [(e.gpu_index, e.xid) for e in b.xid_events()] == [(1, 48)]
    assert b.xid_events() == []  # drained
    assert b.read(g1).fields["DCGM_FI_DEV_XID_ERRORS"] == 48
    clock.t = 31.0
    assert [(e.gpu_index, e.xid) for e in b.xid_events()] == [(1, 79)]
    with pytest.raises(GpuError) as err:
        b.read(g1)
    assert err.value.reason == "gpu_lost"
    assert b.read(g0).fields["DCGM_FI_DEV_GPU_UTIL"] == 0  # the other GPU still reads


def test_mig_instances_have_their_own_memory_and_no_gpu_util():
    doc = {"model": "a100", "profiling": "dcgm", "gpus": 1, "gpu": [{"index": 0, "mig": ["3g.40gb", {"profile": "2g.20gb", "utilization": 80}],
           "processes": [{"pid": 5, "used_memory_mib": 1000, "gpu_instance_id": 2}]}]}
    b = backend(doc)
    g = b.devices()[0]
    assert [(m.gpu_instance_id, m.profile) for m in g.mig_instances] == [(1, "3g.40gb"), (2, "2g.20gb")]
    assert all(m.uuid.startswith("MIG-") for m in g.mig_instances)
    r = b.read(g)
    assert "DCGM_FI_DEV_GPU_UTIL" not in r.fields
    assert r.instance_fields[1]["DCGM_FI_DEV_FB_TOTAL"] == 40192
    assert r.instance_fields[2]["DCGM_FI_DEV_FB_USED"] == 1000
    assert r.instance_fields[2]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.8
    assert r.instance_fields[1]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.0


def test_control_dir_overrides_and_survives_garbage(tmp_path, caplog):
    b = backend({"model": "h100", "gpus": 2, "control_dir": str(tmp_path), "gpu": [{"index": 0, "utilization": 50}]})
    g0 = b.devices()[0]
    assert b.read(g0).fields["DCGM_FI_DEV_GPU_UTIL"] == 50
    (tmp_path / "0.toml").write_text('utilization = 97\nprocesses = [ { pid = 77, used_memory_mib = 4096 } ]\n')
    assert b.read(g0).fields["DCGM_FI_DEV_GPU_UTIL"] == 97
    assert [(p.pid, p.used_memory_bytes) for p in b.processes(g0)] == [(77, 4096 * 1024 * 1024)]
    (tmp_path / "0.toml").write_text("utilization = [garbage\n")
    assert b.read(g0).fields["DCGM_FI_DEV_GPU_UTIL"] == 50  # falls back to the scenario
    assert "ignoring simulator control file" in caplog.text


def test_control_fields_drive_the_profiling_rates_where_profiling_is_on(tmp_path, caplog):
    """A control file's `fields` publish PCIe and NVLink rates (absent otherwise) on a profiled GPU
    (the demo's input-bound and all-reduce jobs); not on a GPU without profiling; a name that is not
    a profiling field of the catalogue makes the file ignored, with a warning."""
    b = backend({"model": "h100", "gpus": 1, "control_dir": str(tmp_path)})
    g0 = b.devices()[0]
    assert "DCGM_FI_PROF_PCIE_RX_BYTES" not in b.read(g0).fields
    (tmp_path / "0.toml").write_text("utilization = 60\nfields = { DCGM_FI_PROF_SM_ACTIVE = 0.18, DCGM_FI_PROF_PCIE_RX_BYTES = 1.1e10 }\n")
    f = b.read(g0).fields
    assert (f["DCGM_FI_PROF_SM_ACTIVE"], f["DCGM_FI_PROF_PCIE_RX_BYTES"], f["DCGM_FI_DEV_GPU_UTIL"]) == (0.18, 1.1e10, 60)
    off = backend({"model": "a100", "gpus": 1, "control_dir": str(tmp_path)})
    assert "DCGM_FI_PROF_PCIE_RX_BYTES" not in off.read(off.devices()[0]).fields
    (tmp_path / "0.toml").write_text("utilization = 60\nfields = { DCGM_FI_DEV_GPU_TEMP = 99 }\n")
    assert b.read(g0).fields["DCGM_FI_DEV_GPU_TEMP"] != 99
    assert "not a profiling field of the catalogue" in caplog.text


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ({"model": "z100"}, "model = 'z100': expected one of"),
        ({"gpus": 0}, "gpus = 0: expected an integer from 1 to 1024"),
        ({"gpus": 2, "minor_numbers": [1, 1]}, "minor_numbers = [1, 1]: expected a list of 2 distinct"),
        ({"gpus": 2, "gpu": [{"index": 5}]}, "gpu[0].index = 5: expected an integer GPU index from 0 to 1"),
        ({"gpu": [{"index": 0, "utilization": {"kind": "sinus"}}]}, "gpu[0].utilization = {'kind': 'sinus'}: expected a number or a table with kind"),
        ({"gpu": [{"index": 0, "utilization": {"kind": "steps", "points": []}}]}, "gpu[0].utilization.points = []"),
        ({"gpu": [{"index": 0, "processes": [{"pid": "x"}]}]}, "gpu[0].processes[0]"),
        ({"gpu": [{"index": 0, "mig": ["9g.99gb"]}]}, "gpu[0].mig[0] = '9g.99gb': expected a MIG profile of NVIDIA H100"),
        ({"gpu": [{"index": 0, "fields": {"DCGM_FI_NOPE": 1}}]}, "gpu[0].fields = 'DCGM_FI_NOPE'"),
        ({"gpu": [{"index": 0, "colour": "red"}]}, "gpu[0].colour = 'red': expected no such key"),
        ({"gpus_total": 3}, "gpus_total = 3: expected no such key"),
    ],
)
def test_bad_scenarios_name_the_key_value_and_expectation(doc, fragment):
    with pytest.raises(ConfigError) as err:
        sim_scenario.parse(doc, "s.toml")
    assert fragment in str(err.value)
    assert str(err.value).startswith("scenario s.toml: ")


def test_scenario_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="scenario file .*missing.toml not found"):
        sim_scenario.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("gpus = [unclosed\n")
    with pytest.raises(ConfigError, match="scenario file .*bad.toml is not valid TOML"):
        sim_scenario.load(bad)


def test_shipped_demo_scenario_loads():
    from importlib import resources

    with resources.as_file(resources.files("gpufleet.exporter.scenarios") / "demo-node.toml") as p:
        sc = sim_scenario.load(p)
    assert sc.gpus == 8 and sc.minor_numbers == (1, 0, 3, 2, 5, 4, 7, 6)
    assert sc.spec(7).lost_at_s == 240


# --- profiling fields by GPU generation (issue #14) ---

PROF = [n for n in FIELDS if n.startswith("DCGM_FI_PROF_") and "BYTES" not in n]


@pytest.mark.parametrize("model, profiling, present", [
    ("h100", None, True), ("h200", None, True), ("b200", None, True),  # GPM: Hopper and later
    ("a100", None, False), ("a100-40gb", None, False), ("l4", None, False), ("t4", None, False),
    ("a100", "dcgm", True), ("t4", "dcgm", True),  # dcgm-exporter publishes them on any model
    ("h100", "none", False),
])
def test_profiling_fields_follow_the_generation(model, profiling, present):
    doc = {"model": model, "gpus": 2, "gpu": [{"index": 0, "utilization": 80}]}
    if profiling:
        doc["profiling"] = profiling
    b = backend(doc)
    for g in b.devices():
        f = b.read(g).fields
        assert ([n for n in PROF if n in f] == PROF) if present else not any(n.startswith("DCGM_FI_PROF_") for n in f)


def test_gpm_on_a_board_without_it_is_refused_by_name():
    with pytest.raises(ConfigError, match=r'profiling = .gpm.*A100.*no GPM'):
        sim_scenario.parse({"model": "a100", "profiling": "gpm"}, "s.toml")
    with pytest.raises(ConfigError, match=r"s.toml: profiling = 'dcp'"):
        sim_scenario.parse({"model": "h100", "profiling": "dcp"}, "s.toml")


@settings(max_examples=60, deadline=None)
@given(util=st.floats(0, 100), tensor=st.one_of(st.none(), st.floats(0, 1)), mig=st.booleans())
def test_profiling_ratios_stay_in_0_1(util, tensor, mig):
    spec = {"index": 0, "utilization": util}
    if tensor is not None:
        spec["tensor_active"] = tensor
    if mig:
        spec["mig"] = [{"profile": "3g.40gb", "utilization": util}, "1g.10gb"]
    b = backend({"model": "h100", "gpus": 1, "gpu": [spec]})
    r = b.read(b.devices()[0])
    rows = list(r.instance_fields.values()) if mig else [r.fields]
    for f in rows:
        assert [n for n in PROF if n in f] == PROF
        assert all(0 <= f[n] <= 1 for n in PROF), f
    if tensor is not None and not mig:
        assert r.fields["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == round(tensor, 6)
