"""The idle-GPU policy's actions: mail, webhook, scancel, pod deletion, and their audit trail.

    runner = Runner.from_config(doc, path)               # validates [policy] (and [report.smtp])
    plan = runner.plan(store_root, as_of)                # gpufleet.analytics.policy over a reader
    rows = runner.execute(plan, record)                  # acts only when [policy] enforce = true

The plan is gpufleet.analytics.policy's; this module carries it out, since it sends mail the way
the weekly report does ([report.smtp], [report] from_address). Channels:

- e-mail to the job's owner: the address from `directory_file` ("user address" lines, '#'
  comments), else `email_template` (default "{user}@{domain}") when `email_domain` is set;
  escalations also go to `account_contacts[account]`;
- a Slack-compatible incoming webhook (`webhook_url`): {"text": ...} with &, <, > escaped as
  Slack asks, so a job name cannot mention @channel or forge a link;
- cancel: `scancel <job id>` for Slurm, DELETE of the pod through the Kubernetes API (the
  [collector.kubernetes] connection) for pods; the owner is told after.

Every attempt that was made is an audit row (time, rule, reason with the idle figures, result);
a dry run (enforce = false, or --dry-run) does nothing and writes nothing. Each channel is tried
1 + `retries` times; a failure is recorded as result "failed" with the error and counted in
gpufleet_policy_action_failures_total, and because a failure never suppresses, the next
evaluation plans (retries) it again: never silently dropped.

Hostile text (job names, users) is made inert before it goes anywhere: control characters are
shown escaped, HTML is escaped in the HTML part, headers get no line breaks.
"""

from __future__ import annotations

import html
import logging
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.policy import OPT_OUT_TAG, POD_ANNOTATION, Action, Plan, Rules, load_rules
from gpufleet.config import ConfigError

log = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SLURM_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def inert(text: Any, limit: int = 200) -> str:
    """`text` with control characters shown as escapes (\\n, \\x1b), at most `limit` characters."""
    s = "" if text is None else str(text)
    s = _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def slack_escape(text: str) -> str:
    """Slack's escaping of message text: &, <, > (so no <!channel>, <@U..> or <url|label>)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class ActionError(Exception):
    """One channel failed; the message says which and why."""


@dataclass
class PolicyMetrics:
    registry: Any = None

    def __post_init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        r = self.registry if self.registry is not None else CollectorRegistry()
        self.registry = r
        self.actions = Counter("gpufleet_policy_actions", "Policy actions attempted, by action and result.", ["action", "result"], registry=r)
        self.failures = Counter("gpufleet_policy_action_failures", "Policy actions that failed after their retries.", ["action"], registry=r)
        self.failing = Gauge("gpufleet_policy_failing_actions", "Actions whose latest attempt failed (retried at the next evaluation).", registry=r)
        self.planned = Gauge("gpufleet_policy_planned_actions", "Actions the last evaluation planned, by action.", ["action"], registry=r)
        self.last_run = Gauge("gpufleet_policy_last_run_timestamp_seconds", "Unix time of the last policy evaluation.", registry=r)
        self.last_success = Gauge("gpufleet_policy_last_success", "1 if the last policy evaluation ran (store readable).", registry=r)
        self.enforce = Gauge("gpufleet_policy_enforce", "1 when [policy] enforce = true.", registry=r)
        self.optout_unknown = Counter("gpufleet_policy_optout_unreadable", "Jobs left alone for a round because their opt-out tag could not be read.", registry=r)
        self.lemon = Gauge("gpufleet_reliability_lemon_node", "1 for a node with improbably many hardware failures for its "
                           "GPU-hours over [policy] lemon_window (gpufleet.analytics.reliability).", ["cluster", "Hostname", "scheduler"], registry=r)
        self.hw_rate = Gauge("gpufleet_reliability_hardware_interruptions_per_1000_gpu_days", "Job attempts ended by GPU hardware "
                             "per 1,000 GPU-days allocated, over [policy] interruption_rate_window (window=recent) and lemon_window "
                             "(window=baseline).", ["window"], registry=r)
        self.hw_count = Gauge("gpufleet_reliability_hardware_interruptions", "Job attempts ended by GPU hardware in the window.",
                              ["window"], registry=r)
        for a in ("notify", "escalate", "cancel"):
            self.planned.labels(a).set(0)
        for a in ("notify", "escalate", "cancel", "efficiency_note", "drain"):
            self.failures.labels(a)


def read_directory(path: str) -> dict[str, str]:
    """'user address' per line ('#' comments, blank lines skipped); a bad line is a ConfigError."""
    out: dict[str, str] = {}
    problems = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"[policy] directory_file = {path!r}: cannot read it ({e.strerror})") from None
    from gpufleet.report.config import is_address

    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not is_address(parts[1]):
            problems.append(f"[policy] directory_file {path} line {n}: {line!r}: expected 'user address'")
            continue
        out[parts[0]] = parts[1]
    if problems:
        raise ConfigError(*problems)
    return out


@dataclass
class Channels:
    """Where messages go and how jobs are cancelled (each replaceable in tests only by real ones)."""

    smtp: Any  # gpufleet.report.config.Smtp
    from_address: str
    directory: Mapping[str, str] = field(default_factory=dict)
    email_template: str = "{user}@{domain}"
    email_domain: str = ""
    account_contacts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    webhook_url: str = ""
    scancel: Sequence[str] = ("scancel",)
    kubernetes: Any = None  # gpufleet.collector.sources.kubernetes.KubernetesSource (its connection)
    cluster: str | None = None  # the [collector] cluster: scancel and the API act on its jobs only (None: any)
    timeout: float = 10.0

    @property
    def email(self) -> bool:
        return bool(self.directory) or bool(self.email_domain)

    def address(self, user: str | None) -> str | None:
        from gpufleet.report.config import is_address

        if not user:
            return None
        if user in self.directory:
            return self.directory[user]
        if self.email_domain:
            a = self.email_template.format(user=user, domain=self.email_domain)
            return a if is_address(a) else None
        return None


def describe(a: Action, enforce: bool) -> tuple[str, str]:
    """(subject, plain text) of the message about an action; every job field made inert."""
    j = a.job
    what = {"notify": "is holding idle GPUs", "escalate": "is still holding idle GPUs (escalated to the account contact)",
            "cancel": "was cancelled: its GPUs stayed idle" if enforce else "would be cancelled: its GPUs stayed idle"}[a.action]
    subject = inert(f"[gpufleet] job {j.job_id} ({j.name or '?'}) on {j.cluster} {what}", 160)
    lines = [
        f"Job {inert(j.job_id)} ({inert(j.name)}) of user {inert(j.user_name)}, account {inert(j.account)},",
        f"on cluster {inert(j.cluster)} ({j.scheduler}) {what}.",
        "",
        f"  GPUs held:      {j.gpus}",
        f"  GPUs idle:      {j.idle_gpus}",
        f"  Idle for:       {words.duration(j.idle_s)} ({j.idle_s:.0f} s)" if j.idle_s is not None else "  Idle for:       unknown",
        f"  Job state:      {inert(j.state)}",
        f"  Rule:           {a.rule}",
        f"  Reason:         {inert(a.reason, 400)}",
        "",
        "If the job is waiting on purpose, add  gpufleet:exempt=<your reason>  to its Slurm comment",
        "(scontrol update job=<id> comment=...) or the pod annotation gpufleet.io/exempt; otherwise please",
        "end it so that others can use the GPUs.",
    ]
    return subject, "\n".join(lines) + "\n"


def _html(text: str) -> str:
    return "<html><body><pre>" + html.escape(text) + "</pre></body></html>\n"


class Runner:
    """Plans with gpufleet.analytics.policy and carries the plan out (only with enforce)."""

    def __init__(self, rules: Rules, channels: Channels, params_for: Callable[[datetime], Any], *,
                 metrics: PolicyMetrics | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], datetime] | None = None, reliability: Any = None):
        from gpufleet.analytics.reliability import Settings
        from gpufleet.times import utcnow

        self.reliability = reliability or Settings()  # the lemon test's settings ([analytics] reliability_*)
        self.rules = rules
        self.channels = channels
        self.params_for = params_for
        self.metrics = metrics or PolicyMetrics()
        self.sleep = sleep
        self.clock = clock or utcnow
        self.metrics.enforce.set(1 if rules.enforce else 0)

    @classmethod
    def from_config(cls, doc: Mapping[str, Any], path: Any, *, registry: Any = None, **kw: Any) -> "Runner":
        from datetime import timedelta

        from gpufleet.analytics.params import from_config
        from gpufleet.config import gather
        from gpufleet.report import config as report_config

        rules, report = gather(lambda: load_rules(doc, path), lambda: report_config.load(doc, path))
        o = rules.options
        directory = read_directory(o["directory_file"]) if o["directory_file"] else {}
        kube = None
        k8s = (doc.get("collector") or {}).get("kubernetes") if isinstance(doc.get("collector"), dict) else None
        if o["kube_api"] or (isinstance(k8s, dict) and k8s.get("enabled")):
            from gpufleet.collector.sources.kubernetes import KubernetesSource

            opts = dict(k8s or {})
            if o["kube_api"]:
                opts["host"] = o["kube_api"]
            kube = KubernetesSource(str((doc.get("collector") or {}).get("cluster") or "kubernetes"), host=opts.get("host") or None,
                                    token=opts.get("token") or None, ca_cert=opts.get("ca_cert") or None,
                                    insecure=bool(opts.get("insecure", False)), kubeconfig=opts.get("kubeconfig") or None,
                                    in_cluster=not (opts.get("host") or opts.get("kubeconfig")))
        if rules.enforce and report.smtp.password_file:
            report.smtp.password()
        channels = Channels(smtp=report.smtp, from_address=report.from_address, directory=directory,
                            email_template=o["email_template"], email_domain=o["email_domain"],
                            account_contacts={k: tuple(v) for k, v in o["account_contacts"].items()},
                            webhook_url=o["webhook_url"], scancel=tuple(o["scancel"].split()), kubernetes=kube,
                            cluster=str(doc["collector"].get("cluster") or "default") if isinstance(doc.get("collector"), dict) else None)
        from gpufleet.analytics import reliability
        from gpufleet.analytics.params import analytics_options

        return cls(rules, channels, lambda as_of: from_config(doc, path, as_of - timedelta(hours=1), as_of),
                   metrics=PolicyMetrics(registry), reliability=reliability.settings(analytics_options(doc, path)), **kw)

    # --- planning ---

    def round_reads(self, store_root: Any, as_of: datetime | None = None) -> tuple[Plan, list[dict[str, Any]], dict[str, Any]]:
        """A round's three reads of the store at one time - its plan, its efficiency notes and its lemon drains - each on a
        reader of its own, the notes and drains in worker threads beside the plan: none reads what another writes, and
        DuckDB runs their statements while Python runs the others'. A read's error is raised as the reads alone raise it."""
        as_of = as_of or self.clock()
        with ThreadPoolExecutor(2, thread_name_prefix="policy-read") as pool:
            notes = pool.submit(self.notes, store_root, as_of)
            lemons = pool.submit(self.drains, store_root, as_of)
            plan = self.plan(store_root, as_of)
            return plan, notes.result(), lemons.result()

    def plan(self, store_root: Any, as_of: datetime | None = None) -> Plan:
        """The plan at as_of. The opt-out tag is read from the scheduler for the jobs the plan
        would act on (their Slurm comment, their pod's annotation), now, so a tag added a minute
        ago counts; a job whose tag cannot be read is left alone this round (logged, counted)."""
        from gpufleet.analytics.policy import plan_of, read_plan_inputs
        from gpufleet.collector.store import open_reader

        as_of = as_of or self.clock()
        con = open_reader(store_root)
        try:
            inputs = read_plan_inputs(con, self.rules, self.params_for(as_of), as_of)
        finally:
            con.close()
        plan = plan_of(inputs, self.rules, as_of)
        if plan.actions:
            comments, unknown = self.opt_out_tags(plan.actions)
            if comments or unknown:
                plan = plan_of(inputs, self.rules, as_of, comments)
                plan.actions = [a for a in plan.actions if (a.job.cluster, a.job.scheduler, a.job.job_key) not in unknown]
        for e in plan.exempt:
            log.info("policy: job %s (%s) exempt: %s: %s", inert(e.job.job_key), e.job.cluster, e.rule, inert(e.reason, 400))
        for a in ("notify", "escalate", "cancel"):
            self.metrics.planned.labels(a).set(sum(1 for x in plan.actions if x.action == a))
        return plan

    def opt_out_tags(self, actions: Sequence[Action]) -> tuple[dict[tuple, str], set[tuple]]:
        """({job: comment text}, {jobs whose tag could not be read}) for the jobs of `actions`."""
        comments: dict[tuple, str] = {}
        unknown: set[tuple] = set()
        for a in actions:
            j = a.job
            key = (j.cluster, j.scheduler, j.job_key)
            try:
                text = self._tag(j)
            except ActionError as e:
                unknown.add(key)
                self.metrics.optout_unknown.inc()
                log.warning("policy: job %s (%s) left alone this round: its opt-out tag cannot be read: %s",
                            inert(j.job_key), j.cluster, inert(e, 400))
                continue
            if text:
                comments[key] = text
        return comments, unknown

    def _tag(self, j: Any) -> str | None:
        if j.scheduler == "slurm":
            if not _SLURM_ID.match(j.job_key):
                raise ActionError(f"job key {inert(j.job_key)} is not a Slurm job id")
            squeue = self.rules.options.get("squeue", "squeue")
            if not squeue:
                return None  # [policy] squeue = "": Slurm comments are not read
            text = _run([*squeue.split(), "-h", "-j", j.job_key, "-o", "%k"], self.channels.timeout * 3).strip()
            return None if text in ("", "(null)") else text
        if j.scheduler == "kubernetes":
            ns, _, name = j.job_key.partition("/")
            if self.channels.kubernetes is None:
                return None  # no API to ask: the store's view stands (no tag)
            try:
                ann = self.channels.kubernetes.pod_annotations(ns, name)
            except Exception as e:  # noqa: BLE001 - SourceError, client errors
                raise ActionError(str(e)) from None
            value = (ann or {}).get(POD_ANNOTATION)
            return f"{OPT_OUT_TAG}={value}" if value is not None else None
        return None

    # --- lemon nodes ---

    def drains(self, store_root: Any, as_of: datetime | None = None) -> dict[str, Any]:
        """The lemon nodes of the last lemon_window (gpufleet.analytics.reliability) to drain:
        {"drains": [Drain], "exempt": [(Drain, why)], "suppressed": [Drain drained ok within
        renotify_after]}; none when [policy] drain_lemons = false."""
        from dataclasses import replace

        from gpufleet.analytics import reliability, reliability_store
        from gpufleet.analytics.policy import audit
        from gpufleet.collector.store import open_reader
        from gpufleet.times import parse_duration

        o = self.rules.options or {}
        if not o.get("drain_lemons", True):
            return {"drains": [], "exempt": [], "suppressed": [], "lemons": [], "figures": None}
        as_of = as_of or self.clock()
        window = parse_duration(o.get("lemon_window", "7d"))
        con = open_reader(store_root)
        try:
            rel = reliability_store.figures_and_lemons(con, replace(self.params_for(as_of), start=as_of - window, end=as_of), self.reliability,
                                                       as_of=as_of)
            done = audit(con, as_of - self.rules.renotify_after, as_of).to_dicts()
        finally:
            con.close()
        found = [reliability.Lemon(x["node"], x["failures"], x["gpu_hours"], x["expected_failures"], x["p_value"], tuple(x["evidence"]))
                 for x in rel["lemons"]]
        where = {x["node"]: (x["cluster"], x["scheduler"]) for x in rel["lemons"]}
        drained = [r["job_key"].removeprefix(reliability.DRAIN_KEY_PREFIX) for r in done
                   if r["action"] == reliability.DRAIN_ACTION and r["result"] == "ok"]
        plan, exempt, suppressed = reliability.drain_plan(found, where, tuple(o.get("exempt_nodes", ())), drained)
        for d, why in exempt:
            log.info("policy: lemon node %s (%s) exempt: %s", inert(d.node), d.cluster, why)
        return {"drains": plan, "exempt": exempt, "suppressed": suppressed, "lemons": rel["lemons"], "figures": rel["figures"]}

    def recent_reliability(self, store_root: Any, as_of: datetime | None = None) -> dict[str, Any]:
        """The reliability figures of the last interruption_rate_window (the "recent" rate publish_reliability sets beside
        lemon_window's): a read of its own, so a round makes it beside its other reads."""
        from dataclasses import replace

        from gpufleet.analytics import reliability_store
        from gpufleet.collector.store import open_reader
        from gpufleet.times import parse_duration

        as_of = as_of or self.clock()
        recent = parse_duration((self.rules.options or {}).get("interruption_rate_window", "1d"))
        con = open_reader(store_root)
        try:
            return reliability_store.figures_and_lemons(con, replace(self.params_for(as_of), start=as_of - recent, end=as_of),
                                                        self.reliability, as_of=as_of)["figures"]
        finally:
            con.close()

    def publish_reliability(self, lemons: Mapping[str, Any], recent: Mapping[str, Any] | None) -> None:
        """The lemons of `lemons` (drains()' answer, exempt ones too) and the hardware interruption
        rate over interruption_rate_window (`recent`: recent_reliability's figures) beside lemon_window's
        (baseline) as metrics, for the alert rules GpufleetLemonNode and GpufleetHardwareInterruptionRateHigh.
        Unknown rates (no GPU-hours) are left out, never 0."""
        m = self.metrics
        m.lemon.clear()
        for x in lemons.get("lemons", ()):
            m.lemon.labels(x["cluster"] or "", x["node"], x["scheduler"] or "").set(1)
        m.hw_rate.clear()
        m.hw_count.clear()
        for window, fig in (("recent", recent), ("baseline", lemons.get("figures"))):
            if fig and fig["hardware_interruptions_per_1000_gpu_days"] is not None:
                m.hw_rate.labels(window).set(fig["hardware_interruptions_per_1000_gpu_days"])
                m.hw_count.labels(window).set(fig["hardware_interruptions"])

    def execute_drains(self, drains: Sequence[Any], record: Callable[[list[dict[str, Any]]], Any], *,
                       dry_run: bool = False) -> list[dict[str, Any]]:
        """Drain (Slurm) or cordon (Kubernetes) each node, only with enforce and not dry_run; audit
        rows (action "drain", job_key "node:<name>"). Never resumes a node."""
        if dry_run or not self.rules.enforce:
            for d in drains:
                log.info("policy (dry run): would drain node %s (%s): %s", inert(d.node), d.cluster, inert(d.reason, 400))
            return []
        rows = []
        for d in drains:
            try:
                result, detail = "ok", self._retry("drain", lambda d=d: self._drain(d))
            except ActionError as e:
                result, detail = "failed", str(e)
                self.metrics.failures.labels("drain").inc()
                log.error("policy: drain of node %s (%s) failed (retried at the next evaluation): %s", inert(d.node), d.cluster, inert(detail, 600))
            self.metrics.actions.labels("drain", result).inc()
            rows.append({"ts": self.clock(), "cluster": d.cluster, "scheduler": d.scheduler, "job_key": d.audit_key, "job_id": None,
                         "user_name": None, "account": None, "action": "drain", "rule": "lemon", "reason": d.reason,
                         "idle_s": None, "idle_gpus": None, "enforce": True, "result": result, "detail": detail, "attempt": 1})
        if rows:
            record(rows)
        return rows

    def _drain(self, d: Any) -> str:
        if self.channels.cluster is not None and d.cluster != self.channels.cluster:
            raise ActionError(f"node of cluster {inert(d.cluster)}: this scontrol / Kubernetes API acts on cluster "
                              f"{self.channels.cluster} only ([collector] cluster): not drained")
        if d.scheduler == "slurm":
            cmd = d.command(tuple((self.rules.options or {}).get("scontrol", "scontrol").split()))
            _run(cmd, self.channels.timeout * 3)
            return f"drained with {' '.join(cmd[:-1])} {cmd[-1]!r}"
        if self.channels.kubernetes is None:
            raise ActionError("no Kubernetes API configured ([collector.kubernetes] or [policy] kube_api): not cordoned")
        try:
            self.channels.kubernetes.cordon_node(d.node)
        except Exception as e:  # noqa: BLE001 - SourceError, client errors: a failed action
            raise ActionError(f"cordoning node {inert(d.node)}: {e}") from None
        return f"cordoned node {d.node}"

    def failing(self, store_root: Any) -> list[dict[str, Any]]:
        """Actions whose latest attempt failed (from the audit trail), for metrics and health."""
        rows = _failing(store_root)
        self.metrics.failing.set(sum(1 for r in rows if r["job_state"] == "RUNNING"))
        return rows

    # --- acting ---

    def execute(self, plan: Plan, record: Callable[[list[dict[str, Any]]], Any], *, attempts: Mapping[tuple, int] | None = None,
                dry_run: bool = False) -> list[dict[str, Any]]:
        """Carry out the plan when enforce is on and not dry_run; returns (and records) audit rows."""
        if dry_run or not self.rules.enforce:
            for a in plan.actions:
                log.info("policy (dry run): would %s job %s (%s): %s: %s", a.action, inert(a.job.job_key), a.job.cluster,
                         a.rule, inert(a.reason, 400))
            return []
        rows = []
        for a in plan.actions:
            result, detail = self._act(a)
            j = a.job
            n = (attempts or {}).get((j.cluster, j.scheduler, j.job_key, a.action), 0) + 1 if result == "failed" else 1
            rows.append({"ts": self.clock(), "cluster": j.cluster, "scheduler": j.scheduler, "job_key": j.job_key,
                         "job_id": j.job_id, "user_name": j.user_name, "account": j.account, "action": a.action,
                         "rule": a.rule, "reason": a.reason, "idle_s": j.idle_s, "idle_gpus": j.idle_gpus, "enforce": True,
                         "result": result, "detail": detail, "attempt": n})
            self.metrics.actions.labels(a.action, result).inc()
            if result == "failed":
                self.metrics.failures.labels(a.action).inc()
                log.error("policy: %s of job %s (%s) failed (attempt %d, retried at the next evaluation): %s",
                          a.action, inert(j.job_key), j.cluster, n, inert(detail, 600))
            else:
                log.info("policy: %s job %s (%s): %s", a.action, inert(j.job_key), j.cluster, inert(detail, 400))
        if rows:
            record(rows)
        return rows

    def notes(self, store_root: Any, as_of: datetime | None = None) -> list[dict[str, Any]]:
        """Efficiency notes due (jobs of efficiency_note_accounts ended within the lookback, none sent yet)."""
        from datetime import timedelta

        from gpufleet.analytics.policy import efficiency_notes
        from gpufleet.collector.store import open_reader
        from gpufleet.times import parse_duration

        accounts = tuple(self.rules.options.get("efficiency_note_accounts") or ()) if self.rules.options else ()
        if not accounts:
            return []
        as_of = as_of or self.clock()
        lookback = parse_duration(self.rules.options.get("efficiency_note_lookback", "1d"))
        con = open_reader(store_root)
        try:
            return efficiency_notes(con, self.params_for(as_of), accounts, as_of - max(lookback, timedelta(seconds=1)), as_of)
        finally:
            con.close()

    def send_notes(self, notes: Sequence[Mapping[str, Any]], record: Callable[[list[dict[str, Any]]], Any], *,
                   dry_run: bool = False) -> list[dict[str, Any]]:
        """Mail each note to the job's owner (only with enforce and not dry_run); audit rows."""
        from gpufleet.report.mail import MailError, message, send

        if dry_run or not self.rules.enforce:
            for n in notes:
                log.info("policy (dry run): would send the efficiency note of job %s (%s): %s", inert(n["job_key"]), n["cluster"], n["verdict"])
            return []
        rows = []
        for n in notes:
            subject, text = note_text(n)
            to = self.channels.address(n["user_name"])

            def mail(to=to, subject=subject, text=text) -> str:
                if not to:
                    raise ActionError(f"no e-mail address for user {inert(n['user_name'])}")
                try:
                    send([message(sender=self.channels.from_address, to=[to], subject=subject, text=text, html=_html(text))],
                         self.channels.smtp)
                except (MailError, ConfigError) as e:
                    raise ActionError(str(e)) from None
                return f"mailed {to}"

            try:
                result, detail = "ok", self._retry("email", mail)
            except ActionError as e:
                result, detail = "failed", str(e)
                self.metrics.failures.labels("efficiency_note").inc()
                log.error("policy: efficiency note of job %s (%s) failed (retried next round): %s", inert(n["job_key"]), n["cluster"], detail)
            self.metrics.actions.labels("efficiency_note", result).inc()
            rows.append({"ts": self.clock(), "cluster": n["cluster"], "scheduler": n["scheduler"], "job_key": n["job_key"],
                         "job_id": n["job_id"], "user_name": n["user_name"], "account": n["account"], "action": "efficiency_note",
                         "rule": n["verdict"], "reason": n["rule"], "idle_s": n["idle_gpu_h"] * 3600 if n["idle_gpu_h"] is not None else None,
                         "idle_gpus": None, "enforce": True, "result": result, "detail": detail, "attempt": 1})
        if rows:
            record(rows)
        return rows

    def _retry(self, what: str, fn: Callable[[], str]) -> str:
        last: Exception | None = None
        for i in range(1 + int(self.rules.options.get("retries", 2) if self.rules.options else 2)):
            if i:
                self.sleep(min(30.0, 0.5 * 2 ** (i - 1)))
            try:
                return fn()
            except ActionError as e:
                last = e
        raise ActionError(f"{what}: {last}")

    def _act(self, a: Action) -> tuple[str, str]:
        done, failed = [], []
        if a.action == "cancel":
            try:
                done.append(self._retry("cancel", lambda: self._cancel(a)))
            except ActionError as e:
                return "failed", str(e)
        for name, fn in (("email", self._email), ("webhook", self._webhook)):
            try:
                msg = self._retry(name, lambda fn=fn: fn(a))
                if msg:
                    done.append(msg)
            except ActionError as e:
                failed.append(str(e))
        if a.action != "cancel" and not done and not failed:
            failed.append("no channel: set [policy] email_domain, directory_file or webhook_url")
        if failed and a.action != "cancel":
            return "failed", "; ".join(done + failed)
        return "ok", "; ".join(done + [f"(notice failed: {f})" for f in failed])

    def _email(self, a: Action) -> str:
        from gpufleet.report.mail import MailError, message, send

        ch = self.channels
        if not ch.email:
            return ""
        owner = ch.address(a.job.user_name)
        to = [owner] if owner else []
        if a.action in ("escalate", "cancel"):
            to += [c for c in ch.account_contacts.get(a.job.account or "", ()) if c not in to]
        if not to:
            raise ActionError(f"no e-mail address for user {inert(a.job.user_name)!s} (directory_file / email_domain)")
        subject, text = describe(a, self.rules.enforce)
        try:
            send([message(sender=ch.from_address, to=to, subject=subject, text=text, html=_html(text))], ch.smtp)
        except (MailError, ConfigError) as e:
            raise ActionError(str(e)) from None
        return f"mailed {', '.join(to)}"

    def _webhook(self, a: Action) -> str:
        import httpx

        ch = self.channels
        if not ch.webhook_url:
            return ""
        subject, text = describe(a, self.rules.enforce)
        j = a.job
        payload = {"text": slack_escape(subject + "\n" + text),
                   "gpufleet": {**a.as_dict(), "job_name": inert(j.name), "user": inert(j.user_name)}}
        try:
            r = httpx.post(ch.webhook_url, json=payload, timeout=ch.timeout)
        except httpx.HTTPError as e:
            raise ActionError(f"webhook {ch.webhook_url}: {type(e).__name__}: {e}") from None
        if r.status_code >= 300:
            raise ActionError(f"webhook {ch.webhook_url}: HTTP {r.status_code}: {inert(r.text, 200)}")
        return "posted to the webhook"

    def _cancel(self, a: Action) -> str:
        j = a.job
        if self.channels.cluster is not None and j.cluster != self.channels.cluster:
            raise ActionError(f"job of cluster {inert(j.cluster)}: this scancel / Kubernetes API acts on cluster "
                              f"{self.channels.cluster} only ([collector] cluster): not cancelled")
        if j.scheduler == "slurm":
            if not _SLURM_ID.match(j.job_key):
                raise ActionError(f"job key {inert(j.job_key)!s} is not a Slurm job id: not cancelled")
            cmd = [*self.channels.scancel, j.job_key]
            _run(cmd, self.channels.timeout * 3)
            return f"cancelled with {' '.join(cmd)}"
        if j.scheduler == "kubernetes":
            ns, _, name = j.job_key.partition("/")
            if not (_K8S_NAME.match(ns) and _K8S_NAME.match(name)):
                raise ActionError(f"job key {inert(j.job_key)!s} is not namespace/pod: not deleted")
            if self.channels.kubernetes is None:
                raise ActionError("no Kubernetes API configured ([collector.kubernetes] or [policy] kube_api)")
            try:
                self.channels.kubernetes.delete_pod(ns, name)
            except Exception as e:  # noqa: BLE001 - SourceError, client errors: all are a failed action
                raise ActionError(f"deleting pod {ns}/{name}: {e}") from None
            return f"deleted pod {ns}/{name}"
        raise ActionError(f"scheduler {inert(j.scheduler)!s}: cannot cancel")


def _run(cmd: list[str], timeout: float) -> str:
    """A scheduler command's stdout; ActionError naming the command when it cannot run or fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ActionError(f"{' '.join(cmd)}: {e}") from None
    if p.returncode != 0:
        raise ActionError(f"{' '.join(cmd)}: exit {p.returncode}: {inert(p.stderr.strip(), 300)}")
    return p.stdout


def note_text(n: Mapping[str, Any]) -> tuple[str, str]:
    """(subject, text) of the efficiency note of an ended job; every job field made inert."""
    def pct(v):
        return "no data" if v is None else f"{v:.1f} %"

    mem = "no data" if n["fb_used_max_mib"] is None else f"{n['fb_used_max_mib']:,.0f} MiB"
    subject = inert(f"[gpufleet] job {n['job_id']} ({n['name'] or '?'}) on {n['cluster']} ended: {n['verdict']}", 160)
    lines = [
        f"Job {inert(n['job_id'])} ({inert(n['name'])}) of user {inert(n['user_name'])}, account {inert(n['account'])},",
        f"on cluster {inert(n['cluster'])} ended ({inert(n['state'])}).",
        "",
        f"  GPUs:                 {n['gpus'] if n['gpus'] is not None else 'unknown'}",
        f"  Runtime:              {n['runtime_h']:.2f} h ({n['allocated_gpu_h']:.2f} GPU-hours allocated)",
        f"  Mean GPU utilization: {pct(n['mean_utilization_pct'])}",
        f"  Idle GPU-hours:       {n['idle_gpu_h']:.2f}",
        f"  No-process GPU-hours: {n['no_process_gpu_h']:.2f}",
        f"  Memory high-water:    {mem}",
        f"  Verdict:              {n['verdict']} ({inert(n['rule'], 300)})",
        "",
        "Your account asked for this note at the end of every GPU job ([policy] efficiency_note_accounts).",
    ]
    return subject, "\n".join(lines) + "\n"


def attempts_from_audit(store_root: Any, as_of: datetime) -> dict[tuple, int]:
    """(cluster, scheduler, job_key, action) -> the attempt count of its latest failed row."""
    return {(r["cluster"], r["scheduler"], r["job_key"], r["action"]): int(r["attempt"])
            for r in _failing(store_root)}


def _failing(store_root: Any) -> list[dict[str, Any]]:
    from gpufleet.analytics.policy import failing
    from gpufleet.collector.store import open_reader

    con = open_reader(store_root)
    try:
        return failing(con).to_dicts()
    finally:
        con.close()


# --- the collector service's job ---

JOB_ID = "idle-gpu-policy"


class PolicyJob:
    """The policy as a job of the collector service: every [policy] interval, plan over the
    published store and act through the collector's own writer (the store has one writer), so
    the audit trail, and with it renotify_after, survives restarts."""

    def __init__(self, runner: Runner, store_root: Any):
        self.runner = runner
        self.store_root = store_root
        self.record: Callable[[list[dict[str, Any]]], Any] | None = None
        self.last_result: bool | None = None

    def add_to(self, scheduler: Any, collector: Any = None):
        """Add the interval job to an APScheduler 3 scheduler; `collector` (the service) gives the
        writer for the audit rows and the /metrics registry."""
        if collector is not None:
            self.runner.metrics = PolicyMetrics(collector.metrics.registry)
            self.runner.metrics.enforce.set(1 if self.runner.rules.enforce else 0)
            self.record = collector.record_policy
        s = self.runner.rules.interval.total_seconds()
        job = scheduler.add_job(self, "interval", seconds=s, id=JOB_ID, name="idle-GPU policy", max_instances=1,
                                coalesce=True, misfire_grace_time=max(1, int(s)), replace_existing=True)
        log.info("idle-GPU policy every %s (%s)", words.duration(s), "enforcing" if self.runner.rules.enforce else "dry run")
        return job

    def __call__(self) -> bool:
        try:
            self.last_result = self.run()
        except Exception:  # noqa: BLE001 - a policy bug must not stop the collector
            log.exception("idle-GPU policy failed unexpectedly")
            self.last_result = False
        self.runner.metrics.last_success.set(1 if self.last_result else 0)
        return bool(self.last_result)

    def run(self) -> bool:
        from gpufleet.collector.store import StoreError

        m = self.runner.metrics
        now = self.runner.clock()
        # the notes', drains' and recent reliability's reads in worker threads beside the plan's (Runner.round_reads); each
        # read's failure is met where its result is taken, so one that fails keeps the others
        with ThreadPoolExecutor(2, thread_name_prefix="policy-read") as pool:
            notes = pool.submit(self.runner.notes, self.store_root, now)
            lemons = pool.submit(self.runner.drains, self.store_root, now)
            recent = pool.submit(self.runner.recent_reliability, self.store_root, now)
            try:
                plan = self.runner.plan(self.store_root, now)
                attempts = attempts_from_audit(self.store_root, now)
            except StoreError as e:
                log.error("idle-GPU policy: the store is unreadable: %s", e)
                return False
            m.last_run.set(time.time())
            if self.record is None:
                log.error("idle-GPU policy: no writer to record actions in: not acting")
                return False
            rows = self.runner.execute(plan, self.record, attempts=attempts)
            try:
                rows += self.runner.send_notes(notes.result(), self.record)
            except StoreError as e:
                log.error("idle-GPU policy: efficiency notes: the store is unreadable: %s", e)
            try:
                found = lemons.result()
                rows += self.runner.execute_drains(found["drains"], self.record)
                self.runner.publish_reliability(found, recent.result())
            except StoreError as e:
                log.error("policy: lemon nodes: the store is unreadable: %s", e)
        self.runner.failing(self.store_root)
        return all(r["result"] != "failed" for r in rows)


def scheduled(doc: Mapping[str, Any], path: Any) -> Callable[..., Any] | None:
    """The collector service's hook (wired by the shell): the policy job's `add_to`, or None
    without a [policy] section. Validates [policy] at start."""
    if not isinstance(doc.get("policy"), dict):
        return None
    from gpufleet.analytics.params import store_path

    runner = Runner.from_config(doc, path)
    return PolicyJob(runner, store_path(doc, path)).add_to
