"""The one vocabulary (../shared/DESIGN.md contract 4b) and the one way figures are written for
people, named here once for every page, the weekly report and `gpufleet analyze`.

capacity = allocated + stranded; allocated = with data + no data; busy = utilization-weighted
time with data; utilization = busy / with data; idle allocated, no process, waste. The word
"used" names none of them. Unknown is written "unknown", never 0, "None", "NaN" or -1.

Plain Python only: the dashboards, the report and the CLI all import it.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

UNKNOWN = "unknown"
MINUS = "\u2212"  # a minus sign, not a hyphen
NONE = "\u2013"  # nothing to show (no wait because nothing waited): a dash, never "None"

# figure (a Totals field or a table column) -> its name for people
TERMS = {
    "capacity_gpu_h": "capacity",
    "allocated_gpu_h": "allocated",
    "stranded_gpu_h": "stranded",
    "data_gpu_h": "with data",
    "no_data_gpu_h": "no data",
    "busy_gpu_h": "busy",
    "utilization_pct": "utilization",
    "idle_allocated_gpu_h": "idle allocated",
    "idle_gpu_h": "idle allocated",
    "no_process_gpu_h": "no process",
    "idle_allocated_cost": "waste (idle allocated)",
    "idle_cost": "waste (idle allocated)",
    "no_process_cost": "waste (no process)",
    "stranded_cost": "waste (stranded)",
    "held_data_gpu_h": "held (exporter data)",
    "allocated_data_gpu_h": "allocated with data",
    "data_cost": "with data",
}

# what each term means, one sentence (help texts, the report's method section)
MEANINGS = {
    "capacity": "GPU-hours the inventory had: allocated + stranded",
    "allocated": "GPU-hours a job held (scheduler accounting): with data + no data",
    "stranded": "GPU-hours of capacity no job held",
    "with data": "allocated (or capacity) time with a sample within max_gap",
    "no data": "time with no sample within max_gap: neither idle nor busy",
    "busy": "utilization-weighted time with data",
    "utilization": "busy / with data",
    "idle allocated": "allocated time in idle stretches (below idle_threshold for at least idle_min_duration)",
    "no process": "allocated time with no compute process",
}

# The JSON keys renamed to the vocabulary: the old key is kept beside the new one for one release.
DEPRECATED_KEYS = {"used_gpu_h": "allocated_gpu_h", "used_share": "allocated_share"}

# A job's verdict (gpufleet.analytics.jobs) in the report's words
VERDICTS = {
    "no_data": "no samples", "no_process": "held with no process", "idle": "idle", "idle_stretches": "long idle stretches",
    "unused_gpus": "some GPUs unused", "low": "low utilization", "ok": "ok",
}

# Where a job's GPU time went (gpufleet.analytics.states' keys) in words
STATES = {
    "startup": "startup", "no_process": "no process", "idle": "idle", "checkpoint": "checkpoint stalls", "pause": "pauses",
    "input_bound": "input-bound", "communication_bound": "communication-bound", "straggler": "straggler shortfall",
    "compute": "compute", "busy_unresolved": "busy, not resolved",
}

# Health events (gpufleet.analytics.health.events' kinds) in words
EVENTS = {"xid": "XID", "ecc_dbe": "ECC double-bit errors", "ecc_sbe": "ECC single-bit errors", "row_remap": "rows remapped",
          "row_remap_failure": "row-remap failure", "gpu_lost": "GPU lost"}

# Column headers: the term with its unit, so a header says what its cells hold
HEADERS = {
    **{k: f"{v} GPU-h" for k, v in TERMS.items() if k.endswith("_gpu_h")},
    **{k: f"{v} $" for k, v in TERMS.items() if k.endswith("_cost")},
    "utilization_pct": "utilization %", "mean_utilization_pct": "mean utilization %",
    "used_gpu_h": "allocated GPU-h", "used_share": "allocated share", "gpu_h": "GPU-h", "cost": "cost $",
    "runtime_h": "run time in window", "gpus": "GPUs", "idle_gpus": "GPUs idle", "job_id": "job", "user_name": "user", "gi": "MIG instance",
    "gpus_unknown_jobs": "jobs with GPU count unknown",
    "mfu_pct": "MFU %", "mfu_method": "MFU method", "mfu_unknown_gpu_h": "GPU-h with MFU unknown",
    "mttf_h": "MTTF", "mttf_ci_low_h": "MTTF 95 % low", "mttf_ci_high_h": "MTTF 95 % high", "wall_h": "wall time",
    "ettr": "ETTR", "gpu_hours": "GPU-h", "p_value": "p-value",
    "data_h": "time with data", "fb_used_mib": "memory MiB", "fb_used_max_mib": "memory high-water MiB",
    "ecc_dbe_vol": "ECC double-bit errors (volatile)", "remap_failure": "row-remap failure",
    # (a GPU's last XID code and its last sample reporting it: the event tables date an XID by its first)
    "last_xid": "last XID", "last_xid_at": "last XID last reported",
}

# How many decimals each kind of figure gets, everywhere
DECIMALS = {"gpu_h": 1, "usd": 2, "pct": 1, "ratio": 2}


# A figure no part of which the filter's jobs own (capacity and stranded time under an account, user or partition filter)
NOT_ATTRIBUTABLE = "not attributable"


def bad(x: Any) -> bool:
    """No number to show: None, NaN or infinite."""
    return x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


# Columns of money, by name: a column named so, or ending so ("idle_cost", "cost_usd_per_h")
MONEY = ("cost", "usd", "_usd_per_h", "usd_per_gpu_hour", "price")
# ... and of GPU-hours ("idle_gpu_h"; the reliability figures' "gpu_hours")
GPU_HOURS = ("_gpu_h", "gpu_h", "gpu_hours")


def named(column: str, suffixes: tuple[str, ...]) -> bool:
    """Whether `column` ends with one of `suffixes` or is one of them."""
    return any(column.endswith(s) or column == s.strip("_") for s in suffixes)


def duration_unit_s(column: str) -> int | None:
    """Seconds per unit of a duration column, which every surface writes out ("2 h 48 min"): `_s` seconds, `_h` hours
    (not GPU-hours, not money); None for any other column."""
    if column.endswith("_s"):
        return 1
    if column.endswith("_h") and not named(column, MONEY + GPU_HOURS):
        return 3600
    return None


# Columns of percentages (0-100) and of fractions (0-1, shown as percentages), by name
PERCENTS = ("_pct",)
FRACTIONS = ("_share", "mfu", "ettr")
KINDS = ("usd", "gpu_h", "duration", "pct", "fraction", "mib", "p_value")


def kind(column: str) -> str | None:
    """What a numeric column holds, told by its name (one of KINDS; None: a plain number): the one rule by which the pages'
    tables and the CLI's write a cell (money with cents, GPU-hours and percentages with one decimal, durations in words,
    whole MiB, a p-value in two significant digits: a lemon's is 1e-5, not "0.00")."""
    if named(column, MONEY):
        return "usd"
    if named(column, GPU_HOURS):
        return "gpu_h"
    if duration_unit_s(column):
        return "duration"
    if named(column, PERCENTS):
        return "pct"
    if named(column, FRACTIONS):
        return "fraction"
    if named(column, ("_mib",)):
        return "mib"
    if column == "p_value":
        return "p_value"
    return None


