"""Parsers for what Slurm says about jobs: sacct text, `scontrol show job -d`, slurmrestd JSON.

Pure functions (text or dict in, rows out) so every quirk is testable without a Slurm. Job rows
carry exactly gpufleet.collector.schema.JOB_COLUMNS. A bad record is counted and described, never raised:
one garbled line must not lose the good ones around it (DESIGN contract 6). The quirks handled
are listed in shared/data/FORMATS.md sections 4-6.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from gpufleet.collector.schema import ATTEMPT_COLUMNS, JOB_COLUMNS
from gpufleet.times import utcnow

# Base job states (first word of sacct's State) plus the flags Slurm can print in their place.
KNOWN_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED", "RESIZING", "REVOKED",
    "SPECIAL_EXIT", "COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING", "STAGE_OUT",
    "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "LAUNCH_FAILED",
})
# States of a record that is over: it has an end, even when Slurm did not write it down. A
# REQUEUED record is a finished attempt (sacct --duplicates, slurmdbd's state.current): the job
# went back to the queue as a new record with its own start.
TERMINAL_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
    "OUT_OF_MEMORY", "REQUEUED", "REVOKED", "SPECIAL_EXIT", "LAUNCH_FAILED",
})
# States of a job that has not ended: its End is not a fact yet, whatever Slurm prints there
# (End = Start or Unknown in sacct, 0 or a forecast in JSON).
OPEN_STATES = KNOWN_STATES - TERMINAL_STATES
# ... and of those, a job that has not started: a Start is only the scheduler's plan.
NOT_STARTED_STATES = frozenset({"PENDING", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
MAX_PROBLEMS = 50
_NULLS = frozenset({"", "unknown", "none", "n/a", "(null)", "none assigned", "invalid"})
_NO_VAL = 0xFFFFFFFE  # Slurm's NO_VAL/INFINITE in old JSON: "not set", never a real number
_JOBID = re.compile(
    r"^(?P<base>\d+)(?:_(?P<task>\d+)|_\[(?P<range>[0-9,%:\-]+)\]|\+(?P<off>\d+))?(?:\.(?P<step>\S+))?$"
)
_EXIT = re.compile(r"^\d+:\d+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # all but tab, line feed, carriage return
_ELAPSED = re.compile(r"^(?:(\d+)-)?(\d+(?::\d+)*(?:\.\d+)?)$")


class _Bad(ValueError):
    """A record that cannot be trusted (misaligned fields, bad ids or times): rejected."""


class _Problems(list):
    """The first MAX_PROBLEMS messages, then a count, so garbage input cannot flood the log."""

    dropped = 0

    def add(self, msg: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(msg)
        else:
            self.dropped += 1

    def done(self) -> list[str]:
        return list(self) + ([f"... and {self.dropped} more"] if self.dropped else [])


# ---- small value parsers -------------------------------------------------------------------


def as_tz(tz: str | tzinfo | None) -> tzinfo:
    if tz is None or (isinstance(tz, str) and tz.upper() in ("UTC", "Z")):
        return timezone.utc
    return ZoneInfo(tz) if isinstance(tz, str) else tz


def parse_time(value: str | None, tz: str | tzinfo | None = "UTC") -> datetime | None:
    """Slurm's local ISO time (or epoch seconds) -> naive UTC; Unknown/None/empty -> None.

    sacct prints the cluster's local time without an offset, so `tz` says which zone that was.
    """
    v = (value or "").strip()
    if v.lower() in _NULLS:
        return None
    if v.isdigit():  # SLURM_TIME_FORMAT=%s
        return datetime.fromtimestamp(int(v), timezone.utc).replace(tzinfo=None) if int(v) else None
    dt = datetime.fromisoformat(v)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=as_tz(tz))
    return dt.astimezone(timezone.utc).replace(tzinfo=None)


def parse_elapsed(value: str | None) -> float | None:
    """`D-HH:MM:SS`, `HH:MM:SS`, `MM:SS`, `MM:SS.mmm` -> seconds; empty/INVALID/UNLIMITED -> None."""
    v = (value or "").strip()
    if v.lower() in _NULLS or v.upper() in ("UNLIMITED", "PARTITION_LIMIT"):
        return None
    m = _ELAPSED.match(v)
    parts = m[2].split(":") if m else []
    if not 1 <= len(parts) <= 3 or (len(parts) == 1 and not m[1]) or any("." in p for p in parts[:-1]):
        raise ValueError(f"bad elapsed time {v!r}")
    days = int(m[1] or 0)
    if not m[1] and len(parts) == 2:  # MM:SS[.mmm]
        parts = ["0", *parts]
    h, mi, s = (parts + ["0", "0"])[:3]  # D-HH, D-HH:MM, [D-]HH:MM:SS
    h, mi, s = int(h), int(mi), float(s)
    return days * 86400 + h * 3600 + mi * 60 + s


def split_top(text: str) -> list[str]:
    """Split on commas outside () and [] (gpu(IDX:0,2),gg:g0(CNT:1); node[1-3,5],gpu7)."""
    return [p.strip() for p in re.split(r",(?![^\[(]*[\])])", text) if p.strip()]


def parse_idx(text: str) -> list[int]:
    """'0,2-3,5' -> [0, 2, 3, 5]; 'N/A' or '' -> []."""
    out: list[int] = []
    for lo, _, hi in (p.strip().partition("-") for p in text.split(",") if p.strip().upper() not in ("", "N/A")):
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def expand_hostlist(text: str | None, limit: int = 100_000) -> list[str]:
    """Slurm hostlist -> hosts: 'node[01-03,05],gpu7' -> node01 node02 node03 node05 gpu7.

    Zero padding follows the range's lower bound, as Slurm writes it; several bracket groups in a
    name expand as a product.
    """
    hosts: list[str] = []
    for item in split_top(text or ""):
        todo = [item]
        while todo:
            name = todo.pop(0)
            m = re.search(r"\[([^\]]*)\]", name)
            if not m:
                hosts.append(name)
                if len(hosts) > limit:
                    raise ValueError(f"hostlist {text[:60]!r} expands past {limit} hosts")
                continue
            for part in m[1].split(","):
                lo, _, hi = part.strip().partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise ValueError(f"bad hostlist range {part!r} in {text!r}")
                if hi and int(hi) - int(lo) > limit:
                    raise ValueError(f"hostlist {text[:60]!r} expands past {limit} hosts")
                todo.extend(
                    name[: m.start()] + str(n).zfill(len(lo)) + name[m.end():]
                    for n in range(int(lo), int(hi or lo) + 1)
                )
    return hosts


def tres_gpus(tres: str | None) -> tuple[int | None, str | None]:
    """GPU count and type from a TRES string; (None, None) when it says nothing about GPUs.

    Slurm lists the untyped total next to the typed counts (`gres/gpu=1,gres/gpu:a100=1`): the
    total wins, typed counts are summed only when no total is given. gres/gpumem, gres/gpuutil
    are usage TRES, not GPUs.
    """
    total, typed = None, {}
    for item in (tres or "").split(","):
        key, _, val = item.strip().partition("=")
        if key != "gres/gpu" and not key.startswith("gres/gpu:"):
            continue
        try:
            n = int(val)
        except ValueError:
            continue
        if key == "gres/gpu":
            total = n
        else:
            typed[key[len("gres/gpu:"):]] = typed.get(key[len("gres/gpu:"):], 0) + n
    gpu_type = ",".join(sorted(typed)) or None
    if total is not None:
        return total, gpu_type
    return (sum(typed.values()), gpu_type) if typed else (None, None)


def alloc_tres_gpu_count(tres: str | None) -> int:
    """xdmod's rule: the GPUs in AllocTRES, 0 when it names none."""
    return tres_gpus(tres)[0] or 0


