"""Reliability and goodput (DESIGN.md contract 7): how each job attempt ended, what failures cost,
how long a job of N GPUs survives, which nodes are lemons.

Pure functions over attempts (one ended run of a job: a Slurm requeue starts a new attempt of the
same job) and the health events of their GPUs, read by gpufleet.analytics.reliability_store. Definitions:

- Cause, one per attempt, the first rule that applies (CAUSES):
  1. not ended (RUNNING, PENDING, ...): "not_ended", in no figure;
  2. COMPLETED: "completed" (a hardware event near its end does not undo a success);
  3. the scheduler's verdict naming who stopped it: TIMEOUT/DEADLINE "timeout", PREEMPTED "preempted",
     a cancel in the policy audit (result ok) "cancelled_policy", "CANCELLED by <uid>" of admin_uids "cancelled_admin";
  4. a HARDWARE_EVENTS event on one of its GPUs in [end - hardware_window, end + grace]: "hardware", the
     events its evidence. It outranks FAILED, NODE_FAIL, REQUEUED, a user's cancel and UNKNOWN: a job that
     crashed on XID 79 reports FAILED, and a person who scancels a job hung on a dead GPU did not end it;
  5. NODE_FAIL, BOOT_FAIL, LAUNCH_FAILED: "node_failure";
  6. REQUEUED with no evidence: "requeued" (why unknown);
  7. CANCELLED by another uid: "cancelled_user"; with no uid: "cancelled_unknown";
  8. FAILED, OUT_OF_MEMORY, SPECIAL_EXIT, or a non-zero exit code: "user_error";
  9. anything else: "unknown".
- Interruption: ended for a reason outside the job (INTERRUPTION_CAUSES); failure: the infrastructure's
  fault (FAILURE_CAUSES) - what MTTF and lemons count.
- Exposure: GPU-hours clipped to the window; an interruption counts in the window its end falls in.
- MTTF of a size bucket: its job-hours (not GPU-hours) / its failures, with an exact (Garwood) Poisson
  interval. Per-GPU rate r = failures / GPU-hours; MTTF_N = 1 / (N r) (failures independent across GPUs).
- Lemon: a node whose failures k are improbably many for its GPU-hours e: P(Poisson(r e) >= k) <
  false_positive_rate / nodes (Bonferroni: on a fleet with no lemon, any node is named with at most that
  chance) and k >= min_count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Sequence

from gpufleet.analytics import vocabulary as words
from gpufleet.config import Option, number, strings
from gpufleet.times import default_bucket

CAUSES = ("completed", "user_error", "hardware", "node_failure", "timeout", "preempted", "requeued",
          "cancelled_user", "cancelled_admin", "cancelled_policy", "cancelled_unknown", "unknown", "not_ended")
CAUSE_LABELS = {
    "completed": "completed", "user_error": "user error", "hardware": "hardware", "node_failure": "node failure",
    "timeout": "time limit", "preempted": "preempted", "requeued": "requeued (why unknown)",
    "cancelled_user": "cancelled by user", "cancelled_admin": "cancelled by an admin",
    "cancelled_policy": "cancelled by gpufleet policy", "cancelled_unknown": "cancelled (by whom unknown)",
    "unknown": "unknown", "not_ended": "not ended",
}
FAILURE_CAUSES = ("hardware", "node_failure")
INTERRUPTION_CAUSES = FAILURE_CAUSES + ("preempted", "requeued", "cancelled_admin")

# XIDs of the hardware's (or firmware's) fault; application faults (13, 31, 43, 45) are not evidence
HARDWARE_XIDS: dict[int, str] = {
    48: "ECC double-bit error", 61: "GPU microcontroller breakpoint", 62: "GPU microcontroller halt",
    63: "row remapping (pending)", 64: "row remapping failed", 74: "NVLink error", 79: "GPU fell off the bus",
    92: "high single-bit ECC rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error", 140: "unrecovered ECC error",
}  # = xid_hardware in alerts/thresholds.yml (tests/test_reliability.py holds them together)
# health event kinds (gpufleet.analytics.health.events) that are hardware evidence; "xid" only with a HARDWARE_XIDS code
HARDWARE_EVENTS = ("xid", "ecc_dbe", "row_remap", "row_remap_failure", "gpu_lost")

# Job size buckets (GPUs), the published anchors' grid
SIZE_BUCKETS = ((1, 1, "1"), (2, 8, "2-8"), (9, 64, "9-64"), (65, 512, "65-512"), (513, 4096, "513-4096"),
                (4097, None, ">4096"))
PROJECTED_SIZES = (1024, 16384, 100000)

OPTIONS = (
    Option("reliability_hardware_window_seconds", 600.0,
           "a number of seconds > 0 (a hardware event this long before an attempt's end caused it)", number(0)),
    Option("reliability_resubmit_window_seconds", 3600.0,
           "a number of seconds > 0 (a resubmission this soon after a failed attempt continues its chain)", number(0)),
    Option("reliability_admin_uids", ["0"], "a list of uid strings whose cancels are an admin's", strings),
    Option("reliability_lemon_false_positive_rate", 0.01, "a probability in (0, 1)", lambda v: number(0)(v) and v < 1),
    Option("reliability_lemon_min_failures", 3.0, "a number of failures >= 1", number(1, inclusive=True)),
)


@dataclass(frozen=True)
class Settings:
    """What the classification and the figures depend on; the defaults' reasons:
    hardware_window: an XID 79 kills a job within minutes (NCCL's default timeout is 10 min), an event an
    hour before the end of a job that ran on is not its cause; grace: the scheduler may record the end
    before the next scrape shows the event; resubmit_window: people and retry wrappers resubmit within
    minutes; admin_uids: root (add the Slurm user's and operators'); lemons: one or two failures are luck."""

    hardware_window: timedelta = timedelta(minutes=10)
    grace: timedelta = timedelta(minutes=2)
    resubmit_window: timedelta = timedelta(hours=1)
    admin_uids: frozenset[str] = frozenset({"0"})
    lemon_fp_rate: float = 0.01
    lemon_min_failures: int = 3


def settings(opts: Mapping[str, Any]) -> Settings:
    """Validated [analytics] options -> Settings."""
    return Settings(hardware_window=timedelta(seconds=opts["reliability_hardware_window_seconds"]),
                    resubmit_window=timedelta(seconds=opts["reliability_resubmit_window_seconds"]),
                    admin_uids=frozenset(opts["reliability_admin_uids"]),
                    lemon_fp_rate=float(opts["reliability_lemon_false_positive_rate"]),
                    lemon_min_failures=int(opts["reliability_lemon_min_failures"]))


@dataclass(frozen=True)
class Event:
    """A health event of one GPU (gpufleet.analytics.health.events' row)."""

    ts: datetime
    host: str
    gpu_uuid: str
    kind: str
    code: int | None = None
    gpu: int | None = None
    detail: str | None = None

    @property
    def hardware(self) -> bool:
        return self.kind in HARDWARE_EVENTS and (self.kind != "xid" or self.code in HARDWARE_XIDS)

    def describe(self) -> str:
        what = f"XID {self.code} ({HARDWARE_XIDS[self.code]})" if self.kind == "xid" and self.code in HARDWARE_XIDS else (
            self.detail or self.kind)
        gpu = f"GPU {self.gpu}" if self.gpu is not None else self.gpu_uuid
        return f"{what} on {self.host} {gpu} at {words.instant(self.ts)}"


@dataclass(frozen=True)
class Attempt:
    """One run of a job. `gpus_held`: the (host, gpu_uuid) it held (its allocations), the GPUs whose
    events are its evidence; `attempt`: 1, 2, ... for the requeues of one job (0: not known)."""

    cluster: str
    scheduler: str
    job_key: str
    job_id: str
    state: str | None
    start: datetime | None
    end: datetime | None
    gpus: int | None = None
    state_raw: str | None = None
    exit_code: str | None = None
    user_name: str | None = None
    account: str | None = None
    name: str | None = None
    nodes: str | None = None
    submit: datetime | None = None
    attempt: int = 0
    gpus_held: tuple[tuple[str, str], ...] = ()
    share: float = 1.0  # the GPU-equivalents each of its GPUs counts as: a MIG slice's share of its GPU (sql.mig_share), else 1

    @property
    def equiv(self) -> float | None:
        """Its GPUs as GPU-equivalents (GPUs x share; None: the count is unknown): what its GPU-time counts in, as everywhere."""
        return None if self.gpus is None else self.gpus * self.share

    @classmethod
    def from_job(cls, j: Mapping[str, Any], held: Iterable[tuple[str, str]] = (), attempt: int = 0) -> "Attempt":
        """One attempt from a job row (gpufleet.collector.schema.JOB_COLUMNS: the store's, a parsed sacct line's)."""
        return cls(j["cluster"], j["scheduler"], j["job_key"], j["job_id"], j["state"], j["start"], j["end"], gpus=j.get("gpus"),
                   state_raw=j.get("state_raw"), exit_code=j.get("exit_code"), user_name=j.get("user_name"),
                   account=j.get("account"), name=j.get("name"), nodes=j.get("nodes"), submit=j.get("submit"),
                   attempt=attempt, gpus_held=tuple(sorted(set(held))))

    @property
    def key(self) -> tuple[str, str, str, datetime | None]:
        return (self.cluster, self.scheduler, self.job_key, self.start)

    @property
    def run_s(self) -> float:
        return (self.end - self.start).total_seconds() if self.start and self.end else 0.0


_WHOLE = frozenset({"completed", "not_ended"})  # the causes of an attempt that did not break its chain (Classified.broken)


@dataclass(frozen=True)
class Classified:
    attempt: Attempt
    cause: str
    reason: str  # the rule, for a person
    evidence: tuple[Event, ...] = ()

    @property
    def interrupted(self) -> bool:
        return self.cause in INTERRUPTION_CAUSES

    @property
    def failed(self) -> bool:
        return self.cause in FAILURE_CAUSES

    @property
    def broken(self) -> bool:
        """Ended otherwise than completed: an attempt whose chain is linked (SQL's `broken`)."""
        return self.cause not in _WHOLE


# states no hardware evidence changes (classify's rules 1-3 but the cancels): the store reads no GPUs for them
NO_EVIDENCE_STATES = ("COMPLETED", "TIMEOUT", "DEADLINE", "PREEMPTED", "PENDING", "RUNNING", "SUSPENDED", "REQUEUE_HOLD",
                      "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED")
ENDED_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                          "OUT_OF_MEMORY", "REQUEUED", "REVOKED", "SPECIAL_EXIT", "LAUNCH_FAILED", "UNKNOWN"})
_CANCELLED_BY = re.compile(r"^\s*CANCELLED\s+by\s+(\S+)", re.IGNORECASE)


