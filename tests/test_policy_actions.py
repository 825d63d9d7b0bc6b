"""The idle-GPU policy over a real store: the plan, the CLI, the audit trail, and its actions
through real components on loopback (aiosmtpd, an HTTP webhook receiver, the API server stand-in
of tests/test_kubernetes_source.py)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiosmtpd.controller as aiosmtpd_controller
import pytest

from gpufleet.analytics.params import Params
from gpufleet.analytics.policy import Rules, plan_from_store
from gpufleet.cli import main
from gpufleet.analytics import raw_reads
from gpufleet.collector.maintenance import compact
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.times import epoch_us
from gpufleet.config import load_file
from gpufleet.policy.enforce import PolicyJob, Runner, attempts_from_audit
from tests.support.fleet import Fleet
from tests.support.policy_config import policy_toml
from tests.test_kubernetes_source import FakeApiServer
from tests.test_report_email import Inbox, free_port

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
H = timedelta(hours=1)
FIVE_MIN_US = 300 * 1_000_000
HOSTILE = "<b>nb</b>\r\nBcc: evil@example.org <!channel>"


def build(root: Path) -> Fleet:
    f = Fleet(root, cluster="hpc")
    end = AS_OF + timedelta(seconds=15)  # the last sample at AS_OF: fresh

    def gpus(host, n, start, util, procs=0.0):
        out = []
        for i in range(n):
            uuid = f"GPU-{host}-{i}"
            f.gpu_series(host, uuid, start, end, util=util, procs=procs, gpu=i)
            out.append((host, uuid))
        return out

    # idle 5 h on both GPUs -> cancel
    f.job("101", account="nlp", user="alice", start=AS_OF - 6 * H, end=None, gpus=2, name="train-big",
          placements=gpus("n1", 2, AS_OF - 5 * H, 0.0))
    # busy until 1.5 h ago -> notify
    f.job("102", account="vision", user="carol", start=AS_OF - 3 * H, end=None, gpus=1,
          placements=gpus("n2", 1, AS_OF - 3 * H, lambda t: 80.0 if t < AS_OF - 1.5 * H else 1.0, procs=1.0))
    # busy -> nothing
    f.job("103", account="nlp", user="dave", start=AS_OF - 6 * H, end=None, gpus=1, placements=gpus("n3", 1, AS_OF - 6 * H, 85.0, 1.0))
    # idle but exempt account -> exempt
    f.job("104", account="ops", user="erin", start=AS_OF - 6 * H, end=None, gpus=1, placements=gpus("n4", 1, AS_OF - 6 * H, 0.0))
    # one idle GPU, one busy -> nothing
    pl = gpus("n5", 1, AS_OF - 6 * H, 0.0) + [("n5", "GPU-n5-b")]
    f.gpu_series("n5", "GPU-n5-b", AS_OF - 6 * H, end, util=60.0, procs=1.0, gpu=1)
    f.job("106", account="nlp", user="frank", start=AS_OF - 6 * H, end=None, gpus=2, placements=pl)
    # too young
    f.job("105", account="nlp", user="gina", start=AS_OF - timedelta(minutes=10), end=None, gpus=1,
          placements=gpus("n6", 1, AS_OF - timedelta(minutes=10), 0.0))
    # a pod with a hostile name, idle 2.5 h -> escalate
    f.job("research/nb-1", scheduler="kubernetes", account="research", user="alice", partition="research",
          start=AS_OF - 4 * H, end=None, gpus=1, name=HOSTILE, placements=gpus("k1", 1, AS_OF - 2.5 * H, 0.0))
    f.write()
    return f


RULES = Rules(notify_after=H, escalate_after=2 * H, cancel_after=4 * H, no_process_after=timedelta(minutes=30),
              renotify_after=12 * H, min_job_age=timedelta(minutes=30), exempt_accounts=("ops",))


def params() -> Params:
    return Params(start=AS_OF - H, end=AS_OF)


@pytest.fixture
def store(tmp_path):
    build(tmp_path / "store")
    return tmp_path / "store"


def test_plan_over_the_store_uses_the_idle_definition(store):
    con = open_reader(store)
    plan = plan_from_store(con, RULES, params(), AS_OF)
    got = {a.job.job_key: (a.action, a.rule, a.job.idle_s, a.job.idle_gpus) for a in plan.actions}
    assert got == {"101": ("cancel", "cancel_after", 5 * 3600.0, 2),
                   "102": ("notify", "notify_after", 1.5 * 3600.0, 1),
                   "research/nb-1": ("escalate", "escalate_after", 2.5 * 3600.0, 1)}
    assert [(e.job.job_key, e.rule) for e in plan.exempt] == [("104", "exempt_accounts")]


def config(tmp_path, store, *, enforce=False, smtp_port=1, webhook="", kube="", scancel="scancel", extra="") -> Path:
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f'[analytics]\nstore = "{store}"\n' + policy_toml(
        smtp_port, enforce=enforce, notify_after="1h", escalate_after="2h", cancel_after="4h", exempt_accounts=["ops"],
        email_domain="example.org", webhook_url=webhook, kube_api=kube, scancel=scancel, squeue="", retries=1) + f"""[policy.account_contacts]