_GRES_ITEM = re.compile(
    r"^(?:gres[/:])?(?P<name>[^:()=]+)(?::(?P<type>[^:()]*))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?$"
)


def gres_gpus(gres: str | None) -> tuple[int | None, str | None, list[int] | None]:
    """GPU count, type and Slurm GRES indices from a GRES string (ReqGRES, AllocGRES, scontrol's
    GRES=/GRES_IDX=, slurmrestd gres_detail): `gpu:2`, `gpu:tesla:2`, `gpu(IDX:0,2-3,5)`,
    `gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)`, `gpu:(null):2(IDX:0-1)`. Other GRES are ignored."""
    count = gtype = idx = None
    for item in split_top((gres or "").replace("(null)", "")):
        m = _GRES_ITEM.match(item)
        if not m or m["name"] != "gpu":
            continue
        t, n = m["type"] or None, m["count"]
        if n is None and t and t.isdigit():  # gpu:2
            t, n = None, t
        extra = m["extra"] or ""
        ids = parse_idx(extra[4:]) if extra.upper().startswith("IDX:") else None
        if ids is not None:
            idx = (idx or []) + ids
        c = int(n) if n is not None else (len(ids) if ids is not None else 1)
        count = (count or 0) + c
        gtype = gtype or t
    return count, gtype, idx


