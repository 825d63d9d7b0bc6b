"""The idle-GPU policy: which running jobs to warn, escalate or cancel, and why (pure functions).
When nothing is due, the plan names the running job nearest to an action and why it is not due
yet (`Plan.closest`), so "0 actions" is never a bare zero. Options: OPTIONS ([policy] in docs/configuration.md).

Idle is the product's one definition (gpufleet.analytics.fleet_now.gpu_states). A GPU's idle time counts
from `idle_with_data_since`, the start of its current run of below-threshold samples in continuous data:
a gap longer than max_gap ends the run (no data is never idle, so an outage never lengthens idle time;
the dashboard's `idle_since` may reach across a gap). A job is idle when every GPU it holds is; its idle
time is the shortest run among them. A job with any GPU not reporting is neither idle nor busy: no action.

A job opts out with a reason: `gpufleet:exempt=<reason>` in its Slurm comment, or the pod annotation
`gpufleet.io/exempt: <reason>`; a tag without a reason does not exempt (a reason is the price of opting
out). The store keeps no comments: the runner (gpufleet.policy.enforce) reads the tags of the jobs a plan
would act on and passes them in (`comments`); a job whose tag cannot be read is left alone that round.

Rules, highest first: cancel_after, escalate_after, notify_after, no_process_after (notify sooner when no
process at all). A job acted on at a level within renotify_after is not acted on again at that level or
below; a failed action is not done and is planned again at the next evaluation.
"""

from __future__ import annotations

import fnmatch
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Sequence

from gpufleet.analytics import vocabulary as words
from gpufleet.collector.reading import query_rows
from gpufleet.config import ConfigError, Option, boolean, section, string, strings
from gpufleet.times import parse_duration

ACTIONS = ("notify", "escalate", "cancel")  # in escalation order
LEVEL = {a: i for i, a in enumerate(ACTIONS, 1)}

# the reason runs to the end of the text or to a ';'
OPT_OUT_TAG = "gpufleet:exempt"
_OPT_OUT = re.compile(r"gpufleet:exempt\s*=\s*([^;]*)")
POD_ANNOTATION = "gpufleet.io/exempt"  # value: the reason


def _duration(v: Any) -> bool:
    try:
        parse_duration(v)
    except ConfigError:
        return False
    return True


