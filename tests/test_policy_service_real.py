"""The idle-GPU policy inside the real `gpufleet collect` service (a subprocess): it notifies
through a real SMTP server (aiosmtpd), records the audit trail through the service's writer, and
after a restart of the service it does not notify the same job again inside renotify_after,
while the failed action keeps being retried (its attempt count rising across the restart)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import aiosmtpd.controller as aiosmtpd_controller
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.store import open_reader
from gpufleet.times import utcnow
from tests import test_policy_actions as tpa
from tests.realstack.process import free_port, wait_for
from tests.support.exporter import stop
from tests.support.policy_config import policy_toml
from tests.test_report_email import Inbox


def audit(store) -> list[tuple]:
    con = open_reader(store)
    try:
        return con.sql("SELECT job_key, action, result, attempt FROM policy_audit ORDER BY ts, job_key").fetchall()
    finally:
        con.close()


def metrics(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.realstack
def test_policy_job_in_the_service_does_not_renotify_across_a_restart(tmp_path, monkeypatch):
    monkeypatch.setattr(tpa, "AS_OF", utcnow().replace(microsecond=0))
    store = tmp_path / "store"
    tpa.build(store)
    inbox = Inbox()
    smtp_port = free_port()
    smtp = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    listen = free_port()
    cfg = tmp_path / "collect.toml"
    cfg.write_text(f"""
[collector]
store = "{store}"
cluster = "hpc"
listen = "127.0.0.1:{listen}"
[collector.scrape]
interval = 30
timeout = 0.5
targets = ["127.0.0.1:{free_port()}"]
""" + policy_toml(
        smtp_port, enforce=True, interval="1s", notify_after="1h", escalate_after="2h", cancel_after="4h",
        exempt_accounts=["ops"], email_domain="example.org", scancel="/nonexistent/scancel", squeue="", retries=0))

    def run_service(until, what):
        log = tmp_path / "collect.log"
        service = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg)],
                                   stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True)
        try:
            assert "metrics at" in service.stdout.readline(), log.read_text()[-3000:]
            wait_for(what, until, timeout=60, interval=0.2)
            m = metrics(listen)
            service.send_signal(signal.SIGTERM)
            assert service.wait(timeout=15) == 0, log.read_text()[-3000:]
            return m
        finally:
            stop(service)

    try:
        # first run: the owners of 102 (notify) and research/nb-1 (escalate) are mailed; the
        # cancel of 101 fails (no scancel) and is recorded, then retried
        m = run_service(lambda: sum(1 for r in audit(store) if r[:2] == ("101", "cancel")) >= 2, "two cancel attempts")
        first = audit(store)
        assert {r[:3] for r in first if r[1] != "cancel"} == {("102", "notify", "ok"), ("research/nb-1", "escalate", "ok")}
        assert len([r for r in first if r[1] != "cancel"]) == 2
        assert m[("gpufleet_policy_enforce", ())] == 1
        assert m[("gpufleet_policy_failing_actions", ())] == 1
        assert m[("gpufleet_policy_action_failures_total", (("action", "cancel"),))] >= 2
        attempts = [r[3] for r in first if r[1] == "cancel"]
        assert attempts == list(range(1, len(attempts) + 1))  # consecutive failures counted
        assert len(inbox.wait(2, 10)) == 2

        # restart: more rounds, the cancel is retried with its count carried over, no new mail
        n0 = len(attempts)
        run_service(lambda: sum(1 for r in audit(store) if r[:2] == ("101", "cancel")) >= n0 + 2, "two more cancel attempts")
        second = audit(store)
        assert [r for r in second if r[1] != "cancel"] == [r for r in first if r[1] != "cancel"]
        assert [r[3] for r in second if r[1] == "cancel"][n0] == n0 + 1
        time.sleep(0.5)
        assert len(inbox.received) == 2
    finally:
        smtp.stop()
