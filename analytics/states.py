"""Where a job's GPU time goes: its time with data split into states that add up to it exactly.

`gpu_states` gives every second with data of one GPU's allocation exactly one state, the first matching rule's
(thresholds: `[analytics.states]`, STATE_OPTIONS; "low": utilization below the analysis' idle_threshold; "busy": not low):

  startup             up to the first busy stretch of `startup_busy_seconds` (model loading, image pull, cold start;
                      never that busy: no startup); a requeued job's every run on a GPU is a hold with its own
                      (schema.ALLOCATION_START), the runs summed per GPU before GPUs are compared
  no_process          held with no compute process (as every other figure counts it)
  idle                low stretches of at least idle_min_duration (the waste figure's rule)
  checkpoint          low dips between busy samples (`checkpoint_min_seconds` up to idle_min_duration) at a regular
                      period: at least `checkpoint_min_count`, half of their start-to-start intervals within
                      `checkpoint_period_tolerance` of the median (period and cost per checkpoint reported)
  pause               the other short low dips
  input_bound         busy, SM active below `input_sm_active_max` with PCIe RX at least `input_pcie_rx_min_bytes_per_s`
  communication_bound (several GPUs) NVLink RX + TX at least `communication_nvlink_min_bytes_per_s`, tensor active
                      below `communication_tensor_max`, SM active below `communication_sm_active_max`
  straggler           (several GPUs) where busy utilization spreads more than `straggler_spread` of the best GPU's:
                      each GPU's busy residue x (best - own) / best; the least busy GPU is named
  compute             the rest, with its tensor activity (MFU's estimate input) where known
  busy_unresolved     busy time a missing profiling field leaves unsplit, never guessed as compute (`unknown`: which)

No state moves when a field outside its READS changes (tests/test_analytics_states.py). Pure numpy over one job's
samples: a breakdown costs its GPUs x samples, whatever the fleet's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any, Mapping, Sequence

import numpy as np

from gpufleet.analytics import vocabulary as words
from gpufleet.collector.reading import query_rows
from gpufleet.config import Option, integer, number

STATES = ("startup", "no_process", "idle", "checkpoint", "pause", "input_bound", "communication_bound",
          "straggler", "compute", "busy_unresolved")
LOSSES = tuple(s for s in STATES if s not in ("compute", "busy_unresolved"))
# what a job's breakdown says beside it: its no process and idle are not the job's figures of those names
ORDER_NOTE = (words.first_state_matches(STATES) + ": no process is the time with no compute process outside startup, idle the low "
              "stretches of at least idle_min_duration less what startup and no process took, so neither is the job's figure of that name")

# the sample columns a state's rule reads, with the rules before it (a state takes what no earlier one took)
_UTIL, _PROCS, _SM, _RX, _NVL, _TENSOR = "util", "procs", "sm_active", "pcie_rx", "nvlink", "tensor_active"
READS: dict[str, frozenset[str]] = {
    "startup": frozenset({_UTIL}),
    "no_process": frozenset({_UTIL, _PROCS}),
    "idle": frozenset({_UTIL, _PROCS}),
    "checkpoint": frozenset({_UTIL, _PROCS}),
    "pause": frozenset({_UTIL, _PROCS}),
    "input_bound": frozenset({_UTIL, _PROCS, _SM, _RX}),
    "communication_bound": frozenset({_UTIL, _PROCS, _SM, _RX, _NVL, _TENSOR}),
    "straggler": frozenset({_UTIL, _PROCS, _SM, _RX, _NVL, _TENSOR}),
    "compute": frozenset({_UTIL, _PROCS, _SM, _RX, _NVL, _TENSOR}),
    "busy_unresolved": frozenset({_UTIL, _PROCS, _SM, _RX, _NVL, _TENSOR}),
}
# the exporters' fields behind a column: what "unknown" asks for
FIELDS = {
    _PROCS: ("gpufleet_gpu_compute_processes",),
    _SM: ("DCGM_FI_PROF_SM_ACTIVE",),
    _RX: ("DCGM_FI_PROF_PCIE_RX_BYTES",),
    _NVL: ("DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
    _TENSOR: ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",),
}
# what to try, per loss
FIXES = {
    "startup": "warm pools, pre-pulled images, model weights on local NVMe or a faster loader",
    "no_process": "release GPUs the job does not run on (timeout policy), or fix the launch",
    "idle": "a timeout policy for idle sessions; release GPUs between phases",
    "checkpoint": "asynchronous (background) checkpoints, or checkpoint less often",
    "pause": "look at what stops the job for a moment (evaluation, logging, synchronous I/O)",
    "input_bound": "more data-loader workers, prefetching, pinned memory, data on local NVMe",
    "communication_bound": "overlap compute with communication (bucketed all-reduce), larger micro-batches, "
                           "tune TP/PP/DP to the interconnect",
    "straggler": "check the named GPU (clocks, throttling, placement) and balance the parallel split",
}

STATE_OPTIONS = (
    Option("startup_busy_seconds", 120.0, "a number of seconds > 0 (busy this long ends a GPU's startup)", number(0)),
    Option("checkpoint_min_seconds", 10.0, "a number of seconds > 0 (the shortest dip that can be a checkpoint)", number(0)),
    Option("checkpoint_min_count", 3, "an integer >= 2 (dips before a rhythm is a checkpoint period)", integer(2)),
    Option("checkpoint_period_tolerance", 0.2, "a fraction > 0 (how far a checkpoint interval may stray from the median)", number(0)),
    Option("input_sm_active_max", 0.3, "a ratio > 0 (SM active below it, with PCIe RX, is input-bound)", number(0)),
    Option("input_pcie_rx_min_bytes_per_s", 1e9, "a number of bytes/s > 0 (host-to-device traffic of a starved GPU)", number(0)),
    Option("communication_nvlink_min_bytes_per_s", 1e10, "a number of bytes/s > 0 (NVLink RX + TX of a communicating GPU)", number(0)),
    Option("communication_tensor_max", 0.2, "a ratio > 0 (tensor active below it, with NVLink traffic, is communication)", number(0)),
    Option("communication_sm_active_max", 0.5, "a ratio > 0 (SM active below it, with NVLink traffic, is communication)", number(0)),
    Option("straggler_spread", 0.1, "a fraction > 0 (busy utilization spread across a job's GPUs that is imbalance)", number(0)),
)


@dataclass(frozen=True)
class Thresholds:
    idle_threshold: float = 5.0  # percent (Params.idle_threshold)
    idle_min_s: float = 1800.0  # Params.idle_min_duration
    max_gap_s: float = 30.0  # Params.max_gap
    startup_busy_seconds: float = 120.0
    checkpoint_min_seconds: float = 10.0
    checkpoint_min_count: int = 3
    checkpoint_period_tolerance: float = 0.2
    input_sm_active_max: float = 0.3
    input_pcie_rx_min_bytes_per_s: float = 1e9
    communication_nvlink_min_bytes_per_s: float = 1e10
    communication_tensor_max: float = 0.2
    communication_sm_active_max: float = 0.5
    straggler_spread: float = 0.1

    @classmethod
    def of(cls, p: Any, opts: Mapping[str, Any]) -> "Thresholds":
        """The analysis' thresholds (Params) with the validated [analytics.states] options (a key not given: its default)."""
        return cls(idle_threshold=p.idle_threshold, idle_min_s=p.idle_min_duration.total_seconds(),
                   max_gap_s=p.max_gap.total_seconds(), **{o.key: opts.get(o.key, o.default) for o in STATE_OPTIONS})