def header(column: str) -> str:
    """A table column's header for people."""
    if column in HEADERS:
        return HEADERS[column]
    for suffix, unit in (("_gpu_h", " GPU-h"), ("_pct", " %"), ("_mib", " MiB"), ("_cost", " $"), ("_c", " \u00b0C"), ("_w", " W")):
        if column.endswith(suffix):
            return column[: -len(suffix)].replace("_", " ") + unit
    if duration_unit_s(column):  # durations are written out ("2 h 48 min"): no unit in the header
        return column[:-2].replace("_", " ")
    return column.replace("_", " ")


def verdict(v: str | None) -> str:
    return VERDICTS.get(v or "", v or NONE)


def state(s: str) -> str:
    """A job time state (analytics.states) for people."""
    return STATES.get(s, s)


def sentence(phrase: str) -> str:
    """A phrase the analytics give in lower case (a warning, a note) as a sentence on a page or in a report."""
    return phrase[:1].upper() + phrase[1:] + ("" if phrase.endswith(".") else ".")


def listing(items: Any) -> str:
    """Items as a sentence lists them: "a", "a and b", "a, b and c"."""
    items = list(items)
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def first_state_matches(states: Any) -> str:
    """What every breakdown says of its `states` (in their rule order): each GPU-hour lands in one."""
    return f"each GPU-hour with data counts once, in the first state that matches ({', '.join(state(s) for s in states)})"


def state_headers(states: Any) -> dict[str, str]:
    """The headers of a breakdown's `<state>_gpu_h` and `<state>_cost` columns: the state's word ("idle GPU-h"), never the
    figure a column of the same key would name ("idle allocated GPU-h"): a state holds only what the states before it left."""
    return {**{f"{s}_gpu_h": f"{state(s)} GPU-h" for s in states}, **{f"{s}_cost": f"{state(s)} $" for s in states}}


def gpu_h(x: float | None) -> str:
    """GPU-hours, one decimal, thousands separated: 1,234.5."""
    return UNKNOWN if bad(x) else f"{x:,.{DECIMALS['gpu_h']}f}"


def shows_gpu_h(x: float | None) -> bool:
    """Whether GPU-hours `x` are more than gpu_h writes as 0.0: a loss listed as "0.0 GPU-h" says nothing."""
    return not bad(x) and abs(x) >= 0.5 * 10 ** -DECIMALS["gpu_h"]


def usd(x: float | None) -> str:
    """Money: US dollars with cents, $1,234.56 (\u2212$3.00 below zero; -0.0 reads $0.00)."""
    if bad(x):
        return UNKNOWN
    return f"{MINUS if x < 0 else ''}${abs(x):,.{DECIMALS['usd']}f}"


