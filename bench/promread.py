"""Prometheus-API source: field-samples/s read from a real VictoriaMetrics, sequential vs parallel.

A simulated fleet (the gpufleet exporter's simulator, as bench/collector.py: 8-GPU nodes, 6
training, 1 serving, 1 idle, with Slurm jobs) scraped every STEP s for HOURS, imported into
Debian's victoria-metrics (single node, on loopback, its own data directory) with the scrape
times. Then the whole span is read back through PrometheusApiSource.read_windows, chunk by
chunk (900 s chunks), once per setting, in one run, each read timed wall clock:

  sequential          parallel_requests = 1, gpu_shards = 1 (one query after the other: before issue #17)
  by time             parallel_requests = 4, gpu_shards = 1 (chunks read ahead while one is parsed)
  by time and GPU     parallel_requests = 4, gpu_shards = 4 (each chunk as 4 queries, one per GPU shard)
  on Dask             a `--backfill` with [analytics] dask_scheduler: each chunk a task on a local
                      2-worker Dask cluster (gpufleet.collector.backfill.read_chunk), batches back
                      here in order (TaskRunner.ordered); CPU is this process's plus the workers'

field-samples = the non-null field values of the rows read (as bench/collector.py counts them);
every setting must read the same batches (checked). CPU seconds of this process (the parse) and
of VictoriaMetrics over each read say where the time goes: on this shared 2-core machine the two
compete for the cores, so the parallel gain is bounded by the client's parse (one core, GIL).

Knobs (environment):
  GPUFLEET_BENCH_PROMREAD_NODES=40   8-GPU nodes (320 GPUs)
  GPUFLEET_BENCH_PROMREAD_HOURS=2    hours of samples
  GPUFLEET_BENCH_PROMREAD_STEP=30    seconds between scrapes
  GPUFLEET_BENCH_VICTORIAMETRICS=victoria-metrics   the binary
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench._common import Table, _children, _stop, env_number, free_port, local_dask, proc_cpu_seconds, progress

NODES = int(env_number("GPUFLEET_BENCH_PROMREAD_NODES", 40))
HOURS = env_number("GPUFLEET_BENCH_PROMREAD_HOURS", 2)
STEP = int(env_number("GPUFLEET_BENCH_PROMREAD_STEP", 30))
VM = os.environ.get("GPUFLEET_BENCH_VICTORIAMETRICS", "victoria-metrics")
CHUNK_S = 900
SETTINGS = (("sequential", 1, 1), ("by time", 4, 1), ("by time and GPU", 4, 4), ("on Dask", 1, 1))
DASK_WORKERS = 2


def _get(url: str, data: bytes | None = None, timeout: float = 300) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as r:
        return r.read()


def _start_vm(exe: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [exe, f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y",
            "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN"]
    log = open(workdir / "vm.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    _children.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if _get(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{exe} did not start: {(workdir / 'vm.log').read_text()[-2000:]}")
        time.sleep(0.1)


def _name(line: str) -> str:
    brace = line.find("{")
    return line[:brace] if brace > 0 else line.split(" ", 1)[0]


def _load(url: str, t0: datetime) -> int:
    """Render the fleet scrape by scrape and import each node's whole span in one request
    (Prometheus text, a timestamp per line, its instance as an extra label); returns samples."""
    from bench.collector import GPUS_PER_NODE, _Clock, _node
    from gpufleet.collector.sources.prometheus_api import DEFAULT_METRICS

    wanted = set(DEFAULT_METRICS)
    clock = _Clock()
    pollers = [_node(i, clock) for i in range(NODES)]
    lines: list[list[str]] = [[] for _ in range(NODES)]
    rounds = int(HOURS * 3600 // STEP)
    base = int(t0.replace(tzinfo=timezone.utc).timestamp())
    for r in range(rounds):
        clock.t = r * STEP
        stamp = f" {(base + (r + 1) * STEP) * 1000}\n"  # the first scrape 1 step into the first chunk
        for n, p in enumerate(pollers):
            p.poll_telemetry()
            p.poll_processes_and_jobs()
            for line in p.exposition().decode().splitlines():
                if line and not line.startswith("#") and _name(line) in wanted:
                    lines[n].append(line + stamp)
    samples = 0
    for n, node_lines in enumerate(lines):
        query = urllib.parse.urlencode([("extra_label", f"instance=node-{n:04d}:9400"), ("extra_label", "job=gpu")])
        _get(f"{url}/api/v1/import/prometheus?{query}", data="".join(node_lines).encode())
        samples += len(node_lines)
    _get(f"{url}/internal/force_flush")
    progress(f"promread: {samples:,} samples of {NODES * GPUS_PER_NODE} GPUs ({rounds} scrapes) imported")
    return samples


def _wait_searchable(url: str, t0: datetime, nodes: int) -> None:
    """Imported samples become searchable a moment after the flush: wait for every node's."""
    end = t0 + timedelta(hours=HOURS)
    q = urllib.parse.urlencode({"query": "count(count_over_time(DCGM_FI_DEV_GPU_UTIL[1h]) > 0) by (instance)",
                                "time": end.replace(tzinfo=timezone.utc).timestamp()})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(json.loads(_get(f"{url}/api/v1/query?{q}"))["data"]["result"]) >= nodes:
            return
        time.sleep(0.5)
    raise RuntimeError("VictoriaMetrics: imported samples not searchable after 60 s")


