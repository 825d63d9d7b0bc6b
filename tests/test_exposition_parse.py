"""Scraped exposition -> canonical rows: every dcgm-exporter dump in shared/data, the gpufleet
exporter's own output, the format drifts of FORMATS.md §1-2, bad input, and the fast path's
equality with prometheus_client's parser."""

from __future__ import annotations

import functools
import math
import time
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import gpufleet.collector.exposition_fast as fast_mod
import gpufleet.collector.exposition_parse as parse_mod
from gpufleet.collector.exposition_fast import MAX_LINE_CHARS, MAX_PROBLEMS, scan
from gpufleet.collector.exposition_parse import DCGM_BLANK_THRESHOLD, parse_exposition, target_host
from gpufleet.collector.schema import SAMPLE_SCHEMA
from gpufleet.exporter.jobmap.base import JobBinding
from tests.test_exporter_output import StaticSource, make_poller
from tests.support.shared_data import SHARED_DATA, require_shared_data, shared_glob

DATA = SHARED_DATA
DCGM = DATA / "dcgm-exporter"
FIXTURES = shared_glob("dcgm-exporter", "*.prom")
TS = datetime(2024, 5, 1, 12, 0, 0)


def fixture(name: str) -> str:
    return (DCGM / name).read_text()


def parse(text: str, target: str = "10.0.0.5:9400", **kw):
    return parse_exposition(text, ts=TS, cluster="c1", target=target, **kw)


def rows(result) -> list[dict]:
    return result.samples.to_pylist()


def row(result, gpu: int, instance: int | None = None) -> dict:
    found = [r for r in rows(result) if r["gpu"] == gpu and r["gpu_instance"] == instance]
    assert len(found) == 1, found
    return found[0]


def allocs(result) -> set[tuple]:
    return {(a["scheduler"], a["job_key"], a["host"], a["gpu_uuid"], a["gpu_instance"], a["gpu"]) for a in result.allocations}


def approx(v: float):
    return pytest.approx(v, rel=1e-6)  # float32 columns


def sample_line(name: str, labels: dict[str, str], value: str) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{body}}} {value}\n"


def gpu_labels(gpu: int = 0, uuid: str = "GPU-aaaa", host: str = "node-1", **extra: str) -> dict[str, str]:
    return {"gpu": str(gpu), "UUID": uuid, "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": host, **extra}


# --- every saved dcgm-exporter dump ---


def test_t4_baremetal_dcgm4x():
    r = parse(fixture("t4_baremetal_dcgm4x_ericsson-ccd.prom"))
    assert (r.rejected, r.problems) == (0, [])
    assert r.samples.schema == SAMPLE_SCHEMA
    [t4] = rows(r)
    assert t4["ts"] == TS and t4["cluster"] == "c1" and t4["source"] == "scrape"
    assert (t4["host"], t4["gpu"], t4["gpu_uuid"], t4["gpu_instance"]) == ("cp-bm14r7", 0, "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a", None)
    assert (t4["model"], t4["mig_profile"]) == ("Tesla T4", None)
    assert t4["gpu_util"] == 91 and t4["mem_copy_util"] == 73 and t4["enc_util"] == 0 and t4["dec_util"] == 0
    assert t4["power_w"] == approx(68.244)
    assert t4["energy_mj"] == 15152422938  # int64, exact
    assert t4["mem_temp_c"] == 0  # T4 reports 0 for "unsupported": stored as exported
    assert t4["gpu_temp_c"] == 74 and t4["sm_clock_mhz"] == 660 and t4["mem_clock_mhz"] == 5000
    assert (t4["fb_used_mib"], t4["fb_free_mib"], t4["fb_reserved_mib"], t4["fb_total_mib"]) == (5120, 9791, 447, None)
    assert t4["pcie_replay"] == 0
    assert t4["gr_engine_active"] == approx(0.156205) and t4["tensor_active"] == approx(0.005822) and t4["dram_active"] == approx(0.092781)
    assert t4["pcie_tx_bytes_per_s"] == 4791810 and t4["pcie_rx_bytes_per_s"] == 6935930
    # what the dump lacks is null, never 0
    for column in ("xid_last", "ecc_sbe_vol", "ecc_dbe_agg", "remap_failure", "power_violation_ns", "sm_active", "gpu_up", "compute_processes"):
        assert t4[column] is None, column
    assert r.gpus == [{
        "ts": TS, "cluster": "c1", "host": "cp-bm14r7", "gpu_uuid": "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a",
        "gpu_instance": -1, "gpu": 0, "mig_profile": None, "model": "Tesla T4",
        "fb_total_mib": 5120 + 9791 + 447, "driver_version": "590.48.01",
    }]
    assert r.allocations == []


def test_readme_sample_sentinel_is_null_and_host_comes_from_target():
    r = parse(fixture("readme_quickstart_sentinel-value_space-after-comma.prom"))
    assert (r.rejected, r.problems) == (0, [])
    [g] = rows(r)
    assert (g["host"], g["gpu"], g["gpu_uuid"]) == ("10.0.0.5", 0, "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52")
    assert g["sm_clock_mhz"] == 139 and g["mem_clock_mhz"] == 405
    assert g["mem_temp_c"] is None  # 9223372036854775794: DCGM's blank, not 9.2e18 °C
    assert g["model"] is None and r.gpus[0]["fb_total_mib"] is None and r.gpus[0]["driver_version"] is None


