"""Waste and cost: idle allocated GPU-hours and money by team and user, the worst jobs, stranded
capacity, and the trend against the previous window of the same length."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import goodput, vocabulary as words
from gpufleet.analytics.core import capacity_warnings
from gpufleet.dashboards import data, ui

TOP = 15


def bars(df: pl.DataFrame, key: str, value: str, title: str) -> alt.LayerChart:
    """The TOP largest, every bar named on its axis (no label dropped for room: the chart grows
    with its bars) and its figure written at its end."""
    top = df.sort(value, descending=True, nulls_last=True).head(TOP).with_columns(pl.col(key).fill_null("(none)"))
    base = alt.Chart(top).encode(
        y=alt.Y(f"{key}:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)),
        x=alt.X(f"{value}:Q", title=title),
        tooltip=[f"{key}:N", alt.Tooltip("gpu_h:Q", title="GPU-hours", format=",.1f"), alt.Tooltip("cost:Q", title="cost", format=ui.USD_D3),
                 alt.Tooltip("gpus:Q", title="GPUs")],
    )
    figures = base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{value}:Q", format=",.1f"))
    return alt.layer(base.mark_bar(), figures).properties(height=max(120, 26 * top.height + 30))


def waterfall_section(b: data.Bundle) -> None:
    """The goodput waterfall (gpufleet.analytics.goodput): where the window's capacity went, step by step."""
    st.subheader("Goodput waterfall")
    g = b.goodput
    if g is None:
        st.text(f"Not shown: {b.goodput_error}.")
        return
    st.caption("Capacity, then what jobs were allocated, of it the time with data, busy, not lost to interruptions (the "
               "lost GPU-hours at the team's utilization) and useful (x MFU, where known). A step unknown for some team is "
               "the sum of the others (at least).")
    rows = pl.DataFrame(goodput.chart_rows(g["fleet"]), schema={"step": pl.Utf8, "gpu_h": pl.Float64, "cost": pl.Float64,
                                                                 "dropped_gpu_h": pl.Float64})
    rows = rows.with_columns(pl.Series("unknown_teams", [r["unknown_teams"] for r in g["fleet"]]))
    if b.totals.not_attributable_reason and rows["gpu_h"][0] is None:  # (a job filter: no capacity of its own)
        st.caption(f"It starts at allocated: {b.totals.not_attributable_reason}.")
        rows = rows.slice(1)
    # what went since the step before, as text: the first step has none (a dash), not an unknown amount
    gone = pl.Series("dropped_gpu_h", [words.NONE if i == 0 else words.gpu_h(x) for i, x in enumerate(rows["dropped_gpu_h"])], pl.String)
    known = rows.filter(pl.col("gpu_h").is_not_null())
    if not known.is_empty():
        order = list(rows["step"])
        st.altair_chart(alt.Chart(known).mark_bar().encode(
            x=alt.X("step:N", sort=order, title=None, axis=alt.Axis(labelAngle=0, labelLimit=0)),
            y=alt.Y("gpu_h:Q", title="GPU-hours"),
            tooltip=["step:N", alt.Tooltip("gpu_h:Q", title="GPU-hours", format=",.1f"),
                     alt.Tooltip("cost:Q", title="cost", format=ui.USD_D3)]), width="stretch")
    ui.table(rows.with_columns(gone), key="waste_waterfall", labels={"gpu_h": "GPU-h", "dropped_gpu_h": "gone since the step before GPU-h"},
             sort="the waterfall's order")
    said = set(capacity_warnings(b.totals))  # (the page says those under its scope: ui.scope_note)
    for note in [n for n in g["notes"] if n not in said] + (
            ["lost GPU-hours are an upper bound where a job reported no checkpoint: not lost is then at least what is shown"]
            if g["lost_is_upper_bound"] else []):
        st.caption(words.sentence(note))
    teams = pl.DataFrame(g["teams"], schema={"cluster": pl.Utf8, "account": pl.Utf8,
                                             **{f"{s}_{u}": pl.Float64 for u in ("gpu_h", "cost") for s in goodput.STEPS[1:]}})
    ui.table(teams.select("cluster", "account", *(f"{s}_{u}" for s in goodput.STEPS[1:] for u in ("gpu_h", "cost"))), key="waste_waterfall_teams",
             empty="No team held GPUs in this window.", sort="cluster and account")