def _nonzero_exit(code: str | None) -> bool:
    return bool(code) and any(p.strip() not in ("", "0") for p in code.split(":"))


def hardware_evidence(attempt: Attempt, events: Iterable[Event], s: Settings) -> tuple[Event, ...]:
    """The hardware events on the attempt's GPUs in [end - hardware_window, end + grace], oldest first."""
    if attempt.end is None:
        return ()
    held = set(attempt.gpus_held)
    lo, hi = attempt.end - s.hardware_window, attempt.end + s.grace
    if attempt.start is not None:
        lo = max(lo, attempt.start)
    return tuple(sorted((e for e in events if e.hardware and (e.host, e.gpu_uuid) in held and lo <= e.ts <= hi),
                        key=lambda e: (e.ts, e.host, e.gpu_uuid, e.kind)))


def classify(attempt: Attempt, events: Iterable[Event] = (), policy_cancelled: bool = False,
             s: Settings = Settings()) -> Classified:
    """The attempt's one cause with its rule and evidence (module docstring); `events`: those of at least its GPUs."""
    state = (attempt.state or "UNKNOWN").upper()
    if state not in ENDED_STATES:
        return Classified(attempt, "not_ended", f"state {state}: not ended")
    if state == "COMPLETED":
        return Classified(attempt, "completed", "COMPLETED")
    if state in ("TIMEOUT", "DEADLINE"):
        return Classified(attempt, "timeout", state)
    if state == "PREEMPTED":
        return Classified(attempt, "preempted", state)
    by = _CANCELLED_BY.match(attempt.state_raw or "")
    if state == "CANCELLED" and policy_cancelled:
        return Classified(attempt, "cancelled_policy", "CANCELLED; gpufleet's policy audit records the cancel")
    if state == "CANCELLED" and by and by[1] in s.admin_uids:
        return Classified(attempt, "cancelled_admin", f"CANCELLED by uid {by[1]} (an admin uid)")
    evidence = hardware_evidence(attempt, events, s) if events else ()  # (most attempts: no event on their GPUs)
    if evidence:
        return Classified(attempt, "hardware", f"{state}; {evidence[0].describe()}", evidence)
    if state in ("NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"):
        return Classified(attempt, "node_failure", state)
    if state == "REQUEUED":
        return Classified(attempt, "requeued", "REQUEUED with no hardware evidence")
    if state == "CANCELLED":
        return (Classified(attempt, "cancelled_user", f"CANCELLED by uid {by[1]}") if by
                else Classified(attempt, "cancelled_unknown", "CANCELLED, no uid reported"))
    if state in ("FAILED", "OUT_OF_MEMORY", "SPECIAL_EXIT") or _nonzero_exit(attempt.exit_code):
        return Classified(attempt, "user_error", f"{state}, exit {attempt.exit_code or 'unknown'}, no hardware evidence")
    return Classified(attempt, "unknown", f"state {state}")


