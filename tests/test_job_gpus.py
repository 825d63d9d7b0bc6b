"""A job's GPUs are never lost and never overwritten by a zero (issue #51).

Accounting without gres/gpu in AccountingStorageTRES names no GPU for any job: that is an unknown
count, not 0. The store fills it from slurmctld (tres_per_job, tres_per_node x nodes, gres_detail)
and, last, from the exporters' job mapping; of the counts it reads it keeps the most authoritative
one (collector.schema.GPUS_SOURCES), whatever the order; every row says where its count came from.
Through every Slurm route: sacct text, sacct --json, slurmrestd v0.0.38-v0.0.44, JSON files.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timedelta, timezone
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.slurm import SacctSource
from gpufleet.collector.sources.slurm_files import SlurmJsonFilesSource
from gpufleet.collector.sources.slurm_json import jobs_batch, parse_slurmrestd_jobs, slurmctld_gpus, tres_tracks_gpus
from gpufleet.collector.sources.slurm_parse import parse_sacct
from gpufleet.collector.sources.slurmrestd import VERSIONS, SlurmrestdSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.http import Loopback
from tests.test_slurmrestd_source import FAKE_SACCT, _n, ok, openapi

NOW = datetime(2026, 11, 20, 12, 0, 0)
START = NOW - timedelta(hours=1)
SHAPES = [v for v in VERSIONS if v >= "v0.0.38"]  # v0.0.38 .. v0.0.44
FIELDS = ("JobIDRaw", "JobID", "User", "Account", "Partition", "Start", "End", "State", "NNodes", "NodeList", "AllocTRES", "JobName")


def _epoch(t: datetime) -> int:
    return int(t.replace(tzinfo=timezone.utc).timestamp())


# --- what each source says about job 601 -------------------------------------------------------

def sacct_text(state: str, tres: str, job: str = "601") -> str:
    end = "Unknown" if state == "RUNNING" else NOW.strftime("%Y-%m-%dT%H:%M:%S")
    return "|".join([job, job, "alice", "nlp", "gpu", START.strftime("%Y-%m-%dT%H:%M:%S"), end, state, "1", "g01", tres, "train"]) + "\n"


def slurmdb_job(version: str, state: str, tres: list[dict], job: int = 601) -> dict:
    """slurmdbd's record of `job` in `version`'s shape (sacct --json, /slurmdb/ jobs)."""
    return {"job_id": job, "name": "train", "user": "alice", "account": "nlp", "partition": "gpu", "cluster": "hpc",
            "state": {"current": [state] if version >= "v0.0.41" else state, "reason": "None"},
            "time": {"submission": _epoch(START), "start": _epoch(START), "end": 0 if state == "RUNNING" else _epoch(NOW),
                     "elapsed": 3600},
            "tres": {"allocated": tres, "requested": tres},
            "exit_code": {"status": "SUCCESS", "return_code": _n(0, version)}, "nodes": "g01", "allocation_nodes": 1}


NO_GPU_TRES = [{"type": "cpu", "name": "", "count": 8}, {"type": "mem", "name": "", "count": 65536},
               {"type": "node", "name": "", "count": 1}, {"type": "billing", "name": "", "count": 8}]


def slurmctld_job(version: str, state: str = "RUNNING", job: int = 601, **gres) -> dict:
    """slurmctld's record of `job` in `version`'s shape (/slurm/ jobs, scontrol --json): its GPUs
    only in `gres` (tres_per_job, tres_per_node, gres_detail), as where accounting lacks gres/gpu."""
    rec = {"job_id": job, "name": "train", "user_name": "alice", "account": "nlp", "partition": "gpu",
           "job_state": [state] if version >= "v0.0.40" else state,
           "submit_time": _n(_epoch(START), version), "start_time": _n(_epoch(START), version),
           "end_time": _n(_epoch(NOW) if state != "RUNNING" else _epoch(NOW + timedelta(days=1)), version),
           "node_count": _n(gres.pop("node_count", 1), version), "nodes": gres.pop("nodes", "g01"),
           "tres_alloc_str": "cpu=8,mem=64G,node=1,billing=8", "tres_per_job": "", "tres_per_node": "", "gres_detail": []}
    rec.update(gres)
    return rec


def doc(*jobs: dict) -> dict:
    return {"meta": {}, "errors": [], "warnings": [], "jobs": list(jobs)}


def stored(root, job: str = "601") -> tuple:
    rows = open_reader(root).execute("SELECT gpus, gpus_source FROM jobs WHERE job_key = ?", [job]).fetchall()
    return rows[0] if rows else None


def mapping(gpus: int, job: str = "601", ts: datetime = NOW) -> list[dict]:
    return [{"ts": ts, "cluster": "hpc", "scheduler": "slurm", "job_key": job, "host": "g01", "gpu_uuid": f"GPU-{i}",
             "gpu_instance": -1, "gpu": i, "source": "exporter"} for i in range(gpus)]


# --- the parsers: unknown is not zero --------------------------------------------------------------

def test_sacct_text_without_gpu_tres_is_unknown_unless_accounting_tracks_gpus():
    text = sacct_text("COMPLETED", "cpu=8,mem=64G,node=1,billing=8")
    [row], _, _ = parse_sacct(text, fields=FIELDS, cluster="hpc", now=NOW)
    assert (row["gpus"], row["gpus_source"]) == (None, None) and "_no_gpu_tres" not in row
    # a record of the same read that names a GPU shows this accounting tracks them: then no GPU TRES is 0
    rows, _, _ = parse_sacct(text + sacct_text("COMPLETED", "cpu=8,gres/gpu=2,node=1", job="602"), fields=FIELDS, cluster="hpc", now=NOW)
    assert [(r["job_key"], r["gpus"], r["gpus_source"]) for r in rows] == [("601", 0, "slurmdbd"), ("602", 2, "slurmdbd")]
    [row], _, _ = parse_sacct(sacct_text("RUNNING", "cpu=8,node=1"), fields=FIELDS, cluster="hpc", now=NOW, tracks_gpus=True)
    assert (row["gpus"], row["gpus_source"]) == (0, "slurmdbd_running")
    [row], _, _ = parse_sacct(sacct_text("RUNNING", "cpu=8,gres/gpu=4"), fields=FIELDS, cluster="hpc", now=NOW)
    assert (row["gpus"], row["gpus_source"]) == (4, "slurmdbd_running")


@pytest.mark.parametrize("version", SHAPES)
def test_slurmdbd_json_without_gpu_tres_is_unknown(version):
    rows, rejected, problems = parse_slurmrestd_jobs(doc(slurmdb_job(version, "COMPLETED", NO_GPU_TRES)), "hpc", NOW)
    assert (rejected, problems) == (0, [])
    assert [(r["gpus"], r["gpus_source"]) for r in rows] == [(None, None)]
    rows, _, _ = parse_slurmrestd_jobs(doc(slurmdb_job(version, "COMPLETED", NO_GPU_TRES)), "hpc", NOW, tracks_gpus=True)
    assert [(r["gpus"], r["gpus_source"]) for r in rows] == [(0, "slurmdbd")]


@pytest.mark.parametrize("version", SHAPES)
@pytest.mark.parametrize("gres, want", [
    ({"tres_per_job": "gres/gpu:4"}, (4, "slurmctld")),
    ({"tres_per_job": "gres:gpu:h100:4"}, (4, "slurmctld")),
    ({"tres_per_node": "gres/gpu:2", "node_count": 2, "nodes": "g[01-02]"}, (4, "slurmctld")),
    ({"gres_detail": ["gpu:h100:4(IDX:0-3)"]}, (4, "slurmctld")),
    ({"gres_detail": ["gpu:h100:2(IDX:0-1)", "gpu:h100:2(IDX:2-3)"], "nodes": "g[01-02]"}, (4, "slurmctld")),
    ({"tres_alloc_str": "cpu=8,gres/gpu=4,node=1"}, (4, "slurmctld")),
    ({}, (0, "slurmctld")),  # the GRES fields are there and name no GPU: it asked for none
    ({"tres_per_node": "gres/gpu:2", "node_count": 0, "nodes": None}, (None, None)),  # per node, nodes unknown
])
def test_slurmctld_record_says_the_gpus_accounting_lacks(version, gres, want):
    rows, rejected, _ = parse_slurmrestd_jobs(doc(slurmctld_job(version, **gres)), "hpc", NOW)
    assert rejected == 0 and [(r["gpus"], r["gpus_source"]) for r in rows] == [want]


def test_a_truncated_slurmctld_record_is_unknown_never_zero():
    rec = {k: v for k, v in slurmctld_job("v0.0.41").items() if k not in ("tres_per_job", "tres_per_node", "gres_detail")}
    assert slurmctld_gpus(rec, rec["node_count"]) == (None, None)


def test_placeholders_are_null_on_every_route():
    for nodes in ("None assigned", "(null)", "", "Unknown"):
        rows, _, _ = parse_slurmrestd_jobs(doc({**slurmdb_job("v0.0.41", "PENDING", NO_GPU_TRES), "nodes": nodes},
                                               slurmctld_job("v0.0.41", "PENDING", job=602, nodes=nodes)), "hpc", NOW)
        assert [r["nodes"] for r in rows] == [None, None]
        [row], _, _ = parse_sacct(sacct_text("PENDING", "cpu=1").replace("|g01|", f"|{nodes}|"), fields=FIELDS, cluster="hpc", now=NOW)
        assert row["nodes"] is None


def test_the_tres_answer_says_whether_slurmdbd_tracks_gpus():
    base = [{"type": "cpu", "name": "", "id": 1, "count": 0}, {"type": "mem", "name": "", "id": 2, "count": 0}]
    assert tres_tracks_gpus(json.dumps({"TRES": base})) is False
    assert tres_tracks_gpus(json.dumps({"TRES": base + [{"type": "gres", "name": "gpu", "id": 1001, "count": 0}]})) is True
    assert tres_tracks_gpus(json.dumps({"tres": [base + [{"type": "gres", "name": "gpu:h100", "id": 1002}]]})) is True  # dbv0.0.38
    assert tres_tracks_gpus("<html>") is None and tres_tracks_gpus(json.dumps({"errors": []})) is None


# --- the store: one merge rule ---------------------------------------------------------------------

_keys = count()


def commit(w: StoreWriter, jobs=(), allocations=()) -> None:
    w.commit(Batch(key=f"t{next(_keys)}", jobs=list(jobs), allocations=list(allocations)))
    w.publish()


def ctld_rows(version: str, state: str = "RUNNING", **kw) -> list[dict]:
    return jobs_batch(json.dumps(doc(slurmctld_job(version, state, **kw))), key="k", input="slurmctld", cluster="hpc", now=NOW).jobs


def route_rows(route: str, state: str, tmp_path) -> list[dict]:
    """Job 601 ended or running with no GPU TRES, read through `route`."""
    if route == "sacct":
        return parse_sacct(sacct_text(state, "cpu=8,mem=64G,node=1"), fields=FIELDS, cluster="hpc", now=NOW)[0]
    version = route.split(":")[1]
    return jobs_batch(json.dumps(doc(slurmdb_job(version, state, NO_GPU_TRES))), key="k", input=route, cluster="hpc", now=NOW).jobs


ROUTES = ["sacct"] + [f"slurmdbd:{v}" for v in SHAPES]


@pytest.mark.parametrize("route", ROUTES)
def test_slurmctld_fills_what_accounting_lacks_and_it_survives_the_end(route, tmp_path):
    version = route.split(":")[1] if ":" in route else "v0.0.41"
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    commit(w, route_rows(route, "RUNNING", tmp_path))
    assert stored(tmp_path / "s") == (None, None)  # unknown, never 0
    commit(w, ctld_rows(version, tres_per_job="gres/gpu:4"))
    assert stored(tmp_path / "s") == (4, "slurmctld")
    commit(w, route_rows(route, "RUNNING", tmp_path))  # the next accounting read: no GPU TRES
    commit(w, route_rows(route, "COMPLETED", tmp_path))  # ... and its end
    commit(w, allocations=mapping(2))  # the mapping saw fewer: less authoritative
    row = open_reader(tmp_path / "s").execute("SELECT gpus, gpus_source, state, \"end\" FROM jobs").fetchone()
    assert row == (4, "slurmctld", "COMPLETED", NOW)
    w.close()


@pytest.mark.parametrize("route", ROUTES)
def test_without_slurmctld_the_mapping_gives_the_gpus_and_without_it_unknown(route, tmp_path):
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    commit(w, route_rows(route, "COMPLETED", tmp_path))
    assert stored(tmp_path / "s") == (None, None)
    commit(w, allocations=mapping(2, ts=NOW - timedelta(minutes=30)))
    assert stored(tmp_path / "s") == (2, "job_map")
    commit(w, allocations=mapping(3, ts=NOW - timedelta(minutes=20)))  # a third GPU seen later
    assert stored(tmp_path / "s") == (3, "job_map")
    commit(w, route_rows(route, "COMPLETED", tmp_path))  # accounting again: unknown does not replace it
    assert stored(tmp_path / "s") == (3, "job_map")
    w.close()


def test_a_mapping_seen_before_the_job_fills_it_when_it_arrives(tmp_path):
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    commit(w, allocations=mapping(2))
    commit(w, route_rows("sacct", "RUNNING", tmp_path))
    assert stored(tmp_path / "s") == (2, "job_map")
    w.close()


def test_finished_accounting_beats_slurmctld_and_the_disagreement_is_logged_once(tmp_path, caplog):
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    commit(w, ctld_rows("v0.0.41", tres_per_job="gres/gpu:4"))
    tracked = parse_sacct(sacct_text("COMPLETED", "cpu=8,gres/gpu=2,node=1"), fields=FIELDS, cluster="hpc", now=NOW)[0]
    with caplog.at_level(logging.WARNING, logger="gpufleet.collector.store"):
        commit(w, tracked)
        commit(w, ctld_rows("v0.0.41", "COMPLETED", tres_per_job="gres/gpu:4"))  # slurmctld still keeps the ended job
        commit(w, tracked)
    assert stored(tmp_path / "s") == (2, "slurmdbd")
    said = [r.getMessage() for r in caplog.records if "GPUs" in r.getMessage()]
    assert len(said) == 2, said  # once per pair of values and sources
    assert "slurmctld says 4 GPUs, slurmdbd says 2; keeping 2 from slurmdbd" in said[0]
    w.close()


def test_a_store_of_the_previous_schema_keeps_its_counts_and_drops_untracked_zeros(tmp_path):
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    w.db.execute("ALTER TABLE jobs DROP COLUMN gpus_source")
    w.db.execute("DELETE FROM schema_version WHERE version >= 6")  # and the later ones
    for cluster, key, gpus, tres in (("a", "1", 0, "cpu=1"), ("a", "2", 4, "cpu=1,gres/gpu=4"), ("b", "3", 0, "cpu=1")):
        w.db.execute("INSERT INTO jobs (cluster, scheduler, job_key, job_id, gpus, alloc_tres, source, updated_at, \"end\") "
                     "VALUES (?, 'slurm', ?, ?, ?, ?, 'sacct', ?, ?)", [cluster, key, key, gpus, tres, NOW, NOW])
    w.close()
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    rows = w.db.execute("SELECT cluster, job_key, gpus, gpus_source FROM jobs ORDER BY job_key").fetchall()
    # cluster a's accounting names GPUs: its 0 is 0; cluster b's never did: its 0 was "no GPU TRES"
    assert rows == [("a", "1", 0, "slurmdbd"), ("a", "2", 4, "slurmdbd"), ("b", "3", None, None)]
    w.close()


# --- the property: the most authoritative known value seen, whatever the order -------------------

CTLD_GPUS, DBD_GPUS = 4, 2  # the two sources disagree, so the rank decides
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("ctld"), st.sampled_from(["ok", "truncated", "absent"])),
    st.tuples(st.just("dbd"), st.sampled_from(["RUNNING", "COMPLETED"]), st.booleans()),  # state, tracks gres/gpu
    st.tuples(st.just("map"), st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)),
), min_size=1, max_size=8)


def _event_rows(event: tuple) -> tuple[list[dict], list[dict]]:
    if event[0] == "ctld":
        if event[1] == "absent":  # a listing cut short: the job is not in it
            return [], []
        gres = {"tres_per_job": f"gres/gpu:{CTLD_GPUS}"} if event[1] == "ok" else {}
        rec = slurmctld_job("v0.0.41", **gres)
        if event[1] == "truncated":  # its GRES fields missing
            rec = {k: v for k, v in rec.items() if k not in ("tres_per_job", "tres_per_node", "gres_detail")}
        return jobs_batch(json.dumps(doc(rec)), key="k", input="slurmctld", cluster="hpc", now=NOW).jobs, []
    if event[0] == "dbd":
        tres = f"cpu=8,gres/gpu={DBD_GPUS},node=1" if event[2] else "cpu=8,node=1"
        return parse_sacct(sacct_text(event[1], tres), fields=FIELDS, cluster="hpc", now=NOW)[0], []
    return [], [{**m, "gpu_uuid": f"GPU-{i}", "gpu": i} for i, m in zip(event[1], mapping(len(event[1])))]


def _expected(events: list[tuple]) -> tuple[int | None, str | None] | None:
    known: list[tuple[int, int, str]] = []  # (rank, gpus, source)
    mapped: set[int] = set()
    any_job = False
    for e in events:
        if e[0] == "ctld" and e[1] != "absent":
            any_job = True
            if e[1] == "ok":
                known.append((schema.GPUS_SOURCES["slurmctld"], CTLD_GPUS, "slurmctld"))
        elif e[0] == "dbd":
            any_job = True
            if e[2]:
                src = "slurmdbd" if e[1] == "COMPLETED" else "slurmdbd_running"
                known.append((schema.GPUS_SOURCES[src], DBD_GPUS, src))
        elif e[0] == "map":
            mapped |= set(e[1])
    if not any_job:
        return None
    if known:
        rank = max(k[0] for k in known)
        return next((g, s) for r, g, s in known if r == rank)
    return (len(mapped), "job_map") if mapped else (None, None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS)
def test_the_stored_gpu_count_is_the_most_authoritative_seen_in_any_order(events, tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    w = StoreWriter(root, clock=lambda: NOW)
    try:
        for e in events:
            jobs, allocations = _event_rows(e)
            w.commit(Batch(key=f"e{next(_keys)}", jobs=jobs, allocations=allocations))
        row = w.db.execute("SELECT gpus, gpus_source FROM jobs WHERE job_key = '601'").fetchone()
        assert row == _expected(events)
    finally:
        w.close()


# --- the sources: said loudly, filled from slurmctld, through each route -------------------------

class Restd(Loopback):
    """slurmrestd of a cluster whose AccountingStorageTRES lacks gres/gpu: slurmdbd's job 601
    names no GPU, slurmctld's says gres/gpu:4 while it keeps the job."""

    def __init__(self, version: str, state: str, ctld: bool = True):
        super().__init__()
        self.routes["/openapi/v3"] = ok(openapi([version]))
        self.routes[f"/slurmdb/{version}/jobs"] = ok(doc(slurmdb_job(version, state, NO_GPU_TRES)))
        self.routes[f"/slurm/{version}/jobs"] = ok(doc(slurmctld_job(version, state, tres_per_job="gres/gpu:4")) if ctld else doc())
        self.routes[f"/slurmdb/{version}/tres"] = ok({"TRES": NO_GPU_TRES})


