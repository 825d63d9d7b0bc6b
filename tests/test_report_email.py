"""The weekly report by e-mail: a real SMTP server (aiosmtpd) on loopback, with STARTTLS and AUTH,
receives what the collector's APScheduler job sends when it fires under a frozen clock.

The PDF attachment needs Debian's chromium (installed as root; skipped without, failed under
CI=true); the failure-path tests need no browser.
"""

from __future__ import annotations

import email
import socket
import ssl
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from zoneinfo import ZoneInfo

import aiosmtpd.controller as aiosmtpd_controller  # the test extra: missing is a failure, not a skip
import pytest
from aiosmtpd.smtp import AuthResult, LoginPassword

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.report import fmt
from gpufleet.report.config import Smtp
from gpufleet.report.mail import MailError, send
from gpufleet.report.window import week_window
from gpufleet.report import job as report_job
from gpufleet.config import ConfigError, load_file
from tests.realstack.debian import ensure_packages, which
from tests.realstack.policy import unavailable
from tests.test_report import HOSTILE_ACCOUNT, store  # noqa: F401 - the report store fixture

BERLIN = ZoneInfo("Europe/Berlin")
FROZEN = datetime(2026, 11, 23, 7, 0, tzinfo=BERLIN)  # Monday 07:00: report week 2026-W47
USER, PASSWORD = "gpufleet", "s3cret pass"


class Inbox:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.logins: list[tuple[str, bool]] = []
        self.cond = threading.Condition()

    async def handle_DATA(self, server, session, envelope):
        with self.cond:
            self.received.append({"from": envelope.mail_from, "to": list(envelope.rcpt_tos), "tls": session.ssl is not None,
                                  "msg": email.message_from_bytes(envelope.original_content or envelope.content, policy=default_policy)})
            self.cond.notify_all()
        return "250 OK"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.login == USER.encode() and auth_data.password == PASSWORD.encode()
        self.logins.append((auth_data.login.decode() if isinstance(auth_data, LoginPassword) else "?", ok))
        return AuthResult(success=ok, handled=False)  # handled=False: the server answers 535 itself

    def wait(self, n: int, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.received) < n and time.monotonic() < deadline:
                self.cond.wait(max(0.1, deadline - time.monotonic()))
            return list(self.received)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost / 127.0.0.1 (the client trusts it as its ca_file)."""
    if not which("openssl"):
        ensure_packages("openssl")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
                           "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        unavailable(f"openssl could not make a test certificate: {proc.stderr.strip()[-300:]}")
    return cert, key


@pytest.fixture
def tls_server(certificate):
    cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    inbox = Inbox()
    port = free_port()
    c = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port, tls_context=ctx, require_starttls=True,
                                       authenticator=inbox.authenticate, auth_require_tls=True)
    c.start()
    try:
        yield inbox, port, cert
    finally:
        c.stop()


@pytest.fixture
def plain_server():
    inbox = Inbox()
    port = free_port()
    c = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port)
    c.start()
    try:
        yield inbox, port
    finally:
        c.stop()


@pytest.fixture(scope="module")
def chromium():
    ensure_packages("chromium")
    path = which("chromium")
    if not path:
        unavailable("chromium not found after installing it")
    return path


def write_config(tmp_path: Path, store_root: Path, port: int, *, cert: Path | None = None, password: str = PASSWORD) -> Path:
    pw = tmp_path / "smtp-password"
    pw.write_text(password + "\n")
    tls = f'starttls = true\nusername = "{USER}"\npassword_file = "{pw}"\nca_file = "{cert}"\n' if cert else ""
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f"""
[collector]
store = "{store_root}"

[report]
recipients = ["managers@example.org", "cfo@example.org"]
from_address = "gpufleet@example.org"
out_dir = "{tmp_path / 'kept'}"

[report.team_recipients]
physics = ["lead@physics.example.org"]