def classify_all(attempts: Iterable[Attempt], events: Iterable[Event] = (),
                 policy_cancels: Iterable[tuple[str, str, str]] = (), s: Settings = Settings()) -> list[Classified]:
    """Each attempt classified once (events looked up per GPU, never attempts x events).
    `policy_cancels`: (cluster, scheduler, job_key) of the jobs gpufleet's policy cancelled."""
    by_gpu: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        by_gpu.setdefault((e.host, e.gpu_uuid), []).append(e)
    cancelled = set(policy_cancels)
    out = []
    for a in attempts:
        near = [e for g in a.gpus_held for e in by_gpu.get(g, ())]
        out.append(classify(a, near, (a.cluster, a.scheduler, a.job_key) in cancelled, s))
    return out


def number_requeues(attempts: Iterable[Attempt]) -> list[Attempt]:
    """Attempts numbered 1, 2, ... per job (cluster, scheduler, job_key) in start order."""
    groups: dict[tuple[str, str, str], list[Attempt]] = {}
    for a in attempts:
        groups.setdefault((a.cluster, a.scheduler, a.job_key), []).append(a)
    out = []
    for runs in groups.values():
        runs.sort(key=lambda a: (a.start is None, a.start or datetime.min))
        out.extend(replace(a, attempt=i) for i, a in enumerate(runs, 1))
    return out


# --- exact Poisson statistics (standard library only) ---


def _gamma_p(a: float, x: float) -> float:
    """Regularised lower incomplete gamma P(a, x) (series for x < a + 1, else continued fraction)."""
    if x <= 0:
        return 0.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(100000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, total * math.exp(-x + a * math.log(x) - lg))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(-x + a * math.log(x) - lg) * h)


def poisson_sf(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu)."""
    if k <= 0:
        return 1.0
    return _gamma_p(k, mu) if mu > 0 else 0.0


def poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu)."""
    return 1.0 - poisson_sf(k + 1, mu) if k >= 0 else 0.0


def _solve(f, lo: float, hi: float) -> float:
    """The root of the increasing f in [lo, hi] by bisection (to 1e-12 relative)."""
    while f(hi) < 0:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def poisson_interval(k: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) interval of a Poisson mean given k events: P(X >= k | lower) = alpha/2,
    P(X <= k | upper) = alpha/2; lower 0 for k = 0."""
    alpha = 1 - confidence
    lower = 0.0 if k == 0 else _solve(lambda m: poisson_sf(k, m) - alpha / 2, 0.0, max(1.0, 2.0 * k))
    upper = _solve(lambda m: (1 - poisson_cdf(k, m)) - (1 - alpha / 2), 0.0, max(4.0, 2.0 * k + 10))
    return lower, upper


# --- figures ---


def size_bucket(gpus: int | None) -> str | None:
    if not gpus or gpus < 1:
        return None
    for lo, hi, label in SIZE_BUCKETS:
        if gpus >= lo and (hi is None or gpus <= hi):
            return label
    return None


def run_seconds_in(a: Attempt, start: datetime, end: datetime, as_of: datetime | None = None) -> float:
    """The attempt's run time in [start, end); one still running runs to as_of (default: end)."""
    if a.start is None:
        return 0.0
    a_end = a.end if a.end is not None else (as_of or end)
    return max(0.0, (min(a_end, end) - max(a.start, start)).total_seconds())


def ends_in(a: Attempt, start: datetime, end: datetime) -> bool:
    return a.end is not None and start <= a.end < end


Checkpoints = Mapping[tuple[str, str, str], Sequence[datetime]]  # (cluster, scheduler, job_key) -> times saved


def lost_since(a: Attempt, checkpoints: Checkpoints, until: datetime) -> tuple[datetime, bool]:
    """Where an attempt that did not complete starts losing work, and whether that is measured: its last
    checkpoint reported while it ran, else its start (an upper bound: a save may go unreported)."""
    saved = [t for t in checkpoints.get((a.cluster, a.scheduler, a.job_key), ()) if a.start <= t <= until]
    return (max(saved), True) if saved else (a.start, False)


