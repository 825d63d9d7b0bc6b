"""MFU: model FLOPs utilization per job and per team, with the method behind each figure
(job-reported throughput, an estimate from tensor-pipe activity, or unknown - never GPU_UTIL)."""

from __future__ import annotations

import polars as pl
import streamlit as st

from gpufleet.dashboards import data, ui


def body(ctx: ui.Context) -> None:
    w = ctx.window
    b = data.window_bundle(w.key, "mfu")
    ui.window_caption(b.window)
    figures_mfu = b.mfu
    if figures_mfu is None:
        st.error("The MFU figures could not be computed for this window. The dashboard's log has the details.")
        st.text(b.mfu_error or "")
        return
    if all(df.is_empty() for df in figures_mfu.values()):
        ui.empty_window("GPU job")
        return
    st.caption("Each figure says its method: from the job's reported throughput over the GPUs' dense peak for the dtype, an estimate "
               "from tensor-pipe activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, from dcgm-exporter or our exporter's GPM; labelled "
               "as one), or unknown. GPU utilization is never used as MFU.")
    st.subheader("Per account / team")
    st.caption("A team's MFU is over its jobs with a known MFU only: 'GPU-h with MFU known' says how much of its GPU-hours that is.")
    acc = figures_mfu["accounts"]
    if not acc.is_empty():
        acc = acc.with_columns((pl.col("gpu_h") - pl.col("unknown_gpu_h")).alias("known_gpu_h")).select(
            "cluster", "account", "mfu", "method", "known_gpu_h", "unknown_gpu_h", "gpu_h", "jobs", "unknown_jobs", "gpus_unknown_jobs")
        acc = ui.unknown_gpu_counts_note(acc)  # (jobs that report, of unknown GPU count: no weight in the MFU)
    ui.table(acc, key="mfu_accounts", empty="No MFU figure in this window.", sort="cluster and account",
             labels={"mfu": "MFU %", "known_gpu_h": "GPU-h with MFU known", "unknown_gpu_h": "GPU-h with MFU unknown",
                     "unknown_jobs": "jobs with MFU unknown"})
    st.subheader("Per job")
    jobs = ui.first_rows(figures_mfu["jobs"].sort("gpu_h", descending=True, nulls_last=True, maintain_order=True),
                         "most GPU-hours first", "filter by account or user to see others")
    # (the column it is sorted by beside the job, before the method's long text: at a page's width it was off to the right)
    order = ["cluster", "job_key", "job_id", "account", "user_name", "model", "gpus", "gpu_h", "mfu", "method", "tflops_per_gpu",
             "peak_tflops", "reason"]
    jobs = jobs.select(*order, *[c for c in jobs.columns if c not in order])
    ui.table(jobs, key="mfu_jobs", empty="No MFU figure in this window.", sort="most GPU-hours first", labels={"mfu": "MFU %"})


ui.run_page("MFU", body)