@pytest.mark.parametrize("version", SHAPES)
def test_slurmrestd_without_gpu_tres_is_said_and_filled_from_slurmctld(version, tmp_path):
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    with Restd(version, "RUNNING") as server:
        src = SlurmrestdSource(url=server.url, cluster="hpc", timeout=5, initial_lookback=timedelta(hours=2))
        c = Collector(w, [ScheduledSource(src, 60)], clock=lambda: NOW)
        assert c.run_source(src) is True
        assert src.tracks_gpus is False  # asked of /tres: no gres/gpu among them
    assert stored(tmp_path / "s") == (4, "slurmctld")
    with Restd(version, "COMPLETED") as server:  # ended: slurmctld keeps it a while ...
        src.url = server.url
        assert c.run_source(src) is True
    with Restd(version, "COMPLETED", ctld=False) as server:  # ... then forgets it
        src.url = server.url
        assert c.run_source(src) is True
    assert stored(tmp_path / "s") == (4, "slurmctld")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())["unrecognized"]
    said = [u["detail"] for u in manifest if u["kind"] == "accounting_without_gpus"]  # one per server (each on its port)
    assert said and all("add gres/gpu to AccountingStorageTRES in slurm.conf" in d and "never 0" in d for d in said)
    sample = c.metrics.registry.get_sample_value
    assert sample("gpufleet_collect_jobs_gpus_fallback", {"cluster": "hpc", "gpus_source": "slurmctld"}) == 0  # at start: running
    c.count_job_gpu_sources()  # as upkeep does
    assert sample("gpufleet_collect_jobs_gpus_fallback", {"cluster": "hpc", "gpus_source": "slurmctld"}) == 1
    assert sample("gpufleet_collect_jobs_gpus_fallback", {"cluster": "hpc", "gpus_source": "unknown"}) == 0
    w.close()