DURATION = "a duration such as \"30m\", \"4h\" or \"2d\""
OPTIONS = (
    Option("enforce", False, "true or false", boolean),
    Option("notify_after", "1h", DURATION, _duration),
    Option("escalate_after", "2h", DURATION, _duration),
    Option("cancel_after", "4h", DURATION, _duration),
    Option("no_process_after", "30m", DURATION, _duration),
    Option("renotify_after", "12h", DURATION, _duration),
    Option("min_job_age", "30m", DURATION, _duration),
    Option("interval", "5m", DURATION, _duration),
    Option("exempt_accounts", [], "a list of account names", strings),
    Option("exempt_partitions", [], "a list of Slurm partition names", strings),
    Option("exempt_namespaces", [], "a list of Kubernetes namespaces", strings),
    Option("exempt_users", [], "a list of user names", strings),
    Option("exempt_job_names", [], "a list of shell patterns for job names, e.g. [\"jupyter-*\"]", strings),
    # where the actions go (gpufleet.policy.enforce); validated here so one pass finds every problem
    Option("email_domain", "", "a mail domain for {user}@domain, or \"\" for none", string),
    Option("email_template", "{user}@{domain}", "a template with {user} (and {domain})", lambda v: isinstance(v, str) and "{user}" in v),
    Option("directory_file", "", "a file of 'user address' lines, or \"\"", string),
    Option("account_contacts", {}, "a table of account -> list of e-mail addresses", lambda v: isinstance(v, dict)),
    Option("webhook_url", "", "an http(s) URL of a Slack-compatible incoming webhook, or \"\"",
           lambda v: isinstance(v, str) and (v == "" or v.startswith(("http://", "https://")))),
    Option("retries", 2, "an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    Option("scancel", "scancel", "the scancel command", lambda v: isinstance(v, str) and bool(v)),
    Option("squeue", "squeue", "the squeue command that reads a job's comment (the opt-out tag), or \"\" not to read comments",
           string),
    Option("efficiency_note_accounts", [], "a list of accounts whose users get a note on each GPU job's efficiency when it ends",
           strings),
    Option("efficiency_note_lookback", "1d", DURATION, _duration),
    Option("kube_api", "", "the Kubernetes API URL, or \"\" for the in-cluster/kubeconfig one", string),
    # lemon nodes (gpufleet.analytics.reliability): drained under the same enforce switch and audit trail
    Option("drain_lemons", True, "true or false (propose draining nodes with improbably many hardware failures)", boolean),
    Option("lemon_window", "7d", DURATION, _duration),
    Option("exempt_nodes", [], "a list of shell patterns for node names never drained, e.g. [\"login*\"]", strings),
    Option("scontrol", "scontrol", "the scontrol command that drains a Slurm node", lambda v: isinstance(v, str) and bool(v)),
    # the recent hardware interruption rate, published for alerts beside the lemon_window's (the baseline)
    Option("interruption_rate_window", "1d", DURATION, _duration),
)


@dataclass(frozen=True)
class Rules:
    enforce: bool = False
    notify_after: timedelta = timedelta(hours=1)
    escalate_after: timedelta = timedelta(hours=2)
    cancel_after: timedelta = timedelta(hours=4)
    no_process_after: timedelta = timedelta(minutes=30)
    renotify_after: timedelta = timedelta(hours=12)
    min_job_age: timedelta = timedelta(minutes=30)
    interval: timedelta = timedelta(minutes=5)
    exempt_accounts: tuple[str, ...] = ()
    exempt_partitions: tuple[str, ...] = ()
    exempt_namespaces: tuple[str, ...] = ()
    exempt_users: tuple[str, ...] = ()
    exempt_job_names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)  # the whole validated section


def load_rules(doc: Mapping[str, Any], path: Any) -> Rules:
    """[policy], validated (ConfigError naming key, value and expectation)."""
    opts = section(doc, "policy", OPTIONS, path)
    where = f"config {path or '(defaults)'} [policy]"
    d = {k: parse_duration(opts[k], f"{where} {k}") for k in
         ("notify_after", "escalate_after", "cancel_after", "no_process_after", "renotify_after", "min_job_age", "interval")}
    problems = []
    if not d["notify_after"] <= d["escalate_after"] <= d["cancel_after"]:
        problems.append(f"{where}: notify_after = {opts['notify_after']!r}, escalate_after = {opts['escalate_after']!r}, "
                        f"cancel_after = {opts['cancel_after']!r}: expected notify_after <= escalate_after <= cancel_after")
    for account, addrs in opts["account_contacts"].items():
        if not (isinstance(addrs, list) and all(isinstance(a, str) and "@" in a for a in addrs)):
            problems.append(f"{where}.account_contacts: {account} = {addrs!r}: expected a list of e-mail addresses")
    if problems:
        raise ConfigError(*problems)
    return Rules(enforce=opts["enforce"], **d,
                 **{k: tuple(opts[k]) for k in ("exempt_accounts", "exempt_partitions", "exempt_namespaces",
                                                 "exempt_users", "exempt_job_names")},
                 options=opts)


@dataclass(frozen=True)
class JobFacts:
    """One running job and the idle figures of the GPUs it holds, as of one moment."""

    cluster: str
    scheduler: str  # slurm | kubernetes
    job_key: str
    job_id: str
    name: str | None
    user_name: str | None
    account: str | None
    partition: str | None  # kubernetes: the namespace
    state: str
    age_s: float | None  # since the scheduler started it
    gpus: int  # GPUs (or MIG instances) it holds
    reporting: int  # of them with a fresh sample
    idle_gpus: int  # of them idle now
    idle_s: float | None  # every GPU idle this long (the shortest run); None unless all are idle
    no_process_s: float | None  # every GPU without a compute process this long; None unless all
    comment: str | None = None  # Slurm comment / pod annotation value (the opt-out tag)