@dataclass
class GpuSamples:
    """One GPU's samples inside (and up to max_gap before) its allocation [a0, a1), epoch seconds;
    NaN where a sample has no such field (util NaN: no data)."""

    gpu: str  # how a person names it: host:index
    a0: float
    a1: float
    ts: np.ndarray
    util: np.ndarray  # percent
    procs: np.ndarray | None = None  # compute processes
    sm_active: np.ndarray | None = None  # ratios 0-1
    tensor_active: np.ndarray | None = None
    pcie_rx: np.ndarray | None = None  # bytes/s
    nvlink: np.ndarray | None = None  # NVLink RX + TX bytes/s
    equiv: np.ndarray | None = None  # the share of a GPU each sample's time counts as (a MIG slice's); None: 1
    foreign: np.ndarray | None = None  # processes of jobs not allocated this GPU (read by no state)

    def column(self, name: str) -> np.ndarray:
        v = getattr(self, name)
        return np.full(len(self.ts), np.nan) if v is None else np.asarray(v, dtype=float)


@dataclass
class Checkpoints:
    count: int
    period_s: float  # median start-to-start
    cost_s: float  # mean seconds per checkpoint


@dataclass
class GpuStates:
    gpu: str
    data_s: float
    seconds: dict[str, float]
    unknown: dict[str, tuple[str, ...]]  # state -> the fields that would tell it (on this GPU)
    checkpoints: Checkpoints | None = None
    busy_util: float | None = None  # mean utilization over compute + unresolved time (straggler's input)
    foreign_max: float | None = None  # most processes of other jobs seen on it at once (None: none reported)
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # state -> time-weighted column means


