"""Jobs: search by job id, name, user or account, each with its largest loss; the per-job efficiency report (per-GPU
utilization and memory over time, idle periods, MFU if known, the verdict and its rule, and where
the job's GPU time went)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import altair as alt
import polars as pl
import streamlit as st

from gpufleet.analytics import jobs as ajobs
from gpufleet.analytics import states
from gpufleet.analytics import vocabulary as words
from gpufleet.dashboards import data, ui

VERDICTS = ("no_data", "no_process", "idle", "idle_stretches", "unused_gpus", "low", "ok")
# the key columns first (what idled and why), so they are on screen at 1,600 px; then who and when
LIST_COLUMNS = ("job_id", "idle_gpu_h", "verdict", "largest_loss", "no_process_gpu_h", "allocated_gpu_h", "mean_utilization_pct", "gpus", "user_name",
                "account", "name", "state", "runtime_h", "start", "end", "partition")
# the figures of the part of a job inside the window, said so (a job may start before it or end after it)
LIST_LABELS = {"idle_gpu_h": "idle GPU-h in window", "no_process_gpu_h": "no process GPU-h in window",
               "allocated_gpu_h": "allocated GPU-h in window", "mean_utilization_pct": "mean utilization % in window",
               "runtime_h": "run time in window", "largest_loss": "largest loss in window (share of time with data)"}
# sort choices: label -> (column, descending)
SORTS = {"most idle GPU-hours first": ("idle_gpu_h", True), "most no-process GPU-hours first": ("no_process_gpu_h", True),
         "most allocated GPU-hours first": ("allocated_gpu_h", True), "lowest mean utilization first": ("mean_utilization_pct", False),
         "newest start first": ("start", True), "job id": ("job_id", False)}


def search(jobs: pl.DataFrame, q: str, verdicts: list[str]) -> pl.DataFrame:
    """Rows whose job id, key, name, user or account contain `q` (case-insensitive, literal)."""
    out = jobs
    if q:
        needle = q.lower()
        cols = [c for c in ("job_id", "job_key", "name", "user_name", "account") if c in jobs.columns]
        out = out.filter(pl.any_horizontal([pl.col(c).fill_null("").str.to_lowercase().str.contains(needle, literal=True) for c in cols]))
    if verdicts:
        out = out.filter(pl.col("verdict").is_in(verdicts))
    return out


def gpu_chart(tl: pl.DataFrame, field: str, title: str, domain: list[float] | None = None, fmt: str = ",.1f") -> alt.Chart:
    """One line per GPU of the job; the legend lists every GPU (beside the chart, in as many columns
    of 16 as it needs, the chart as tall as its legend: a legend taller than its chart is cut)."""
    gi = pl.col("gi") if "gi" in tl.columns else pl.lit(-1)
    label = pl.when(gi >= 0).then(pl.format("{} / GPU {} (MIG {})", pl.col("host"), pl.col("gpu"), gi)).otherwise(
        pl.format("{} / GPU {}", pl.col("host"), pl.col("gpu")))
    df = ui.utc_times(tl.with_columns(label.alias("gpu_label")))
    n = df["gpu_label"].n_unique()
    y = alt.Y(f"{field}:Q", title=title, scale=alt.Scale(domain=domain) if domain else alt.Undefined, axis=alt.Axis(format=fmt))
    return alt.Chart(df).mark_line(point=True, interpolate="step-after").encode(
        x=ui.time_x(df["bucket"].min(), df["bucket"].max()) if df.height else ui.time_x(), y=y,
        color=alt.Color("gpu_label:N", title="GPU",
                        legend=alt.Legend(orient="right", columns=-(-n // 16), symbolLimit=0, labelLimit=0)),
        tooltip=[ui.time_tooltip(), alt.Tooltip("gpu_label:N", title="GPU"), alt.Tooltip(f"{field}:Q", title=title, format=fmt)],
    ).properties(height=max(240, 28 * min(n, 16) + 40))


def report(window, job: dict) -> None:
    st.subheader("Job report")
    ui.text("Job", job["job_id"])
    ui.text("Name", job.get("name"))
    ui.text("User / account / partition", f"{job.get('user_name') or ''} / {job.get('account') or ''} / {job.get('partition') or ''}")
    gpus = "unknown (the accounting names none: see the Health page)" if job.get("gpus") is None else ui.gpus(job["gpus"])
    ui.text("State, GPUs", f"{job.get('state') or words.UNKNOWN}, {gpus}" + (f" (from {job['gpus_source']})" if job.get("gpus_source") else ""))
    ui.text("Run", f"{ui.when(job.get('start'))} to {ui.when(job.get('end')) if job.get('end') else 'still running'}")
    res = data.job_report(window.key, {k: job.get(k) for k in ("cluster", "scheduler", "job_key", "job_id", "account", "user_name",
                                                                   "partition", "start", "end")})
    if res is None:
        st.info("This job held no GPU inside the window.")
        return
    r = res["report"]
    c = st.columns(3)
    c[0].metric("Verdict", words.verdict(r.verdict))
    c[1].metric("Runtime in window", ui.duration(r.runtime_h * 3600))
    c[2].metric("Allocated", ui.gpu_h(r.allocated_gpu_h) if r.allocated_gpu_h is not None else "unknown",
                help=None if r.allocated_gpu_h is not None else "The job's GPU count is unknown, so its allocated GPU-hours are")
    c = st.columns(3)
    c[0].metric("Mean utilization", ui.pct(r.mean_utilization_pct))
    c[1].metric("Idle (stretches)", ui.gpu_h(r.idle_gpu_h))
    c[2].metric("Held with no process", ui.gpu_h(r.no_process_gpu_h))
    st.text(f"Rule: {r.rule}")
    m = res["mfu"]  # (the job's row of the MFU page's per-job figures)
    if m is not None:
        st.text(f"MFU: {ui.pct(m['mfu'] * 100) if m.get('mfu') is not None else 'unknown'}; method: {m.get('method') or words.UNKNOWN}"
                + (f"; {m['reason']}" if m.get("reason") else ""))
    else:
        st.text(f"MFU: {res['mfu_error'] or 'unknown for this job (not in the MFU figures of this window)'}")

    states_section(res)
    shared_section(res.get("shared_gpus") or [])

    tl = res["timeline"]
    st.subheader("Per GPU")
    ui.table(r.per_gpu, key="job_gpus")
    if not tl.is_empty():
        st.caption("Utilization and memory per GPU over time (points: buckets with data; a missing point is no data).")
        st.altair_chart(gpu_chart(tl.drop_nulls("utilization_pct"), "utilization_pct", "utilization %", [0, 100]), width="stretch")
        if tl["fb_used_max_mib"].is_not_null().any():
            st.altair_chart(gpu_chart(tl.drop_nulls("fb_used_max_mib"), "fb_used_max_mib", "memory used, MiB (max)", fmt=",.0f"), width="stretch")
        else:
            st.caption("No memory samples for this job's GPUs.")
    st.subheader("Idle periods")
    ui.table(r.idle_stretches, key="job_idle", empty="No idle stretch as long as the idle minimum.",
             labels={"s0": "from", "s1": "to"})


def states_chart(df: pl.DataFrame) -> alt.Chart:
    """One bar of the job's time with data, stacked by state in the legend's order (the states' own, as the Teams page's
    bars: the table beside it lists them largest first), its legend above in a row. The bar's thickness is set (size) and
    the chart's height has room for its frame (ui.chart_height): at 60 px the page drew an axis and a legend, and the bar
    0 px high."""
    legend = ui.state_colors(df["state"]).domain
    return alt.Chart(df.with_columns(order=pl.col("state").replace_strict(legend, list(range(len(legend))), return_dtype=pl.Int32))
                     ).mark_bar(size=30).encode(
        x=alt.X("share_pct:Q", title="share of the time with data, %", stack="zero", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("state:N", title=None, scale=ui.state_colors(df["state"]), legend=alt.Legend(orient="top", labelLimit=0)),
        order=alt.Order("order:Q"),
        tooltip=["state:N", alt.Tooltip("share_pct:Q", format=".1f"), alt.Tooltip("gpu_h:Q", format=",.2f"), "evidence:N"],
    ).properties(height=ui.chart_height(1, 40, legend_above=True))


def states_section(res: dict) -> None:
    """Where the job's GPU time went (gpufleet.analytics.states): the stacked bar, each state with
    its evidence and the fix to try, the states a missing field leaves unknown, and other jobs'
    processes seen on the job's GPUs."""
    st.subheader("Where the GPU time went")
    js = res.get("states")
    if js is None:
        st.caption(res.get("states_error") or "Unknown: no GPU of this job is mapped in the window.")
        return
    df = js.table().with_columns(pl.col("state").replace(words.STATES))
    if df.is_empty():
        st.caption("No time with data on this job's GPUs in the window.")
        return
    st.altair_chart(states_chart(df), width="stretch")
    ui.table(df, key="job_states", labels={"gpu_h": "GPU-hours", "share_pct": "share %", "fix": "fix to try"})
    st.caption(words.sentence(states.ORDER_NOTE))
    for state, where in js.unknown.items():
        st.caption(f"{words.state(state)}: unknown on {'; '.join(where)} (the GPU does not publish these fields).")
    foreign = [(g.gpu, g.foreign_max) for g in js.gpus if g.foreign_max]
    st.text("Other jobs' processes on this job's GPUs: "
            + (", ".join(f"{gpu} (up to {n:.0f})" for gpu, n in foreign) if foreign else "none reported"))