def interruption_loss(a: Attempt, checkpoints: Checkpoints, start: datetime) -> tuple[float, bool]:
    """(GPU-seconds, measured) an interrupted attempt of known GPU count and start lost inside a
    window starting at `start`: its GPU-equivalents x the time from lost_since to its end."""
    since, measured = lost_since(a, checkpoints, a.end)
    return a.equiv * max(0.0, (a.end - max(since, start)).total_seconds()), measured


def _per_1000_gpu_days(n: int, gpu_h: float) -> float | None:
    return n / (gpu_h / 24) * 1000 if gpu_h > 0 else None


def _size_totals(row: list[float] | None) -> tuple[int, int, float, float]:
    """(attempts, failures, job-hours, GPU-hours) of a size bucket's running sums."""
    n, k, job_s, gpu_s = row or (0, 0, 0.0, 0.0)
    return int(n), int(k), job_s / 3600, gpu_s / 3600


def _mttf_row(label: str, jobs: int, failures: int, job_h: float, gpu_h: float) -> dict[str, Any]:
    lo, hi = poisson_interval(failures)
    return {"size": label, "attempts": jobs, "failures": failures, "job_hours": job_h, "gpu_hours": gpu_h,
            "mttf_h": job_h / failures if failures else None,
            "mttf_ci_low_h": job_h / hi if job_h > 0 else None,
            "mttf_ci_high_h": job_h / lo if lo > 0 else None}


def mix_bucket(start: datetime, end: datetime) -> timedelta:
    """The cause mix's bucket: a window's timeline bucket (gpufleet.times.default_bucket: 30-200 over it), so a day's
    attempts spread over its hours rather than stand in one bar."""
    return default_bucket(end - start)


@dataclass(frozen=True)
class Summed:
    """Attempts that completed or have not ended, summed by the store rather than listed (the report needs
    no row of them: most of a fleet's), per GPU count (None: unknown), cause and the mix bucket their end
    falls in (None: no end in the window). `ran`: how many ran in the window; `run_s`: their run_seconds_in;
    `gpu_run_s`: GPU-equivalents (Attempt.equiv) x run_s; `wall_gpu_s`: those x start to end (or as_of), goodput's others_gpu_s."""

    gpus: int | None
    cause: str
    bucket: datetime | None
    attempts: int
    ran: int
    run_s: float
    gpu_run_s: float
    wall_gpu_s: float