def test_legacy_v1_pod_exporter():
    r = parse(fixture("legacy_v1_pod-gpu-metrics-exporter_pod_name-labels.prom"), target="gpu-node-7:9400")
    assert (r.rejected, r.problems) == (0, [])  # dcgm_low_util_violation: unknown, ignored, not rejected
    g0, g1 = row(r, 0), row(r, 1)
    assert g0["gpu_uuid"] == "GPU-2b399198-c670-a848-173b-d3400051a200"  # from the lowercase `uuid` label
    assert (g0["gpu_temp_c"], g1["gpu_temp_c"]) == (33, 34)
    assert (g0["gpu_util"], g0["mem_copy_util"], g0["mem_clock_mhz"]) == (0, 0, 810)
    assert g0["host"] == g1["host"] == "gpu-node-7"
    assert allocs(r) == {
        ("kubernetes", "default/pod1", "gpu-node-7", "GPU-2b399198-c670-a848-173b-d3400051a200", -1, 0),
        ("kubernetes", "default/pod1", "gpu-node-7", "GPU-9567a9e7-341e-bb7e-fcf5-788d8caa50f9", -1, 1),
    }
    assert all(a["source"] == "exporter" and a["ts"] == TS and a["cluster"] == "c1" for a in r.allocations)


def test_a800_mig_rows_are_per_instance_with_the_parent_uuid():
    r = parse(fixture("a800x8_mig-2g.20gb_dcgm3x_subset.prom"))
    assert (r.rejected, r.problems) == (0, [])  # DCGM_FI_DEV_ACCOUNTING_DATA ignored
    assert r.samples.num_rows == 3 + 7
    parent = "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"
    instances = [row(r, 0, gi) for gi in (3, 5, 6)]
    assert [i["gpu_uuid"] for i in instances] == [parent] * 3
    assert [i["mig_profile"] for i in instances] == ["2g.20gb"] * 3
    assert all(i["host"] == "msxf-hpc-64-35-ai" and i["model"] == "NVIDIA A800-SXM4-80GB" for i in instances)
    # no GPU_UTIL for MIG GPUs; device-level values repeated per instance, as exported (not summed)
    assert [i["gpu_util"] for i in instances] == [None] * 3
    assert [i["energy_mj"] for i in instances] == [257858316] * 3
    assert [i["power_w"] for i in instances] == [approx(78.174), approx(78.174), approx(78.446)]
    assert [i["gr_engine_active"] for i in instances] == [0, 0, 0]
    assert [i["pcie_tx_bytes_per_s"] for i in instances] == [None] * 3
    assert [(i["gpu_temp_c"], i["mem_temp_c"], i["sm_clock_mhz"]) for i in instances] == [(33, 29, 1410)] * 3
    with pytest.raises(AssertionError):
        row(r, 0)  # no whole-GPU row for the MIG GPU
    g1 = row(r, 1)
    assert (g1["gpu_uuid"], g1["gpu_util"], g1["power_w"], g1["pcie_tx_bytes_per_s"], g1["pcie_rx_bytes_per_s"]) == (
        "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6", 0, approx(55.942), 143341, 211846)
    assert row(r, 7)["gpu_temp_c"] is None  # that row is missing from the dump
    assert row(r, 7)["energy_mj"] == 183986286
    assert sorted((g["gpu"], g["gpu_instance"]) for g in r.gpus) == [(0, 3), (0, 5), (0, 6)] + [(i, -1) for i in range(1, 8)]
    assert {g["driver_version"] for g in r.gpus} == {"535.129.03"}
    assert r.allocations == []


def test_h100_k8s_pod_labels_only_on_gpu0():
    r = parse(fixture("h100x8_k8s_pod-labels_dcgm4x_aicr.prom"))
    assert (r.rejected, r.problems) == (0, [])
    assert r.samples.num_rows == 8
    assert allocs(r) == {("kubernetes", "dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5", "gpu-node-1",
                          "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", -1, 0)}
    g0 = row(r, 0)
    assert (g0["gpu_temp_c"], g0["power_w"], g0["gpu_util"], g0["mem_copy_util"]) == (30, approx(113.611), 0, 0)
    assert row(r, 7)["power_w"] == approx(66.997)
    assert {x["model"] for x in rows(r)} == {"NVIDIA H100 80GB HBM3"}
    assert row(r, 0)["sm_clock_mhz"] is None  # 4 families sampled: the rest is null


