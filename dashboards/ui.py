"""Shared UI pieces: number formats for people, safe tables and text, the common filters, the
page frame (messages instead of tracebacks), sign-in and auto-refresh.

Safety rule: anything that came from the store (job names, users, accounts, labels, exception
text) is shown with st.dataframe, st.text or st.code, or inside an Altair chart - never with
st.markdown, st.write, a title, an alert body or a metric label, which interpret Markdown.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import polars as pl
import streamlit as st

from gpufleet.analytics import trends
from gpufleet.analytics.core import totals_warnings
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.params import Filters
from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards import data

log = logging.getLogger(__name__)

ALL = "(all)"
CUSTOM = "custom"
FILTERS = (("cluster", "Cluster"), ("account", "Account / team"), ("user", "User"), ("model", "GPU model"), ("partition", "Partition / namespace"))


# --- numbers for people (gpufleet.analytics.vocabulary: the same words and decimals as the report and the CLI) ---

_bad = words.bad


def gpu_h(x: float | None) -> str:
    return "no data" if _bad(x) else f"{words.gpu_h(x)} GPU-h"


# Money on the dashboards: one format, US dollars with cents and thousands separators ($4,724.00,
# $945.53, -$3.00), in metrics (usd), tables (Streamlit's "dollar" column format) and chart
# tooltips (USD_D3) alike; unknown money (a GPU model without a price) is "unknown", never $0.
USD_COLUMN = "dollar"  # st.column_config.NumberColumn: "$1,234.57"
USD_D3 = "$,.2f"  # Altair/Vega tooltips and axes
usd = words.usd


def pct(x: float | None) -> str:
    return "no data" if _bad(x) else words.pct(x)


def count(n: int | float | None) -> str:
    return words.UNKNOWN if _bad(n) else f"{int(n):,}"


def gpus(x: float | None) -> str:
    """GPU equivalents (MIG instances are fractions)."""
    if _bad(x):
        return words.UNKNOWN
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.2f}"


duration = words.duration
when = words.when


def with_last_xid(states: pl.DataFrame) -> pl.DataFrame:
    """Fleet now's states (analytics.fleet_now) with last_xid as people read it: the code; "none"
    when the GPU's samples report XIDs (its latest sample has one, 0: none) and none was non-zero
    within forget_after; "unknown" only when nothing says (no sample, or a source without XIDs)."""
    return states.with_columns(
        pl.when(pl.col("last_xid").is_not_null()).then(pl.col("last_xid").cast(pl.Int64).cast(pl.Utf8))
        .when(pl.col("xid_last").is_not_null()).then(pl.lit("none")).otherwise(pl.lit(words.UNKNOWN)).alias("last_xid"))


def with_event_codes(events: pl.DataFrame) -> pl.DataFrame:
    """Health events (analytics.health.events) as people read them: the kind in words (vocabulary.EVENTS), an XID's code and
    a dash for the other kinds, which have none (not "unknown": nothing is missing)."""
    return events.with_columns(pl.when(pl.col("kind") == "xid").then(pl.col("code").cast(pl.Utf8)).otherwise(pl.lit(words.NONE)).alias("code"),
                               pl.col("kind").replace_strict(words.EVENTS, default=pl.col("kind")))


def idle_since(t: datetime | None, before: bool = False) -> str:
    """When an idle GPU became idle: the time, or "before <time>" when no busy sample is known in
    the range looked at (gpufleet.analytics.fleet_now: idle_since_capped) - unknown stays unknown."""
    if t is None:
        return "unknown"
    return ("before " if before else "") + words.instant(t)


def attributable(x: float | None, totals: Any, fmt: Callable[[float | None], str]) -> str:
    """A figure of Totals as text: "not attributable" where the filter's jobs own no part of it
    (capacity and stranded time under an account, user or partition filter), else fmt(x)."""
    if x is None and getattr(totals, "not_attributable_reason", None):
        return words.NOT_ATTRIBUTABLE
    return fmt(x)


def allocated_help(t: Any, what: str) -> str:
    """A metric's help beside allocated GPU-hours (`what` it says): and, where jobs of the window
    have an unknown GPU count, that the figure leaves them out (words.unknown_gpu_counts)."""
    return what + (f". {words.unknown_gpu_counts(t.allocated_unknown_jobs)}" if t.allocated_unknown_jobs else "")


def empty_totals(t: Any) -> bool:
    """Nothing in the window: no capacity (or none attributable), nothing allocated (no job, not
    even one of unknown GPU count), no data."""
    return (t.capacity_gpu_h or 0) <= 0 and (t.allocated_gpu_h or 0) <= 0 and not t.allocated_unknown_jobs and t.data_gpu_h <= 0


def change(cur: float | None, prev: float | None, fmt: Callable[[float | None], str]) -> str | None:
    """Metric delta text: "+1.25 GPU-h vs previous window" (None when unchanged or either is unknown)."""
    if _bad(cur) or _bad(prev):
        return None
    d = cur - prev
    if abs(d) < 1e-9:
        return None  # unchanged: no arrow
    sign = "+" if d >= 0 else "-"
    return f"{sign}{fmt(abs(d))} vs previous window"


def delta(cur: float | None, prev: float | None, fmt: Callable[[float | None], str], no_comparison: str | None) -> dict[str, Any]:
    """st.metric's delta arguments for a figure where more is worse: the change, or a grey "no data"
    without an arrow when the previous window is no base (gpufleet.analytics.trends rule)."""
    if no_comparison is not None:
        return {"delta": f"{trends.NO_DATA} for the previous window", "delta_color": "off", "delta_arrow": "off"}
    return {"delta": change(cur, prev, fmt), "delta_color": "inverse"}


# --- charts: one time axis (24-hour clock, UTC, dates at day changes) and partial buckets said ---

# the first label and every label at midnight carry the date, on a second line; the others the time of day alone
_TIME_LABEL = ("({first} || (utchours(datum.value) == 0 && utcminutes(datum.value) == 0)) "
               "? [utcFormat(datum.value, '%H:%M'), utcFormat(datum.value, '%Y-%m-%d')] : utcFormat(datum.value, '%H:%M')")
TIME_TOOLTIP = "%Y-%m-%d %H:%M UTC"


# ticks by the span a chart covers: steps that divide a day, counted from midnight UTC, so midnight
# is a tick (and carries its date), and few enough that every label fits (none is dropped: a
# dropped label could be the date)
_TICKS = ((timedelta(hours=3), timedelta(minutes=30)), (timedelta(hours=12), timedelta(hours=1)),
          (timedelta(days=1, hours=2), timedelta(hours=3)), (timedelta(days=3, hours=2), timedelta(hours=12)),
          (timedelta(days=10), timedelta(days=1)), (timedelta(days=70), timedelta(days=7)))


def time_ticks(start: datetime, end: datetime) -> list[str]:
    """The time axis' ticks between start and end (UTC), as ISO 8601 with the offset (Vega takes
    these, and DateTime objects, for a time axis' values; epoch numbers it draws no label for)."""
    start, end = (t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t for t in (start, end))
    step = next((s for longest, s in _TICKS if end - start <= longest), None)
    if step is None:
        return []
    midnight = start.replace(hour=0, minute=0, second=0, microsecond=0)
    t = midnight + step * -(-(start - midnight) // step)  # the first tick at or after start
    out = []
    while t <= end and len(out) < 60:
        out.append(t.replace(tzinfo=timezone.utc).isoformat())
        t += step
    return out


def time_x(start: datetime | None = None, end: datetime | None = None, field: str = "bucket", title: str = "time (UTC)"):
    """The x encoding of every time chart: a UTC scale, 24-hour labels, a date on the first tick
    and at each midnight; ticks on steps that divide a day when the chart's span is known."""
    import altair as alt

    ticks = time_ticks(start, end) if start is not None and end is not None else []
    if not ticks:
        return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"),
                     axis=alt.Axis(labelExpr=_TIME_LABEL.format(first="datum.index == 0"), labelOverlap=True, labelAngle=0))
    # the first tick carries its date unless a midnight tick (which carries its own) follows within two
    times = [datetime.fromisoformat(t) for t in ticks]
    midnight_soon = any(t.hour == 0 and t.minute == 0 for t in times[1:3])
    first = "false" if midnight_soon else f"time(datum.value) == {int(times[0].timestamp() * 1000)}"
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"),
                 axis=alt.Axis(values=ticks, labelExpr=_TIME_LABEL.format(first=first), labelOverlap=False, labelAngle=0))


