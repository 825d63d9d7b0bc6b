"""Oracle: per-GPU mean utilization from the analytics equals a real Prometheus's avg_over_time.

The same regular samples (every 15 s, 8 GPUs, 3 hours, seeded-random utilization of several
shapes) go into a store through the real StoreWriter (tests/support/fleet.py) and, as OpenMetrics
text, through `promtool tsdb create-blocks-from openmetrics` into a real Prometheus. For windows
[t0, t1) on the sample grid, Analysis.per_gpu()'s busy_gpu_h / data_gpu_h x 100 (time-weighted
DCGM_FI_DEV_GPU_UTIL) must equal `avg_over_time(DCGM_FI_DEV_GPU_UTIL[t1 - t0])` within 0.1 point.

Why the sample sets coincide, and the one trick it takes:
- Ours: a sample holds from its time until the next one (15 s here, below max_gap = 30 s), and
  windows are half-open [t0, t1). With t0 and t1 on the 15 s grid, the samples at t0, t0+15, ...,
  t1-15 each hold exactly 15 s inside the window: the time-weighted mean is their plain mean.
- Prometheus 2.x (Debian ships 2.42) selects a range [t - d, t] *closed at both ends*; 3.x made
  it left-open (t - d, t]. Evaluated at t1 with d = t1 - t0, 2.x would take the sample at t0 and
  also the one at t1, which our half-open window leaves out (3.x would take t1 and drop t0).
  So the range is shifted by 1 ms: `[d] offset 1ms` at t1 selects [t0 - 1 ms, t1 - 1 ms] (2.x) or
  (t0 - 1 ms, t1 - 1 ms] (3.x), which on a 15 s grid holds exactly t0 .. t1-15 either way.
  count_over_time with the same selector checks that the sets are the same size.
Regular samples are the claim's premise: with gaps beyond max_gap we call the time "no data"
while avg_over_time just averages whatever samples there are, so the two means legitimately
differ (uneven gaps below max_gap weight samples by time in ours, equally in Prometheus).
"""

from __future__ import annotations

import math
import random
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from tests.realstack.prometheus import start_prometheus
from tests.support.fleet import Fleet

pytestmark = pytest.mark.realstack

START = datetime(2026, 11, 2, 0, 0, 0)  # naive UTC, in the past; Prometheus keeps it (10y retention)
HOURS = 3
STEP = 15
GPUS = 8
END = START + timedelta(hours=HOURS)
N = HOURS * 3600 // STEP
HOST = "oracle-node"
MODEL = "NVIDIA H100 80GB HBM3"

# [t0, t1) windows on the 15 s grid: the whole series, a long middle stretch, 5 and 1 minutes
WINDOWS = [
    (START, END),
    (START + timedelta(minutes=62, seconds=45), START + timedelta(hours=2, minutes=30)),
    (START + timedelta(minutes=45), START + timedelta(minutes=50)),
    (END - timedelta(minutes=1), END),
]


def uuid(gpu: int) -> str:
    return f"GPU-0rac1e00-0000-4000-8000-{gpu:012d}"


