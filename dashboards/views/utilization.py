"""Utilization: over time and by cluster, partition/namespace, account, user or GPU model;
allocated vs used vs capacity, with "no data" shown as such."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.dashboards import figures, ui

BY = {"fleet": "whole fleet", "cluster": "cluster", "partition": "partition / namespace", "account": "account / team",
      "user_name": "user", "model": "GPU model"}
# what the "Group by" control offers (its options are its labels: a bound widget writes the label into the URL)
CHOICES = {"fleet": "fleet", "cluster": "cluster", "partition": "partition", "account": "account", "user": "user_name", "model": "model"}
KEYS = {"fleet": [], "cluster": ["cluster"], "model": ["model"], "partition": ["cluster", "partition"], "account": ["cluster", "account"],
        "user_name": ["cluster", "user_name"]}
SERIES = {"capacity_gpu_h": "capacity", "allocated_gpu_h": "allocated (scheduler)", "held_data_gpu_h": "held (exporter data)",
          "busy_gpu_h": "used (busy)", "no_data_gpu_h": "no data"}
TOP = 25


def fleet_chart(tl: pl.DataFrame, bucket_h: float) -> alt.Chart:
    """Average GPUs over each bucket (GPU-hours / bucket hours) of each series."""
    cols = [c for c in SERIES if c in tl.columns and tl[c].is_not_null().any()]
    long = tl.select("bucket", *cols).unpivot(index="bucket", on=cols, variable_name="series", value_name="gpu_h").with_columns(
        (pl.col("gpu_h") / bucket_h).alias("gpus"), pl.col("series").replace_strict(SERIES))
    return alt.Chart(long).mark_line(interpolate="step-after", point=True).encode(
        x=alt.X("bucket:T", title=None),
        y=alt.Y("gpus:Q", title="GPUs (average over the bucket)"),
        color=alt.Color("series:N", title=None, sort=list(SERIES.values()),
                        scale=alt.Scale(domain=list(SERIES.values()), range=["#7f7f7f", "#1f77b4", "#17becf", "#2ca02c", "#d62728"])),
        tooltip=[alt.Tooltip("bucket:T", format="%Y-%m-%d %H:%M"), "series:N", alt.Tooltip("gpus:Q", format=",.1f"),
                 alt.Tooltip("gpu_h:Q", title="GPU-hours", format=",.2f")],
    ).properties(height=300)


def heatmap(tl: pl.DataFrame, keys: list[str], order: list[str], basis: str, bucket_h: float) -> alt.Chart:
    """Group x time, coloured by utilization; grey where GPUs were there (capacity) or held
    (allocated) but sent no data; blank where there was nothing to measure."""
    label = keys[-1]
    df = tl.filter((pl.col(basis) > 0) | (pl.col("data_gpu_h") > 0)).select(
        "bucket", pl.col(label).fill_null("(none)").alias("group"), "utilization_pct", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h"
    ).with_columns((pl.col("bucket") + pl.duration(seconds=bucket_h * 3600)).alias("bucket_end"))
    base = alt.Chart(df).encode(x=alt.X("bucket:T", title=None), x2="bucket_end:T", y=alt.Y("group:N", sort=order, title=None, axis=alt.Axis(labelOverlap=False))
                                ).properties(height=max(120, 20 * len(order)))
    tooltip = [alt.Tooltip("group:N", title=label), alt.Tooltip("bucket:T", format="%Y-%m-%d %H:%M"),
               alt.Tooltip("utilization_pct:Q", title="utilization %", format=".1f"),
               alt.Tooltip("busy_gpu_h:Q", title="busy GPU-h", format=",.2f"), alt.Tooltip("no_data_gpu_h:Q", title="no-data GPU-h", format=",.2f")]
    grey = base.mark_rect(color="#d0d0d0").encode(tooltip=tooltip)
    colored = base.transform_filter("isValid(datum.utilization_pct)").mark_rect().encode(
        color=alt.Color("utilization_pct:Q", title="utilization %", scale=alt.Scale(domain=[0, 100], scheme="viridis")), tooltip=tooltip)
    return alt.layer(grey, colored)


def body(ctx: ui.Context) -> None:
    w = ctx.window
    choice = st.segmented_control("Group by (partition = namespace on Kubernetes, account = team)", list(CHOICES), default="fleet",
                                  key="by", bind="query-params")
    by = CHOICES.get(choice or "fleet", "fleet")
    b = figures.use_for(w)
    t = b.totals
    ui.window_caption(b.window)
    ui.facts_note(b.facts_hours)
    if not b.facts_hours and b.facts_missed and not w.relative:
        st.caption("Computed for this window: hour facts, which answer a window typed in within seconds, could not - "
                   + b.facts_missed + ".")
    if ui.empty_totals(t):
        ui.empty_window("GPU or job")
        return
    ui.scope_note(t)
    c = st.columns(3)
    c[0].metric("Utilization", ui.pct(t.utilization_pct), help="Time-weighted GPU utilization over the time with data")
    c[1].metric("Used (busy)", ui.gpu_h(t.busy_gpu_h))
    c[2].metric("Allocated", ui.gpu_h(t.allocated_gpu_h), help="Scheduler accounting: GPUs x MIG share x run time")
    c = st.columns(3)
    c[0].metric("Capacity", ui.attributable(t.capacity_gpu_h, t, ui.gpu_h))
    c[1].metric("With data", ui.gpu_h(t.data_gpu_h))
    c[2].metric("No data", ui.gpu_h(t.no_data_gpu_h), help="Allocated time with no sample: neither idle nor busy" if t.not_attributable_reason
                else "Capacity with no sample: neither idle nor busy")

    tl_fleet = b.timeline["fleet"]
    bucket_h = ((tl_fleet["bucket"][1] - tl_fleet["bucket"][0]).total_seconds() / 3600) if tl_fleet.height > 1 else b.window.length.total_seconds() / 3600
    st.subheader("Allocated vs used vs capacity")
    st.caption(f"Average GPUs in each {ui.duration(bucket_h * 3600)} bucket. 'No data': capacity without samples (exporter down, GPU lost).")
    st.altair_chart(fleet_chart(tl_fleet, bucket_h), width="stretch")

    if by != "fleet":
        keys = KEYS[by]
        u = b.utilization[by]
        rank = "capacity_gpu_h" if "capacity_gpu_h" in u.columns else "allocated_gpu_h"
        if rank == "capacity_gpu_h" and t.not_attributable_reason:
            rank = "data_gpu_h"  # capacity is no job's: under a job filter, the selected jobs' time
        order = u.sort(rank, descending=True)[keys[-1]].fill_null("(none)").to_list()
        shown = order[:TOP]
        tl = b.timeline[by].filter(pl.col(keys[-1]).fill_null("(none)").is_in(shown))
        st.subheader(f"Utilization by {BY[by]} over time")
        if len(order) > TOP:
            st.caption(f"The {TOP} largest of {len(order)} by {rank.replace('_gpu_h', '').replace('_', ' ')} GPU-hours; the table below has all.")
        st.caption("Colour: utilization; grey: " + ("capacity" if rank == "capacity_gpu_h" else "allocated time")
                   + " without samples (no data); blank: nothing " + ("installed" if rank == "capacity_gpu_h" else "allocated") + ".")
        st.altair_chart(heatmap(tl, keys, shown, rank, bucket_h), width="stretch")
        st.subheader(f"By {BY[by]} over the window")
        ui.table(u.sort(rank, descending=True), key="util_by")
    else:
        st.subheader("The window")
        ui.table(b.utilization["fleet"], key="util_by")
    with st.expander("Timeline (table)"):
        ui.table(b.timeline[by], key="util_timeline")


ui.run_page("Utilization", body)
