"""The shipped Slurm prolog/epilog run as Slurm runs them (env vars only, no PATH), without Slurm.

The real-Slurm test is in test_slurm_jobmap_real.py (it exercises the `slurmd -G` path with the
real slurmd); these pin the file format and the three-step translation cheaply:

    Slurm GRES index (SLURM_JOB_GPUS) -> the node's gpu device file at that position
    (GRES_DEVICES in node.conf, or `slurmd -G`) -> its minor number -> NVML index (device map).

Fixture node, 4 GPUs; no step is the identity, and reading an index as a minor number would
land on a different GPU:

    Slurm index   device file   minor   NVML index (device map)
        0          nvidia5        5          1
        1          nvidia2        2          3
        2          nvidia7        7          0
        3          nvidia0        0          2

Most tests use regular files named nvidiaN for the device files: the prolog takes the minor
number from the name when a path is not a character device (logged). One test (root only, for
mknod) uses real character devices whose names disagree with their minor numbers, to show the
stat() of the device wins.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpufleet.exporter.jobmap.slurm_dir import SlurmMappingDirSource
from gpufleet.exporter.model import GpuIdentity
from tests.realstack.policy import unavailable

KIT = Path(__file__).resolve().parents[1] / "compose" / "node" / "slurm"
GRES_MINORS = (5, 2, 7, 0)  # gres.conf order: Slurm index i is /dev/nvidia{GRES_MINORS[i]}
NVML_MINORS = (7, 5, 0, 2)  # device map: NVML index j has minor NVML_MINORS[j]
SLURM_TO_NVML = {i: NVML_MINORS.index(m) for i, m in enumerate(GRES_MINORS)}  # {0: 1, 1: 3, 2: 0, 3: 2}


def test_fixture_has_no_identity_step():
    for i, m in enumerate(GRES_MINORS):
        assert len({i, m, SLURM_TO_NVML[i]}) == 3
        # the old bug (index read as a minor number) would name another GPU
        assert i not in GRES_MINORS or NVML_MINORS.index(i) != SLURM_TO_NVML[i]


def write_conf(kit: Path, tmp_path: Path, **settings: str) -> None:
    lines = [f"JOB_MAP_DIR={tmp_path / 'map'}", f"DEVICE_MAP={tmp_path / 'devices.tsv'}"]
    lines += [f'{k}="{v}"' for k, v in settings.items()]
    (kit / "node.conf").write_text("\n".join(lines) + "\n")


@pytest.fixture
def devdir(tmp_path) -> Path:
    d = tmp_path / "dev"
    d.mkdir()
    for m in GRES_MINORS:
        (d / f"nvidia{m}").write_text("")  # stand-ins: not character devices
    return d


@pytest.fixture
def kit(tmp_path, devdir):
    """A copy of the node kit; node.conf points into tmp_path and lists the devices in GRES_DEVICES."""
    d = tmp_path / "kit"
    shutil.copytree(KIT, d)
    write_conf(d, tmp_path, GRES_DEVICES=" ".join(str(devdir / f"nvidia{m}") for m in GRES_MINORS))
    rows = "".join(f"{j} {m} GPU-{j} 0000:{j + 1:02x}:00.0\n" for j, m in enumerate(NVML_MINORS))
    (tmp_path / "devices.tsv").write_text("# index minor uuid pci_bus_id\n" + rows)
    return d


def run(script: Path, **env: str) -> subprocess.CompletedProcess:
    # Exactly what Slurm gives a prolog: no PATH, only job variables. The script sets its own PATH.
    return subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)


def mapping(tmp_path) -> dict[str, list[str]]:
    d = tmp_path / "map"
    return {f.name: f.read_text().split() for f in sorted(d.iterdir()) if not f.name.startswith(".")} if d.exists() else {}


def nvml(*slurm_indices: int) -> list[str]:
    return sorted(str(SLURM_TO_NVML[i]) for i in slurm_indices)


def test_prolog_translates_slurm_indices_via_devices_and_minors_to_nvml_indices(kit, tmp_path):
    r = run(kit / "prolog.sh", SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    assert r.returncode == 0, r.stderr
    # Slurm 0,1 -> nvidia5, nvidia2 -> minors 5, 2 -> NVML 1, 3: not 0,1 (index taken for NVML
    # index) and not 2,0 (index taken for a minor number, the old bug)
    assert mapping(tmp_path) == {"1": ["101"], "3": ["101"]}
    assert nvml(0, 1) == ["1", "3"]


def test_every_gpu_and_slurm_index_ranges(kit, tmp_path):
    assert run(kit / "prolog.sh", SLURM_JOB_ID="5", SLURM_JOB_GPUS="0-1,3,2").returncode == 0
    assert mapping(tmp_path) == {str(j): ["5"] for j in range(4)}


def test_step_gpus_used_when_job_gpus_absent(kit, tmp_path):
    assert run(kit / "prolog.sh", SLURM_JOB_ID="6", SLURM_STEP_GPUS="2").returncode == 0
    assert mapping(tmp_path) == {"0": ["6"]}


def test_shared_gpu_two_jobs_then_epilog_removes_only_its_job(kit, tmp_path):
    run(kit / "prolog.sh", SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    run(kit / "prolog.sh", SLURM_JOB_ID="102", SLURM_JOB_GPUS="1,2")
    run(kit / "prolog.sh", SLURM_JOB_ID="102", SLURM_JOB_GPUS="1,2")  # requeue/retry: no duplicate line
    # Slurm 0 -> NVML 1, Slurm 1 -> NVML 3 (shared), Slurm 2 -> NVML 0
    assert mapping(tmp_path) == {"0": ["102"], "1": ["101"], "3": ["101", "102"]}
    gpus = [GpuIdentity(index=i, uuid=f"GPU-{i}", model="m") for i in range(4)]
    got = sorted((b.gpu_index, b.job_id) for b in SlurmMappingDirSource(tmp_path / "map").collect(gpus, {}))
    assert got == [(0, "102"), (1, "101"), (3, "101"), (3, "102")]
    assert run(kit / "epilog.sh", SLURM_JOB_ID="101").returncode == 0
    assert mapping(tmp_path) == {"0": ["102"], "3": ["102"]}
    run(kit / "epilog.sh", SLURM_JOB_ID="102")
    assert mapping(tmp_path) == {}


def test_index_beyond_the_devices_is_logged_not_guessed_and_prolog_still_succeeds(kit, tmp_path):
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="2,9")
    assert r.returncode == 0
    assert mapping(tmp_path) == {"0": ["7"]}
    assert "Slurm GPU index 9 has no single device file in GRES_DEVICES" in r.stderr


def test_device_whose_minor_is_not_in_the_device_map_is_left_out(kit, tmp_path, devdir):
    (devdir / "nvidia9").write_text("")
    write_conf(kit, tmp_path, GRES_DEVICES=f"{devdir}/nvidia5 {devdir}/nvidia9")
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1")
    assert r.returncode == 0
    assert mapping(tmp_path) == {"1": ["7"]}
    assert "no NVML index known for" in r.stderr and "minor number 9" in r.stderr


def test_no_device_source_maps_nothing_rather_than_taking_indices_for_minors(kit, tmp_path):
    # no GRES_DEVICES and a slurmd that cannot be run: the old behaviour would have mapped
    # Slurm index 0 as minor 0 -> NVML 2
    write_conf(kit, tmp_path, SLURMD=str(tmp_path / "no-such-slurmd"))
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert mapping(tmp_path) == {}
    assert "-G' failed" in r.stderr and "not mapped" in r.stderr


def test_no_device_map_and_no_driver_maps_nothing(kit, tmp_path):
    (tmp_path / "devices.tsv").unlink()
    r = run(kit / "prolog.sh", SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert mapping(tmp_path) == {}
    assert "no minor number -> NVML index table" in r.stderr


def test_jobs_without_gpus_and_epilog_without_files_are_no_ops(kit, tmp_path):
    assert run(kit / "prolog.sh", SLURM_JOB_ID="8").returncode == 0
    assert run(kit / "epilog.sh", SLURM_JOB_ID="8").returncode == 0
    assert mapping(tmp_path) == {}


def test_unwritable_mapping_dir_still_exits_zero(kit, tmp_path):
    (tmp_path / "map").write_text("a file where the directory should be")
    r = run(kit / "prolog.sh", SLURM_JOB_ID="9", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert run(kit / "epilog.sh", SLURM_JOB_ID="9").returncode == 0


# ---- the `slurmd -G` source, with a stand-in slurmd printing what slurmd 22.05 prints --------

def fake_slurmd(tmp_path: Path, lines: list[str], rc: int = 0) -> Path:
    """A slurmd that records its argv and SLURM_CONF and prints `lines` on stderr, as `slurmd -G` does."""
    path = tmp_path / "fake-slurmd"
    body = "".join(f"echo {shlex.quote('slurmd: ' + line)} >&2\n" for line in lines)
    path.write_text(
        f'#!/bin/sh\necho "$SLURM_CONF $*" >> {tmp_path / "slurmd-calls"}\n'
        f'[ "$1" = -G ] || exit 2\n{body}exit {rc}\n'
    )
    path.chmod(0o755)
    return path


def gres_line(minor: int, devdir: Path, name: str = "gpu") -> str:
    # Index= in `slurmd -G` is the number slurmd parsed from the file name, NOT Slurm's index
    return f"Gres Name={name} Type=h100 Count=1 Index={minor} ID=7696487 File={devdir}/nvidia{minor} (null)"


def test_slurmd_g_gives_the_device_order(kit, tmp_path, devdir):
    lines = [gres_line(m, devdir) for m in GRES_MINORS]
    lines.insert(2, "Gres Name=shard Type=(null) Count=4 Index=0 ID=1 File=(null) (null)")  # not a gpu line
    slurmd = fake_slurmd(tmp_path, lines)
    write_conf(kit, tmp_path, SLURMD=str(slurmd))  # no GRES_DEVICES
    env = {"SLURM_JOB_ID": "201", "SLURM_JOB_GPUS": "2,3", "SLURM_CONF": "/etc/slurm/x.conf", "SLURMD_NODENAME": "node 1"}
    r = run(kit / "prolog.sh", **env)
    assert r.returncode == 0, r.stderr
    assert mapping(tmp_path) == {"0": ["201"], "2": ["201"]}
    assert nvml(2, 3) == ["0", "2"]
    # asked with the prolog's SLURM_CONF and for this node
    assert (tmp_path / "slurmd-calls").read_text() == "/etc/slurm/x.conf -G -N node 1\n"


def test_gres_devices_wins_over_slurmd_g(kit, tmp_path, devdir):
    slurmd = fake_slurmd(tmp_path, [gres_line(m, devdir) for m in reversed(GRES_MINORS)])
    write_conf(kit, tmp_path, SLURMD=str(slurmd), GRES_DEVICES=" ".join(f"{devdir}/nvidia{m}" for m in GRES_MINORS))
    assert run(kit / "prolog.sh", SLURM_JOB_ID="202", SLURM_JOB_GPUS="0").returncode == 0
    assert mapping(tmp_path) == {"1": ["202"]}
    assert not (tmp_path / "slurmd-calls").exists()


def test_slurmd_g_gpu_line_without_one_file_keeps_later_positions(kit, tmp_path, devdir):
    # a MIG-style line (several files) takes a position but cannot be mapped; index 1 still can
    mig = f"Gres Name=gpu Type=1g.10gb Count=1 Index=9 ID=7696487 File={devdir}/nvidia9,/dev/nvidia-caps/nvidia-cap21 (null)"
    slurmd = fake_slurmd(tmp_path, [mig, gres_line(2, devdir)])
    write_conf(kit, tmp_path, SLURMD=str(slurmd))
    r = run(kit / "prolog.sh", SLURM_JOB_ID="203", SLURM_JOB_GPUS="0,1")
    assert r.returncode == 0
    assert mapping(tmp_path) == {"3": ["203"]}  # index 1 -> nvidia2 -> minor 2 -> NVML 3
    assert "Slurm GPU index 0 has no single device file in slurmd -G" in r.stderr


def test_slurmd_g_failing_maps_nothing(kit, tmp_path, devdir):
    slurmd = fake_slurmd(tmp_path, ["fatal: can't stat gres.conf file /dev/nvidia5"], rc=1)
    write_conf(kit, tmp_path, SLURMD=str(slurmd))
    r = run(kit / "prolog.sh", SLURM_JOB_ID="204", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert mapping(tmp_path) == {}
    assert "can't stat gres.conf file" in r.stderr


def test_slurmd_g_hanging_is_cut_off(kit, tmp_path):
    slurmd = tmp_path / "slow-slurmd"
    slurmd.write_text("#!/bin/sh\nexec sleep 30\n")
    slurmd.chmod(0o755)
    write_conf(kit, tmp_path, SLURMD=str(slurmd), SLURMD_TIMEOUT="1")
    r = run(kit / "prolog.sh", SLURM_JOB_ID="205", SLURM_JOB_GPUS="0")
    assert r.returncode == 0
    assert mapping(tmp_path) == {}
    assert "exit 124" in r.stderr


# ---- real character devices: the minor number comes from stat(), not from the name -----------

def test_minor_number_comes_from_the_character_device_not_its_name(kit, tmp_path):
    if os.geteuid() != 0:
        unavailable("needs root to mknod character devices")
    d = tmp_path / "chardev"
    d.mkdir()
    # named nvidia10..13 but with minors 5, 2, 7, 0: names would point at no GPU in the map
    paths = []
    for n, m in enumerate(GRES_MINORS, start=10):
        p = d / f"nvidia{n}"
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(195, m))
        paths.append(str(p))
    write_conf(kit, tmp_path, GRES_DEVICES=" ".join(paths))
    r = run(kit / "prolog.sh", SLURM_JOB_ID="301", SLURM_JOB_GPUS="0,2")
    assert r.returncode == 0, r.stderr
    assert mapping(tmp_path) == {"0": ["301"], "1": ["301"]}  # minors 5, 7 -> NVML 1, 0
    assert "not a character device" not in r.stderr