def utilization_series(seed: int = 20261102) -> dict[int, list[float]]:
    """Per GPU, N values of several shapes: idle, pegged, uniform noise, random walk, bursts,
    a slow wave, a step change, and sparse spikes. One decimal, as DCGM reports integers and
    exporters often average."""
    rng = random.Random(seed)
    out: dict[int, list[float]] = {0: [0.0] * N, 1: [100.0] * N}
    out[2] = [round(rng.uniform(0, 100), 1) for _ in range(N)]
    walk, v = [], 50.0
    for _ in range(N):
        v = min(100.0, max(0.0, v + rng.gauss(0, 8)))
        walk.append(round(v, 1))
    out[3] = walk
    burst, on = [], False
    for _ in range(N):
        if rng.random() < 0.02:
            on = not on
        burst.append(round(rng.uniform(85, 100), 1) if on else 0.0)
    out[4] = burst
    out[5] = [round(50 + 45 * math.sin(i / 40) + rng.uniform(-5, 5), 1) for i in range(N)]
    out[6] = [round(rng.uniform(2, 8), 1) if i < N // 2 else round(rng.uniform(70, 95), 1) for i in range(N)]
    out[7] = [round(rng.uniform(90, 100), 1) if rng.random() < 0.05 else 0.0 for _ in range(N)]
    return out


def write_openmetrics(path, series: dict[int, list[float]]) -> None:
    t0 = int(START.replace(tzinfo=timezone.utc).timestamp())
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %)."]
    for gpu, values in series.items():
        labels = f'gpu="{gpu}",UUID="{uuid(gpu)}",Hostname="{HOST}",modelName="{MODEL}",instance="{HOST}:9400",job="dcgm"'
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {v} {t0 + i * STEP}" for i, v in enumerate(values)]
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def loaded(prometheus_bin, promtool, tmp_path_factory):
    """(store reader connection, running Prometheus, the series) holding the same samples."""
    tmp = tmp_path_factory.mktemp("oracle-prom")
    series = utilization_series()

    fleet = Fleet(tmp / "store", cluster="oracle")
    for gpu, values in series.items():
        fleet.gpu_series(HOST, uuid(gpu), START, END, step=STEP, gpu=gpu, model=MODEL,
                         util=lambda t, v=values: v[int((t - START).total_seconds()) // STEP])
    fleet.write()

    om = tmp / "data.om"
    write_openmetrics(om, series)
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "prom" / "data")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prom = start_prometheus(tmp / "prom", "global:\n  scrape_interval: 1h\n", extra_args=["--storage.tsdb.retention.time=10y"])
    try:
        yield fleet.reader(), prom, series
    finally:
        prom.stop()


def epoch(t: datetime) -> int:
    return int(t.replace(tzinfo=timezone.utc).timestamp())


def test_the_two_hold_the_same_samples(loaded):
    con, prom, series = loaded
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == N * GPUS
    got = prom.query(f"count_over_time(DCGM_FI_DEV_GPU_UTIL[{HOURS * 3600}s] offset 1ms)", time=epoch(END))
    assert sorted((r["metric"]["UUID"], r["value"][1]) for r in got) == sorted((uuid(g), str(N)) for g in series)


@pytest.mark.parametrize("t0,t1", WINDOWS, ids=[f"{(b - a).total_seconds():g}s@{(a - START).total_seconds():g}" for a, b in WINDOWS])
def test_per_gpu_mean_utilization_equals_avg_over_time(loaded, t0, t1):
    con, prom, series = loaded
    seconds = int((t1 - t0).total_seconds())
    assert seconds % STEP == 0 and int((t0 - START).total_seconds()) % STEP == 0, "windows stay on the sample grid"
    n = seconds // STEP
    selector = f"DCGM_FI_DEV_GPU_UTIL[{seconds}s] offset 1ms"

    counts = {r["metric"]["UUID"]: int(r["value"][1]) for r in prom.query(f"count_over_time({selector})", time=epoch(t1))}
    assert counts == {uuid(g): n for g in series}, "Prometheus selected other samples than the window's"
    prom_avg = {r["metric"]["UUID"]: float(r["value"][1]) for r in prom.query(f"avg_over_time({selector})", time=epoch(t1))}

    per_gpu = Analysis(con, Params(t0, t1), now=END + timedelta(days=1)).per_gpu()
    ours = {}
    for r in per_gpu.iter_rows(named=True):
        assert r["data_gpu_h"] == pytest.approx(seconds / 3600, abs=1e-9), r  # regular samples: no "no data"
        assert r["no_data_gpu_h"] == pytest.approx(0, abs=1e-9)
        ours[r["gpu_uuid"]] = r["busy_gpu_h"] / r["data_gpu_h"] * 100
    assert set(ours) == set(prom_avg) == {uuid(g) for g in series}

    # the plain mean of the window's samples, as a third opinion that explains a mismatch
    i0 = int((t0 - START).total_seconds()) // STEP
    plain = {uuid(g): sum(v[i0:i0 + n]) / n for g, v in series.items()}
    for u in ours:
        assert ours[u] == pytest.approx(prom_avg[u], abs=0.1), (u, ours[u], prom_avg[u], plain[u])
        assert prom_avg[u] == pytest.approx(plain[u], abs=1e-6)

    # and the fleet figure is the mean of the GPUs (all have the same data time here)
    fleet = Analysis(con, Params(t0, t1), now=END + timedelta(days=1)).utilization("fleet")
    assert fleet["utilization_pct"][0] == pytest.approx(sum(prom_avg.values()) / len(prom_avg), abs=0.1)


def test_why_the_range_is_shifted_by_1ms(loaded):
    """Without the shift, Prometheus 2.x takes both edge samples (closed range): one too many."""
    _, prom, series = loaded
    t0, t1 = WINDOWS[2]
    seconds = int((t1 - t0).total_seconds())
    version = prom.get_json("/api/v1/status/buildinfo")["data"]["version"]
    naive = {int(r["value"][1]) for r in prom.query(f"count_over_time(DCGM_FI_DEV_GPU_UTIL[{seconds}s])", time=epoch(t1))}
    assert naive == {seconds // STEP + 1 if version.startswith("2.") else seconds // STEP}, version


def backfilled_equals_direct(con, url: str, tmp_path) -> None:
    """`gpufleet collect --backfill` from the Prometheus API at `url` into a new store: its
    per-GPU figures equal those of the store written directly (`con`), window by window."""
    import sys

    from gpufleet.collector.store import open_reader

    store, cfg = tmp_path / "store", tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{store}"\ncluster = "oracle"\nlisten = ""\n'
                   f'[collector.prometheus]\nurl = "{url}"\nchunk_seconds = 3600\n')
    # backfill chunks are (lo, hi]: start 1 s early so the sample at START is read
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "--log-level", "WARNING", "collect", "--config", str(cfg),
                        "--backfill", (START - timedelta(seconds=1)).isoformat(), END.isoformat()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    collected = open_reader(store)
    assert collected.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == N * GPUS
    cols = ["gpu_uuid", "data_gpu_h", "busy_gpu_h", "no_data_gpu_h"]
    for t0, t1 in WINDOWS:
        direct = Analysis(con, Params(t0, t1), now=END + timedelta(days=1)).per_gpu().select(cols).sort("gpu_uuid")
        via = Analysis(collected, Params(t0, t1), now=END + timedelta(days=1)).per_gpu().select(cols).sort("gpu_uuid")
        assert direct["gpu_uuid"].to_list() == via["gpu_uuid"].to_list()
        for c in cols[1:]:
            assert via[c].to_list() == pytest.approx(direct[c].to_list(), abs=1e-9), (t0, t1, c)


def test_collected_through_the_prometheus_api_gives_the_same_figures(loaded, tmp_path):
    """The whole path: `gpufleet collect --backfill` reads that Prometheus into a second store;
    its per-GPU figures equal those of the store written directly."""
    con, prom, _ = loaded
    backfilled_equals_direct(con, prom.url, tmp_path)


def test_collected_through_victoriametrics_gives_the_same_figures(loaded, tmp_path):
    """The same samples in a real VictoriaMetrics (Debian's, single node): `gpufleet collect
    --backfill` reading it stores what the direct store holds, figure for figure. The series
    start at midnight UTC, which VictoriaMetrics 1.79 answers only 1 ms later (prometheus_api)."""
    from tests.realstack.victoriametrics import start_victoriametrics

    con, _, series = loaded
    vm = start_victoriametrics(tmp_path / "vm")
    try:
        t0 = int(START.replace(tzinfo=timezone.utc).timestamp()) * 1000
        for gpu, values in series.items():
            labels = f'gpu="{gpu}",UUID="{uuid(gpu)}",Hostname="{HOST}",modelName="{MODEL}"'
            vm.import_prometheus("".join(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {v} {t0 + i * STEP * 1000}\n" for i, v in enumerate(values)),
                                 extra_labels={"instance": f"{HOST}:9400", "job": "dcgm"})
        vm.flush()
        backfilled_equals_direct(con, vm.url, tmp_path)
    finally:
        vm.stop()
