"""SlurmrestdSource against a loopback HTTP server speaking slurmrestd's job lists, per data_parser
version: slurmctld answers are the real files in shared/data/slurm/slurmrestd, slurmdbd answers
are our own rows in each version's shape (as in tests/test_slurm_parse.py). Also `sacct --json`
as a command and JSON files (SlurmJsonFilesSource), and every failure as a clear error that keeps
the windows read before it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm import WINDOW_STATES, SacctSource
from gpufleet.collector.sources.slurm_files import SlurmJsonFilesSource
from gpufleet.collector.sources.slurm_json import parse_slurmrestd_jobs
from gpufleet.collector.sources.slurmrestd import VERSIONS, SlurmrestdSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.http import Loopback
from tests.support.shared_data import SHARED_DATA

DATA = SHARED_DATA / "slurm" / "slurmrestd"
CTLD = {"v0.0.38": "telegraf_v0.0.38_jobs.json", "v0.0.40": "lcrownover_v0.0.40_slurm23.11.1_jobs.json"}
NOW = datetime(2026, 11, 20, 12, 0, 0)
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJncHVmbGVldCJ9.c2lnbmF0dXJl"


def _n(v, shape):
    """A number as `shape` writes it: plain (<= v0.0.39) or {set, infinite, number} (v0.0.40+)."""
    return v if shape < "v0.0.40" else {"set": True, "infinite": False, "number": v}


def slurmdb_doc(version: str) -> dict:
    """slurmdbd's /jobs answer in `version`'s shape: three jobs (GPU job, array task, failed)."""
    listy = version >= "v0.0.41"
    def state(s):
        return {"current": [s] if listy else s, "reason": "None"}
    return {"meta": {"plugin": {"type": f"openapi/dbv{version[1:]}" if version < "v0.0.39" else "openapi/slurmdbd",
                                "data_parser": f"data_parser/{version}"}},
            "errors": [], "warnings": [],
            "jobs": [
                {"job_id": 501, "name": "train", "user": "alice", "account": "nlp", "partition": "gpu", "qos": "normal",
                 "cluster": "hpc", "state": state("COMPLETED"),
                 "time": {"submission": 1763600000, "eligible": 1763600000, "start": 1763600060, "end": 1763603660, "elapsed": 3600},
                 "array": {"job_id": 0, "task_id": _n(4294967294, version) if version < "v0.0.40" else {"set": False, "number": 0}, "task": ""},
                 "het": {"job_id": 0, "job_offset": _n(4294967294, version) if version < "v0.0.40" else {"set": False, "number": 0}},
                 "tres": {"allocated": [{"type": "cpu", "name": "", "count": 8}, {"type": "gres", "name": "gpu", "count": 4},
                                        {"type": "gres", "name": "gpu:h100", "count": 4}]},
                 "exit_code": {"status": "SUCCESS", "return_code": _n(0, version)}, "nodes": "g[01-02]", "allocation_nodes": 2},
                {"job_id": 512, "name": "sweep", "user": "bob", "account": "vision", "partition": "gpu", "qos": "normal",
                 "cluster": "hpc", "state": state("RUNNING"),
                 "time": {"submission": 1763601000, "start": 1763601100, "end": 0, "elapsed": 500},
                 "array": {"job_id": 510, "task_id": _n(2, version), "task": ""},
                 "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]},
                 "exit_code": {"status": "SUCCESS", "return_code": _n(0, version)}, "nodes": "g03", "allocation_nodes": 1},
                {"job_id": 520, "name": "oops", "user": "carol", "account": "ops", "partition": "cpu",
                 "cluster": "hpc", "state": state("FAILED"),
                 "time": {"submission": 1763602000, "start": 1763602001, "end": 1763602002, "elapsed": 1},
                 "tres": {"allocated": [{"type": "cpu", "name": "", "count": 1}]},
                 "exit_code": {"status": "FAILED", "return_code": _n(2, version)}, "nodes": "c01", "allocation_nodes": 1},
            ]}


def ctld_doc(version: str) -> dict:
    if version in CTLD:
        return json.loads((DATA / CTLD[version]).read_text())
    doc = json.loads((DATA / CTLD["v0.0.40"]).read_text())  # later versions: the v0.0.40 shapes plus gres_detail
    doc["meta"]["plugin"]["data_parser"] = f"data_parser/{version}"
    doc["jobs"][0]["gres_detail"] = ["gpu:h100:2(IDX:0-1)"]
    return doc


def openapi(versions: list[str]) -> dict:
    paths = {}
    for v in versions:
        paths[f"/slurm/{v}/jobs/"] = {"get": {}}
        paths[f"/slurmdb/{v}/jobs/"] = {"get": {}}
        paths[f"/slurm/{v}/diag/"] = {"get": {}}
    return {"openapi": "3.0.2", "info": {"title": "Slurm REST API"}, "paths": paths}


def ok(doc) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(doc).encode()


class Restd(Loopback):
    """slurmrestd's job lists for `versions`, the newest advertised in /openapi/v3 (when `document`)."""

    def __init__(self, versions: list[str], document: bool = True):
        super().__init__()
        if document:
            self.routes["/openapi/v3"] = ok(openapi(versions))
        for v in versions:
            self.routes[f"/slurmdb/{v}/jobs"] = ok(slurmdb_doc(v))
            self.routes[f"/slurm/{v}/jobs"] = ok(ctld_doc(v))


