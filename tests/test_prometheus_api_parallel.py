"""The Prometheus-API source's parallel read (issue #17): each window read as one query per GPU
shard, several in flight. The shards are a partition of every instance (a property, and what a
real VictoriaMetrics and a real Prometheus answer to the shard matchers); a sharded, parallel
read of a real VictoriaMetrics gives batch for batch what the sequential read gives; a failing
shard query fails its window loudly; a server that ignores the matcher is caught."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.collector.schema import SAMPLE_SCHEMA
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.prometheus_api import PrometheusApiSource, instance_shard, instance_shard_regex, shard_matchers
from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus
from gpufleet.collector.store import StoreWriter, open_reader
from tests.realstack.prometheus import promtool_path, start_prometheus
from tests.realstack.victoriametrics import start_victoriametrics
from tests.support.http import Loopback
from tests.test_victoriametrics_source import BODIES, START, STEP, body_at, ms

# instances of every shape: host:port, numbered and hex hosts, no port, IPv6, a URL, upper case,
# non-ASCII (a Kelvin sign lower-cases to "k" in Python, not in RE2), a newline, nothing before ":"
INSTANCES = ["gpu-node-1:9400", "gpu-node-1:9402", "node-0017:9400", "10.0.3.18:9400", "i-030791dc5a37cd257:9400",
             "GPU-NODE-Z:1", "[::1]:9400", "http://exp.example:9400/metrics", "ünïcødé-ß:9400", "host-K", "host-\u212a:1",
             "a\nb:1", ":9400", "bare", "x:y:z", "q"]
SHARDS = (2, 3, 4, 7, 36)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet=st.sampled_from("ab09Zz:-.\n\u212a/[]")), st.sampled_from(INSTANCES)),
       st.integers(1, 36), st.text(alphabet="0123456789:abc"))
def test_every_instance_is_in_exactly_one_shard_and_its_host_decides_which(instance, shards, port):
    matching = [k for k in range(shards) if re.fullmatch(instance_shard_regex(k, shards), instance)]
    assert matching == [instance_shard(instance, shards)]
    host = instance.split(":", 1)[0]
    assert instance_shard(f"{host}:{port}", shards) == instance_shard(host, shards)  # a host's exporters stay together


def test_shard_settings_are_checked():
    from gpufleet.collector import config
    from gpufleet.collector.sources import prometheus_api

    assert len(prometheus_api._SHARD_CHARS) == config.GPU_SHARDS_MAX
    for bad in ({"gpu_shards": 0}, {"gpu_shards": config.GPU_SHARDS_MAX + 1}, {"parallel_requests": 0}):
        with pytest.raises(ValueError, match="gpu_shards must be"):
            PrometheusApiSource(url="http://unused", cluster="c", **bad)
    with pytest.raises(config.ConfigError, match="gpu_shards"):
        config.load({"collector": {"prometheus": {"url": "http://p:9090", "gpu_shards": 37}}}, "g.toml")


def test_numbered_hosts_spread_over_the_shards():
    counts = [0] * 4
    for i in range(400):
        counts[instance_shard(f"gpu-node-{i:03d}:9400", 4)] += 1
    assert counts == [120, 120, 80, 80]  # the ten digits dealt round-robin


def _partition_check(query, shards: int) -> dict[str, int]:
    """Each shard's answer to the selector with its matcher: the instances it holds."""
    seen: dict[str, int] = {}
    for k, matcher in enumerate(shard_matchers(shards)):
        for s in query(f'{{__name__="shard_probe"{matcher}}}'):
            labels = s["metric"]
            key = labels.get("instance", "")
            assert key not in seen, (shards, key, seen[key], k)
            assert instance_shard(key, shards) == k, (shards, key, k)
            seen[key] = k
    return seen


def _probe_body(instances: list[str]) -> str:
    esc = lambda v: v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')  # noqa: E731
    return "".join(f'shard_probe{{instance="{esc(i)}",n="{n}"}} 1\n' for n, i in enumerate(instances)) + 'shard_probe{n="none"} 1\n'


