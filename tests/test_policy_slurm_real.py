"""The idle-GPU policy against a real Slurm (tests/realstack/slurm.py): jobs submitted with sbatch
and read back by the real SacctSource; their GPUs' telemetry comes from the simulated exporter
(idle or busy per GPU, its job map naming each job), scraped by the collector; `gpufleet policy` then notifies through a real SMTP server
(aiosmtpd) and cancels with the real scancel, and sacct must show the job CANCELLED. The exempt
and the busy job are left alone; a dry run changes nothing."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import aiosmtpd.controller as aiosmtpd_controller
import pytest

from gpufleet.cli import main
from gpufleet.collector.schema import Batch
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.scrape import ScrapeSource
from gpufleet.collector.sources.slurm import SacctSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.exporter import start_exporter, stop
from tests.support.policy_config import policy_toml
from tests.test_report_email import Inbox, free_port

pytestmark = pytest.mark.realstack
CLUSTER = "gpufleet"


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def ingest(c, store, tmp_path, jobs: dict[int, tuple[float, float]]) -> dict[str, dict]:
    """The collector's own path: sacct's rows for the jobs (the real SacctSource), then a few
    scrape rounds of a simulated exporter (`gpufleet exporter --backend sim`) whose GPUs are the
    jobs' GRES indices, at each job's (utilization, processes), with the exporter's job map
    naming the job on each of its GPUs."""
    src = SacctSource(cluster=CLUSTER, env=c.env, initial_lookback=timedelta(hours=1))
    deadline = time.monotonic() + 30
    while True:  # slurmdbd learns of the start a moment after squeue says RUNNING
        rows = {j["job_key"]: j for b in src.run(utcnow()) for j in b.jobs}
        if all(rows.get(str(k), {}).get("state") == "RUNNING" for k in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        src = SacctSource(cluster=CLUSTER, env=c.env, initial_lookback=timedelta(hours=1))
    mine = [rows[str(k)] for k in jobs]
    assert all(r["state"] == "RUNNING" for r in mine), mine
    on_gpu = {idx: (job, util, procs) for job, (util, procs) in jobs.items() for idx in c.gres_idx(job)}
    scenario = f'hostname = "{c.host}"\nmodel = "h100"\ngpus = {max(on_gpu) + 1}\n' + "".join(
        f"[[gpu]]\nindex = {idx}\nutilization = {util}\nmemory_used_mib = 1000\n"
        + (f"processes = [ {{ pid = {4000 + idx}, used_memory_mib = 900, sm_util = {util} }} ]\n" if procs else "")
        for idx, (_, util, procs) in sorted(on_gpu.items()))
    (tmp_path / "exporter").mkdir()
    exporter, port = start_exporter(tmp_path / "exporter", scenario, {idx: str(job) for idx, (job, _, _) in on_gpu.items()})
    try:
        scrape = ScrapeSource(cluster=CLUSTER, static_targets=[f"127.0.0.1:{port}"], timeout=5)
        collector = Collector(StoreWriter(store), [ScheduledSource(scrape, 1)])
        try:
            collector.commit("sacct", [Batch(key=f"policy-sacct-{utcnow().isoformat()}", jobs=mine)])
            for _ in range(4):
                assert collector.run_source(scrape), scrape.status
                time.sleep(1)
        finally:
            collector.writer.close()
    finally:
        stop(exporter)
    return {r["job_key"]: r for r in mine}


def write_config(path, store, smtp_port, *, notify, escalate, cancel, enforce=True):
    path.write_text(f'[analytics]\nstore = "{store}"\n' + policy_toml(
        smtp_port, enforce=enforce, notify_after=notify, escalate_after=escalate, cancel_after=cancel,
        no_process_after="1h", min_job_age="0s", exempt_accounts=["biology"], email_domain="example.org", retries=1))
    return path


def audit(store):
    con = open_reader(store)
    try:
        return con.sql("SELECT job_key, action, rule, result, detail, idle_s FROM policy_audit ORDER BY ts").fetchall()
    finally:
        con.close()


def test_idle_job_notified_then_cancelled_exempt_and_busy_left_alone(slurm_cluster, tmp_path, monkeypatch, capsys):
    c = slurm_cluster
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)  # scancel (run by the policy) talks to this cluster
    inbox = Inbox()
    port = free_port()
    smtp = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port)
    smtp.start()
    idle = c.sbatch("sleep 300\n", account="physics", gpus=2, extra_args=["--job-name=idle <x>\r\nBcc: a@b"])
    busy = c.sbatch("sleep 300\n", account="physics", gpus=1)
    exempt = c.sbatch("sleep 300\n", account="biology", gpus=1)
    opted = c.sbatch("sleep 300\n", account="physics", gpus=1, extra_args=["--comment=gpufleet:exempt=long eval, idle on purpose"])
    store = tmp_path / "store"
    cfg = tmp_path / "gpufleet.toml"
    try:
        for j in (idle, busy, exempt, opted):
            c.wait_running(j)
        ingest(c, store, tmp_path, {idle: (0.0, 0.0), busy: (90.0, 1.0), exempt: (0.0, 0.0), opted: (0.0, 0.0)})
        time.sleep(2.5)

        # round 1: notify_after passed, cancel_after not: the owner is mailed, nothing cancelled
        write_config(cfg, store, port, notify="1s", escalate="1h", cancel="1h")
        assert main(["policy", "--config", str(cfg), "--format", "json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert [(a["job_key"], a["action"], a["rule"]) for a in plan["actions"]] == [(str(idle), "notify", "notify_after")]
        assert sorted((e["job_key"], e["rule"], e["reason"]) for e in plan["exempt"]) == sorted([
            (str(exempt), "exempt_accounts", "account biology is exempt"),
            (str(opted), "opt_out", "opted out in its job comment: long eval, idle on purpose")])
        (msg,) = inbox.wait(1, 10)
        assert msg["to"] == ["root@example.org"]
        body = msg["msg"].get_body(("plain",)).get_content()
        # sacct gives the whole name, line break included: the mail shows it escaped (no header
        # injection, no forged line), the HTML part escapes the markup too
        assert f"Job {idle} (idle <x>\\r\\nBcc: a@b)" in body and "&lt;x&gt;" in msg["msg"].get_body(("html",)).get_content() and "GPUs held:      2" in body and "GPUs idle:      2" in body
        assert "Bcc" not in msg["msg"].keys() and "\n" not in msg["msg"]["Subject"]
        assert c.job_state(idle) == "RUNNING"

        # the same round again: inside renotify_after, no second mail
        assert main(["policy", "--config", str(cfg), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["actions"] == []
        time.sleep(1)
        assert len(inbox.received) == 1

        # a dry run with cancel_after passed: plans the cancel, changes nothing
        write_config(cfg, store, port, notify="1s", escalate="2s", cancel="2s")
        before = audit(store)
        assert main(["policy", "--config", str(cfg), "--dry-run", "--format", "json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert [(a["job_key"], a["action"]) for a in plan["actions"]] == [(str(idle), "cancel")]
        assert audit(store) == before and c.job_state(idle) == "RUNNING"

        # enforce: scancel, and sacct says CANCELLED; the busy and the exempt job keep running
        assert main(["policy", "--config", str(cfg)]) == 0
        capsys.readouterr()
        assert c.wait_job(idle).startswith("CANCELLED")
        assert c.job_state(busy) == "RUNNING" and c.job_state(exempt) == "RUNNING" and c.job_state(opted) == "RUNNING"
        rows = audit(store)
        assert [(r[0], r[1], r[3]) for r in rows] == [(str(idle), "notify", "ok"), (str(idle), "cancel", "ok")]
        assert "scancel" in rows[-1][4] and rows[-1][5] >= 2
        states = c.sacct("-X", "-n", "-P", "-o", "State", "-j", str(idle)).split()
        assert states and states[0].startswith("CANCELLED")
    finally:
        smtp.stop()
        for j in (idle, busy, exempt, opted):
            c.run("scancel", str(j), check=False)
    for j in (busy, exempt, opted):
        c.wait_job(j)