@dataclass(frozen=True)
class Action:
    action: str  # notify | escalate | cancel
    rule: str  # the [policy] key that planned it
    reason: str
    job: JobFacts

    def as_dict(self) -> dict[str, Any]:
        j = self.job
        return {"action": self.action, "job_key": j.job_key, "job_id": j.job_id, "cluster": j.cluster,
                "scheduler": j.scheduler, "user": j.user_name, "account": j.account, "job_state": j.state,
                "idle_s": j.idle_s, "idle_gpus": j.idle_gpus, "rule": self.rule, "reason": self.reason,
                "job_name": j.name, "gpus": j.gpus}


@dataclass(frozen=True)
class Exemption:
    rule: str
    reason: str
    job: JobFacts

    def as_dict(self) -> dict[str, Any]:
        j = self.job
        return {"job_key": j.job_key, "job_id": j.job_id, "cluster": j.cluster, "scheduler": j.scheduler,
                "user": j.user_name, "account": j.account, "rule": self.rule, "reason": self.reason}


@dataclass(frozen=True)
class Done:
    """A past audit row as the planner needs it."""

    ts: datetime
    cluster: str
    scheduler: str
    job_key: str
    action: str
    result: str  # ok | failed | dry-run | logged


@dataclass(frozen=True)
class NotYet:
    """When nothing is due: the running job nearest to an action, and why it is not due yet."""

    job: JobFacts
    rule: str | None  # the [policy] key it waits for; None: it waits for every GPU to be idle (or reporting)
    idle_since: datetime | None  # when its idle count started (every GPU idle since), None unless all are idle
    due_at: datetime | None  # when `rule` is due if nothing changes; None: no rule is counting yet
    reason: str

    def as_dict(self) -> dict[str, Any]:
        j = self.job
        return {"job_key": j.job_key, "job_id": j.job_id, "cluster": j.cluster, "scheduler": j.scheduler, "user": j.user_name,
                "account": j.account, "gpus": j.gpus, "idle_gpus": j.idle_gpus, "reporting_gpus": j.reporting, "idle_s": j.idle_s,
                "idle_since": None if self.idle_since is None else self.idle_since.isoformat(), "rule": self.rule,
                "due_at": None if self.due_at is None else self.due_at.isoformat(), "reason": self.reason}


@dataclass
class Plan:
    as_of: datetime
    enforce: bool
    actions: list[Action] = field(default_factory=list)
    exempt: list[Exemption] = field(default_factory=list)
    suppressed: list[Action] = field(default_factory=list)  # due, but done within renotify_after
    # set when no action is planned (None: no running GPU job)
    closest: NotYet | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"as_of": self.as_of.isoformat(), "enforce": self.enforce,
                "actions": [a.as_dict() for a in self.actions], "exempt": [e.as_dict() for e in self.exempt],
                "suppressed": [a.as_dict() for a in self.suppressed],
                "closest": None if self.closest is None else self.closest.as_dict()}


def opt_out_reason(comment: str | None) -> str | None:
    """The reason of a `gpufleet:exempt=<reason>` tag; None without a tag or without a reason."""
    if not comment:
        return None
    m = _OPT_OUT.search(comment)
    reason = m.group(1).strip() if m else ""
    return reason or None