def _read_on_dask(src, windows, vm_pid: int, tmp: Path) -> tuple[float, float, float, list]:
    """The chunks read as a backfill on Dask reads them: (wall, CPU here + workers', VictoriaMetrics CPU, batches)."""
    from gpufleet.collector.backfill import read_chunk
    from gpufleet.collector.tasks import TaskRunner

    (tmp / "dask").mkdir(exist_ok=True)
    with local_dask(tmp / "dask", DASK_WORKERS) as (address, workers):
        runner = TaskRunner(scheduler=address, name="promread")
        vm0, cpu0, w0 = proc_cpu_seconds(vm_pid), time.process_time(), [proc_cpu_seconds(p.pid) for p in workers]
        w = time.monotonic()
        batches = list(runner.ordered(read_chunk, [(src, lo, hi) for lo, hi in windows]))
        wall = time.monotonic() - w
        cpu = time.process_time() - cpu0 + sum(proc_cpu_seconds(p.pid) - c for p, c in zip(workers, w0))
        return wall, cpu, proc_cpu_seconds(vm_pid) - vm0, batches


def run() -> list[Table]:
    from bench.collector import GPUS_PER_NODE, _field_values
    from gpufleet.collector.sources.prometheus_api import PrometheusApiSource

    gpus = NODES * GPUS_PER_NODE
    t = Table(f"promread: reading {gpus} simulated GPUs x {HOURS:g} h (a scrape every {STEP} s) back from VictoriaMetrics, "
              f"{CHUNK_S} s chunks")
    exe = shutil.which(VM)
    if not exe:
        t.add("read throughput", f"not measured: {VM} not found (Debian package victoria-metrics)", "", False)
        return [t]
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"], capture_output=True, text=True).stdout.strip()
    # whole chunks, a day back, not at midnight
    t0 = (datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=1)).replace(hour=6, minute=0, second=0, microsecond=0)
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-promread-") as tmp:
        proc, url = _start_vm(exe, Path(tmp))
        try:
            w0 = time.monotonic()
            samples = _load(url, t0)
            _wait_searchable(url, t0, NODES)
            load_s = time.monotonic() - w0
            reference = None
            results = []
            for label, requests, shards in SETTINGS:
                src = PrometheusApiSource(url=url, cluster="bench", chunk_seconds=CHUNK_S, parallel_requests=requests, gpu_shards=shards,
                                          clock=lambda: t0 + timedelta(days=2))
                windows = src.backfill_windows(t0, t0 + timedelta(hours=HOURS))
                progress(f"promread: reading {len(windows)} chunks, {label}")
                if label == "on Dask":
                    wall, cpu, vm_cpu, batches = _read_on_dask(src, windows, proc.pid, Path(tmp))
                else:
                    vm0, cpu0, w = proc_cpu_seconds(proc.pid), time.process_time(), time.monotonic()
                    batches = list(src.read_windows(windows))
                    wall = time.monotonic() - w
                    cpu, vm_cpu = time.process_time() - cpu0, proc_cpu_seconds(proc.pid) - vm0
                values = sum(_field_values(b.samples) for b in batches)
                rows = sum(b.samples.num_rows for b in batches)
                if reference is None:
                    reference = batches
                same = len(batches) == len(reference) and all(a.key == b.key and a.samples.equals(b.samples) and a.allocations == b.allocations
                                                              for a, b in zip(batches, reference))
                results.append((label, requests, shards, wall, cpu, vm_cpu, values, rows, same))
        finally:
            _stop(proc)
            if proc in _children:
                _children.remove(proc)
    seq_rate = results[0][6] / results[0][3]
    for label, requests, shards, wall, cpu, vm_cpu, values, rows, same in results:
        rate = values / wall
        how = f"{DASK_WORKERS} workers, a task per chunk" if label == "on Dask" else f"parallel_requests={requests}, gpu_shards={shards}"
        t.add(f"{label} ({how})",
              f"{rate:,.0f} field-samples/s ({values:,} in {wall:.1f} s, {rows:,} rows; {'CPU here + workers' if label == 'on Dask' else 'client CPU'} {cpu:.1f} s, VictoriaMetrics CPU {vm_cpu:.1f} s)"
              + ("" if label == "sequential" else f"; x{rate / seq_rate:.2f} vs sequential"),
              "the sequential read's batches" if label != "sequential" else "", None if label == "sequential" else same)
    t.notes.append(f"VictoriaMetrics {version} (Debian), on this machine's {os.cpu_count()} cores with the client; "
                   f"{samples:,} samples imported in {load_s:.0f} s (rendering included)")
    t.notes.append("each chunk is parsed in this process (one core: the GIL), VictoriaMetrics answers on the other: parallel "
                   "requests overlap its answering with the parse, GPU shards split one chunk's answer over several requests; "
                   "on Dask the parse runs in the worker processes, so it is no longer bound to one core (this process unpickles the batches)")
    return [t]