def test_sacct_routes_and_files_say_it_and_leave_the_count_unknown(tmp_path):
    out, calls = tmp_path / "out", tmp_path / "calls"
    exe = tmp_path / "sacct"
    exe.write_text(FAKE_SACCT.format(python=sys.executable, calls=str(calls), output=str(out)))
    exe.chmod(0o755)
    (tmp_path / "f.json").write_text(json.dumps(doc(slurmdb_job("v0.0.44", "COMPLETED", NO_GPU_TRES, job=603))))
    w = StoreWriter(tmp_path / "s", clock=lambda: NOW)
    text = SacctSource(cluster="hpc", command=(str(exe),), delimiter="|", fields=FIELDS)
    js = SacctSource(cluster="hpc", command=(str(exe),), format="json", name="sacct_json")
    files = SlurmJsonFilesSource(cluster="hpc", files=[str(tmp_path / "f.json")])
    c = Collector(w, [ScheduledSource(s, 60) for s in (text, js, files)], clock=lambda: NOW)
    out.write_text(sacct_text("COMPLETED", "cpu=8,mem=64G,node=1"))
    assert c.run_source(text) is True
    out.write_text(json.dumps(doc(slurmdb_job("v0.0.40", "COMPLETED", NO_GPU_TRES, job=602))))
    assert c.run_source(js) is True and c.run_source(files) is True
    con = open_reader(tmp_path / "s")
    assert con.execute("SELECT job_key, gpus, gpus_source FROM jobs ORDER BY job_key").fetchall() == [
        ("601", None, None), ("602", None, None), ("603", None, None)]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())["unrecognized"]
    assert sorted(u["source"] for u in manifest if u["kind"] == "accounting_without_gpus") == ["sacct", "sacct_json", "slurm_json"]
    c.count_job_gpu_sources()  # as upkeep does (the first job batch counted 1)
    assert c.metrics.registry.get_sample_value("gpufleet_collect_jobs_gpus_fallback", {"cluster": "hpc", "gpus_source": "unknown"}) == 3
    w.close()