def exemption(job: JobFacts, rules: Rules) -> tuple[str, str] | None:
    """(rule, reason) when a rule exempts the job, else None."""
    if job.account is not None and job.account in rules.exempt_accounts:
        return "exempt_accounts", f"account {job.account} is exempt"
    if job.scheduler == "kubernetes":
        if job.partition is not None and job.partition in rules.exempt_namespaces:
            return "exempt_namespaces", f"namespace {job.partition} is exempt"
    elif job.partition is not None and job.partition in rules.exempt_partitions:
        return "exempt_partitions", f"partition {job.partition} is exempt"
    if job.user_name is not None and job.user_name in rules.exempt_users:
        return "exempt_users", f"user {job.user_name} is exempt"
    for pattern in rules.exempt_job_names:
        if job.name is not None and fnmatch.fnmatchcase(job.name, pattern):
            return "exempt_job_names", f"job name matches {pattern!r}"
    reason = opt_out_reason(job.comment)
    if reason is not None:
        where = "pod annotation" if job.scheduler == "kubernetes" else "job comment"
        return "opt_out", f"opted out in its {where}: {reason}"
    return None


def due(job: JobFacts, rules: Rules) -> tuple[str, str, str] | None:
    """(action, rule, reason) the job's idle figures call for, ignoring exemptions and history."""
    if job.state != "RUNNING" or job.gpus <= 0 or job.reporting < job.gpus or job.idle_gpus < job.gpus:
        return None  # not running, holds nothing known, not every GPU reporting, or busy
    if job.age_s is None or job.age_s < rules.min_job_age.total_seconds():
        return None
    idle = job.idle_s
    if idle is None:
        return None
    figures = f"all {words.quantity(job.gpus, 'GPU')} idle for {words.duration(idle)}"
    if idle >= rules.cancel_after.total_seconds():
        return "cancel", "cancel_after", f"{figures} (cancel_after = {words.duration(rules.cancel_after.total_seconds())})"
    if idle >= rules.escalate_after.total_seconds():
        return "escalate", "escalate_after", f"{figures} (escalate_after = {words.duration(rules.escalate_after.total_seconds())})"
    if idle >= rules.notify_after.total_seconds():
        return "notify", "notify_after", f"{figures} (notify_after = {words.duration(rules.notify_after.total_seconds())})"
    np_s = job.no_process_s
    if np_s is not None and np_s >= rules.no_process_after.total_seconds():
        return "notify", "no_process_after", (f"{figures}, no process on any of them for {words.duration(np_s)} "
                                             f"(no_process_after = {words.duration(rules.no_process_after.total_seconds())})")
    return None


def not_yet(job: JobFacts, rules: Rules, as_of: datetime) -> NotYet | None:
    """Why a running GPU job with nothing due is not due yet: the rule it waits for and when that comes
    due if nothing changes, or what keeps every rule from counting. None unless running with GPUs."""
    if job.state != "RUNNING" or job.gpus <= 0:
        return None
    n = words.quantity(job.gpus, "GPU")
    if job.reporting < job.gpus:
        return NotYet(job, None, None, None, f"{job.gpus - job.reporting} of its {n} not reporting (a GPU without fresh data is "
                                             "neither idle nor busy): no rule counts until every GPU reports")
    if job.idle_s is None:
        return NotYet(job, None, None, None, f"{job.gpus - job.idle_gpus} of its {n} busy: no rule counts until every GPU is idle")
    since = as_of - timedelta(seconds=job.idle_s)
    waits = [(since + rules.notify_after, "notify_after", rules.notify_after)]
    if job.no_process_s is not None:
        waits.append((as_of - timedelta(seconds=job.no_process_s) + rules.no_process_after, "no_process_after", rules.no_process_after))
    due_at, rule, after = min(waits, key=lambda w: w[0])
    text = (f"all {n} idle since {words.instant(since)} ({words.duration(job.idle_s)}; the count starts at the GPUs' current "
            f"run of idle samples, and a gap in the data longer than max_gap restarts it): {rule} = {words.duration(after.total_seconds())}")
    if job.age_s is not None and as_of - timedelta(seconds=job.age_s) + rules.min_job_age > due_at:
        due_at = as_of - timedelta(seconds=job.age_s) + rules.min_job_age
        text += f", and the job is younger than min_job_age = {words.duration(rules.min_job_age.total_seconds())}"
    return NotYet(job, rule, since, due_at, f"{text}: due at {words.instant(due_at)} "
                                            f"(in {words.duration(max(0.0, (due_at - as_of).total_seconds()))})")