def time_tooltip(field: str = "bucket", title: str = "time"):
    import altair as alt

    return alt.Tooltip(f"{field}:T", title=f"{title} (UTC)", format=TIME_TOOLTIP, formatType="utc")


def utc_times(df: pl.DataFrame) -> pl.DataFrame:
    """Naive UTC timestamps (the store's) marked as UTC, so a browser in any zone draws them in UTC."""
    return df.with_columns([pl.col(c).dt.replace_time_zone("UTC") for c, t in df.schema.items()
                            if isinstance(t, pl.Datetime) and t.time_zone is None])


PARTIAL = "partial"


def bucket_coverage(df: pl.DataFrame, bucket_h: float, start: datetime, end: datetime) -> pl.DataFrame:
    """Each bucket's hours inside the window (`covered_h`) and whether it is cut by the window's
    edges or by now (`part`: "partial" or "whole"): a rate over a partial bucket is divided by the
    hours it covers, never by the whole bucket (which draws a cliff at the current bucket)."""
    size = pl.duration(microseconds=int(round(bucket_h * 3600e6)))
    b0, b1 = pl.col("bucket"), pl.col("bucket") + size
    lo = pl.when(b0 < pl.lit(start)).then(pl.lit(start)).otherwise(b0)
    hi = pl.when(b1 > pl.lit(end)).then(pl.lit(end)).otherwise(b1)
    covered = ((hi - lo).dt.total_microseconds() / 3600e6).clip(lower_bound=0.0)
    return df.with_columns(covered.alias("covered_h")).with_columns(
        pl.when(pl.col("covered_h") < bucket_h - 1e-9).then(pl.lit(PARTIAL)).otherwise(pl.lit("whole")).alias("part"))