# --- the figures: unknown is shown as unknown, and what is known still adds up --------------------

def test_unknown_gpu_counts_are_unknown_in_the_figures_and_the_ledger_adds_up(tmp_path, monkeypatch):
    import io

    from gpufleet.analytics.cli import build_report, print_table
    from gpufleet.analytics.core import Analysis, unknown_gpu_jobs
    from gpufleet.analytics.jobs import job_summaries
    from gpufleet.analytics.params import Params
    from tests.support.fleet import Fleet

    t0 = datetime(2026, 11, 16, 10)
    f = Fleet(tmp_path / "s", cluster="hpc")
    f.gpu_series("g01", "GPU-a", t0, t0 + timedelta(hours=2), util=50.0, procs=1)
    f.gpu_series("g02", "GPU-b", t0, t0 + timedelta(hours=2), util=0.0, procs=0)
    f.job("701", account="nlp", user="ann", start=t0, end=t0 + timedelta(hours=1), gpus=1, placements=[("g01", "GPU-a")])
    f.job("702", account="nlp", user="bo", start=t0, end=t0 + timedelta(hours=1), gpus=None, placements=[])  # nobody said
    f.job("703", account="vision", user="bo", start=t0, end=t0 + timedelta(hours=1), gpus=None, placements=[("g02", "GPU-b")])
    f.job("704", account="speech", user="cy", start=t0, end=t0 + timedelta(hours=1), gpus=None, placements=[])  # a team nobody said
    f.write()
    con = f.reader()
    assert con.execute("SELECT job_key, gpus, gpus_source FROM jobs ORDER BY 1").fetchall() == [
        ("701", 1, None), ("702", None, None), ("703", 1, "job_map"), ("704", None, None)]  # 703: the mapping saw it hold GPU-b
    p = Params(t0, t0 + timedelta(hours=2))
    a = Analysis(con, p, now=t0 + timedelta(hours=3))
    rows = {r["job_key"]: r for r in job_summaries(a).to_dicts()}
    assert (rows["702"]["gpus"], rows["702"]["allocated_gpu_h"]) == (None, None)  # unknown, never 0
    assert rows["701"]["allocated_gpu_h"] == pytest.approx(1.0) and rows["703"]["allocated_gpu_h"] == pytest.approx(1.0)
    totals = a.totals()
    by_account = a.utilization("account")
    assert totals.allocated_gpu_h == pytest.approx(2.0) == by_account["allocated_gpu_h"].sum()  # the known add up
    rows_by = {r["account"]: r for r in by_account.to_dicts()}
    assert (rows_by["nlp"]["allocated_gpu_h"], rows_by["nlp"]["gpus_unknown_jobs"]) == (pytest.approx(1.0), 1)  # the known part, and 1 unknown
    assert (rows_by["speech"]["allocated_gpu_h"], rows_by["speech"]["no_data_gpu_h"], rows_by["speech"]["gpus_unknown_jobs"]) == (None, None, 1)
    [warning] = unknown_gpu_jobs(a)
    assert "2 jobs of this window (702, 704) have an unknown GPU count" in warning and "AccountingStorageTRES" in warning
    report = build_report(con, p, "account", 5, "702", now=t0 + timedelta(hours=3))
    assert warning in report["warnings"] and report["job"]["allocated_gpu_h"] is None
    out = io.StringIO()
    print_table(report, out)
    assert "unknown GPU count" in out.getvalue() and "its allocated GPU-hours are unknown" in out.getvalue()

    # the Utilization page by account: the same rows, unknown where none is known, and says why
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from tests.test_dashboard_pages import frame, goto, open_app  # (its window: 2026-11-16 10:00-12:00)

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(tmp_path / "s"))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = goto(open_app(), "utilization")
    at.button_group(key="by").set_value("account").run()
    assert not at.exception, at.exception
    shown = frame(at, "util_by").set_index("account")
    import pandas as pd

    assert pd.isna(shown.loc["speech", "allocated_gpu_h"])  # shown "unknown" (the table's placeholder), not 0
    assert shown.loc["nlp", "allocated_gpu_h"] == pytest.approx(1.0) and shown.loc["nlp", "gpus_unknown_jobs"] == 1
    assert any("2 jobs of this window have an unknown GPU count" in c.value for c in at.caption), [c.value for c in at.caption]
    # the headline: the known part, said to be a lower bound (and why), never presented as complete
    from tests.test_dashboard_pages import metrics

    allocated = next(m for m in at.metric if m.label == "Allocated")
    assert allocated.value == "at least 2.0 GPU-h" and "2 jobs of this window have an unknown GPU count" in allocated.help
    assert metrics(goto(at, "waste"))["Share of allocated"] != "unknown"  # (of the known jobs' time: said in its help)
    # ... and the Teams page's fairness: speech's usage unknown, not 0 GPU-hours
    at = goto(at, "teams")
    teams = frame(at, "fair_accounts").set_index("account")
    assert pd.isna(teams.loc["speech", "used_gpu_h"]) and teams.loc["speech", "gpus_unknown_jobs"] == 1
    assert teams.loc["nlp", "used_gpu_h"] == pytest.approx(1.0)