def body(ctx: ui.Context) -> None:
    w = ctx.window
    b = data.window_bundle(w.key, "waste")
    ui.window_caption(b.window)
    t = b.totals
    if ui.empty_totals(t):
        ui.empty_window("GPU or job")
        return
    ui.scope_note(t)
    base = b.previous
    prev, why = base.totals, base.no_comparison
    c = st.columns(3)
    c[0].metric("Idle allocated", ui.gpu_h(t.idle_allocated_gpu_h), **ui.delta(t.idle_allocated_gpu_h, prev.idle_allocated_gpu_h, ui.gpu_h, why),
                help="Allocated time below the idle threshold, in stretches at least the idle minimum long")
    c[1].metric("Idle allocated cost", ui.usd(t.idle_allocated_cost), **ui.delta(t.idle_allocated_cost, prev.idle_allocated_cost, ui.usd, why))
    share = t.idle_allocated_gpu_h / t.allocated_gpu_h * 100 if (t.allocated_gpu_h or 0) > 0 else None
    c[2].metric("Share of allocated", words.UNKNOWN if t.allocated_gpu_h is None else ui.pct(share),
                help=ui.allocated_help(t, "Idle allocated over the allocated GPU-hours of the jobs whose GPU count is known"))
    c = st.columns(3)
    c[0].metric("Held with no process", ui.gpu_h(t.no_process_gpu_h), **ui.delta(t.no_process_gpu_h, prev.no_process_gpu_h, ui.gpu_h, why))
    c[1].metric("No-process cost", ui.usd(t.no_process_cost), **ui.delta(t.no_process_cost, prev.no_process_cost, ui.usd, why))
    stranded_delta = {} if t.not_attributable_reason else ui.delta(t.stranded_gpu_h, prev.stranded_gpu_h, ui.gpu_h, why)
    c[2].metric("Stranded (unallocated)", ui.attributable(t.stranded_gpu_h, t, ui.gpu_h), **stranded_delta,
                help="GPU time with data that no job held")
    c = st.columns(3)
    stranded_delta = {} if t.not_attributable_reason else ui.delta(t.stranded_cost, prev.stranded_cost, ui.usd, why)
    c[0].metric("Stranded cost", ui.attributable(t.stranded_cost, t, ui.usd), **stranded_delta)
    if t.unpriced_models:
        st.caption("No price for these GPU models ([analytics.prices]); money on them is unknown:")
        st.text(", ".join(t.unpriced_models))

    st.subheader("Against the previous window")
    st.text(f"Previous window: {ui.when(b.window.start - b.window.length)} to {ui.when(b.window.start)}")
    if why:
        st.text(f"No data to compare against: {why}")
    ui.table(ui.trend_table(base.compare(t)), key="waste_trend", sort="the headline figures' order")

    st.subheader("Idle allocated by account / team")
    acct = b.waste[("account", "idle")]
    if not acct.is_empty():
        if acct.height > TOP:
            st.caption(f"The {TOP} teams with the most idle allocated GPU-hours of {acct.height}; the table below has all.")
        st.altair_chart(bars(acct, "account", "gpu_h", "idle allocated GPU-hours"), width="stretch")
    ui.table(acct, key="waste_by_account", empty="No idle allocated time in this window.", labels={"gpu_h": "idle GPU-h"},
             sort="most idle GPU-hours first")
    st.subheader("Idle allocated by user")
    ui.table(b.waste[("user_name", "idle")], key="waste_by_user", empty="No idle allocated time in this window.", labels={"gpu_h": "idle GPU-h"},
             sort="most idle GPU-hours first")
    with ui.details("Held with no compute process, by account and by user", "waste_np") as shown:
        if shown:
            ui.table(b.waste[("account", "no_process")], key="waste_np_account", labels={"gpu_h": words.header("no_process_gpu_h")})
            ui.table(b.waste[("user_name", "no_process")], key="waste_np_user", labels={"gpu_h": words.header("no_process_gpu_h")})

    st.subheader("Most wasteful jobs")
    ui.table(b.top_jobs.drop(["scheduler"], strict=False), key="waste_top_jobs", empty="No job idled in this window.",
             sort="most idle GPU-hours first")

    waterfall_section(b)

    queue_gaps(b)
    st.subheader("Stranded capacity")
    if t.not_attributable_reason:
        st.text(f"Not shown: {t.not_attributable_reason}.")
        return
    st.caption("GPU time with data that no job held, by GPU model and by host.")
    by_model = b.utilization["model"].select("model", "capacity_gpu_h", "stranded_gpu_h", "data_gpu_h").sort("stranded_gpu_h", descending=True)
    ui.table(by_model, key="waste_stranded_model", sort="most stranded GPU-hours first")
    by_host = b.utilization["host"].select("cluster", "host", "capacity_gpu_h", "stranded_gpu_h").sort("stranded_gpu_h", descending=True)
    ui.table(by_host, key="waste_stranded_host", sort="most stranded GPU-hours first")


def queue_gaps(b: data.Bundle) -> None:
    """Free GPUs while pending jobs that would have fit waited (gpufleet.analytics.queue_gaps)."""
    st.subheader("Queue gaps")
    g = b.queue_gaps
    st.caption("GPU-hours a partition's GPUs of one model stood free while a pending job that would have fit on them waited "
               "(GPUs counted, not node shapes: an upper bound of what the scheduler could have placed). "
               "A GPU serving two partitions is in both: pools do not add up to the fleet." + (f" Under this filter {g.note}." if g.note else ""))
    ui.table(g.pools.filter(pl.col("gap_gpu_h") > 0), key="waste_queue_gaps", empty="No pending job waited while it would have fit.",
             sort="largest gap first")
    if not g.jobs.is_empty():
        with ui.details(f"The jobs that waited while they would have fit ({words.quantity(g.jobs.height, 'job')})", "waste_queue_jobs") as shown:
            if shown:
                ui.table(g.jobs.drop("job_key"), key="waste_queue_jobs", sort="most GPU-hours waited while they fit first")
    left = [f"{n} {why}" for why, n in g.not_counted.items() if n]
    if left:
        st.caption("Waiting jobs not counted: " + "; ".join(left) + ".")


ui.run_page("Waste and cost", body)