[report.smtp]
host = "localhost"
port = {port}
timeout = 20
{tls}
[report.schedule]
weekday = "mon"
hour = 7
minute = 0
timezone = "Europe/Berlin"
""")
    return cfg


def test_scheduled_job_mails_fleet_and_team_reports_over_starttls(tls_server, chromium, store, tmp_path):  # noqa: F811
    from apscheduler.schedulers.background import BackgroundScheduler

    inbox, port, cert = tls_server
    cfg = write_config(tmp_path, store.root, port, cert=cert)
    job = report_job.prepare(load_file(cfg), cfg, clock=lambda: FROZEN)
    assert job is not None
    scheduler = BackgroundScheduler(timezone="UTC")
    aps = job.add_to(scheduler)
    # the cron trigger: Mondays 07:00 Berlin time
    assert aps.trigger.get_next_fire_time(None, FROZEN - timedelta(minutes=1)) == FROZEN
    assert aps.trigger.get_next_fire_time(None, FROZEN + timedelta(minutes=1)) == FROZEN + timedelta(days=7)
    assert aps.trigger.get_next_fire_time(None, datetime(2026, 3, 28, 12, tzinfo=BERLIN)).utcoffset() == timedelta(hours=2)  # after DST
    scheduler.start()
    try:
        aps.modify(next_run_time=datetime.now(timezone.utc))  # fire now; the job reads the frozen clock
        got = inbox.wait(2, timeout=240)
    finally:
        scheduler.shutdown(wait=True)
    assert job.last_result is True
    assert len(got) == 2, got
    assert inbox.logins == [(USER, True)]
    by_to = {tuple(sorted(m["to"])): m for m in got}
    assert set(by_to) == {("cfo@example.org", "managers@example.org"), ("lead@physics.example.org",)}
    assert all(m["tls"] and m["from"] == "gpufleet@example.org" for m in got)

    w = week_window(2026, 47, "Europe/Berlin")
    t = Analysis(store.reader(), Params(w.start, w.end), now=FROZEN.astimezone(timezone.utc).replace(tzinfo=None)).totals()
    fleet: EmailMessage = by_to[("cfo@example.org", "managers@example.org")]["msg"]
    assert fleet["Subject"] == (f"GPU waste report 2026-W47: {fmt.usd(t.idle_allocated_cost)} idle, utilization {fmt.pct(t.utilization_pct)}, "
                                f"{fmt.hours(t.allocated_gpu_h)} GPU-h allocated")
    assert fleet["To"] == "managers@example.org, cfo@example.org"
    assert fleet.get_content_type() == "multipart/mixed"
    parts = [(p.get_content_type(), p.get_filename()) for p in fleet.walk() if not p.is_multipart()]
    assert parts == [("text/plain", None), ("text/html", None), ("application/pdf", "gpufleet-report-2026-W47.pdf")]
    body = fleet.get_body(("html",)).get_content()
    text = fleet.get_body(("plain",)).get_content()
    assert "Mon 2026-11-16 00:00 to Mon 2026-11-23 00:00 (Europe/Berlin)" in body
    assert fmt.usd(t.idle_allocated_cost) in body and fmt.hours(t.idle_allocated_gpu_h) in text
    assert "&lt;b&gt;bio&lt;/b&gt;" in body and "<b>bio" not in body
    pdf = next(p for p in fleet.iter_attachments()).get_content()
    assert pdf.startswith(b"%PDF-") and len(pdf) > 10_000

    team: EmailMessage = by_to[("lead@physics.example.org",)]["msg"]
    assert team["Subject"].startswith("GPU waste report 2026-W47 \u2014 team physics: ")
    tbody = team.get_body(("html",)).get_content()
    assert "Your team" in tbody and "bio" not in tbody
    assert [a.get_filename() for a in team.iter_attachments()] == ["gpufleet-report-2026-W47-team-physics.pdf"]
    # and a copy is kept
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == sorted(
        f"gpufleet-report-2026-W47{s}.{x}" for s in ("", "-team-physics") for x in ("html", "pdf", "txt"))


@pytest.mark.realstack
def test_unreachable_store_mails_a_not_available_notice(plain_server, store, tmp_path):  # noqa: F811
    inbox, port = plain_server
    cfg = write_config(tmp_path, tmp_path / "no-store-here", port)
    job = report_job.prepare(load_file(cfg), cfg, clock=lambda: FROZEN)
    assert job() is False
    got = inbox.wait(1, timeout=30)
    assert len(got) == 1
    msg = got[0]["msg"]
    assert sorted(got[0]["to"]) == ["cfo@example.org", "lead@physics.example.org", "managers@example.org"]
    assert msg["Subject"] == "GPU waste report 2026-W47: NOT AVAILABLE"
    text = msg.get_content()
    assert "could not be produced" in text and "no store at" in text and "No figures are reported" in text
    assert not msg.is_multipart()


@pytest.mark.realstack
def test_wrong_password_and_missing_starttls_are_clear_errors(tls_server):
    inbox, port, cert = tls_server
    msg = EmailMessage()
    msg["Subject"], msg["From"], msg["To"] = "x", "a@example.org", "b@example.org"
    msg.set_content("x")
    pw = cert.parent / "wrong"
    pw.write_text("nope")
    with pytest.raises(MailError, match="authentication as 'gpufleet' failed"):
        send([msg], Smtp(host="localhost", port=port, starttls=True, username=USER, password_file=str(pw), ca_file=str(cert), timeout=10))
    with pytest.raises(MailError, match="SMTP localhost:%d" % port):
        send([msg], Smtp(host="localhost", port=port, starttls=False, timeout=10))  # the server requires STARTTLS
    with pytest.raises(MailError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        send([msg], Smtp(host="localhost", port=port, starttls=True, timeout=10))  # not trusted without ca_file
    assert inbox.received == []


def test_prepare_schedules_only_with_recipients_and_checks_the_password_file_at_start(store, tmp_path):  # noqa: F811
    assert report_job.prepare({}, None) is None
    assert report_job.prepare({"report": {"top_jobs": 3}}, None) is None  # nobody to mail
    off = {"report": {"recipients": ["a@example.org"], "schedule": {"enabled": False}}}
    assert report_job.prepare(off, None) is None
    on = {"collector": {"store": str(store.root)}, "report": {"recipients": ["a@example.org"], "schedule": {"weekday": "fri", "hour": 18}}}
    job = report_job.prepare(on, None)
    assert job is not None
    fri = job.trigger().get_next_fire_time(None, datetime(2026, 11, 23, tzinfo=timezone.utc))
    assert fri == datetime(2026, 11, 27, 18, tzinfo=timezone.utc)
    bad = {"report": {"recipients": ["a@example.org"], "smtp": {"username": "u", "password_file": str(tmp_path / "missing")}}}
    with pytest.raises(ConfigError, match="password_file = .*cannot read it"):
        report_job.prepare(bad, "g.toml")
    with pytest.raises(ConfigError, match=r"\[report.schedule\]: weekday = 'Montag'"):
        report_job.prepare({"report": {"recipients": ["a@example.org"], "schedule": {"weekday": "Montag"}}}, "g.toml")


def test_a_failing_run_never_raises_into_the_scheduler(store, monkeypatch):  # noqa: F811
    on = {"collector": {"store": str(store.root)}, "report": {"recipients": ["a@example.org"]}}
    job = report_job.prepare(on, None, clock=lambda: FROZEN)

    def boom(*a, **k):
        raise RuntimeError("template bug")

    monkeypatch.setattr("gpufleet.report.pipeline.make", boom)
    assert job() is False and job.last_result is False
    assert HOSTILE_ACCOUNT  # the shared store fixture is the report tests' one