# A job row's mark while it is parsed: its accounting TRES were reported and name no GPU. Taken
# off by settle_accounting_gpus: a row leaves the parser with exactly JOB_COLUMNS.
NO_GPU_TRES = "_no_gpu_tres"
ACCOUNTING_GPUS_SOURCES = ("slurmdbd", "slurmdbd_running")  # collector.schema.GPUS_SOURCES of accounting


def accounting_gpus_source(state: str | None) -> str:
    """gpus_source of a count from an accounting record: final once the record has ended."""
    return "slurmdbd" if state in TERMINAL_STATES else "slurmdbd_running"


def settle_accounting_gpus(jobs: list[dict[str, Any]], tracks_gpus: bool | None = None) -> bool:
    """Rows whose accounting TRES name no GPU: 0 GPUs where accounting tracks GPUs, else unknown.

    slurmdbd records gres/gpu only when AccountingStorageTRES includes it; without it every job's
    TRES name no GPU whatever it held, so "no GPU TRES" is 0 only when the accounting is known to
    track GPUs: `tracks_gpus` (asked of slurmdbd, or remembered by the source), else when any
    record here names a GPU. Returns whether it tracks them, as far as that shows."""
    tracks = bool(tracks_gpus) or any(j.get("gpus_source") in ACCOUNTING_GPUS_SOURCES for j in jobs)
    for j in jobs:
        if j.pop(NO_GPU_TRES, False) and tracks and j.get("gpus") is None:
            j.update(gpus=0, gpus_source=accounting_gpus_source(j.get("state")))
    return tracks


def known_text(v: Any) -> str | None:
    """Text as Slurm printed it, None for its placeholders of nothing ("None assigned", "(null)",
    "Unknown", "N/A", ""), on every route: a placeholder is not a value."""
    if not isinstance(v, str):
        return None
    v = v.strip()
    return None if v.lower() in _NULLS else v


def normalise_state(raw: str | None) -> tuple[str, bool]:
    """'CANCELLED by 1000' -> ('CANCELLED', True); an unknown word -> ('UNKNOWN', False)."""
    word = (raw or "").strip().split(" ")[0].upper().rstrip("+")
    return (word, True) if word in KNOWN_STATES else ("UNKNOWN", False)


def settle_times(times: dict[str, Any], state: str, elapsed: float | None, job: str,
                 end_reported: bool = True) -> str | None:
    """Make `times` (start, end: naive UTC or None) follow the job's state; a problem or None.

    - Not ended (RUNNING, SUSPENDED, ...): end None, whatever Slurm printed (sacct shows End =
      Start or Unknown for a running job, JSON 0 or the time limit's forecast). Not started
      (PENDING, REQUEUE_HOLD, ...): start None as well, it is only the planned start.
    - Ended (TERMINAL_STATES): an End that is missing, or equal to Start while Elapsed says the
      job ran, is Start + Elapsed (slurmdbd writes no end for a NODE_FAIL record, time.end 0).
      With no End and no Start + Elapsed to derive it, the end stays unknown and that is
      reported: the store and analytics read a job without an end as still running.
    - Anything else (UNKNOWN): left as Slurm said.
    `end_reported`: the input had an end field at all (a format without End reports nothing).
    """
    if state in OPEN_STATES:
        times["end"] = None
        if state in NOT_STARTED_STATES:
            times["start"] = None
        return None
    if state not in TERMINAL_STATES:
        return None
    start, end = times.get("start"), times.get("end")
    if end is None or (end == start and elapsed):
        if start is not None and elapsed is not None:
            times["end"] = start + timedelta(seconds=elapsed)
        elif end is None and end_reported:
            return (f"job {job} is {state} but has no end time and no Start + Elapsed to derive it: "
                    "end left unknown, so it reads as not ended")
    return None


