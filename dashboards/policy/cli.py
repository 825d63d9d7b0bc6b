"""`gpufleet policy`: plan (and with [policy] enforce = true, carry out) the idle-GPU policy.

    gpufleet policy --config gpufleet.toml                 # the plan; acts only if enforce = true
    gpufleet policy --config gpufleet.toml --dry-run --format json

Lemon nodes (gpufleet.analytics.reliability, over [policy] lemon_window) are proposed for draining
beside the plan ("drains": [{"action": "drain", "cluster", "scheduler", "node", "reason", "command"}],
"drains_exempt", "drains_suppressed"), and drained only under the same enforce switch.

The plan is printed either way: a table, or JSON {"actions": [{"action", "job_key", "job_id",
"cluster", "scheduler", "user", "account", "job_state", "idle_s", "idle_gpus", "rule", "reason"},
...], "exempt": [...], "suppressed": [...], "closest": {"job_key", "job_id", ..., "idle_since",
"rule", "due_at", "reason"} or null}: with no action, the running job nearest to one and why it
is not due yet. A dry run reads the store and changes nothing. To act,
the command needs the store's writer: with the collector service running, the policy runs inside
it ([policy] interval) and this command plans only (exit 1 if asked to act).
Exit status: 0 success; 2 bad usage or configuration; 1 the store is unreachable or an action failed.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpufleet.config import ConfigError, command_error, load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML configuration file ([policy], [report] smtp, [analytics], [collector] sections)")
    p.add_argument("--store", help="store directory (default: [analytics] store, else [collector] store)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and do nothing (the default unless enforce = true)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="a table for people, or JSON (a stable schema) for scripts")
    p.add_argument("--as-of", help="evaluate at this time (ISO 8601, UTC unless an offset is given; default now); implies --dry-run")


def _table(plan, acting: bool) -> str:
    from gpufleet.analytics import vocabulary as words
    from gpufleet.policy.enforce import inert

    mode = "enforcing" if acting else "dry run" + ("" if plan.enforce else " (enforce = false)")
    lines = [f"idle-GPU policy at {plan.as_of.isoformat(timespec='seconds')}Z: {len(plan.actions)} action(s), {mode}"]

    def job(j) -> str:
        return f"{j.cluster}/{inert(j.job_id, 40)}"

    # columns as wide as their longest value (a pod's name is longer than a Slurm job id)
    jobs = [x.job for x in (*plan.actions, *plan.exempt, *plan.suppressed)]
    wj = max([18, *(len(job(j)) for j in jobs)])
    wu = max([12, *(len(inert(j.user_name, 20)) for j in jobs)])
    wa = max([12, *(len(inert(j.account, 20)) for j in jobs)])
    for a in plan.actions:
        j = a.job
        lines.append(f"  {a.action:<8} {job(j):<{wj}} {inert(j.user_name, 20):<{wu}} {inert(j.account, 20):<{wa}} "
                     f"{j.idle_gpus}/{j.gpus} GPUs idle {words.duration(j.idle_s):>11}  [{a.rule}] {inert(a.reason, 300)}  "
                     f"name {inert(j.name, 60)}")
    for e in plan.exempt:
        lines.append(f"  exempt   {job(e.job):<{wj}} [{e.rule}] {inert(e.reason, 300)}")
    for a in plan.suppressed:
        lines.append(f"  (done)   {job(a.job):<{wj}} {a.action} already done within renotify_after")
    if not plan.actions:
        c = plan.closest
        lines.append("  nothing due: no running job holds GPUs" if c is None else
                     f"  nothing due; closest {c.job.cluster}/{inert(c.job.job_id, 40)} {inert(c.job.user_name, 20)} "
                     f"{inert(c.job.account, 20)}: {c.reason}")
    return "\n".join(lines) + "\n"


def _drain_table(lemons: dict, acting: bool) -> str:
    """The lemon nodes the policy drains (or would), with the command as a shell takes it (its reason quoted: an operator
    copies it); a person resumes them."""
    import shlex

    from gpufleet.policy.enforce import inert

    lines = []
    for d in lemons["drains"]:
        lines.append(f"  {'drain' if acting else 'drain?':<8} {d.cluster}/{inert(d.node, 60)} ({d.scheduler}) {inert(d.reason, 300)}\n"
                     f"           {inert(shlex.join(d.command()), 600)}")
    for d, why in lemons["exempt"]:
        lines.append(f"  exempt   {d.cluster}/{inert(d.node, 60)} [{why}]")
    for d in lemons["suppressed"]:
        lines.append(f"  (done)   {d.cluster}/{inert(d.node, 60)} drained within renotify_after")
    return "".join(line + "\n" for line in lines)


def run(args: argparse.Namespace, out=None) -> int:
    from gpufleet.analytics.params import store_path
    from gpufleet.collector.store import STORE_FIX, NoStoreError, StoreError, StoreWriter
    from gpufleet.policy.enforce import Runner, attempts_from_audit
    from gpufleet.times import parse_time

    out = out or sys.stdout
    try:
        doc = load_config(args.config)
        runner = Runner.from_config(doc, args.config)
        store = store_path(doc, args.config, args.store)
        as_of = parse_time(args.as_of) if args.as_of else None
    except ConfigError as e:
        return command_error("policy", e)
    act = runner.rules.enforce and not args.dry_run and as_of is None
    try:
        plan, notes, lemons = runner.round_reads(store, as_of)
    except NoStoreError as e:  # nothing there: the command named the wrong store (usage)
        return command_error("policy", f"{e}: {STORE_FIX}")
    except StoreError as e:
        return command_error("policy", e, 1)
    if args.format == "json":
        doc = plan.as_dict()
        doc["efficiency_notes"] = notes
        doc["drains"] = [d.as_dict() for d in lemons["drains"]]
        doc["drains_exempt"] = [{**d.as_dict(), "exempt_reason": why} for d, why in lemons["exempt"]]
        doc["drains_suppressed"] = [d.as_dict() for d in lemons["suppressed"]]
        out.write(json.dumps(doc, default=str, indent=1) + "\n")
    else:
        out.write(_table(plan, act))
        for n in notes:
            out.write(f"  note     {n['cluster']}/{n['job_id']} ended: {n['verdict']} ({n['rule']})\n")
        out.write(_drain_table(lemons, act))
    if not act or not (plan.actions or notes or lemons["drains"]):
        return 0
    try:
        attempts = attempts_from_audit(store, plan.as_of)
        writer = StoreWriter(store)
    except StoreError as e:
        return command_error("policy", f"not acting: {e} (with the collector service running, the policy acts inside it)", 1)
    try:
        def record(rows):
            writer.record_policy(rows)
            writer.publish()

        rows = runner.execute(plan, record, attempts=attempts)
        rows += runner.send_notes(notes, record)
        rows += runner.execute_drains(lemons["drains"], record)
    finally:
        writer.close()
    return 1 if any(r["result"] == "failed" for r in rows) else 0
