"""Slurm's JSON job records: slurmrestd and `sacct --json`, data_parser v0.0.37 to v0.0.44.

A second way in beside sacct's text. The shapes drift across versions (see shared/data
FORMATS.md section 5): numbers become {set, infinite, number} objects in v0.0.40, job_state
becomes a list, het jobs carry het_job_id/het_job_offset objects.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from gpufleet.collector.schema import Batch, Unrecognized
from gpufleet.collector.sources.base import SourceError
from gpufleet.collector.sources.slurm_parse import (
    _NO_VAL,
    ACCOUNTING_GPUS_SOURCES,
    _Bad,
    _blank_row,
    _Problems,
    expand_hostlist,
    NO_GPU_TRES,
    accounting_gpus_source,
    gres_gpus,
    known_text,
    split_attempts,
    normalise_state,
    settle_accounting_gpus,
    settle_times,
    tres_gpus,
)
from gpufleet.times import utcnow


def _num(v: Any) -> Any:
    """v0.0.40+ {set, infinite, number} or a plain number -> the number, None when unset."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v >= _NO_VAL:
        return None
    return v


def _epoch(v: Any) -> datetime | None:
    n = _num(v)
    return datetime.fromtimestamp(n, timezone.utc).replace(tzinfo=None) if n else None


def _tres_list(items: Any) -> str | None:
    """dbv0.0.37+ tres.allocated [{type, name, count}] -> 'gres/gpu=2,cpu=4' for tres_gpus()."""
    if not isinstance(items, list):
        return None
    parts = [
        f"{t.get('type')}{'/' + t['name'] if t.get('name') else ''}={_num(t.get('count'))}"
        for t in items if isinstance(t, dict) and _num(t.get("count")) is not None  # 22.05's dbv0.0.38: energy count null
    ]
    return ",".join(parts) or None


def _node_count(count: Any, nodes: Any) -> int | None:
    """The job's node count, else the hosts in its node list; None when neither is known."""
    if isinstance(count, int) and count > 0:
        return count
    if not isinstance(nodes, str):
        return None
    try:
        return len(expand_hostlist(nodes)) or None
    except ValueError:
        return None


def _tres_per_gpus(text: Any) -> tuple[int | None, str | None]:
    """slurmctld's tres_per_job / tres_per_node (`gres/gpu:4`, `gres:gpu:4`, `gres/gpu:a100:2`,
    `gres/gpu=2`, comma lists with other gres) -> (GPUs, type); (None, None) when it names no GPU."""
    if not isinstance(text, str) or not text.strip():
        return None, None
    count, gpu_type, _ = gres_gpus(text.replace("=", ":"))
    return (count, gpu_type) if count is not None else (None, None)


# slurmctld's fields that describe a job's GPUs whatever AccountingStorageTRES says: when one of
# them is there and none names a GPU, the job asked for none
_SLURMCTLD_GRES_FIELDS = ("gres_detail", "tres_per_job", "tres_per_node", "tres_per_task", "tres_per_socket")