def figures(classified: Sequence[Classified], start: datetime, end: datetime,
            checkpoints: Checkpoints | None = None,
            bucket: timedelta | None = None, as_of: datetime | None = None, summed: Iterable[Summed] = ()) -> dict[str, Any]:
    """The window's reliability figures (module docstring) from its classified attempts and those `summed`
    (mixed in buckets of `bucket`, default mix_bucket's, from `start`); lost work by interruption_loss. A running attempt
    counts up to `as_of` (default: end)."""
    checkpoints = checkpoints or {}
    bucket = bucket or mix_bucket(start, end)
    end_of = min(as_of or end, end)
    # each attempt's run time in the window, added to its size bucket ("unknown" when its GPU count is unknown)
    per_size: dict[str, list[float]] = {}  # label -> [attempts, failures, job seconds, GPU seconds]
    in_window: list[Classified] = []
    gpu_s = 0.0
    unknown_attempts = known_attempts = 0  # that ran in the window; of unknown GPU count: GPU-hours unknown, never 0
    counts = dict.fromkeys(CAUSES, 0)
    mix: dict[tuple[datetime, str], int] = {}
    summed_n = summed_ended = 0
    for x in summed:  # (completed or not ended: no failure, interruption or loss among them)
        row = per_size.setdefault(size_bucket(x.gpus) or "unknown", [0, 0, 0.0, 0.0])
        row[0] += x.attempts
        row[2] += x.run_s
        row[3] += x.gpu_run_s
        if x.gpus is None:
            unknown_attempts += x.ran
        else:
            gpu_s += x.gpu_run_s
            known_attempts += x.ran
        counts[x.cause] += x.attempts
        summed_n += x.attempts
        if x.bucket is not None:
            summed_ended += x.attempts
            mix[(x.bucket, x.cause)] = mix.get((x.bucket, x.cause), 0) + x.attempts
    rows = {}  # GPU count -> its size bucket's running sums (one size_bucket() per count, not per attempt)
    for c in classified:
        a = c.attempt
        run = run_seconds_in(a, start, end, end_of)
        gpus = a.gpus
        if gpus is None:
            unknown_attempts += run > 0
            gpu_run = 0.0  # (the "unknown" row's GPU-hours: None below)
        else:
            gpu_run = a.equiv * run
            gpu_s += gpu_run
            known_attempts += run > 0
        cause = c.cause
        counts[cause] += 1
        ended = cause != "not_ended" and ends_in(a, start, end)
        if ended:
            in_window.append(c)
        row = rows.get(gpus)
        if row is None:
            row = rows[gpus] = per_size.setdefault(size_bucket(gpus) or "unknown", [0, 0, 0.0, 0.0])
        row[0] += 1
        row[1] += ended and cause in FAILURE_CAUSES  # (Classified.failed)
        row[2] += run
        row[3] += gpu_run
    gpu_h = gpu_s / 3600
    interruptions = [c for c in in_window if c.interrupted]
    failures = [c for c in in_window if c.failed]
    hardware = [c for c in in_window if c.cause == "hardware"]
    # the rates: attempts of known GPU count over their GPU-hours
    known = [c for c in in_window if c.attempt.gpus is not None]

    lost_by_cause: dict[str, float] = {}  # GPU-seconds
    lost_measured = 0.0  # of them, GPU-seconds counted from a reported checkpoint
    measured_n = 0
    lost_unknown = 0  # interruptions of unknown GPU count: their lost GPU-hours are unknown, never 0
    for c in interruptions:
        a = c.attempt
        if a.gpus is None:
            lost_unknown += 1
            continue
        if a.start is None:
            continue
        lost, measured = interruption_loss(a, checkpoints, start)
        lost_by_cause[c.cause] = lost_by_cause.get(c.cause, 0.0) + lost
        lost_measured += lost if measured else 0.0
        measured_n += measured
    lost_gpu_h = sum(lost_by_cause.values()) / 3600 if len(interruptions) > lost_unknown or not lost_unknown else None
    allocated_gpu_h = gpu_h if known_attempts or not unknown_attempts else None

    labels = [b[2] for b in SIZE_BUCKETS] + (["unknown"] if "unknown" in per_size else [])
    sizes = [_mttf_row(label, *_size_totals(per_size.get(label))) for label in labels]
    for row in sizes:
        if row["size"] == "unknown":
            row["gpu_hours"] = None

    k = sum(1 for c in known if c.failed)
    r = k / gpu_h if gpu_h > 0 else None
    r_lo, r_hi = poisson_interval(k)
    projection = []
    for n in PROJECTED_SIZES:
        projection.append({"gpus": n, "mttf_h": 1 / (n * r) if r else None,
                           "mttf_ci_low_h": 1 / (n * r_hi / gpu_h) if gpu_h > 0 else None,
                           "mttf_ci_high_h": 1 / (n * r_lo / gpu_h) if gpu_h > 0 and r_lo > 0 else None})
    disagreements = []
    for row, (_, _, label) in zip(sizes, SIZE_BUCKETS):
        if not r or not row["failures"] or row["attempts"] == 0:
            continue
        mean_gpus = row["gpu_hours"] / row["job_hours"] if row["job_hours"] else None
        if not mean_gpus:
            continue
        predicted = 1 / (mean_gpus * r)
        if (row["mttf_ci_high_h"] is not None and predicted > row["mttf_ci_high_h"]) or (
                row["mttf_ci_low_h"] is not None and predicted < row["mttf_ci_low_h"]):
            disagreements.append(f"jobs of {label} GPUs: measured MTTF {row['mttf_h']:.3g} h "
                                 f"(95% {row['mttf_ci_low_h']:.3g}-{_num(row['mttf_ci_high_h'])} h), the per-GPU rate "
                                 f"predicts {predicted:.3g} h at their mean {mean_gpus:.3g} GPUs")

    for c in in_window:
        t0 = start + bucket * int((c.attempt.end - start) / bucket)
        mix[(t0, c.cause)] = mix.get((t0, c.cause), 0) + 1
    return {
        "attempts": len(classified) + summed_n, "ended_in_window": len(in_window) + summed_ended, "causes": counts,
        # the known attempts' sum (None: none of them is known), a lower bound when some are not
        "allocated_gpu_hours": allocated_gpu_h, "allocated_unknown_attempts": unknown_attempts,
        "interruptions": len(interruptions), "hardware_interruptions": len(hardware), "failures": len(failures),
        "failures_of_known_gpu_count": k,
        "interruptions_per_1000_gpu_days": _per_1000_gpu_days(sum(1 for c in known if c.interrupted), gpu_h),
        "hardware_interruptions_per_1000_gpu_days": _per_1000_gpu_days(sum(1 for c in known if c.cause == "hardware"), gpu_h),
        "mttf_by_size": sizes,
        "gpu_failure_rate_per_gpu_hour": r,
        "gpu_failure_rate_ci": [r_lo / gpu_h, r_hi / gpu_h] if gpu_h > 0 else None,
        "projection": projection, "projection_disagreements": disagreements,
        # (the interruptions of unknown GPU count left out: lost_unknown_interruptions; None: all of them)
        "lost_gpu_hours": lost_gpu_h, "lost_unknown_interruptions": lost_unknown,
        "lost_share_of_allocated": lost_gpu_h / gpu_h if gpu_h > 0 and lost_gpu_h is not None else None,
        "lost_is_upper_bound": measured_n < len(interruptions) - lost_unknown,
        # interruptions whose loss counts from a reported checkpoint, and that loss; the rest count from start
        "lost_measured_interruptions": measured_n,
        "lost_measured_gpu_hours": lost_measured / 3600 if lost_gpu_h is not None else None,
        # where the lost GPU-hours went, by cause (INTERRUPTION_CAUSES' order; they sum to lost_gpu_hours)
        "lost_gpu_hours_by_cause": {cause: lost_by_cause[cause] / 3600 for cause in INTERRUPTION_CAUSES if cause in lost_by_cause},
        "cause_mix": [{"bucket": t, "cause": cause, "attempts": n} for (t, cause), n in sorted(mix.items())], "mix_bucket_s": bucket.total_seconds(),
    }


def _num(v: float | None) -> str:
    return "unbounded" if v is None else f"{v:.3g}"


# --- lemons ---


@dataclass(frozen=True)
class Lemon:
    node: str
    failures: int
    gpu_hours: float
    expected: float
    p_value: float
    evidence: tuple[str, ...] = field(default=())


def node_failures(classified: Iterable[Classified], start: datetime, end: datetime) -> dict[str, list[Classified]]:
    """Each failure in the window attributed to the node(s) its evidence names; a node failure with
    no evidence to its node when it ran on one (a multi-node job's NODE_FAIL names no node)."""
    out: dict[str, list[Classified]] = {}
    for c in classified:
        if not c.failed or not ends_in(c.attempt, start, end):
            continue
        hosts = {e.host for e in c.evidence} or ({h for h, _ in c.attempt.gpus_held} if len({h for h, _ in c.attempt.gpus_held}) == 1 else set())
        for h in hosts:
            out.setdefault(h, []).append(c)
    return out


