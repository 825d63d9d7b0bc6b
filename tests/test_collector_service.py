"""The collector service with stand-in sources: scheduling, isolation, metrics, CLI exit codes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta

import pytest
from prometheus_client import generate_latest

from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.schema import Batch
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.store import StoreWriter, open_reader
from tests.test_store import job, samples

T0 = datetime(2026, 11, 20, 12, 0, 0)


class FakeSource:
    def __init__(self, name, batches=(), error=None, sleep=0.0):
        self.name, self._batches, self._error, self._sleep = name, list(batches), error, sleep
        self.runs = 0
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def run(self, now):
        with self._lock:
            self.runs += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self._sleep)
            if self._error:
                raise self._error
            yield from self._batches
        finally:
            with self._lock:
                self.active -= 1


def metric(c: Collector, name: str, **labels) -> float | None:
    return c.metrics.registry.get_sample_value(name, labels)


def test_run_once_commits_and_isolates_a_failing_source(tmp_path):
    good = FakeSource("good", [Batch(key="g1", samples=samples([T0], [50]), jobs=[job("1", "RUNNING")], rejected=2, problems=["line 3: junk"])])
    bad = FakeSource("bad", error=SourceError("sacct: command not found"))
    boom = FakeSource("boom", error=RuntimeError("bug"))
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(bad, 1), ScheduledSource(boom, 1), ScheduledSource(good, 1)], clock=lambda: T0)
    assert c.run_once() is False
    con = open_reader(tmp_path)
    assert con.execute("SELECT gpu_util FROM gpu_samples").fetchall() == [(50.0,)]
    assert metric(c, "gpufleet_collect_source_success", source="good") == 1
    assert metric(c, "gpufleet_collect_source_success", source="bad") == 0
    assert metric(c, "gpufleet_collect_source_success", source="boom") == 0
    assert metric(c, "gpufleet_collect_rows_written_total", source="good", table="gpu_samples") == 1
    assert metric(c, "gpufleet_collect_rows_written_total", source="good", table="jobs") == 1
    assert metric(c, "gpufleet_collect_rows_rejected_total", source="good") == 2
    assert metric(c, "gpufleet_collect_source_failures_total", source="bad") == 1
    assert b"gpufleet_collect_source_duration_seconds" in generate_latest(c.metrics.registry)


def test_duplicates_counted_and_lag_from_watermark(tmp_path):
    batch = Batch(key="w", samples=samples([T0], [1]), watermark=("src", (T0 - timedelta(minutes=5)).isoformat()))
    src = FakeSource("src", [batch])
    src.watermark_name = "src"
    src.run = lambda now, watermark=None, _b=batch: iter([_b])
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(src, 1)], clock=lambda: T0)
    c.run_once()
    c.run_once()
    assert metric(c, "gpufleet_collect_batches_duplicate_total", source="src") == 1
    assert metric(c, "gpufleet_collect_source_lag_seconds", source="src") == 300


def test_scheduler_never_overlaps_runs_of_one_source(tmp_path):
    slow = FakeSource("slow", sleep=0.6)
    fast = FakeSource("fast")
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(slow, 0.1), ScheduledSource(fast, 0.1)])
    stop = threading.Event()
    t = threading.Thread(target=c.serve, args=(stop,), kwargs={"jitter_fraction": 0.0})
    t.start()
    time.sleep(2.0)
    stop.set()
    t.join(timeout=10)
    assert slow.max_active == 1  # max_instances=1: a slow run is never doubled
    assert 2 <= slow.runs <= 4  # ~2 s / 0.6 s, missed runs coalesced
    assert fast.runs >= 8  # the slow source does not hold the fast one back


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "collect", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_config_errors_exit_2(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 2 and "no source configured" in r.stderr
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\n[collector.scrape]\ninterval = "fast"\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 2 and "[collector.scrape]: interval = 'fast': expected a number of seconds > 0" in r.stderr
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\n[collector.prometheus]\nurl = "prom:9090"\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 2 and "expected an http:// or https:// URL" in r.stderr
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\n[collector.prometheus]\nurl = "http://127.0.0.1:1"\n')
    r = run_cli("--config", str(cfg), "--backfill", "2026-11-02", "2026-11-01")
    assert r.returncode == 2 and "START must be before END" in r.stderr
    r = run_cli("--config", str(cfg), "--backfill", "yesterday", "today")
    assert r.returncode == 2 and "expected ISO 8601" in r.stderr


def test_cli_once_with_unreachable_source_exits_1_and_keeps_the_store(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\nlisten = ""\n[collector.scrape]\ntargets = ["127.0.0.1:1"]\ntimeout = 1\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 1, r.stderr
    assert "all 1 scrape targets failed" in r.stderr
    assert (tmp_path / "s" / "manifest.json").exists()


@pytest.mark.parametrize("when, expected", [("2026-11-16T00:00:00Z", datetime(2026, 11, 16)), ("2026-11-16T01:00:00+01:00", datetime(2026, 11, 16)), ("2026-11-16", datetime(2026, 11, 16))])
def test_times_are_utc_unless_an_offset_is_given(when, expected):
    from gpufleet.times import parse_time

    assert parse_time(when) == expected


def test_per_target_series_count_each_round_once_and_go_with_their_target(tmp_path):
    from gpufleet.collector.sources.scrape import TargetStatus

    src = FakeSource("scrape", [Batch(key="k", samples=samples([T0], [1]))])
    src.status, src.rejected_total = {"a:9400": TargetStatus(up=True, rejected=3), "b:9400": TargetStatus()}, {"a:9400": 3}
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(src, 1)], clock=lambda: T0)
    c.run_once()
    c.run_once()  # the same round's status read again (a failed run leaves it as it was): counted once
    assert metric(c, "gpufleet_collect_target_lines_rejected_total", target="a:9400") == 3
    assert metric(c, "gpufleet_collect_target_lines_rejected_total", target="b:9400") == 0
    assert metric(c, "gpufleet_collect_target_up", target="b:9400") == 0
    src.status, src.rejected_total = {"a:9400": TargetStatus(up=True, rejected=2)}, {"a:9400": 5, "b:9400": 0}
    c.run_once()
    assert metric(c, "gpufleet_collect_target_lines_rejected_total", target="a:9400") == 5
    assert metric(c, "gpufleet_collect_target_up", target="b:9400") is None  # b left the target list


def test_service_upkeep_compacts_closed_hours_and_reports_itself(tmp_path):
    """serve() schedules maintain(); here it is called directly with the clock 2 h after the data."""
    import json

    rounds = [Batch(key=f"r{i}", samples=samples([T0 + timedelta(seconds=15 * i)], [float(i)])) for i in range(4)]
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(FakeSource("src", rounds), 1)], clock=lambda: T0 + timedelta(hours=2))
    c.run_once()
    assert len(json.loads((tmp_path / "manifest.json").read_text())["samples"]) == 4
    c.maintain(raw_days=35)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len(manifest["samples"]) == 1 and "compact-12" in manifest["samples"][0]
    # the settled hour's 5-minute facts (no day is closed yet): nothing left to build
    assert [e["grain"] for e in manifest["facts"]] == ["5m"]
    assert open_reader(tmp_path).execute("SELECT sum(samples_n) FROM fact_parts WHERE lead AND grain_s = 300").fetchall() == [(4,)]
    assert [metric(c, "gpufleet_collect_facts", grain=g, state=s) for g in ("hour", "day") for s in ("listed", "awaiting_build")] == [1, 0, 0, 0]
    assert metric(c, "gpufleet_collect_source_success", source="maintenance") == 1
    # no per-GPU summaries (retired, issue #52): the manifest lists none, the metric is gone
    assert "summaries" not in manifest and metric(c, "gpufleet_collect_summary_hours", state="summarised") is None