def shared_section(shared: list[dict]) -> None:
    """The GPUs this job shared with other jobs (gpufleet.analytics.jobs.gpu_shares): its part of
    each while shared, and the others'. Nothing is shown for a job that shared none."""
    if not shared:
        return
    st.subheader("Shared GPUs")
    st.caption("GPUs whose processes of several jobs ran at once (the gpufleet exporter's per-process NVML split): "
               "each job's mean part of the GPU's SM time while shared, and its memory high-water there.")
    for g in shared:
        mem = "unknown" if g["memory_max_bytes"] is None else f"{g['memory_max_bytes'] / 2**20:,.0f} MiB"
        st.text(f"GPU {g['gpu_uuid']} on {g['host']}, {ui.when(g['first_hour'])} to {ui.when(g['last_hour'])}: "
                f"{ajobs.share_sentence(g)}; this job's memory high-water {mem}")


# The list's selection (st.session_state[ROWS_KEY]) and its rows' jobs as shown (SHOWN_KEY: job id and key): a row selected
# names its job in the report's box before the next run (pick_row), which then draws that job's report first; PICKED_KEY
# keeps the row's key, so a job id two clusters share still reports the row's job
ROWS_KEY, SHOWN_KEY, PICKED_KEY = "jobs_list_rows", "jobs_list_shown", "jobs_list_picked"
JOB_IDENTITY = ("job_id", "cluster", "scheduler", "job_key")


