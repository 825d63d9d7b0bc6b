"""Slurm mapping-directory and cgroup sources: real formats, and bad input that never crashes."""

from __future__ import annotations

import os

import pytest

from gpufleet.exporter.jobmap.base import MappingError
from gpufleet.exporter.jobmap.cgroup import CgroupProcessSource, job_from_cgroup
from gpufleet.exporter.jobmap.slurm_dir import SlurmMappingDirSource
from gpufleet.exporter.model import GpuIdentity, GpuProcess

GPUS = [GpuIdentity(index=i, uuid=f"GPU-{i}", model="m") for i in range(4)]


def test_mapping_dir_whole_gpus_mig_shared_and_idle_markers(tmp_path):
    (tmp_path / "0").write_text("123\n")
    (tmp_path / "1").write_text("123\n124_7\n")  # shared by a job and an array task
    (tmp_path / "2").write_text("0\n")  # some prologs write 0 for idle
    (tmp_path / "3.5").write_text("900+1\n")  # MIG instance 5 of GPU 3, het job component
    (tmp_path / ".0.tmp").write_text("999\n")  # the prolog's temp file: ignored
    src = SlurmMappingDirSource(tmp_path)
    got = sorted((b.gpu_index, b.gpu_instance_id, b.job_id) for b in src.collect(GPUS, {}))
    assert got == [(0, None, "123"), (1, None, "123"), (1, None, "124_7"), (3, 5, "900+1")]
    assert src.problems == []


def test_mapping_dir_junk_is_counted_and_good_rows_kept(tmp_path):
    (tmp_path / "0").write_text("123\nDROP TABLE jobs;\n\n456\n")
    (tmp_path / "gpu1").write_text("77\n")
    (tmp_path / "1.x").write_text("78\n")
    (tmp_path / "2").mkdir()
    (tmp_path / "3").write_bytes(b"\xff\xfe321\n55\n")
    src = SlurmMappingDirSource(tmp_path)
    got = sorted((b.gpu_index, b.job_id) for b in src.collect(GPUS, {}))
    assert got == [(0, "123"), (0, "456"), (3, "55")]
    assert len(src.problems) == 5
    assert any("'DROP TABLE jobs;' is not a Slurm job id" in p for p in src.problems)
    assert any("gpu1: name is not <gpu index>" in p for p in src.problems)


def test_mapping_dir_missing_or_unreadable_raises_mapping_error(tmp_path):
    with pytest.raises(MappingError, match="does not exist: expected the directory the Slurm prolog writes"):
        SlurmMappingDirSource(tmp_path / "nope").collect(GPUS, {})
    if os.geteuid() != 0:  # root reads anything
        d = tmp_path / "locked"
        d.mkdir(mode=0)
        with pytest.raises(MappingError, match="unreadable"):
            SlurmMappingDirSource(d).collect(GPUS, {})


@pytest.mark.parametrize(
    "text, job",
    [
        ("12:devices:/slurm/uid_1000/job_4242/step_0/task_0\n0::/\n", "4242"),  # cgroup v1
        ("0::/system.slice/slurmstepd.scope/job_17/step_batch/user/task_0\n", "17"),  # cgroup v2
        ("0::/system.slice/slurmstepd.scope/job_17\n", "17"),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/kubepods/burstable/pod1234/abcd\n", None),
        ("garbage without colons\n", None),
        ("", None),
    ],
)
def test_job_from_cgroup_paths(text, job):
    assert job_from_cgroup(text) == job


def test_cgroup_source_maps_processes_and_skips_vanished_ones(tmp_path):
    for pid, text in ((100, "0::/system.slice/slurmstepd.scope/job_55/step_0/user/task_0\n"), (200, "0::/user.slice\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    procs = {0: [GpuProcess(pid=100), GpuProcess(pid=200), GpuProcess(pid=300)], 1: [GpuProcess(pid=100, gpu_instance_id=2)]}
    src = CgroupProcessSource(tmp_path)
    got = [(b.gpu_index, b.job_id, b.pid, b.gpu_instance_id) for b in src.collect(GPUS, procs)]
    assert got == [(0, "55", 100, None), (1, "55", 100, 2)]
    assert src.problems == []