def closest(jobs: Iterable[JobFacts], rules: Rules, as_of: datetime) -> NotYet | None:
    """The running GPU job nearest to an action that due() gives nothing for: the earliest to come
    due among those whose GPUs are all idle, else the one with the largest share of its GPUs idle."""
    waiting = [w for w in (not_yet(j, rules, as_of) for j in jobs if due(j, rules) is None) if w is not None]
    if not waiting:
        return None
    return min(waiting, key=lambda w: (w.due_at is None, w.due_at or as_of, -w.job.idle_gpus / w.job.gpus,
                                       w.job.cluster, w.job.scheduler, w.job.job_key))


def _recent(history: Iterable[Done], as_of: datetime, window: timedelta) -> dict[tuple[str, str, str], int]:
    """(cluster, scheduler, job_key) -> the highest action level done (result ok) within window."""
    out: dict[tuple[str, str, str], int] = {}
    for h in history:
        if h.result == "ok" and h.action in LEVEL and as_of - window < h.ts <= as_of:
            k = (h.cluster, h.scheduler, h.job_key)
            out[k] = max(out.get(k, 0), LEVEL[h.action])
    return out


def evaluate(jobs: Iterable[JobFacts], rules: Rules, history: Iterable[Done], as_of: datetime) -> Plan:
    """The plan at `as_of`: per job at most the highest rule due, exemptions with their reasons, and actions
    done (result ok) at that level or above within renotify_after, suppressed; failures never suppress."""
    plan = Plan(as_of=as_of, enforce=rules.enforce)
    recent = _recent(history, as_of, rules.renotify_after)
    jobs = sorted(jobs, key=lambda j: (j.cluster, j.scheduler, j.job_key))
    for job in jobs:
        d = due(job, rules)
        if d is None:
            continue
        ex = exemption(job, rules)
        if ex is not None:
            plan.exempt.append(Exemption(ex[0], ex[1], job))
            continue
        action = Action(d[0], d[1], d[2], job)
        done = recent.get((job.cluster, job.scheduler, job.job_key), 0)
        (plan.suppressed if done >= LEVEL[action.action] else plan.actions).append(action)
    if not plan.actions:
        plan.closest = closest(jobs, rules, as_of)
    return plan


# --- from the store ---

def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def job_facts(running: list[Mapping[str, Any]], states: list[Mapping[str, Any]], as_of: datetime,
              comments: Mapping[tuple[str, str, str], str] | None = None) -> list[JobFacts]:
    """JobFacts from POLICY_RUNNING_GPUS rows (one per job and GPU) and gpu_states() rows."""
    by_gpu = {(s["cluster"], s["host"], s["gpu_uuid"], s["gi"]): s for s in states}
    jobs: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in running:
        jobs.setdefault((r["cluster"], r["scheduler"], r["job_key"]), []).append(r)
    out = []
    for key, rows in jobs.items():
        first = rows[0]
        gpus = [by_gpu.get((r["cluster"], r["host"], r["gpu_uuid"], r["gi"])) for r in rows if r["gpu_uuid"] is not None]
        fresh = [g for g in gpus if g is not None and g["fresh"] and g["util"] is not None]
        idle = [g for g in fresh if g["idle_with_data_since"] is not None]
        all_idle = bool(gpus) and len(idle) == len(gpus)
        idle_s = min((as_of - g["idle_with_data_since"]).total_seconds() for g in idle) if all_idle else None
        noproc = [g for g in fresh if g.get("no_process_with_data_since") is not None]
        np_s = (min((as_of - g["no_process_with_data_since"]).total_seconds() for g in noproc)
                if gpus and len(noproc) == len(gpus) else None)
        start = first["start"]
        out.append(JobFacts(
            cluster=first["cluster"], scheduler=first["scheduler"], job_key=first["job_key"], job_id=first["job_id"],
            name=first["name"], user_name=first["user_name"], account=first["account"], partition=first["partition"],
            state=first["state"], age_s=(as_of - start).total_seconds() if start is not None else None,
            gpus=len(gpus), reporting=len(fresh), idle_gpus=len(idle), idle_s=_f(idle_s), no_process_s=_f(np_s),
            comment=(comments or {}).get(key, first.get("comment")),
        ))
    return out


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is evaluated from, read once (read_plan_inputs): the running jobs' GPUs, their
    gpu_states() rows and the audit trail within renotify_after."""
    running: list[dict[str, Any]]
    states: list[dict[str, Any]]
    done: list[Done]


def read_plan_inputs(con: Any, rules: Rules, params: Any, as_of: datetime) -> PlanInputs:
    """The plan's inputs over a reader connection (gpufleet.collector.store.open_reader)."""
    from gpufleet.analytics import sql
    from gpufleet.analytics.fleet_now import gpu_states

    lookback = max(rules.cancel_after, rules.renotify_after) + timedelta(hours=1)
    states = gpu_states(con, params, as_of, lookback=lookback).to_dicts()
    cur = con.cursor()
    try:
        running = query_rows(cur, sql.POLICY_RUNNING_GPUS, {"as_of": as_of}).to_pylist()
        history = query_rows(cur, sql.POLICY_AUDIT, {"as_of": as_of, "since": as_of - rules.renotify_after}).to_pylist()
    finally:
        cur.close()
    return PlanInputs(running, states, [Done(h["ts"], h["cluster"], h["scheduler"], h["job_key"], h["action"], h["result"]) for h in history])