def pick_row(state: MutableMapping[str, Any]) -> None:
    """The jobs list's on_select: the selected row's job id into the report's box ("job") and its key into PICKED_KEY;
    nothing without a selection."""
    rows = ((state.get(ROWS_KEY) or {}).get("selection") or {}).get("rows") or []
    shown = state.get(SHOWN_KEY) or []
    if rows and rows[0] < len(shown):
        state["job"], state[PICKED_KEY] = shown[rows[0]]["job_id"], shown[rows[0]]


def _picked_row() -> None:
    pick_row(st.session_state)


def body(ctx: ui.Context) -> None:
    w = ctx.window
    window = data.resolved(w.key)  # (the window the bundle's figures are for)
    ui.window_caption(window)
    # the job asked for (typed, in the URL, or a row selected below): its report from its own row of the window's job table,
    # drawn before the window's list is computed (the list waits for the window's figures: seconds at 16,384 GPUs)
    picked = (st.text_input("Job id for the report (or select a row of the list below)", key="job", bind="query-params") or "").strip()
    if picked:
        # (the row selected, by its key, while the box still names it; else, or once it is out of the window, by the name)
        row = st.session_state.get(PICKED_KEY) or {}
        exact = (row["cluster"], row["scheduler"], row["job_key"]) if row.get("job_id") == picked else None
        job = (exact and data.named_job(window.key, picked, exact)) or data.named_job(window.key, picked)
        if job is None:
            st.info(words.sentence(data.job_not_in_window(window.key, picked)))
        else:
            report(window, job)
    b = data.window_bundle(w.key, "jobs")
    st.subheader("Jobs in the window")
    jobs = b.jobs
    if jobs.is_empty():
        ui.empty_window("job")
        return
    if b.states is None:
        st.caption(f"Largest loss: unknown ({b.states_error}).")
    c = st.columns([3, 2, 2, 2])
    q = c[0].text_input("Search (job id, name, user, account)", key="q", bind="query-params")
    verdicts = c[1].multiselect("Verdict", VERDICTS, key="verdict", bind="query-params", format_func=words.verdict)
    order = c[2].selectbox("Sort", list(SORTS), key="sort", bind="query-params") or next(iter(SORTS))
    found = search(jobs, q or "", verdicts or [])
    c[3].metric("Jobs", f"{found.height:,} of {jobs.height:,}")
    column, descending = SORTS[order]
    found = found.sort([column, "job_id"], descending=[descending, False], nulls_last=True)
    shown = ui.first_rows(found, order, "narrow the search to see others")
    # the largest loss of each job shown, in words (gpufleet.analytics.window_states, from the window's facts)
    shown = b.states.with_largest_loss(shown) if b.states is not None else shown.with_columns(pl.lit(None, pl.String).alias("largest_loss"))
    st.caption("Figures are of the part of each job inside the window (a job may have started before it or end after it).")
    st.session_state[SHOWN_KEY] = shown.select(JOB_IDENTITY).to_dicts()
    ui.table(shown.select(LIST_COLUMNS), key="jobs_list", empty="No job matches.", on_select=_picked_row, selection_mode="single-row",
             rows_key=ROWS_KEY, labels=LIST_LABELS, sort=order, height=560)
    policy_section(ctx)