@pytest.fixture
def token(tmp_path) -> Path:
    path = tmp_path / "slurm.jwt"
    path.write_text(f"SLURM_JWT={TOKEN}\n")  # what `scontrol token` prints
    return path


def source(server: Loopback, token: Path, **kw) -> SlurmrestdSource:
    kw.setdefault("timeout", 5)
    return SlurmrestdSource(url=server.url, cluster="hpc", token_file=str(token), user="gpufleet", **kw)


def expected(doc: dict, now: datetime) -> list[dict]:
    jobs, rejected, problems = parse_slurmrestd_jobs(copy.deepcopy(doc), "hpc", now)
    assert (rejected, problems) == (0, [])
    return jobs


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.41", "v0.0.44"])
def test_each_version_discovered_and_read_like_the_parser(version, token):
    older = [v for v in VERSIONS if v < version][-2:]
    with Restd(older + [version]) as server:
        src = source(server, token)
        batches = list(src.run(NOW, watermark=(NOW - timedelta(hours=2)).isoformat()))
        assert src.version() == version  # the newest with both job lists
        window, current = batches
        assert window.jobs == expected(slurmdb_doc(version), NOW)
        assert window.watermark == ("slurmrestd:hpc", NOW.isoformat()) and window.rejected == 0
        # slurmctld's ended jobs too: their GPUs are what accounting may lack (issue #51)
        assert current.jobs == expected(ctld_doc(version), NOW) and current.watermark is None
        assert {j["source"] for j in window.jobs + current.jobs} == {"slurmrestd"}
        gpu = {j["job_key"]: (j["job_id"], j["gpus"], j["gpu_type"], j["state"]) for j in window.jobs}
        assert gpu == {"501": ("501", 4, "h100", "COMPLETED"), "512": ("510_2", 1, None, "RUNNING"), "520": ("520", 0, None, "FAILED")}
        reads = [q for q in server.requests if q["path"].startswith(("/slurm/", "/slurmdb/"))]
        assert [q["path"] for q in reads] == [f"/slurmdb/{version}/jobs", f"/slurm/{version}/jobs"]
        for q in reads:  # the JWT and the user name on every request
            assert q["headers"]["X-SLURM-USER-TOKEN"] == TOKEN and q["headers"]["X-SLURM-USER-NAME"] == "gpufleet"
        start = int((NOW - timedelta(hours=3)).replace(tzinfo=timezone.utc).timestamp())  # watermark - 1 h overlap
        # every base state named (slurmdbd then selects by each state's times, not eligible time
        # alone); from v0.0.40 every record of a requeued job asked for by name, times uncut
        states = "&state=PENDING%2CRUNNING%2CSUSPENDED%2CCOMPLETED%2CCANCELLED%2CFAILED%2CTIMEOUT%2CNODE_FAIL%2CPREEMPTED%2CBOOT_FAIL%2CDEADLINE%2COUT_OF_MEMORY"
        duplicates = "&show_duplicates=true&disable_truncate_usage_time=true" if version >= "v0.0.40" else ""
        if version >= "v0.0.39":  # Unix times
            assert reads[0]["query"] == f"start_time={start}&end_time={int(NOW.replace(tzinfo=timezone.utc).timestamp())}{states}{duplicates}"
        else:  # v0.0.37/38 parse only local times (slurmrestd's zone, `timezone`, UTC by default)
            assert reads[0]["query"] == f"start_time=2026-11-20T09%3A00%3A00&end_time=2026-11-20T12%3A00%3A00{states}{duplicates}"


