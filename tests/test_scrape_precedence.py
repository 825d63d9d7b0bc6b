"""One GPU reported by both dcgm-exporter and the gpufleet exporter in one scrape round: one row,
dcgm-exporter's value per field, the gpufleet exporter's where dcgm-exporter has none
(collector.exposition_parse.PRECEDENCE, issue #14)."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.collector.exposition_parse import PRECEDENCE
from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus

TS = datetime(2026, 11, 16, 10, 0)
UUID = "GPU-ddd410c6-7d9d-a975-abed-7cedd4847d44"
BLANK = "9223372036854775794"  # DCGM's int64 blank

# metric -> store column, for the fields the property test varies
FIELDS = {
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
}


def labels(gpu: int = 0, uuid: str = UUID, **extra: str) -> str:
    base = {"gpu": str(gpu), "UUID": uuid, "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1", **extra}
    return ",".join(f'{k}="{v}"' for k, v in base.items())


def dcgm_exporter(values: dict[str, str], gpu: int = 0, uuid: str = UUID) -> str:
    return "".join(f"{m}{{{labels(gpu, uuid, DCGM_FI_DRIVER_VERSION='580.159.04')}}} {v}\n" for m, v in values.items())


def gpufleet(values: dict[str, str], gpu: int = 0, uuid: str = UUID) -> str:
    text = "".join(f"{m}{{{labels(gpu, uuid)}}} {v}\n" for m, v in values.items())
    text += f'gpufleet_gpu_up{{gpu="{gpu}",UUID="{uuid}",Hostname="n1"}} 1\n'
    text += f'gpufleet_gpu_compute_processes{{gpu="{gpu}",UUID="{uuid}",Hostname="n1"}} 2\n'
    text += f'gpufleet_gpu_job_info{{gpu="{gpu}",UUID="{uuid}",Hostname="n1",scheduler="slurm",job_id="4242"}} 1\n'
    text += 'gpufleet_build_info{version="0.1.0",backend="nvml",python_version="3.12.3"} 1\n'
    return text


def round_rows(*bodies: str) -> list[dict]:
    src = ScrapeSource(cluster="c1", static_targets=[])
    answers = [(Target(f"n1:{9400 + i}"), TargetStatus(up=True), body) for i, body in enumerate(bodies)]
    batch = src.round_batch(TS, answers)
    return batch.samples.to_pylist(), batch


def test_dcgm_exporter_wins_per_field_and_ours_fills_the_gaps():
    dcgm = dcgm_exporter({"DCGM_FI_DEV_GPU_UTIL": "80", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.5", "DCGM_FI_PROF_SM_ACTIVE": BLANK})
    ours = gpufleet({"DCGM_FI_DEV_GPU_UTIL": "81", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.45", "DCGM_FI_PROF_SM_ACTIVE": "0.9",
                     "DCGM_FI_PROF_DRAM_ACTIVE": "0.25"})
    for bodies in ((dcgm, ours), (ours, dcgm)):  # the order of the targets does not matter
        [row], batch = round_rows(*bodies)
        assert row["gpu_util"] == 80 and row["tensor_active"] == 0.5  # dcgm-exporter's
        assert abs(row["sm_active"] - 0.9) < 1e-6  # its blank: ours
        assert abs(row["dram_active"] - 0.25) < 1e-6  # only ours has it
        assert row["compute_processes"] == 2 and row["gpu_up"] == 1  # gpufleet's own series
        assert [(a["job_key"], a["gpu_uuid"]) for a in batch.allocations] == [("4242", UUID)]


def test_dcgm_exporter_without_dcp_takes_tensor_activity_from_our_gpm():
    [row], _ = round_rows(dcgm_exporter({"DCGM_FI_DEV_GPU_UTIL": "99"}), gpufleet({"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.934"}))
    assert row["gpu_util"] == 99 and abs(row["tensor_active"] - 0.934) < 1e-6


def test_different_gpus_and_one_exporter_alone_are_untouched():
    rows, _ = round_rows(dcgm_exporter({"DCGM_FI_DEV_GPU_UTIL": "10"}), gpufleet({"DCGM_FI_DEV_GPU_UTIL": "20"}, gpu=1, uuid="GPU-other"))
    assert sorted((r["gpu_uuid"], r["gpu_util"]) for r in rows) == sorted([("GPU-other", 20), (UUID, 10)])
    [row], _ = round_rows(gpufleet({"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.3"}))
    assert abs(row["tensor_active"] - 0.3) < 1e-6
    assert PRECEDENCE == ("dcgm-exporter", "gpufleet")


value = st.one_of(st.none(), st.just(BLANK), st.floats(0, 1).map(lambda v: repr(round(v, 4))))


@settings(max_examples=80, deadline=None)
@given(dcgm=st.fixed_dictionaries({m: value for m in FIELDS}), ours=st.fixed_dictionaries({m: value for m in FIELDS}),
       swap=st.booleans())
def test_each_field_comes_from_the_first_exporter_with_data(dcgm, ours, swap):
    d = dcgm_exporter({m: v for m, v in dcgm.items() if v is not None} or {"DCGM_FI_DEV_MEM_CLOCK": "2619"})
    o = gpufleet({m: v for m, v in ours.items() if v is not None})
    rows, _ = round_rows(*((o, d) if swap else (d, o)))
    assert len(rows) == 1  # one GPU, one row, whoever reported what
    for metric, column in FIELDS.items():
        have = [float(v) for v in (dcgm[metric], ours[metric]) if v is not None and v != BLANK]
        got = rows[0][column]
        if not have:
            assert got is None
        else:
            assert got is not None and abs(got - have[0]) < 1e-3, (metric, dcgm[metric], ours[metric], got)


# --- read back from a TSDB: each exporter's samples carry their own scrape times ---

def tsdb_series(exporter_text: str, instance: str, times: list[float]) -> list[dict]:
    """The Prometheus API's answer for one target's text scraped at `times` (one value per series)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(exporter_text):
        for s in fam.samples:
            out.append({"metric": {"__name__": s.name, **s.labels, "instance": instance},
                        "values": [[t, str(s.value)] for t in times]})
    return out