def policy_section(ctx: ui.Context) -> None:
    """The idle-GPU policy: what it would do now (its plan, evaluated from every GPU's state when asked for) and what it did in
    the window (audit trail)."""
    st.subheader("Idle-GPU policy")
    enforce = data.policy_enforce(ctx.settings)
    if enforce is None:
        st.caption("No [policy] section in the configuration: nothing is planned (gpufleet policy).")
    else:
        acts = ("The policy acts (enforce = true): the collector's policy round carries out what its plan lists. " if enforce else
                "The policy only plans (enforce = false in [policy]): nothing its plan lists is mailed, cancelled or drained. ")
        st.caption(f"{acts}Opt-out tags (a Slurm comment or a pod annotation) are read from the scheduler only when the policy acts, "
                   "so a job its plan lists may still be skipped as opted out; the past actions below say what happened.")
        with ui.details("What it would do now: the rule and the idle figures of each running job it would act on", "policy_planned") as shown:
            if shown:
                pol = data.policy_plan(ctx.window.key, ctx.version)
                st.caption(f"Planned as of {ui.when(pol['as_of'])}.")
                c = pol["closest"]  # with nothing due: the job nearest to an action, and why it is not due yet
                why = f" Closest: job {c.job.job_id} ({c.job.cluster}, {c.job.account}): {c.reason}." if c else " No running job holds GPUs."
                ui.table(pol["planned"], key="policy_planned", empty="No running job is due for a notification or a cancel." + why)
    st.caption("Past notifications and actions in the window (every attempt, with its result), newest first.")
    ui.table(data.policy_past(ctx.window.key, ctx.version), key="policy_past", empty="The policy did nothing in this window" + (
        " (it only plans: enforce = false)." if enforce is False else "."))


ui.run_page("Jobs", body)
