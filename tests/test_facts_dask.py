"""Rebuilding the facts (gpufleet.collector.maintenance.build_facts) as tasks an hour: on a real
Dask cluster on loopback (`dask scheduler` + two `dask worker` processes started here) a rebuild
writes the bytes the collector's own upkeep wrote in-process, also when a worker is SIGKILLed
mid-rebuild; a few hours stay in the collector even with a scheduler set; `gpufleet collect
--rebuild-facts` runs it on [analytics] dask_scheduler. The retired `--rebuild-summaries` is
refused with what replaced it."""

from __future__ import annotations

import json
import shutil
import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.collector import facts
from gpufleet.collector.maintenance import compact, rebuild_facts, task_runner
from gpufleet.collector.store import StoreWriter
from gpufleet.collector.tasks import TaskRunner
from tests.realstack.dask import start_dask
from tests.support.collect import run_collect
from tests.support.fleet import Fleet

T0 = datetime(2026, 3, 1, 17)  # 17:00 to 09:00 the next day: two days, 16 hours
END = T0 + timedelta(hours=16)
NOW = END + timedelta(hours=2)
HOURS = 16  # 17:00 to 08:00: the hours with samples (a sample a minute holds 30 s)


def util_of(n: int):
    return lambda t: 0.0 if (t.hour + n) % 4 == 0 else 30.0 + 7 * n + (t.minute % 10)


def fleet_store(root: Path) -> Path:
    """Twelve GPUs (two MIG instances among them) over 16 hours, compacted and with the facts the
    collector's upkeep writes, in-process."""
    f = Fleet(root)
    for n in range(10):
        f.gpu_series(f"n{n}", f"GPU-{n}", T0, END, step=60, util=util_of(n), procs=1.0)
    for gi in (1, 2):
        f.gpu_series("n10", "GPU-M", T0, END, step=60, util=util_of(gi + 3), model="NVIDIA A100-SXM4-80GB", gi=gi, mig_profile="3g.40gb")
    f.job("1", account="a", user="u", start=T0, end=END, gpus=2, placements=[("n1", "GPU-1"), ("n2", "GPU-2")])
    f.write()
    w = StoreWriter(root)
    compact(w, NOW, facts_hours=None)
    w.close()
    return root


def listed(root: Path) -> dict[str, bytes]:
    """The facts files the manifest lists, by name."""
    return {e["file"]: (root / e["file"]).read_bytes() for e in json.loads((root / "manifest.json").read_text())["facts"]}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fleet_store(tmp_path_factory.mktemp("rebuild") / "store")


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    cluster = start_dask(tmp_path_factory.mktemp("dask"), workers=2)
    yield cluster
    cluster.stop()


def lost_copy(store: Path, root: Path) -> dict[str, bytes]:
    """A copy of the store whose facts files are all lost; returns what upkeep had written."""
    written = listed(store)
    assert len([f for f in written if "/5m/" in f]) == HOURS
    shutil.copytree(store, root)
    for f in written:
        (root / f).unlink()
    return written


def test_facts_rebuilt_on_dask_are_the_bytes_upkeep_wrote_here(store, dask_cluster, tmp_path):
    """--rebuild-facts with a Dask scheduler: the hours' facts built on the cluster
    (maintenance.FactsTask), byte for byte those the upkeep of the store wrote in-process."""
    written = lost_copy(store, tmp_path / "s")
    seen = []
    w = StoreWriter(tmp_path / "s")
    built = rebuild_facts(w, NOW, facts.FactParams(), tasks=TaskRunner(scheduler=dask_cluster.address, progress=lambda d, t: seen.append(t)))
    w.close()
    assert built["hours"] == HOURS and sorted(set(seen)) == [7, 9]  # a map a day (7 hours, then 9), on the cluster
    assert {f: (tmp_path / "s" / f).read_bytes() for f in written} == written


def test_a_worker_killed_mid_rebuild_costs_nothing_but_time(store, dask_cluster, tmp_path):
    written = lost_copy(store, tmp_path / "s")

    def progress(done: int, total: int) -> None:
        if done == 2:  # the other tasks running or queued on both workers
            dask_cluster.workers[0].proc.send_signal(signal.SIGKILL)

    w = StoreWriter(tmp_path / "s")
    built = rebuild_facts(w, NOW, facts.FactParams(), tasks=TaskRunner(scheduler=dask_cluster.address, progress=progress))
    w.close()
    assert built["hours"] == HOURS and not dask_cluster.workers[0].alive()
    assert {f: (tmp_path / "s" / f).read_bytes() for f in written} == written
    dask_cluster.add_worker()


def test_few_hours_stay_in_the_collector_even_with_a_scheduler():
    on_dask = TaskRunner(scheduler="tcp://127.0.0.1:1", name="facts")  # never reached: nothing is sent
    assert task_runner(on_dask, 2).scheduler in (None, "") and task_runner(on_dask, 24).scheduler == on_dask.scheduler
    assert task_runner(None, 24).scheduler in (None, "")


def test_cli_rebuilds_the_facts_on_dask(store, dask_cluster, tmp_path):
    written = lost_copy(store, tmp_path / "s")
    rc, text = run_collect(tmp_path, tmp_path / "s", f'dask_scheduler = "{dask_cluster.address}"\n', "--rebuild-facts")
    assert rc == 0 and f"facts: {HOURS} hours of 5-minute facts and 2 days of hour and day facts built" in text
    assert {f: (tmp_path / "s" / f).read_bytes() for f in written} == written


def test_rebuild_summaries_is_refused_with_what_replaced_it(store, tmp_path, caplog):
    rc, _ = run_collect(tmp_path, store, "", "--rebuild-summaries")
    assert rc == 2 and "--rebuild-summaries was retired" in caplog.text and "--rebuild-facts" in caplog.text