def plan_of(inputs: PlanInputs, rules: Rules, as_of: datetime, comments: Mapping[tuple[str, str, str], str] | None = None) -> Plan:
    """The plan from its inputs and the jobs' opt-out `comments` where read, so the runner can plan again
    with the tags of the jobs a first plan would act on without reading the store again."""
    return evaluate(job_facts(inputs.running, inputs.states, as_of, comments), rules, inputs.done, as_of)


def plan_from_store(con: Any, rules: Rules, params: Any, as_of: datetime, *,
                    comments: Mapping[tuple[str, str, str], str] | None = None) -> Plan:
    """The plan over a reader connection (gpufleet.collector.store.open_reader)."""
    return plan_of(read_plan_inputs(con, rules, params, as_of), rules, as_of, comments)


def audit(con: Any, since: datetime, as_of: datetime) -> Any:
    """The audit trail in (since, as_of], newest first (a polars DataFrame)."""
    import polars as pl

    from gpufleet.analytics import sql

    cur = con.cursor()
    try:
        return pl.from_arrow(query_rows(cur, sql.POLICY_AUDIT, {"since": since, "as_of": as_of}))
    finally:
        cur.close()


def failing(con: Any) -> Any:
    """Actions whose latest attempt failed, with the job's state now (a polars DataFrame); those
    of running jobs are planned again at the next evaluation."""
    import polars as pl

    from gpufleet.analytics import sql

    cur = con.cursor()
    try:
        return pl.from_arrow(query_rows(cur, sql.POLICY_FAILING))
    finally:
        cur.close()


def plan_frame(plan: Plan) -> Any:
    """The plan's actions as a polars DataFrame (the JSON's columns), for tables."""
    import polars as pl

    cols = ("action", "job_key", "job_id", "cluster", "scheduler", "user", "account", "job_state", "idle_s", "idle_gpus",
            "rule", "reason")
    rows = [{c: a.as_dict()[c] for c in cols} for a in plan.actions]
    return pl.DataFrame(rows, schema={c: (pl.Float64 if c == "idle_s" else pl.Int64 if c == "idle_gpus" else pl.Utf8) for c in cols})


# --- the efficiency note at a job's end (opt-in per account) ---


NOTE_WORKERS = 2  # efficiency_notes' analyses run at once
NOTE_BATCH = 500  # jobs in one of efficiency_notes' analyses at most (a first round after a day's stop notes a day's jobs)