# --- tables ---

# st.column_config's format of each kind of column (vocabulary.kind; a duration has none: display_text writes it out)
_FORMATS = {"usd": USD_COLUMN, "gpu_h": f"%,.{words.DECIMALS['gpu_h']}f", "pct": f"%.{words.DECIMALS['pct']}f %%",
            "fraction": f"%.{words.DECIMALS['pct']}f %%", "mib": "%,.0f", "p_value": "scientific"}
# (column, what its null means) where a missing value is not unknown but "none" or a state
_NULL_MEANS = {"end": "still running", "reason": words.NONE, "change_missing": words.NONE, "change_pct_missing": words.NONE}


def _duration_scale(name: str, dtype: pl.DataType) -> int | None:
    """Seconds per unit of a numeric duration column (vocabulary.duration_unit_s), None for any other column."""
    return words.duration_unit_s(name) if dtype.is_numeric() else None


def people(df: pl.DataFrame) -> pl.DataFrame:
    """The one table formatter of every page: what a cell says is what it means. Times in UTC on a
    24-hour clock, verdicts in the report's words, a whole GPU's MIG instance (-1) and absent text
    as a dash, NaN as unknown, shares as percentages; the numbers stay numeric, so a column sorts
    by value: their decimals come from column_config and durations are written out ("2 h 48 min")
    by display_text, a null shown as "unknown" (table's placeholder)."""
    out = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if dtype.is_float():
            col = col.fill_nan(None)
        if name == "gi" and dtype.is_integer():
            col = pl.when(col >= 0).then(col.cast(pl.Utf8)).otherwise(pl.lit(words.NONE))
        elif name == "verdict":
            col = col.replace_strict(words.VERDICTS, default=col).fill_null(words.NONE)
        elif name == "gpu_up" and dtype.is_numeric():
            col = pl.when(col.is_null()).then(pl.lit(words.UNKNOWN)).when(col > 0).then(pl.lit("up")).otherwise(pl.lit("lost"))
        elif _duration_scale(name, dtype):
            pass  # numeric: written out by display_text
        elif dtype.is_numeric() and words.kind(name) == "fraction":
            col = col * 100  # shown as a percentage
        elif isinstance(dtype, pl.Datetime):
            col = col.dt.strftime("%Y-%m-%d %H:%M:%S").fill_null(pl.lit(_NULL_MEANS.get(name, words.NONE)))
        elif dtype == pl.Utf8 or dtype == pl.Categorical:
            col = col.cast(pl.Utf8).fill_null(pl.lit(_NULL_MEANS.get(name, words.NONE)))
        out.append(col.alias(name))
    return df.select(out) if out else df


