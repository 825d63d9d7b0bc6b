"""The shipped Slurm prolog/epilog run as Slurm runs them (env vars only), without Slurm.

The real-Slurm test is in test_slurm_jobmap_real.py; these pin the file format and the
minor-number translation cheaply.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.jobmap.slurm_dir import SlurmMappingDirSource
from exporter.model import GpuIdentity

KIT = Path(__file__).resolve().parents[1] / "compose" / "node" / "slurm"


@pytest.fixture
def kit(tmp_path):
    """A copy of the node kit with its own node.conf pointing into tmp_path."""
    d = tmp_path / "kit"
    shutil.copytree(KIT, d)
    (d / "node.conf").write_text(f"JOB_MAP_DIR={tmp_path / 'map'}\nDEVICE_MAP={tmp_path / 'devices.tsv'}\n")
    # NVML index -> minor: 0->3, 1->2, 2->1, 3->0 (reversed, as on some real nodes)
    (tmp_path / "devices.tsv").write_text("# index minor uuid pci_bus_id\n0 3 GPU-a -\n1 2 GPU-b -\n2 1 GPU-c -\n3 0 GPU-d -\n")
    return d


def run(script: Path, **env) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], **env}
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=30)


def mapping(tmp_path) -> dict[str, list[str]]:
    d = tmp_path / "map"
    return {f.name: f.read_text().split() for f in sorted(d.iterdir()) if not f.name.startswith(".")} if d.exists() else {}


def test_prolog_translates_minor_numbers_to_nvml_indices(kit, tmp_path):
    r = run(kit / "prolog.sh", SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    assert r.returncode == 0, r.stderr
    # minors 0 and 1 are NVML indices 3 and 2 - not 0 and 1
    assert mapping(tmp_path) == {"2": ["101"], "3": ["101"]}


def test_shared_gpu_two_jobs_then_epilog_removes_only_its_job(kit, tmp_path):
    run(kit / "prolog.sh", SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    run(kit / "prolog.sh", SLURM_JOB_ID="102", SLURM_JOB_GPUS="1,2")
    run(kit / "prolog.sh", SLURM_JOB_ID="102", SLURM_JOB_GPUS="1,2")  # requeue/retry: no duplicate line
    assert mapping(tmp_path) == {"1": ["102"], "2": ["101", "102"], "3": ["101"]}
    gpus = [GpuIdentity(index=i, uuid=f"GPU-{i}", model="m") for i in range(4)]
    got = sorted((b.gpu_index, b.job_id) for b in SlurmMappingDirSource(tmp_path / "map").collect(gpus, {}))
    assert got == [(1, "102"), (2, "101"), (2, "102"), (3, "101")]
    assert run(kit / "epilog.sh", SLURM_JOB_ID="101").returncode == 0
    assert mapping(tmp_path) == {"1": ["102"], "2": ["102"]}
    run(kit / "epilog.sh", SLURM_JOB_ID="102")
    assert mapping(tmp_path) == {}


def test_unknown_minor_is_logged_not_guessed_and_prolog_still_succeeds(kit, tmp_path):
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="1,9")
    assert r.returncode == 0
    assert mapping(tmp_path) == {"2": ["7"]}


def test_no_device_map_and_no_driver_maps_nothing(kit, tmp_path):
    (tmp_path / "devices.tsv").unlink()
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert mapping(tmp_path) == {}


def test_jobs_without_gpus_and_epilog_without_files_are_no_ops(kit, tmp_path):
    assert run(kit / "prolog.sh", SLURM_JOB_ID="8").returncode == 0
    assert run(kit / "epilog.sh", SLURM_JOB_ID="8").returncode == 0
    assert mapping(tmp_path) == {}
