"""Rebuilding the per-GPU summaries (gpufleet.collector.maintenance.summarize) as tasks per (day,
shard of GPUs): on a real Dask cluster on loopback (`dask scheduler` + two `dask worker`
processes started here) the rebuild writes the bytes the in-process rebuild writes, also when a
worker is SIGKILLed mid-rebuild; a rebuild that failed half-way resumes from the parts it wrote;
`gpufleet collect --rebuild-summaries` runs it from [analytics] with a progress bar."""

from __future__ import annotations

import json
import shutil
import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.collector import maintenance
from gpufleet.collector.maintenance import compact, summarize, summarize_health
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.collector.summaries import PARTS_DIR, SummaryParams
from gpufleet.collector.tasks import TaskError, TaskRunner
from tests.realstack.dask import start_dask
from tests.realstack.process import free_port
from tests.support.collect import run_collect
from tests.support.fleet import Fleet

T0 = datetime(2026, 3, 1, 17)  # 17:00 to 09:00 the next day: two days, 16 hours
END = T0 + timedelta(hours=16)
NOW = END + timedelta(hours=2)
# the hours summarised: 16:00 (its end within max_gap of the first sample) to 08:00
HOURS = 17
NEW = SummaryParams(idle_threshold=50.0)  # the changed threshold that makes the rebuild


def util_of(n: int):
    return lambda t: 0.0 if (t.hour + n) % 4 == 0 else 30.0 + 7 * n + (t.minute % 10)


def fleet_store(root: Path) -> Path:
    """Twelve GPUs (two MIG instances among them) over 16 hours, compacted and summarised with
    the default parameters, as the collector leaves a store."""
    f = Fleet(root)
    for n in range(10):
        f.gpu_series(f"n{n}", f"GPU-{n}", T0, END, step=60, util=util_of(n), procs=1.0)
    for gi in (1, 2):
        f.gpu_series("n10", "GPU-M", T0, END, step=60, util=util_of(gi + 3), model="NVIDIA A100-SXM4-80GB", gi=gi, mig_profile="3g.40gb")
    f.job("1", account="a", user="u", start=T0, end=END, gpus=2, placements=[("n1", "GPU-1"), ("n2", "GPU-2")])
    f.write()
    w = StoreWriter(root)
    compact(w, NOW)
    w.close()
    return root