def column_config(df: pl.DataFrame, labels: dict[str, str] | None = None, times: frozenset[str] = frozenset(),
                  tiny: list[str] | None = None) -> dict[str, Any]:
    """Headers in the vocabulary with their units (gpufleet.analytics.vocabulary.header); people's
    formats by column name: GPU-hours 1 decimal, dollars with cents, percentages 1 decimal."""
    cfg: dict[str, Any] = {}
    labels = labels or {}
    tiny = _tiny_percents(df) if tiny is None else tiny
    for name, dtype in df.schema.items():
        label = labels.get(name, words.header(name))
        if (isinstance(dtype, pl.Datetime) or name in times) and "UTC" not in label:
            label += " (UTC)"
        if _duration_scale(name, dtype) or name in tiny:
            cfg[name] = st.column_config.NumberColumn(label)  # no format: display_text's words show
        elif dtype.is_numeric():
            fmt = _FORMATS.get(words.kind(name) or "")
            if fmt is None and dtype.is_integer():
                fmt = "localized"
            cfg[name] = st.column_config.NumberColumn(label, format=fmt or "%,.2f")
        elif dtype == pl.Boolean:
            cfg[name] = st.column_config.CheckboxColumn(label)
        else:
            cfg[name] = st.column_config.TextColumn(label)  # plain text: no HTML, no Markdown
    return cfg


def display_text(df: pl.DataFrame, tiny: list[str] | None = None) -> Any:
    """people()'s frame for st.dataframe: as it is, or - where it has duration columns - as a pandas
    Styler whose display text writes them out ("2 h 48 min", a null "unknown" or what it means)
    while the cells keep their numbers, so clicking the header sorts by value, not by the text.

    Streamlit reads a Styler's display text from its _translate(), which renders every cell of the frame (0.16 s of the
    Jobs list's 1,000 rows, the largest part of the page's script); this Styler's gives the cells written out alone
    (_written_cells: every other cell shows its value, formatted by its column's format). A Streamlit that reads the
    Styler otherwise gets pandas' own rendering of the same formats."""
    scales = {c: k for c, t in df.schema.items() if (k := _duration_scale(c, t))}
    tiny = _tiny_percents(df) if tiny is None else tiny
    if not scales and not tiny:
        return df
    styler = df.to_pandas(use_pyarrow_extension_array=True).style
    writers: dict[str, tuple[Callable[[Any], str], str]] = {
        **{c: ((lambda v, k=k: words.duration(v * k)), _NULL_MEANS.get(c, words.UNKNOWN)) for c, k in scales.items()},
        **{c: (words.pct, words.UNKNOWN) for c in tiny}}
    for c, (write, null) in writers.items():
        styler = styler.format(write, subset=[c], na_rep=null)
    styler._translate = _written_cells(df, writers)
    return styler


def _written_cells(df: pl.DataFrame, writers: dict[str, tuple[Callable[[Any], str], str]]) -> Callable[..., dict[str, Any]]:
    """A Styler's _translate for display_text: the body's cells of `writers`' columns, each written by its writer (its null
    by the text beside it), as pandas names them (row<r>_col<c>), with no style."""
    written = {df.columns.index(c): [null if v is None else write(v) for v in df[c].to_list()] for c, (write, null) in writers.items()}

    def translate(*_: Any, **__: Any) -> dict[str, Any]:
        return {"body": [[{"type": "td", "id": f"row{r}_col{c}", "display_value": texts[r]} for c, texts in written.items()]
                         for r in range(df.height)],
                "cellstyle": [], "table_styles": []}

    return translate