def slurmctld_gpus(j: dict[str, Any], node_count: Any) -> tuple[int | None, str | None]:
    """GPUs of a slurmctld job record (/slurm/ jobs, scontrol --json): its tres_alloc_str when that
    names gres/gpu (only where accounting tracks it), else the GRES slurmctld allocated
    (gres_detail: `gpu:h100:4(IDX:0-3)`, one per node), else what the job asked for: tres_per_job,
    tres_per_node x its nodes, tres_per_task x its tasks, then tres_req_str. 0 when the GRES fields
    are there and name no GPU; None (unknown) when they are missing (a truncated answer) or name
    GPUs in a way that cannot be counted (per node with no node count, per socket)."""
    gpus, gpu_type = tres_gpus(j.get("tres_alloc_str"))
    if gpus is not None:
        return gpus, gpu_type
    detail = j.get("gres_detail")
    if isinstance(detail, list) and detail:
        gpus, gpu_type, _ = gres_gpus(",".join(str(d) for d in detail))
        if gpus is not None:
            return gpus, gpu_type
    gpus, gpu_type = _tres_per_gpus(j.get("tres_per_job"))
    if gpus is not None:
        return gpus, gpu_type
    for per, many in (("tres_per_node", _node_count(_num(node_count), j.get("nodes"))),
                      ("tres_per_task", _num(j.get("tasks")) or _num(j.get("num_tasks")))):
        each, gpu_type = _tres_per_gpus(j.get(per))
        if each is not None:
            return (each * many, gpu_type) if isinstance(many, int) and many > 0 else (None, gpu_type)
    gpus, gpu_type = tres_gpus(j.get("tres_req_str"))
    if gpus is not None:
        return gpus, gpu_type
    named = [f for f in _SLURMCTLD_GRES_FIELDS if f in j]
    if named and not any("gpu" in str(j.get(f) or "") for f in named):
        return 0, None
    return None, None


def _restd_row(j: dict[str, Any], cluster: str | None, now: datetime) -> tuple[dict, str | None]:
    if j.get("job_id") is None:
        raise _Bad("job without job_id")
    if _num(j["job_id"]) is None:
        raise _Bad(f"bad job_id {j['job_id']!r}")
    key = str(_num(j["job_id"]))
    if "job_state" in j:  # slurmctld (/slurm/ jobs, scontrol --json)
        state_v, user, node_count = j.get("job_state"), j.get("user_name"), j.get("node_count")
        aj, task, task_str = j.get("array_job_id"), j.get("array_task_id"), j.get("array_task_string")
        hj, off = j.get("het_job_id"), j.get("het_job_offset")
        when = [j.get(f"{n}_time") for n in ("submit", "eligible", "start", "end")]
        elapsed, end_reported = None, "end_time" in j  # slurmctld gives no elapsed time
    else:  # slurmdbd (/slurmdb/ jobs, sacct --json): state.current, time.*, array.*, het.*
        state_v, user, node_count = (j.get("state") or {}).get("current"), j.get("user"), j.get("allocation_nodes")
        arr, het, t = j.get("array") or {}, j.get("het") or {}, j.get("time") or {}
        aj, task, task_str = arr.get("job_id"), arr.get("task_id"), arr.get("task")
        hj, off = het.get("job_id"), het.get("job_offset")
        when = [t.get(n) for n in ("submission", "eligible", "start", "end")]
        elapsed, end_reported = _num(t.get("elapsed")), "end" in t
    aj, task, hj, off = _num(aj), _num(task), _num(hj), _num(off)
    states = [str(s) for s in (state_v if isinstance(state_v, list) else [state_v]) if s]
    state = states[0] if states else None  # the base state comes first, flags follow
    norm, known = normalise_state(state)
    tres = j.get("tres") or {}
    alloc = j.get("tres_alloc_str") or _tres_list(tres.get("allocated"))
    no_gpu_tres = False
    if "job_state" in j:
        gpus, gpu_type = slurmctld_gpus(j, node_count)
        gpus_source = None if gpus is None else "slurmctld"
    else:
        gpus, gpu_type = tres_gpus(alloc)
        requested = _tres_list(tres.get("requested"))
        if gpus is None and requested:
            gpus, gpu_type = tres_gpus(requested)
        gpus_source = None if gpus is None else accounting_gpus_source(norm)
        no_gpu_tres = gpus is None and bool(alloc or requested)
    ec = j.get("exit_code")
    if isinstance(ec, dict):
        sig = _num(((ec.get("signal") or {}).get("id"))) or 0
        exit_code = f"{_num(ec.get('return_code')) or 0}:{sig}"
        if exit_code == "0:0" and norm == "FAILED":
            # Slurm 22.05's dbv0.0.38 (slurmrestd and sacct --json) answers {SUCCESS, 0} for every
            # job, a FAILED one with `exit 3` included (sacct's text says 3:0; seen on the test
            # cluster): a failure with a success code is no exit code at all, so unknown
            exit_code = None
    else:  # slurmctld's v0.0.37/38 job_info: the raw wait status (768 = exit 3; 15 = SIGTERM), as sacct decodes it
        n = _num(ec)
        exit_code = None if n is None else f"{(int(n) >> 8) & 0xFF}:{int(n) & 0x7F}"
    times = dict(zip(("submit", "eligible", "start", "end"), map(_epoch, when)))
    # slurmctld fills in the *expected* start/end of a job not started/ended; slurmdbd writes
    # end 0 for a record that ended without an end (NODE_FAIL): Start + time.elapsed
    settled = settle_times(times, norm, elapsed, key, end_reported) if states else None
    row = _blank_row(
        cluster=cluster or j.get("cluster") or "default", scheduler="slurm", job_key=key, job_id=key,
        name=j.get("name") or None, user_name=user or None, account=j.get("account") or None,
        partition=j.get("partition") or None, qos=j.get("qos") or None, state=norm if states else None,
        state_raw=",".join(states) or None, exit_code=exit_code, gpus=gpus, gpu_type=gpu_type,
        gpus_source=gpus_source, node_count=_num(node_count),
        nodes=known_text(j.get("nodes")), alloc_tres=alloc or None, source="slurmrestd", updated_at=now,
        **times,
    )
    if no_gpu_tres:
        row[NO_GPU_TRES] = True
    if aj:
        if task is not None:
            row.update(job_id=f"{aj}_{task}", array_job_id=str(aj), array_task_id=str(task))
        elif task_str:
            row.update(job_id=f"{aj}_[{task_str}]", array_job_id=str(aj), array_task_id=str(task_str))
    elif hj:
        row.update(job_id=f"{hj}+{int(off or 0)}", het_job_id=str(hj), het_job_offset=int(off or 0))
    return row, settled or (None if known or not states else f"unknown state {state!r} for job {key}, kept as UNKNOWN")


