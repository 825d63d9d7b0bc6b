"""The idle-GPU policy's rule evaluation (gpufleet.analytics.policy): examples and invariants."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.analytics.policy import (
    Done, JobFacts, Rules, closest, evaluate, exemption, load_rules, opt_out_reason,
)
from gpufleet.config import ConfigError

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
H = 3600.0


def job(**kw) -> JobFacts:
    base = dict(cluster="hpc", scheduler="slurm", job_key="101", job_id="101", name="train", user_name="alice",
                account="nlp", partition="train", state="RUNNING", age_s=10 * H, gpus=4, reporting=4, idle_gpus=4,
                idle_s=2.5 * H, no_process_s=None, comment=None)
    base.update(kw)
    return JobFacts(**base)


RULES = Rules(notify_after=timedelta(hours=1), escalate_after=timedelta(hours=2), cancel_after=timedelta(hours=4),
              no_process_after=timedelta(minutes=30), renotify_after=timedelta(hours=12), min_job_age=timedelta(minutes=30))


def test_levels_and_reasons_name_the_rule_and_figures():
    plan = evaluate([job(job_key="a", idle_s=1.5 * H), job(job_key="b", idle_s=2.5 * H), job(job_key="c", idle_s=5 * H),
                     job(job_key="d", idle_s=0.2 * H), job(job_key="e", idle_s=0.7 * H, no_process_s=0.6 * H)], RULES, [], AS_OF)
    got = {a.job.job_key: (a.action, a.rule) for a in plan.actions}
    assert got == {"a": ("notify", "notify_after"), "b": ("escalate", "escalate_after"), "c": ("cancel", "cancel_after"),
                   "e": ("notify", "no_process_after")}
    c = next(a for a in plan.actions if a.job.job_key == "c")
    assert "all 4 GPUs idle for 5 h" in c.reason and "cancel_after" in c.reason
    d = c.as_dict()
    assert set(d) >= {"action", "job_key", "job_id", "cluster", "scheduler", "user", "account", "job_state", "idle_s",
                      "idle_gpus", "rule", "reason"}
    assert d["idle_s"] == 5 * H and d["idle_gpus"] == 4 and d["user"] == "alice" and d["job_state"] == "RUNNING"


def test_busy_partly_idle_or_unreported_jobs_are_left_alone():
    plan = evaluate([job(job_key="busy", idle_gpus=0, idle_s=None), job(job_key="half", idle_gpus=2, idle_s=None),
                     job(job_key="nodata", reporting=3, idle_gpus=3, idle_s=None), job(job_key="young", age_s=600),
                     job(job_key="pending", state="PENDING")], RULES, [], AS_OF)
    assert plan.actions == [] and plan.exempt == []


def test_exemptions_and_opt_out_are_reported_with_reasons():
    rules = Rules(**{**RULES.__dict__, "exempt_accounts": ("ops",), "exempt_namespaces": ("inference-prod",),
                     "exempt_partitions": ("interactive",), "exempt_users": ("bob",), "exempt_job_names": ("jupyter-*",)})
    plan = evaluate([
        job(job_key="1", account="ops"), job(job_key="2", scheduler="kubernetes", partition="inference-prod"),
        job(job_key="3", partition="interactive"), job(job_key="4", user_name="bob"), job(job_key="5", name="jupyter-alice"),
        job(job_key="6", comment="gpufleet:exempt=benchmark waits on I/O; other text"),
        job(job_key="7", comment="gpufleet:exempt="),  # no reason: not exempt
        job(job_key="8", scheduler="slurm", partition="inference-prod"),  # a namespace exemption is for pods
    ], rules, [], AS_OF)
    ex = {e.job.job_key: e.rule for e in plan.exempt}
    assert ex == {"1": "exempt_accounts", "2": "exempt_namespaces", "3": "exempt_partitions", "4": "exempt_users",
                  "5": "exempt_job_names", "6": "opt_out"}
    assert {a.job.job_key for a in plan.actions} == {"7", "8"}
    assert next(e for e in plan.exempt if e.job.job_key == "6").reason == "opted out in its job comment: benchmark waits on I/O"


def test_renotify_window_suppresses_and_failures_do_not():
    j = job(idle_s=1.5 * H)
    notified = Done(AS_OF - timedelta(hours=1), "hpc", "slurm", "101", "notify", "ok")
    assert evaluate([j], RULES, [notified], AS_OF).actions == []
    assert len(evaluate([j], RULES, [notified], AS_OF).suppressed) == 1
    old = Done(AS_OF - timedelta(hours=13), "hpc", "slurm", "101", "notify", "ok")
    assert len(evaluate([j], RULES, [old], AS_OF).actions) == 1
    failed = Done(AS_OF - timedelta(minutes=5), "hpc", "slurm", "101", "notify", "failed")
    dry = Done(AS_OF - timedelta(minutes=5), "hpc", "slurm", "101", "notify", "dry-run")
    assert len(evaluate([j], RULES, [failed, dry], AS_OF).actions) == 1
    # a notification does not hold back the escalation
    assert [a.action for a in evaluate([job(idle_s=2.5 * H)], RULES, [notified], AS_OF).actions] == ["escalate"]


def test_config_is_validated_with_key_and_value():
    r = load_rules({"policy": {"notify_after": "30m", "cancel_after": "1d", "exempt_users": ["x"]}}, "p.toml")
    assert r.notify_after == timedelta(minutes=30) and r.cancel_after == timedelta(days=1) and not r.enforce
    with pytest.raises(ConfigError) as e:
        load_rules({"policy": {"notify_after": "soon", "enforce": "yes", "bogus": 1}}, "p.toml")
    text = str(e.value)
    assert "notify_after = 'soon'" in text and "enforce = 'yes'" in text and "unknown key 'bogus'" in text
    with pytest.raises(ConfigError, match="notify_after <= escalate_after <= cancel_after"):
        load_rules({"policy": {"notify_after": "5h"}}, "p.toml")


def test_opt_out_reason():
    assert opt_out_reason("gpufleet:exempt = long eval") == "long eval"
    assert opt_out_reason("nothing here") is None and opt_out_reason(None) is None


# --- invariants ---

names = st.sampled_from(["train", "jupyter-x", "eval", "bench"])
jobs_st = st.builds(
    job,
    job_key=st.text("abc123", min_size=1, max_size=4),
    scheduler=st.sampled_from(["slurm", "kubernetes"]),
    name=names, user_name=st.sampled_from(["alice", "bob", None]), account=st.sampled_from(["nlp", "ops", None]),
    partition=st.sampled_from(["train", "interactive", "research"]),
    state=st.sampled_from(["RUNNING", "RUNNING", "PENDING", "COMPLETED"]),
    age_s=st.one_of(st.none(), st.floats(0, 48 * H)),
    gpus=st.integers(0, 8), reporting=st.integers(0, 8), idle_gpus=st.integers(0, 8),
    idle_s=st.one_of(st.none(), st.floats(0, 48 * H)), no_process_s=st.one_of(st.none(), st.floats(0, 48 * H)),
    comment=st.sampled_from([None, "", "gpufleet:exempt=why", "gpufleet:exempt="]),
)
hours = st.floats(0, 24).map(lambda h: timedelta(hours=h))


@st.composite
def rules_st(draw):
    a, b, c = sorted(draw(st.lists(hours, min_size=3, max_size=3)))
    return Rules(notify_after=a, escalate_after=b, cancel_after=c, no_process_after=draw(hours),
                 renotify_after=draw(hours), min_job_age=draw(hours),
                 exempt_accounts=tuple(draw(st.sets(st.sampled_from(["nlp", "ops"])))),
                 exempt_partitions=tuple(draw(st.sets(st.sampled_from(["interactive", "train"])))),
                 exempt_namespaces=tuple(draw(st.sets(st.sampled_from(["research"])))),
                 exempt_users=tuple(draw(st.sets(st.sampled_from(["bob"])))),
                 exempt_job_names=tuple(draw(st.sets(st.sampled_from(["jupyter-*", "b*"])))))


history_st = st.lists(st.builds(Done, ts=st.floats(0, 30 * H).map(lambda s: AS_OF - timedelta(seconds=s)),
                                cluster=st.just("hpc"), scheduler=st.sampled_from(["slurm", "kubernetes"]),
                                job_key=st.text("abc123", min_size=1, max_size=4),
                                action=st.sampled_from(["notify", "escalate", "cancel"]),
                                result=st.sampled_from(["ok", "failed", "dry-run"])), max_size=10)


@settings(max_examples=300, deadline=None)
@given(st.lists(jobs_st, max_size=12), rules_st(), history_st)
def test_invariants(jobs, rules, history):
    plan = evaluate(jobs, rules, history, AS_OF)
    for a in plan.actions:
        j = a.job
        assert exemption(j, rules) is None, "never an action for an exempt job"
        assert j.state == "RUNNING" and j.gpus > 0 and j.idle_gpus >= j.gpus and j.reporting >= j.gpus, "never a busy job"
        assert j.age_s is not None and j.age_s >= rules.min_job_age.total_seconds(), "never before min_job_age"
        assert j.idle_s is not None
        if a.action == "cancel":
            assert j.idle_s >= rules.cancel_after.total_seconds(), "cancel only after cancel_after"
        if a.action == "escalate":
            assert j.idle_s >= rules.escalate_after.total_seconds()
        assert a.rule in a.reason and a.reason
        # nothing done successfully at this level or above within renotify_after
        for h in history:
            if (h.scheduler, h.job_key) == (j.scheduler, j.job_key) and h.result == "ok" and h.ts > AS_OF - rules.renotify_after:
                assert ["notify", "escalate", "cancel"].index(h.action) < ["notify", "escalate", "cancel"].index(a.action)
    keys = [(a.job.cluster, a.job.scheduler, a.job.job_key) for a in plan.actions]
    assert len(keys) == len(set(keys)) or len({id(a.job) for a in plan.actions}) == len(plan.actions)
    for e in plan.exempt:
        assert exemption(e.job, rules) is not None


def test_nothing_due_names_the_closest_job_and_why_it_is_not_due():
    """Issue #53.9: "0 actions" is never a bare zero. The job nearest to an action is the earliest
    to come due among those whose GPUs are all idle: when its idle count started, the rule it
    waits for and when that comes due."""
    busy = job(job_key="busy", idle_gpus=3, idle_s=None)
    soon = job(job_key="soon", idle_s=50 * 60)  # notify_after 1h: due in 10 min
    later = job(job_key="later", idle_s=10 * 60)
    plan = evaluate([busy, later, soon], RULES, [], AS_OF)
    assert plan.actions == [] and plan.closest is not None
    c = plan.closest
    assert (c.job.job_key, c.rule, c.idle_since, c.due_at) == ("soon", "notify_after", AS_OF - timedelta(minutes=50),
                                                               AS_OF + timedelta(minutes=10))
    assert c.reason == ("all 4 GPUs idle since 2026-11-20 11:10:00 UTC (50 min; the count starts at the GPUs' current run of idle "
                        "samples, and a gap in the data longer than max_gap restarts it): notify_after = 1 h: "
                        "due at 2026-11-20 12:10:00 UTC (in 10 min)")
    d = plan.as_dict()["closest"]
    assert (d["job_key"], d["rule"], d["idle_since"], d["due_at"]) == ("soon", "notify_after", "2026-11-20T11:10:00", "2026-11-20T12:10:00")
    # no process on any GPU: no_process_after (30m) comes due sooner than notify_after
    np_ = closest([job(idle_s=20 * 60, no_process_s=25 * 60)], RULES, AS_OF)
    assert (np_.rule, np_.due_at) == ("no_process_after", AS_OF + timedelta(minutes=5))
    # a young job waits for min_job_age too
    from dataclasses import replace

    young = closest([job(idle_s=10 * 60, no_process_s=10 * 60, age_s=10 * 60)], replace(RULES, min_job_age=timedelta(minutes=45)), AS_OF)
    assert young.due_at == AS_OF + timedelta(minutes=35) and "younger than min_job_age = 45 min: due at 2026-11-20 12:35:00" in young.reason
    # none all idle: the one with the most of its GPUs idle, and what keeps every rule from counting
    part = closest([busy, job(job_key="half", idle_gpus=2, idle_s=None)], RULES, AS_OF)
    assert (part.job.job_key, part.rule, part.due_at) == ("busy", None, None)
    assert part.reason == "1 of its 4 GPUs busy: no rule counts until every GPU is idle"
    dark = closest([job(reporting=3, idle_gpus=3, idle_s=None)], RULES, AS_OF)
    assert dark.reason.startswith("1 of its 4 GPUs not reporting")
    # no running GPU job: nothing to name; and a plan with actions names none
    assert closest([job(state="COMPLETED")], RULES, AS_OF) is None and evaluate([], RULES, [], AS_OF).as_dict()["closest"] is None
    assert evaluate([job(idle_s=5 * H), soon], RULES, [], AS_OF).closest is None


def test_the_plan_table_s_columns_are_as_wide_as_their_longest_value():
    """A pod's name is longer than a Slurm job id: the table's columns widen to it, so every row's user starts at one column
    (`k8s/ctr-train-f2bd5` pushed its row's columns one place right)."""
    from types import SimpleNamespace as NS

    from gpufleet.policy.cli import _table

    def action(cluster, job_id, user):
        job = NS(cluster=cluster, job_id=job_id, user_name=user, account="acct", idle_gpus=1, gpus=1, idle_s=3600.0, name="n")
        return NS(job=job, action="notify", rule="notify_after", reason="idle")

    plan = NS(as_of=datetime(2026, 12, 6, 12), enforce=False, actions=[action("hpc", "4831", "ann"), action("k8s", "ctr-train-f2bd5-long", "bo")],
              exempt=[], suppressed=[], closest=None)
    rows = _table(plan, acting=False).splitlines()[1:]
    assert len({row.index(user) for row, user in zip(rows, ("ann", "bo"))}) == 1, rows