def _tiny_percents(df: pl.DataFrame) -> list[str]:
    """people()'s percentage columns with a positive value too small for one decimal: written by vocabulary.pct ("<0.1 %",
    as the CLI and the report write it), never "0.0 %" for some time (a job's 40 s of startup in a week). (display_text and
    column_config take it from their caller, table(), which finds them once.)"""
    least = words.least_shown_pct()
    return [c for c, t in df.schema.items() if t.is_numeric() and not _duration_scale(c, t) and words.kind(c) in ("pct", "fraction")
            and df.select(((pl.col(c) > 0) & (pl.col(c) < least)).any()).item()]


def unknown_gpu_counts_note(df: pl.DataFrame) -> pl.DataFrame:
    """A table by team, user or partition (its gpus_unknown_jobs: how many of a row's jobs have an
    unknown GPU count) with a caption saying what that means where there are any; without the
    column where there are none (a column of zeros says nothing)."""
    n = int(df["gpus_unknown_jobs"].sum()) if "gpus_unknown_jobs" in df.columns else 0
    if not n:
        return df.drop("gpus_unknown_jobs", strict=False)
    st.caption(words.unknown_gpu_counts(n) + ".")
    return df


def trend_table(cmp: pl.DataFrame) -> pl.DataFrame:
    """The comparison as people read it (trends.people_rows, as the CLI writes it)."""
    return pl.DataFrame(trends.people_rows(cmp), schema={c: pl.Utf8 for c in ("figure", "this window", "previous window", "change", "change %")})


# A longer table is cut to its first rows (in the order the page's sort picks; its search finds
# the others): the browser is sent every row a table holds (800,000 jobs of a 16,384-GPU week took
# 2.5 s on every visit), and a table with durations writes each cell's text in Python
# (display_text's Styler: the demo's 3,800 jobs, half of the Jobs page's 1 s).
MAX_ROWS = 1000


def first_rows(df: pl.DataFrame, order: str, others: str) -> pl.DataFrame:
    """The first MAX_ROWS rows of `df`, saying so under the table when it has more: `order` says
    which come first, `others` how to see the rest."""
    if df.height > MAX_ROWS:
        st.caption(f"The first {MAX_ROWS:,} of {df.height:,} ({order}); {others}.")
    return df.head(MAX_ROWS)


def without_repeated_keys(df: pl.DataFrame) -> pl.DataFrame:
    """`df` without its job_key column where every row's equals its job_id (a Slurm job's key is its id: the same number twice);
    kept where one differs (a pod's key is namespace/name, its id the name alone)."""
    if {"job_key", "job_id"} <= set(df.columns) and df.select((pl.col("job_key") == pl.col("job_id")).fill_null(False).all()).item():
        return df.drop("job_key")
    return df


# The headers of a GPU's newest sample and its age in the tables of GPUs now (Fleet now, Health): a lost GPU still
# reporting is not "silent for" its age
LAST_SAMPLE_LABELS = {"ts": "last sample", "age_s": "age of last sample"}


def table(df: pl.DataFrame, key: str, *, labels: dict[str, str] | None = None, empty: str = "Nothing in this window.",
          height: int | None = None, sort: str | None = None, rows_key: str | None = None, **kwargs: Any):
    """st.dataframe through the one formatter (people, column_config; in a container keyed `key`, so
    tests find it), its order said when `sort` names it, or a plain message when there is nothing.
    `rows_key`: the dataframe's own key (a selectable table's selection: st.session_state[rows_key])."""
    with st.container(key=key):
        if df is None or df.is_empty():
            st.caption(empty)
            return None
        # (a table its page did not cut: a 16,384-GPU table broke the pandas Styler, 262,144 cells at most)
        df = without_repeated_keys(first_rows(df, sort or "in the order shown", "narrow the filters to see the others"))
        # list columns (e.g. XID codes) as text
        df = df.with_columns([pl.col(c).cast(pl.List(pl.Utf8)).list.join(", ") for c, t in df.schema.items() if isinstance(t, pl.List)])
        if sort:
            st.caption(f"Sorted by {sort}; click a column's header to sort by it.")
        shown = people(df)
        times = frozenset(c for c, t in df.schema.items() if isinstance(t, pl.Datetime))
        tiny = _tiny_percents(shown)
        return st.dataframe(display_text(shown, tiny), hide_index=True, column_config=column_config(shown, labels, times, tiny),
                            height=height or "auto", placeholder=words.UNKNOWN, key=rows_key, **kwargs)


