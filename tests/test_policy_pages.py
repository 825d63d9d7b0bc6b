"""The idle-GPU policy on the dashboard: planned and past actions on the Jobs page, failing
actions on the Health page (streamlit.testing's AppTest over a real store)."""

from __future__ import annotations

from datetime import timedelta
import pytest

pytest.importorskip("streamlit")  # the [dashboards] extra, like tests/test_dashboard_pages.py

from gpufleet.collector.store import StoreWriter  # noqa: E402
from gpufleet.times import utcnow  # noqa: E402
from tests import test_policy_actions as tpa  # noqa: E402
from tests.test_dashboard_pages import APP, AppTest, clean, frame, goto, opened  # noqa: E402


def test_jobs_and_health_pages_show_the_policy(tmp_path, monkeypatch):
    now = utcnow().replace(microsecond=0)
    monkeypatch.setattr(tpa, "AS_OF", now)
    root = tmp_path / "store"
    tpa.build(root)
    w = StoreWriter(root)
    w.record_policy([
        {"ts": now - timedelta(minutes=10), "cluster": "hpc", "scheduler": "slurm", "job_key": "102", "job_id": "102",
         "user_name": "carol", "account": "vision", "action": "notify", "rule": "notify_after", "reason": "all 1 GPU idle",
         "idle_s": 4800.0, "idle_gpus": 1, "enforce": True, "result": "ok", "detail": "mailed carol@example.org", "attempt": 1},
        {"ts": now - timedelta(minutes=9), "cluster": "hpc", "scheduler": "slurm", "job_key": "101", "job_id": "101",
         "user_name": "alice", "account": "nlp", "action": "cancel", "rule": "cancel_after", "reason": "all 2 GPUs idle",
         "idle_s": 17460.0, "idle_gpus": 2, "enforce": True, "result": "failed", "detail": "scancel: exit 1", "attempt": 3},
    ])
    w.publish()
    w.close()
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text('[policy]\nnotify_after = "1h"\nescalate_after = "2h"\ncancel_after = "4h"\nexempt_accounts = ["ops"]\n')
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.setenv("GPUFLEET_CONFIG", str(cfg))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"from": (now - timedelta(hours=2)).isoformat(timespec="minutes"),
                            "to": (now + timedelta(minutes=1)).isoformat(timespec="minutes")})
    at = clean(at.run())
    goto(at, "jobs")
    # enforce unset: the page says that the plan is a plan and why nothing was done on its account
    assert any(c.value.startswith("The policy only plans (enforce = false in [policy]): nothing its plan lists is mailed, cancelled or drained.")
               for c in at.caption), [c.value for c in at.caption]
    # the plan (every GPU's state over the rules' look-back) is evaluated once asked for
    with pytest.raises(KeyError):
        at.container("policy_planned")
    planned = frame(opened(at, "policy_planned"), "policy_planned")
    # 102 was notified 10 minutes ago (the audit row above): not planned again inside renotify_after
    assert dict(zip(planned["job_id"], planned["action"])) == {"101": "cancel", "research/nb-1": "escalate"}
    past = frame(at, "policy_past")
    # (a job key that only repeats its id is not shown)
    assert list(past["job_id"]) == ["101", "102"] and list(past["result"]) == ["failed", "ok"] and "job_key" not in past.columns
    goto(at, "health")
    failing = frame(at, "health_policy_failing")
    assert list(failing["job_id"]) == ["101"] and list(failing["attempt"]) == [3]


def test_jobs_page_with_nothing_due_names_the_closest_job(tmp_path, monkeypatch):
    """Issue #53.9: no action due - the Jobs page says which job is nearest to one and why not yet."""
    now = utcnow().replace(microsecond=0)
    monkeypatch.setattr(tpa, "AS_OF", now)
    root = tmp_path / "store"
    tpa.build(root)
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text('[policy]\nenforce = true\nnotify_after = "6h"\nescalate_after = "7h"\ncancel_after = "8h"\nno_process_after = "6h"\n'
                   'exempt_accounts = ["ops"]\n')
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.setenv("GPUFLEET_CONFIG", str(cfg))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"from": (now - timedelta(hours=2)).isoformat(timespec="minutes"),
                            "to": (now + timedelta(minutes=1)).isoformat(timespec="minutes")})
    at = goto(clean(at.run()), "jobs")
    assert any(c.value.startswith("The policy acts (enforce = true): the collector's policy round carries out what its plan lists.")
               for c in at.caption), [c.value for c in at.caption]
    assert "The policy did nothing in this window." in [c.value for c in at.container("policy_past").caption]
    said = [c.value for c in opened(at, "policy_planned").container("policy_planned").caption]
    assert any(c.startswith("No running job is due for a notification or a cancel. Closest: job 101 (hpc, nlp): all 2 GPUs idle since ")
               and "notify_after = 6 h: due at " in c for c in said), said
