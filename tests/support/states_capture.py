"""Issue #55's real-GPU check: four short loads on one GPU, each a job of its own, captured as our exporter's
/metrics once a second and replayed through the collector into a store whose job breakdown must name each load.

A capture is a folder: `jobs.json` (what ran when, what each load should be told as, the GPU, the thresholds) and
`scrapes.prom.gz` (every /metrics body, each after a `# gpufleet-scrape <unix seconds>` line). `scripts/states-check`
makes one on a GPU (real loads through PyTorch, the exporter's NVML backend): `python3 -m tests.support.states_capture
capture ...`, which needs only the exporter's dependencies and PyTorch. tests/test_states_capture.py makes one through the
NVML backend over the fake pynvml (the loads' NVML readings scripted) and replays both kinds: the collector's own scrape
path (ScrapeSource.round_batch, StoreWriter) into a store, then analytics.states.job_breakdown of each job.

The loads: bf16 matrix products (compute); a data loader's rhythm, a pinned host-to-device copy feeding a light kernel
(input-bound: busy with SM active low and PCIe RX high); a process that holds the GPU and sleeps (idle); matrix products
that stop for CHECKPOINT_PAUSE_S every CHECKPOINT_PERIOD_S (checkpoint stalls, the period found within 5 %).
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

SCRAPES = "scrapes.prom.gz"
JOBS = "jobs.json"
MARK = "# gpufleet-scrape "
CHECKPOINT_PERIOD_S, CHECKPOINT_PAUSE_S = 16.0, 4.0
GAP_S = 6.0  # between loads: no job mapped, the GPU at rest
SCRAPE_EVERY_S = 1.0
CLUSTER, TARGET = "gpu-check", "vm:9400"
# The thresholds of loads a minute or two long ([analytics] and [analytics.states] as a site would set them): an idle
# stretch is idle from 30 s (the checkpoint pauses stay dips), a job's startup ends at its first 10 s busy, a sample
# holds for 3 s (max_gap; they come every second)
THRESHOLDS = {"idle_threshold": 5.0, "idle_min_s": 30.0, "max_gap_s": 3.0, "startup_busy_seconds": 10.0,
              "checkpoint_min_seconds": 2.0, "checkpoint_min_count": 3}


@dataclass(frozen=True)
class Load:
    name: str
    job_id: str
    seconds: float
    expect: str  # the state (analytics.states.STATES) that holds most of the job's time; the checkpoint load's: its largest loss


LOADS = (Load("compute", "7001", 75, "compute"), Load("input", "7002", 75, "input_bound"),
         Load("idle", "7003", 75, "idle"), Load("checkpoint", "7004", 6 * CHECKPOINT_PERIOD_S, "checkpoint"))


# --- the capture ---


def run(scrape: Callable[[], str], clock: Callable[[], float], sleep: Callable[[float], None], map_job: Callable[[str | None], None],
        start_load: Callable[[Load], Any], stop_load: Callable[[Any], None], loads: tuple[Load, ...] = LOADS,
        gap_s: float = GAP_S) -> tuple[list[dict], list[tuple[float, str]]]:
    """Each load in turn as a job of its own (`map_job(job_id)` before it starts, `map_job(None)` after it stops), `gap_s` of
    rest before each and after the last, the exporter scraped every SCRAPE_EVERY_S throughout: the jobs (job_id, load, start, end,
    expect) and the scrapes [(unix seconds, body)] as a list (what write() takes)."""
    scrapes: list[tuple[float, str]] = []
    jobs = []

    def scrape_until(t_end: float) -> None:
        while clock() < t_end:
            t = clock()
            scrapes.append((t, scrape()))
            sleep(max(0.0, t + SCRAPE_EVERY_S - clock()))

    scrape_until(clock() + gap_s)
    for load in loads:
        map_job(load.job_id)
        start = clock()
        handle = start_load(load)
        scrape_until(start + load.seconds)
        stop_load(handle)
        map_job(None)
        jobs.append({"job_id": load.job_id, "load": load.name, "start": start, "end": clock(), "expect": load.expect})
        scrape_until(clock() + gap_s)
    return jobs, scrapes


def write(out: Path, jobs: list[dict], scrapes: list[tuple[float, str]], **meta: Any) -> None:
    """A capture folder (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / SCRAPES, "wt", encoding="utf-8") as f:
        for t, body in scrapes:
            f.write(f"{MARK}{t:.3f}\n{body}")
            if not body.endswith("\n"):
                f.write("\n")
    (out / JOBS).write_text(json.dumps({"jobs": jobs, "thresholds": THRESHOLDS, "scrape_every_s": SCRAPE_EVERY_S,
                                        "checkpoint": {"period_s": CHECKPOINT_PERIOD_S, "pause_s": CHECKPOINT_PAUSE_S}, **meta}, indent=1) + "\n")