def _blank_row(**kw: Any) -> dict[str, Any]:
    row = dict.fromkeys(JOB_COLUMNS)
    row.update(kw)
    return row


# ---- sacct ---------------------------------------------------------------------------------


def _sacct_row(v: dict[str, str], cluster: str | None, tz: tzinfo, now: datetime) -> tuple[dict | None, str | None]:
    """One sacct line (column name -> text) -> (row, or None for a step; unknown-state note)."""
    jid = (v.get("jobid") or v.get("jobidraw") or "").strip()
    m = _JOBID.match(jid)
    if not m:
        raise _Bad(f"bad JobID {jid[:40]!r}")
    if m["step"]:
        return None, None
    raw = (v.get("jobidraw") or "").strip()
    if raw and not _JOBID.match(raw):
        raise _Bad(f"bad JobIDRaw {raw[:40]!r}")
    try:
        times = {c: parse_time(v.get(c), tz) for c in ("submit", "eligible", "start", "end")}
        elapsed = parse_elapsed(v.get("elapsed"))
    except ValueError as e:
        raise _Bad(str(e)) from None
    exit_code = (v.get("exitcode") or "").strip() or None
    if exit_code and not _EXIT.match(exit_code):
        raise _Bad(f"bad ExitCode {exit_code[:20]!r}")
    nnodes = (v.get("nnodes") or "").strip()
    if nnodes and not nnodes.isdigit():
        raise _Bad(f"bad NNodes {nnodes[:20]!r}")
    state_raw = (v.get("state") or "").strip() or None
    state, known = normalise_state(state_raw)
    note = None if known else f"unknown state {state_raw!r} for job {jid}, kept as UNKNOWN"
    note = settle_times(times, state, elapsed, jid, end_reported="end" in v) or note

    # Allocated beats requested; TRES beats the pre-19.05 GRES columns. TRES that name no GPU
    # say 0 only where accounting tracks GPUs (settle_accounting_gpus), else the count is unknown.
    gpus = gpu_type = None
    for col in ("alloctres", "allocgres", "reqtres", "reqgres"):
        if gpus is None and v.get(col):
            gpus, gpu_type = tres_gpus(v[col]) if col.endswith("tres") else gres_gpus(v[col])[:2]
    no_gpu_tres = gpus is None and any((v.get(c) or "").strip() for c in ("alloctres", "allocgres", "reqtres", "reqgres"))
    nodes = (v.get("nodelist") or "").strip()
    row = _blank_row(
        cluster=cluster or (v.get("cluster") or "").strip() or "default",
        scheduler="slurm", job_key=raw or jid, job_id=jid,
        name=v.get("jobname") or None, state=state, state_raw=state_raw, exit_code=exit_code,
        gpus=gpus, gpu_type=gpu_type, gpus_source=None if gpus is None else accounting_gpus_source(state),
        node_count=int(nnodes) if nnodes else None, nodes=known_text(nodes),
        alloc_tres=(v.get("alloctres") or "").strip() or None, source="sacct", updated_at=now, **times,
    )
    if no_gpu_tres:
        row[NO_GPU_TRES] = True
    for col, key in (("user_name", "user"), ("account", "account"), ("partition", "partition"), ("qos", "qos")):
        row[col] = (v.get(key) or "").strip() or None
    if m["task"] is not None or m["range"] is not None:
        row.update(array_job_id=m["base"], array_task_id=m["task"] if m["task"] is not None else m["range"])
    elif m["off"] is not None:
        row.update(het_job_id=m["base"], het_job_offset=int(m["off"]))
    return row, note


