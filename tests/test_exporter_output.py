"""What the exporter publishes: dcgm-exporter's vocabulary, gpufleet's own metrics, and isolation.

The label-set comparison reads the real dcgm-exporter dumps in ../shared/data/dcgm-exporter/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.exporter.backends import sim_scenario
from gpufleet.exporter.backends.sim import SimBackend
from gpufleet.exposition import Family, format_value, render
from gpufleet.exporter.fields import FIELDS
from gpufleet.exporter.jobmap.base import JobBinding, MappingError
from gpufleet.exporter.model import BackendUnavailable
from gpufleet.exporter.poller import Poller, write_device_map
from tests.support.shared_data import SHARED_DATA

DCGM_DATA = SHARED_DATA / "dcgm-exporter"


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_poller(doc: dict, sources=(), clock: Clock | None = None) -> tuple[Poller, Clock]:
    clock = clock or Clock()
    doc = {"hostname": "node-a", **doc}
    p = Poller(SimBackend(sim_scenario.parse(doc), clock=clock), sources, hostname="node-a", clock=clock)
    return p, clock


def samples(p: Poller) -> list[tuple[str, dict, float]]:
    text = p.exposition().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def find(ss, name, **labels):
    return [v for n, lab, v in ss if n == name and all(lab.get(k) == str(val) for k, val in labels.items())]


class StaticSource:
    def __init__(self, name, bindings=(), error=None, problems=()):
        self.name, self._bindings, self._error, self.problems = name, list(bindings), error, list(problems)

    def collect(self, gpus, processes):
        if self._error:
            raise self._error
        return list(self._bindings)


def test_every_sample_parses_and_dcgm_values_are_in_dcgm_units():
    p, _ = make_poller({"model": "h100", "gpus": 2, "gpu": [{"index": 0, "utilization": 40, "processes": [{"pid": 9, "used_memory_mib": 2048}]}]})
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = samples(p)
    assert find(ss, "DCGM_FI_DEV_GPU_UTIL", gpu=0) == [40]
    assert find(ss, "DCGM_FI_DEV_FB_USED", gpu=0) == [2048]  # MiB, as dcgm-exporter
    # 70 W idle + 630 W * 0.9 * 0.4 = 296.8 W
    assert find(ss, "DCGM_FI_DEV_POWER_USAGE", gpu=0) == [pytest.approx(296.8)]
    assert find(ss, "gpufleet_gpu_compute_processes", gpu=0) == [1]
    assert find(ss, "gpufleet_gpu_compute_processes", gpu=1) == [0]
    assert find(ss, "gpufleet_gpu_up", gpu=1) == [1]


def test_counter_families_keep_dcgm_names_without_total_suffix():
    p, _ = make_poller({"gpus": 1})
    p.poll_telemetry()
    text = p.exposition().decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text


def _dcgm_label_sets(path: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.name.startswith("DCGM_FI_"):
                out.setdefault(s.name, set()).update(s.labels)
    return out


@pytest.mark.parametrize("dump", ["t4_baremetal_dcgm4x_ericsson-ccd.prom", "l4_aws_dcgm4x_kops.prom"])
def test_label_set_matches_dcgm_exporter_on_shared_fields(dump):
    real = _dcgm_label_sets(DCGM_DATA / dump)
    p, _ = make_poller({"model": "t4", "gpus": 1})
    p.poll_telemetry()
    ours: dict[str, set[str]] = {}
    for name, labels, _ in samples(p):
        if name.startswith("DCGM_FI_"):
            ours.setdefault(name, set()).update(labels)
    shared = set(real) & set(ours)
    assert len(shared) >= 10, shared
    for name in shared:
        assert ours[name] == real[name], name


def test_label_order_matches_dcgm_exporter_template():
    p, _ = make_poller({"model": "t4", "gpus": 1})
    p.poll_telemetry()
    line = next(ln for ln in p.exposition().decode().splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    keys = [kv.split("=")[0] for kv in line[line.index("{") + 1 : line.index("}")].split('",')]
    real = next(ln for ln in (DCGM_DATA / "t4_baremetal_dcgm4x_ericsson-ccd.prom").read_text().splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    real_keys = [kv.split("=")[0] for kv in real[real.index("{") + 1 : real.index("}")].split('",')]
    assert keys == real_keys == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


def test_mig_rows_as_dcgm_exporter_makes_them():
    real = _dcgm_label_sets(DCGM_DATA / "a800x8_mig-2g.20gb_dcgm3x_subset.prom")
    p, _ = make_poller({"model": "a100", "gpus": 2, "gpu": [{"index": 0, "mig": ["2g.20gb", "2g.20gb", "3g.40gb"]}]})
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = samples(p)
    clocks = [lab for n, lab, _ in ss if n == "DCGM_FI_DEV_SM_CLOCK" and lab["gpu"] == "0"]
    assert sorted((c["GPU_I_ID"], c["GPU_I_PROFILE"]) for c in clocks) == [("1", "2g.20gb"), ("2", "2g.20gb"), ("3", "3g.40gb")]
    assert {c["UUID"] for c in clocks} == {p.snapshot.gpus[0].identity.uuid}  # parent UUID, as dcgm-exporter
    # the real A800 dump's MIG rows carry the same keys (it has no pci_bus_id; it adds a process-name label)
    real_mig_keys = real["DCGM_FI_DEV_SM_CLOCK"] - {"DCGM_FI_PROCESS_NAME"}
    assert set(clocks[0]) - {"pci_bus_id"} == real_mig_keys
    assert find(ss, "DCGM_FI_DEV_GPU_UTIL", gpu=0) == []  # absent for MIG, as in the real dump
    assert find(ss, "DCGM_FI_DEV_GPU_UTIL", gpu=1) == [0]
    assert find(ss, "DCGM_FI_DEV_FB_TOTAL", gpu=0, GPU_I_ID=3) == [40192]
    assert sorted(find(ss, "gpufleet_gpu_compute_processes", gpu=0)) == [0, 0, 0]


def test_lost_gpu_reports_state_while_others_flow():
    p, clock = make_poller({"gpus": 3, "gpu": [{"index": 1, "lost_at_s": 10, "xid": [{"at_s": 10, "code": 79}]}]})
    p.poll_telemetry()
    clock.t = 11
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = samples(p)
    assert find(ss, "gpufleet_gpu_up", gpu=1) == [0]
    assert [lab["reason"] for n, lab, _ in ss if n == "gpufleet_gpu_up" and lab["gpu"] == "1"] == ["gpu_lost"]
    assert find(ss, "gpufleet_gpu_up", gpu=0) == [1] and find(ss, "gpufleet_gpu_up", gpu=2) == [1]
    assert find(ss, "DCGM_FI_DEV_GPU_UTIL", gpu=1) == []
    assert len(find(ss, "DCGM_FI_DEV_GPU_UTIL")) == 2
    assert find(ss, "gpufleet_gpu_xid_errors_total", gpu=1, xid=79) == [1]
    assert find(ss, "gpufleet_gpu_compute_processes", gpu=1) == []  # unknown, not 0
    assert find(ss, "gpufleet_collector_success", collector="sim") == [1]


class BrokenBackend:
    name = "nvml"
    opens = 0

    def open(self):
        BrokenBackend.opens += 1
        raise BackendUnavailable("NVML library not found (libnvidia-ml.so.1): is the NVIDIA driver installed?")


def test_backend_missing_at_start_serves_health_and_retries_with_backoff(caplog):
    clock = Clock(0)
    p = Poller(BrokenBackend(), hostname="h", poll_interval=5, clock=clock)
    p.poll_telemetry()
    ss = samples(p)
    assert find(ss, "gpufleet_collector_success", collector="nvml") == [0]
    assert find(ss, "gpufleet_build_info") == [1]
    assert not [n for n, _, _ in ss if n.startswith("DCGM_")]
    assert "libnvidia-ml.so.1" in caplog.text
    p.poll_telemetry()  # too early: no new attempt
    assert BrokenBackend.opens == 1
    clock.t = 5
    p.poll_telemetry()
    clock.t = 10  # backoff doubled to 10 s after the second failure -> next attempt at 15
    p.poll_telemetry()
    assert BrokenBackend.opens == 2
    clock.t = 15
    p.poll_telemetry()
    assert BrokenBackend.opens == 3
    assert caplog.text.count("libnvidia-ml.so.1") == 1  # logged once, not every retry


def test_job_info_from_allocations_and_foreign_processes():
    p, _ = make_poller({"gpus": 2, "gpu": [{"index": 0, "processes": [{"pid": 100, "used_memory_mib": 1024, "sm_util": 30}, {"pid": 200, "used_memory_mib": 512, "sm_util": 20}]}]})
    alloc = StaticSource("slurm_jobmap", [JobBinding("slurm", "slurm_jobmap", job_id="501", gpu_index=0)])
    procs = StaticSource("cgroup", [
        JobBinding("slurm", "cgroup", job_id="501", gpu_index=0, pid=100),
        JobBinding("slurm", "cgroup", job_id="777", gpu_index=0, pid=200),
    ])
    p.sources = [alloc, procs]
    p.snapshot.allocation_sources_enabled = True
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = samples(p)
    info = [lab for n, lab, _ in ss if n == "gpufleet_gpu_job_info"]
    assert [(i["gpu"], i["job_id"], i["scheduler"]) for i in info] == [("0", "501", "slurm")]  # only the allocation
    assert find(ss, "gpufleet_gpu_foreign_processes", gpu=0, job_id=777) == [1]
    assert find(ss, "gpufleet_gpu_foreign_processes", job_id=501) == []
    assert find(ss, "gpufleet_gpu_job_sm_utilization_ratio", gpu=0, job_id=501) == [0.3]
    assert find(ss, "gpufleet_gpu_job_memory_used_bytes", gpu=0, job_id=777) == [512 * 1024 * 1024]


def test_process_mapping_is_the_job_info_when_no_allocation_source():
    p, _ = make_poller({"gpus": 1, "gpu": [{"index": 0, "processes": [{"pid": 100}]}]})
    p.sources = [StaticSource("cgroup", [JobBinding("slurm", "cgroup", job_id="42", gpu_index=0, pid=100)])]
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    assert [lab["job_id"] for n, lab, _ in samples(p) if n == "gpufleet_gpu_job_info"] == ["42"]
    assert find(samples(p), "gpufleet_gpu_foreign_processes") == []


def test_kubernetes_bindings_resolve_mig_uuid_to_instance():
    p, _ = make_poller({"model": "a100", "gpus": 1, "gpu": [{"index": 0, "mig": ["3g.40gb", "3g.40gb"]}]})
    p.poll_telemetry()
    mig2 = p.snapshot.gpus[0].identity.mig_instances[1]
    p.sources = [StaticSource("kubelet", [
        JobBinding("kubernetes", "kubelet", pod="train-0", namespace="ml", container="c", gpu_uuid=mig2.uuid),
        JobBinding("kubernetes", "kubelet", pod="ghost", namespace="ml", gpu_uuid="GPU-not-here"),
    ])]
    p.snapshot.allocation_sources_enabled = True
    p.poll_processes_and_jobs()
    ss = samples(p)
    info = [lab for n, lab, _ in ss if n == "gpufleet_gpu_job_info"]
    assert info == [{"gpu": "0", "UUID": p.snapshot.gpus[0].identity.uuid, "GPU_I_ID": "2", "Hostname": "node-a",
                     "scheduler": "kubernetes", "namespace": "ml", "pod": "train-0", "container": "c"}]
    assert find(ss, "gpufleet_collector_problems_total", collector="kubelet") == [1]  # the ghost


def test_failing_mapping_source_is_reported_and_gpus_still_flow(caplog):
    p, _ = make_poller({"gpus": 2})
    p.sources = [StaticSource("kubelet", error=MappingError("kubelet pod-resources socket /x not found")), StaticSource("slurm_jobmap", [JobBinding("slurm", "slurm_jobmap", job_id="9", gpu_index=1)], problems=["junk line"])]
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ss = samples(p)
    assert find(ss, "gpufleet_collector_success", collector="kubelet") == [0]
    assert find(ss, "gpufleet_collector_success", collector="slurm_jobmap") == [1]
    assert find(ss, "gpufleet_collector_problems_total", collector="slurm_jobmap") == [1]
    assert len(find(ss, "DCGM_FI_DEV_GPU_UTIL")) == 2
    assert [lab["job_id"] for n, lab, _ in ss if n == "gpufleet_gpu_job_info"] == ["9"]
    assert "socket /x not found" in caplog.text


def test_label_values_are_escaped_and_values_formatted():
    fam = Family("x", "gauge", "help with \\ and\nnewline")
    fam.add((("job", 'a"b\\c\nd'),), 1.5)
    fam.add((("job", "plain"),), 3.0)
    text = render([fam]).decode()
    parsed = [(s.labels["job"], s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    assert parsed == [('a"b\\c\nd', 1.5), ("plain", 3.0)]
    assert format_value(3.0) == "3" and format_value(0.000822) == "0.000822" and format_value(float("nan")) == "NaN"


def test_device_map_file_for_the_prolog(tmp_path):
    p, _ = make_poller({"gpus": 3, "minor_numbers": [2, 0, 1]})
    p.poll_telemetry()
    out = tmp_path / "run" / "gpu-devices.tsv"
    write_device_map(out, [st.identity for st in p.snapshot.gpus])
    rows = [ln.split() for ln in out.read_text().splitlines() if not ln.startswith("#")]
    assert [(r[0], r[1]) for r in rows] == [("0", "2"), ("1", "0"), ("2", "1")]
    assert [r[2] for r in rows] == [st.identity.uuid for st in p.snapshot.gpus]


def test_field_catalogue_types_match_dcgm_csv():
    """Every field we publish that dcgm-exporter's CSVs list has the same Prometheus type. An
    active line wins over a commented-out one (the CSV keeps the old NVML-based PCIe counters
    commented out beside the DCP gauges of the same name)."""
    active, commented = {}, {}
    for csv in ("default-counters.csv", "dcp-metrics-included.csv"):
        for raw in (DCGM_DATA / csv).read_text().splitlines():
            line = raw.lstrip("# ").strip()
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 3 and parts[0].startswith("DCGM_FI_") and parts[1] in ("gauge", "counter"):
                (commented if raw.lstrip().startswith("#") else active).setdefault(parts[0], parts[1])
    declared = {**commented, **active}
    common = set(declared) & set(FIELDS)
    assert len(common) >= 20
    mismatched = {n for n in common if declared[n] != FIELDS[n].kind}
    assert mismatched == set()
