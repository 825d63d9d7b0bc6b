"""Teams and fairness: entitled vs allocated share per account, Jain's index, the fair-share factor,
the Gini of GPU-hours over users, and queue wait."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import fairness
from gpufleet.dashboards import data, ui

SHARE_LABELS = {"active_share": "entitled share (among accounts with demand)", "used_share": "allocated share"}


def share_chart(acc: pl.DataFrame) -> alt.Chart:
    df = acc.filter(pl.col("active_share").is_not_null() | pl.col("used_share").is_not_null()).select(
        "account", "active_share", "used_share").unpivot(index="account", variable_name="share", value_name="value").with_columns(
        pl.col("share").replace_strict(SHARE_LABELS), (pl.col("value") * 100).alias("percent"))
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("account:N", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)), x=alt.X("percent:Q", title="% of the GPU-hours"), yOffset=alt.YOffset("share:N"),
        color=alt.Color("share:N", title=None, legend=alt.Legend(orient="top", labelLimit=0)),
        tooltip=["account:N", "share:N", alt.Tooltip("percent:Q", format=".1f")],
    ).properties(height=max(120, 36 * df["account"].n_unique() + 40))


def body(ctx: ui.Context) -> None:
    w = ctx.window
    b = data.window_bundle(w.key)
    ui.window_caption(b.window)
    f, fairness_error = b.fairness, b.fairness_error
    if f is None:
        st.error("The fairness figures could not be computed for this window. The dashboard's log has the details.")
        st.text(fairness_error or "")
        st.subheader("Allocated GPU-hours by account")
        ui.table(b.utilization["account"], key="fair_usage")
        return
    acc = f.per_account
    if acc.is_empty():
        ui.empty_window("GPU job")
        return
    s = ctx.settings
    c = st.columns(4)
    c[0].metric("Jain's index", "no data" if f.jain_index is None else f"{f.jain_index:.3f}",
                help="Over allocated share / entitled share of the accounts with demand: 1 = everyone got their share")
    c[1].metric("Gini of GPU-hours over users", "no data" if f.gini_users is None else f"{f.gini_users:.3f}",
                help="Of allocated GPU-hours: 0 = every user was allocated the same, towards 1 = one user had everything")
    c[2].metric("Accounts with demand", ui.count(acc.filter(pl.col("jobs") > 0).height))
    c[3].metric("Jobs pending now", ui.count(f.pending.height))
    if f.shown:  # under a filter: its rows of the whole comparison (fairness is a relation between teams)
        st.caption(f"Showing {f.shown}'s row of the {f.compared_across}'s fairness; Jain's index and the Gini are the "
                   f"{f.compared_across}'s, the pending jobs and waits by size those of {f.shown}.")
    st.caption("Entitled shares: " + fairness.SHARES_SOURCES[f.shares_source]
               + f"; fair-share factor with a decay half-life of {ui.duration(s.half_life.total_seconds())}.")
    if f.without_share:
        st.caption("Accounts with demand but no configured share (no ratio):")
        st.text(", ".join(f.without_share))
    if f.unknown_demand:
        st.caption("Accounts whose jobs of this window all have an unknown GPU count: their demand and usage are unknown (not "
                   "none), so they have no ratio and are not in Jain's index:")
        st.text(", ".join(f.unknown_demand))

    st.subheader("Entitled vs allocated share")
    st.altair_chart(share_chart(acc), width="stretch")
    ui.table(ui.unknown_gpu_counts_note(acc), key="fair_accounts", labels={"ratio": "allocated / entitled", "wait_p50_s": "wait p50", "wait_p95_s": "wait p95"},
             sort="account")

    st.subheader("Queue wait by job size (GPUs)")
    ui.table(f.wait_by_size, key="fair_wait", labels={"gpus_bucket": "GPUs", "wait_p50_s": "wait p50", "wait_p95_s": "wait p95"})
    st.subheader("Pending now")
    ui.table(f.pending, key="fair_pending", empty="No GPU job is waiting.", labels={"wait_s": "waiting for"})


ui.run_page("Teams and fairness", body)