def efficiency_notes(con: Any, params: Any, accounts: Sequence[str], since: datetime, as_of: datetime) -> list[dict[str, Any]]:
    """For each GPU job of `accounts` that ended in (since, as_of] with no note sent yet: its figures from
    gpufleet.analytics.jobs.job_list over the job's own span, in the jobs' order.

    A round's jobs of one cluster are one analysis (NOTE_BATCH at most), its window from the earliest start to the latest
    end, filtered to their keys: a job's figures depend only on its allocations, which lie inside its own span, so a wider
    window gives the same figures (tests/test_policy_actions.py holds them to each job's own analysis) and the round reads
    the store's tables once, not once a job. A job requeued after an earlier attempt is analysed alone: the attempt's
    allocations lie before its record's start, inside the others' window but not inside its own span."""
    from gpufleet.analytics import sql

    if not accounts:
        return []
    cur = con.cursor()
    try:
        ended = query_rows(cur, sql.POLICY_ENDED_JOBS, {"since": since, "as_of": as_of, "accounts": list(accounts)}).to_pylist()
    finally:
        cur.close()
    batches: list[list[dict[str, Any]]] = []
    filling: dict[str, list[dict[str, Any]]] = {}  # cluster -> its batch being filled
    for j in ended:  # (by end: a batch's jobs ended near each other)
        if j["requeued"]:
            batches.append([j])
            continue
        batch = filling.get(j["cluster"])
        if batch is None or len(batch) == NOTE_BATCH:
            batch = filling[j["cluster"]] = []
            batches.append(batch)
        batch.append(j)
    # NOTE_WORKERS analyses at a time, each on a cursor of its own (made on the caller's thread, as `gpufleet analyze`
    # makes its previous window's)
    curs = [con.cursor() for _ in batches]
    try:
        with ThreadPoolExecutor(NOTE_WORKERS, thread_name_prefix="efficiency-note") as pool:
            found = [n for ns in pool.map(lambda js, c: _notes_of(js, c, params, as_of), batches, curs) for n in ns]
    finally:
        for c in curs:
            c.close()
    by_job = {(n["cluster"], n["scheduler"], n["job_key"]): n for n in found}
    return [by_job[k] for j in ended if (k := (j["cluster"], j["scheduler"], j["job_key"])) in by_job]


def _notes_of(jobs: list[dict[str, Any]], cur: Any, params: Any, as_of: datetime) -> list[dict[str, Any]]:
    """The notes of `jobs` (of one cluster) from one analysis over their spans, filtered to their keys: the job's own GPUs,
    as the job page reads them, not its account's."""
    from dataclasses import replace

    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.jobs import job_summaries, rule
    from gpufleet.analytics.params import Filters

    p = replace(params, start=min(j["start"] for j in jobs), end=max(j["end"] for j in jobs),
                filters=Filters(cluster=jobs[0]["cluster"], job_key=tuple(sorted({j["job_key"] for j in jobs}))))
    a = Analysis(cur, p, now=as_of)
    try:
        summaries = job_summaries(a)
        rows = {(r["cluster"], r["scheduler"], r["job_key"]): r for r in summaries.iter_rows(named=True)}
        out = []
        for j in jobs:
            r = rows.get((j["cluster"], j["scheduler"], j["job_key"]))
            if r is None:
                continue
            note = {k: v for k, v in j.items() if k != "requeued"}
            out.append({**note, "gpus": r.get("gpus"), "runtime_h": r["runtime_h"], "allocated_gpu_h": r["allocated_gpu_h"],
                        "mean_utilization_pct": r["mean_utilization_pct"], "idle_gpu_h": r["idle_gpu_h"],
                        "no_process_gpu_h": r["no_process_gpu_h"], "fb_used_max_mib": r["fb_used_max_mib"],
                        "verdict": r["verdict"], "rule": rule(r["verdict"], r, a)})
        return out
    finally:
        a.con.close()  # the analysis' temporary tables go with its cursor