def test_l4_remapped_rows_and_fb_total_from_parts():
    r = parse(fixture("l4_aws_dcgm4x_kops.prom"))
    assert (r.rejected, r.problems) == (0, [])  # DCGM_FI_DEV_VGPU_LICENSE_STATUS ignored
    [l4] = rows(r)
    assert (l4["host"], l4["model"], l4["gpu_uuid"]) == ("i-030791dc5a37cd257", "NVIDIA L4", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c")
    assert (l4["remap_correctable"], l4["remap_uncorrectable"], l4["remap_failure"]) == (0, 0, 0)
    assert (l4["fb_used_mib"], l4["fb_free_mib"], l4["fb_reserved_mib"]) == (0, 22563, 470)
    assert l4["mem_temp_c"] == 0 and l4["gpu_temp_c"] == 31 and l4["power_w"] == approx(16.365)
    assert l4["energy_mj"] == 4742776 and l4["pcie_tx_bytes_per_s"] == 112603 and l4["pcie_rx_bytes_per_s"] == 17544
    assert r.gpus[0]["fb_total_mib"] == 23033 and r.gpus[0]["driver_version"] == "580.105.08"


def test_every_saved_dump_has_asserted_values_above():
    require_shared_data()
    assert [p.name for p in FIXTURES] == [
        "a800x8_mig-2g.20gb_dcgm3x_subset.prom", "h100x8_k8s_pod-labels_dcgm4x_aicr.prom", "l4_aws_dcgm4x_kops.prom",
        "legacy_v1_pod-gpu-metrics-exporter_pod_name-labels.prom", "readme_quickstart_sentinel-value_space-after-comma.prom",
        "t4_baremetal_dcgm4x_ericsson-ccd.prom",
    ]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_fixture_parses_cleanly_into_the_schema(path):
    r = parse(path.read_text())
    assert r.samples.schema == SAMPLE_SCHEMA
    assert r.samples.num_rows == len(r.gpus) > 0
    assert (r.rejected, r.problems) == (0, [])


# --- the gpufleet exporter ---


def gpufleet_exposition() -> tuple[str, object]:
    p, _ = make_poller({"model": "a100", "gpus": 4, "gpu": [
        {"index": 0, "mig": ["3g.40gb", "2g.20gb"]},
        {"index": 1, "utilization": {"kind": "constant", "value": 40}, "processes": [{"pid": 9, "used_memory_mib": 2048}]},
        {"index": 3, "lost_at_s": 0},
    ]})
    p.poll_telemetry()
    mig = p.snapshot.gpus[0].identity.mig_instances
    p.sources = [
        StaticSource("slurm_jobmap", [JobBinding("slurm", "slurm_jobmap", job_id="501", gpu_index=1)]),
        StaticSource("kubelet", [JobBinding("kubernetes", "kubelet", pod="train-0", namespace="ml", container="c", gpu_uuid=mig[1].uuid)]),
    ]
    p.snapshot.allocation_sources_enabled = True
    p.poll_processes_and_jobs()
    return p.exposition().decode(), p.snapshot


def test_gpufleet_exporter_output():
    text, snap = gpufleet_exposition()
    uuid = [g.identity.uuid for g in snap.gpus]
    r = parse(text)
    assert (r.rejected, r.problems) == (0, [])  # build_info, collector health, xid totals: ignored
    assert sorted((x["gpu"], x["gpu_instance"]) for x in rows(r)) == [(0, 1), (0, 2), (1, None), (2, None), (3, None)]
    mig1, mig2, g1, g2, g3 = row(r, 0, 1), row(r, 0, 2), row(r, 1), row(r, 2), row(r, 3)
    assert mig1["gpu_uuid"] == mig2["gpu_uuid"] == uuid[0] and (mig1["mig_profile"], mig2["mig_profile"]) == ("3g.40gb", "2g.20gb")
    # gpufleet_gpu_up is per GPU: copied onto the MIG GPU's instance rows, like DCGM's device fields
    assert [x["gpu_up"] for x in (mig1, mig2, g1, g2)] == [1, 1, 1, 1]
    assert (g3["gpu_up"], g3["gpu_util"], g3["model"]) == (0, None, None)  # fell off the bus: only gpu_up
    assert [x["compute_processes"] for x in (mig1, mig2, g1, g2)] == [0, 0, 1, 0]
    assert g3["compute_processes"] is None
    assert (g1["gpu_util"], g1["fb_used_mib"], g1["power_w"], g2["gpu_util"], mig1["gpu_util"]) == (40, 2048, approx(179.2), 0, None)
    assert (mig1["fb_total_mib"], mig2["fb_total_mib"], g1["fb_total_mib"]) == (40192, 19968, 81920)
    assert all(x["host"] == "node-a" for x in rows(r))
    assert allocs(r) == {
        ("slurm", "501", "node-a", uuid[1], -1, 1),
        ("kubernetes", "ml/train-0", "node-a", uuid[0], 2, 0),
    }
    assert sorted((g["gpu"], g["gpu_instance"], g["mig_profile"], g["fb_total_mib"]) for g in r.gpus) == [
        (0, 1, "3g.40gb", 40192), (0, 2, "2g.20gb", 19968), (1, -1, None, 81920), (2, -1, None, 81920), (3, -1, None, None)]
    assert {g["model"] for g in r.gpus if g["gpu"] != 3} == {"NVIDIA A100-SXM4-80GB"}
    assert {g["driver_version"] for g in r.gpus if g["gpu"] != 3} == {"550.54.15"}


def test_job_info_forms_and_deduplication():
    base = {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1"}
    text = (
        sample_line("gpufleet_gpu_job_info", {**base, "scheduler": "slurm", "job_id": "77_3"}, "1")
        + sample_line("gpufleet_gpu_job_info", {**base, "scheduler": "slurm", "job_id": "77_3"}, "1")  # duplicate
        + sample_line("gpufleet_gpu_job_info",
                      {**base, "GPU_I_ID": "4", "scheduler": "kubernetes", "namespace": "ns", "pod": "p", "container": "c"}, "1")
        + sample_line("gpufleet_gpu_job_info", {**base, "scheduler": "slurm", "job_id": "88"}, "0")  # not a holder
        + sample_line("gpufleet_gpu_job_info", {**base, "scheduler": "slurm"}, "1")  # no job id: rejected
        + sample_line("gpufleet_gpu_job_info", {"gpu": "1", "Hostname": "n1", "scheduler": "slurm", "job_id": "9"}, "1")  # no UUID
    )
    r = parse(text)
    assert allocs(r) == {("slurm", "77_3", "n1", "GPU-a", -1, 0), ("kubernetes", "ns/p", "n1", "GPU-a", 4, 0)}
    assert r.rejected == 2 and len(r.problems) == 2
    assert "line 5" in r.problems[0] and "job_id" in r.problems[0]
    assert "line 6" in r.problems[1] and "UUID" in r.problems[1]
    assert r.samples.num_rows == 0 and r.gpus == []  # job info alone makes no sample rows


# --- Slurm hpc_job mapping ---


def test_hpc_job_copies_give_one_row_and_one_allocation_per_job():
    text = ""
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", "50"), ("DCGM_FI_DEV_POWER_USAGE", "200.5")):
        text += sample_line(name, gpu_labels(0, "GPU-a", hpc_job="101"), value)
        text += sample_line(name, gpu_labels(0, "GPU-a", hpc_job="102"), value)
        text += sample_line(name, gpu_labels(1, "GPU-b", hpc_job="0"), "0")  # idle, prolog wrote 0
        text += sample_line(name, gpu_labels(2, "GPU-c", hpc_job=""), "0")
    text += sample_line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu_labels(3, "GPU-d", GPU_I_PROFILE="1g.10gb", GPU_I_ID="7", hpc_job="103"), "0.5")
    r = parse(text)
    assert r.rejected == 0
    assert sorted((x["gpu"], x["gpu_instance"]) for x in rows(r)) == [(0, None), (1, None), (2, None), (3, 7)]
    assert (row(r, 0)["gpu_util"], row(r, 0)["power_w"]) == (50, 200.5)
    assert allocs(r) == {
        ("slurm", "101", "node-1", "GPU-a", -1, 0),
        ("slurm", "102", "node-1", "GPU-a", -1, 0),
        ("slurm", "103", "node-1", "GPU-d", 7, 3),
    }


# --- Kubernetes workload labels ---


def test_exported_pod_wins_over_the_exporters_pod_labels():
    exporter = {"pod": "nvidia-dcgm-exporter-sv6g2", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter"}
    text = (
        sample_line("DCGM_FI_DEV_GPU_UTIL",
                    gpu_labels(0, "GPU-a", **exporter, exported_pod="train-1", exported_namespace="ml", exported_container="main"), "90")
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(1, "GPU-b", **exporter), "0")  # idle GPU, honorLabels false
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(2, "GPU-c", pod="dcgm-exporter-lcxpl", namespace="gpu-operator"), "0")
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(3, "GPU-d", pod="", namespace="", container=""), "0")  # old versions: empty
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(4, "GPU-e", pod="cuda-validator", namespace="gpu-operator"), "0")
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(5, "GPU-f", pod_name="old", pod_namespace="team", container_name="x"), "0")
        + sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(6, "GPU-g", pod="p", namespace="n", pod_uid=""), "0")
    )
    r = parse(text)
    assert r.rejected == 0 and r.samples.num_rows == 7
    assert {(a["job_key"], a["gpu"]) for a in r.allocations} == {("ml/train-1", 0), ("gpu-operator/cuda-validator", 4), ("team/old", 5), ("n/p", 6)}
    assert {a["scheduler"] for a in r.allocations} == {"kubernetes"}