def test_without_an_openapi_document_versions_are_tried_newest_first(token):
    with Restd(["v0.0.39", "v0.0.40"], document=False) as server:
        src = source(server, token, current_jobs=False)
        [batch] = list(src.run(NOW, watermark=(NOW - timedelta(hours=2)).isoformat()))
        assert src.version() == "v0.0.40" and batch.jobs == expected(slurmdb_doc("v0.0.40"), NOW)
        tried = [q["path"] for q in server.requests if q["path"].startswith("/slurmdb/")]
        assert tried[:5] == ["/slurmdb/v0.0.44/jobs", "/slurmdb/v0.0.43/jobs", "/slurmdb/v0.0.42/jobs", "/slurmdb/v0.0.41/jobs",
                             "/slurmdb/v0.0.40/jobs"]


def test_an_unsupported_version_set_is_named(token):
    with Loopback() as server:
        server.routes["/openapi/v3"] = ok(openapi(["v0.0.36"]))
        with pytest.raises(SourceError, match=r"no job lists of a supported data_parser version.*v0\.0\.36") as e:
            source(server, token).version()
        assert e.value.unrecognized[0].kind == "unsupported_version"


def test_token_from_the_environment_and_its_absence(token, monkeypatch):
    with Restd(["v0.0.40"]) as server:
        monkeypatch.setenv("GPUFLEET_TEST_JWT", TOKEN)
        src = SlurmrestdSource(url=server.url, cluster="hpc", token_env="GPUFLEET_TEST_JWT", current_jobs=False)
        list(src.run(NOW))
        assert server.requests[-1]["headers"]["X-SLURM-USER-TOKEN"] == TOKEN
        monkeypatch.delenv("GPUFLEET_TEST_JWT")
        with pytest.raises(SourceError, match="GPUFLEET_TEST_JWT.*not set"):
            list(src.run(NOW))
        token.write_text("")
        with pytest.raises(SourceError, match="is empty"):
            list(source(server, token).run(NOW))


def slow(req):
    time.sleep(2)
    return ok(slurmdb_doc("v0.0.40"))


@pytest.mark.parametrize("answer, message", [
    ((401, "application/json", b'{"errors":[{"error":"Authentication failure"}]}'), r"HTTP 401 .*authentication refused.*token_file"),
    ((403, "text/plain", b"Protocol authentication error"), r"HTTP 403 .*authentication refused"),
    ((500, "application/json", b'{"errors":[{"error":"Unable to connect to database"}]}'), r"HTTP 500 .*Unable to connect to database"),
    ((200, "application/json", b'{"jobs": [{"job_id": 1, "job_state"'), r"not JSON"),
    ((200, "application/json", b'{"meta": {}, "errors": []}'), r"no 'jobs' list"),
    ((200, "application/json", b'{"jobs": [], "errors": [{"error": "Nothing found", "description": "slurmdbd down"}]}'),
     r"Slurm answered with errors: slurmdbd down"),
    (slow, r"no answer in 0.5 s \(timeout\)"),
])
def test_failures_are_clear_and_earlier_windows_are_kept(answer, message, token, tmp_path):
    """Two one-day windows: the first is answered, the second fails; the first's jobs are stored."""
    with Restd(["v0.0.40"]) as server:
        calls = []

        def second_fails(req):
            calls.append(req)
            if len(calls) == 1:
                return ok(slurmdb_doc("v0.0.40"))
            return answer(req) if callable(answer) else answer

        server.routes["/slurmdb/v0.0.40/jobs"] = second_fails
        src = source(server, token, timeout=0.5, max_window=timedelta(days=1), initial_lookback=timedelta(days=2))
        c = Collector(StoreWriter(tmp_path), [ScheduledSource(src, 60)], clock=lambda: NOW)
        with pytest.raises(SourceError, match=message):
            c.commit(src.name, src.run(NOW, watermark=None))
        # the watermark stopped at the first window's end: the next run reads the failed one again
        assert c.writer.watermark("slurmrestd:hpc") == (NOW - timedelta(days=1)).isoformat()
        c.writer.close()
        assert len(calls) == 2
        stored = open_reader(tmp_path).execute("SELECT job_key FROM jobs ORDER BY job_key").fetchall()
        assert stored == [("501",), ("512",), ("520",)]  # the first window's rows


