"""Reliability: how job attempts ended and why (with the evidence), interruptions over time by
cause, job MTTF by size beside the per-GPU rate's projection and the published anchors, lemon
nodes, the fleet's goodput (ETTR) and the job chains that lost most (gpufleet.analytics.reliability)."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.reliability_store import advice_rows
from gpufleet.analytics.reliability import CAUSE_LABELS, INTERRUPTION_CAUSES
from gpufleet.dashboards import data, ui

# Published job MTTF anchors (hours) to compare the fleet's with: Kokolis et al., "Revisiting Reliability
# in Large-Scale ML Research Clusters" (HPCA 2025), Meta's A100 clusters: ~47 days at 8 GPUs, ~8 h at
# 1,024, ~1.8 h at 16,384.
ANCHORS = pl.DataFrame({"gpus": [8, 1024, 16384], "mttf_h": [47 * 24.0, 8.0, 1.8],
                        "source": ["Kokolis et al. 2025 (Meta A100 clusters)"] * 3})


def _rows(rows: list[dict], columns: list[str]) -> pl.DataFrame:
    return pl.DataFrame(rows, infer_schema_length=None).select(columns) if rows else pl.DataFrame()


def body(ctx: ui.Context) -> None:
    rel = data.reliability(ctx.window.key)
    if rel["model_note"]:
        st.caption(words.sentence(rel["model_note"]))
    ui.window_caption(rel["resolved"])
    f = rel["figures"]
    if not f["attempts"]:
        ui.empty_window("GPU job")
        return
    c = st.columns(4)
    c[0].metric("Interruptions", ui.count(f["interruptions"]),
                help="Attempts ended by hardware, a node failure, preemption, a requeue or an admin's cancel.")
    c[1].metric("Per 1,000 GPU-days", "unknown" if f["interruptions_per_1000_gpu_days"] is None else f"{f['interruptions_per_1000_gpu_days']:.3g}")
    c[2].metric("Hardware", ui.count(f["hardware_interruptions"]),
                help="An XID of the hardware class, a double-bit ECC rise, a row-remap failure or a lost GPU on the attempt's GPUs "
                     "shortly before its end.")
    c[3].metric("GPU-hours lost", words.known_gpu_h(f["lost_gpu_hours"], f["lost_unknown_interruptions"]),
                help="From each interrupted attempt's last reported checkpoint (measured; else its start: an upper bound) to its end.")
    share = f["lost_share_of_allocated"]
    st.caption(f"Lost: {ui.pct(None if share is None else 100 * share)} of "
               f"{words.known_gpu_h(f['allocated_gpu_hours'], f['allocated_unknown_attempts'])} allocated"
               + (f" - {rel['goodput']['checkpoints']}" if f["interruptions"] else ""))
    if f["allocated_unknown_attempts"]:
        st.caption(f"{f['allocated_unknown_attempts']:,} attempts of this window ({f['lost_unknown_interruptions']:,} of them interrupted) "
                   "have an unknown GPU count: their GPU-hours are unknown, never 0, and left out of allocated and lost (at least "
                   "those figures); the rates per GPU-day count the attempts of known GPU count.")

    st.subheader("How attempts ended, over time")
    mix = pl.DataFrame(f["cause_mix"], infer_schema_length=None) if f["cause_mix"] else pl.DataFrame()
    if not mix.is_empty():
        w = rel["resolved"]
        st.caption(f"Attempts ended in each {ui.duration(f['mix_bucket_s'])} from the window's start, times in UTC: each bar spans "
                   "its bucket (the last one may be cut by the window's end).")
        # (stacked by hand: a bar spanning x to x2 is not stacked by Vega-Lite)
        mix = ui.utc_times(mix.with_columns(pl.col("cause").replace_strict(CAUSE_LABELS, default=pl.col("cause")).alias("how"),
                                            pl.min_horizontal(pl.col("bucket") + pl.duration(seconds=f["mix_bucket_s"]),
                                                              pl.lit(w.end)).alias("bucket_end"))
                           .sort("bucket", "how").with_columns(pl.col("attempts").cum_sum().over("bucket").alias("top"))
                           .with_columns((pl.col("top") - pl.col("attempts")).alias("bottom")))
        st.altair_chart(alt.Chart(mix).mark_bar().encode(
            x=ui.time_x(w.start, w.end), x2="bucket_end:T", y=alt.Y("bottom:Q", title="attempts ended"), y2="top:Q",
            color=alt.Color("how:N", title=None, legend=alt.Legend(orient="top", labelLimit=0)),
            tooltip=[ui.time_tooltip("bucket", "from"), "how:N", "attempts:Q"]),
            width="stretch")
    causes = pl.DataFrame({"cause": [CAUSE_LABELS[k] for k, v in f["causes"].items() if v],
                           "attempts": [v for v in f["causes"].values() if v],
                           "interruption": [k in INTERRUPTION_CAUSES for k, v in f["causes"].items() if v]})
    ui.table(causes, key="reliability_causes")

    st.subheader("Job MTTF by size")
    st.caption("Failures: hardware and node failures. 95 % exact Poisson intervals. The projection is 1 / (N x the per-GPU rate); "
               "published anchors beside it.")
    ui.table(_rows(f["mttf_by_size"], ["size", "attempts", "failures", "job_hours", "mttf_h", "mttf_ci_low_h", "mttf_ci_high_h"]),
             key="reliability_mttf")
    proj = _rows(f["projection"], ["gpus", "mttf_h", "mttf_ci_low_h", "mttf_ci_high_h"])
    if not proj.is_empty() and proj["mttf_h"].is_not_null().any():
        line = proj.filter(pl.col("mttf_h").is_not_null()).with_columns(pl.lit("this fleet's per-GPU rate").alias("source"))
        both = pl.concat([line.select("gpus", "mttf_h", "source"), ANCHORS], how="vertical_relaxed")
        st.altair_chart(alt.Chart(both).mark_line(point=True).encode(
            x=alt.X("gpus:Q", scale=alt.Scale(type="log"), title="GPUs per job"),
            y=alt.Y("mttf_h:Q", scale=alt.Scale(type="log"), title="MTTF (hours)"), color=alt.Color("source:N", title=None, legend=alt.Legend(orient="top", labelLimit=0)),
            tooltip=["source:N", "gpus:Q", alt.Tooltip("mttf_h:Q", format=".3g")]), width="stretch")
    for d in f["projection_disagreements"]:
        st.text(f"The fleet's own jobs disagree with the projection: {d}")

    st.subheader("Lemon nodes")
    st.caption(f"Improbably many failures for their GPU-hours (Poisson test against the fleet's rate, "
               f"{rel['settings']['lemon_false_positive_rate']:g} false-positive rate over the fleet, at least "
               f"{rel['settings']['lemon_min_failures']} failures). `gpufleet policy` proposes draining them.")
    ui.table(_rows(rel["lemons"], ["node", "cluster", "failures", "gpu_hours", "expected_failures", "p_value", "reason"]),
             key="reliability_lemons", empty="No lemon node in this window.")
    if rel["lemons"]:
        st.caption("The evidence: each failure counted against a lemon node, with the event that ended its job's attempt.")
        ui.table(_rows([{"node": x["node"], "evidence": e} for x in rel["lemons"] for e in x["evidence"]], ["node", "evidence"]),
                 key="reliability_lemon_evidence", empty="No evidence reported.")

    st.subheader("Interruptions that cost most")
    ui.table(_rows(rel["interrupted_attempts"], ["job_id", "user_name", "account", "gpus", "end", "cause", "reason"]),
             key="reliability_interrupted", empty="No interruption in this window.")
    st.subheader("Goodput")
    g = rel["goodput"]
    c = st.columns(3)
    c[0].metric("Fleet ETTR", ui.pct(None if g["ettr"] is None else 100 * g["ettr"]),
                help="Effective training time ratio: productive / wall GPU-hours over the job chains of the window (a chain's wall "
                     "time runs from its first attempt's start to its last attempt's end, the waits for a requeue included).")
    c[1].metric("Wall GPU-hours", ui.gpu_h(g["wall_gpu_hours"]))
    c[2].metric("Lost + waiting", ui.gpu_h(g["lost_gpu_hours"] + g["requeue_wait_gpu_hours"]),
                help="Work lost in attempts that did not complete - user errors, time limits and cancels too, not only the "
                     "interruptions above - and the GPU-hours waiting for a requeue")
    lost = f["lost_gpu_hours_by_cause"]
    if lost and f["allocated_gpu_hours"] is not None and not f["allocated_unknown_attempts"]:  # (parts that add up)
        fall = pl.DataFrame({"part": ["allocated", *(f"lost: {CAUSE_LABELS[k]}" for k in lost), "not lost"],
                             "gpu_hours": [f["allocated_gpu_hours"], *(-v for v in lost.values()),
                                           f["allocated_gpu_hours"] - sum(lost.values())]})
        st.caption("Where the window's allocated GPU-hours went: lost to interruptions, by cause, and the rest.")
        ui.table(fall, key="reliability_waterfall")

    st.subheader("Job chains that lost most")
    st.caption("Attempts linked: requeues of one job, resubmissions of the same user, account and name soon after a failure. "
               "ETTR = productive time / wall time.")
    chains = [{**ch, "job_ids": ", ".join(ch["job_ids"])} for ch in rel["chains"]]
    ui.table(_rows(chains, ["job_ids", "user_name", "gpus", "attempts", "interruptions", "wall_h", "lost_h", "lost_basis",
                            "requeue_wait_h", "ettr"]),
             key="reliability_chains", empty="No interrupted chain in this window.")

    st.subheader("Checkpoint advice")
    st.caption("For the largest chains: Young/Daly's interval sqrt(2 x C x MTTF_N), from the checkpoint cost C the job reported "
               "(gpufleet.exporter.jobreport.checkpoint_saved; the median save) and the fleet's MTTF for its size "
               "(1 / (N x the per-GPU rate)), beside the interval it used (the median time between its checkpoints).")
    ui.table(_rows(advice_rows(rel["checkpoint_advice"]), ["job_ids", "user_name", "gpus", "checkpoints", "checkpoint_save_s",
                                                           "used_interval_s", "mttf_h", "advised_interval_s", "advice"]),
             key="reliability_advice", empty="No job chain in this window.")


ui.run_page("Reliability", body)