# a team's row: the known jobs' allocated GPU-hours summed, unknown (never 0) when no job of it is known
ACCOUNTS, USERS = ("nlp", "vision", "speech"), ("ann", "bo")
WINDOW_T0 = datetime(2026, 11, 16, 10)
MIXED_JOBS = st.lists(st.tuples(st.sampled_from(ACCOUNTS), st.sampled_from(USERS), st.sampled_from([None, 1, 2]),
                                st.integers(0, 90), st.integers(10, 60), st.booleans()), min_size=1, max_size=6)


def _expected_rows(jobs: list[tuple], by: int) -> dict[str, tuple[float | None, int]]:
    """name -> (the known jobs' allocated GPU-hours, None if no job of the row is known; unknown jobs)."""
    out: dict[str, tuple[float | None, int]] = {}
    for j in jobs:
        known, unknown = out.get(j[by], (None, 0))
        if j[2] is None:
            out[j[by]] = (known, unknown + 1)
        else:
            out[j[by]] = ((known or 0.0) + j[2] * j[4] / 60, unknown)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(jobs=MIXED_JOBS)
def test_rows_of_unknown_gpu_counts_are_unknown_and_the_known_part_adds_up(jobs, tmp_path_factory):
    import io

    import polars as pl

    from gpufleet.analytics import vocabulary as words
    from gpufleet.analytics.cli import build_report, print_table
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.params import Filters, Params
    from tests.support.fleet import Fleet

    t0 = WINDOW_T0
    f = Fleet(tmp_path_factory.mktemp("store"), cluster="hpc")
    gpus = [("g01", "GPU-a"), ("g01", "GPU-b")]
    for i, (host, uuid) in enumerate(gpus):
        f.gpu_series(host, uuid, t0, t0 + timedelta(hours=3), util=50.0, procs=1, gpu=i)
    for i, (account, user, n, start, minutes, placed) in enumerate(jobs):
        s = t0 + timedelta(minutes=start)
        # a known count may have been mapped too; an unknown one was not (the mapping would have given it)
        f.job(f"{800 + i}", account=account, user=user, start=s, end=s + timedelta(minutes=minutes), gpus=n,
              placements=gpus[:n] if n is not None and placed else [])
    f.write()
    con = f.reader()
    p = Params(t0, t0 + timedelta(hours=3))
    now = t0 + timedelta(hours=4)
    a = Analysis(con, p, now=now)
    totals = a.totals()
    fleet_known, fleet_unknown = _expected_rows([(None, *j[1:]) for j in jobs], 0)[None]  # (all jobs as one row)
    # the fleet's allocated: the known jobs' sum, unknown (never 0) when none is known, the rest counted
    assert (totals.allocated_gpu_h is None) == (fleet_known is None) and totals.allocated_unknown_jobs == fleet_unknown
    for dim, by in (("account", 0), ("user_name", 1)):
        rows = {r[dim]: r for r in a.utilization(dim).to_dicts()}
        want = _expected_rows(jobs, by)
        assert set(rows) == set(want)
        for name, (known, unknown) in want.items():
            r = rows[name]
            assert r["gpus_unknown_jobs"] == unknown, (dim, name)
            if known is None:  # unknown, never 0
                assert r["allocated_gpu_h"] is None and r["no_data_gpu_h"] is None, (dim, name, r)
            else:
                assert r["allocated_gpu_h"] == pytest.approx(known), (dim, name)
                assert r["data_gpu_h"] <= r["allocated_gpu_h"] + 1e-9
                assert r["allocated_gpu_h"] == pytest.approx(r["data_gpu_h"] + r["no_data_gpu_h"]), (dim, name)
        # the known part of the teams (of the users) sums to the fleet's allocated figure, the unknown jobs to its count
        assert sum(k for k, _ in want.values() if k is not None) == pytest.approx(totals.allocated_gpu_h or 0.0)
        assert float(pl.Series([r["allocated_gpu_h"] for r in rows.values()], dtype=pl.Float64).sum()) == pytest.approx(totals.allocated_gpu_h or 0.0)
        assert sum(r["gpus_unknown_jobs"] for r in rows.values()) == totals.allocated_unknown_jobs
    # a filtered figure equals its row unfiltered: unknown where the row is, the known part and its unknown jobs
    for name, (known, unknown) in _expected_rows(jobs, 0).items():
        ft = Analysis(con, Params(t0, t0 + timedelta(hours=3), filters=Filters(account=name)), now=now).totals()
        assert ft.allocated_gpu_h == (None if known is None else pytest.approx(known)) and ft.allocated_unknown_jobs == unknown, name
    # over time: a team's buckets add up to its row, unknown (null, not 0) where only jobs of unknown count ran
    from gpufleet.analytics.timeline import utilization_timelines

    tl = utilization_timelines(a, ["account"])["account"]
    for name, (known, unknown) in _expected_rows(jobs, 0).items():
        mine = tl.filter(pl.col("account") == name)["allocated_gpu_h"]
        assert float(mine.sum()) == pytest.approx(known or 0.0), (name, mine)
        assert mine.null_count() > 0 if known is None else (mine.null_count() == 0 or unknown), (name, mine)
    # the facts' path (analytics/facts.py) says the same
    from gpufleet.analytics.facts import FactWindow

    fw = FactWindow(con, p, now=now)
    ftot = fw.totals()
    fw.close()
    assert (ftot["allocated_gpu_h"], ftot["allocated_unknown_jobs"]) == (
        None if totals.allocated_gpu_h is None else pytest.approx(totals.allocated_gpu_h), totals.allocated_unknown_jobs)
    # the headline comparison: "at least" a lower bound, "unknown" where nothing is known, no change of either (never 0)
    from gpufleet.analytics.trends import compare, people_rows

    row = next(r for r in compare(totals, totals).to_dicts() if r["figure"] == "allocated_gpu_h")
    shown = next(r for r in people_rows([row]))
    if fleet_unknown:
        assert row["change"] is None and row["change_missing"] == "unknown" and "unknown GPU count" in row["reason"], row
        # the figure written is the total's own (equal to the known sum to float precision: 2.65 may be 2.6499...)
        assert shown["this window"] == ("unknown" if fleet_known is None else "at least " + words.figure("allocated_gpu_h", totals.allocated_gpu_h))
    else:
        assert row["change"] == 0 and row["reason"] is None and not shown["this window"].startswith("at least")
    # fairness (the Teams page): an account's usage is its known part, unknown where nothing is known
    from gpufleet.analytics.fairness import fairness

    fair = {r["account"]: r for r in fairness(a, None).per_account.to_dicts()}
    for name, (known, unknown) in _expected_rows(jobs, 0).items():
        assert fair[name]["used_gpu_h"] == (None if known is None else pytest.approx(known)), name
        assert fair[name]["gpus_unknown_jobs"] == unknown, name
    # ... and an account whose demand is unknown (only jobs of unknown GPU count) is said, with no ratio
    assert fairness(a, None).unknown_demand == tuple(sorted(n for n, (k, _) in _expected_rows(jobs, 0).items() if k is None))
    assert all(fair[n]["ratio"] is None for n in fairness(a, None).unknown_demand)
    # analyze --by account: null in JSON, "unknown" in the table, the unknown jobs counted in a column
    report = build_report(con, p, "account", 5, None, now=now)
    by_json = {r["account"]: r for r in report["utilization"]["rows"]}
    for name, (known, unknown) in _expected_rows(jobs, 0).items():
        assert (by_json[name]["allocated_gpu_h"] is None) == (known is None) and by_json[name]["gpus_unknown_jobs"] == unknown
    out = io.StringIO()
    print_table(report, out)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if "jobs with GPU count unknown" in line)
    assert "allocated GPU-h" in header
    for name, (known, _) in _expected_rows(jobs, 0).items():
        row = next(line for line in lines[lines.index(header):] if line.split()[:1] == [name])
        cell = row[header.index("allocated GPU-h"):].split()[0]  # the column's cell, by the header's offset
        assert (cell == "unknown") == (known is None), (header, row)


