"""utkuozdemir/nvidia_gpu_exporter outputs (shared/data/nvidia_gpu_exporter) -> canonical rows,
and the edges of real bodies: a UTF-8 BOM, no final newline, a pod name as Hostname, families
nothing reads."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.exposition_parse import parse_exposition, smi_uuid
from gpufleet.collector.schema import NVIDIA_SMI_TO_COLUMN, SAMPLE_FIELDS
from tests.support.shared_data import SHARED_DATA, shared_glob

DATA = SHARED_DATA
SMI = shared_glob("nvidia_gpu_exporter", "*.metrics")
TS = datetime(2024, 5, 1, 12, 0, 0)
TYPES = {f.column: f.type for f in SAMPLE_FIELDS}


def parse(text: str, target: str = "10.0.0.5:9835", **kw):
    return parse_exposition(text, ts=TS, cluster="c1", target=target, **kw)


def file_values(text: str) -> dict[str, dict[str, float]]:
    """uuid -> metric -> value, read by prometheus_client (the reference reader)."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "uuid" in s.labels:
                out.setdefault(s.labels["uuid"], {})[s.name] = s.value
    return out


def as_column(column: str, value: float):
    """The file's value in the column's unit and type, as the store keeps it."""
    t = TYPES[column]
    if pa.types.is_integer(t):
        return round(value)
    return pa.scalar(value, pa.float64()).cast(t).as_py()


@pytest.mark.parametrize("path", SMI, ids=lambda p: p.name)
def test_every_mapped_field_equals_the_file(path):
    text = path.read_text()
    r = parse(text)
    ref = file_values(text)
    assert r.rejected == 0 and r.problems == []
    assert [kind for kind, _ in r.warnings] == (["mig_no_utilization"] if "mig" in path.name else [])  # said, issue #51
    rows = r.samples.to_pylist()
    assert len(rows) == len(ref) >= 1
    mapped = 0
    for row in rows:
        [uuid] = [u for u in ref if smi_uuid(u) == row["gpu_uuid"]]
        values = ref[uuid]
        assert row["gpu"] == int(values["nvidia_smi_index"])
        assert row["host"] == "10.0.0.5" and row["gpu_instance"] is None and row["source"] == "scrape"
        for name, (column, scale) in NVIDIA_SMI_TO_COLUMN.items():
            if name in values:
                assert row[column] == as_column(column, values[name] * scale), (name, column)
                mapped += 1
        # columns no nvidia_smi family feeds stay unknown, never 0
        fed = {NVIDIA_SMI_TO_COLUMN[n][0] for n in values if n in NVIDIA_SMI_TO_COLUMN}
        assert all(row[c] is None for c in TYPES if c not in fed)
    assert mapped >= 14
    [info] = [s for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == "nvidia_smi_gpu_info"]
    [gpu] = r.gpus
    assert (gpu["model"], gpu["driver_version"], gpu["gpu_uuid"]) == (info.labels["name"], info.labels["driver_version"], smi_uuid(info.labels["uuid"]))
    assert gpu["fb_total_mib"] == as_column("fb_total_mib", ref[info.labels["uuid"]]["nvidia_smi_memory_total_bytes"] / 2**20)


def test_mig_gpu_has_no_utilization_not_zero():
    [path] = [p for p in SMI if "mig" in p.name] or [DATA / "nvidia_gpu_exporter" / "mig"]  # (absent: opening it skips)
    [row] = parse(path.read_text()).samples.to_pylist()
    assert row["gpu_util"] is None and row["mem_copy_util"] is None  # nvidia-smi shows N/A on MIG GPUs
    assert row["fb_used_mib"] is not None and row["power_w"] is not None


def test_two_gpus_and_real_uuids():
    text = "".join(
        f'nvidia_smi_index{{uuid="{u}"}} {i}\nnvidia_smi_utilization_gpu_ratio{{uuid="{u}"}} 0.{i + 4}\n'
        for i, u in enumerate(["3f2a0c1e-aaaa-bbbb-cccc-000000000001", "GPU-3f2a0c1e-aaaa-bbbb-cccc-000000000002"]))
    rows = sorted(parse(text).samples.to_pylist(), key=lambda r: r["gpu"])
    assert [(r["gpu"], r["gpu_uuid"], r["gpu_util"]) for r in rows] == [
        (0, "GPU-3f2a0c1e-aaaa-bbbb-cccc-000000000001", 40.0), (1, "GPU-3f2a0c1e-aaaa-bbbb-cccc-000000000002", 50.0)]


def test_series_without_an_index_are_rejected_by_name():
    r = parse('nvidia_smi_index{uuid="a"} 0\nnvidia_smi_utilization_gpu_ratio{uuid="a"} 0.5\n'
              'nvidia_smi_utilization_gpu_ratio{uuid="b"} 0.7\n')
    assert [x["gpu_util"] for x in r.samples.to_pylist()] == [50.0]
    assert r.rejected == 1 and "'b'" in r.problems[0] and "nvidia_smi_index" in r.problems[0]