def test_through_the_cli_and_the_config(token, tmp_path):
    with Restd(["v0.0.38", "v0.0.40"]) as server:
        cfg = tmp_path / "g.toml"
        cfg.write_text(f'[collector]\nstore = "{tmp_path / "s"}"\ncluster = "hpc"\nlisten = ""\n'
                       f'[collector.slurmrestd]\nurl = "{server.url}"\ntoken_file = "{token}"\nuser = "gpufleet"\n')
        r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg), "--once"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        con = open_reader(tmp_path / "s")
        keys = {k for (k,) in con.execute("SELECT job_key FROM jobs").fetchall()}
        assert keys == {"501", "512", "520", "7745162", "7725337"}  # slurmdbd's window + slurmctld's running/pending
        cfg.write_text(cfg.read_text() + 'token_env = "X"\n')
        r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg), "--once"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "token_file or token_env, not both" in r.stderr


# --- sacct --json, as a command and as files ---

FAKE_SACCT = """#!{python}
import json, sys
with open({calls!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.stdout.write(open({output!r}).read())
"""


def test_sacct_json_command(tmp_path):
    out, calls = tmp_path / "out.json", tmp_path / "calls"
    out.write_text(json.dumps(slurmdb_doc("v0.0.40")))
    exe = tmp_path / "sacct"
    exe.write_text(FAKE_SACCT.format(python=sys.executable, calls=str(calls), output=str(out)))
    exe.chmod(0o755)
    src = SacctSource.from_options("hpc", {"command": str(exe), "format": "json"})
    [batch] = list(src.run(NOW, watermark=(NOW - timedelta(hours=2)).isoformat()))
    want = expected(slurmdb_doc("v0.0.40"), NOW)
    for j in want:
        j["source"] = "sacct"
    assert batch.jobs == want and batch.watermark == ("sacct:hpc", NOW.isoformat())
    [argv] = [json.loads(x) for x in calls.read_text().splitlines()]
    assert "--json" in argv and not any(a.startswith(("--format", "--delimiter", "--parsable")) for a in argv)
    assert argv[-3:] == ["--starttime=2026-11-20T09:00:00", "--endtime=2026-11-20T12:00:00", "--state=" + ",".join(WINDOW_STATES)]
    out.write_text("sacct: error: Unknown option: json\n")  # a Slurm older than 21.08
    with pytest.raises(SourceError, match="not JSON") as e:
        list(src.run(NOW, watermark=(NOW - timedelta(hours=2)).isoformat()))
    assert e.value.unrecognized[0].kind == "not_json"


def test_json_files_good_ones_kept_bad_ones_reported(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(slurmdb_doc("v0.0.38")))
    (tmp_path / "b.json").write_bytes(b"\xef\xbb\xbf" + (DATA / CTLD["v0.0.40"]).read_bytes())  # with a BOM
    (tmp_path / "c.json").write_text("<html>502 Bad Gateway</html>")
    src = SlurmJsonFilesSource(cluster="hpc", files=[str(tmp_path / "*.json")])
    c = Collector(StoreWriter(tmp_path / "s"), [ScheduledSource(src, 60)], clock=lambda: NOW)
    assert c.run_source(src) is False  # c.json failed the run, loudly
    assert c.metrics.registry.get_sample_value("gpufleet_collect_input_unrecognized_total",
                                               {"source": "slurm_json", "input": str(tmp_path / "c.json"), "kind": "not_json"}) == 1
    c.writer.close()
    keys = {k for (k,) in open_reader(tmp_path / "s").execute("SELECT job_key FROM jobs").fetchall()}
    assert keys == {"501", "512", "520", "7745162", "7725337"}  # a.json and b.json, every job (ended ones too)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())["unrecognized"]
    assert [(u["input"], u["kind"]) for u in manifest] == [(str(tmp_path / "c.json"), "not_json")]


def test_slurmdbds_nothing_found_with_query_is_an_empty_window_not_a_failure():
    """Slurm 22.05's slurmrestd answers a window without jobs with this error (seen on the real
    cluster of tests/realstack/slurm.py): no jobs, read successfully."""
    from gpufleet.collector.sources.slurm_json import jobs_batch

    answer = json.dumps({"jobs": [], "errors": [{"error": "Nothing found with query", "description": "Nothing found",
                                                 "source": "slurmdb_jobs_get", "error_number": 0}]})
    batch = jobs_batch(answer, key="k", input="http://slurmrestd/slurmdb/v0.0.38/jobs", cluster="c", now=datetime(2026, 11, 20))
    assert batch.jobs == [] and batch.problems == []
