"""SacctSource against a fake `sacct` (a script that prints a fixture and records its argv and
environment): window, overlap and watermark arithmetic, the command it builds, and how a missing,
failing or hanging sacct is reported."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta

import pytest

from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm import DEFAULT_FIELDS, UNIT_SEPARATOR, WINDOW_STATES, SacctSource
from tests.support.shared_data import SHARED_DATA

DATA = SHARED_DATA / "slurm"
NOW = datetime(2026, 11, 20, 12, 0, 0, 123456)
US = UNIT_SEPARATOR

FAKE = """\
#!{python}
import json, os, sys, time, subprocess
with open({calls!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in
                ("TZ", "SLURM_TIME_FORMAT", "SLURM_CONF")}}}}) + "\\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "fail":
    sys.stderr.write("sacct: error: line 1\\nsacct: error: Problem talking to the database: Connection refused\\n")
    sys.exit(1)
if mode == "hang":
    subprocess.run(["sleep", "30"])  # a child in our process group, holding stdout open
if mode == "signal":
    os.kill(os.getpid(), 9)
sys.stdout.buffer.write(open({output!r}, "rb").read())
"""


def line(**values: str) -> str:
    """One sacct line in DEFAULT_FIELDS order, U+001F separated."""
    return US.join(values.get(f, "") for f in DEFAULT_FIELDS)


SAMPLE = "\n".join([
    line(JobIDRaw="101", JobID="101", Cluster="gpufleet", User="alice", Account="physics", Partition="main",
         QOS="normal", Submit="2026-11-20T06:00:00", Eligible="2026-11-20T06:00:00", Start="2026-11-20T06:00:01",
         End="2026-11-20T07:00:01", State="COMPLETED", ExitCode="0:0", NNodes="1", NodeList="n1",
         AllocTRES="billing=1,cpu=1,gres/gpu=2,mem=1G,node=1", ReqTRES="cpu=1,gres/gpu=2", JobName="train | eval"),
    line(JobIDRaw="102", JobID="102_[3-5]", User="bob", Account="biology", Submit="2026-11-20T08:00:00",
         Start="Unknown", End="Unknown", State="PENDING", ExitCode="0:0", NNodes="1", NodeList="None assigned",
         ReqTRES="cpu=1,gres/gpu=1", JobName="sweep"),
    line(JobIDRaw="102", JobID="102_5", User="bob", Account="biology", Submit="2026-11-20T08:00:00",
         Start="2026-11-20T09:00:00", End="Unknown", State="RUNNING", ExitCode="0:0", NNodes="1", NodeList="n1",
         AllocTRES="cpu=1,gres/gpu=1", JobName="sweep"),
    "garbled\x00line",
    "",
])


@pytest.fixture
def fake(tmp_path):
    """-> (command, calls()) for a fake sacct printing `output` (default SAMPLE)."""
    calls_file = tmp_path / "calls.jsonl"
    out_file = tmp_path / "out.txt"
    out_file.write_text(SAMPLE)
    script = tmp_path / "sacct"
    script.write_text(FAKE.format(python=sys.executable, calls=str(calls_file), output=str(out_file)))
    script.chmod(0o755)

    class Fake:
        command = (str(script),)
        output = out_file

        @staticmethod
        def calls() -> list[dict]:
            return [json.loads(x) for x in calls_file.read_text().splitlines()] if calls_file.exists() else []

        @staticmethod
        def windows() -> list[tuple[str, str]]:
            out = []
            for c in Fake.calls():
                opts = dict(a.split("=", 1) for a in c["argv"] if a.startswith("--") and "=" in a)
                out.append((opts["--starttime"], opts["--endtime"]))
            return out

    return Fake


def test_first_run_reads_the_initial_lookback_in_chunks(fake):
    src = SacctSource(cluster="gpufleet", command=fake.command, initial_lookback=timedelta(days=3))
    batches = list(src.run(NOW))
    assert fake.windows() == [
        ("2026-11-17T12:00:00", "2026-11-18T12:00:00"),
        ("2026-11-18T12:00:00", "2026-11-19T12:00:00"),
        ("2026-11-19T12:00:00", "2026-11-20T12:00:00"),
    ]
    assert [b.key for b in batches] == [
        "sacct:gpufleet:2026-11-17T12:00:00:2026-11-18T12:00:00",
        "sacct:gpufleet:2026-11-18T12:00:00:2026-11-19T12:00:00",
        "sacct:gpufleet:2026-11-19T12:00:00:2026-11-20T12:00:00",
    ]
    assert [b.watermark for b in batches] == [
        ("sacct:gpufleet", "2026-11-18T12:00:00"),
        ("sacct:gpufleet", "2026-11-19T12:00:00"),
        ("sacct:gpufleet", "2026-11-20T12:00:00"),
    ]


def test_command_environment_and_parsed_batch(fake, tmp_path):
    src = SacctSource(
        cluster="gpufleet", command=fake.command, extra_args=("--partition=main",),
        env={"SLURM_CONF": "/x/slurm.conf", "FAKE_MODE": "ok"}, watermark_of=lambda name: "2026-11-20T11:00:00",
    )
    (batch,) = list(src.run(NOW))
    (call,) = fake.calls()
    assert call["argv"] == [
        "--allusers", "--allocations", "--duplicates", "--parsable2", "--noheader", f"--delimiter={US}",
        "--format=" + ",".join(DEFAULT_FIELDS), "--starttime=2026-11-20T10:00:00", "--endtime=2026-11-20T12:00:00",
        "--state=" + ",".join(WINDOW_STATES), "--partition=main",
    ]
    assert call["env"] == {"TZ": "UTC", "SLURM_TIME_FORMAT": "standard", "SLURM_CONF": "/x/slurm.conf"}

    assert batch.rejected == 1 and batch.problems[0].startswith("line 4: 1 fields, expected 18")
    # 102_[3-5] and 102_5 share JobIDRaw 102 (the array's last task inherits the meta record): last wins
    assert [(j["job_key"], j["job_id"], j["state"], j["gpus"], j["name"]) for j in batch.jobs] == [
        ("101", "101", "COMPLETED", 2, "train | eval"),
        ("102", "102_5", "RUNNING", 1, "sweep"),
    ]
    j = batch.jobs[0]
    assert (j["cluster"], j["user_name"], j["account"], j["start"], j["end"], j["updated_at"]) == (
        "gpufleet", "alice", "physics", datetime(2026, 11, 20, 6, 0, 1), datetime(2026, 11, 20, 7, 0, 1), NOW)


def test_watermark_overlap_and_in_memory_progress(fake):
    src = SacctSource(command=fake.command, overlap=timedelta(minutes=30))
    list(src.run(NOW))
    later = NOW + timedelta(minutes=5)
    (batch,) = list(src.run(later))
    assert fake.windows()[-1] == ("2026-11-20T11:30:00", "2026-11-20T12:05:00")
    assert batch.key == "sacct:default:2026-11-20T11:30:00:2026-11-20T12:05:00"
    assert batch.watermark == ("sacct:default", "2026-11-20T12:05:00")


def test_watermark_not_advanced_when_the_consumer_did_not_take_the_batch(fake):
    src = SacctSource(command=fake.command, initial_lookback=timedelta(hours=2), max_window=timedelta(hours=1))
    gen = src.run(NOW)
    first = next(gen)  # the consumer got it but failed to commit and never came back
    gen.close()
    assert first.watermark == ("sacct:default", "2026-11-20T11:00:00")
    list(src.run(NOW))
    assert fake.windows()[-2:] == [("2026-11-20T10:00:00", "2026-11-20T11:00:00"), ("2026-11-20T11:00:00", "2026-11-20T12:00:00")]
    list(src.run(NOW + timedelta(hours=1)))
    assert fake.windows()[-2:] == [("2026-11-20T11:00:00", "2026-11-20T12:00:00"), ("2026-11-20T12:00:00", "2026-11-20T13:00:00")]


def test_store_watermark_wins_and_same_window_same_key(fake):
    stored = {"sacct:c": "2026-11-20T11:45:10"}
    src = SacctSource(cluster="c", command=fake.command, watermark_of=stored.get)
    a = list(src.run(NOW))
    b = list(src.run(NOW))
    assert [x.key for x in a] == [x.key for x in b] == ["sacct:c:2026-11-20T10:45:10:2026-11-20T12:00:00"]
    assert a[0].jobs == b[0].jobs


def test_bad_or_future_watermark(fake):
    src = SacctSource(command=fake.command, watermark_of=lambda n: "last tuesday", initial_lookback=timedelta(hours=6))
    (batch,) = list(src.run(NOW))
    assert fake.windows()[-1] == ("2026-11-20T06:00:00", "2026-11-20T12:00:00")
    assert batch.problems[0] == "watermark sacct:default='last tuesday' is not an ISO time: reading the last 6:00:00"
    src = SacctSource(command=fake.command, watermark_of=lambda n: "2026-11-21T00:00:00")  # clock stepped back
    list(src.run(NOW))
    assert fake.windows()[-1] == ("2026-11-20T11:00:00", "2026-11-20T12:00:00")


def test_cluster_time_zone_both_ways(fake):
    fake.output.write_text(line(JobIDRaw="7", JobID="7", Start="2026-11-20T06:00:00", End="2026-11-20T06:30:00",
                                State="COMPLETED", JobName="x") + "\n")
    src = SacctSource(command=fake.command, tz="America/New_York", watermark_of=lambda n: "2026-11-20T11:00:00")
    (batch,) = list(src.run(NOW))
    assert fake.windows() == [("2026-11-20T05:00:00", "2026-11-20T07:00:00")]  # EST = UTC-5
    assert fake.calls()[0]["env"]["TZ"] == "America/New_York"
    assert (batch.jobs[0]["start"], batch.jobs[0]["end"]) == (datetime(2026, 11, 20, 11, 0), datetime(2026, 11, 20, 11, 30))


def test_other_fields_and_delimiter_read_the_xdmod_log(fake):
    fake.output.write_bytes((DATA / "sacct" / "xdmod_unit_accounting-logs.psv").read_bytes())
    fields = (DATA / "sacct" / "xdmod_FORMAT_header.txt").read_text().strip().split("|")
    src = SacctSource(command=fake.command, fields=fields, delimiter="|", initial_lookback=timedelta(hours=1))
    (batch,) = list(src.run(NOW))
    assert [(j["job_id"], j["state"], j["gpus"]) for j in batch.jobs] == [
        ("4103947", "TIMEOUT", 0), ("4107166", "CANCELLED", 0), ("4107219", "COMPLETED", 0), ("5692623", "COMPLETED", 2)]
    assert "--delimiter=|" in fake.calls()[0]["argv"]


def test_missing_binary(tmp_path):
    src = SacctSource(command=(str(tmp_path / "no-such-sacct"),))
    with pytest.raises(SourceError, match=r"no-such-sacct' not found: install the Slurm client"):
        list(src.run(NOW))


def test_not_executable(tmp_path):
    path = tmp_path / "sacct"
    path.write_text("#!/bin/sh\n")
    with pytest.raises(SourceError, match="cannot run .*Permission denied"):
        list(SacctSource(command=(str(path),)).run(NOW))


def test_exit_status_and_stderr_tail(fake):
    src = SacctSource(command=fake.command, env={"FAKE_MODE": "fail"}, watermark_of=lambda n: "2026-11-20T11:00:00")
    with pytest.raises(SourceError) as e:
        list(src.run(NOW))
    msg = str(e.value)
    assert "exited with status 1" in msg
    assert "window 2026-11-20T10:00:00 .. 2026-11-20T12:00:00 UTC" in msg
    assert msg.endswith("sacct: error: line 1 | sacct: error: Problem talking to the database: Connection refused")


def test_killed_by_signal(fake):
    src = SacctSource(command=fake.command, env={"FAKE_MODE": "signal"})
    with pytest.raises(SourceError, match="was killed by signal 9"):
        list(src.run(NOW))


def test_hang_times_out_and_kills_the_process_group(fake):
    src = SacctSource(command=fake.command, env={"FAKE_MODE": "hang"}, timeout=1.5, watermark_of=lambda n: "2026-11-20T11:00:00")
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"did not finish in 1.5s; killed it"):
        list(src.run(NOW))
    assert time.monotonic() - t0 < 8  # the sleeping grandchild did not keep us waiting for its pipe


def test_batches_commit_to_the_store_and_rereading_changes_nothing(fake, tmp_path):
    from gpufleet.collector.store import StoreWriter, open_reader

    store = StoreWriter(tmp_path / "store", clock=lambda: NOW)
    src = SacctSource(cluster="gpufleet", command=fake.command, watermark_of=store.watermark, initial_lookback=timedelta(hours=2))
    for batch in src.run(NOW):
        store.commit(batch)
    store.publish()
    first = open_reader(tmp_path / "store").execute("SELECT * FROM jobs ORDER BY job_key").fetchall()
    assert store.watermark("sacct:gpufleet") == "2026-11-20T12:00:00"
    for batch in src.run(NOW + timedelta(minutes=5)):
        store.commit(batch)
    store.publish()
    assert open_reader(tmp_path / "store").execute("SELECT * FROM jobs ORDER BY job_key").fetchall() == first
    assert [r[2] for r in first] == ["101", "102"]
    assert fake.windows()[-1] == ("2026-11-20T11:00:00", "2026-11-20T12:05:00")
    store.close()


def test_watermark_given_by_the_caller(fake):
    src = SacctSource(command=fake.command, watermark_of=lambda n: "2026-11-20T00:00:00", initial_lookback=timedelta(hours=3))
    list(src.run(NOW, watermark="2026-11-20T11:50:00"))  # the caller's value wins over watermark_of
    list(src.run(NOW, watermark=None))  # the caller says: nothing committed yet
    assert fake.windows() == [("2026-11-20T10:50:00", "2026-11-20T12:00:00"), ("2026-11-20T09:00:00", "2026-11-20T12:00:00")]


def test_backfill_windows_and_read_window_leave_the_watermark_alone(fake):
    src = SacctSource(cluster="c", command=fake.command, max_window=timedelta(hours=12))
    windows = src.backfill_windows(datetime(2026, 11, 1, 0, 0, 0, 500), datetime(2026, 11, 2, 6, 0))
    assert windows == [
        (datetime(2026, 11, 1, 0, 0), datetime(2026, 11, 1, 12, 0)),
        (datetime(2026, 11, 1, 12, 0), datetime(2026, 11, 2, 0, 0)),
        (datetime(2026, 11, 2, 0, 0), datetime(2026, 11, 2, 6, 0)),
    ]
    batch = src.read_window(*windows[0], now=NOW)
    assert batch.key == "sacct:c:2026-11-01T00:00:00:2026-11-01T12:00:00"
    assert batch.watermark is None and [j["job_key"] for j in batch.jobs] == ["101", "102"]
    assert fake.windows() == [("2026-11-01T00:00:00", "2026-11-01T12:00:00")]


def test_from_options():
    opts = {"enabled": True, "interval": 300.0, "command": "ssh login1 '/opt/slurm/bin/sacct'", "overlap_seconds": 600,
            "initial_lookback_seconds": 86400, "timezone": "Europe/Berlin", "timeout": 30.0, "slurm_conf": "/etc/slurm/x.conf"}
    src = SacctSource.from_options("gpu-a", opts)
    assert (src.cluster, src.command, src.env, src.tz, src.timeout) == (
        "gpu-a", ("ssh", "login1", "/opt/slurm/bin/sacct"), {"SLURM_CONF": "/etc/slurm/x.conf"}, "Europe/Berlin", 30.0)
    assert (src.overlap, src.initial_lookback, src.watermark_name, src.name) == (
        timedelta(minutes=10), timedelta(days=1), "sacct:gpu-a", "sacct")
    src = SacctSource.from_options("c", {"command": "sacct", "slurm_conf": "", "timezone": "UTC"})
    assert (src.command, src.env, src.tz) == (("sacct",), {}, "UTC")


def test_through_the_collector_service_and_backfill(fake, tmp_path):
    import io

    from gpufleet.collector.backfill import backfill
    from gpufleet.collector.service import Collector, ScheduledSource
    from gpufleet.collector.store import StoreWriter, open_reader

    store = StoreWriter(tmp_path / "store", clock=lambda: NOW)
    src = SacctSource(cluster="gpufleet", command=fake.command, initial_lookback=timedelta(hours=2))
    collector = Collector(store, [ScheduledSource(src, 300)], clock=lambda: NOW)
    assert collector.run_once()
    assert store.watermark("sacct:gpufleet") == "2026-11-20T12:00:00"
    assert backfill(collector, datetime(2026, 11, 1), datetime(2026, 11, 3), out=io.StringIO())
    assert store.watermark("sacct:gpufleet") == "2026-11-20T12:00:00"  # the backfill did not move it back
    assert fake.windows() == [
        ("2026-11-20T10:00:00", "2026-11-20T12:00:00"),
        ("2026-11-01T00:00:00", "2026-11-02T00:00:00"), ("2026-11-02T00:00:00", "2026-11-03T00:00:00"),
    ]
    con = open_reader(tmp_path / "store")
    assert con.execute("SELECT job_key, job_id, state, gpus FROM jobs ORDER BY job_key").fetchall() == [
        ("101", "101", "COMPLETED", 2), ("102", "102_5", "RUNNING", 1)]
    store.close()