def test_label_order_and_hostname_spelling_do_not_matter():
    canonical = parse(fixture("t4_baremetal_dcgm4x_ericsson-ccd.prom"))
    # client_golang style: every label sorted by name (Hostname first), and the 2026 lowercase rename
    alphabetical = lowercase = ""
    for line in fixture("t4_baremetal_dcgm4x_ericsson-ccd.prom").splitlines():
        name, _, rest = line.partition("{")
        block, _, value = rest.rpartition("} ")
        pairs = sorted(block.split(","))
        alphabetical += f"{name}{{{','.join(pairs)}}} {value}\n"
        lowercase += line.replace('Hostname="', 'hostname="') + "\n"
    assert alphabetical.startswith('DCGM_FI_DEV_SM_CLOCK{DCGM_FI_DRIVER_VERSION="590.48.01",Hostname="cp-bm14r7",UUID=')
    for text in (alphabetical, lowercase):
        r = parse(text)
        assert r.rejected == 0
        assert r.samples.equals(canonical.samples)
        assert r.gpus == canonical.gpus


def test_host_precedence_node_label_then_hostname_then_target():
    text = sample_line("DCGM_FI_DEV_GPU_TEMP", gpu_labels(0, "GPU-a", host="nvidia-dcgm-exporter-sv6g2"), "40")
    assert row(parse(text, target_labels={"node": "gpu-node-3"}), 0)["host"] == "gpu-node-3"
    assert row(parse(text), 0)["host"] == "nvidia-dcgm-exporter-sv6g2"
    no_host = sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": "GPU-a"}, "40")
    assert row(parse(no_host, target="10.0.0.5:9400"), 0)["host"] == "10.0.0.5"
    empty_host = sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": "GPU-a", "Hostname": ""}, "40")
    assert row(parse(empty_host, target="gpu-9:9400"), 0)["host"] == "gpu-9"


@pytest.mark.parametrize("target, host", [
    ("10.0.0.5:9400", "10.0.0.5"), ("gpu-node-1:9400", "gpu-node-1"), ("gpu-node-1", "gpu-node-1"),
    ("[fd00::5]:9400", "fd00::5"), ("http://gpu-node-1:9400/metrics", "gpu-node-1"), ("https://[::1]/metrics", "::1"),
])
def test_target_host(target, host):
    assert target_host(target) == host


# --- names, units, sentinels, entities ---


def test_old_namespace_and_legacy_units():
    labels = {"gpu": "0", "uuid": "GPU-a", "hostname": "n1"}
    text = (
        "# TYPE dcgm_fi_prof_gr_engine_active gauge\n"
        + sample_line("dcgm_fi_prof_gr_engine_active", labels, "0.25")
        + "# TYPE dcgm_fi_dev_ecc_sbe_vol_total counter\n"
        + sample_line("dcgm_fi_dev_ecc_sbe_vol_total", labels, "3")
        + sample_line("dcgm_power_violation", labels, "5")  # 1.x: microseconds
        + sample_line("DCGM_FI_DEV_THERMAL_VIOLATION", labels, "7")  # DCGM: nanoseconds
        + sample_line("dcgm_total_energy_consumption", labels, "7.824041e+06")  # 1.x %g style
        + sample_line("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", labels, "1")  # pre-rename name
    )
    r = parse(text)
    g = row(r, 0)
    assert (r.rejected, g["host"]) == (0, "n1")
    assert g["gr_engine_active"] == 0.25 and g["ecc_sbe_vol"] == 3
    assert (g["power_violation_ns"], g["thermal_violation_ns"]) == (5000, 7)
    assert g["energy_mj"] == 7824041 and g["clocks_event_reasons"] == 1


def test_blank_sentinels_and_nan_are_null_never_zero():
    text = "".join(
        sample_line(name, gpu_labels(0, "GPU-a"), value)
        for name, value in (
            ("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775794"),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "9223372036854775807"),
            ("DCGM_FI_DEV_XID_ERRORS", str(DCGM_BLANK_THRESHOLD)),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", str(DCGM_BLANK_THRESHOLD - 1)),  # just below: a value
            ("DCGM_FI_DEV_POWER_USAGE", "NaN"),
            ("DCGM_FI_DEV_GPU_TEMP", "+Inf"),
            ("DCGM_FI_DEV_SM_CLOCK", "9.3e18"),
            ("DCGM_FI_DEV_GPU_UTIL", "0"),
        )
    )
    g = row(parse(text), 0)
    assert (g["mem_temp_c"], g["energy_mj"], g["xid_last"], g["power_w"], g["gpu_temp_c"], g["sm_clock_mhz"]) == (None,) * 6
    assert g["pcie_replay"] == DCGM_BLANK_THRESHOLD - 1
    assert g["gpu_util"] == 0