def lemons(failures: Mapping[str, int], gpu_hours: Mapping[str, float], fp_rate: float = 0.01, min_failures: int = 3,
           evidence: Mapping[str, Sequence[str]] | None = None) -> list[Lemon]:
    """Nodes whose failures are improbably many for their GPU-hours against the fleet's rate,
    most improbable first (module docstring). `gpu_hours`: every node's exposure, failing or not."""
    total_h = sum(gpu_hours.values())
    total_k = sum(failures.get(n, 0) for n in gpu_hours)
    if total_h <= 0 or total_k == 0:
        return []
    rate, nodes = total_k / total_h, len(gpu_hours)
    out = []
    for node, h in gpu_hours.items():
        k = failures.get(node, 0)
        if k < min_failures:
            continue
        p = poisson_sf(k, rate * h)
        if p < fp_rate / nodes:
            out.append(Lemon(node, k, h, rate * h, p, tuple((evidence or {}).get(node, ()))))
    return sorted(out, key=lambda x: (x.p_value, -x.failures, x.node))


# --- draining lemons (gpufleet policy) ---

DRAIN_ACTION = "drain"
DRAIN_KEY_PREFIX = "node:"  # a drain's audit row names its node as job_key "node:<name>"


@dataclass(frozen=True)
class Drain:
    """A proposal to take a lemon node out of service (Slurm drain, Kubernetes cordon); resuming it stays a person's."""

    cluster: str
    scheduler: str  # slurm | kubernetes
    node: str
    reason: str

    @property
    def audit_key(self) -> str:
        return DRAIN_KEY_PREFIX + self.node

    def command(self, scontrol: Sequence[str] = ("scontrol",)) -> list[str]:
        """The command that carries it out (argv; for Kubernetes what kubectl would run)."""
        if self.scheduler == "slurm":
            return [*scontrol, "update", f"NodeName={self.node}", "State=DRAIN", f"Reason=gpufleet: {self.reason}"]
        return ["kubectl", "cordon", self.node]

    def as_dict(self) -> dict[str, Any]:
        return {"action": DRAIN_ACTION, "cluster": self.cluster, "scheduler": self.scheduler, "node": self.node,
                "reason": self.reason, "command": self.command()}


def lemon_reason(x: Lemon) -> str:
    """Why, in the words a Slurm Reason field holds (short, no quotes)."""
    return (f"lemon: {x.failures} hardware/node failures in {x.gpu_hours:.0f} GPU-h, "
            f"{x.expected:.2g} expected at the fleet rate (p={x.p_value:.1e})")


def drain_plan(found: Sequence[Lemon], where: Mapping[str, tuple[str, str]], exempt_nodes: Sequence[str] = (),
               drained: Iterable[str] = ()) -> tuple[list[Drain], list[tuple[Drain, str]], list[Drain]]:
    """(proposals, exempt with the pattern that exempts each, already drained) for the lemons `found`.
    `where`: node -> (cluster, scheduler); `drained`: nodes a drain succeeded on within renotify_after."""
    import fnmatch

    done = set(drained)
    plan, exempt, suppressed = [], [], []
    for x in found:
        cluster, scheduler = where.get(x.node, ("default", "slurm"))
        d = Drain(cluster, scheduler, x.node, lemon_reason(x))
        pattern = next((p for p in exempt_nodes if fnmatch.fnmatchcase(x.node, p)), None)
        if pattern is not None:
            exempt.append((d, f"node matches exempt_nodes {pattern!r}"))
        elif x.node in done:
            suppressed.append(d)
        else:
            plan.append(d)
    return plan, exempt, suppressed


# --- chains and goodput ---