@contextmanager
def details(label: str, key: str) -> Iterator[bool]:
    """A collapsed expander whose content runs only once it is opened (Streamlit's lazy expander, on_change="rerun":
    opening it reruns the page, whose figures are cached), yielding whether it is open: a page neither computes nor sends
    the browser a detail table nobody opened (the Waste page's 1,000 waiting jobs were a third of its script's time).
    `key` names its state (details_key: `key` with "_open")."""
    box = st.expander(label, key=details_key(key), on_change="rerun")
    with box:
        yield bool(box.open)


def details_key(key: str) -> str:
    """The session state key of details(`key`): True while it is open (a test opens it so)."""
    return f"{key}_open"


# A state of GPU time has one colour on every chart: losses warm, compute green, what the fields cannot split grey
# (Altair's default scheme gave compute red and the colours moved with the states a chart happened to have)
STATE_COLORS = {"startup": "#9467bd", "no_process": "#d62728", "idle": "#ff7f0e", "checkpoint": "#e377c2", "pause": "#f7b6d2",
                "input_bound": "#bcbd22", "communication_bound": "#17becf", "straggler": "#8c564b", "compute": "#2ca02c",
                "busy_unresolved": "#c7c7c7"}


def state_colors(shown: Any) -> Any:
    """The colour scale of a chart whose `state` field holds states in words (vocabulary.STATES); its legend lists the
    states `shown` (those words), each in its colour."""
    import altair as alt

    shown = set(shown)
    pairs = [(words.state(s), c) for s, c in STATE_COLORS.items() if words.state(s) in shown]
    return alt.Scale(domain=[w for w, _ in pairs], range=[c for _, c in pairs])


# What a chart's frame takes of its height: Streamlit fits the whole chart, its x axis and title and a legend above it,
# in the height it is given, so bands sized alone left a chart of one or two rows a plot 0 px high (axes, no bars).
# Measured in Chromium: a two-row chart given 166 px drew ~16 px of bars
AXIS_PX, LEGEND_ABOVE_PX = 80, 70


def chart_height(rows: int, row_px: int, *, legend_above: bool = False) -> int:
    """A chart's height for `rows` bands of `row_px` each, with room for its frame (AXIS_PX, LEGEND_ABOVE_PX)."""
    return rows * row_px + AXIS_PX + (LEGEND_ABOVE_PX if legend_above else 0)


def text(label: str, value: Any) -> None:
    """A label and a value from the store, the value shown verbatim as plain text."""
    st.text(f"{label}: {'' if value is None else value}")


# --- the page frame ---


@dataclass
class Context:
    settings: dconfig.Settings
    window: data.Window
    version: int | None
    now: datetime


def set_context(ctx: Context) -> None:
    st.session_state["_gpufleet_ctx"] = ctx


def context() -> Context:
    ctx = st.session_state.get("_gpufleet_ctx")
    if ctx is None:  # a page run on its own (not through app.py)
        ctx = sidebar()
    return ctx


def no_store_message(root: Any) -> None:
    st.info("No store to read yet. Start the collector (`gpufleet collect`) or point the dashboard at a store with "
            "`gpufleet dashboard --store DIR`. The store directory this dashboard reads:")
    st.code(str(root), language=None)