def summary_bytes(root: Path, key: str = "file") -> dict[str, bytes]:
    """The files the manifest's summary entries name under `key` ("file": their rows, "health":
    their health summaries), by name."""
    entries = json.loads((root / "manifest.json").read_text())["summaries"]
    return {e[key]: (root / e[key]).read_bytes() for e in entries if e.get(key)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fleet_store(tmp_path_factory.mktemp("rebuild") / "store")


@pytest.fixture(scope="module")
def in_process(store, tmp_path_factory):
    """The store rebuilt for the new threshold in this process: what every other rebuild must equal."""
    root = tmp_path_factory.mktemp("in-process") / "store"
    shutil.copytree(store, root)
    w = StoreWriter(root)
    assert summarize(w, NOW, NEW) == HOURS
    w.publish()
    w.close()
    return root


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    cluster = start_dask(tmp_path_factory.mktemp("dask"), workers=2)
    yield cluster
    cluster.stop()


def rebuild_copy(store: Path, root: Path, **kw) -> int:
    shutil.copytree(store, root)
    w = StoreWriter(root)
    built = summarize(w, NOW, NEW, **kw)
    w.publish()
    w.close()
    return built


def test_the_in_process_rebuild_is_of_the_new_threshold(in_process):
    con = open_reader(in_process)
    assert {r[0] for r in con.execute("SELECT DISTINCT idle_threshold FROM summary_hours").fetchall()} == {50.0}


def test_a_rebuild_on_dask_writes_the_bytes_of_the_in_process_rebuild(store, in_process, dask_cluster, tmp_path):
    seen = []
    tasks = TaskRunner(scheduler=dask_cluster.address, name="summaries")
    assert rebuild_copy(store, tmp_path / "s", tasks=tasks, gpu_shards=3, progress=lambda d, t: seen.append((d, t))) == HOURS
    assert seen[-1] == (6, 6)  # two days x three GPU shards, run on the cluster
    assert summary_bytes(tmp_path / "s") == summary_bytes(in_process)
    assert not any((tmp_path / "s" / PARTS_DIR).iterdir())  # the parts are gone once the hours are written


def test_an_hour_of_more_samples_than_a_task_holds_is_built_here_by_shards_of_its_hosts(store, in_process, tmp_path, monkeypatch):
    """An hour holding more samples than one task can (SUMMARY_TASK_SAMPLES; an hour of 100,000
    GPUs did not fit 24 GiB) is summarised here by several tasks, each over a range of the day's
    hosts: the bytes one task a day writes."""
    monkeypatch.setattr(maintenance, "SUMMARY_TASK_SAMPLES", 300)  # an hour of this fleet: 12 GPUs x 60 samples
    seen = []
    assert rebuild_copy(store, tmp_path / "s", progress=lambda d, t: seen.append((d, t))) == HOURS
    assert seen[-1][0] == seen[-1][1] >= 2 * 3  # two days, at least three shards of hosts each
    assert summary_bytes(tmp_path / "s") == summary_bytes(in_process)
    # the hour's own file counts whole (60), the hour before's not at all (0), one spanning 17:30-18:30
    # for the half inside the hour (60 x 30/60 = 30): 60 + 0 + 30
    assert maintenance._samples_in(T0, [(T0, T0 + timedelta(minutes=59), 60), (T0 - timedelta(hours=1), T0 - timedelta(minutes=1), 60),
                                        (T0 + timedelta(minutes=30), T0 + timedelta(minutes=90), 60)]) == 90


def test_a_worker_killed_mid_rebuild_costs_nothing_but_time(store, in_process, dask_cluster, tmp_path):
    def progress(done, total):
        if done == 2:  # the other tasks running or queued on both workers
            dask_cluster.workers[0].proc.send_signal(signal.SIGKILL)

    tasks = TaskRunner(scheduler=dask_cluster.address, name="summaries")
    assert rebuild_copy(store, tmp_path / "s", tasks=tasks, gpu_shards=8, progress=progress) == HOURS
    assert not dask_cluster.workers[0].alive()
    assert summary_bytes(tmp_path / "s") == summary_bytes(in_process)
    dask_cluster.add_worker()


def test_run_facts_are_built_on_dask_with_the_bytes_built_here(in_process, dask_cluster, tmp_path):
    """The rebuild left every hour without its run facts file (they go with the summary): an hour
    a task, on the cluster, each the file this process writes, and every one attached."""
    from distributed import Client

    built = {}
    for where, tasks in (("here", None), ("dask", TaskRunner(scheduler=dask_cluster.address, name="summaries"))):
        root = tmp_path / where
        shutil.copytree(in_process, root)
        w = StoreWriter(root)
        seen = []
        assert summarize_health(w, tasks=tasks, progress=lambda d, t: seen.append((d, t))) == HOURS
        assert seen[-1] == (HOURS, HOURS)
        w.publish()
        w.close()
        built[where] = summary_bytes(root, "health")
    assert len(built["here"]) == HOURS and built["dask"] == built["here"]
    with Client(dask_cluster.address, timeout=10, set_as_default=False) as c:
        ran = c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert any(name.startswith("run facts") for name in ran), ran  # (the hour's health file holds Fleet now's run facts only)
    con = open_reader(tmp_path / "dask")
    assert con.execute("SELECT count(*) FROM health_hours WHERE idle_threshold = 50.0").fetchone()[0] == HOURS


def test_few_hours_stay_in_the_collector_even_with_a_scheduler(store, in_process, tmp_path):
    """Upkeep closes an hour or two at a time: it must not need the cluster (here: none answers)."""
    root = tmp_path / "s"
    shutil.copytree(in_process, root)
    w = StoreWriter(root)
    late = Fleet(tmp_path / "unused")
    late.gpu_series("n0", "GPU-0", END - timedelta(minutes=30), END - timedelta(minutes=20), step=60, util=1.0)
    w.commit(late.batch("late"))
    down = TaskRunner(scheduler=f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=2)
    assert summarize(w, NOW, NEW, tasks=down, gpu_shards=4) == 1  # the late batch's hour, here
    w.close()


def test_a_failed_rebuild_resumes_from_the_parts_it_wrote(store, in_process, tmp_path, monkeypatch):
    root = tmp_path / "s"
    shutil.copytree(store, root)
    real = maintenance.build_summary_part
    calls = []

    def second_day_fails(task):
        calls.append(task.day)
        if task.day == END.strftime("%Y-%m-%d"):
            raise OSError("disk full (planted)")
        return real(task)

    monkeypatch.setattr(maintenance, "build_summary_part", second_day_fails)
    w = StoreWriter(root)
    with pytest.raises(TaskError, match="disk full"):
        summarize(w, NOW, NEW)
    w.close()  # the rebuild was killed: a new writer (a restarted collector) picks it up
    written = sorted(p.name for p in (root / PARTS_DIR).iterdir())
    assert len(written) == 1 and written[0].startswith(T0.strftime("%Y-%m-%d"))
    mtime = (root / PARTS_DIR / written[0]).stat().st_mtime_ns
    calls.clear()
    monkeypatch.setattr(maintenance, "build_summary_part", lambda task: calls.append(task.day) or real(task))
    w = StoreWriter(root)
    assert summarize(w, NOW, NEW) == HOURS
    w.publish()
    w.close()
    assert len(calls) == 2  # both days asked for; the first answered from its part, not recomputed
    assert summary_bytes(root) == summary_bytes(in_process)
    assert not (root / PARTS_DIR / written[0]).exists() and mtime


def test_cli_rebuilds_from_the_config_on_dask_with_a_progress_bar(store, in_process, dask_cluster, tmp_path):
    root = tmp_path / "s"
    shutil.copytree(store, root)
    rc, text = run_collect(tmp_path, root, f'idle_threshold_percent = 50.0\ndask_scheduler = "{dask_cluster.address}"\nrebuild_gpu_shards = 2\n',
                           "--rebuild-summaries")
    assert rc == 0
    assert "rebuilding summaries [" in text and "] 4/4 tasks" in text
    assert f"summaries: {HOURS} hours built ({dask_cluster.address}), {HOURS} hours summarised" in text
    assert summary_bytes(root) == summary_bytes(in_process)
    # every closed hour's joined segments written again from its new rows (the old ones went with their summary)
    assert len(summary_bytes(root, "coarse")) == HOURS


def test_facts_rebuilt_on_dask_are_the_bytes_upkeep_wrote_here(store, dask_cluster, tmp_path):
    """`gpufleet collect --rebuild-facts` with a Dask scheduler: the hours' facts built on the
    cluster (maintenance.FactsTask), byte for byte those the upkeep of the store wrote in-process."""
    from gpufleet.collector.maintenance import fact_params, rebuild_facts

    listed = {e["file"]: (store / e["file"]).read_bytes() for e in json.loads((store / "manifest.json").read_text())["facts"]}
    assert len([f for f in listed if "/5m/" in f]) == 16  # 17:00 to 08:00: the hours with samples (a sample a minute holds 30 s)
    root = tmp_path / "s"
    shutil.copytree(store, root)
    for f in listed:
        (root / f).unlink()  # lost: built again from the samples
    seen = []
    w = StoreWriter(root)
    built = rebuild_facts(w, NOW, fact_params(SummaryParams()), tasks=TaskRunner(scheduler=dask_cluster.address, progress=lambda d, t: seen.append(t)))
    w.close()
    assert built["hours"] == 16 and sorted(set(seen)) == [7, 9]  # a map a day (7 hours, then 9), on the cluster
    assert {f: (root / f).read_bytes() for f in listed} == listed
