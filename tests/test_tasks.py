"""The task runner (gpufleet.collector.tasks) in-process and on a real Dask cluster on loopback
(`dask scheduler` + `dask worker` processes started here): same results, retries, a worker
killed mid-run."""

from __future__ import annotations

import io
import signal
import time
from datetime import datetime, timedelta

import pytest

from gpufleet.collector.backfill import backfill
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.collector.tasks import TaskError, TaskRunner
from tests.realstack.dask import start_dask
from tests.support.tasks import ChunkedSource, flaky, mark_and_square, square_slowly


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    cluster = start_dask(tmp_path_factory.mktemp("dask"), workers=2)
    yield cluster
    cluster.stop()


def test_in_process_results_in_order_with_progress_and_retries(tmp_path):
    seen = []
    runner = TaskRunner(name="t", progress=lambda done, total: seen.append((done, total)))
    assert runner.map(square_slowly, [(n, 0) for n in range(5)]) == [0, 1, 4, 9, 16]
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert TaskRunner(retries=2).map(flaky, [(str(tmp_path / "a"), 2)]) == ["ok after 2"]
    with pytest.raises(TaskError, match=r"task b failed 2 times; last: RuntimeError: transient failure 2"):
        TaskRunner(retries=1).map(flaky, [(str(tmp_path / "b"), 5)], label=lambda i: "b")
    assert TaskRunner().map(square_slowly, []) == []


def test_dask_gives_what_in_process_gives_and_retries(dask_cluster, tmp_path):
    items = [(n, 0.01) for n in range(40)]
    assert TaskRunner(scheduler=dask_cluster.address).map(square_slowly, items) == TaskRunner().map(square_slowly, items)
    assert TaskRunner(scheduler=dask_cluster.address, retries=3).map(flaky, [(str(tmp_path / "c"), 2)]) == ["ok after 2"]
    with pytest.raises(TaskError, match=r"task d failed 2 times on Dask; last: RuntimeError: transient failure"):
        TaskRunner(scheduler=dask_cluster.address, retries=1).map(flaky, [(str(tmp_path / "d"), 5)], label=lambda i: "d")


def test_a_worker_killed_mid_run_costs_nothing_but_time(dask_cluster):
    done = []

    def progress(n, total):
        done.append(n)
        if n == 3:  # some tasks finished, others running or queued on both workers
            dask_cluster.workers[0].proc.send_signal(signal.SIGKILL)

    items = [(n, 0.3) for n in range(16)]
    t0 = time.monotonic()
    assert TaskRunner(scheduler=dask_cluster.address, name="kill", progress=progress).map(square_slowly, items) == [n * n for n in range(16)]
    assert done[-1] == 16 and not dask_cluster.workers[0].alive() and time.monotonic() - t0 < 120
    dask_cluster.add_worker()  # for later tests in this module


def test_ordered_yields_in_order_and_holds_only_what_it_reads_ahead(dask_cluster, tmp_path):
    items = [(n, 0.05 * (n % 3)) for n in range(12)]  # tasks finish out of order on two workers
    assert list(TaskRunner(scheduler=dask_cluster.address).ordered(square_slowly, items)) == [n * n for n in range(12)]
    assert list(TaskRunner().ordered(square_slowly, items)) == [n * n for n in range(12)]

    started = tmp_path / "started"
    started.mkdir()
    results = TaskRunner(scheduler=dask_cluster.address, name="ahead").ordered(
        mark_and_square, [(str(started), n) for n in range(10)], ahead=2)
    assert next(results) == 0
    time.sleep(1.5)  # time enough for every task to start if the runner submitted them all
    assert len(list(started.iterdir())) <= 3  # two read ahead, one submitted when the first was taken
    assert list(results) == [n * n for n in range(1, 10)]

    with pytest.raises(TaskError, match=r"task e failed 2 times on Dask; last: RuntimeError: transient failure"):
        list(TaskRunner(scheduler=dask_cluster.address, retries=1).ordered(flaky, [(str(tmp_path / "e"), 5)], label=lambda i: "e"))


def test_ordered_survives_a_worker_killed_mid_run(dask_cluster):
    def progress(n, total):
        if n == 2:
            dask_cluster.workers[0].proc.send_signal(signal.SIGKILL)

    items = [(n, 0.3) for n in range(10)]
    runner = TaskRunner(scheduler=dask_cluster.address, name="kill-ordered", progress=progress)
    assert list(runner.ordered(square_slowly, items)) == [n * n for n in range(10)]
    assert not dask_cluster.workers[0].alive()
    dask_cluster.add_worker()  # for later tests in this module


def test_a_backfill_on_dask_commits_in_order_and_stops_at_a_chunk_that_fails(dask_cluster, tmp_path, caplog):
    """Chunks read on the workers are committed here in order; a chunk failing on every try ends
    the backfill there, loudly, with the chunks before it stored (a re-run resumes)."""
    t0 = datetime(2026, 11, 2, 6, 0)
    on_dask = TaskRunner(scheduler=dask_cluster.address, name="summaries", retries=1)

    def run(source, store) -> tuple[bool, str, list]:
        c = Collector(StoreWriter(store), [ScheduledSource(source, 60)], clock=lambda: t0 + timedelta(days=1), tasks=on_dask)
        out = io.StringIO()
        ok = backfill(c, t0, t0 + timedelta(minutes=6), out=out)
        c.writer.close()
        return ok, out.getvalue(), [r[0] for r in open_reader(store).execute("SELECT job_id FROM jobs ORDER BY job_id").fetchall()]

    ok, out, jobs = run(ChunkedSource(), tmp_path / "whole")
    assert ok and f"backfill chunked on {dask_cluster.address} [" in out and "6/6 (100%)" in out
    assert jobs == ["0600", "0601", "0602", "0603", "0604", "0605"]

    ok, out, jobs = run(ChunkedSource(fail_at=t0 + timedelta(minutes=3)), tmp_path / "broken")
    assert not ok and jobs == ["0600", "0601", "0602"] and "3/6" in out and "4/6" not in out
    assert "backfill of chunked failed at 2026-11-02T06:03:00..2026-11-02T06:04:00" in caplog.text
    assert "failed 2 times on Dask; last: SourceError: chunk 2026-11-02T06:03:00 is unreadable" in caplog.text


def test_unreachable_scheduler_is_a_clear_error():
    from tests.realstack.process import free_port

    with pytest.raises(TaskError, match="cannot reach the Dask scheduler at tcp://127.0.0.1"):
        TaskRunner(scheduler=f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=2).map(square_slowly, [(1, 0)])