@pytest.mark.realstack
def test_victoriametrics_answers_each_shard_matcher_with_exactly_its_instances(tmp_path):
    vm = start_victoriametrics(tmp_path / "vm")
    try:
        vm.import_prometheus(_probe_body(INSTANCES))
        vm.flush()
        vm.wait_query('{__name__="shard_probe"}', timeout=30, min_results=len(INSTANCES) + 1)  # searchable a moment after the flush
        stored = {s["metric"].get("instance", "") for s in vm.query('{__name__="shard_probe"}')}
        assert stored == set(INSTANCES) | {""}, stored
        for shards in SHARDS:
            assert set(_partition_check(vm.query, shards)) == stored, shards
    finally:
        vm.stop()


@pytest.mark.realstack
def test_prometheus_answers_each_shard_matcher_with_exactly_its_instances(tmp_path):
    server = Loopback()
    server.routes["/metrics"] = (200, "text/plain; version=0.0.4", _probe_body(INSTANCES).encode())
    prom = None
    try:  # honor_labels: the instance label the target exposes is the one stored
        prom = start_prometheus(tmp_path / "prom", "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: probe\n"
                                f"    honor_labels: true\n    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
        prom.wait_query('{__name__="shard_probe"}', timeout=60, min_results=len(INSTANCES) + 1)
        stored = {s["metric"].get("instance", "") for s in prom.query('{__name__="shard_probe"}')}
        # the series without an instance label gets the target's
        assert stored == set(INSTANCES) | {f"127.0.0.1:{server.port}"}, stored
        for shards in SHARDS:
            assert set(_partition_check(prom.query, shards)) == stored, shards
    finally:
        if prom:
            prom.stop()
        server.close()


# --- a fleet in VictoriaMetrics: the real exporter outputs of the harness, each under several hosts ---

COPIES = 5  # hosts ...-c0 .. -c4: in 4 shards, shard 0 holds two of them, the others one
FLEET_SCRAPES = 16
_IDS = re.compile(r'((?:UUID|uuid|Hostname)=")([^"]*)(")')


def fleet_body(instance: str, k: int, copy: int) -> str:
    """The exporter output of `instance` at scrape k, as copy `copy` on its own host: its GPU UUIDs and Hostname renamed."""
    return _IDS.sub(lambda m: f"{m[1]}{m[2]}-c{copy}{m[3]}", body_at(BODIES[instance], k))


def load_fleet(vm) -> list[str]:
    instances = []
    for copy in range(COPIES):
        for instance in BODIES:
            host, port = instance.split(":")
            name = f"{host}-c{copy}:{port}"
            instances.append(name)
            for k in range(FLEET_SCRAPES):
                vm.import_prometheus(fleet_body(instance, k, copy), timestamp_ms=ms(START + k * STEP),
                                     extra_labels={"instance": name, "job": "gpu"})
    vm.flush()
    return instances


def _same(a, b) -> None:
    assert (a.key, a.watermark) == (b.key, b.watermark)
    assert a.samples.equals(b.samples), (a.samples.num_rows, b.samples.num_rows)
    for attr in ("gpus", "allocations", "throughput", "rejected", "problems"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert [(u.input, u.kind, u.detail) for u in a.unrecognized] == [(u.input, u.kind, u.detail) for u in b.unrecognized]


@pytest.mark.realstack
def test_sharded_parallel_read_of_victoriametrics_is_the_sequential_read_and_rereading_is_a_no_op(tmp_path):
    vm = start_victoriametrics(tmp_path / "vm")
    try:
        instances = load_fleet(vm)
        assert len({instance_shard(i, 4) for i in instances}) == 4  # every shard holds targets
        lo, hi = START - timedelta(seconds=1), START + FLEET_SCRAPES * STEP
        clock = lambda: hi + timedelta(days=1)  # noqa: E731
        read = {}
        for requests, shards in ((1, 1), (4, 4), (3, 7), (2, 36), (4, 1), (1, 4)):
            src = PrometheusApiSource(url=vm.url, cluster="fleet", chunk_seconds=60, parallel_requests=requests, gpu_shards=shards, clock=clock)
            windows = src.backfill_windows(lo, hi)
            assert len(windows) == 5
            read[requests, shards] = list(src.read_windows(windows))
        # the sharded window is the one-query window: through the source's own run() too
        src = PrometheusApiSource(url=vm.url, cluster="fleet", chunk_seconds=60, lag_seconds=0, gpu_shards=4,
                                  initial_lookback_seconds=int((hi - windows[0][0]).total_seconds()))
        assert src.pending(hi, None) == windows
        c = Collector(StoreWriter(tmp_path / "store"), [ScheduledSource(src, 60)], clock=clock)
        written = c.commit(src.name, src.run(hi))
        again = c.commit(src.name, src.read_windows(windows))
        c.writer.close()
    finally:
        vm.stop()
    sequential = read[1, 1]
    rows = sum(b.samples.num_rows for b in sequential)
    gpus = {(r["host"], r["gpu_uuid"], r["gpu_instance"]) for b in sequential for r in b.samples.to_pylist()}
    assert rows == FLEET_SCRAPES * len(gpus) and len(gpus) >= COPIES * 20, (rows, len(gpus))
    assert all(not b.unrecognized and not b.rejected for b in sequential)
    for how, batches in read.items():
        assert len(batches) == len(sequential), how
        for a, b in zip(batches, sequential):
            _same(a, b)
    assert written and again == 0  # the same batch keys: re-reading stores nothing
    con = open_reader(tmp_path / "store")
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == rows


@pytest.mark.realstack
def test_collector_shards_read_victoriametrics_as_one_collector_does(tmp_path):
    """[collector] shard = "K/N" with a Prometheus API: each shard reads its share of the targets
    (the same rule as the GPU shards, as a second instance matcher), and the shards' union holds
    every sample one collector stores, once."""
    from gpufleet.collector.shard import Shard

    vm = start_victoriametrics(tmp_path / "vm")
    try:
        instances = load_fleet(vm)
        lo, hi = START - timedelta(seconds=1), START + FLEET_SCRAPES * STEP
        clock = lambda: hi + timedelta(days=1)  # noqa: E731

        def collect(root, part=None, gpu_shards=1):
            src = PrometheusApiSource(url=vm.url, cluster="fleet", chunk_seconds=60, gpu_shards=gpu_shards, part=part, clock=clock)
            c = Collector(StoreWriter(root), [ScheduledSource(src, 60)], clock=clock)
            c.commit(src.name, src.read_windows(src.backfill_windows(lo, hi)))
            c.writer.close()

        collect(tmp_path / "single")
        for n, gpu_shards in ((2, 1), (3, 4)):
            assert len({instance_shard(i, n) for i in instances}) == n  # every shard has targets
            for k in range(n):
                collect(Shard(k + 1, n).root(tmp_path / f"sharded-{n}"), part=(k, n), gpu_shards=gpu_shards)
    finally:
        vm.stop()
    dump = lambda root: sorted(open_reader(root).execute("SELECT * FROM gpu_samples").fetchall(), key=repr)  # noqa: E731
    single = dump(tmp_path / "single")
    assert len(single) >= FLEET_SCRAPES * COPIES * 20
    for n in (2, 3):
        assert dump(tmp_path / f"sharded-{n}") == single
        hosts = [{r[0] for r in open_reader(Shard(k + 1, n).root(tmp_path / f"sharded-{n}")).execute(
            "SELECT DISTINCT host FROM gpu_samples").fetchall()} for k in range(n)]
        assert all(hosts) and sum(len(h) for h in hosts) == len(set().union(*hosts))  # each host in one shard


def test_a_server_ignoring_the_collector_shard_matcher_fails_the_window(tmp_path):
    src = PrometheusApiSource(url="http://unused", cluster="c", part=(0, 2))
    other = next(i for i in INSTANCES if instance_shard(i, 2) == 1)
    answer = type("R", (), {"json": lambda self: {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"instance": other}, "values": []}]}}, "text": "..."})()
    with pytest.raises(SourceError, match="another collector shard's"):
        src._answer(answer, 0)
    with pytest.raises(ValueError, match="part must be"):
        PrometheusApiSource(url="http://unused", cluster="c", part=(2, 2))