def test_from_a_tsdb_our_samples_fold_into_the_nearest_dcgm_exporter_sample_of_the_gpu():
    from gpufleet.collector.exposition_parse import PRECEDENCE_WITHIN_S
    from gpufleet.collector.sources.prometheus_api import PrometheusApiSource

    t0 = TS.replace(tzinfo=timezone.utc).timestamp()
    at = lambda t: datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None)  # noqa: E731
    dcgm = tsdb_series(dcgm_exporter({"DCGM_FI_DEV_GPU_UTIL": "80", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.5"}), "n1:9400",
                       [t0 + 30, t0 + 60])
    # ours every 15 s, then on alone for a stretch dcgm-exporter did not cover
    late = t0 + 60 + PRECEDENCE_WITHIN_S + 15
    ours = tsdb_series(gpufleet({"DCGM_FI_DEV_GPU_UTIL": "81", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "0.45",
                                 "DCGM_FI_PROF_DRAM_ACTIVE": "0.25"}), "n1:9401",
                       [t0 + 15, t0 + 30, t0 + 45, t0 + 60, t0 + 75, late])
    src = PrometheusApiSource(url="http://unused", cluster="c1")
    batch = src._to_batch(dcgm + ours, TS, at(late + 1))
    rows = sorted(batch.samples.to_pylist(), key=lambda r: r["ts"])
    # dcgm-exporter's two samples carry its values, with ours filling its gaps ...
    [(a, b), (c,)] = [[r for r in rows if r["gpu_util"] == 80], [r for r in rows if r["gpu_util"] == 81]]
    for r in (a, b):
        assert r["tensor_active"] == 0.5 and abs(r["dram_active"] - 0.25) < 1e-6 and r["compute_processes"] == 2
    # ... and only our sample farther than PRECEDENCE_WITHIN_S from any of dcgm-exporter's stays
    assert c["ts"] == at(late) and abs(c["tensor_active"] - 0.45) < 1e-6
    assert [(x["job_key"], x["gpu_uuid"]) for x in batch.allocations][:1] == [("4242", UUID)]
