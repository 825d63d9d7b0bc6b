"""Reliability from the store: the window's attempts, their GPUs' health events, the policy's cancels, jobs' checkpoints.

Attempts from accounting, with the GPUs the job mapping saw them hold; events from health.events (the store's facts); cancels
from the policy audit; checkpoints from job_checkpoints - classified and summed by gpufleet.analytics.reliability's pure
functions. Read by `gpufleet analyze --reliability`, the policy's lemon drains and its metrics.
"""

from __future__ import annotations

import heapq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, Mapping

from gpufleet.analytics import health, sql
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.reliability import (
    ENDED_STATES, FAILURE_CAUSES, HARDWARE_XIDS, INTERRUPTION_CAUSES, NO_EVIDENCE_STATES, Attempt, Chain, Classified, Event,
    Settings, Summed, run_seconds_in, ends_in,
    checkpoint_advice, checkpoint_habits, classify_all, figures, goodput_of, interruption_loss, lemon_reason, lemons,
    link_chains, lost_since, mix_bucket, node_failures,
)
from gpufleet.analytics.scope import reliability_model_note
from gpufleet.collector.reading import first_row, seen_floor
from gpufleet.procs import gc_paused
from gpufleet.times import ceil_time, floor_time

SCHEMA = "gpufleet.reliability/v1"
EVENT_READ_STEP = timedelta(hours=1)  # the attempts' health events are read over whole hours (read_store)


