"""Sharded ingest without processes: the split of targets, the accounting claim, the config,
and readers seeing the union of the shards exactly as one store holding every batch."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector import config
from gpufleet.collector.cli import build
from gpufleet.collector.shard import Shard, ShardError, claim_accounting, shard_of, target_host
from gpufleet.collector.sources.scrape import ScrapeSource
from gpufleet.collector.store import StoreError, StoreWriter, open_reader, read_manifests, store_version
from gpufleet.config import ConfigError
from tests.support.fleet import Fleet

T0 = datetime(2026, 11, 20, 10, 0, 0)
HOSTS = st.from_regex(r"[a-z][a-z0-9\-]{0,12}(\.[a-z]{2,5})?", fullmatch=True)


def test_shard_spec():
    assert Shard.parse("2/4") == Shard(2, 4) and Shard.parse(" 1 / 1 ").name == "1-of-1"
    for bad in ("0/4", "5/4", "4", "a/b", "", "1/0"):
        with pytest.raises(ShardError, match="expected K/N"):
            Shard.parse(bad)


def test_target_host_is_what_a_shard_is_chosen_by():
    assert target_host("node-1:9400") == target_host("NODE-1:9402") == target_host("http://node-1:9400/metrics") == "node-1"
    assert target_host("https://user@node-2.example.org/m") == "node-2.example.org"
    assert target_host("[fd00::1]:9400") == target_host("http://[fd00::1]:9400/metrics") == "fd00::1"
    assert target_host("node-3") == "node-3"


@settings(max_examples=60)
@given(st.lists(HOSTS, min_size=1, max_size=30, unique=True), st.integers(1, 6), HOSTS)
def test_every_target_falls_to_exactly_one_shard_and_adding_one_moves_no_other(hosts, n, new):
    targets = [f"{h}:9400" for h in hosts]
    owners = {t: [k for k in range(1, n + 1) if Shard(k, n).owns(t)] for t in targets}
    assert all(len(o) == 1 for o in owners.values())
    # the gpufleet exporter and dcgm-exporter of one node: the same shard (precedence merges them)
    assert all(shard_of(f"{h}:9400", n) == shard_of(f"http://{h}:9402/metrics", n) for h in hosts)
    before = {t: shard_of(t, n) for t in targets}
    assert {t: shard_of(t, n) for t in targets + [f"{new}:9400"] if t in before} == before


def test_scrape_source_keeps_its_share(tmp_path):
    targets = [f"node-{i}:9400" for i in range(40)]
    seen = []
    for k in (1, 2, 3):
        mine, problems = ScrapeSource(cluster="c", static_targets=targets, shard=Shard(k, 3)).targets()
        assert problems == [] and mine
        seen += [t.address for t in mine]
    assert sorted(seen) == sorted(targets)


def test_accounting_is_claimed_by_one_shard(tmp_path):
    claim_accounting(tmp_path, Shard(1, 2))
    claim_accounting(tmp_path, Shard(1, 2))  # the same shard restarting
    with pytest.raises(ShardError, match=r"shard 2/2 .* but shard 1-of-2 owns it .* delete"):
        claim_accounting(tmp_path, Shard(2, 2))


def _opts(tmp_path, **top):
    doc = {"collector": {"store": str(tmp_path / "store"), "listen": "", "scrape": {"targets": ["node-1:9400", "node-2:9400"]},
                         "sacct": {"enabled": True}, **top}}
    return config.load(doc, "test.toml")


def test_build_places_each_shard_and_gives_accounting_to_one(tmp_path):
    one = build(_opts(tmp_path, shard="1/2"))
    assert one.writer.root == tmp_path / "store" / "shards" / "1-of-2" and one.accounting
    assert [s.source.name for s in one.sources] == ["scrape", "sacct"]
    two = build(_opts(tmp_path, shard="2/2"))
    assert not two.accounting and [s.source.name for s in two.sources] == ["scrape"]
    with pytest.raises(ConfigError, match="shard 1-of-2 owns it"):
        build(_opts(tmp_path, shard="2/2", accounting=True))
    one.writer.close()
    two.writer.close()
    # a single collector's writer on a sharded store is refused, and the reverse
    with pytest.raises(StoreError, match="is sharded"):
        StoreWriter(tmp_path / "store")
    with pytest.raises(ConfigError, match="--shard '3/2': expected K/N"):
        config.load({"collector": {"store": "x"}}, "t.toml", shard="3/2")
    with pytest.raises(ConfigError, match="shard = '0/2': expected K/N"):
        config.load({"collector": {"store": "x", "shard": "0/2"}}, "t.toml")
    with pytest.raises(ConfigError, match="at most 36 shards read one Prometheus API"):
        build(_opts(tmp_path, shard="1/37", prometheus={"url": "http://p:9090"}))
    prom = build(_opts(tmp_path / "p", shard="2/3", prometheus={"url": "http://p:9090"}))
    assert [s.source.part for s in prom.sources if s.source.name == "prometheus"] == [(1, 3)]  # its third of the targets
    prom.writer.close()


def test_a_store_with_both_a_manifest_and_shards_is_refused(tmp_path):
    StoreWriter(tmp_path).close()
    StoreWriter(tmp_path / "shards" / "1-of-2").close()
    with pytest.raises(StoreError, match="holds both a single collector's manifest.json and shards"):
        open_reader(tmp_path)
    assert store_version(tmp_path) is None


TABLES = ("gpu_samples", "jobs", "allocations", "gpus")


def _dump(con) -> dict[str, list]:
    return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 23), st.floats(0, 100)), min_size=1, max_size=20), st.integers(2, 4))
def test_the_shards_read_as_one_store_holding_every_batch(tmp_path_factory, samples, n):
    """Every node's series written by the shard its host hashes to reads the same, table for
    table, as all of them written by one collector; jobs come from the accounting shard."""
    base = tmp_path_factory.mktemp("shards")
    single = Fleet(base / "single", cluster="c")
    shards = {k: Fleet(Shard(k, n).root(base / "sharded"), cluster="c") for k in range(1, n + 1)}
    for node, minute, util in samples:
        host = f"node-{node}"
        t = T0 + timedelta(minutes=minute * 5)
        for f in (single, shards[shard_of(host, n)]):
            f.gpu_series(host, f"GPU-{node}", t, t + timedelta(seconds=1), util=util, procs=1.0)
    for f in (single, shards[1]):  # accounting: shard 1
        f.job("7", account="a", user="u", start=T0, end=T0 + timedelta(hours=1), gpus=1, placements=[("node-0", "GPU-0")])
    for f in (single, *shards.values()):
        f.write()
    assert _dump(open_reader(base / "sharded")) == _dump(open_reader(base / "single"))
    assert len(read_manifests(base / "sharded")) == sum(1 for f in shards.values() if f.root.exists())