def test_entity_rows_and_unknown_families_are_ignored_not_rejected():
    text = (
        sample_line("DCGM_FI_DEV_NVSWITCH_TEMPERATURE", {"nvswitch": "0", "Hostname": "n1"}, "40")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"cpu": "0", "Hostname": "n1"}, "50")  # Grace CPU entity
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "", "UUID": "GPU-z", "Hostname": "n1"}, "50")  # empty = absent
        + sample_line("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", {"gpu": "0", "UUID": "GPU-a", "nvlink": "3", "Hostname": "n1"}, "999")
        + sample_line("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1"}, "123")
        + sample_line("DCGM_EXP_XID_ERRORS_COUNT", {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1", "xid": "79", "window_size_in_ms": "300000"}, "1")
        + sample_line("some_other_exporter_metric", {"pod": "x", "namespace": "y"}, "1")
    )
    r = parse(text)
    assert (r.rejected, r.problems) == (0, [])
    [g] = rows(r)
    assert g["nvlink_bandwidth_total"] == 123 and g["gpu_temp_c"] is None
    assert r.allocations == []


def test_ts_cluster_source_and_aware_timestamps():
    text = sample_line("DCGM_FI_DEV_GPU_TEMP", gpu_labels(), "40")
    r = parse_exposition(text, ts=datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2))),
                         cluster="east", target="t:1", source="prometheus")
    [g] = rows(r)
    assert (g["ts"], g["cluster"], g["source"]) == (datetime(2024, 5, 1, 12, 0, 0, 123000), "east", "prometheus")
    assert r.gpus[0]["ts"] == datetime(2024, 5, 1, 12, 0, 0, 123000)  # the samples' precision everywhere


# --- bad input never loses the good lines ---


T4 = "t4_baremetal_dcgm4x_ericsson-ccd.prom"


def test_empty_body():
    for text in ("", "\n", "\n\n  \n", "# just a comment\n"):
        r = parse(text)
        assert r.samples.num_rows == 0 and r.samples.schema == SAMPLE_SCHEMA
        assert (r.gpus, r.allocations, r.rejected, r.problems) == ([], [], 0, [])


def test_body_without_final_newline_is_read_as_prometheus_reads_it_and_said():
    clean = parse(fixture(T4))
    text = fixture(T4)
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    assert last.startswith("DCGM_FI_PROF_PCIE_RX_BYTES") and last.endswith("} 6935930")
    r = parse(text.rstrip("\n"))  # a whole last line, no newline (the DataDog fixture's shape)
    assert r.rejected == 0 and rows(r) == rows(clean)
    assert r.warnings[0][0] == "no_final_newline" and "line 20" in r.warnings[0][1]
    r = parse(text[:len(text) - len(last) // 2])  # cut mid-labels: unreadable, rejected, the rest kept
    assert r.rejected == 1 and "line 20" in r.problems[0]
    [g] = rows(r)
    assert g["pcie_rx_bytes_per_s"] is None
    assert {k: v for k, v in g.items() if k != "pcie_rx_bytes_per_s"} == {k: v for k, v in rows(clean)[0].items() if k != "pcie_rx_bytes_per_s"}


def test_garbled_lines_in_the_middle_are_counted_and_skipped():
    clean = parse(fixture("a800x8_mig-2g.20gb_dcgm3x_subset.prom"))
    lines = fixture("a800x8_mig-2g.20gb_dcgm3x_subset.prom").splitlines()
    junk = [
        "garbage",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x" 55',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x"} fifty',
        "{{{}}}",
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",gpu="2",UUID="GPU-x"} 1',
        "# TYPE DCGM_FI_DEV_GPU_TEMP",
        bytes(range(256)).decode("latin-1").replace("\n", ""),
        b"\x00\xff\xfe garbage \xc3\x28".decode("utf-8", errors="replace"),
    ]
    garbled = "\n".join(lines[:40] + junk[:4] + lines[40:100] + junk[4:] + lines[100:]) + "\n"
    r = parse(garbled)
    assert r.rejected == len(junk)
    assert [p.split(":")[0] for p in r.problems] == [f"line {n}" for n in (41, 42, 43, 44, 105, 106, 107, 108)]
    assert r.samples.equals(clean.samples)
    assert r.gpus == clean.gpus


def test_label_values_with_escapes_commas_and_braces():
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="Weird \\"GPU\\", {v2} \\\\ \\n",Hostname="n1",'
        'namespace="ns",pod="we\\"ird,pod}"} 12\n'
    )
    r = parse(text)
    assert r.rejected == 0
    g = row(r, 0)
    assert g["model"] == 'Weird "GPU", {v2} \\ \n' and g["gpu_util"] == 12
    assert allocs(r) == {("kubernetes", 'ns/we"ird,pod}', "n1", "GPU-a", -1, 0)}


def test_huge_lines():
    good = sample_line("DCGM_FI_DEV_GPU_TEMP", gpu_labels(0, "GPU-a"), "40")
    huge_junk = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="' + '\\"' * 500_000 + "\n"
    huge_valid = sample_line("DCGM_FI_DEV_GPU_UTIL", gpu_labels(0, "GPU-a", annotation="x" * 200_000), "55")
    quotes = '"' * 300_000 + "\n"
    t = time.perf_counter()
    r = parse(good + huge_junk + quotes + huge_valid)
    assert time.perf_counter() - t < 5
    assert r.rejected == 2 and r.problems[0].startswith("line 2: unreadable line of 1000035 characters")
    g = row(r, 0)
    assert (g["gpu_temp_c"], g["gpu_util"]) == (40, 55)  # a long but well-formed line is read