def _openmetrics(path) -> None:
    """The fleet as OpenMetrics with timestamps (family by family, series by series, in time
    order), what `promtool tsdb create-blocks-from openmetrics` turns into Prometheus blocks."""
    families: dict[str, dict[str, list[str]]] = {}
    for copy in range(COPIES):
        for instance in BODIES:
            host, port = instance.split(":")
            extra = f'instance="{host}-c{copy}:{port}",job="gpu"'
            for k in range(FLEET_SCRAPES):
                t = ms(START + k * STEP) / 1000
                for line in fleet_body(instance, k, copy).splitlines():
                    if not line or line.startswith("#"):
                        continue
                    brace = line.find("{")
                    name = line[:brace] if brace > 0 else line.split(" ", 1)[0]
                    series, _, value = line.rpartition(" ")
                    series = f"{name}{{{extra}," + series[brace + 1:] if brace > 0 else f"{name}{{{extra}}}"
                    families.setdefault(name, {}).setdefault(series.replace(",}", "}"), []).append(f"{series.replace(',}', '}')} {value} {t:.3f}\n")
    with open(path, "w") as f:
        for name, by_series in families.items():
            f.write(f"# TYPE {name} gauge\n")
            for lines in by_series.values():
                f.writelines(lines)
        f.write("# EOF\n")


