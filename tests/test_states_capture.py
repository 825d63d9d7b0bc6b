"""Issue #55's check of the job breakdown on one GPU's four loads (tests/support/states_capture.py): through our
exporter's NVML backend, its /metrics, the collector's scrape path and store, to analytics.states.job_breakdown.

Made here through the NVML backend over the fake pynvml, the loads' readings scripted as the real loads give them
(PyTorch on an H100: matrix products keep SM active ~0.96 and tensor ~0.93; a starved loader's copies keep PCIe RX at
~12 GB/s beside one light kernel; a sleeping process holds the GPU at 0 %); a capture scripts/states-check made on a GPU
(tests/data/states-*/) is replayed the same way, each one a case of its own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

pynvml = pytest.importorskip("pynvml")

from gpufleet.exporter.backends.nvml import NvmlBackend  # noqa: E402
from gpufleet.exporter.jobmap.slurm_dir import SlurmMappingDirSource  # noqa: E402
from gpufleet.exporter.poller import Poller  # noqa: E402
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml  # noqa: E402
from tests.realstack.process import free_port  # noqa: E402
from tests.support import states_capture as sc  # noqa: E402

CAPTURES = sorted(p for p in (Path(__file__).parent / "data").glob("states-*") if (p / sc.JOBS).is_file())
MIB = 1 << 20

# Each load's NVML readings: (GPU utilization %, compute processes, GPM SM active %, tensor active %, PCIe RX MiB/s)
AT_REST = (0, 0, 0.0, 0.0, 2.0)
READINGS = {"compute": (100, 1, 96.2, 93.4, 20.0), "input": (48, 1, 0.8, 0.0, 12_000.0), "idle": (0, 1, 0.0, 0.0, 0.5)}
CUDA_START_S = 3  # a load's first seconds: the process is up, no kernel yet


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def readings(load: sc.Load | None, since: float) -> tuple:
    if load is None:
        return AT_REST
    if since < CUDA_START_S:
        return (0, 1, 0.0, 0.0, 2.0)
    if load.name == "checkpoint":  # products, paused for the last CHECKPOINT_PAUSE_S of each period from its start (_LOAD_CODE's t0)
        paused = (since - CUDA_START_S) % sc.CHECKPOINT_PERIOD_S >= sc.CHECKPOINT_PERIOD_S - sc.CHECKPOINT_PAUSE_S
        return (0, 1, 0.0, 0.0, 2.0) if paused else READINGS["compute"]
    return READINGS[load.name]


def fake_capture(out: Path, jobmap: Path) -> None:
    """A capture made as scripts/states-check makes one, the GPU an H100 of the fake pynvml whose readings follow the load."""
    gpu = FakeGpu(uuid="GPU-5tate5c0-0000-4000-8000-000000000001", gpm={})
    nv = FakeNvml([gpu])
    clock = Clock(1_796_000_000.0)  # 2026-12-01
    jobmap.mkdir()
    p = Poller(NvmlBackend(nvml=nv), [SlurmMappingDirSource(jobmap)], hostname="vm", clock=clock)
    running: dict[str, object] = {"load": None, "since": 0.0}

    def scrape() -> str:
        util, procs, sm, tensor, rx = readings(running["load"], clock() - running["since"])
        gpu.util = (util, 0)
        gpu.processes = [SimpleNamespace(pid=4000 + i, usedGpuMemory=900 * MIB) for i in range(procs)]
        gpu.gpm = {pynvml.NVML_GPM_METRIC_SM_UTIL: sm, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: rx,
                   pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1.0}
        p.poll_telemetry()
        p.poll_processes_and_jobs()
        return p.exposition().decode()

    def map_job(job_id: str | None) -> None:
        (jobmap / "0").unlink(missing_ok=True)
        if job_id is not None:
            (jobmap / "0").write_text(job_id + "\n")

    def start(load: sc.Load) -> sc.Load:
        running.update(load=load, since=clock())
        return load

    def stop(_: sc.Load) -> None:
        running.update(load=None)

    jobs, scrapes = sc.run(scrape, clock, clock.sleep, map_job, start, stop)
    sc.write(out, jobs, scrapes, source="fake-nvml", gpu=gpu.name)


@pytest.fixture(scope="module", params=["fake-nvml", *CAPTURES], ids=lambda p: p if isinstance(p, str) else p.name)
def replayed(request, tmp_path_factory) -> tuple[dict, dict]:
    folder = request.param
    if folder == "fake-nvml":
        folder = tmp_path_factory.mktemp("capture") / "fake"
        fake_capture(folder, tmp_path_factory.mktemp("jobmap") / "jobmap")
    root = tmp_path_factory.mktemp("store")
    meta = sc.replay(folder, root)
    return meta, sc.breakdowns(root, meta)


def _largest(js) -> str:
    return max(js.seconds, key=js.seconds.get)


def test_each_load_is_told_as_what_it_did(replayed):
    meta, found = replayed
    told = {}
    for job in meta["jobs"]:
        js = found[job["job_id"]]
        assert js is not None, f"job {job['job_id']} ({job['load']}): no allocation in the store"
        assert js.data_s == pytest.approx(job["end"] - job["start"], abs=4), (job, js.data_s)
        told[job["load"]] = js.largest_loss if job["load"] == "checkpoint" else _largest(js)
    assert told == {j["load"]: j["expect"] for j in meta["jobs"]}, {j["job_id"]: found[j["job_id"]].seconds for j in meta["jobs"]}


def test_the_checkpoint_period_is_found_within_5_percent_and_its_cost(replayed):
    meta, found = replayed
    [job] = [j for j in meta["jobs"] if j["load"] == "checkpoint"]
    cp = found[job["job_id"]].checkpoints
    assert cp is not None and cp.count >= 3
    assert cp.period_s == pytest.approx(meta["checkpoint"]["period_s"], rel=0.05)
    assert cp.cost_s == pytest.approx(meta["checkpoint"]["pause_s"], abs=1.5)


def test_the_evidence_names_the_fields_that_told_it(replayed):
    meta, found = replayed
    by_load = {j["load"]: found[j["job_id"]] for j in meta["jobs"]}
    assert "PCIe RX" in by_load["input"].evidence["input_bound"] and "SM active" in by_load["input"].evidence["input_bound"]
    assert not by_load["compute"].unknown, by_load["compute"].unknown  # GPM told every state it reads


def test_a_capture_reads_back_as_written(tmp_path):
    jobs = [{"job_id": "1", "load": "idle", "start": 10.0, "end": 20.0, "expect": "idle"}]
    scrapes = [(10.0, "a 1\n"), (11.5, "b 2")]
    sc.write(tmp_path, jobs, scrapes, source="test")
    meta, back = sc.read(tmp_path)
    assert back == [(10.0, "a 1\n"), (11.5, "b 2\n")] and meta["jobs"] == jobs and meta["source"] == "test"


def test_the_script_runs_end_to_end_in_its_dry_run(tmp_path):
    """scripts/states-check without a GPU (its dry run: simulated GPUs, loads that sleep): the exporter it starts maps each
    load's job through the job-map directory, and its capture replays into a store holding each job's allocation."""
    script = Path(__file__).parents[1] / "scripts" / "states-check"
    env = {**os.environ, "STATES_CHECK_DRY_RUN": "1", "STATES_CHECK_PORT": str(free_port())}
    done = subprocess.run(["bash", str(script), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    capture = tmp_path / "out" / "states-dry-run"
    meta, scrapes = sc.read(capture)
    assert meta["source"] == "dry-run" and [j["load"] for j in meta["jobs"]] == [x.name for x in sc.LOADS]
    for job in meta["jobs"]:
        # the exporter maps a job at its next job-mapping pass (every second here, later on a loaded host): from the first
        # scrape that shows the job, every scrape until the job stopped shows it
        shown = [f'job_id="{job["job_id"]}"' in b for t, b in scrapes if job["start"] < t < job["end"]]
        assert True in shown and all(shown[shown.index(True):]), (job, shown)
    root = tmp_path / "store"
    sc.replay(capture, root)
    found = sc.breakdowns(root, meta)
    assert all(found[j["job_id"]] is not None for j in meta["jobs"]), found