def run_page(title: str, body: Callable[[Context], None], caption: str | None = None) -> None:
    """Title, then the page body; a missing store or an empty window is a message, and an
    unexpected failure is a short error (details in the server log), never a traceback."""
    from gpufleet.collector.store import StoreError
    from gpufleet.config import ConfigError

    st.title(title)
    if caption:
        st.caption(caption)
    try:
        ctx = context()
        if ctx.version is None:
            no_store_message(ctx.settings.store)
            return
        body(ctx)
    except StoreError as e:
        st.info("The store cannot be read right now:")
        st.code(str(e), language=None)
    except ConfigError as e:
        st.error("The configuration is not valid:")
        st.code(str(e), language=None)
    except Exception as e:  # noqa: BLE001 - a page must never show a traceback
        log.exception("page %s failed", title)
        st.error("This page failed to render. The dashboard's log has the details.")
        st.code(f"{type(e).__name__}: {e}", language=None)


def window_caption(w: data.Resolved) -> None:
    """The window the figures on the page are for, and the filters (plain text: values are data),
    then each of its edge warnings (data.edge_warnings: an edge whose cut minutes retention retired)."""
    f = w.filters
    parts = [f"{k}={v}" for k, v in (("cluster", f.cluster), ("account", f.account), ("user", f.user_name), ("model", f.model), ("partition", f.partition)) if v]
    st.text(f"Window {when(w.start)} to {when(w.end)}" + (" (the last " + words.span(w.length.total_seconds()) + ", moving with now)" if w.relative else "")
            + (f"; filters: {', '.join(parts)}" if parts else ""))
    for warning in data.edge_warnings(w.key):
        st.warning(warning)


def scope_note(t: Any) -> None:
    """Whose figures these are (Totals.scope) and, under a job filter, what is not attributable
    (plain text: the scope holds filter values, which are data); a warning where allocated exceeds
    capacity, or where a GPU model filter cannot place some jobs (core.totals_warnings)."""
    if t.scope != "fleet":
        st.text(f"Figures for {t.scope}" + (f" only; {t.not_attributable_reason}." if t.not_attributable_reason else "."))
    for warning in totals_warnings(t):
        st.warning(words.sentence(warning))


def unknown_filter_warning(warnings: list[str]) -> None:
    """Each unknown filter value as a visible warning (the text holds the value the URL gave:
    shown as plain text under a fixed alert, never as Markdown)."""
    if warnings:
        st.warning("A filter names a value this store does not know; the figures below match nothing for it:")
        for w in warnings:
            st.text(w)


def empty_window(what: str = "data") -> None:
    st.info(f"No {what} in this window. Widen the time window or clear the filters in the sidebar.")


# --- the sidebar: common filters, carried across pages and in the URL ---


def _parse_time(text: str) -> datetime | None:
    from gpufleet.times import parse_time
    from gpufleet.config import ConfigError

    try:
        return parse_time(text.strip())
    except (ConfigError, ValueError):
        return None