def test_bad_label_values_are_rejected_per_line():
    text = (
        sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "nvidia0", "UUID": "GPU-a"}, "1")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "1"}, "1")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "2", "UUID": "GPU-c", "GPU_I_ID": "x"}, "1")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "99999", "UUID": "GPU-d"}, "1")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "3", "UUID": "GPU-\udcff"}, "1")  # surrogate-escaped bytes
        + sample_line("DCGM_FI_DEV_POWER_USAGE", {"gpu": "1"}, "1")
        + sample_line("DCGM_FI_DEV_GPU_TEMP", {"gpu": "4", "UUID": "GPU-e"}, "44")
    )
    r = parse(text)
    assert r.rejected == 6
    assert [p.split(":")[0] for p in r.problems] == [f"line {n}" for n in range(1, 7)]
    assert "bad gpu label" in r.problems[0] and "UUID" in r.problems[1] and "GPU_I_ID" in r.problems[2]
    assert [(x["gpu"], x["gpu_temp_c"]) for x in rows(r)] == [(4, 44)]


def test_problems_are_capped_but_every_rejection_counted():
    r = parse("junk\n" * 500 + sample_line("DCGM_FI_DEV_GPU_TEMP", gpu_labels(), "40"))
    assert r.rejected == 500 and len(r.problems) == MAX_PROBLEMS
    assert row(r, 0)["gpu_temp_c"] == 40


def test_crlf_line_endings():
    clean = parse(fixture(T4))
    r = parse(fixture(T4).replace("\n", "\r\n"))
    assert r.rejected == 0 and r.samples.equals(clean.samples)


# --- the fast path equals prometheus_client ---


def canon(s) -> tuple:
    def v(x):
        return ("nan",) if x != x else (type(x).__name__, x)

    return [(n, name, dict(labels), v(value)) for n, name, _, labels, value in s.samples], s.rejected, s.problems


def assert_same_as_reference(text: str) -> None:
    assert canon(scan(text)) == canon(scan(text, fast=False))


def assert_parse_same_as_reference(text: str) -> None:
    """The whole of parse_exposition (fast path + pivot) against the same with prometheus_client lines."""
    fast = parse(text)
    with mock.patch.object(parse_mod, "scan", functools.partial(fast_mod.scan, fast=False)):
        ref = parse(text)
    assert fast.samples.equals(ref.samples)
    assert (fast.gpus, fast.allocations, fast.rejected, fast.problems) == (ref.gpus, ref.allocations, ref.rejected, ref.problems)