def test_bom_and_missing_final_newline():
    text = (DATA / "nvidia_gpu_exporter" / SMI[0].name).read_text()
    clean = parse(text).samples.to_pylist()
    bom = parse("\ufeff" + text)
    assert bom.samples.to_pylist() == clean and bom.rejected == 0
    body = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1"} 42'  # one line, no newline
    r = parse("\ufeff" + body)
    assert [x["gpu_util"] for x in r.samples.to_pylist()] == [42.0] and r.rejected == 0
    assert r.warnings[0][0] == "no_final_newline" and "no newline" in r.warnings[0][1]
    [ref] = [s.value for fam in text_string_to_metric_families(body) for s in fam.samples]
    assert ref == 42.0  # what Prometheus' own parser reads


def test_pod_name_hostname_gives_way_to_a_node_label():
    line = 'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="nvidia-dcgm-exporter-sv6g2"{extra}}} 7\n'
    r = parse(line.format(extra=',kubernetes_node="gpu-node-3"'))
    [row] = r.samples.to_pylist()
    assert row["host"] == "gpu-node-3" and r.allocations == []
    [(kind, text)] = r.warnings
    assert kind == "pod_hostname" and "nvidia-dcgm-exporter-sv6g2" in text and "kubernetes_node" in text
    r = parse(line.format(extra=""))
    assert r.samples.to_pylist()[0]["host"] == "nvidia-dcgm-exporter-sv6g2"  # kept (nothing better), but said
    assert "pod name" in r.warnings[0][1] and "node" in r.warnings[0][1]
    r = parse(line.format(extra=""), target_labels={"node": "n7"})
    assert r.samples.to_pylist()[0]["host"] == "n7" and r.warnings == []  # the operator said which node
    r = parse(line.format(extra="").replace("nvidia-dcgm-exporter-sv6g2", "gpu-node-1"))
    assert r.warnings == []


def test_unknown_families_are_named():
    r = parse('node_cpu_seconds_total{cpu="0"} 5\nsome_other_gpu_metric{gpu="0",UUID="GPU-a"} 1\n')
    assert r.samples.num_rows == 0 and r.rejected == 0
    assert r.unknown_names == ["node_cpu_seconds_total", "some_other_gpu_metric"]


# --- invariants ---

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SMI_VALUES = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(sorted(NVIDIA_SMI_TO_COLUMN)), _SMI_VALUES, min_size=1),
       st.integers(0, 31), st.sampled_from(["", "GPU-"]))
def test_every_mapped_family_is_its_value_times_its_scale(values, index, prefix):
    uuid = prefix + "3f2a0c1e-aaaa-bbbb-cccc-00000000abcd"
    text = f'nvidia_smi_index{{uuid="{uuid}"}} {index}\n' + "".join(f'{n}{{uuid="{uuid}"}} {v!r}\n' for n, v in values.items())
    r = parse(text)
    [row] = r.samples.to_pylist()
    assert (row["gpu"], row["gpu_uuid"], r.rejected) == (index, "GPU-3f2a0c1e-aaaa-bbbb-cccc-00000000abcd", 0)
    by_column: dict[str, float] = {}
    for name, v in values.items():  # two names of one column (throttle/event reasons): the later line wins
        by_column[NVIDIA_SMI_TO_COLUMN[name][0]] = v * NVIDIA_SMI_TO_COLUMN[name][1]
    for column, v in by_column.items():
        t = TYPES[column]
        if pa.types.is_integer(t):
            assert row[column] == (round(v) if round(v) < 2**63 - 16 else None)
        else:
            assert row[column] == pa.scalar(v, pa.float64()).cast(t).as_py()


_LINES = st.lists(st.sampled_from([
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1"} 42',
    'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",Hostname="n1"} 1024',
    'nvidia_smi_index{uuid="c"} 2',
    'nvidia_smi_utilization_gpu_ratio{uuid="c"} 0.25',
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    "garbage line",
    "",
]), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_LINES)
def test_bom_and_final_newline_change_nothing_but_a_note(lines):
    """A BOM in front, or the last newline missing: the same rows, the same rejects."""
    text = "\n".join(lines) + "\n"
    clean = parse(text)
    for variant in ("\ufeff" + text, text.rstrip("\n") if text.strip() else text):
        r = parse(variant)
        assert r.samples.to_pylist() == clean.samples.to_pylist()
        assert r.rejected == clean.rejected
        assert [k for k, _ in r.warnings if k != "no_final_newline"] == [k for k, _ in clean.warnings]


def test_mig_gpu_without_utilization_is_said():
    """nvidia-smi gives no utilization in MIG mode: the GPU's samples hold every other field, so
    the missing one is said (a warning the collector turns into a Health page entry)."""
    from gpufleet.collector.exposition_parse import MIG_NO_UTILIZATION

    for path in SMI:
        said = [text for kind, text in parse(path.read_text()).warnings if kind == "mig_no_utilization"]
        if "mig" in path.name:
            assert len(said) == 1 and MIG_NO_UTILIZATION in said[0] and "(index 0)" in said[0], said
        else:
            assert said == [], path.name
