"""Two and four `gpufleet collect --shard K/N` processes on one store, started together over
simulated exporters on loopback "nodes" (127.0.0.x), against one unsharded collector scraping
the same exporters: every GPU is read once, by the shard of its node, and the figures are the
single collector's. One shard killed with SIGKILL mid-round: the others go on, and its GPUs are
"no data" from then on, never idle."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from gpufleet.analytics.fleet_now import collector_status, gpu_states
from gpufleet.analytics.params import Params
from gpufleet.collector.shard import Shard, shard_of
from gpufleet.collector.store import open_reader
from gpufleet.procs import terminate
from gpufleet.times import utcnow
from tests.realstack.process import wait_for
from tests.support.exporter import start_exporter, stop

GPUS = 2


def loopback_nodes(minimum: int = 6) -> list[str]:
    """127.0.0.x addresses, at least `minimum`, until both the 2- and the 4-shard split give
    every shard a node (the hash decides which node goes where)."""
    nodes = []
    for x in range(2, 250):
        nodes.append(f"127.0.0.{x}")
        if len(nodes) >= minimum and all({shard_of(h, n) for h in nodes} == set(range(1, n + 1)) for n in (2, 4)):
            return nodes
    raise AssertionError("no loopback split covers every shard")


def util_of(node: int, gpu: int) -> float:
    return 0.0 if gpu == 0 else 10.0 * node + gpu  # GPU 0 of every node idle: the no-data check means something


def collect(tmp: Path, name: str, store: Path, targets: list[str], shard: str | None) -> subprocess.Popen:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(f'[collector]\nstore = "{store}"\ncluster = "c"\nlisten = ""\n'
                   f'[collector.scrape]\ninterval = 1\ntimeout = 3\ntargets = {targets!r}\n'
                   "[collector.retention]\ncompact_interval = 3600\n".replace("'", '"'))
    argv = [sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg)] + (["--shard", shard] if shard else [])
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"))


def gpus_seen(store: Path) -> set[str]:
    try:
        return {r[0] for r in open_reader(store).execute("SELECT DISTINCT gpu_uuid FROM gpu_samples").fetchall()}
    except Exception:  # noqa: BLE001 - no shard published yet
        return set()


def test_sharded_collectors_read_every_gpu_once_and_a_killed_shard_is_no_data(tmp_path):
    nodes = loopback_nodes()
    exporters, targets = [], []
    collectors: dict[str, subprocess.Popen] = {}
    try:
        for i, host in enumerate(nodes):
            d = tmp_path / f"node-{i}"
            d.mkdir()
            scenario = f'hostname = "node-{i}"\nmodel = "h100"\ngpus = {GPUS}\n' + "".join(
                f"[[gpu]]\nindex = {g}\nutilization = {util_of(i, g)}\n"
                f"processes = [ {{ pid = {4000 + g}, used_memory_mib = 900, sm_util = {util_of(i, g)} }} ]\n" for g in range(GPUS))
            proc, port = start_exporter(d, scenario, {g: str(100 + i) for g in range(GPUS)}, host=host)
            exporters.append(proc)
            targets.append(f"{host}:{port}")
        stores = {"single": tmp_path / "single", 2: tmp_path / "two", 4: tmp_path / "four"}
        collectors["single"] = collect(tmp_path, "single", stores["single"], targets, None)
        for n in (2, 4):
            for k in range(1, n + 1):
                collectors[f"{k}/{n}"] = collect(tmp_path, f"shard-{k}-of-{n}", stores[n], targets, f"{k}/{n}")
        every = len(nodes) * GPUS

        def all_gpus_in_every_store() -> bool:
            for name, p in collectors.items():
                assert p.poll() is None, f"collector {name} exited {p.returncode}: " + \
                    (tmp_path / f"{'single' if name == 'single' else 'shard-' + name.replace('/', '-of-')}.log").read_text()[-2000:]
            return all(len(gpus_seen(s)) == every for s in stores.values())

        wait_for("every store to hold every GPU", all_gpus_in_every_store, timeout=90, interval=0.5)

        # shard 2 of 2 dies mid-round; the others go on
        collectors.pop("2/2").send_signal(signal.SIGKILL)
        killed_at = utcnow()
        time.sleep(8)
        for name, p in collectors.items():
            assert p.poll() is None, f"collector {name} stopped when another shard was killed"
    finally:
        for p in collectors.values():
            p.send_signal(signal.SIGTERM)
        for p in collectors.values():
            terminate(p)
        for p in exporters:
            stop(p)

    host_of = {f"node-{i}": h for i, h in enumerate(nodes)}
    for n in (2, 4):
        for k in range(1, n + 1):  # each shard holds exactly the nodes that hash to it
            con = open_reader(Shard(k, n).root(stores[n]))
            hosts = {r[0] for r in con.execute("SELECT DISTINCT host FROM gpu_samples").fetchall()}
            assert hosts == {h for h, addr in host_of.items() if shard_of(addr, n) == k}, (n, k)
        con = open_reader(stores[n])
        total, distinct = con.execute("SELECT count(*), count(DISTINCT (gpu_uuid, ts)) FROM gpu_samples").fetchone()
        assert total == distinct, f"{n} shards: a GPU sample stored twice"

    # the figures: each GPU's utilization, its holder and its model are the single collector's
    def figures(store: Path) -> dict:
        con = open_reader(store)
        per_gpu = con.execute("SELECT host, gpu, gpu_uuid, model, avg(gpu_util), min(gpu_util), max(gpu_util) FROM gpu_samples GROUP BY ALL").fetchall()
        held = con.execute("SELECT host, gpu_uuid, job_key FROM allocations GROUP BY ALL").fetchall()
        return {"gpus": sorted(per_gpu), "held": sorted(held)}

    single = figures(stores["single"])
    assert len(single["gpus"]) == every and all(r[4] == util_of(int(r[0].split("-")[1]), r[1]) for r in single["gpus"])
    assert figures(stores[4]) == single and figures(stores[2]) == single

    # the killed shard: its GPUs stop at the kill, the other shard's go on
    con = open_reader(stores[2])
    last = dict(con.execute("SELECT host, max(ts) FROM gpu_samples GROUP BY host").fetchall())
    killed_hosts = {h for h, addr in host_of.items() if shard_of(addr, 2) == 2}
    assert all(last[h] <= killed_at for h in killed_hosts)
    assert all(last[h] > killed_at + timedelta(seconds=4) for h in set(last) - killed_hosts)
    as_of = max(last.values())
    states = gpu_states(con, Params(start=as_of - timedelta(hours=1), end=as_of), as_of, stale_after=timedelta(seconds=4))
    for row in states.iter_rows(named=True):
        if row["host"] in killed_hosts:
            assert not row["fresh"] and not row["idle_allocated"], row  # no data, never idle
        else:
            assert row["fresh"] and row["idle_allocated"] == (row["gpu"] == 0), row
    status = collector_status(stores[2], now=as_of)
    by_shard = {s["shard"]: s for s in status["shards"]}
    assert set(by_shard) == {"1-of-2", "2-of-2"} and status["published_at"] == by_shard["2-of-2"]["published_at"] <= killed_at
