"""Teams and fairness: entitled vs allocated share per account, Jain's index, the fair-share factor,
the Gini of GPU-hours over users, queue wait, and where each team's GPU time went."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import fairness, window_states
from gpufleet.analytics import vocabulary as words
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
    ).properties(height=ui.chart_height(df["account"].n_unique(), 36, legend_above=True))


def body(ctx: ui.Context) -> None:
    w = ctx.window
    b = data.window_bundle(w.key, "teams")
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
    if f.model_note:
        st.caption(words.sentence(f.model_note))
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
    ui.table(f.pending, key="fair_pending", empty="No GPU job is waiting.", labels={"wait_s": "waiting for", "gpus_bucket": "size (GPUs)"},
             sort="longest wait first")
    states_section(b)
    shared_gpus(ctx)


def states_chart(df: pl.DataFrame) -> alt.Chart:
    """One bar per team: its time with data stacked by state (share %)."""
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("account:N", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)),
        x=alt.X("share_pct:Q", title="share of the time with data, %", stack="zero", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("state:N", title="state", scale=ui.state_colors(df["state"]), legend=alt.Legend(orient="top", labelLimit=0)),
        tooltip=["account:N", "state:N", alt.Tooltip("share_pct:Q", format=".1f"), alt.Tooltip("gpu_h:Q", format=",.1f")],
    ).properties(height=ui.chart_height(df["account"].n_unique(), 28, legend_above=True))


def states_section(b: data.Bundle) -> None:
    """Where each team's GPU time went (gpufleet.analytics.window_states, from the window's facts)."""
    st.subheader("Where the GPU time went")
    ws = b.states
    if ws is None:
        st.caption(b.states_error or "Unknown for this window.")
        return
    st.caption("Each team's time with data by state, from the window's facts; unknown (not 0) where a GPU lacks the fields "
               "a state needs. " + words.sentence(ws.not_at_grain_note()) + " "
               + words.sentence(window_states.ORDER_NOTE))
    shares = ws.team_shares()
    if not shares.is_empty():
        st.altair_chart(states_chart(shares), width="stretch")
    ui.table(ws.teams, key="team_states", empty="No team's GPU time with data in this window.", sort="cluster and account",
             labels=words.state_headers(window_states.STATES))


def shared_gpus(ctx: ui.Context) -> None:
    """Each team's GPUs shared with other jobs and the share of them it had (gpufleet.analytics.shares)."""
    st.subheader("Shared GPUs")
    st.caption("GPUs a team's jobs shared with other jobs (the gpufleet exporter's per-job split, kept per GPU and clock hour): "
               "the GPU clock-hours with a shared scrape (each counts whole) and the team's share of the GPUs' SM time while shared.")
    ui.table(data.team_shares(ctx.window.key), key="fair_shared_gpus", empty="No GPU was shared by two jobs in this window "
             "(or no exporter publishes the per-job split: dcgm-exporter does not).", labels={"shared_hours": "GPU clock-hours shared",
             "sm_share": "its SM share", "shared_with": "shared with teams"}, sort="most shared GPU-hours first")


ui.run_page("Teams and fairness", body)