def _rows(cur: Any, query: str, binds: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = cur.execute(query, sql.bound(query, binds))  # (Python's numbers: a sum of integers an int, not Arrow's decimal)
    cols = [d[0] for d in found.description]
    return [dict(zip(cols, row)) for row in found.fetchall()]


def read_store(con: Any, params: Any, s: Settings = Settings(), as_of: datetime | None = None, top: int = 20,
               bucket: timedelta | None = None, chains: bool = True
               ) -> tuple[list[Classified], list[Classified] | None, list[Summed], list[dict[str, Any]]]:
    """The window's attempts the report needs as rows, classified (sql.RELIABILITY_ATTEMPTS says which: a chain's with an
    attempt that did not complete, a job's that reported checkpoints, the `top` largest), of those the chains' candidates
    (reliability.chain_candidates' pick, made by the store: the attempts the report links), the rest summed (figures'
    `summed`: completed or not ended, per GPU count and mix bucket), and each host's GPU-hours held (cluster, host,
    scheduler, gpu_hours).
    `as_of`: where a running job's time ends (default: the window's end); `bucket`: the mix's (default mix_bucket's);
    `chains` False: for the figures alone (figures(), lemons, lost_by_team), the jobs with an attempt that did not complete
    are listed and no other (no chain candidate, `top` ignored), and the candidates are None."""
    as_of = min(as_of or params.end, params.end)
    bucket = bucket or mix_bucket(params.start, params.end)
    binds = {"start": params.start, "end": params.end, "as_of": as_of, "max_gap": params.max_gap.total_seconds(),
             "no_evidence_states": list(NO_EVIDENCE_STATES), "ended_states": sorted(ENDED_STATES), "top": top, "chains": chains,
             "bucket_us": round(bucket.total_seconds() * 1_000_000), "resubmit_s": s.resubmit_window.total_seconds(),
             **params.filters.bind()}
    # every GPU of the cluster, any model (the attempts pick their own events; they are not filtered by model), over whole hours
    # around the attempts' evidence windows, so the facts answer alone (an edge off the grid is read raw); an event outside an
    # attempt's own window is not its evidence
    around = replace(params, start=floor_time(params.start - s.hardware_window, EVENT_READ_STEP),
                     end=ceil_time(params.end + s.grace, EVENT_READ_STEP), filters=replace(params.filters, model=None))
    cur, events_cur, hosts_cur = con.cursor(), con.cursor(), con.cursor()
    try:
        # two reads need nothing from the attempts, each on its own cursor in a worker thread (DuckDB runs a statement while Python
        # runs): the health events (many small statements) beside the attempts' few large ones, and the hosts' GPU-hours (a scan of
        # every allocation) once those are done, beside the Python over the attempts (beside the statements it slows both)
        with ThreadPoolExecutor(2, thread_name_prefix="reliability-read") as pool:
            found = pool.submit(health.events, events_cur, around)
            cur.execute(sql.RELIABILITY_ATTEMPTS, sql.bound(sql.RELIABILITY_ATTEMPTS, binds))
            listed = cur.execute(sql.RELIABILITY_LISTED, sql.bound(sql.RELIABILITY_LISTED, binds)).fetchall()
            hosts = pool.submit(_host_rows, hosts_cur, binds)
            summed = [Summed(r["gpus"], "completed" if r["completed"] else "not_ended",
                             None if r["k"] is None else params.start + bucket * r["k"], r["attempts"], r["ran"],
                             r["run_us"] / 1e6, (r["gpu_run_us"] or 0) / 1e6, (r["wall_gpu_us"] or 0) / 1e6)
                      for r in _rows(cur, sql.RELIABILITY_SUMMED, binds)]
            cancels = [(r["cluster"], r["scheduler"], r["job_key"]) for r in _rows(cur, sql.RELIABILITY_POLICY_CANCELS, binds)]
            attempts = [listed_attempt(r) for r in listed]
            # (an attempt holding no GPU takes no event: read all the same, beside the attempts)
            events = [Event(e["ts"], e["host"], e["gpu_uuid"], e["kind"], e["code"], e["gpu"], e["detail"])
                      for e in found.result().iter_rows(named=True) if e["host"] is not None and e["gpu_uuid"] is not None]
            classified = classify_all(attempts, events, cancels, s)
            linked = [c for c, r in zip(classified, listed) if r[-1]] if chains else None
            host_rows = hosts.result()
    finally:
        for c in (cur, events_cur, hosts_cur):
            c.close()
    return classified, linked, summed, host_rows


def _host_rows(cur: Any, binds: Mapping[str, Any]) -> list[dict[str, Any]]:
    """RELIABILITY_HOST_GPU_HOURS' rows (its allocations read at $start, with their $seen_floor)."""
    return _rows(cur, sql.RELIABILITY_HOST_GPU_HOURS, {**binds, "seen_floor": seen_floor(cur, binds["start"], binds["max_gap"])})


# RELIABILITY_LISTED's first columns: Attempt's fields in order, up to `attempt`; then the MIG share, the GPUs held (hosts,
# uuids) and whether the attempt's job is a chain candidate
_LISTED_FIELDS = tuple(f.name for f in fields(Attempt))[:16]


def listed_attempt(row: tuple) -> Attempt:
    """The Attempt of a RELIABILITY_LISTED row, as Attempt(*row[:16], share=..., gpus_held=...) makes it, without the frozen
    __init__'s setattr per field: a report makes hundreds of thousands (at 16,384 GPUs that __init__ took 1.1 s of the read)."""
    n = len(_LISTED_FIELDS)
    share, hosts, uuids = row[n:n + 3]
    a = object.__new__(Attempt)
    a.__dict__.update(zip(_LISTED_FIELDS, row), share=share, gpus_held=tuple(zip(hosts, uuids)) if hosts else ())
    return a


Saved = dict[tuple[str, str, str], list[tuple[datetime, float | None]]]


def read_checkpoints(con: Any, params: Any, as_of: datetime | None = None) -> Saved:
    """The checkpoints the window's filtered jobs reported saving, per job (cluster, scheduler,
    job_key): (when, seconds the save took or None), in time order."""
    binds = {"start": params.start, "end": params.end, "as_of": min(as_of or params.end, params.end), **params.filters.bind()}
    cur = con.cursor()
    try:
        rows = _rows(cur, sql.RELIABILITY_CHECKPOINTS, binds)
    finally:
        cur.close()
    saved: Saved = {}
    for r in rows:
        saved.setdefault((r["cluster"], r["scheduler"], r["job_key"]), []).append((r["saved_at"], r["duration_s"]))
    return saved


@dataclass(frozen=True)
class Read:
    """What report() and lost_by_team() compute from: read_store's and read_checkpoints' results, read once where a caller
    wants both (the weekly report's reliability section and goodput waterfall)."""

    classified: list[Classified]
    linked: list[Classified] | None  # of them, the chains' candidates (read_store; None: read for the figures alone)
    summed: list[Summed]
    host_rows: list[dict[str, Any]]
    saved: Saved
    bucket: timedelta  # the cause mix's, which `summed` is binned in and figures() bins the classified attempts in


def read(con: Any, params: Any, s: Settings = Settings(), as_of: datetime | None = None, top: int = 20, chains: bool = True) -> Read:
    """The window's attempts and checkpoints (read_store, read_checkpoints): `top` and `chains` as read_store's."""
    bucket = mix_bucket(params.start, params.end)
    with gc_paused():
        return Read(*read_store(con, params, s, as_of, top, bucket, chains), read_checkpoints(con, params, as_of), bucket)


def report(con: Any, params: Any, s: Settings = Settings(), as_of: datetime | None = None, top: int = 20,
           done: Read | None = None) -> dict[str, Any]:
    """The window's reliability as JSON-ready data (schema SCHEMA): settings, figures, lemons with their evidence, the
    interrupted attempts that cost most with their causes' evidence, the chains that lost most, and Young/Daly's checkpoint
    advice for the largest chains. `done`: the window's read() with the same `top`, when the caller has it."""
    with gc_paused():  # (it builds many objects: procs.gc_paused)
        rel = _report(params, s, as_of, top, done or read(con, params, s, as_of, top))
    return {**rel, "warnings": [] if rel["figures"]["attempts"] else [empty_warning(con)]}


def empty_warning(con: Any) -> str:
    """What a window without a job attempt is told: its zeros measure nothing, and where the store's jobs are
    (sql.JOB_SPAN) - a mistyped window must not read as a fleet without failures."""
    return words.nothing_measured("job attempts", "jobs", *first_row(con, sql.JOB_SPAN))


def figures_and_lemons(con: Any, params: Any, s: Settings = Settings(), as_of: datetime | None = None) -> dict[str, Any]:
    """The window's figures and lemons alone, as report() gives them: what the policy's drains and its interruption-rate
    metrics read each round, without the chains, goodput and advice the report adds."""
    with gc_paused():
        done = read(con, params, s, as_of, top=0, chains=False)
        return _figures_and_lemons(params, s, as_of, done, _saved_times(done))


def _saved_times(done: Read) -> dict[tuple, list[datetime]]:
    """Each job's reported checkpoint times (done.saved's, without their costs)."""
    return {k: [t for t, _ in v] for k, v in done.saved.items()}


def _figures_and_lemons(params: Any, s: Settings, as_of: datetime | None, done: Read, times: dict[tuple, list[datetime]]) -> dict[str, Any]:
    classified, host_rows = done.classified, done.host_rows
    host_hours = {h["host"]: float(h["gpu_hours"]) for h in host_rows}
    where = {h["host"]: (h["cluster"], h["scheduler"]) for h in host_rows}
    f = figures(classified, params.start, params.end, times, bucket=done.bucket, as_of=as_of, summed=done.summed)
    by_node = node_failures(classified, params.start, params.end)
    evidence = {h: [f"job {c.attempt.job_id}: {c.reason}" for c in cs] for h, cs in by_node.items()}
    found = lemons({h: len(cs) for h, cs in by_node.items()}, host_hours, s.lemon_fp_rate, s.lemon_min_failures, evidence)
    return {"figures": f,
            "lemons": [{"node": x.node, "cluster": where.get(x.node, (None, None))[0], "scheduler": where.get(x.node, (None, None))[1],
                        "failures": x.failures, "gpu_hours": x.gpu_hours, "expected_failures": x.expected,
                        "p_value": x.p_value, "reason": lemon_reason(x), "evidence": list(x.evidence)} for x in found]}


def _report(params: Any, s: Settings, as_of: datetime | None, top: int, done: Read) -> dict[str, Any]:
    classified, summed, saved = done.classified, done.summed, done.saved
    if done.linked is None:
        raise ValueError("the reliability report needs a read that linked the chains (read(..., chains=True)); this one was read "
                         "for the figures alone")
    times = _saved_times(done)
    fl = _figures_and_lemons(params, s, as_of, done, times)
    f = fl["figures"]
    until = min(as_of or params.end, params.end)
    linked = done.linked
    chains = link_chains(linked, times, s, until)
    in_chains = {id(c) for c in linked}
    others = (c for c in classified if id(c) not in in_chains)
    # (the first `top` of each order: heapq.nsmallest is sorted()[:top] without sorting every chain)
    interrupted_chains = heapq.nsmallest(top, (ch for ch in chains if ch.interruptions),
                                         key=lambda ch: (-(ch.equiv or 0) * (ch.wall_s - ch.productive_s), ch.attempts[0].attempt.job_key))
    interrupted = heapq.nsmallest(top, (c for c in classified if c.interrupted and ends_in(c.attempt, params.start, params.end)),
                                  key=lambda c: -(c.attempt.equiv or 0) * run_seconds_in(c.attempt, params.start, params.end))
    return {
        "schema": SCHEMA,
        "window": {"from": params.start.isoformat(), "to": params.end.isoformat()},
        "filters": {k: v for k, v in asdict(params.filters).items() if v is not None},
        "model_note": reliability_model_note(params.filters),  # under a GPU model filter: it does not apply here
        "settings": {"hardware_window_s": s.hardware_window.total_seconds(), "grace_s": s.grace.total_seconds(),
                     "resubmit_window_s": s.resubmit_window.total_seconds(), "admin_uids": sorted(s.admin_uids),
                     "lemon_false_positive_rate": s.lemon_fp_rate, "lemon_min_failures": s.lemon_min_failures,
                     "hardware_xids": {str(k): v for k, v in HARDWARE_XIDS.items()},
                     "interruption_causes": list(INTERRUPTION_CAUSES), "failure_causes": list(FAILURE_CAUSES)},
        **fl,
        "interrupted_attempts": [_attempt_row(c, times) for c in interrupted],
        # the chains with an attempt in the window, whole (from their first start to their last end)
        "goodput": {**goodput_of(chains, others, until, sum(x.wall_gpu_s for x in summed)), "checkpoints": checkpoints_note(f)},
        # the interrupted chains that lost most (GPUs x (wall - productive)) first
        "chains": [_chain_row(ch, f["gpu_failure_rate_per_gpu_hour"], saved) for ch in interrupted_chains],
        # Young/Daly's interval for the largest chains (GPUs, then wall time), beside the one they used
        "checkpoint_advice": [{**_chain_head(ch), **_advice(ch, f["gpu_failure_rate_per_gpu_hour"], saved)}
                              for ch in largest_chains(classified, linked, chains, times, s, until, top)],
    }


def lost_by_team(con: Any, params: Any, s: Settings = Settings(), as_of: datetime | None = None, done: Read | None = None
                 ) -> dict[tuple[str, str | None], tuple[float | None, bool]]:
    """Per (cluster, account): the GPU-hours the window's interruptions lost, as figures() counts them for the fleet (None: an
    interruption of unknown GPU count), and whether every one was measured from a reported checkpoint (else an upper bound).
    Teams with no interruption are absent. `done`: the window's read(), any `top` (every interrupted attempt is a row)."""
    done = done or read(con, params, s, as_of)
    classified = done.classified
    times = _saved_times(done)
    out: dict[tuple[str, str | None], tuple[float | None, bool]] = {}
    for c in classified:
        a = c.attempt
        if not (c.interrupted and ends_in(a, params.start, params.end)) or a.start is None:
            continue
        team = (a.cluster, a.account)
        h, measured_all = out.get(team, (0.0, True))
        if a.gpus is None or h is None:
            out[team] = (None, measured_all)
            continue
        gpu_s, measured = interruption_loss(a, times, params.start)
        out[team] = (h + gpu_s / 3600, measured_all and measured)
    return out


def checkpoints_note(f: dict[str, Any]) -> str:
    """How the lost work of the window's interruptions was counted, in words."""
    n, measured = f["interruptions"] - f["lost_unknown_interruptions"], f["lost_measured_interruptions"]
    if not n:
        return "no interruption of known GPU count in this window"
    if measured == n:
        return "every interrupted attempt's job reported checkpoints: its lost work is measured from the last one"
    if not measured:
        return ("no interrupted attempt's job reported a checkpoint (gpufleet.exporter.jobreport.checkpoint_saved): "
                "their work is counted lost from each attempt's start, an upper bound")
    return (f"{measured:,} of {n:,} interrupted attempts' jobs reported checkpoints (lost work measured from the last one); "
            "the others' is counted from the attempt's start, an upper bound")


def largest_chains(classified: list[Classified], linked: list[Classified], chains: list[Chain], times: dict,
                   s: Settings, until: datetime, top: int) -> list[Chain]:
    """The `top` largest chains (GPUs, then wall time): the linked ones, and the jobs that ran once
    among the largest attempts and those that reported checkpoints (a chain of one attempt each)."""
    if top <= 0:
        return []
    in_chains = {id(c) for c in linked}
    alone = [c for c in classified if id(c) not in in_chains and c.attempt.start is not None]
    # (the order below, as a chain of one attempt has it, as sql.RELIABILITY_ATTEMPTS' `top` lists them: which attempts
    # are linked then changes nothing)
    single = {id(c): c for c in heapq.nsmallest(top, alone, key=lambda c: (-(c.attempt.gpus or 0), -_wall_s(c.attempt, until),
                                                                          c.attempt.job_key))}
    if times:
        single.update((id(c), c) for c in alone if (c.attempt.cluster, c.attempt.scheduler, c.attempt.job_key) in times)
    pool = chains + [link_chains([c], times, s, until)[0] for c in single.values()]
    # (none of the first `top` holds fewer GPUs than the top-th most: only those are ordered, in pool's order, as all would be)
    fewest = heapq.nlargest(top, (ch.gpus or 0 for ch in pool))[-1] if pool else 0
    return heapq.nsmallest(top, (ch for ch in pool if (ch.gpus or 0) >= fewest),
                           key=lambda ch: (-(ch.gpus or 0), -ch.wall_s, ch.attempts[0].attempt.job_key))


def _wall_s(a: Attempt, until: datetime) -> float:
    """The wall time of a chain of `a` alone (link_chains' with as_of `until`)."""
    return ((a.end if a.end is not None else until) - a.start).total_seconds()


def _chain_head(ch: Chain) -> dict[str, Any]:
    first = ch.attempts[0].attempt
    return {"job_ids": list(dict.fromkeys(c.attempt.job_id for c in ch.attempts)), "user_name": first.user_name,
            "account": first.account, "name": first.name, "gpus": ch.gpus, "attempts": len(ch.attempts),
            "interruptions": ch.interruptions}


def _advice(ch: Chain, rate: float | None, saved: Saved) -> dict[str, Any]:
    n, cost, used = checkpoint_habits(ch, saved)
    return checkpoint_advice(ch, rate, cost, used, n)


def _chain_row(ch: Chain, rate: float | None, saved: Saved) -> dict[str, Any]:
    """A chain that was interrupted, for the JSON: its attempts, goodput (lost work measured from
    the last reported checkpoint, else an upper bound) and Young/Daly's advice."""
    return {**_chain_head(ch), "causes": [c.cause for c in ch.attempts],
            "wall_h": ch.wall_s / 3600, "run_h": ch.run_s / 3600, "requeue_wait_h": ch.gap_s / 3600,
            "lost_h": ch.lost_s / 3600, "productive_h": ch.productive_s / 3600, "ettr": ch.ettr,
            "lost_is_upper_bound": ch.lost_upper_bound, "lost_basis": "upper bound" if ch.lost_upper_bound else "measured",
            "checkpoint_advice": _advice(ch, rate, saved)}


def _attempt_row(c: Classified, times: dict) -> dict[str, Any]:
    a = c.attempt
    since, measured = lost_since(a, times, a.end) if a.start is not None and a.end is not None else (None, False)
    return {"cluster": a.cluster, "job_id": a.job_id, "attempt": a.attempt, "user_name": a.user_name, "account": a.account, "gpus": a.gpus,
            "start": a.start, "end": a.end, "state": a.state_raw or a.state, "cause": c.cause, "reason": c.reason,
            # the work it lost: from its last reported checkpoint (measured), else from its start (an upper bound)
            "lost_since": since, "lost_basis": "measured" if measured else "upper bound",
            "lost_gpu_h": a.equiv * (a.end - since).total_seconds() / 3600 if since is not None and a.gpus is not None else None,
            "evidence": [{"ts": e.ts, "host": e.host, "gpu": e.gpu, "gpu_uuid": e.gpu_uuid, "kind": e.kind, "code": e.code}
                         for e in c.evidence]}


def advice_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gpufleet.reliability/v1's checkpoint_advice for a table: the job ids joined, and in words
    what the advice says (or why there is none)."""
    out = []
    for x in rows:
        advice = f"no advice: {x['no_advice']}" if x["advised_interval_s"] is None else x["verdict"] or "interval used unknown"
        out.append({**x, "job_ids": ", ".join(x["job_ids"]), "advice": advice})
    return out