@st.cache_resource(show_spinner=False)
def log_to_stderr() -> None:
    """gpufleet's own log lines (a failing figure's) on the served dashboard's
    stderr, once per process, in the format of `gpufleet`'s other commands."""
    logger = logging.getLogger("gpufleet")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def sidebar() -> Context:
    """The common filters (bound to query parameters, so the URL is shareable and the filters
    follow the user from page to page); returns this run's context."""
    s = data.current_settings()
    root = str(s.store)
    version = data.manifest_version(root)
    opts: dict[str, list[str]] = {}
    if version is not None:
        try:
            opts = data.filter_options(root, version)
        except Exception:  # noqa: BLE001 - filters without choices still work
            log.exception("reading filter values failed")
    sb = st.sidebar
    sb.header("Filters")
    presets = [*dconfig.WINDOWS, CUSTOM]
    asked_window = st.query_params.get("window")
    if asked_window is not None and asked_window not in presets and "window" not in st.session_state:
        # a URL's unknown window (?window=bogus): said aloud, then the default window (a window
        # cannot match nothing the way an unknown account does)
        st.warning(f"Unknown time window in the URL; showing the default window ({s.dashboard['default_window']}). "
                   f"Known windows: {', '.join(presets)}.")
        st.text(f"window={asked_window}")
        del st.query_params["window"]
    if "window" not in st.session_state and "window" not in st.query_params and "from" in st.query_params:
        st.session_state["window"] = CUSTOM  # a shared URL with from/to and no window
    default = {} if "window" in st.session_state else {"index": presets.index(s.dashboard["default_window"])}
    # options are their own labels: a bound widget writes its label into the URL
    preset = sb.selectbox("Time window (the last ...)", presets, key="window", bind="query-params", **default)
    now = data.utcnow()
    start = end = None
    if preset == CUSTOM:
        sb.text_input("From (ISO 8601, UTC)", key="from", bind="query-params", placeholder="2026-11-16T00:00")
        sb.text_input("To (ISO 8601, UTC)", key="to", bind="query-params", placeholder="2026-11-17T00:00")
        start, end = _parse_time(st.session_state.get("from") or ""), _parse_time(st.session_state.get("to") or "")
        if start is None or end is None or end <= start:
            sb.warning("Enter From and To as ISO 8601 times, From before To. Showing the default window meanwhile.")
            preset, start, end = s.dashboard["default_window"], None, None
    values: dict[str, str | None] = {}
    for key, label in FILTERS:
        choices = [ALL, *opts.get(key, [])]
        asked = st.session_state.get(key, st.query_params.get(key))
        if asked is not None and asked not in choices:
            # a value the store does not know (?account=nosuchteam) stays selected and applied - the
            # figures then match nothing, with a warning - never silently dropped for the whole fleet
            choices.append(asked)
        v = sb.selectbox(label, choices, key=key, bind="query-params")
        values[key] = None if v in (None, ALL) else v
    filters = Filters(cluster=values["cluster"], account=values["account"], user_name=values["user"], model=values["model"],
                      partition=values["partition"])
    if version is not None and any(v is not None for v in values.values()):
        try:
            unknown_filter_warning(data.unknown_filters(root, version, filters))
        except Exception:  # noqa: BLE001 - the check must not take the page down
            log.exception("checking the filter values failed")
    window = data.make_window(s, preset=None if preset == CUSTOM else preset, start=start, end=end, filters=filters, now=now)
    sb.caption(f"Store: {root}")
    ctx = Context(settings=s, window=window, version=version, now=now)
    set_context(ctx)
    return ctx


# --- sign-in ---


def sign_in_gate(s: dconfig.Settings) -> bool:
    """With [dashboard.auth] configured: True once the user has signed in (and is allowed)."""
    if not s.auth_enabled:
        return True
    user = st.user
    if not user.get("is_logged_in"):
        st.title("gpufleet")
        st.write("Sign in to see the GPU fleet.")
        st.button("Sign in", on_click=st.login, type="primary")
        return False
    email = str(user.get("email") or "")
    emails = [e.lower() for e in s.dashboard["allowed_emails"]]
    domains = [d.lower().lstrip("@") for d in s.dashboard["allowed_domains"]]
    if (emails or domains) and email.lower() not in emails and email.lower().rpartition("@")[2] not in domains:
        st.title("gpufleet")
        st.warning("This account may not see the dashboard. Ask its operators to add it to [dashboard] allowed_emails or allowed_domains.")
        st.text(f"Signed in as: {email}")
        st.button("Sign out", on_click=st.logout)
        return False
    st.sidebar.text(f"Signed in as {email}")
    st.sidebar.button("Sign out", on_click=st.logout)
    return True


# --- auto-refresh ---


def auto_refresh(ctx: Context) -> None:
    """Rerun the page when the store has a new publish or a relative window's reuse period
    ended (data.step_for), checked every refresh_seconds. Cached figures make a rerun cheap
    when nothing changed for them."""
    seconds = ctx.settings.refresh_seconds
    if seconds <= 0:
        return

    @st.fragment(run_every=timedelta(seconds=seconds))
    def _watch() -> None:
        w = ctx.window
        version = data.manifest_version(ctx.settings.store)
        epoch = data.make_window(ctx.settings, preset=w.preset, start=w.start, end=w.end, filters=w.filters).epoch
        if version != ctx.version or epoch != w.epoch:
            st.rerun(scope="app")

    _watch()
