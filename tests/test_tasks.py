"""The task runner (gpufleet.collector.tasks) in-process and on a real Dask cluster on loopback
(`dask scheduler` + `dask worker` processes started here): same results, retries, a worker
killed mid-run."""

from __future__ import annotations

import signal
import time

import pytest

from gpufleet.collector.tasks import TaskError, TaskRunner
from tests.realstack.dask import start_dask
from tests.support.tasks import flaky, square_slowly


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


def test_unreachable_scheduler_is_a_clear_error():
    from tests.realstack.process import free_port

    with pytest.raises(TaskError, match="cannot reach the Dask scheduler at tcp://127.0.0.1"):
        TaskRunner(scheduler=f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=2).map(square_slowly, [(1, 0)])