def read(folder: Path) -> tuple[dict, list[tuple[float, str]]]:
    """A capture folder's jobs.json and its scrapes in time order."""
    meta = json.loads((folder / JOBS).read_text())
    scrapes, t, body = [], None, []
    with gzip.open(folder / SCRAPES, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith(MARK):
                if t is not None:
                    scrapes.append((t, "".join(body)))
                t, body = float(line[len(MARK):]), []
            else:
                body.append(line)
    if t is not None:
        scrapes.append((t, "".join(body)))
    if not scrapes:
        raise ValueError(f"{folder / SCRAPES}: no scrape (expected lines starting {MARK!r})")
    return meta, sorted(scrapes, key=lambda s: s[0])


# --- the replay ---


def utc(t: float) -> datetime:
    from gpufleet.times import from_epoch_us

    return from_epoch_us(round(t * 1_000_000))


def replay(folder: Path, root: Path) -> dict:
    """The capture's scrapes through the collector's scrape path into a store at `root`, one commit each (as a
    collector scraping every second would); its jobs.json."""
    from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus
    from gpufleet.collector.store import StoreWriter

    meta, scrapes = read(folder)
    source, target = ScrapeSource(cluster=CLUSTER, static_targets=[TARGET]), Target(TARGET)
    w = StoreWriter(root)
    for t, body in scrapes:
        batch = source.round_batch(utc(t), [(target, TargetStatus(up=True), body)])
        if batch.rejected or batch.problems:
            raise ValueError(f"{folder / SCRAPES}: the scrape at {utc(t)} was not read whole: {batch.problems[:3]}")
        w.commit(batch)
    w.publish()
    w.close()
    return meta


def breakdowns(root: Path, meta: dict) -> dict[str, Any]:
    """Each job's breakdown (analytics.states.job_breakdown) under the capture's thresholds: job_id -> JobStates."""
    from gpufleet.analytics.params import Params
    from gpufleet.analytics.states import Thresholds, job_breakdown
    from gpufleet.collector.store import open_reader

    th = meta["thresholds"]
    t = Thresholds(**th)
    p = Params(utc(min(j["start"] for j in meta["jobs"])) - timedelta(minutes=1), utc(max(j["end"] for j in meta["jobs"])) + timedelta(minutes=1),
               max_gap=timedelta(seconds=th["max_gap_s"]), idle_threshold=th["idle_threshold"], idle_min_duration=timedelta(seconds=th["idle_min_s"]))
    con = open_reader(root)
    try:
        return {j["job_id"]: job_breakdown(con, p, j["job_id"], t) for j in meta["jobs"]}
    finally:
        con.close()


# --- on a GPU (scripts/states-check) ---

# Each load's own process (PyTorch, GPU 0) until killed. input: 256 MiB pinned batches copied to the GPU, each followed by
# ~10 ms of a kernel on one SM (torch.cuda._sleep), as a loader that cannot keep up feeds a model too small for the GPU:
# busy, SM active low, PCIe RX high; checkpoint: products, then a pause, on the period
_LOAD_CODE = """
import sys, time, torch
kind, period, pause = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
dev = torch.device("cuda:0")
if kind == "idle":
    x = torch.zeros(1, device=dev); torch.cuda.synchronize()
    while True: time.sleep(1)
if kind == "input":
    host = torch.empty(64 * 2**20, dtype=torch.float32).pin_memory(); gpu = torch.empty_like(host, device=dev)
    while True:
        gpu.copy_(host, non_blocking=True); torch.cuda._sleep(20_000_000); torch.cuda.synchronize()
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev); b = torch.randn_like(a)
t0 = time.monotonic()
while True:
    if kind == "checkpoint" and (time.monotonic() - t0) % period >= period - pause:
        torch.cuda.synchronize(); time.sleep(period - (time.monotonic() - t0) % period); continue
    for _ in range(4): a @ b
    torch.cuda.synchronize()
"""


# STATES_CHECK_DRY_RUN (scripts/states-check): loads that sleep, a twentieth as long, no PyTorch (the script's plumbing alone)
DRY_RUN = "STATES_CHECK_DRY_RUN"
_DRY_LOAD_CODE = "import time\nwhile True: time.sleep(1)\n"


def capture_on_gpu(url: str, jobmap: Path, out: Path) -> None:
    """The loads on GPU 0 through PyTorch, each mapped to its job through the Slurm job-map directory `jobmap` (file `0`, as
    the prolog writes it), the exporter at `url` scraped throughout; the capture written to `out`."""
    import os
    import subprocess
    import urllib.request

    dry = bool(os.environ.get(DRY_RUN))
    scale = 0.05 if dry else 1.0

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    def map_job(job_id: str | None) -> None:
        f = jobmap / "0"
        if job_id is None:
            f.unlink(missing_ok=True)
        else:
            tmp = jobmap / ".0"
            tmp.write_text(job_id + "\n")
            tmp.rename(f)

    def start(load: Load) -> subprocess.Popen:
        print(f"states-check: {load.name} as job {load.job_id} for {load.seconds:.0f} s", flush=True)
        return subprocess.Popen([sys.executable, "-c", _DRY_LOAD_CODE if dry else _LOAD_CODE, load.name, str(CHECKPOINT_PERIOD_S),
                                 str(CHECKPOINT_PAUSE_S)])

    def stop(p: subprocess.Popen) -> None:
        if p.poll() is not None:
            raise RuntimeError(f"the load exited early with {p.returncode}: expected it to run until stopped")
        p.kill()
        p.wait()

    loads = tuple(Load(x.name, x.job_id, x.seconds * scale, x.expect) for x in LOADS)
    jobs, scrapes = run(scrape, time.time, time.sleep, map_job, start, stop, loads, GAP_S * scale)
    if dry:
        gpu, source = "simulated", "dry-run"
    else:
        import torch

        gpu, source = torch.cuda.get_device_name(0), "nvml"
    write(out, jobs, scrapes, source=source, gpu=gpu, made=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    print(f"states-check: {len(scrapes)} scrapes of {len(jobs)} jobs written to {out}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "capture":
        print("usage: python3 -m tests.support.states_capture capture URL JOBMAP_DIR OUT_DIR", file=sys.stderr)
        return 2
    capture_on_gpu(argv[1], Path(argv[2]), Path(argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