def whole_text_reference(text: str) -> list:
    """prometheus_client on the whole body; its `_total` renaming of counters undone on both sides."""
    def key(name, labels, value):
        return (name.removesuffix("_total"), sorted(labels.items()), ("nan",) if value != value else value)

    return sorted(key(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples)


TRICKY_LINES = [
    'm{a="x,y",b="}{",c="= ,"} 1',
    'm{a="he said \\"hi\\"",b="back\\\\slash",c="new\\nline",d="tab\\there"} 2',
    'm{a="1", b="2",  c="3"} 3',
    'm{a="1",\tb="2"} 3',
    'm{ a="1"} 1', 'm{a="1" } 1', 'm{a="1",} 1', 'm{a = "1"} 1',
    "m{} 5", "m 5", "m 5 1700000000000", 'm{a="b"} 5 1700000000000', 'm{a="b"} 5 -1', 'm{a="b"} 5 1.5e3',
    'm{a="b"} -Inf', 'm{a="b"} +Inf', 'm{a="b"} Inf', 'm{a="b"} NaN', 'm{a="b"} nan', 'm{a="b"} 1e3', 'm{a="b"} 1E-3',
    'm{a="b"} .5', 'm{a="b"} 5.', 'm{a="b"} -0', 'm{a="b"} +7', 'm{a="b"} 0x10', 'm{a="b"} 1_000', 'm{a="b"} ١٢',
    'm{a="b"} 9223372036854775794', 'm{a="b"} 123456789012345678901234567890', 'm{a="b"} ' + "7" * 5000,
    'm{a="b"}  5', 'm{a="b"}\t5', 'm{a="b"}5', 'm{a="b"} 5 6 7', 'm{a="b"} 5 x', 'm{a="b"} ', 'm{a="b"}',
    'm{__name__="x"} 1', '{__name__="m",a="b"} 1', 'm{a="b",a="c"} 1', 'm{_="x"} 1', 'm{__x="y"} 1',
    'm{a:b="c"} 1', 'm{1a="b"} 1', "m{a=b} 1", 'm{a="b} 1', 'm{a="b"', 'm{"quoted.name"="v"} 1', 'm{a="b"}} 1',
    'm:sub_name{a="b"} 1', "0m 1", "m-x 1", "m\t5", " m 5", 'm{a="b"} 1 # {trace_id="x"} 1',
    "# HELP m some \"quoted\" doc", "# HELP m", "# HELP m  two  spaces", "# TYPE m gauge", "# TYPE m counter",
    "# TYPE m bogus", "# TYPE m", "# TYPE 0bad gauge", "# TYPE m gauge extra", "# random comment", "#", "#HELP m x",
    "# HELP m with \\\\ and \\n escapes", '# HELP "quoted" doc', "   ", "\t",
    'm{a="ünïcødé ✓"} 1', 'm{a="\x00\x01"} 1', 'm{a="\udcff"} 1', "m{a=\"\u2028\"} 1", "m 1\u2028",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0", UUID="GPU-1"} 9',
    'm{a="' + "x" * 15000 + '"} 1', "q" * (MAX_LINE_CHARS + 10),
]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fast_path_equals_prometheus_client_on_fixtures(path, monkeypatch):
    text = path.read_text()
    assert_same_as_reference(text)
    mine = sorted((name.removesuffix("_total"), sorted(labels.items()), value) for _, name, _, labels, value in scan(text).samples)
    assert mine == whole_text_reference(text)
    assert_parse_same_as_reference(text)
    # and the fast path did all the work: no line needed prometheus_client
    monkeypatch.setattr(fast_mod, "reference_line", lambda line: pytest.fail(f"slow path for {line!r}"))
    scan(text)


def test_fast_path_equals_prometheus_client_on_gpufleet_output(monkeypatch):
    text, _ = gpufleet_exposition()
    assert_same_as_reference(text)
    assert_parse_same_as_reference(text)
    mine = sorted((name.removesuffix("_total"), sorted(labels.items()), value) for _, name, _, labels, value in scan(text).samples)
    assert mine == whole_text_reference(text)
    monkeypatch.setattr(fast_mod, "reference_line", lambda line: pytest.fail(f"slow path for {line!r}"))
    scan(text)


def test_fast_path_equals_prometheus_client_on_tricky_lines():
    text = "\n".join(TRICKY_LINES) + "\n"
    assert_same_as_reference(text)
    for line in TRICKY_LINES:
        assert_same_as_reference(line + "\n")
    dcgm_like = "\n".join(line.replace("m{", 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",') for line in TRICKY_LINES) + "\n"
    assert_parse_same_as_reference(dcgm_like)
    assert [x["gpu_util"] for x in rows(parse(dcgm_like)) if x["gpu_uuid"] == "GPU-a"] == [1]  # the last good line wins
    r = scan(text)
    assert 0 < r.rejected < len(TRICKY_LINES) and len(r.samples) > 40


_FRAGMENTS = st.sampled_from(['"', "\\", ",", "{", "}", "=", " ", "\t", "#", "a", "_", "__", ":", "0", "1", ".", "e", "-", "+",
                              "Inf", "NaN", "\\\"", "\\\\", "\\n", "é", "\x00", "TYPE", "HELP", "gauge", "\r"])
_ESCAPED_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=10).map(
    lambda t: t.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))  # a valid label value
_LABEL_VALUE = st.one_of(_ESCAPED_TEXT, st.lists(_FRAGMENTS, max_size=6).map("".join))
_VALUE = st.one_of(st.sampled_from(["0", "1", "-1", "1.5", "1e3", "NaN", "+Inf", "-Inf", "9223372036854775794", "5 1700000000000"]),
                   st.lists(_FRAGMENTS, max_size=4).map("".join))


# _line's and _gpu_line's draws, built once: a strategy built inside a draw is validated and
# labelled again at every draw
_KINDS = st.sampled_from(["junk", "bare", "comment", "sample", "valid", "valid"])
_JUNK = st.lists(_FRAGMENTS, max_size=12).map("".join)
_VALID_KEYS = st.lists(st.sampled_from(["a", "gpu", "UUID", "Hostname", "GPU_I_ID", "pod", "namespace", "hpc_job"]), max_size=5, unique=True)
_COMMA = st.sampled_from([",", ", "])
_INDEX = st.sampled_from(["0", "1", "x"])
_VALID_VALUE = st.sampled_from(["0", "1", "-1", "1.5", "68.244000", "1e3", "NaN", "+Inf", "9223372036854775794", "5 1700000000000"])
_VALID_NAME = st.sampled_from(["m", "a:b", "DCGM_FI_DEV_GPU_UTIL", "dcgm_power_violation", "gpufleet_gpu_job_info"])
_ANY_NAME = st.sampled_from(["m", "DCGM_FI_DEV_GPU_UTIL", "a:b", "_x", "0bad", "", "m m"])
_COMMENT = st.sampled_from(['HELP', 'TYPE', 'other'])
_LABELS = st.lists(st.tuples(st.sampled_from(["a", "b", "gpu", "UUID", "__x", "1", "a:b", ""]), _LABEL_VALUE), max_size=4)
_SEP = st.sampled_from([",", ", ", ",\t", ""])
_SPACE = st.sampled_from([' ', '  ', ''])


@st.composite
def _line(draw) -> str:
    kind = draw(_KINDS)
    if kind == "junk":
        return draw(_JUNK)
    if kind == "valid":  # well-formed, with arbitrary (escaped) label values: what the fast path takes
        keys = draw(_VALID_KEYS)
        body = draw(_COMMA).join(f'{k}="{draw(_INDEX if k in ("gpu", "GPU_I_ID") else _ESCAPED_TEXT)}"' for k in keys)
        value = draw(_VALID_VALUE)
        name = draw(_VALID_NAME)
        return f"{name}{{{body}}} {value}"
    name = draw(_ANY_NAME)
    if kind == "bare":
        return f"{name} {draw(_VALUE)}"
    if kind == "comment":
        return f"# {draw(_COMMENT)} {name} {draw(_LABEL_VALUE)}"
    labels = draw(_LABELS)
    sep = draw(_SEP)
    body = sep.join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{body}}}{draw(_SPACE)}{draw(_VALUE)}"


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line(), max_size=8), st.booleans())
def test_fast_path_equals_prometheus_client_on_generated_input(lines, final_newline):
    assert_same_as_reference("\n".join(lines) + ("\n" if final_newline else ""))


_GPU_LABELS = (("GPU_I_ID", ["1", "2"]), ("Hostname", ["n1", "n2", ""]), ("hostname", ["n3"]),
               ("pod", ["p", "dcgm-exporter-x", ""]), ("namespace", ["ns", "gpu-operator"]),
               ("exported_pod", ["q"]), ("exported_namespace", ["ns2"]), ("hpc_job", ["0", "7", "8"]),
               ("scheduler", ["slurm", "kubernetes"]), ("job_id", ["9"]), ("modelName", ["A \\\"B\\\"", "H100"]))
_GPU_LABEL_VALUES = {key: st.sampled_from(values) for key, values in _GPU_LABELS}
_UUIDS = st.sampled_from(["GPU-a", "GPU-b", ""])
_GPU_NAMES = st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                              "dcgm_power_violation", "gpufleet_gpu_up", "gpufleet_gpu_job_info", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"])
_GPU_VALUES = st.sampled_from(["0", "1", "55.5", "9223372036854775794", "NaN", "-Inf", "1e3", "x"])