def parse_slurmrestd_jobs(
    doc: dict[str, Any], cluster: str | None = None, now: datetime | None = None, tracks_gpus: bool | None = None
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """slurmrestd /slurm/ or /slurmdb/ job list (or `sacct --json`) -> (rows, rejected, problems).

    `tracks_gpus`: whether slurmdbd records gres/gpu (slurm_parse.settle_accounting_gpus).

    Handles data_parser v0.0.40+ ({set, infinite, number} numbers, job_state lists) and the older
    dbv0.0.37 / v0.0.38 shapes (plain numbers, state strings, tres.allocated lists).
    """
    now = now or utcnow()
    problems, jobs, rejected = _Problems(), [], 0
    items = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return [], 1, [f"no 'jobs' list in the document (keys: {sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__})"]
    for i, j in enumerate(items):
        try:
            if not isinstance(j, dict):
                raise _Bad(f"not an object: {type(j).__name__}")
            row, note = _restd_row(j, cluster, now)
        except (_Bad, TypeError, ValueError, AttributeError, OverflowError) as e:
            rejected += 1
            problems.add(f"jobs[{i}]: {e}")
            continue
        if note:
            problems.add(f"jobs[{i}]: {note}")
        jobs.append(row)
    settle_accounting_gpus(jobs, tracks_gpus)
    return jobs, rejected, problems.done()


MAX_PROBLEMS_PER_BATCH = 20
ACCOUNTING_GPUS_FIX = "add gres/gpu to AccountingStorageTRES in slurm.conf"


def note_gpu_tracking(batch: Batch, input: str, tracks_gpus: bool | None) -> bool | None:
    """After a batch of accounting records: whether the accounting tracks GPUs now (what the
    source knew, or True once a record named one), and when it does not (or no record has shown
    it does) while jobs of the batch have TRES naming no GPU, an Unrecognized entry saying so with
    the fix: logged by the collector, counted, on the Health page. Those jobs' GPU counts stay
    unknown unless slurmctld or the exporters' job mapping gives them (collector.store JOB_MERGE)."""
    from_records = any(j.get("gpus_source") in ACCOUNTING_GPUS_SOURCES for j in batch.jobs)
    tracks = True if from_records else tracks_gpus
    unknown = sum(1 for j in batch.jobs if j.get("gpus") is None and j.get("alloc_tres"))
    if tracks is not True and unknown:
        why = ("slurmdbd's TRES list has no gres/gpu" if tracks is False
               else "no job record of this read names a gres/gpu TRES")
        batch.unrecognized.append(Unrecognized(input, "accounting_without_gpus", (
            f"{why}: the GPU counts of {unknown} of its {len(batch.jobs)} jobs are unknown unless slurmctld or the "
            f"exporters' job mapping tells them (never 0); {ACCOUNTING_GPUS_FIX}")))
    return tracks


def tres_tracks_gpus(text: str | bytes) -> bool | None:
    """slurmrestd's /slurmdb/vX/tres answer (the TRES slurmdbd accounts, AccountingStorageTRES)
    -> whether gres/gpu is among them; None when the answer lists no TRES at all."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    found: list[dict[str, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            if "type" in v and "name" in v:
                found.append(v)
            else:
                for x in v.values():
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(doc.get("TRES", doc.get("tres")) if isinstance(doc, dict) else None)
    if not found:
        return None
    return any(t.get("type") == "gres" and str(t.get("name") or "").split(":")[0] == "gpu" for t in found)


def jobs_batch(text: str | bytes, *, key: str, input: str, cluster: str, now: datetime, source: str = "slurmrestd",
               tracks_gpus: bool | None = None) -> Batch:
    """One JSON job listing (a slurmrestd answer, `sacct --json`, a file of either) -> a Batch.

    Text that is not JSON, or JSON without a `jobs` list, is input of a shape this does not know:
    SourceError naming `input` and what was there (with an Unrecognized for the report). Slurm's
    own `errors` beside the jobs are kept as problems; with no jobs they fail the read.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.removeprefix("\ufeff")
    try:
        doc = json.loads(text)
    except ValueError as e:
        what = f"not JSON ({e}): {text[:120]!r}"
        raise SourceError(f"{input}: {what}", [Unrecognized(input, "not_json", what)]) from None
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, cluster, now, tracks_gpus)
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SourceError(f"{input}: {problems[0]}", [Unrecognized(input, "no_jobs_list", problems[0])])
    errors = [error_text(e) for e in doc.get("errors") or [] if not _no_jobs_in_window(e)]
    if errors and not jobs:
        raise SourceError(f"{input}: Slurm answered with errors: {'; '.join(errors[:3])}")
    for job in jobs:
        job["source"] = source
    latest, attempts = split_attempts(jobs)
    return Batch(key=key, jobs=latest, attempts=attempts, rejected=rejected,
                 problems=([f"Slurm reported: {e}" for e in errors[:3]] + problems)[:MAX_PROBLEMS_PER_BATCH])


def _no_jobs_in_window(e: Any) -> bool:
    """slurmdbd's way (Slurm 22.05's slurmdb_jobs_get, seen on a real cluster) of saying a window
    holds no job: an empty answer, not a failed read. Any other "Nothing found" (a description
    naming why, e.g. slurmdbd down) is still an error."""
    return (isinstance(e, dict) and e.get("source") == "slurmdb_jobs_get"
            and {e.get("error"), e.get("description")} == {"Nothing found", "Nothing found with query"})


def error_text(e: Any) -> str:
    """slurmrestd's {error, error_number, description, source} (or a plain string) -> one line."""
    if not isinstance(e, dict):
        return str(e)[:200]
    parts = [str(e.get(k)) for k in ("description", "error", "source") if e.get(k)]
    return " / ".join(parts)[:200] or json.dumps(e)[:200]
