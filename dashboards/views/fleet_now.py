"""Fleet now: every node and GPU at a glance, who holds each GPU, and what idles right now."""

from __future__ import annotations


import altair as alt
import polars as pl
import streamlit as st

from gpufleet.dashboards import data, ui

MARKS = {"lost": "✕", "error": "!", "no data": "?"}
EQUIV_HELP = "GPU equivalents: a MIG instance counts as its share of its GPU (3g.40gb = 3/7 of a GPU)"
# the latest sample's utilization in the tables, as every table heads and writes a utilization (vocabulary: "utilization %", 0.0)
UTILIZATION = pl.col("util").alias("utilization_pct")
LEGEND = "✕ lost (gpu_up = 0)   ! XID / ECC / row-remap error   ? no recent data   ○ held with no process   · held by a job"


def grid(states: pl.DataFrame) -> alt.LayerChart:
    """One row per host, one column per GPU index; a MIG GPU's column is split into its instances,
    so slices sit inside their GPU instead of widening the grid for every node."""
    df = states.with_columns(
        pl.when(pl.col("gi") >= 0).then(pl.format("{}/{}", pl.col("gpu"), pl.col("gi"))).otherwise(pl.col("gpu").cast(pl.Utf8)).alias("slot"),
        pl.when(pl.col("fresh")).then(pl.col("util")).otherwise(None).alias("shown_util"),
        pl.when(pl.col("status") != "ok").then(pl.col("status").replace_strict(MARKS, default=""))
        .when(pl.col("no_process")).then(pl.lit("○")).when(pl.col("held")).then(pl.lit("·")).otherwise(pl.lit("")).alias("mark"),
        pl.col("job_ids").fill_null(""), pl.col("user_names").fill_null(""), pl.col("accounts").fill_null(""), pl.col("job_names").fill_null(""),
        pl.len().over("host", "gpu").alias("_parts"),
        (pl.col("gi").rank("ordinal").over("host", "gpu") - 1).alias("_part"),
    ).with_columns(
        (pl.col("gpu") + pl.col("_part") / pl.col("_parts")).alias("x0"),
        (pl.col("gpu") + (pl.col("_part") + 1) / pl.col("_parts")).alias("x1"),
    ).with_columns(((pl.col("x0") + pl.col("x1")) / 2).alias("xc")).select(
        "cluster", "host", "slot", "gpu", "gi", "x0", "x1", "xc", "model", "status", "shown_util", "util", "mark", "job_ids",
        "job_names", "user_names", "accounts", "gpu_temp_c", "power_w", "fb_used_mib", "compute_processes", "last_xid", "age_s")
    hosts = df.select("cluster", "host").unique().sort("cluster", "host")
    y_order = hosts["host"].to_list()
    columns = int(df["gpu"].max()) + 1 if df.height else 1
    tooltip = [alt.Tooltip("host:N"), alt.Tooltip("slot:N", title="GPU"), alt.Tooltip("status:N"),
               alt.Tooltip("util:Q", title="utilization %", format=".0f"), alt.Tooltip("job_ids:N", title="job"),
               alt.Tooltip("job_names:N", title="job name"), alt.Tooltip("user_names:N", title="user"),
               alt.Tooltip("accounts:N", title="account"), alt.Tooltip("gpu_temp_c:Q", title="temperature °C", format=".0f"),
               alt.Tooltip("power_w:Q", title="power W", format=".0f"), alt.Tooltip("fb_used_mib:Q", title="memory used MiB", format=",.0f"),
               alt.Tooltip("compute_processes:Q", title="processes", format="d"), alt.Tooltip("last_xid:N", title="last XID"),
               alt.Tooltip("model:N")]
    x_axis = alt.Axis(values=[g + 0.5 for g in range(columns)], labelExpr="floor(datum.value)", grid=False, ticks=False)
    base = alt.Chart(df).encode(y=alt.Y("host:N", sort=y_order, title=None, axis=alt.Axis(labelOverlap=False))).properties(
        height=max(120, 22 * len(y_order)))
    cells = base.encode(x=alt.X("x0:Q", title="GPU (MIG GPUs split into their instances)", scale=alt.Scale(domain=[0, columns], nice=False),
                                axis=x_axis), x2="x1")
    background = cells.mark_rect(color="#d0d0d0", stroke="white", strokeWidth=1).encode(tooltip=tooltip)
    colored = cells.transform_filter("isValid(datum.shown_util)").mark_rect(stroke="white", strokeWidth=1).encode(
        color=alt.Color("shown_util:Q", title="utilization %", scale=alt.Scale(domain=[0, 100], scheme="viridis")), tooltip=tooltip)
    marks = base.mark_text(fontSize=13, fontWeight="bold", color="#d62728").encode(
        x=alt.X("xc:Q", scale=alt.Scale(domain=[0, columns], nice=False), axis=x_axis), text="mark:N", tooltip=tooltip)
    return alt.layer(background, colored, marks)