@dataclass
class JobStates:
    data_s: float
    seconds: dict[str, float]
    gpus: list[GpuStates]
    unknown: dict[str, list[str]]  # state -> "GPU: fields" for the GPUs where it could not be told
    checkpoints: Checkpoints | None
    straggler: dict[str, Any] | None  # gpu, utilization_pct, job_mean_pct
    evidence: dict[str, str]
    largest_loss: str | None

    def table(self) -> Any:
        """The states with time as a polars frame (state_rows): what the job page shows."""
        import polars as pl

        return pl.DataFrame(state_rows(self.seconds, self.data_s, self.evidence),
                            schema={"state": pl.String, "gpu_h": pl.Float64, "share_pct": pl.Float64, "evidence": pl.String, "fix": pl.String})

    def share(self, state: str) -> float | None:
        return self.seconds[state] / self.data_s if self.data_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "data_s": self.data_s,
            "states": [{"state": s, "seconds": self.seconds[s], "share": self.share(s), "evidence": self.evidence.get(s),
                        "fix": FIXES.get(s), "unknown_on": self.unknown.get(s, [])} for s in STATES],
            "largest_loss": self.largest_loss,
            "checkpoints": None if self.checkpoints is None else vars(self.checkpoints),
            "straggler": self.straggler,
            "gpus": [{"gpu": g.gpu, "data_s": g.data_s, "seconds": g.seconds, "busy_utilization_pct": g.busy_util,
                      "unknown": {k: list(v) for k, v in g.unknown.items()}, "foreign_processes_max": g.foreign_max}
                     for g in self.gpus],
        }


