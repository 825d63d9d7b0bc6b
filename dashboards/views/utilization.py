"""Utilization: over time and by cluster, partition/namespace, account, user or GPU model;
capacity, allocated, held and busy, with "no data" shown as such (the vocabulary of
gpufleet.analytics.vocabulary)."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import vocabulary as words
from gpufleet.dashboards import data, ui

BY = {"fleet": "whole fleet", "cluster": "cluster", "partition": "partition / namespace", "account": "account / team",
      "user_name": "user", "model": "GPU model"}
# what the "Group by" control offers (its options are its labels: a bound widget writes the label into the URL)
CHOICES = {"fleet": "fleet", "cluster": "cluster", "partition": "partition", "account": "account", "user": "user_name", "model": "model"}
KEYS = {"fleet": [], "cluster": ["cluster"], "model": ["model"], "partition": ["cluster", "partition"], "account": ["cluster", "account"],
        "user_name": ["cluster", "user_name"]}
SERIES = {k: words.TERMS[k] for k in ("capacity_gpu_h", "allocated_gpu_h", "held_data_gpu_h", "busy_gpu_h", "no_data_gpu_h")}
TOP = 25


def fleet_chart(tl: pl.DataFrame, bucket_h: float, start, end) -> alt.LayerChart:
    """Average GPUs over each bucket (GPU-hours / the bucket's hours inside the window) of each
    series; a bucket the window's edges or now cut is drawn as a hollow point and said so in its
    tooltip, its average taken over the part it covers (no cliff at the current bucket). Held is
    dashed, so allocated stays visible where the two lie on each other."""
    cols = [c for c in SERIES if c in tl.columns and tl[c].is_not_null().any()]
    long = ui.bucket_coverage(tl.select("bucket", *cols), bucket_h, start, end).unpivot(
        index=["bucket", "covered_h", "part"], on=cols, variable_name="series", value_name="gpu_h").with_columns(
        (pl.col("gpu_h") / pl.col("covered_h")).alias("gpus"), pl.col("series").replace_strict(SERIES),
        pl.col("covered_h").map_elements(lambda h: f"{ui.duration(h * 3600)} of {ui.duration(bucket_h * 3600)}", return_dtype=pl.Utf8)
        .alias("covers"))
    long = ui.utc_times(long.filter(pl.col("covered_h") > 0))
    names = list(SERIES.values())
    base = alt.Chart(long).encode(
        x=ui.time_x(start, end),
        y=alt.Y("gpus:Q", title="GPUs (average over the bucket)"),
        color=alt.Color("series:N", title=None, sort=names, legend=alt.Legend(orient="top", labelLimit=0),
                        scale=alt.Scale(domain=names, range=["#7f7f7f", "#1f77b4", "#17becf", "#2ca02c", "#d62728"])),
        strokeDash=alt.StrokeDash("series:N", sort=names, legend=None,
                                  scale=alt.Scale(domain=names, range=[[1, 0], [1, 0], [6, 4], [1, 0], [1, 0]])),
        tooltip=[ui.time_tooltip(), "series:N", alt.Tooltip("gpus:Q", title="GPUs", format=",.1f"),
                 alt.Tooltip("gpu_h:Q", title="GPU-hours", format=",.1f"), alt.Tooltip("part:N", title="bucket"),
                 alt.Tooltip("covers:N", title="covers")],
    )
    lines = base.mark_line(interpolate="step-after", strokeWidth=2)
    points = base.mark_point(filled=True, size=30).encode(
        shape=alt.Shape("part:N", title="bucket", scale=alt.Scale(domain=["whole", ui.PARTIAL], range=["circle", "triangle-down"]),
                        legend=alt.Legend(orient="top")),
        fillOpacity=alt.FillOpacity("part:N", scale=alt.Scale(domain=["whole", ui.PARTIAL], range=[1.0, 0.0]), legend=None))
    return alt.layer(lines, points).properties(height=300)


def heatmap(tl: pl.DataFrame, keys: list[str], order: list[str], basis: str, bucket_h: float) -> alt.Chart:
    """Group x time, coloured by utilization; grey where GPUs were there (capacity) or held
    (allocated) but sent no data; blank where there was nothing to measure."""
    label = keys[-1]
    df = tl.filter((pl.col(basis) > 0) | (pl.col("data_gpu_h") > 0)).select(
        "bucket", pl.col(label).fill_null("(none)").alias("group"), "utilization_pct", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h"
    ).with_columns((pl.col("bucket") + pl.duration(seconds=bucket_h * 3600)).alias("bucket_end"))
    df = ui.utc_times(df)
    base = alt.Chart(df).encode(x=ui.time_x(df["bucket"].min(), df["bucket_end"].max()) if df.height else ui.time_x(), x2="bucket_end:T",
                                y=alt.Y("group:N", sort=order, title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0))
                                ).properties(height=max(120, 20 * len(order)))
    tooltip = [alt.Tooltip("group:N", title=label), ui.time_tooltip(),
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
    b = data.window_bundle(w.key, "utilization")
    t = b.totals
    ui.window_caption(b.window)
    if ui.empty_totals(t):
        ui.empty_window("GPU or job")
        return
    ui.scope_note(t)
    c = st.columns(3)
    c[0].metric("Utilization", ui.pct(t.utilization_pct), help="Time-weighted GPU utilization over the time with data")
    c[1].metric("Busy", ui.gpu_h(t.busy_gpu_h), help="Utilization-weighted time with data")
    c[2].metric("Allocated", words.known_gpu_h(t.allocated_gpu_h, t.allocated_unknown_jobs),
                help=ui.allocated_help(t, "Scheduler accounting: GPUs x MIG share x run time"))
    c = st.columns(3)
    c[0].metric("Capacity", ui.attributable(t.capacity_gpu_h, t, ui.gpu_h))
    c[1].metric("With data", ui.gpu_h(t.data_gpu_h))
    c[2].metric("No data", ui.gpu_h(t.no_data_gpu_h), help="Allocated time with no sample: neither idle nor busy" if t.not_attributable_reason
                else "Capacity with no sample: neither idle nor busy")

    tl_fleet = b.timeline["fleet"]
    bucket_h = ((tl_fleet["bucket"][1] - tl_fleet["bucket"][0]).total_seconds() / 3600) if tl_fleet.height > 1 else b.window.length.total_seconds() / 3600
    st.subheader("Capacity, allocated and busy")
    st.caption(f"Average GPUs in each {ui.duration(bucket_h * 3600)} bucket, times in UTC. 'No data': capacity without samples "
               "(exporter down, GPU lost). A hollow triangle is a partial bucket (cut by the window's start or by now): its "
               "average is over the part it covers.")
    st.altair_chart(fleet_chart(tl_fleet, bucket_h, b.window.start, b.window.end), width="stretch")

    if by != "fleet":
        keys = KEYS[by]
        u = b.utilization[by]
        rank = "capacity_gpu_h" if "capacity_gpu_h" in u.columns else "allocated_gpu_h"
        if rank == "capacity_gpu_h" and t.not_attributable_reason:
            rank = "data_gpu_h"  # capacity is no job's: under a job filter, the selected jobs' time
        order = u.sort(rank, descending=True, nulls_last=True)[keys[-1]].fill_null("(none)").to_list()
        shown = order[:TOP]
        tl = b.timeline[by].filter(pl.col(keys[-1]).fill_null("(none)").is_in(shown))
        st.subheader(f"Utilization by {BY[by]} over time")
        if len(order) > TOP:
            st.caption(f"The {TOP} largest of {len(order)} by {rank.replace('_gpu_h', '').replace('_', ' ')} GPU-hours; the table below has all.")
        st.caption("Colour: utilization; grey: " + ("capacity" if rank == "capacity_gpu_h" else "allocated time")
                   + " without samples (no data); blank: nothing " + ("installed" if rank == "capacity_gpu_h" else "allocated") + ".")
        st.altair_chart(heatmap(tl, keys, shown, rank, bucket_h), width="stretch")
        st.subheader(f"By {BY[by]} over the window")
        ui.table(ui.unknown_gpu_counts_note(u).sort(rank, descending=True, nulls_last=True), key="util_by",
                 sort=f"most {words.header(rank)} first")
    else:
        st.subheader("The window")
        ui.table(b.utilization["fleet"], key="util_by")
    with ui.details("Timeline (table)", "util_timeline") as shown:
        if shown:
            ui.table(b.timeline[by], key="util_timeline")


ui.run_page("Utilization", body)