research = ["research-lead@example.org"]
{extra}""")
    return cfg


def test_cli_dry_run_json_changes_nothing(tmp_path, store, capsys):
    cfg = config(tmp_path, store, enforce=True)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in store.rglob("*"))
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {a["job_key"]: a["action"] for a in doc["actions"]} == {"101": "cancel", "102": "notify", "research/nb-1": "escalate"}
    a = next(a for a in doc["actions"] if a["job_key"] == "101")
    for key in ("action", "job_key", "job_id", "cluster", "scheduler", "user", "account", "job_state", "idle_s", "idle_gpus", "rule", "reason"):
        assert key in a
    assert a["idle_s"] == 18000.0 and a["idle_gpus"] == 2 and a["job_state"] == "RUNNING" and a["user"] == "alice"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in store.rglob("*")) == before
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z"]) == 0
    text = capsys.readouterr().out
    assert "cancel" in text and "[cancel_after]" in text and "\r\n" not in text and "\\r\\n" in text


def test_cli_errors_are_one_plain_line_and_a_missing_store_is_usage(tmp_path, capsys):
    cfg = tmp_path / "g.toml"
    cfg.write_text(policy_toml(1, notify_after="1h"))
    assert main(["policy", "--config", str(cfg), "--store", str(tmp_path / "none"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpufleet policy: error: no store at {tmp_path / 'none'}: expected a directory written by `gpufleet collect` "
                   "(manifest.json missing): pass --config gpufleet.toml (its [collector] or [analytics] store) or --store DIR\n")
    cfg.write_text(policy_toml(1, notify_after="soon"))
    assert main(["policy", "--config", str(cfg), "--store", str(tmp_path / "none"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpufleet policy: error: ") and "notify_after = 'soon'" in err and err.count("\n") == 1


def test_cli_with_nothing_due_names_the_closest_job_and_why(tmp_path, store, capsys):
    """Issue #53.9: thresholds above every idle time - 0 actions, and the plan says which job is
    nearest to one (101: both GPUs idle since 07:00, 5 h) and when its rule comes due."""
    cfg = tmp_path / "late.toml"
    cfg.write_text(f'[analytics]\nstore = "{store}"\n' + policy_toml(1, notify_after="6h", escalate_after="7h", cancel_after="8h",
                                                                     no_process_after="6h", exempt_accounts=["ops"], squeue=""))
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["actions"] == []
    c = doc["closest"]
    assert (c["job_key"], c["rule"], c["idle_since"], c["due_at"], c["idle_gpus"], c["gpus"]) == (
        "101", "notify_after", "2026-11-20T07:00:00", "2026-11-20T13:00:00", 2, 2)
    assert main(["policy", "--config", str(cfg), "--as-of", AS_OF.isoformat() + "Z", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "0 action(s)" in text
    assert ("  nothing due; closest hpc/101 alice nlp: all 2 GPUs idle since 2026-11-20 07:00:00 UTC (5 h; the count starts at the "
            "GPUs' current run of idle samples, and a gap in the data longer than max_gap restarts it): notify_after = 6 h: "
            "due at 2026-11-20 13:00:00 UTC (in 1 h)\n") in text


class Webhook:
    def __init__(self):
        self.posts: list[dict] = []
        self.fail = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hook.fail:
                    hook.fail -= 1
                    self.send_response(500)
                    self.end_headers()
                    return
                hook.posts.append({"ctype": self.headers["Content-Type"], "json": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def channels():
    inbox = Inbox()
    port = free_port()
    c = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port)
    c.start()
    hook, api = Webhook(), FakeApiServer()
    try:
        yield inbox, port, hook, api
    finally:
        c.stop()
        hook.stop()
        api.stop()


def runner_for(cfg: Path, clock) -> Runner:
    return Runner.from_config(load_file(cfg), cfg, clock=clock, sleep=lambda s: None)


def recorder(store):
    def record(rows):
        w = StoreWriter(store)  # a writer per round: each round is like a collector restart
        try:
            w.record_policy(rows)
            w.publish()
        finally:
            w.close()
    return record


@pytest.mark.realstack
def test_enforced_actions_reach_real_channels_and_are_audited(tmp_path, store, channels):
    inbox, port, hook, api = channels
    api.pods_present.add("research/nb-1")
    cfg = config(tmp_path, store, enforce=True, smtp_port=port, webhook=hook.url, kube=api.url, scancel="/nonexistent/scancel")
    clock = [AS_OF]
    r = runner_for(cfg, lambda: clock[0])
    rows = r.execute(r.plan(store, AS_OF), recorder(store))
    res = {x["job_key"]: (x["action"], x["result"]) for x in rows}
    assert res == {"101": ("cancel", "failed"), "102": ("notify", "ok"), "research/nb-1": ("escalate", "ok")}
    # the pod was deleted through the API; the Slurm cancel failed loudly (no such scancel)
    assert api.deleted == []  # escalate does not delete
    assert "/nonexistent/scancel" in next(x["detail"] for x in rows if x["job_key"] == "101")
    msgs = inbox.wait(2, 10)
    by_to = {tuple(m["to"]): m["msg"] for m in msgs}
    assert set(by_to) == {("carol@example.org",), ("alice@example.org", "research-lead@example.org")}
    esc = by_to[("alice@example.org", "research-lead@example.org")]
    assert "\n" not in esc["Subject"] and "Bcc" not in {k for k in esc.keys()}
    body = esc.get_body(("plain",)).get_content()
    assert "Idle for:       2 h 30 min (9000 s)" in body and "escalate_after" in body and "\\r\\n" in body
    html_part = esc.get_body(("html",)).get_content()
    assert "<b>nb</b>" not in html_part and "&lt;b&gt;nb&lt;/b&gt;" in html_part
    posts = [p["json"] for p in hook.posts]
    assert len(posts) == 2 and all(p["gpufleet"]["idle_s"] is not None for p in posts)
    esc_post = next(p for p in posts if p["gpufleet"]["action"] == "escalate")
    assert "<!channel>" not in esc_post["text"] and "&lt;!channel&gt;" in esc_post["text"]
    assert esc_post["gpufleet"]["idle_s"] == 9000.0 and esc_post["gpufleet"]["rule"] == "escalate_after"
    assert r.metrics.registry.get_sample_value("gpufleet_policy_action_failures_total", {"action": "cancel"}) == 1

    # next round, after a restart: notified jobs are not notified again; the failed cancel is retried
    clock[0] = AS_OF + timedelta(minutes=5)
    r2 = runner_for(cfg, lambda: clock[0])
    plan = r2.plan(store, AS_OF + timedelta(minutes=5))
    assert [a.job.job_key for a in plan.actions] == ["101"]
    assert {a.job.job_key for a in plan.suppressed} == {"102", "research/nb-1"}
    rows2 = r2.execute(plan, recorder(store), attempts=attempts_from_audit(store, clock[0]))
    assert rows2[0]["result"] == "failed" and rows2[0]["attempt"] == 2
    failing = r2.failing(store)
    assert [(f["job_key"], f["attempt"], f["job_state"]) for f in failing] == [("101", 2, "RUNNING")]
    assert r2.metrics.registry.get_sample_value("gpufleet_policy_failing_actions") == 1
    assert len(inbox.received) == 2  # no second mail


@pytest.mark.realstack
def test_pod_deleted_only_with_enforce(tmp_path, store, channels):
    inbox, port, hook, api = channels
    api.pods_present.add("research/nb-1")
    rules = {"cancel_after": '"2h"', "escalate_after": '"2h"'}
    for cfg_enforce in (False, True):
        cfg = config(tmp_path, store, enforce=cfg_enforce, smtp_port=port, webhook=hook.url, kube=api.url)
        text = cfg.read_text().replace('escalate_after = "2h"', f'escalate_after = {rules["escalate_after"]}') \
                              .replace('cancel_after = "4h"', f'cancel_after = {rules["cancel_after"]}')
        cfg.write_text(text)
        r = runner_for(cfg, lambda: AS_OF)
        plan = r.plan(store, AS_OF)
        pod = [a for a in plan.actions if a.job.scheduler == "kubernetes"]
        assert [(a.action, a.rule) for a in pod] == [("cancel", "cancel_after")]
        plan.actions = pod
        rows = r.execute(plan, recorder(store))
        if not cfg_enforce:
            assert rows == [] and api.deleted == [] and hook.posts == []
        else:
            assert [x["result"] for x in rows] == ["ok"] and api.deleted == ["research/nb-1"]
            assert "deleted pod research/nb-1" in rows[0]["detail"]
            assert any(rq.get("method") == "DELETE" for rq in api.requests)


@pytest.mark.realstack
def test_pod_opting_out_by_annotation_is_left_alone(tmp_path, store, channels):
    inbox, port, hook, api = channels
    api.pods_present.add("research/nb-1")
    api.annotations["research/nb-1"] = {"gpufleet.io/exempt": "waiting for a <b>dataset</b> copy"}
    cfg = config(tmp_path, store, enforce=True, smtp_port=port, webhook=hook.url, kube=api.url)
    cfg.write_text(cfg.read_text().replace('cancel_after = "4h"', 'cancel_after = "2h"').replace('escalate_after = "2h"', 'escalate_after = "2h"'))
    r = runner_for(cfg, lambda: AS_OF)
    plan = r.plan(store, AS_OF)
    assert "research/nb-1" not in {a.job.job_key for a in plan.actions}
    (ex,) = [e for e in plan.exempt if e.job.job_key == "research/nb-1"]
    assert ex.rule == "opt_out" and ex.reason == "opted out in its pod annotation: waiting for a <b>dataset</b> copy"
    plan.actions = [a for a in plan.actions if a.job.scheduler == "kubernetes"]
    assert r.execute(plan, recorder(store)) == [] and api.deleted == []


@pytest.mark.realstack
def test_service_job_records_through_the_collectors_writer(tmp_path, store, channels):
    inbox, port, hook, api = channels
    from gpufleet.collector.service import Collector

    cfg = config(tmp_path, store, enforce=True, smtp_port=port, webhook=hook.url)
    r = runner_for(cfg, lambda: AS_OF)
    collector = Collector(StoreWriter(store), [])
    try:
        from apscheduler.schedulers.background import BackgroundScheduler

        job = PolicyJob(r, store)
        sched = BackgroundScheduler(timezone="UTC")  # not started: the job is run by hand below
        aps = job.add_to(sched, collector)
        assert aps.id == "idle-gpu-policy" and aps.trigger.interval == timedelta(minutes=5)
        assert aps.func() is False  # the Slurm cancel fails (no scancel here); the mail went
        reg = collector.metrics.registry
        assert reg.get_sample_value("gpufleet_policy_actions_total", {"action": "notify", "result": "ok"}) == 1
        assert reg.get_sample_value("gpufleet_policy_enforce") == 1
    finally:
        collector.writer.close()
    con = open_reader(store)
    audit = con.sql("SELECT job_key, action, result FROM policy_audit ORDER BY job_key").fetchall()
    assert ("102", "notify", "ok") in audit and ("101", "cancel", "failed") in audit


@pytest.mark.realstack
def test_service_round_acts_on_its_plan_when_its_notes_read_fails(tmp_path, store, channels, monkeypatch, caplog):
    """The round's notes and drains are read beside its plan (worker threads): a store error in the notes' read is logged
    as the notes' and the plan's actions and the drains still happen, as when the reads ran one after the other."""
    inbox, port, hook, api = channels
    from gpufleet.collector.service import Collector
    from gpufleet.collector.store import StoreError

    cfg = config(tmp_path, store, enforce=True, smtp_port=port, webhook=hook.url)
    r = runner_for(cfg, lambda: AS_OF)

    def unreadable(*args, **kwargs):
        raise StoreError("jobs file is truncated")

    monkeypatch.setattr(r, "notes", unreadable)
    drained = []
    monkeypatch.setattr(r, "drains", lambda *a, **k: drained.append(a) or {"drains": [], "exempt": [], "suppressed": [], "lemons": [],
                                                                             "figures": None})
    monkeypatch.setattr(r, "recent_reliability", lambda *a, **k: None)
    collector = Collector(StoreWriter(store), [])
    try:
        job = PolicyJob(r, store)
        job.record = collector.record_policy
        assert job.run() is False  # the Slurm cancel fails (no scancel here); the mail went
    finally:
        collector.writer.close()
    assert "efficiency notes: the store is unreadable: jobs file is truncated" in caplog.text and len(drained) == 1
    audit = open_reader(store).sql("SELECT job_key, action, result FROM policy_audit ORDER BY job_key").fetchall()
    assert ("102", "notify", "ok") in audit and ("101", "cancel", "failed") in audit


@pytest.mark.realstack
def test_efficiency_note_at_job_end_for_opted_in_accounts(tmp_path, channels):
    inbox, port, hook, api = channels
    f = Fleet(tmp_path / "store", cluster="hpc")
    start, end = AS_OF - 3 * H, AS_OF - timedelta(minutes=20)
    f.gpu_series("m1", "GPU-m1-0", start, end, util=lambda t: 90.0 if t < start + H else 0.0, procs=1.0, fb_used=30000.0)
    f.job("201", account="nlp", user="alice", start=start, end=end, gpus=1, name="ft <run>", placements=[("m1", "GPU-m1-0")],
          state="COMPLETED")
    f.gpu_series("m2", "GPU-m2-0", start, end, util=90.0, procs=1.0)
    f.job("202", account="vision", user="carol", start=start, end=end, gpus=1, placements=[("m2", "GPU-m2-0")], state="COMPLETED")
    f.write()
    store = tmp_path / "store"
    cfg = config(tmp_path, store, enforce=True, smtp_port=port, extra="")
    cfg.write_text(cfg.read_text().replace("retries = 1", 'retries = 1\nefficiency_note_accounts = ["nlp"]'))
    r = runner_for(cfg, lambda: AS_OF)
    notes = r.notes(store, AS_OF)
    assert [n["job_key"] for n in notes] == ["201"]  # vision did not opt in
    n = notes[0]
    assert n["verdict"] == "idle_stretches" and n["fb_used_max_mib"] == 30000.0 and abs(n["idle_gpu_h"] - (5 / 3 - 0.0)) < 0.02
    rows = r.send_notes(notes, recorder(store))
    assert [(x["action"], x["result"], x["rule"]) for x in rows] == [("efficiency_note", "ok", "idle_stretches")]
    (msg,) = inbox.wait(1, 10)
    body = msg["msg"].get_body(("plain",)).get_content()
    assert msg["to"] == ["alice@example.org"] and "Memory high-water:    30,000 MiB" in body and "Verdict:              idle_stretches" in body
    assert "&lt;run&gt;" in msg["msg"].get_body(("html",)).get_content()
    assert r.notes(store, AS_OF + timedelta(minutes=5)) == []  # sent once


def test_efficiency_notes_of_several_jobs_at_once_are_those_made_one_at_a_time(tmp_path, monkeypatch):
    """efficiency_notes analyses a round's jobs of one cluster at once (their keys, the window from the earliest start to
    the latest end; NOTE_BATCH jobs at most), NOTE_WORKERS analyses at a time: each note's figures are those of the job's
    own analysis over its own span (as the job page reads it) - for two jobs one after the other on one GPU, a job of two
    GPUs, the same key in two clusters and a job requeued after an earlier attempt inside the others' window - in the same
    order, whatever NOTE_WORKERS and NOTE_BATCH."""
    from dataclasses import replace

    from gpufleet.analytics import policy
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.jobs import job_report
    from gpufleet.analytics.params import Filters
    from tests.test_analytics_attempts import attempt

    root = tmp_path / "store"
    start = AS_OF - 4 * H
    f = Fleet(root, cluster="hpc")
    for i in range(7):
        host, uuid = f"m{i}", f"GPU-m{i}-0"
        end = AS_OF - timedelta(minutes=10 + 7 * i)
        f.gpu_series(host, uuid, start, end, util=lambda t, i=i: 90.0 if t < start + (i + 1) * H / 4 else 5.0 * i, procs=1.0,
                     fb_used=1000.0 * (i + 1))
        f.job(str(400 + i), account="nlp" if i % 3 else "vision", user="alice", start=start + i * timedelta(minutes=3), end=end,
              gpus=1, placements=[(host, uuid)], state="COMPLETED")
    # two jobs one after the other on one GPU: the first idle at its end, the next busy from its start
    f.gpu_series("s", "GPU-s-0", start, AS_OF, util=lambda t: 0.0 if start + H < t < start + 2 * H else 80.0, procs=1.0)
    f.job("501", account="nlp", user="bob", start=start, end=start + 2 * H, gpus=1, placements=[("s", "GPU-s-0")], state="COMPLETED")
    f.job("502", account="nlp", user="bob", start=start + 2 * H, end=AS_OF - timedelta(minutes=5), gpus=1,
          placements=[("s", "GPU-s-0")], state="COMPLETED")
    # a job of two GPUs, one of them idle
    for g in range(2):
        f.gpu_series("d", f"GPU-d-{g}", start, AS_OF, util=60.0 if g else 0.0, procs=1.0, gpu=g)
    f.job("503", account="nlp", user="carol", start=start + H, end=AS_OF - timedelta(minutes=1), gpus=2,
          placements=[("d", "GPU-d-0"), ("d", "GPU-d-1")], state="COMPLETED")
    # requeued: its earlier attempt (busy) inside the others' window, before its own record's start
    f.gpu_series("r", "GPU-r-0", start, AS_OF, util=lambda t: 95.0 if t < start + 2 * H else 2.0, procs=1.0)
    f.job("504", account="nlp", user="dave", start=start + 2 * H, end=AS_OF - timedelta(minutes=3), gpus=1,
          placements=[("r", "GPU-r-0")], state="COMPLETED", held_from=start + H / 2)
    w = StoreWriter(root)
    w.commit(f.batch())
    w.commit(Batch(key="attempts", attempts=[{**attempt("504", start + H / 2, start + 2 * H), "cluster": "hpc"}]))
    k = Fleet(root, cluster="k8s")  # the same key in another cluster
    k.gpu_series("k", "GPU-k-0", start, AS_OF, util=30.0, procs=1.0)
    k.job("401", account="nlp", user="erin", start=start + H, end=AS_OF - timedelta(minutes=2), gpus=1, placements=[("k", "GPU-k-0")],
          state="COMPLETED")
    w.commit(k.batch("k8s"))
    w.publish()
    compact(w, AS_OF + 3 * H, facts_hours=None)  # every hour's facts: the notes read them, raw only where a window cuts a bucket
    w.close()
    con = open_reader(root)
    params = Params(AS_OF - 7 * 24 * H, AS_OF)
    args = (con, params, ("nlp", "vision"), AS_OF - 2 * H, AS_OF)
    mark = raw_reads.READS.mark()
    together = policy.efficiency_notes(*args)
    # raw samples read only in the buckets the analyses' windows cut: hpc's (its first start, its last end), k8s's, and the
    # requeued job's own - not at each job's edges (ends at minutes off the 5-minute grid)
    ends = {n["job_key"]: (n["start"], n["end"]) for n in together if n["cluster"] == "hpc" and n["job_key"] != "504"}
    windows = [(min(a for a, _ in ends.values()), max(b for _, b in ends.values())),
               *[(n["start"], n["end"]) for n in together if n["cluster"] == "k8s" or n["job_key"] == "504"]]
    cut = {epoch_us(t) // FIVE_MIN_US for w in windows for t in w}
    edge_buckets = {r.lo_us // FIVE_MIN_US for r in raw_reads.READS.since(mark) if r.kind == "edge" and r.rows}
    assert edge_buckets and edge_buckets <= cut, (edge_buckets - cut, cut)
    assert [(n["cluster"], n["job_key"]) for n in together] == [
        ("hpc", "406"), ("hpc", "405"), ("hpc", "404"), ("hpc", "403"), ("hpc", "402"), ("hpc", "401"), ("hpc", "400"),
        ("hpc", "502"), ("hpc", "504"), ("k8s", "401"), ("hpc", "503")]  # the jobs' order: by end
    for n in together:  # each note is its job's own analysis over its own span
        p = replace(params, start=n["start"], end=n["end"], filters=Filters(cluster=n["cluster"], account=n["account"], job_key=n["job_key"]))
        rep = job_report(Analysis(con.cursor(), p, now=AS_OF), n["job_key"])
        own = {"gpus": rep.job["gpus"], "runtime_h": rep.runtime_h, "allocated_gpu_h": rep.allocated_gpu_h,
               "mean_utilization_pct": rep.mean_utilization_pct, "idle_gpu_h": rep.idle_gpu_h, "no_process_gpu_h": rep.no_process_gpu_h,
               "fb_used_max_mib": rep.per_gpu["fb_used_max_mib"].max(), "verdict": rep.verdict, "rule": rep.rule}
        assert {k: n[k] for k in own} == {k: v if v is None or isinstance(v, str) else pytest.approx(v, rel=1e-9, abs=1e-9)
                                          for k, v in own.items()}, n["job_key"]
    assert {n["job_key"]: n["verdict"] for n in together if n["job_key"] in ("501", "503", "504")} == {
        "503": "idle_stretches", "504": "idle"}  # (501 ended before the round)
    monkeypatch.setattr(policy, "NOTE_WORKERS", 1)
    assert together == policy.efficiency_notes(*args)
    monkeypatch.setattr(policy, "NOTE_BATCH", 2)  # (batches of two)
    assert together == policy.efficiency_notes(*args)
    assert len({n["fb_used_max_mib"] for n in together[:7]}) == 7  # (each its own job's)


@pytest.mark.realstack
def test_efficiency_note_for_a_job_whose_gpu_count_accounting_does_not_know(tmp_path, channels):
    """Accounting that does not track GPUs (gpus unknown): a job the job mapping placed on a GPU is a
    GPU job (the store fills its count from the mapping) and gets its note; a job with no GPU in
    accounting or the mapping (a CPU job) does not."""
    inbox, port, hook, api = channels
    f = Fleet(tmp_path / "store", cluster="hpc")
    start, end = AS_OF - 3 * H, AS_OF - timedelta(minutes=20)
    f.gpu_series("m1", "GPU-m1-0", start, end, util=lambda t: 90.0 if t < start + H else 0.0, procs=1.0)
    f.job("301", account="nlp", user="alice", start=start, end=end, gpus=None, placements=[("m1", "GPU-m1-0")], state="COMPLETED")
    f.job("302", account="nlp", user="alice", start=start, end=end, gpus=None, placements=[], state="COMPLETED")
    f.write()
    store = tmp_path / "store"
    cfg = config(tmp_path, store, enforce=True, smtp_port=port, extra="")
    cfg.write_text(cfg.read_text().replace("retries = 1", 'retries = 1\nefficiency_note_accounts = ["nlp"]'))
    notes = runner_for(cfg, lambda: AS_OF).notes(store, AS_OF)
    assert [n["job_key"] for n in notes] == ["301"]
    assert notes[0]["verdict"] == "idle_stretches" and abs(notes[0]["idle_gpu_h"] - 5 / 3) < 0.02


@pytest.mark.realstack
def test_cancel_is_refused_for_a_job_of_another_cluster(tmp_path, store, channels):
    inbox, port, hook, api = channels
    api.pods_present.add("research/nb-1")
    cfg = config(tmp_path, store, enforce=True, smtp_port=port, webhook=hook.url, kube=api.url)
    cfg.write_text(cfg.read_text() + '\n[collector]\ncluster = "other"\n')
    r = runner_for(cfg, lambda: AS_OF)
    plan = r.plan(store, AS_OF)
    plan.actions = [a for a in plan.actions if a.action == "cancel"]
    (row,) = r.execute(plan, recorder(store))
    assert row["result"] == "failed" and "acts on cluster other only" in row["detail"] and api.deleted == []


# --- the store-level invariant: an action only for a job whose every GPU is idle, with the idle
# time the samples give (since the first idle sample after the last busy one, within the current
# stretch of continuous data: a gap longer than max_gap ends a run, no data is never idle) ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.sampled_from([0.0, 2.0, 50.0, None]), min_size=1, max_size=12), st.integers(0, 12)),
                min_size=1, max_size=3),
       st.integers(0, 3))
def test_store_plan_acts_only_on_all_idle_jobs_with_the_samples_idle_time(tmp_path_factory, series, stale_gpu):
    root = tmp_path_factory.mktemp("prop") / "store"
    f = Fleet(root, cluster="hpc")
    step = timedelta(seconds=15)  # the scrape interval; max_gap is 30 s
    placements, expect_idle = [], []
    for g, (values, gap_at) in enumerate(series):
        uuid = f"GPU-p-{g}"
        times = [AS_OF - step * (len(values) - 1 - i) for i in range(len(values))]
        # samples before gap_at lie 10 minutes further back: a collector outage between them
        times = [t - timedelta(minutes=10) if i < gap_at else t for i, t in enumerate(times)]
        if g == stale_gpu:  # this GPU's newest sample is old: no data now
            times = [t - timedelta(hours=1) for t in times]
        for t, v in zip(times, values):
            f.gpu_series("p1", uuid, t, t + timedelta(seconds=1), util=v, procs=1.0, gpu=g)
        placements.append(("p1", uuid))
        fresh = times[-1] >= AS_OF - timedelta(minutes=5) and values[-1] is not None
        data_from = times[gap_at] if 0 < gap_at < len(times) else times[0]
        busy = [t for t, v in zip(times, values) if v is not None and v >= 5.0]
        after = [t for t, v in zip(times, values) if v is not None and v < 5.0 and (not busy or t > max(busy)) and t >= data_from]
        expect_idle.append(after[0] if fresh and values[-1] < 5.0 and after else None)
    f.job("900", account="nlp", user="u", start=AS_OF - 24 * H, end=None, gpus=len(series), placements=placements)
    f.write()
    rules = Rules(notify_after=timedelta(0), escalate_after=timedelta(0), cancel_after=100 * H, no_process_after=100 * H,
                  renotify_after=H, min_job_age=timedelta(0))
    plan = plan_from_store(open_reader(root), rules, params(), AS_OF)
    if all(e is not None for e in expect_idle):
        (a,) = plan.actions
        assert a.job.idle_gpus == len(series)
        assert a.job.idle_s == min((AS_OF - e).total_seconds() for e in expect_idle)
    else:
        assert plan.actions == []
