"""The shipped prolog/epilog in a real Slurm, feeding a real gpufleet exporter process.

A real single-node Slurm with accounting (tests/realstack/slurm.py) runs compose/node/slurm's
prolog.sh and epilog.sh for real sbatch jobs that request GPUs; the exporter (SIM backend, as a
subprocess) labels exactly the GPUs that `scontrol show job -d` lists for each job, and drops
them when the job ends.

Three numberings, deliberately all different for every GPU:
  - Slurm's GRES index (IDX:, SLURM_JOB_GPUS): position in gres.conf, 0..7;
  - the device minor number: the harness's char devices, minors 3,5,8,9,10,12,14,15 in gres.conf order;
  - the NVML index (the exporter's `gpu` label): the scenario gives NVML index j the minor
    minors[7 - j] (reversed), so NVML index = 7 - Slurm index.
The expected GPUs are computed here independently of the prolog: scontrol IDX -> gres.conf device
order -> os.stat minor -> the scenario's minor_numbers -> the UUID the exporter publishes for that
`gpu` in DCGM_FI_DEV_GPU_UTIL.

The kit's node.conf sets no GRES_DEVICES, so the prolog asks the real `slurmd -G` (the
GRES_DEVICES path is covered by test_slurm_prolog_unit.py). The hook runs the prolog with PATH
removed, i.e. in exactly the environment slurmd gives a prolog.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.realstack.process import HarnessError, free_port, wait_for

pytestmark = pytest.mark.realstack
log = logging.getLogger(__name__)

KIT = Path(__file__).resolve().parents[1] / "compose" / "node" / "slurm"
HOOK = "50-gpufleet-jobmap"


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def job_gpus(samples, job_id: int) -> set[tuple[str, str]]:
    """{(gpu, UUID)} of gpufleet_gpu_job_info{job_id=...}."""
    return {
        (labels["gpu"], labels["UUID"])
        for name, labels, value in samples
        if name == "gpufleet_gpu_job_info" and labels.get("job_id") == str(job_id) and value == 1
    }


def job_ids(samples) -> set[str]:
    return {labels["job_id"] for name, labels, _ in samples if name == "gpufleet_gpu_job_info"}


def wait_for_set(what: str, get, want, timeout: float = 30):
    """Poll get() until it returns `want`; on timeout fail showing the last value (not just 'timed out')."""
    last = None

    def ok() -> bool:
        nonlocal last
        last = get()
        return last == want

    try:
        wait_for(what, ok, timeout=timeout, interval=0.2)
    except HarnessError:
        pytest.fail(f"{what}: still {last!r} after {timeout}s, want {want!r}")
    return last


@pytest.fixture
def exporter(slurm_cluster, tmp_path):
    """The gpufleet exporter (SIM backend) whose GPU minors are the cluster's, reversed."""
    minors = list(reversed(slurm_cluster.minors))  # NVML index j -> minor
    scenario = tmp_path / "node.toml"
    scenario.write_text(f'hostname = "slurm-node"\nmodel = "h100"\ngpus = {len(minors)}\nminor_numbers = {minors}\n')
    jobmap, devmap = tmp_path / "job-mapping", tmp_path / "gpu-devices.tsv"
    jobmap.mkdir()
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(
        "[exporter]\npoll_interval = 1.0\nprocess_interval = 1.0\ncgroup_mapping = false\n"
        f'kubelet_socket = ""\njob_map_dir = "{jobmap}"\ndevice_map_file = "{devmap}"\n'
    )
    port = free_port()
    stderr = open(tmp_path / "exporter.err", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(cfg), "--backend", "sim",
         "--sim-scenario", str(scenario), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=stderr,
    )

    def gpu_series() -> int:
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: {(tmp_path / 'exporter.err').read_text()[-2000:]}")
        return sum(1 for name, _, _ in scrape(port) if name == "DCGM_FI_DEV_GPU_UTIL")

    try:
        wait_for("exporter serving 8 GPUs and its device map", lambda: gpu_series() == len(minors) and devmap.exists(), timeout=30)
        yield {"port": port, "minors": minors, "jobmap": jobmap, "devmap": devmap}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        stderr.close()


@pytest.fixture
def installed_kit(slurm_cluster, exporter, tmp_path):
    """compose/node/slurm copied with a node.conf for this test, hooked into the cluster's prolog/epilog."""
    kit = tmp_path / "kit"
    shutil.copytree(KIT, kit)
    # no GRES_DEVICES: the prolog must learn the device order from the real `slurmd -G`
    (kit / "node.conf").write_text(f"JOB_MAP_DIR={exporter['jobmap']}\nDEVICE_MAP={exporter['devmap']}\n")
    for kind in ("prolog", "epilog"):
        # unset PATH: run the kit exactly as slurmd runs a prolog/epilog (the dispatcher adds one)
        slurm_cluster.add_hook(kind, HOOK, f"#!/bin/sh\nunset PATH\nexec {kit}/{kind}.sh\n")
    try:
        yield kit
    finally:
        for kind in ("prolog", "epilog"):
            slurm_cluster.remove_hook(kind, HOOK)