def least_shown_pct(decimals: int = DECIMALS["pct"]) -> float:
    """The smallest positive percentage `pct` writes as a number at `decimals` (0.05 at one decimal); below it, "<0.1 %"."""
    return 0.5 * 10.0 ** -decimals


def pct(x: float | None, decimals: int = DECIMALS["pct"]) -> str:
    """A percentage, one decimal (or `decimals`: a headline's whole percent): 12.3 %; a positive one too small to show at
    that precision, "<0.1 %" ("<1 %"): never 0.0 % for some time."""
    if bad(x):
        return UNKNOWN
    return f"<{10.0 ** -decimals:.{decimals}f} %" if 0 < x < least_shown_pct(decimals) else f"{x:.{decimals}f} %"


def duration(seconds: float | None) -> str:
    """Two significant units: "46 s", "1 min 26 s", "2 h 48 min", "3 d 4 h"."""
    if bad(seconds):
        return UNKNOWN
    s = int(round(max(0.0, float(seconds))))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    for i, (name, size) in enumerate(units):
        if s >= size or size == 1:
            big, rest = divmod(s, size)
            if i + 1 < len(units):
                small_name, small_size = units[i + 1]
                small = rest // small_size
                if small:
                    return f"{big} {name} {small} {small_name}"
            return f"{big} {name}"
    return f"{s} s"


def span(seconds: float | None) -> str:
    """A window's length to the minute, every unit written: "1 d 45 min", "6 h", "7 d 2 h 12 min" (duration keeps two
    units, so a day's window started back on the hour, 24 h 45 min, would read "1 d"); under a minute: seconds."""
    if bad(seconds):
        return UNKNOWN
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{int(round(s))} s"
    rest = int(round(s / 60))
    parts = []
    for name, size in (("d", 1440), ("h", 60), ("min", 1)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n} {name}")
    return " ".join(parts)


def when(t: datetime | None) -> str:
    """A moment: 24-hour clock, UTC, said."""
    return UNKNOWN if t is None else t.strftime("%Y-%m-%d %H:%M UTC")


def instant(t: datetime | None) -> str:
    """A moment to the second (an event, a deadline): 24-hour clock, UTC, said."""
    return UNKNOWN if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


def figure(key: str, x: float | None) -> str:
    """A headline figure written by its kind (kind: money, a percentage), else as GPU-hours with their unit."""
    k = kind(key)
    if k == "usd":
        return usd(x)
    if k == "pct":
        return pct(x)
    return UNKNOWN if bad(x) else f"{gpu_h(x)} GPU-h"


def known_gpu_h(x: float | None, unknown_jobs: int = 0) -> str:
    """GPU-hours summed over the jobs whose GPU count is known (allocated, lost): "unknown" when
    none is known, "at least ..." when `unknown_jobs` are not (a lower bound), never 0 for unknown."""
    return UNKNOWN if bad(x) else ("at least " if unknown_jobs else "") + figure("allocated_gpu_h", x)


def quantity(n: int, noun: str) -> str:
    """`n` of a countable `noun`, its plural an s: "1 job", "2 jobs", "1,024 GPUs"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def have(n: int) -> str:
    """The verb "have" agreeing with `n` things: "1 job has", "2 jobs have"."""
    return "has" if n == 1 else "have"


def nothing_measured(what: str, held: str, first: datetime | None, last: datetime | None) -> str:
    """What a window without any `what` is told (an empty result must not read as a measurement of zero): where the
    store's `held` lie, from `first` to `last` (None: it holds none yet)."""
    where = (f"the store holds no {held} yet" if first is None else
             f"the store's {held} run from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC")
    return f"no {what} in this window: its figures measure nothing ({where})"


def unknown_gpu_counts(n: int) -> str:
    """What `n` (> 0) jobs of unknown GPU count do to the allocated figures, one sentence."""
    return (f"{quantity(n, 'job')} of this window {have(n)} an unknown GPU count (the accounting "
            "names no GPU, and neither slurmctld nor the job mapping said it: see the Health page); allocated GPU-hours sum "
            "the jobs whose count is known - at least that much - and are unknown where none is, never 0")


def signed(key: str, x: float | None) -> str:
    """A change of a figure: +1.5 GPU-h, \u2212$3.00, +2.5 pp (percentage points), \u00b10."""
    if bad(x):
        return UNKNOWN
    sign = "+" if x > 0 else (MINUS if x < 0 else "\u00b1")
    if kind(key) == "pct":
        return f"{sign}{abs(x):.{DECIMALS['pct']}f} pp"
    return sign + figure(key, abs(x))


def with_new_keys(row: dict[str, Any]) -> dict[str, Any]:
    """A JSON row with each deprecated key's vocabulary name added (the old key kept one release)."""
    out = dict(row)
    for old, new in DEPRECATED_KEYS.items():
        if old in out and new not in out:
            out[new] = out[old]
    return out