def body(ctx: ui.Context) -> None:
    w = ctx.window
    now = data.fleet_now_for(w, ctx.now, ctx.version)
    as_of = now["as_of"]
    states, summary = ui.with_last_xid(now["states"]), now["summary"]
    st.text(f"As of {ui.when(as_of)}" + ("" if w.relative else " (the end of the chosen window)"))
    if states.is_empty():
        ui.empty_window("GPU seen in the last 24 hours before this moment")
        return

    # (the unit said once above the figures: a label with it was cut to "Held by jobs (GPU equivale..." at 1,500 px)
    st.caption(f"Held, free, unsliced, idle and no-process figures are in {EQUIV_HELP}.")
    c = st.columns(5)
    c[0].metric("GPUs reporting", f"{ui.count(summary.reporting)} of {ui.count(summary.gpus)}",
                help="Physical GPUs with a sample in the last few minutes (stale_after_seconds) that are not lost; "
                     "a MIG instance is part of its GPU, not a GPU. Reporting = held + free + unsliced (held on a silent GPU aside)")
    c[1].metric("Held by jobs", ui.gpus(summary.held), help=EQUIV_HELP)
    c[2].metric("Free (reporting, not held)", ui.gpus(summary.free), help=EQUIV_HELP)
    c[3].metric("Unsliced MIG", ui.gpus(summary.unsliced),
                help="The part of MIG GPUs no instance covers: neither held nor free until it is sliced. " + EQUIV_HELP)
    c[4].metric("Mean utilization", ui.pct(summary.mean_utilization_pct), help="Over the GPUs reporting now")
    c = st.columns(4)
    c[0].metric("Idle allocated now", ui.gpus(summary.idle_allocated_gpus),
                help="Held by a job, reporting, utilization below the idle threshold. " + EQUIV_HELP)
    c[1].metric("Idle allocated cost", f"{ui.usd(summary.idle_allocated_usd_per_h)}/h",
                help="$/GPU-hour of the idle allocated GPUs (MIG instances at their share); unknown if a model has no price")
    c[2].metric("Held with no process", ui.gpus(summary.held_no_process), help=EQUIV_HELP)
    c[3].metric("Lost / error / no data (GPUs)", f"{summary.lost} / {summary.error} / {summary.no_data}",
                help="Physical GPUs: lost (gpu_up = 0), reporting an error, or with no recent sample")
    if summary.unpriced_models:
        st.caption("No price for some GPU models ([analytics.prices] in the configuration); their cost is unknown:")
        st.text(", ".join(summary.unpriced_models))

    st.subheader("Every GPU")
    st.caption("Colour: utilization of the latest sample; grey: no recent data. " + LEGEND)
    st.altair_chart(grid(states), width="stretch")

    idle = states.filter(pl.col("idle_allocated")).sort("idle_since", nulls_last=True)
    idle = idle.with_columns(
        ((pl.lit(as_of) - pl.col("idle_since")).dt.total_seconds()).alias("idle_for_s"),
        (pl.col("usd_per_gpu_hour") * pl.col("equiv")).alias("cost_usd_per_h"),
        pl.Series("idle_since_text", [ui.idle_since(t, before) for t, before in zip(idle["idle_since"], idle["idle_since_capped"])],
                  dtype=pl.Utf8),
    )
    st.subheader("Idle allocated GPUs now")
    st.caption("Held by a job and below the idle threshold in the latest sample; idle since = the first sample after the GPU's last "
               "busy sample in the store. \"before\": no busy sample in the look-back, the GPU was idle since before that time "
               "(and idle for at least that long).")
    ui.table(idle.select("host", "gpu", "gi", "model", "job_ids", "job_names", "user_names", "accounts", UTILIZATION, "compute_processes",
                         "idle_since_text", "idle_for_s", "cost_usd_per_h"),
             key="fleet_idle", empty="No GPU is idle while allocated right now.", sort="longest idle first",
             labels={"idle_since_text": "idle since", "idle_for_s": "idle for", "cost_usd_per_h": "$ per hour"})

    st.subheader("Held with no compute process")
    ui.table(states.filter(pl.col("no_process")).select("host", "gpu", "gi", "model", "job_ids", "job_names", "user_names", "accounts",
                                                        UTILIZATION, "fb_used_mib"),
             key="fleet_no_process", empty="Every held GPU has a process on it.")

    st.subheader("Down, erroring or silent GPUs")
    ui.table(states.filter(pl.col("status") != "ok").select("host", "gpu", "gi", "model", "status", "ts", "age_s", "gpu_up", "last_xid",
                                                            "last_xid_at", "ecc_dbe_vol", "remap_failure", "job_ids", "user_names"),
             key="fleet_problems", empty="All GPUs are up and reporting.",
             labels=ui.LAST_SAMPLE_LABELS)

    with ui.details("All GPUs (table)", "fleet_gpus") as shown:
        if shown:
            ui.table(states.select("cluster", "host", "gpu", "gi", "gpu_uuid", "model", "mig_profile", "status", UTILIZATION, "fb_used_mib",
                                   "gpu_temp_c", "power_w", "compute_processes", "held", "job_ids", "job_names", "user_names", "accounts",
                                   "schedulers", "ts", "age_s"),
                     key="fleet_gpus", labels=ui.LAST_SAMPLE_LABELS)

    hosts = now["hosts"]
    stale = hosts.filter(~pl.col("fresh"))
    st.subheader("Freshness")
    cs = data.collector_status(w.root)
    c = st.columns(3)
    c[0].metric("Collector last wrote", ui.duration(cs["age_s"]) + " ago" if cs["age_s"] is not None else "never")
    c[1].metric("Exporters silent", f"{stale.height} of {hosts.height}", help="Hosts with no fresh sample from any GPU")
    silent_since = stale["last_sample"].min() if stale.height else None
    c[2].metric("Silent since", ui.when(silent_since) if silent_since is not None else "none silent",
                help="The newest sample of the exporter silent longest")
    ui.table(stale, key="fleet_stale_hosts", empty="Every exporter reported recently.", sort="silent longest first",
             labels={"age_s": "silent for", "last_sample": "last sample"})


ui.run_page("Fleet now", body)