def test_slurmd_g_lists_gpu_files_in_gres_index_order(slurm_cluster):
    """The prolog's premise: `slurmd -G` prints the gpu File= in Slurm's index order. And it is quick."""
    env = {**os.environ, **slurm_cluster.env}
    t0 = time.monotonic()
    r = subprocess.run(["/usr/sbin/slurmd", "-G"], env=env, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    log.info("slurmd -G took %.3fs", took)
    assert r.returncode == 0, r.stderr
    files = [m.group(1) for line in r.stderr.splitlines() if " Name=gpu " in f" {line} " for m in [re.search(r"File=(\S+)", line)] if m]
    assert files == slurm_cluster.device_files
    assert took < 5


def test_exporter_labels_exactly_the_gpus_scontrol_lists_and_drops_them_at_job_end(slurm_cluster, exporter, installed_kit, tmp_path):
    port, minors = exporter["port"], exporter["minors"]
    n = len(minors)
    # the three numberings differ for every GPU: Slurm index i, its minor, its NVML index
    for i, minor in enumerate(slurm_cluster.minors):
        assert len({i, minor, minors.index(minor)}) == 3

    release_b = tmp_path / "release-b"
    job_a = slurm_cluster.sbatch("sleep 600\n", account="physics", gpus=3)
    job_b = slurm_cluster.sbatch(
        f"i=0; while [ ! -e {release_b} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n",
        account="biology", gpus=2,
    )
    try:
        slurm_cluster.wait_running(job_a)
        slurm_cluster.wait_running(job_b)

        # UUID by NVML index, as the exporter publishes it with the DCGM metrics
        uuid_of = {
            int(labels["gpu"]): labels["UUID"]
            for name, labels, _ in scrape(port) if name == "DCGM_FI_DEV_GPU_UTIL"
        }
        assert sorted(uuid_of) == list(range(n)) and len(set(uuid_of.values())) == n

        def expected(job: int) -> set[tuple[str, str]]:
            out = set()
            for idx in slurm_cluster.gres_idx(job):  # scontrol show job -d: GRES=gpu:h100:N(IDX:...)
                device = slurm_cluster.device_files[idx]  # gres.conf order
                minor = os.minor(os.stat(device).st_rdev)
                nvml = minors.index(minor)  # the scenario's minor_numbers
                out.add((str(nvml), uuid_of[nvml]))
            return out

        want_a, want_b = expected(job_a), expected(job_b)
        assert len(want_a) == 3 and len(want_b) == 2 and not want_a & want_b
        # the old prolog (index taken as a minor number) could not have produced these
        assert {int(g) for g, _ in want_a} != set(slurm_cluster.gres_idx(job_a))

        wait_for_set(f"job {job_a}'s GPUs in gpufleet_gpu_job_info", lambda: job_gpus(scrape(port), job_a), want_a)
        wait_for_set(f"job {job_b}'s GPUs in gpufleet_gpu_job_info", lambda: job_gpus(scrape(port), job_b), want_b)
        samples = scrape(port)
        assert job_ids(samples) == {str(job_a), str(job_b)}
        assert (job_gpus(samples, job_a), job_gpus(samples, job_b)) == (want_a, want_b)
        assert slurm_cluster.hook_status(job_a, "prolog").get(HOOK) == 0
        assert slurm_cluster.hook_status(job_b, "prolog").get(HOOK) == 0

        # job A cancelled: its series go, B's stay
        slurm_cluster.run("scancel", str(job_a))
        assert slurm_cluster.wait_job(job_a).startswith("CANCELLED")
        wait_for_set(f"job {job_a}'s job_info gone", lambda: job_gpus(scrape(port), job_a), set())
        assert job_gpus(scrape(port), job_b) == want_b

        # job B finishes on its own
        release_b.touch()
        assert slurm_cluster.wait_job(job_b) == "COMPLETED"
        wait_for_set(f"job {job_b}'s job_info gone", lambda: job_ids(scrape(port)), set())
        for job in (job_a, job_b):
            assert slurm_cluster.hook_status(job, "epilog").get(HOOK) == 0
    finally:
        slurm_cluster.run("scancel", str(job_a), str(job_b), check=False)

    # the epilog left nothing behind but the lock file
    assert sorted(p.name for p in exporter["jobmap"].iterdir()) == [".lock"]
    # and the prolog translated every GPU (it logs each one it could not)
    hook_log = (slurm_cluster.logs / "prolog-hooks.out").read_text() if (slurm_cluster.logs / "prolog-hooks.out").exists() else ""
    ours = [ln for ln in hook_log.splitlines() if f"job {job_a}:" in ln or f"job {job_b}:" in ln]
    assert ours == []