def state_rows(seconds: Mapping[str, float], data_s: float, evidence: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """The states with time, largest first: GPU-hours, share of the time with data (%), the
    evidence and the fix to try (the job page and `gpufleet analyze --job` show these)."""
    rows = [{"state": s, "gpu_h": sec / 3600, "share_pct": 100 * sec / data_s, "evidence": evidence.get(s) or "", "fix": FIXES.get(s, "")}
            for s, sec in seconds.items() if sec > 0 and data_s > 0]
    return sorted(rows, key=lambda r: -r["gpu_h"])


def _intervals(s: GpuSamples, max_gap_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sample's interval with data inside [a0, a1): it holds until the next sample, at most
    max_gap; (index of its sample, start, end) of those with a utilization and a length."""
    ts = np.asarray(s.ts, dtype=float)
    util = s.column("util")
    if (ts[1:] >= ts[:-1]).all():  # already in time order (as a GPU's rows mostly come): no sort
        order = np.arange(len(ts))
    else:
        order = np.argsort(ts, kind="stable")
        ts, util = ts[order], util[order]
    nxt = np.append(ts[1:], np.inf)
    start = np.maximum(ts, s.a0)
    end = np.minimum(np.minimum(nxt, ts + max_gap_s), s.a1)
    keep = (end > start) & ~np.isnan(util)
    if keep.all():
        return order, start, end
    return order[keep], start[keep], end[keep]


def _runs(flag: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of consecutive flagged intervals, broken where time is not contiguous: each run's first interval and
    the one after its last ([first, last) ranges in order, covering every flagged interval once)."""
    n = len(flag)
    joined = np.zeros(n, dtype=bool)  # interval i continues interval i - 1's run
    joined[1:] = flag[1:] & flag[:-1] & (start[1:] == end[:-1])
    first = np.flatnonzero(flag & ~joined)
    last = np.flatnonzero(flag & ~np.append(joined[1:], False)) + 1
    return first, last


def gpu_states(s: GpuSamples, t: Thresholds, multi_gpu: bool) -> GpuStates:
    """One GPU's time with data in its allocation, each interval in one state (module doc); the
    straggler share is the job's to cut (job_states)."""
    idx, start, end = _intervals(s, t.max_gap_s)
    dur = end - start
    whole = len(idx) == len(s.ts) and bool((idx == np.arange(len(idx))).all())  # each sample, in time order: no copy
    col = {c: s.column(c) if whole else s.column(c)[idx] for c in (_UTIL, _PROCS, _SM, _TENSOR, _RX, _NVL)}
    util = col[_UTIL]
    n = len(idx)
    state = np.full(n, -1)
    code = {name: k for k, name in enumerate(STATES)}
    low = util < t.idle_threshold

    # startup: everything before the first busy run of startup_busy_seconds
    cum = np.concatenate(([0.0], np.cumsum(dur)))
    first, last = _runs(~low, start, end)
    sustained = np.flatnonzero(cum[last] - cum[first] >= t.startup_busy_seconds)
    if len(sustained):
        state[:first[sustained[0]]] = code["startup"]
    free = state < 0
    state[free & (col[_PROCS] == 0)] = code["no_process"]

    # low runs: idle when long, else a dip between busy samples (checkpoint or pause); a dip is
    # bounded by busy time on both sides (contiguous, not startup) to count toward a rhythm
    first, last = _runs(low, start, end)
    length = cum[last] - cum[first]
    lows = np.flatnonzero(low)  # the runs' intervals, run after run
    run_length = np.repeat(length, last - first)
    open_low = state[lows] < 0
    state[lows[open_low]] = np.where(run_length[open_low] >= t.idle_min_s, code["idle"], code["pause"])
    before, after = np.maximum(first - 1, 0), np.minimum(last, n - 1)
    bounded = ((first > 0) & (last < n) & (start[first] == end[before]) & (end[last - 1] == start[after])
               & (state[before] != code["startup"]))
    dip = bounded & (length < t.idle_min_s) & (length >= t.checkpoint_min_seconds)
    checkpoints = _checkpoint_rhythm(start[first[dip]], length[dip], t)
    if checkpoints is not None:
        in_dip = lows[np.repeat(dip, last - first)]
        state[in_dip[state[in_dip] == code["pause"]]] = code["checkpoint"]

    # busy time: input-bound, communication-bound, else compute, or unresolved for want of fields
    busy = state < 0
    unknown: dict[str, set[str]] = {}
    sm, rx = col[_SM], col[_RX]
    input_known = ~np.isnan(sm) & ~np.isnan(rx)
    is_input = input_known & (sm < t.input_sm_active_max) & (rx >= t.input_pcie_rx_min_bytes_per_s)
    state[busy & is_input] = code["input_bound"]
    if (busy & ~input_known).any():
        unknown["input_bound"] = {c for c in (_SM, _RX) if np.isnan(col[c][busy & ~input_known]).any()}
    resolved = input_known.copy()
    if multi_gpu:
        nvl, tensor = col[_NVL], col[_TENSOR]
        comm_known = ~np.isnan(nvl) & ~np.isnan(tensor) & ~np.isnan(sm)
        is_comm = comm_known & (nvl >= t.communication_nvlink_min_bytes_per_s) & (tensor < t.communication_tensor_max) & (sm < t.communication_sm_active_max)
        state[(state < 0) & is_comm] = code["communication_bound"]
        if (busy & ~comm_known).any():
            unknown["communication_bound"] = {c for c in (_NVL, _TENSOR, _SM) if np.isnan(col[c][busy & ~comm_known]).any()}
        resolved &= comm_known
    rest = state < 0
    state[rest & resolved] = code["compute"]
    state[rest & ~resolved] = code["busy_unresolved"]
    if np.isnan(col[_PROCS]).any():
        unknown["no_process"] = {_PROCS}

    # GPU-seconds: a MIG slice's time counts as its share (rules above ran on wall time)
    wdur = dur if s.equiv is None else dur * (s.column("equiv") if whole else s.column("equiv")[idx])
    # each state's intervals in time order (one stable sort by state)
    by_state = np.argsort(state.astype(np.int8), kind="stable")
    edges = np.searchsorted(state[by_state], np.arange(len(STATES) + 1))
    where = {name: by_state[edges[k]:edges[k + 1]] for k, name in enumerate(STATES)}
    seconds = {name: float(wdur[i].sum()) for name, i in where.items()}
    residue = dur[rest]
    busy_util = float((util[rest] * residue).sum() / residue.sum()) if residue.sum() > 0 else None
    means = {}
    for name, cols in (("input_bound", (_RX, _SM)), ("communication_bound", (_NVL, _TENSOR)), ("compute", (_TENSOR, _SM))):
        i = where[name]
        took = dur[i].sum()
        means[name] = {c: float((col[c][i] * dur[i]).sum() / took) for c in cols if took > 0 and not np.isnan(col[c][i]).any()}
    return GpuStates(gpu=s.gpu, data_s=float(wdur.sum()), seconds=seconds,
                     unknown={k: tuple(f for c in sorted(v) for f in FIELDS[c]) for k, v in unknown.items()},
                     checkpoints=checkpoints, busy_util=busy_util, means=means, foreign_max=_foreign_max(s, idx))


def _foreign_max(s: GpuSamples, idx: np.ndarray) -> float | None:
    """The most foreign processes a sample with data inside the allocation reported, None: none did."""
    if s.foreign is None or len(idx) == 0:
        return None
    f = np.asarray(s.foreign, dtype=float)[idx]
    return float(np.nanmax(f)) if not np.isnan(f).all() else None


def _checkpoint_rhythm(starts: Sequence[float], lengths: Sequence[float], t: Thresholds) -> Checkpoints | None:
    """The dips' rhythm when they recur at a regular period (module doc), else None."""
    if len(starts) < t.checkpoint_min_count:
        return None
    gaps = np.diff(np.asarray(starts))
    period = float(median(gaps.tolist()))  # (statistics.median: numpy's is slower on a few dozen values)
    regular = np.abs(gaps - period) <= t.checkpoint_period_tolerance * period
    if period <= 0 or regular.sum() * 2 < len(gaps):
        return None
    return Checkpoints(count=len(starts), period_s=float(median(gaps[regular].tolist())), cost_s=float(np.mean(lengths)))


def _one_gpu(runs: Sequence[GpuStates]) -> GpuStates:
    """One GPU's states over its holds (a requeued job's runs) summed, means weighted by the time they are over."""
    if len(runs) == 1:
        return runs[0]
    seconds = {k: sum(r.seconds[k] for r in runs) for k in STATES}
    unknown: dict[str, tuple[str, ...]] = {}
    for r in runs:
        for k, fields in r.unknown.items():
            unknown[k] = tuple(dict.fromkeys(unknown.get(k, ()) + fields))
    residue = [(r.busy_util, r.seconds["compute"] + r.seconds["busy_unresolved"]) for r in runs if r.busy_util is not None]
    w = sum(x for _, x in residue)
    means: dict[str, dict[str, float]] = {}
    for k in {k for r in runs for k in r.means}:
        took = [r for r in runs if r.seconds[k] > 0]
        cols = set.intersection(*(set(r.means.get(k, {})) for r in took)) if took else set()
        means[k] = {c: sum(r.means[k][c] * r.seconds[k] for r in took) / seconds[k] for c in cols}
    rhythms = [r.checkpoints for r in runs if r.checkpoints is not None]
    foreign = [r.foreign_max for r in runs if r.foreign_max is not None]
    return GpuStates(gpu=runs[0].gpu, data_s=sum(r.data_s for r in runs), seconds=seconds, unknown=unknown,
                     checkpoints=max(rhythms, key=lambda c: c.count) if rhythms else None,
                     busy_util=sum(u * x for u, x in residue) / w if w > 0 else (residue[0][0] if residue else None),
                     foreign_max=max(foreign) if foreign else None, means=means)


def job_states(gpus: Sequence[GpuSamples], t: Thresholds) -> JobStates:
    """A job's breakdown: its GPUs' states summed (a GPU's holds first: _one_gpu), the straggler share cut from the busy
    residue of the GPUs short of the best one, with the evidence and the largest loss."""
    multi = len({g.gpu for g in gpus}) > 1
    runs: dict[str, list[GpuStates]] = {}
    for g in gpus:
        runs.setdefault(g.gpu, []).append(gpu_states(g, t, multi))
    per = [_one_gpu(r) for r in runs.values()]
    straggler = None
    utils = [(g, g.busy_util) for g in per if g.busy_util is not None]
    if multi and len(utils) > 1:
        best = max(u for _, u in utils)
        mean = float(np.mean([u for _, u in utils]))
        if best > 0 and (best - min(u for _, u in utils)) / best > t.straggler_spread:
            for g, u in utils:
                residue = g.seconds["compute"] + g.seconds["busy_unresolved"]
                cut = residue * (best - u) / best
                if residue > 0 and cut > 0:
                    for k in ("compute", "busy_unresolved"):
                        take = cut * g.seconds[k] / residue
                        g.seconds[k] -= take
                        g.seconds["straggler"] += take
            odd, u = min(utils, key=lambda gu: gu[1])
            straggler = {"gpu": odd.gpu, "utilization_pct": u, "job_mean_pct": mean}
    seconds = {s: sum(g.seconds[s] for g in per) for s in STATES}
    unknown: dict[str, list[str]] = {}
    for g in per:
        for s, fields in g.unknown.items():
            unknown.setdefault(s, []).append(f"{g.gpu}: {', '.join(fields)}")
    rhythms = [g.checkpoints for g in per if g.checkpoints is not None]
    checkpoints = None
    if rhythms:
        checkpoints = Checkpoints(count=max(c.count for c in rhythms), period_s=float(np.median([c.period_s for c in rhythms])),
                                  cost_s=float(np.mean([c.cost_s for c in rhythms])))
    data_s = sum(g.data_s for g in per)
    losses = [(seconds[s], s) for s in LOSSES if seconds[s] > 0]
    js = JobStates(data_s=data_s, seconds=seconds, gpus=per, unknown=unknown, checkpoints=checkpoints, straggler=straggler,
                   evidence={}, largest_loss=max(losses)[1] if losses else None)
    js.evidence = _evidence(js, per, t)
    return js


def _mean_over(per: Sequence[GpuStates], state: str, column: str) -> float | None:
    """The time-weighted mean of a column over a state's time on the GPUs that know it."""
    parts = [(g.means[state][column], g.seconds[state]) for g in per if column in g.means.get(state, {}) and g.seconds[state] > 0]
    w = sum(s for _, s in parts)
    return sum(v * s for v, s in parts) / w if w > 0 else None


def _evidence(js: JobStates, per: Sequence[GpuStates], t: Thresholds) -> dict[str, str]:
    """One line per state with time: its share and the numbers behind it."""
    out: dict[str, str] = {}
    for s in STATES:
        share = js.share(s)
        if not share:
            continue
        head = f"{words.state(s)} {words.pct(100 * share, 0)}"  # (a state with time is never "0 %": "<1 %")
        if s == "input_bound":
            rx, sm = _mean_over(per, s, _RX), _mean_over(per, s, _SM)
            out[s] = f"{head}: PCIe RX {rx / 1e9:.1f} GB/s while SM active {words.pct(100 * sm, 0)}" if rx is not None and sm is not None else head
        elif s == "communication_bound":
            nvl, ten = _mean_over(per, s, _NVL), _mean_over(per, s, _TENSOR)
            out[s] = f"{head}: NVLink {nvl / 1e9:.0f} GB/s while tensor active {words.pct(100 * ten, 0)}" if nvl is not None and ten is not None else head
        elif s == "checkpoint" and js.checkpoints is not None:
            c = js.checkpoints
            out[s] = f"{head}: every {words.duration(c.period_s)}, {words.duration(c.cost_s)} each"
        elif s == "straggler" and js.straggler is not None:
            g = js.straggler
            out[s] = f"{head}: GPU {g['gpu']} at {g['utilization_pct']:.0f} % busy against the job's mean {g['job_mean_pct']:.0f} %"
        elif s == "startup":
            out[s] = (f"{head}: {words.duration(js.seconds[s] / max(1, len(per)))} per GPU before the first "
                      f"{words.duration(t.startup_busy_seconds)} busy")
        elif s == "idle":
            out[s] = (f"{head}: below {t.idle_threshold:g} % utilization in stretches of at least {words.duration(t.idle_min_s)}, "
                      f"{words.duration(js.seconds[s] / max(1, len(per)))} per GPU")
        elif s == "no_process":
            out[s] = f"{head}: no compute process on its GPUs, {words.duration(js.seconds[s] / max(1, len(per)))} per GPU"
        elif s == "compute":
            ten = _mean_over(per, s, _TENSOR)
            out[s] = f"{head}: tensor active {words.pct(100 * ten, 0)} (MFU's estimate input)" if ten is not None else f"{head}: tensor activity unknown"
        elif s == "busy_unresolved":
            fields = sorted({f for g in per for k in ("input_bound", "communication_bound") for f in g.unknown.get(k, ())})
            out[s] = f"{head}: busy, not split without {', '.join(fields)}"
        else:
            out[s] = head
    return out


# --- reading one job from the store ---

def thresholds(doc: Mapping[str, Any], path: Any, p: Any) -> Thresholds:
    """The validated [analytics.states] section with the analysis' own thresholds (Params)."""
    from gpufleet.config import section

    return Thresholds.of(p, section(doc.get("analytics", {}), "states", STATE_OPTIONS, path, parent="analytics"))


def job_breakdown(con: Any, p: Any, job: str, t: Thresholds) -> JobStates | None:
    """The breakdown of one job (its id as people write it, or its key) in the window of `p` (Params), reading only its
    GPUs' allocation stretches; None: no allocation of the job in the window (the exporters never mapped it). One query,
    its columns taken into numpy once, each GPU's rows as its turn comes (_AllocationSamples; gpu_states sorts by time)."""
    import pyarrow as pa

    from gpufleet.analytics import raw_reads, sql
    from gpufleet.times import epoch_us

    cur = con.cursor()
    try:
        bind = {"start": p.start, "end": p.end, "job": job, "cluster": p.filters.cluster, "max_gap": p.max_gap.total_seconds()}
        found = query_rows(cur, sql.JOB_STATE_ALLOCATIONS, sql.bound(sql.JOB_STATE_ALLOCATIONS, bind))
        if found.num_rows == 0:
            return None
        listed = found.to_pylist()
        # one job: the first cluster's, where an id repeats across clusters
        mine = [i for i, r in enumerate(listed) if (r["cluster"], r["job_key"]) == (listed[0]["cluster"], listed[0]["job_key"])]
        al = found.take(mine)
        al = al.append_column("k", pa.array(np.arange(len(mine), dtype=np.int16 if len(mine) <= np.iinfo(np.int16).max else np.int32)))
        allocations = [listed[i] for i in mine]
        cur.register("_job_al", al)
        epoch0 = datetime(1970, 1, 1)
        bind.update(lo=epoch0 + timedelta(seconds=min(r["a0"] for r in allocations)) - p.max_gap,
                    hi=epoch0 + timedelta(seconds=max(r["a1"] for r in allocations)),
                    host_lo=min(r["host"] for r in allocations), host_hi=max(r["host"] for r in allocations), job_cluster=allocations[0]["cluster"])
        rows = raw_reads.read(cur, "job states", sql.JOB_STATE_SAMPLES, sql.bound(sql.JOB_STATE_SAMPLES, bind),
                              epoch_us(bind["lo"]), epoch_us(bind["hi"]))
    finally:
        cur.close()
    # each allocation's rows: a slice of the row numbers ordered by k (stable: a GPU's rows keep their order)
    k = rows.column("k").to_numpy()  # (16 bits where they fit: numpy's stable sort of those is a radix sort)
    order = np.argsort(k, kind="stable")
    edges = np.searchsorted(k[order], np.arange(len(allocations) + 1))
    # a column all at its _DEFAULTS value stays None (gpu_states reads None as it); the rest as the query types them
    # (FLOAT or DOUBLE, NaN for NULL), a GPU's slice widened to float in its turn (GpuSamples.column)
    columns = {c: rows.column(c).to_numpy() for c in _SAMPLE_FIELDS if not _all_default(rows.column(c), c)}
    names = []
    for i, r in enumerate(allocations):
        # the mapping may not say the GPU's index; the samples do
        index = r["gpu"] if r["gpu"] is not None else _sampled_index(_taken(rows, "gpu", order[edges[i]:edges[i + 1]]))
        names.append(f"{r['host']}:{index if index is not None else r['gpu_uuid']}" + (f"/{r['gi']}" if r["gi"] is not None and r["gi"] >= 0 else ""))
    return job_states(_AllocationSamples(allocations, names, columns, order, edges), t)


# JOB_STATE_SAMPLES' columns a GPU's samples take (as float: NaN where a sample has no such field);
# its gpu column is read only for an allocation that does not name its GPU's index
_SAMPLE_FIELDS = ("ts", "util", "procs", "sm_active", "tensor_active", "pcie_rx", "nvlink", "equiv", "foreign_processes")
# ... and the value GpuSamples takes a column's None for (None: NaN, not reported)
_DEFAULTS = {"equiv": 1.0, "foreign_processes": None}


def _all_default(column: Any, name: str) -> bool:
    """Whether every row of an Arrow column is its _DEFAULTS value (False: it has none)."""
    import pyarrow.compute as pc

    if name not in _DEFAULTS:
        return False
    if _DEFAULTS[name] is None:
        return column.null_count == len(column)
    return column.null_count == 0 and pc.all(pc.equal(column, _DEFAULTS[name])).as_py() is True


class _AllocationSamples(Sequence[GpuSamples]):
    """A job's GPUs' samples, each allocation's taken from the unordered columns only when job_states reaches it: memory
    holds the columns once, not a reordered copy too."""

    def __init__(self, allocations: list[dict[str, Any]], names: list[str], columns: dict[str, np.ndarray], order: np.ndarray,
                 edges: np.ndarray) -> None:
        self._allocations, self._names, self._columns, self._order, self._edges = allocations, names, columns, order, edges

    def __len__(self) -> int:
        return len(self._allocations)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"allocation {i} of {len(self)}")
        i %= len(self)
        r, at = self._allocations[i], self._order[self._edges[i]:self._edges[i + 1]]
        got = {c: v[at] for c, v in self._columns.items()}
        return GpuSamples(gpu=self._names[i], a0=float(r["a0"]), a1=float(r["a1"]), ts=got["ts"], util=got["util"], procs=got["procs"],
                          sm_active=got["sm_active"], tensor_active=got["tensor_active"], pcie_rx=got["pcie_rx"],
                          nvlink=got["nvlink"], equiv=got.get("equiv"), foreign=got.get("foreign_processes"))


def _taken(rows: Any, column: str, at: np.ndarray) -> np.ndarray:
    """A column of the rows at the positions `at`, as float (NaN: NULL)."""
    return np.asarray(rows.column(column).take(at).to_numpy(), dtype=float)


def _sampled_index(gpu: np.ndarray) -> int | None:
    """The GPU's index as its samples give it (the largest seen), None: none says it."""
    known = gpu[~np.isnan(gpu)]
    return int(known.max()) if len(known) else None
