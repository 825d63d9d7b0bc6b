"""Health: temperatures, XID/ECC/row-remap events, throttling, lost GPUs, foreign processes,
exporter and collector freshness."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.dashboards import data, ui


UNRECOGNIZED_SCHEMA = {"last_seen": pl.Datetime("us"), "source": pl.Utf8, "input": pl.Utf8, "kind": pl.Utf8, "detail": pl.Utf8,
                       "count": pl.Int64, "first_seen": pl.Datetime("us")}


# The temperature map's colour scale, fixed (values outside it take its end colours), blue (cool) through yellow to red (hot):
# a colour says how hot a GPU was, not how hot against this window's hottest (scaled to the data, in light to dark red, a fleet
# at a healthy 70 C read all dark red)
TEMP_SCALE_C = (30, 90)


def temp_heatmap(df: pl.DataFrame, bucket: timedelta) -> alt.Chart:
    hosts = df.select("cluster", "host").unique().sort("cluster", "host")["host"].to_list()
    df = ui.utc_times(df.with_columns((pl.col("bucket") + bucket).alias("bucket_end")))
    return alt.Chart(df).mark_rect().encode(  # every host's row labelled: the chart grows with the hosts
        x=ui.time_x(df["bucket"].min(), df["bucket_end"].max()), x2="bucket_end:T", y=alt.Y("host:N", sort=hosts, title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)),
        color=alt.Color("gpu_temp_max_c:Q", title="hottest GPU °C", scale=alt.Scale(scheme="redyellowblue", reverse=True, domain=list(TEMP_SCALE_C), clamp=True)),
        tooltip=["host:N", ui.time_tooltip(), alt.Tooltip("gpu_temp_max_c:Q", title="max °C", format=".0f"),
                 alt.Tooltip("gpu_temp_avg_c:Q", title="mean °C", format=".1f"), alt.Tooltip("mem_temp_max_c:Q", title="memory max °C", format=".0f")],
    ).properties(height=max(120, 18 * len(hosts) + 40))


def body(ctx: ui.Context) -> None:
    w = ctx.window
    st.caption("Health is about GPUs: the cluster and GPU model filters apply, the account, user and partition filters do not.")
    bucket = data.health_bucket(w)
    h = data.health_for(w)
    ui.window_caption(h["window"])
    now = data.fleet_now_for(w, ctx.now, ctx.version)
    as_of = now["as_of"]
    gpus, events, summary = h["gpus"], h["events"], now["summary"]
    cs = data.collector_status(w.root)
    stale_hosts = now["hosts"].filter(~pl.col("fresh"))
    if gpus.is_empty():
        ui.empty_window("GPU sample")

    c = st.columns(4)
    c[0].metric("Lost now", ui.count(summary.lost), help=f"gpufleet_gpu_up = 0 in the latest sample, as of {ui.when(as_of)}")
    c[1].metric("Erroring now", ui.count(summary.error), help="XID code, volatile double-bit ECC errors or a row-remap failure in the latest sample")
    c[2].metric("Silent now (no data)", ui.count(summary.no_data))
    c[3].metric("Events in window", ui.count(events.height))
    c = st.columns(4)
    hottest = gpus["gpu_temp_max_c"].max() if not gpus.is_empty() else None
    c[0].metric("Hottest GPU", "no data" if hottest is None else f"{hottest:.0f} °C")
    throttled = gpus.filter((pl.col("thermal_throttle_pct") > 0) | (pl.col("power_throttle_pct") > 0) | (pl.col("hw_slowdown_pct") > 0)) if not gpus.is_empty() else gpus
    c[1].metric("GPUs throttled", ui.count(throttled.height), help="Any sample with a thermal, power or HW-slowdown clock-event reason")
    c[2].metric("Exporters silent", f"{stale_hosts.height} of {now['hosts'].height}")
    c[3].metric("Collector last wrote", (ui.duration(cs["age_s"]) + " ago") if cs["age_s"] is not None else "never",
                help="Sharded: the shard that wrote longest ago" if cs["shards"] else None)
    if cs["shards"]:
        st.caption("Collector shards: each writes its share of the nodes; a shard that stopped shows its nodes as silent, never idle.")
        ui.table(pl.DataFrame(cs["shards"], schema={"shard": pl.Utf8, "published_at": pl.Datetime, "age_s": pl.Float64, "version": pl.Int64}),
                 key="health_shards", labels={"published_at": "last wrote", "age_s": "last wrote ago"})

    st.subheader("Events")
    st.caption("XID codes, new ECC errors, row remapping and lost GPUs in the window, newest first.")
    ui.table(ui.with_event_codes(events), key="health_events", empty="No XID, ECC, row-remap or lost-GPU event in this window.", sort="newest first")
    st.page_link(str(Path(__file__).with_name("reliability.py")), label="Which jobs these events ended, and which nodes are lemons: Reliability",
                 icon=":material/build:")

    st.subheader("Lost, erroring or silent GPUs now")
    ui.table(ui.with_last_xid(now["states"]).filter(pl.col("status") != "ok").select("host", "gpu", "gi", "model", "status", "ts", "age_s", "gpu_up", "last_xid",
                                                                   "last_xid_at", "ecc_dbe_vol", "remap_failure", "job_ids"),
             key="health_now", empty="Every GPU is up and reporting.",
             labels=ui.LAST_SAMPLE_LABELS)

    st.subheader("Temperatures")
    temp = h["temperature"]
    if temp.is_empty():
        st.caption("No temperature samples in this window.")
    else:
        st.caption(f"Hottest GPU of each host per {ui.duration(bucket.total_seconds())}, in buckets on the clock (UTC): "
                   "the window's first and last buckets may cover only part of theirs. Colours on a fixed scale, blue to red, "
                   f"{TEMP_SCALE_C[0]} to {TEMP_SCALE_C[1]} °C (data-centre GPUs slow down in the mid to high 80s: our H100's NVML limits put it at about 85 °C); the throttling "
                   "table below says where heat slowed a GPU.")
        st.altair_chart(temp_heatmap(temp, bucket), width="stretch")

    st.subheader("Throttling")
    ui.table(throttled.select("host", "gpu", "gi", "model", "thermal_throttle_pct", "power_throttle_pct", "hw_slowdown_pct",
                              "thermal_violation_s", "power_violation_s", "gpu_temp_max_c", "power_max_w") if not throttled.is_empty() else throttled,
             key="health_throttle", empty="No clock throttling reported in this window.",
             labels={"thermal_throttle_pct": "thermal % of samples", "power_throttle_pct": "power % of samples", "hw_slowdown_pct": "HW slowdown % of samples"})

    st.subheader("Foreign processes")
    st.caption("GPUs that ran processes of a Slurm job not allocated them (gpufleet_gpu_foreign_processes: the job escaped "
               "its devices, or the job map is stale; alert GpuForeignProcesses). Most at once, and when, in the window.")
    ui.table(h["foreign"], key="health_foreign", empty="No process of a job ran on a GPU it was not allocated in this window.",
             labels={"foreign_processes_max": "most processes at once", "first_seen": "first seen", "last_seen": "last seen"})

    st.subheader("Policy actions failing")
    failing = data.policy_failing(w.root, ctx.version)
    st.caption("Idle-GPU policy actions (mail, webhook, scancel, pod deletion) whose latest attempt failed; those of running jobs "
               "are retried at each evaluation (gpufleet_policy_failing_actions).")
    ui.table(failing, key="health_policy_failing", empty="No failing policy action.", labels={"attempt": "attempts", "detail": "error"})

    st.subheader("Freshness")
    wrote = ui.when(cs["published_at"]) + (f" ({ui.duration(cs['age_s'])} ago)" if cs["age_s"] is not None else "") if cs["published_at"] else "never"
    st.text(f"Collector: last wrote the store at {wrote}")
    ui.table(now["hosts"], key="health_hosts", labels={"age_s": "age of newest sample", "last_sample": "newest sample"})

    st.subheader("Job GPU counts")
    untracked = [u for u in cs["unrecognized"] if u.get("kind") == "accounting_without_gpus"]
    sources = data.job_gpu_sources(w.root, ctx.version)
    gaps = sources.filter(pl.col("gpus_source").is_in(["unknown", "slurmctld", "job_map"]) & (pl.col("ended") > 0)
                          | (pl.col("gpus_source") == "unknown")) if not sources.is_empty() else sources
    if untracked or not gaps.is_empty():
        st.warning("Slurm accounting does not track GPUs: add gres/gpu to AccountingStorageTRES in slurm.conf. Until then a "
                   "job's GPU count comes from slurmctld while it knows the job, else from the exporters' job mapping, else "
                   "it is unknown (its allocated GPU-hours unknown, never 0)"
                   + "".join(f"\n\n{u['input']}: {u['detail']}" for u in untracked[:3]))
    st.caption("Where each Slurm job's GPU count came from: slurmdbd (accounting, ended job), slurmdbd_running, slurmctld, "
               "job_map (the GPUs the exporters saw it hold) or unknown (gpufleet_collect_jobs_gpus_fallback counts them).")
    ui.table(sources, key="health_job_gpus", empty="No Slurm job in the store.", labels={"gpus_source": "GPU count from"})

    st.subheader("Inputs the collector did not recognize")
    st.caption("Targets that answered without GPU series, answers of an unknown shape, exporter pod names used as host names, "
               "... (the collector's log has each; gpufleet_collect_input_unrecognized_total counts them). Last 7 days.")
    unrecognized = pl.DataFrame(cs["unrecognized"], schema=UNRECOGNIZED_SCHEMA) if cs["unrecognized"] else None
    ui.table(unrecognized, key="health_unrecognized", empty="Every input the collector read was recognized.",
             labels={"last_seen": "last seen", "first_seen": "first seen"})

    with ui.details("Every GPU over the window", "health_gpus") as shown:
        if shown:
            ui.table(gpus, key="health_gpus")


ui.run_page("Health", body)