def _direct(root) -> None:
    """What scraping the fleet stores: the scrape source's own round over the same bodies."""
    scrape = ScrapeSource(cluster="fleet", static_targets=[])
    c = Collector(StoreWriter(root), [ScheduledSource(scrape, 15)], clock=lambda: START + timedelta(days=1))
    for k in range(FLEET_SCRAPES):
        answers = [(Target(f"{i.split(':')[0]}-c{copy}:{i.split(':')[1]}"), TargetStatus(up=True), fleet_body(i, k, copy))
                   for copy in range(COPIES) for i in BODIES]
        c.commit("scrape", [scrape.round_batch(START + k * STEP, answers)])
    c.writer.close()


@pytest.mark.realstack
@pytest.mark.parametrize("store", ["victoriametrics", "prometheus"])
def test_sharded_parallel_read_stores_what_scraping_the_fleet_stores(tmp_path, store):
    """A fleet of 25 exporters (real outputs, renamed) in a real VictoriaMetrics (imported) or a
    real Prometheus (blocks made by promtool): read in 4 GPU shards, 4 queries in flight, window
    by window, the store holds per GPU, sample time and column what scraping the bodies stores."""
    _direct(tmp_path / "direct")
    if store == "victoriametrics":
        server = start_victoriametrics(tmp_path / "vm")
        try:
            load_fleet(server)
        except BaseException:
            server.stop()
            raise
    else:
        _openmetrics(tmp_path / "fleet.om")
        r = subprocess.run([promtool_path(), "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "fleet.om"),
                            str(tmp_path / "prom" / "data")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        server = start_prometheus(tmp_path / "prom", "global:\n  scrape_interval: 15s\n", extra_args=["--storage.tsdb.retention.time=100y"])
    try:
        lo, hi = START - timedelta(seconds=1), START + FLEET_SCRAPES * STEP
        src = PrometheusApiSource(url=server.url, cluster="fleet", chunk_seconds=60, parallel_requests=4, gpu_shards=4,
                                  clock=lambda: hi + timedelta(days=1))
        windows = src.backfill_windows(lo, hi)
        c = Collector(StoreWriter(tmp_path / "via"), [ScheduledSource(src, 60)], clock=src.clock)
        c.commit(src.name, src.read_windows(windows))
        c.writer.close()
    finally:
        server.stop()
    columns = [f.name for f in SAMPLE_SCHEMA if f.name != "source"]
    order = "ORDER BY ts, host, gpu_uuid, gpu_instance"
    want = open_reader(tmp_path / "direct").execute(f"SELECT {', '.join(columns)} FROM gpu_samples {order}").fetchall()
    got = open_reader(tmp_path / "via").execute(f"SELECT {', '.join(columns)} FROM gpu_samples {order}").fetchall()
    gpus = {(row[2], row[4], row[5]) for row in want}
    assert len(want) == FLEET_SCRAPES * len(gpus) and len(gpus) >= COPIES * 20, (len(want), len(gpus))
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert dict(zip(columns, g)) == dict(zip(columns, w))
    alloc = "SELECT scheduler, job_key, host, gpu_uuid, gpu_instance, gpu, first_seen, last_seen FROM allocations ORDER BY ALL"
    assert open_reader(tmp_path / "via").execute(alloc).fetchall() == open_reader(tmp_path / "direct").execute(alloc).fetchall()


@pytest.mark.realstack
def test_a_failing_shard_query_fails_its_window_naming_the_shard(tmp_path):
    """VictoriaMetrics refusing a query that selects too many samples (-search.maxSamplesPerQuery):
    the shard over the limit fails its window; the windows before it are read, none after."""
    src = PrometheusApiSource(url="", cluster="fleet", chunk_seconds=60, gpu_shards=4, parallel_requests=4)
    selector = lambda k: src._query(START, START + STEP, k).rsplit("[", 1)[0]  # noqa: E731 - the shard's series selector
    vm = start_victoriametrics(tmp_path / "vm")
    try:
        load_fleet(vm)
        at = ms(START + 5 * STEP) / 1000
        per_shard = [int(vm.query(f"count(last_over_time({selector(k)}[10m]))", time=at)[0]["value"][1]) for k in range(4)]
    finally:
        vm.stop()
    assert max(per_shard) == per_shard[0] > max(per_shard[1:]), per_shard
    # started again on its data, refusing queries of more samples than the other shards hold: it
    # counts the samples of the blocks a query touches, here each series' FLEET_SCRAPES samples
    # (-search.maxUniqueTimeseries, the obvious limit, is not applied by 1.79 to this query)
    limit = (per_shard[0] + max(per_shard[1:])) // 2 * FLEET_SCRAPES
    vm = start_victoriametrics(tmp_path / "vm", extra_args=[f"-search.maxSamplesPerQuery={limit}"])
    try:
        src.url = vm.url
        # two windows the evening before (nothing there), then the first of the fleet's
        windows = [(START - 3 * STEP * 4, START - 2 * STEP * 4), (START - 2 * STEP * 4, START - STEP * 4), (START, START + STEP * 4),
                   (START + STEP * 4, START + STEP * 8)]
        got = []
        with pytest.raises(SourceError, match=r"GPU shard 1/4\) answered HTTP 422: .*maxSamplesPerQuery"):
            for batch in src.read_windows(windows):
                got.append(batch)
        assert [b.key for b in got] == [f"prometheus:fleet:{lo.isoformat()}:{hi.isoformat()}" for lo, hi in windows[:2]]
        assert [u.kind for b in got for u in b.unrecognized] == ["empty_answer"] * 2  # one per window, not per shard
        src.gpu_shards, src.parallel_requests = 1, 1
        with pytest.raises(SourceError, match="HTTP"):  # one query for all of it fails all the same
            src.read_window(*windows[2])
        src.gpu_shards = 8  # smaller shards pass
        assert all(b.samples.num_rows for b in src.read_windows(windows[2:]))
    finally:
        vm.stop()


def test_a_server_that_ignores_the_shard_matcher_fails_the_window(tmp_path):
    """A proxy that drops the instance matcher answers every shard with every series: the
    second shard's answer holds a series of another shard, so the window fails instead of
    storing each sample twice."""
    t = ms(START) / 1000
    result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": f"GPU-{h}", "Hostname": h, "instance": f"{h}:9400"},
               "values": [[t + 15, "1"]]} for h in ("n1", "n2")]
    with Loopback() as server:
        server.routes["/api/v1/query"] = (200, "application/json",
                                          json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode())
        src = PrometheusApiSource(url=server.url, cluster="c1", chunk_seconds=60, gpu_shards=2)
        with pytest.raises(SourceError, match="not in this shard"):
            src.read_window(START, START + timedelta(seconds=60))
        src.gpu_shards = 1
        assert src.read_window(START, START + timedelta(seconds=60)).samples.num_rows == 2