@st.composite
def _gpu_line(draw) -> str:
    """A GPU series as exporters write it, with the labels parse_exposition reads, in any order."""
    labels = {"gpu": draw(_INDEX), "UUID": draw(_UUIDS)}
    for key, _ in _GPU_LABELS:
        if draw(st.booleans()):
            labels[key] = draw(_GPU_LABEL_VALUES[key])
    items = draw(st.permutations(list(labels.items())))
    name = draw(_GPU_NAMES)
    value = draw(_GPU_VALUES)
    return f"{name}{{{','.join(f'{k}={chr(34)}{v}{chr(34)}' for k, v in items)}}} {value}"


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_line(), _gpu_line(), _gpu_line()), max_size=10))
def test_parse_is_the_same_with_the_fast_path_on_generated_input(lines):
    assert_parse_same_as_reference("\n".join(lines) + "\n")


def test_fast_path_reads_a_1024_gpu_exposition_without_falling_back(monkeypatch):
    text, _ = gpufleet_exposition()
    dcgm = fixture("a800x8_mig-2g.20gb_dcgm3x_subset.prom")
    big = "".join(dcgm.replace("msxf-hpc-64-35-ai", f"node-{i:03d}") for i in range(128)) + text
    monkeypatch.setattr(fast_mod, "reference_line", lambda line: pytest.fail(f"slow path for {line!r}"))
    r = parse(big)
    assert r.samples.num_rows == 128 * 10 + 5 and r.rejected == 0
    a800_power = 78.174 * 2 + 78.446 + 55.942 + 53.752 + 56.990 + 58.643 + 54.581 + 57.145 + 55.011
    assert math.isclose(sum(x["power_w"] for x in rows(r) if x["host"] == "node-127"), a800_power, rel_tol=1e-5)


def test_a_label_set_seen_in_an_earlier_scrape_is_read_with_this_scrapes_target():
    """What a label set means is cached across scrapes; the host it gets must still be this scrape's."""
    labels = {k: v for k, v in gpu_labels(hpc_job="42").items() if k != "Hostname"}
    text = sample_line("DCGM_FI_DEV_GPU_UTIL", labels, "7")
    for target, extra, host in (("n1:9400", {}, "n1"), ("n2:9400", {}, "n2"), ("n2:9400", {"target_labels": {"node": "x"}}, "x"),
                                ("n1:9400", {}, "n1")):
        r = parse(text, target=target, **extra)
        assert [(x["host"], x["gpu_util"]) for x in rows(r)] == [(host, 7)]
        assert allocs(r) == {("slurm", "42", host, "GPU-aaaa", -1, 0)}  # every scrape observes its jobs


def test_one_table_for_many_scrapes_is_their_tables_end_to_end():
    """samples_table (a scrape round's one table) equals the per-scrape tables concatenated,
    for scrapes of one time and of several."""
    import pyarrow as pa

    from gpufleet.collector.exposition_parse import parse_rows, samples_table

    texts = [fixture(f.name) for f in FIXTURES[:4]] + [gpufleet_exposition()[0], "", "junk\n"]
    for times in ([TS] * len(texts), [TS + timedelta(seconds=15 * i) for i in range(len(texts))]):
        kw = [dict(ts=t, cluster="c1", target=f"n{i}:9400") for i, t in enumerate(times)]
        one = samples_table([parse_rows(text, **k) for text, k in zip(texts, kw)])
        each = pa.concat_tables([parse_exposition(text, **k).samples for text, k in zip(texts, kw)])
        assert one.schema == SAMPLE_SCHEMA and one.num_rows > 10
        assert one.to_pylist() == each.to_pylist()


def test_profiling_rates_are_stored_and_absent_ones_are_null():
    """PCIe and NVLink rates (DCP, or ours through GPM) are sample columns: what tells an
    input-bound job from a communication-bound one (gpufleet.analytics.states). A GPU that does
    not publish one has NULL there, never 0."""
    labels = {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1"}
    text = (
        sample_line("DCGM_FI_PROF_SM_ACTIVE", labels, "0.18")
        + sample_line("DCGM_FI_PROF_PCIE_RX_BYTES", labels, "11000000000")
        + sample_line("DCGM_FI_PROF_NVLINK_TX_BYTES", labels, "2.5e11")
        + sample_line("DCGM_FI_PROF_NVLINK_RX_BYTES", labels, "2.4e11")
        + sample_line("DCGM_FI_PROF_SM_ACTIVE", {**labels, "gpu": "1", "UUID": "GPU-b"}, "0.5")
    )
    r = parse(text)
    a, b = sorted(rows(r), key=lambda g: g["gpu"])
    assert math.isclose(a["sm_active"], 0.18, rel_tol=1e-6) and a["pcie_rx_bytes_per_s"] == pytest.approx(11e9, rel=1e-6)
    assert a["nvlink_tx_bytes_per_s"] == pytest.approx(2.5e11, rel=1e-6) and a["nvlink_rx_bytes_per_s"] == pytest.approx(2.4e11, rel=1e-6)
    assert (b["pcie_rx_bytes_per_s"], b["nvlink_tx_bytes_per_s"], b["nvlink_rx_bytes_per_s"]) == (None, None, None)


def test_foreign_processes_are_summed_over_the_intruding_jobs():
    """gpufleet_gpu_foreign_processes has one series per GPU and intruding job: the GPU's column is
    their sum (the real H200 capture: two jobs' processes on a GPU the job map says is free); a
    GPU without such a series has NULL, and a bad count is rejected with its line."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "nvml-h200" / "two_jobs_shared.prom").read_text()
    [g] = [r for r in rows(parse(text)) if r["gpu"] == 0]
    assert g["foreign_processes"] == 2 and g["compute_processes"] == 2
    labels = {"gpu": "1", "UUID": "GPU-b", "Hostname": "n1"}
    r = parse(sample_line("DCGM_FI_DEV_GPU_TEMP", labels, "40")
              + sample_line("gpufleet_gpu_foreign_processes", {**labels, "job_id": "7"}, "-1"))
    assert [x["foreign_processes"] for x in rows(r)] == [None]
    assert r.rejected == 1 and "gpufleet_gpu_foreign_processes value -1" in r.problems[0]