def test_a_window_of_unknown_gpu_counts_is_unknown_on_the_pages_never_0(tmp_path, monkeypatch):
    """Every job of the window has an unknown GPU count: allocated GPU-hours are unknown on the
    Utilization and Waste pages and in `gpufleet analyze`, not 0 - and the window is not empty."""
    from gpufleet.analytics.cli import build_report
    from gpufleet.analytics.params import Params
    from tests.support.fleet import Fleet

    t0 = datetime(2026, 11, 16, 10)
    f = Fleet(tmp_path / "s", cluster="hpc")
    f.gpu_series("g01", "GPU-a", t0, t0 + timedelta(hours=2), util=50.0, procs=1)
    f.job("711", account="nlp", user="ann", start=t0, end=t0 + timedelta(hours=1), gpus=None, placements=[])
    f.write()
    report = build_report(f.reader(), Params(t0, t0 + timedelta(hours=2)), "account", 5, None, now=t0 + timedelta(hours=3))
    assert (report["totals"]["allocated_gpu_h"], report["totals"]["allocated_unknown_jobs"]) == (None, 1)
    trend = next(r for r in report["trend"] if r["figure"] == "allocated_gpu_h")
    assert trend["current"] is None and trend["change"] is None and "unknown GPU count" in trend["reason"]

    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from tests.test_dashboard_pages import goto, metrics, open_app  # (its window: 2026-11-16 10:00-12:00)

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(tmp_path / "s"))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = goto(open_app(), "utilization")
    assert not at.exception, at.exception
    assert metrics(at)["Allocated"] == "unknown"
    at = goto(at, "waste")
    assert not at.exception, at.exception
    assert metrics(at)["Share of allocated"] == "unknown"