def parse_sacct(
    text: str | bytes,
    fields: Sequence[str] | None = None,
    delimiter: str = "|",
    cluster: str | None = "default",
    now: datetime | None = None,
    tz: str | tzinfo | None = "UTC",
    tracks_gpus: bool | None = None,
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """`sacct -P`/`-p` output -> (job rows, rejected line count, problems).

    `tracks_gpus`: whether this accounting records gres/gpu (None: as far as these records show;
    see settle_accounting_gpus).

    Without `fields` the first line is the header. Steps (123.batch, 123+0.0) are skipped: they
    are not jobs. A line with k fields too many is a job name containing the delimiter when the
    format has JobName: the k+1 fields from JobName's position are joined back and kept if the
    rest then validates. A job name may hold a line break (sbatch --job-name takes one and sacct
    prints it as is): when JobName is the last column, a line with too few fields that does not
    start with a job ID continues the line before it. `cluster=None` takes the Cluster column.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.removeprefix("\ufeff")  # a byte-order mark (a file saved on Windows) is not part of the header
    now = now or utcnow()
    zone = as_tz(tz)
    problems, jobs, rejected = _Problems(), [], 0
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    trailing: bool | None = None  # --parsable: every line ends with the delimiter
    header = None
    if fields is None:
        if not lines:
            return [], 0, []
        header = lines.pop(0)[1].rstrip("\r")
        fields = header.split(delimiter)
        trailing = len(fields) > 1 and fields[-1] == ""
        if trailing:
            fields = fields[:-1]
    else:
        header = delimiter.join(fields)  # skipped if sacct printed one after all
    names = [f.strip().lower().split("%")[0] for f in fields]
    if "jobid" not in names and "jobidraw" not in names:
        problems.add(f"no JobID column in {list(fields)[:8]}: nothing parsed")
        return [], len(lines), problems.done()
    width, name_at = len(names), names.index("jobname") if "jobname" in names else None
    if name_at == width - 1:
        lines = _join_name_lines(lines, delimiter, width)

    for lineno, line in lines:
        line = line.rstrip("\r")
        if line == header:
            continue
        parts = line.split(delimiter)
        tries = []
        if trailing is not False and parts[-1] == "" and len(parts) > 1:
            tries.append(parts[:-1])
        if trailing is not True:
            tries.append(parts)
        result, error = None, None
        for p in tries:
            joined = len(p) > width and name_at is not None
            if joined:
                k = len(p) - width
                p = p[:name_at] + [delimiter.join(p[name_at:name_at + k + 1])] + p[name_at + k + 1:]
            if len(p) != width:
                continue
            try:
                result = _sacct_row(dict(zip(names, p)), cluster, zone, now)
                break
            except _Bad as e:
                error = error or (f"JobName with the delimiter did not fit ({e})" if joined else str(e))
        if result is None:
            rejected += 1
            count = f"{len(parts)} fields, expected {width}" if len(parts) != width else ""
            problems.add(f"line {lineno}: {'; '.join(filter(None, (count, error)))}: {line[:120]!r}")
            continue
        row, note = result
        if note:
            problems.add(f"line {lineno}: {note}")
        if row is not None:
            jobs.append(row)
    settle_accounting_gpus(jobs, tracks_gpus)
    return jobs, rejected, problems.done()


def _join_name_lines(lines: list[tuple[int, str]], delimiter: str, width: int) -> list[tuple[int, str]]:
    """Rejoin job names that hold line breaks: a line with fewer than `width` fields (the name
    is the last column) that neither starts with a job ID nor holds a control character (a name
    cannot: garbage is rejected, not glued to a good job) continues the line before it."""
    out: list[tuple[int, str]] = []
    for lineno, line in lines:
        parts = line.split(delimiter)
        if (out and len(parts) < width and not (len(parts) > 1 and _JOBID.match(parts[0].strip()))
                and not any(_CONTROL.search(p) for p in parts)):
            out[-1] = (out[-1][0], f"{out[-1][1]}\n{line}")
        else:
            out.append((lineno, line))
    return out


# ---- scontrol show job -d --------------------------------------------------------------------


def _kv(record: str, key: str) -> str | None:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", record)
    return m[1] if m else None


def parse_scontrol_show_job_d(text: str | bytes) -> list[dict[str, Any]]:
    """`scontrol show job -d` -> one dict per job with its GPUs per node as Slurm GRES indices.

    `gres_idx` maps each host to the indices in IDX:... Those are positions in the node's
    gres.conf, not NVML indices or device minors: mapping them to a physical GPU needs that
    node's gres.conf (see tests/realstack/slurm.py).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out = []
    for record in re.split(r"(?m)^(?=JobId=)", text):
        if not record.startswith("JobId="):
            continue
        first = record.split("\n", 1)[0]
        key = _kv(first, "JobId") or ""
        rec: dict[str, Any] = {
            "job_key": key, "job_id": key, "array_job_id": _kv(first, "ArrayJobId"),
            "array_task_id": _kv(first, "ArrayTaskId"), "het_job_id": _kv(record, "HetJobId"),
            "het_job_offset": None,
            "name": first.split("JobName=", 1)[1].strip() if "JobName=" in first else None,
            "user_name": (_kv(record, "UserId") or "").split("(")[0] or None,
            "account": _kv(record, "Account"), "partition": _kv(record, "Partition"),
            "state": _kv(record, "JobState"), "nodes": _kv(record, "NodeList"),
        }
        rec["nodes"] = known_text(rec["nodes"])
        if rec["array_task_id"] is not None:
            t = rec["array_task_id"]
            rec["job_id"] = f"{rec['array_job_id']}_{t}" if t.isdigit() else f"{rec['array_job_id']}_[{t}]"
        elif rec["het_job_id"] is not None:
            rec["het_job_offset"] = int(_kv(record, "HetJobOffset") or 0)
            rec["job_id"] = f"{rec['het_job_id']}+{rec['het_job_offset']}"
        gres_idx: dict[str, list[int]] = {}
        gpu_type = None
        for line in record.split("\n"):
            m = re.match(r"\s*Nodes=(\S+)\s", line)
            gres = re.search(r"\s(?:GRES_IDX|GRES)=(\S*)", line) if m else None
            if not gres:
                continue
            _, t, idx = gres_gpus(gres[1])
            gpu_type = gpu_type or t
            if idx:
                for host in expand_hostlist(m[1]):
                    gres_idx[host] = idx
        rec.update(gres_idx=gres_idx, gpu_type=gpu_type, gpus=sum(len(v) for v in gres_idx.values()))
        out.append(rec)
    return out


def split_attempts(jobs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one row per job_key: its latest record, the earlier attempts) of a listing that may hold
    several records of a job (sacct --duplicates, slurmdbd's jobs: a requeue ends a record and
    starts another under the same JobIDRaw). Latest: a record not ended (running, or pending
    again after the requeue), else the last to start, else the last printed. An earlier record
    that never started ran no attempt and is left out; the others are ATTEMPT_COLUMNS rows."""
    by_key: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, job in enumerate(jobs):
        by_key.setdefault(job["job_key"], []).append((i, job))
    latest, earlier = [], []
    for records in by_key.values():
        records.sort(key=lambda r: (r[1].get("start") is None or r[1].get("end") is None, r[1].get("start") or datetime.min, r[0]))
        latest.append(records[-1])
        earlier.extend({c: job.get(c) for c in ATTEMPT_COLUMNS} for _, job in records[:-1] if job.get("start") is not None)
    return [job for _, job in sorted(latest, key=lambda r: r[0])], earlier


def latest_per_key(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job_key, the last one sacct printed (the store upserts by key: two rows with
    one key in a batch would conflict). Without --duplicates this only bites when a pending
    array range and its last task share the array's JobIDRaw in one listing."""
    latest: dict[str, dict[str, Any]] = {}
    for job in jobs:
        latest.pop(job["job_key"], None)
        latest[job["job_key"]] = job
    return list(latest.values())