@dataclass(slots=True)  # (not frozen: made once per attempt at a fleet's scale, where a frozen one's __init__ costs 5x)
class Chain:
    """Attempts of one piece of work, in order: a job's requeues, a pod's restarts (the same job key), and
    resubmissions (same cluster, user, account and name, submitted within resubmit_window after an attempt
    that did not complete). Seconds: wall = first start to last end (or as_of) = run + gaps (restart overhead);
    lost = per attempt that did not complete, its work since lost_since (`lost_upper_bound`: from a start);
    productive = run - lost; ETTR = productive / wall."""

    attempts: tuple[Classified, ...]
    wall_s: float
    run_s: float
    gap_s: float
    lost_s: float
    productive_s: float
    lost_upper_bound: bool
    interruptions: int  # attempts interrupted (INTERRUPTION_CAUSES)
    gpus: int | None  # the most GPUs an attempt held; None (unknown, never 0) when no attempt's count is known
    broken: bool  # an attempt did not complete (Classified.broken)
    equiv: float | None = None  # those GPUs as GPU-equivalents (Attempt.equiv): what its GPU-time and MTTF count; None as gpus

    @property
    def ettr(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None


def _continues(prev: Classified, nxt: Classified, s: Settings) -> bool:
    a, b = prev.attempt, nxt.attempt
    if a.end is None or b.start is None or b.start < a.end:
        return False
    if (a.cluster, a.scheduler, a.job_key) == (b.cluster, b.scheduler, b.job_key):
        return True  # a requeue or a restart of the same job
    if not prev.broken or not a.name or (a.user_name, a.account, a.name) != (b.user_name, b.account, b.name):
        return False
    return a.cluster == b.cluster and _resubmits(a, b, s)


def _submitted(a: Attempt) -> datetime | None:
    """When a resubmission counts from: its submission, else its start."""
    return a.submit or a.start


def _resubmits(a: Attempt, b: Attempt, s: Settings) -> bool:
    """Was b submitted (else started) within resubmit_window after a ended?"""
    return a.end <= _submitted(b) <= a.end + s.resubmit_window


def link_chains(classified: Iterable[Classified], checkpoints: Checkpoints | None = None,
                s: Settings = Settings(), as_of: datetime | None = None) -> list[Chain]:
    """The attempts linked into chains (each attempt in exactly one), longest wall time first.
    (Written for a fleet's hundreds of thousands of attempts: each one's link keys made once, a chain's tail keys kept beside it.)"""
    checkpoints = checkpoints or {}
    ordered = sorted((c for c in classified if c.attempt.start is not None),
                     key=lambda c: (c.attempt.start, c.attempt.cluster, c.attempt.job_key))
    open_chains: list[list[Classified]] = []
    tails: dict[tuple, list[Classified]] = {}  # link key of a chain's last attempt (its job's, its name's) -> the chain
    tail_keys: dict[int, tuple[tuple, tuple]] = {}  # id(chain) -> its last attempt's two link keys
    for c in ordered:
        a = c.attempt
        job, name = (a.cluster, a.scheduler, a.job_key), (a.cluster, a.user_name, a.account, a.name)
        chain = tails.get(job)
        if chain is None or not _continues(chain[-1], c, s):
            chain = tails.get(name)
            if chain is not None and not _continues(chain[-1], c, s):
                chain = None
        if chain is None:
            chain = [c]
            open_chains.append(chain)
        else:  # the chain's old tail keys no longer lead to it
            for key in tail_keys[id(chain)]:
                if tails.get(key) is chain:
                    del tails[key]
            chain.append(c)
        tails[job] = tails[name] = chain
        tail_keys[id(chain)] = (job, name)
    out = [_chain(chain, checkpoints, as_of) for chain in open_chains]
    out.sort(key=lambda ch: (-ch.wall_s * (ch.gpus or 0), ch.attempts[0].attempt.job_key))
    return out


def _chain(chain: list[Classified], checkpoints: Checkpoints, as_of: datetime | None) -> Chain:
    """A Chain's figures from its attempts, in order (link_chains)."""
    if len(chain) == 1 and chain[0].cause in _WHOLE:  # (most chains: one attempt that completed or runs)
        c = chain[0]
        a = c.attempt
        wall = ((a.end if a.end is not None else (as_of or a.start)) - a.start).total_seconds()
        run = max(0.0, wall)
        return Chain((c,), wall, run, 0.0, 0.0, run, False, 0, a.gpus, False, None if a.gpus is None else a.equiv)
    run = gaps = lost = 0.0
    upper = False
    interruptions = 0
    gpus = equiv = None
    prev_end = None
    broken = False
    for c in chain:
        a = c.attempt
        a_end = a.end if a.end is not None else (as_of or a.start)
        run += max(0.0, (a_end - a.start).total_seconds())
        if prev_end is not None:
            gaps += (a.start - prev_end).total_seconds()
        prev_end = a.end
        cause = c.cause
        if cause not in _WHOLE:  # (Classified.broken)
            broken = True
            since, measured = lost_since(a, checkpoints, a_end)
            upper |= not measured
            lost += (a_end - since).total_seconds()
            interruptions += cause in INTERRUPTION_CAUSES
        if a.gpus is not None and (gpus is None or a.gpus > gpus):
            gpus, equiv = a.gpus, a.equiv
    first, last = chain[0].attempt, chain[-1].attempt
    wall = ((last.end if last.end is not None else (as_of or last.start)) - first.start).total_seconds()
    return Chain(tuple(chain), wall, run, gaps, lost, run - lost, upper, interruptions, gpus, broken, equiv)


def whole_gpu_s(attempts: Iterable[Classified], as_of: datetime) -> float:
    """GPU-equivalent seconds of attempts that count whole in goodput (productive = wall): each one's start to its end (or
    as_of), of known GPU count. Every attempt outside a broken chain counts so - linked with others of its job or not, so
    that goodput does not depend on which unbroken chains a report happened to link (goodput_of)."""
    return sum(c.attempt.equiv * max(0.0, ((c.attempt.end or as_of) - c.attempt.start).total_seconds())
               for c in attempts if c.attempt.start is not None and c.attempt.gpus is not None)


def goodput_of(chains: Sequence[Chain], others: Iterable[Classified], as_of: datetime, summed_gpu_s: float = 0.0) -> dict[str, Any]:
    """goodput() of the broken chains among `chains` (link_chains' of the same `as_of`), every other attempt - the unbroken
    chains' and `others`, attempts not linked - counted whole (whole_gpu_s), with `summed_gpu_s` (Summed.wall_gpu_s) beside.
    An unbroken chain of several attempts (a job whose every attempt completed) loses nothing: the time between its attempts
    is no failure's cost, and counting it would make the figure depend on which such chains were linked."""
    broken = [ch for ch in chains if ch.broken]
    unbroken = (c for ch in chains if not ch.broken for c in ch.attempts)
    return goodput(broken, whole_gpu_s(others, as_of) + whole_gpu_s(unbroken, as_of) + summed_gpu_s)


def goodput(chains: Sequence[Chain], others_gpu_s: float = 0.0) -> dict[str, Any]:
    """The fleet's effective training time ratio over `chains` (whole, as link_chains made them), weighted by GPU-equivalents:
    sum(GPUs x productive) / sum(GPUs x wall). `others_gpu_s`: GPU-seconds of work that completed, or still
    runs, at its first try (productive = wall), added to both sides. Lost: Chain.lost_s (user errors too, not only interruptions).
    A chain of unknown GPU count is left out, counted in unknown_gpu_chains. (The report's: goodput_of.)"""
    wall = productive = lost = gaps = 0.0  # GPU-seconds of the chains of known GPU count
    broken = interrupted = unknown = 0
    upper = False
    for ch in chains:  # (one pass: a fleet's chains are hundreds of thousands)
        if ch.gpus is not None:
            n = ch.equiv
            wall += n * ch.wall_s
            productive += n * ch.productive_s
            lost += n * ch.lost_s
            gaps += n * ch.gap_s
        if ch.broken:  # "chains": those with an attempt that did not complete (the rest is in others_gpu_s)
            broken += 1
            unknown += ch.gpus is None
        interrupted += ch.interruptions > 0
        upper = upper or ch.lost_upper_bound
    wall += others_gpu_s
    productive += others_gpu_s
    return {"chains": broken, "interrupted_chains": interrupted, "unknown_gpu_chains": unknown,
            "wall_gpu_hours": wall / 3600, "productive_gpu_hours": productive / 3600, "lost_gpu_hours": lost / 3600,
            "requeue_wait_gpu_hours": gaps / 3600,
            "ettr": productive / wall if wall > 0 else None,
            "lost_is_upper_bound": upper}


def chain_candidates(classified: Iterable[Classified], s: Settings = Settings()) -> list[Classified]:
    """The attempts link_chains needs to link every chain holding an attempt B that did not complete exactly as linking
    all would (completed work alone, most of a fleet's, stays unlinked): every attempt of B's job, and, where an attempt of
    B's name (user, account, name) can continue B, of the job of the attempt right after B among its name's in
    link_chains' order (start, then job key; attempts tied on both taken together). Why that is enough: an attempt
    continues by name only the chain of its name's previous attempt, and only when that one did not complete; so among
    the candidates, an attempt whose previous candidate of its name did not complete either has it as its previous
    attempt too, or cannot continue it, and every other link falls as among all. The same as sql.RELIABILITY_ATTEMPTS. A
    job's attempts share its user, account and name (the store's take them from its record)."""
    classified = list(classified)
    job = lambda a: (a.cluster, a.scheduler, a.job_key)  # noqa: E731
    jobs = {job(c.attempt) for c in classified if c.broken}
    places: dict[tuple, dict[tuple, list[Classified]]] = {}  # name -> (start, job_key) -> its attempts there
    for c in classified:
        a = c.attempt
        if a.start is not None and a.name:
            places.setdefault((a.cluster, a.user_name, a.account, a.name), {}).setdefault((a.start, a.job_key), []).append(c)
    for at in places.values():
        order = sorted(at)
        for i in range(len(order) - 1):
            later = [x.attempt for p in order[i + 1:] for x in at[p]]
            if any(c.broken and c.attempt.end is not None and any(_can_continue(c.attempt, x, s) for x in later) for c in at[order[i]]):
                jobs.update(job(c.attempt) for c in at[order[i + 1]])
    return [c for c in classified if job(c.attempt) in jobs]


def _can_continue(b: Attempt, x: Attempt, s: Settings) -> bool:
    """Could x, after b among its name's, continue b by name (_continues' timing: started at or after b's end, submitted
    within the resubmit window of it)?"""
    return x.start >= b.end and _resubmits(b, x, s)


def young_daly_interval_s(checkpoint_save_s: float, mttf_s: float) -> float:
    """Young/Daly's first-order optimal checkpoint interval sqrt(2 C M): C a save's seconds, M the job's MTTF in seconds."""
    return math.sqrt(2 * checkpoint_save_s * mttf_s)


def checkpoint_habits(chain: Chain, saved: Mapping[tuple[str, str, str], Sequence[tuple[datetime, float | None]]]
                      ) -> tuple[int, float | None, float | None]:
    """(checkpoints, cost C, interval used) of a chain from its jobs' reports while its attempts ran: C the median
    seconds a save took (None: no duration reported); the interval the median gap within one attempt (None: no attempt has two)."""
    costs: list[float] = []
    gaps: list[float] = []
    n = 0
    for c in chain.attempts:
        a = c.attempt
        until = a.end or datetime.max
        times = sorted((t, d) for t, d in saved.get((a.cluster, a.scheduler, a.job_key), ()) if a.start <= t <= until)
        n += len(times)
        costs += [d for _, d in times if d is not None]
        gaps += [(t2 - t1).total_seconds() for (t1, _), (t2, _) in zip(times, times[1:])]
    return n, _median(costs), _median(gaps)


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


# "about right" within this factor of Young/Daly's interval: the waste is flat near the optimum
ADVICE_TOLERANCE = 1.25

# why there is no advice, in the order checkpoint_advice asks
NO_ADVICE = {
    "no_checkpoints": "no checkpoint reports: the job's checkpoint cost is unknown",
    "no_cost": "its checkpoint reports gave no duration: the checkpoint cost is unknown",
    "no_rate": "no hardware or node failure in the window: the fleet's failure rate, and so the MTTF for its size, is unknown",
    "no_size": "its GPU count is unknown",
}


def checkpoint_advice(chain: Chain, gpu_failure_rate_per_h: float | None, checkpoint_save_s: float | None,
                      used_interval_s: float | None, checkpoints: int | None = None) -> dict[str, Any]:
    """Young/Daly's interval for the chain's size (MTTF_N = 1 / (N r), r the fleet's per-GPU rate, N its GPU-equivalents as
    r's GPU-hours count them) and the job's measured checkpoint cost, beside the interval it used; unknown with the reason
    (NO_ADVICE) where an input is."""
    mttf_h = 1 / (chain.equiv * gpu_failure_rate_per_h) if gpu_failure_rate_per_h and chain.gpus else None
    advised = young_daly_interval_s(checkpoint_save_s, mttf_h * 3600) if mttf_h and checkpoint_save_s is not None else None
    why = None
    if advised is None:
        why = (("no_cost" if checkpoints else "no_checkpoints") if checkpoint_save_s is None
               else "no_size" if not chain.gpus else "no_rate")
    verdict = None
    if advised is not None and used_interval_s is not None:
        verdict = ("about right" if 1 / ADVICE_TOLERANCE <= used_interval_s / advised <= ADVICE_TOLERANCE
                   else "checkpoint more often" if used_interval_s > advised else "checkpoint less often")
    return {"gpus": chain.gpus, "mttf_h": mttf_h, "checkpoints": checkpoints, "checkpoint_save_s": checkpoint_save_s,
            "advised_interval_s": advised, "used_interval_s": used_interval_s, "verdict": verdict,
            "no_advice": NO_ADVICE[why] if why else None}
