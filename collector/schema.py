"""The canonical store schema: every table, column and metric-name mapping, named once.

Samples are *wide*: one row per (time, GPU or MIG instance) with a typed column per field, so
timestamps and GPU keys are stored once per row and each field column compresses on its own
(utilization as small floats, counters as integers). They live in date-partitioned Parquet that
DuckDB, Spark or Trino read as-is. Mutable tables (jobs, allocations, inventory) live in the
writer's DuckDB state and are published as Parquet: the small ones as snapshots, jobs and
allocations as immutable segments of their settled history plus a snapshot of the open rest
(gpufleet.collector.store, SEGMENTED). All times are UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 11


@dataclass(frozen=True)
class SampleField:
    column: str
    type: pa.DataType
    names: tuple[str, ...]  # exposition names (DCGM 2.x+, gpufleet) this column is read from
    legacy: tuple[str, ...] = ()  # dcgm-exporter 1.x lowercase names
    scale: float = 1.0  # legacy unit -> canonical unit


F32, I64 = pa.float32(), pa.int64()

SAMPLE_FIELDS: tuple[SampleField, ...] = (
    SampleField("gpu_util", F32, ("DCGM_FI_DEV_GPU_UTIL",), ("dcgm_gpu_utilization",)),
    SampleField("mem_copy_util", F32, ("DCGM_FI_DEV_MEM_COPY_UTIL",), ("dcgm_mem_copy_utilization",)),
    SampleField("enc_util", F32, ("DCGM_FI_DEV_ENC_UTIL",), ("dcgm_enc_utilization",)),
    SampleField("dec_util", F32, ("DCGM_FI_DEV_DEC_UTIL",), ("dcgm_dec_utilization",)),
    SampleField("fb_used_mib", F32, ("DCGM_FI_DEV_FB_USED",), ("dcgm_fb_used",)),
    SampleField("fb_free_mib", F32, ("DCGM_FI_DEV_FB_FREE",), ("dcgm_fb_free",)),
    SampleField("fb_reserved_mib", F32, ("DCGM_FI_DEV_FB_RESERVED",)),
    SampleField("fb_total_mib", F32, ("DCGM_FI_DEV_FB_TOTAL",)),
    SampleField("power_w", F32, ("DCGM_FI_DEV_POWER_USAGE",), ("dcgm_power_usage",)),
    SampleField("energy_mj", I64, ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), ("dcgm_total_energy_consumption",)),
    SampleField("gpu_temp_c", F32, ("DCGM_FI_DEV_GPU_TEMP",), ("dcgm_gpu_temp",)),
    SampleField("mem_temp_c", F32, ("DCGM_FI_DEV_MEMORY_TEMP",), ("dcgm_memory_temp",)),
    SampleField("sm_clock_mhz", F32, ("DCGM_FI_DEV_SM_CLOCK",), ("dcgm_sm_clock",)),
    SampleField("mem_clock_mhz", F32, ("DCGM_FI_DEV_MEM_CLOCK",), ("dcgm_memory_clock",)),
    SampleField("pcie_replay", I64, ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",), ("dcgm_pcie_replay_counter",)),
    SampleField("xid_last", I64, ("DCGM_FI_DEV_XID_ERRORS",), ("dcgm_xid_errors",)),
    SampleField("ecc_sbe_vol", I64, ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), ("dcgm_ecc_sbe_volatile_total",)),
    SampleField("ecc_dbe_vol", I64, ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), ("dcgm_ecc_dbe_volatile_total",)),
    SampleField("ecc_sbe_agg", I64, ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), ("dcgm_ecc_sbe_aggregate_total",)),
    SampleField("ecc_dbe_agg", I64, ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), ("dcgm_ecc_dbe_aggregate_total",)),
    SampleField("remap_correctable", I64, ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",)),
    SampleField("remap_uncorrectable", I64, ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",)),
    SampleField("remap_failure", I64, ("DCGM_FI_DEV_ROW_REMAP_FAILURE",)),
    SampleField("clocks_event_reasons", I64, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")),
    # DCGM reports violation time in ns; dcgm-exporter 1.x documented (and reported) microseconds
    SampleField("power_violation_ns", I64, ("DCGM_FI_DEV_POWER_VIOLATION",), ("dcgm_power_violation",), 1000.0),
    SampleField("thermal_violation_ns", I64, ("DCGM_FI_DEV_THERMAL_VIOLATION",), ("dcgm_thermal_violation",), 1000.0),
    SampleField("gr_engine_active", F32, ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",)),
    SampleField("sm_active", F32, ("DCGM_FI_PROF_SM_ACTIVE",)),
    SampleField("sm_occupancy", F32, ("DCGM_FI_PROF_SM_OCCUPANCY",)),
    SampleField("tensor_active", F32, ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",)),
    SampleField("dram_active", F32, ("DCGM_FI_PROF_DRAM_ACTIVE",)),
    SampleField("fp64_active", F32, ("DCGM_FI_PROF_PIPE_FP64_ACTIVE",)),
    SampleField("fp32_active", F32, ("DCGM_FI_PROF_PIPE_FP32_ACTIVE",)),
    SampleField("fp16_active", F32, ("DCGM_FI_PROF_PIPE_FP16_ACTIVE",)),
    SampleField("pcie_tx_bytes_per_s", F32, ("DCGM_FI_PROF_PCIE_TX_BYTES",)),
    SampleField("pcie_rx_bytes_per_s", F32, ("DCGM_FI_PROF_PCIE_RX_BYTES",)),
    SampleField("nvlink_bandwidth_total", I64, ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",)),
    # NVLink traffic as a rate (DCP; ours through GPM): what tells a communication-bound job
    # (gpufleet.analytics.states). Files written before these columns read them as NULL.
    SampleField("nvlink_tx_bytes_per_s", F32, ("DCGM_FI_PROF_NVLINK_TX_BYTES",)),
    SampleField("nvlink_rx_bytes_per_s", F32, ("DCGM_FI_PROF_NVLINK_RX_BYTES",)),
    SampleField("compute_processes", F32, ("gpufleet_gpu_compute_processes",)),
    # processes of Slurm jobs on a GPU their job was not allocated, summed over its job_id series
    # (gpufleet.collector.exposition_parse); NULL where the exporter publishes none
    SampleField("foreign_processes", F32, ("gpufleet_gpu_foreign_processes",)),
    SampleField("gpu_up", F32, ("gpufleet_gpu_up",)),
)

# exposition metric name -> (column, scale). Lower-cased DCGM names (dcgm-exporter's
# --use-old-namespace, e.g. dcgm_fi_prof_gr_engine_active) map like the upper-case ones.
METRIC_TO_COLUMN: dict[str, tuple[str, float]] = {}
for _f in SAMPLE_FIELDS:
    for _n in _f.names:
        METRIC_TO_COLUMN[_n] = (_f.column, 1.0)
        if _n.startswith("DCGM_"):
            METRIC_TO_COLUMN[_n.lower()] = (_f.column, 1.0)
    for _n in _f.legacy:
        METRIC_TO_COLUMN[_n] = (_f.column, _f.scale)

# utkuozdemir/nvidia_gpu_exporter (nvidia-smi --query-gpu fields, converted to SI units by the
# exporter: ratio, bytes, Hz, watts): metric name -> (column, scale to the column's unit). Only
# fields whose meaning is the DCGM field's; identity comes from `uuid` (no `GPU-` prefix) and
# nvidia_smi_index / nvidia_smi_gpu_info (gpufleet.collector.exposition_parse).
_MIB = 1.0 / (1 << 20)
NVIDIA_SMI_TO_COLUMN: dict[str, tuple[str, float]] = {
    "nvidia_smi_utilization_gpu_ratio": ("gpu_util", 100.0),
    "nvidia_smi_utilization_memory_ratio": ("mem_copy_util", 100.0),  # utilization.memory: memory controller busy
    "nvidia_smi_utilization_encoder_ratio": ("enc_util", 100.0),
    "nvidia_smi_utilization_decoder_ratio": ("dec_util", 100.0),
    "nvidia_smi_memory_used_bytes": ("fb_used_mib", _MIB),
    "nvidia_smi_memory_free_bytes": ("fb_free_mib", _MIB),
    "nvidia_smi_memory_reserved_bytes": ("fb_reserved_mib", _MIB),
    "nvidia_smi_memory_total_bytes": ("fb_total_mib", _MIB),
    "nvidia_smi_power_draw_watts": ("power_w", 1.0),
    "nvidia_smi_temperature_gpu": ("gpu_temp_c", 1.0),
    "nvidia_smi_temperature_memory": ("mem_temp_c", 1.0),
    "nvidia_smi_clocks_current_sm_clock_hz": ("sm_clock_mhz", 1e-6),
    "nvidia_smi_clocks_current_memory_clock_hz": ("mem_clock_mhz", 1e-6),
    "nvidia_smi_ecc_errors_corrected_volatile_total": ("ecc_sbe_vol", 1.0),
    "nvidia_smi_ecc_errors_uncorrected_volatile_total": ("ecc_dbe_vol", 1.0),
    "nvidia_smi_ecc_errors_corrected_aggregate_total": ("ecc_sbe_agg", 1.0),
    "nvidia_smi_ecc_errors_uncorrected_aggregate_total": ("ecc_dbe_agg", 1.0),
    "nvidia_smi_remapped_rows_correctable": ("remap_correctable", 1.0),
    "nvidia_smi_remapped_rows_uncorrectable": ("remap_uncorrectable", 1.0),
    "nvidia_smi_remapped_rows_failure": ("remap_failure", 1.0),
    "nvidia_smi_clocks_event_reasons_active": ("clocks_event_reasons", 1.0),
    "nvidia_smi_clocks_throttle_reasons_active": ("clocks_event_reasons", 1.0),  # drivers before R535
    "nvidia_smi_compute_apps": ("compute_processes", 1.0),
}
METRIC_TO_COLUMN.update(NVIDIA_SMI_TO_COLUMN)
# nvidia_gpu_exporter series that name a GPU's index, model and driver (not sample columns)
NVIDIA_SMI_INDEX = "nvidia_smi_index"
NVIDIA_SMI_INFO = "nvidia_smi_gpu_info"
NVIDIA_SMI_PREFIX = "nvidia_smi_"


SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms")),  # UTC
        pa.field("cluster", pa.string()),
        pa.field("host", pa.string()),
        pa.field("gpu", pa.int16()),  # NVML index, dcgm-exporter's `gpu` label
        pa.field("gpu_uuid", pa.string()),  # the parent GPU's UUID for MIG rows
        pa.field("gpu_instance", pa.int16()),  # MIG GPU_I_ID, null for a whole GPU
        pa.field("mig_profile", pa.string()),
        pa.field("model", pa.string()),
        pa.field("source", pa.string()),  # "scrape" | "prometheus"
    ]
    + [pa.field(f.column, f.type) for f in SAMPLE_FIELDS]
)


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of `schema` with no rows. (pyarrow's Schema.empty_table() builds its columns from
    Python lists, and the first such build imports pandas where it is installed: ~0.2 s and ~15 MiB
    for a `gpufleet analyze` or a collector that never uses it.)"""
    return pa.Table.from_batches([], schema=schema)


def conform_samples(table: pa.Table) -> pa.Table:
    """`table` as SAMPLE_SCHEMA: its columns cast, the ones it lacks all null (unknown, not 0)."""
    n = table.num_rows
    cols = [table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type) for f in SAMPLE_SCHEMA]
    return pa.Table.from_arrays(cols, schema=SAMPLE_SCHEMA)

# Who held which GPU, as seen by the exporters' job mapping (gpufleet_gpu_job_info, dcgm-exporter
# pod/hpc_job labels) or scontrol: one row per job and GPU, widened as observations arrive.
ALLOCATIONS_DDL = """
CREATE TABLE IF NOT EXISTS allocations (
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,          -- slurm | kubernetes
    job_key VARCHAR NOT NULL,            -- slurm: raw job id; kubernetes: namespace/pod
    host VARCHAR NOT NULL,
    gpu_uuid VARCHAR NOT NULL,
    gpu_instance SMALLINT NOT NULL DEFAULT -1,   -- -1: the whole GPU
    gpu SMALLINT,
    first_seen TIMESTAMP NOT NULL,
    last_seen TIMESTAMP NOT NULL,
    source VARCHAR NOT NULL,             -- exporter | scontrol
    PRIMARY KEY (cluster, scheduler, job_key, host, gpu_uuid, gpu_instance)
)"""

JOBS_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,            -- slurm: JobIDRaw; kubernetes: namespace/pod
    job_id VARCHAR NOT NULL,             -- as people write it: 123, 123_4, 123+0
    array_job_id VARCHAR,
    array_task_id VARCHAR,
    het_job_id VARCHAR,
    het_job_offset INTEGER,
    name VARCHAR,
    user_name VARCHAR,
    account VARCHAR,                     -- kubernetes: the team label, else the namespace
    partition VARCHAR,                   -- kubernetes: the namespace
    qos VARCHAR,
    submit TIMESTAMP,
    eligible TIMESTAMP,
    start TIMESTAMP,
    "end" TIMESTAMP,
    state VARCHAR,                       -- normalised: COMPLETED, FAILED, CANCELLED, ...
    state_raw VARCHAR,                   -- as reported: "CANCELLED by 1000"
    exit_code VARCHAR,
    gpus INTEGER,                        -- GPUs allocated (AllocTRES gres/gpu), else requested; NULL: unknown
    gpu_type VARCHAR,
    node_count INTEGER,
    nodes VARCHAR,
    alloc_tres VARCHAR,
    source VARCHAR NOT NULL,             -- sacct | slurmrestd | kubernetes
    updated_at TIMESTAMP NOT NULL,
    PRIMARY KEY (cluster, scheduler, job_key)
)"""
# ... and, added by MIGRATIONS[6]: gpus_source VARCHAR, where `gpus` came from (GPUS_SOURCES; NULL: unknown)

GPUS_DDL = """
CREATE TABLE IF NOT EXISTS gpus (
    cluster VARCHAR NOT NULL,
    host VARCHAR NOT NULL,
    gpu_uuid VARCHAR NOT NULL,
    gpu_instance SMALLINT NOT NULL DEFAULT -1,
    gpu SMALLINT,
    mig_profile VARCHAR,
    model VARCHAR,
    fb_total_mib FLOAT,
    driver_version VARCHAR,
    first_seen TIMESTAMP NOT NULL,
    last_seen TIMESTAMP NOT NULL,
    PRIMARY KEY (cluster, host, gpu_uuid, gpu_instance)
)"""

# Throughput jobs report about themselves (exporter/jobreport.py -> gpufleet_job_reported_flops),
# the input of MFU method 1. One row per job, host and hour: the mean of that hour's reports and
# their count (a batch already stored is not counted twice), so the table stays small.
JOB_THROUGHPUT_DDL = """
CREATE TABLE IF NOT EXISTS job_throughput (
    ts TIMESTAMP NOT NULL,               -- the hour of the reports (UTC)
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,
    host VARCHAR NOT NULL,               -- the exporter that published them
    reports INTEGER NOT NULL,            -- observations (scrapes) folded into this row
    flops DOUBLE NOT NULL,               -- mean achieved model FLOP/s over `gpus` GPUs
    gpus INTEGER,                        -- GPUs the figure covers; NULL: the job's GPUs
    basis VARCHAR,                       -- flops (reported as FLOP/s) | 6N_tokens (6 x parameters x tokens/s)
    PRIMARY KEY (cluster, scheduler, job_key, host, ts)
)"""

# Published tables: name -> DDL. Each is snapshotted to Parquet for readers.
# The idle-GPU policy's audit trail: every notification and action it took or tried (one row per
# attempt), with the rule, the evidence and the result. It is what keeps a job from being
# notified twice inside renotify_after, across restarts.
POLICY_AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS policy_audit (
    ts TIMESTAMP NOT NULL,               -- when the attempt finished
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,
    job_id VARCHAR,
    user_name VARCHAR,
    account VARCHAR,
    action VARCHAR NOT NULL,             -- notify | escalate | cancel | exempt
    rule VARCHAR NOT NULL,               -- the [policy] rule that planned it
    reason VARCHAR NOT NULL,             -- why, with the idle figures
    idle_s DOUBLE,                       -- evidence: how long every GPU of the job was idle
    idle_gpus INTEGER,                   -- evidence: GPUs idle (all of the job's)
    enforce BOOLEAN NOT NULL,            -- false: a dry run (nothing was done)
    result VARCHAR NOT NULL,             -- ok | failed | dry-run | logged
    detail VARCHAR,                      -- what was done, or the error
    attempt INTEGER NOT NULL DEFAULT 1   -- consecutive attempts of this action on this job
)"""

# The earlier attempts of jobs that ran more than once (reliability, DESIGN.md contract 7): a Slurm
# requeue ends one record of a job and starts another under the same JobIDRaw (sacct --duplicates,
# slurmdbd's records of it), a Kubernetes pod's container restarts (its last terminated state).
# The jobs table keeps a job's latest record; this one every record a later one superseded, one
# row per start. Only jobs that ran more than once have rows, so it grows with the requeues and
# restarts, not with the jobs. A read that sees an attempt again fills what it knew less of.
JOB_ATTEMPTS_DDL = """
CREATE TABLE IF NOT EXISTS job_attempts (
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,            -- the job's (jobs.job_key)
    start TIMESTAMP NOT NULL,            -- the attempt's start: which attempt this is
    job_id VARCHAR,
    submit TIMESTAMP,
    "end" TIMESTAMP,                     -- NULL: not known to have ended
    state VARCHAR,                       -- normalised like jobs.state: REQUEUED, NODE_FAIL, FAILED, ...
    state_raw VARCHAR,
    exit_code VARCHAR,                   -- "code:signal"
    gpus INTEGER,                        -- NULL: the job's
    node_count INTEGER,
    nodes VARCHAR,
    source VARCHAR NOT NULL,             -- sacct | slurmrestd | kubernetes
    updated_at TIMESTAMP NOT NULL,
    PRIMARY KEY (cluster, scheduler, job_key, start)
)"""
ATTEMPT_COLUMNS = ("cluster", "scheduler", "job_key", "start", "job_id", "submit", "end", "state", "state_raw", "exit_code", "gpus",
                   "node_count", "nodes", "source", "updated_at")

# The split of a shared GPU among the jobs on it (the gpufleet exporter's per-process NVML
# figures, gpufleet_gpu_job_sm_utilization_ratio / _memory_used_bytes; exposition_parse keeps the
# scrapes where two or more jobs shared a GPU). One row per GPU, job and hour, like job_throughput,
# so the table grows with shared GPUs x hours, not with scrapes or with all GPUs. A job's mean SM
# share of the GPU over hours = sum(sm_sum) / sum(shared_scrapes): shared_scrapes counts every
# scrape of the hour that published the GPU's split, also those the job was absent from (its
# processes were not on the GPU: 0 SM), so the jobs' shares of a GPU-hour add up to at most 1.
GPU_JOB_SHARES_DDL = """
CREATE TABLE IF NOT EXISTS gpu_job_shares (
    ts TIMESTAMP NOT NULL,               -- the hour (UTC)
    cluster VARCHAR NOT NULL,
    host VARCHAR NOT NULL,
    gpu_uuid VARCHAR NOT NULL,
    gpu_instance SMALLINT NOT NULL DEFAULT -1,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,
    shared_scrapes INTEGER NOT NULL,     -- scrapes of this hour that published the GPU's split (any job)
    reports INTEGER NOT NULL,            -- of them, those that named this job
    sm_reports INTEGER NOT NULL,         -- of those, the ones with the job's SM ratio
    sm_sum DOUBLE,                       -- sum of the job's SM ratios (0-1) over sm_reports; NULL: none known
    memory_max_bytes DOUBLE,             -- the job's memory high-water on the GPU; NULL: unknown
    PRIMARY KEY (cluster, host, gpu_uuid, gpu_instance, scheduler, job_key, ts)
)"""

# The checkpoints jobs report saving (exporter/jobreport.checkpoint_saved ->
# gpufleet_job_checkpoint_timestamp_seconds), the start of the work an interruption loses. One row
# per job and checkpoint: the exporter publishes the last one until the next replaces it, so a
# job that saves more often than it is scraped leaves some out (its lost work is then counted
# from an earlier one: more, never less, than it lost).
JOB_CHECKPOINTS_DDL = """
CREATE TABLE IF NOT EXISTS job_checkpoints (
    cluster VARCHAR NOT NULL,
    scheduler VARCHAR NOT NULL,
    job_key VARCHAR NOT NULL,
    saved_at TIMESTAMP NOT NULL,         -- when the job saved it (UTC, the job's clock)
    duration_s DOUBLE,                   -- how long saving it took; NULL: not reported
    first_seen TIMESTAMP NOT NULL,       -- the scrape that first published it
    PRIMARY KEY (cluster, scheduler, job_key, saved_at)
)"""

TABLES = {"jobs": JOBS_DDL, "allocations": ALLOCATIONS_DDL, "gpus": GPUS_DDL, "job_throughput": JOB_THROUGHPUT_DDL, "policy_audit": POLICY_AUDIT_DDL,
          "job_attempts": JOB_ATTEMPTS_DDL, "gpu_job_shares": GPU_JOB_SHARES_DDL, "job_checkpoints": JOB_CHECKPOINTS_DDL}

# Writer-only bookkeeping.
STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)",
    "CREATE TABLE IF NOT EXISTS watermarks (source VARCHAR PRIMARY KEY, value VARCHAR NOT NULL, updated_at TIMESTAMP NOT NULL)",
    """CREATE TABLE IF NOT EXISTS batches (
        batch_key VARCHAR PRIMARY KEY,   -- deterministic: the same input window gives the same key
        file VARCHAR NOT NULL,           -- relative path of the Parquet file holding its rows
        rows BIGINT NOT NULL,
        checksum VARCHAR NOT NULL,
        min_ts TIMESTAMP,
        max_ts TIMESTAMP,
        written_at TIMESTAMP NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS retired_files (file VARCHAR PRIMARY KEY, retired_at TIMESTAMP NOT NULL)",
)

# Writer-only column of the segmented tables (never published): see MIGRATIONS[5].
SEGMENT_COLUMN = "_segment"

# version -> statements, applied in order by the writer at start. Version 1 is the base schema.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: STATE_DDL + (JOBS_DDL, ALLOCATIONS_DDL, GPUS_DDL),
    # 2: 5-minute rollups of each compacted hour, for dashboards
    2: ("CREATE TABLE IF NOT EXISTS rollups (hour TIMESTAMP PRIMARY KEY, file VARCHAR NOT NULL)",),
    # 3: job-reported throughput, for MFU
    3: (JOB_THROUGHPUT_DDL,),
    # 4: the idle-GPU policy's audit trail
    4: (POLICY_AUDIT_DDL,),
    # 5: settled history published once, in segments (gpufleet.collector.store, SEGMENTED): which
    # segment holds each row (NULL: none; -k: segment k holds an older version, the row overrides it)
    5: (
        f"ALTER TABLE jobs ADD COLUMN {SEGMENT_COLUMN} INTEGER",
        f"ALTER TABLE allocations ADD COLUMN {SEGMENT_COLUMN} INTEGER",
        """CREATE TABLE IF NOT EXISTS segments (
            id INTEGER PRIMARY KEY,          -- what the rows' segment column names
            tbl VARCHAR NOT NULL,            -- jobs | allocations
            file VARCHAR NOT NULL,           -- relative path of the immutable Parquet file
            rows BIGINT NOT NULL,
            schema_version INTEGER NOT NULL, -- written under; an upgrade rewrites older ones
            written_at TIMESTAMP NOT NULL
        )""",
    ),
    # 6: where a job's GPU count came from (GPUS_SOURCES): accounting that does not track GPUs is
    # filled from slurmctld or the job mapping, and the more authoritative source wins (issue #51).
    # A row stored before knew only its accounting's answer: a count is kept as the store had it,
    # from the source that wrote the row (its state says whether that record had ended).
    6: (
        "ALTER TABLE jobs ADD COLUMN gpus_source VARCHAR",
        # a 0 of a cluster whose accounting never named a GPU is "its TRES name no GPU": unknown
        """UPDATE jobs SET gpus = NULL WHERE scheduler = 'slurm' AND gpus = 0
             AND cluster NOT IN (SELECT cluster FROM jobs WHERE alloc_tres LIKE '%gres/gpu%')""",
        """UPDATE jobs SET gpus_source = CASE
             WHEN scheduler = 'kubernetes' THEN 'kubernetes'
             WHEN "end" IS NULL THEN 'slurmdbd_running' ELSE 'slurmdbd' END
           WHERE gpus IS NOT NULL""",
    ),
    # 7: every earlier attempt of a requeued or restarted job (JOB_ATTEMPTS_DDL); a store migrated
    # from 6 kept only each job's latest record, so its earlier attempts are not known
    7: (JOB_ATTEMPTS_DDL,),
    # 8: the per-job split of shared GPUs (GPU_JOB_SHARES_DDL); a store migrated from 7 never kept
    # it, so shares before the upgrade are unknown (no rows), not 0
    8: (GPU_JOB_SHARES_DDL,),
    # 9: the 5-minute rollups retired (issue #52: the facts' 5-minute grain replaces them): their
    # files retired ($now: the writer's clock; deleted after the grace period, as a reader may hold
    # an older manifest), their ledger dropped
    9: ("CREATE TABLE IF NOT EXISTS rollups (hour TIMESTAMP PRIMARY KEY, file VARCHAR NOT NULL)",  # (a store migrated again: gone)
        "INSERT OR IGNORE INTO retired_files SELECT DISTINCT file, $now FROM rollups", "DROP TABLE rollups"),
    # 10: the checkpoints jobs report (JOB_CHECKPOINTS_DDL); before the upgrade none were kept, so
    # those interruptions' lost work stays counted from the attempt's start (an upper bound)
    10: (JOB_CHECKPOINTS_DDL,),
    # 11: the per-GPU summaries retired (issue #52: the facts are the store's one derived tier):
    # their files under summaries/ - 5-minute rows, joined segments, run facts, health day files,
    # a rebuild's parts ($retired, listed by the writer) - retired ($now: deleted after the grace
    # period, as a reader may hold an older manifest); the next publish lists none of them
    11: ("INSERT OR IGNORE INTO retired_files SELECT unnest($retired::VARCHAR[]), $now",),
}

# Where a job's GPU count came from, by authority: a known count is never replaced by an
# unknown one (NULL), and between two known counts the higher rank wins, whatever the order the
# reads arrive in (collector.store merges by it, through GPUS_RANK). slurmdbd's record of an ended
# job is final when accounting tracks GPUs (AccountingStorageTRES has gres/gpu); while the job
# runs slurmctld's allocation is the live one, above slurmdbd's copy of it; the exporters' job
# mapping counts only the GPUs it saw the job hold, so it is the last resort. Kubernetes: the
# pod spec's GPU limits, the scheduler's own figure.
GPUS_SOURCES = {
    "slurmdbd": 4,          # sacct / slurmdbd record of an ended job, with GPU TRES
    "kubernetes": 4,        # the pod spec's nvidia.com/gpu (and MIG) limits
    "slurmctld": 3,         # slurmctld's record: tres_alloc_str, tres_per_job, tres_per_node x nodes, gres_detail
    "slurmdbd_running": 2,  # sacct / slurmdbd record of a job not ended yet, with GPU TRES
    "job_map": 1,           # the GPUs the exporters' job mapping saw the job hold
}
# GPUS_SOURCES as SQL: the rank of gpus_source in {col} (0: unknown)
GPUS_RANK = "CASE {col} " + " ".join(f"WHEN '{k}' THEN {v}" for k, v in GPUS_SOURCES.items()) + " ELSE 0 END"

JOB_COLUMNS = (
    "cluster", "scheduler", "job_key", "job_id", "array_job_id", "array_task_id", "het_job_id",
    "het_job_offset", "name", "user_name", "account", "partition", "qos", "submit", "eligible",
    "start", "end", "state", "state_raw", "exit_code", "gpus", "gpu_type", "node_count", "nodes",
    "alloc_tres", "source", "updated_at", "gpus_source",
)

@dataclass(frozen=True)
class Unrecognized:
    """Input a source could not make sense of, or read with a doubt: reported, counted
    (gpufleet_collect_input_unrecognized_total) and listed in the store's manifest for the
    dashboard's Health page. `input`: where (a target, a URL, a file); `kind`: a short token
    (no_gpu_rows, pod_hostname, no_final_newline, vector_answer, unknown_answer, no_jobs_list, ...);
    `detail`: what was there, for a person."""

    input: str
    kind: str
    detail: str


@dataclass
class Batch:
    """What one source run produced; the store commits a batch whole or not at all.

    `key` identifies the input window deterministically (the same window read twice gives the
    same key), which is what makes re-ingesting idempotent. `watermark` is committed in the same
    transaction, so a crash never advances a watermark past data that was not stored.
    Row dicts use the column names of gpufleet.collector.schema.
    """

    key: str
    samples: pa.Table | None = None  # gpufleet.collector.schema.SAMPLE_SCHEMA
    jobs: list[dict[str, Any]] = field(default_factory=list)  # JOB_COLUMNS
    allocations: list[dict[str, Any]] = field(default_factory=list)  # one observation each: ts + ALLOCATIONS key
    gpus: list[dict[str, Any]] = field(default_factory=list)  # one observation each: ts + GPUS columns
    throughput: list[dict[str, Any]] = field(default_factory=list)  # job-reported FLOP/s: ts + job_throughput columns
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # job-reported checkpoints: seen + job_checkpoints columns
    shares: list[dict[str, Any]] = field(default_factory=list)  # shared GPUs' split: exposition_parse share observations
    attempts: list[dict[str, Any]] = field(default_factory=list)  # earlier attempts of requeued/restarted jobs: ATTEMPT_COLUMNS
    rejected: int = 0  # malformed lines/records skipped (the good ones around them are kept)
    problems: list[str] = field(default_factory=list)  # what was rejected, for the log (first few)
    watermark: tuple[str, str] | None = None  # (watermark name, new value)
    unrecognized: list[Unrecognized] = field(default_factory=list)  # input not understood (good rows kept)
    # (cluster, scheduler, as of): `jobs` holds every job of that scope the scheduler still
    # knows, so a job the store has as PENDING or RUNNING that is not among them is gone (a pod
    # deleted between two listings) and is closed as of that time
    jobs_complete: tuple[str, str, datetime] | None = None

# When an allocation holds its GPU (before an analysis clips it to its window): from its job's
# start, else the mapping's first sighting, to the job's end, else the last sighting plus
# $max_gap. A requeued (restarted) job ran in runs - each earlier attempt (job_attempts; one that
# started before the job's record: a pod's restarted containers are inside its record's run) until
# its end, else the next run's start - and its record's run: the allocation holds its GPU once per
# run the mapping saw it in (first sighting before the run's end, last one plus $max_gap after its
# start), each run from its own start, so a requeue on the same GPUs is held twice (each attempt's
# startup its own) and a GPU only the first attempt had is not held through the second. An
# allocation of such a job in none of its runs keeps the job's record's bounds. Named once: the
# analytics' allocations (gpufleet.analytics.sql.ALLOCATIONS), the facts' holds
# (gpufleet.collector.facts.HOLDS) and every other reader use the one rule, so a part ends where an
# analysis looks up. Aliases: a = allocations, j = jobs (LEFT JOIN), r = ALLOCATION_RUNS (joined
# after j: `FROM allocations a LEFT JOIN jobs j ON ... {ALLOCATION_RUNS}`).
_RUNS = """(
    SELECT cluster, scheduler, job_key, false AS record, start AS r0, "end" AS r1,
           lead(start) OVER (PARTITION BY cluster, scheduler, job_key ORDER BY start) AS nxt
    FROM job_attempts
    UNION ALL
    SELECT DISTINCT cluster, scheduler, job_key, true, NULL, NULL, NULL FROM job_attempts)"""
_RUN_START = "CASE WHEN r.record THEN j.start ELSE r.r0 END"
_RUN_END = 'CASE WHEN r.record THEN j."end" ELSE least(r.r1, r.nxt, j.start) END'
_LAST_HELD = "a.last_seen + to_seconds($max_gap)"
ALLOCATION_RUNS = f"""LEFT JOIN {_RUNS} r ON r.cluster = a.cluster AND r.scheduler = a.scheduler AND r.job_key = a.job_key
  AND CASE WHEN r.record THEN j.start IS NOT NULL ELSE j.start IS NULL OR r.r0 < j.start END
  AND a.first_seen < coalesce({_RUN_END}, {_LAST_HELD}) AND {_LAST_HELD} > {_RUN_START}"""
ALLOCATION_START = f"coalesce({_RUN_START}, j.start, a.first_seen)"
ALLOCATION_END = f'CASE WHEN r.record IS NULL OR r.record THEN coalesce(j."end", {_LAST_HELD}) ELSE coalesce({_RUN_END}, {_LAST_HELD}) END'


def allocations_ending_after(since: str, where: str = "true", keys: str = "true") -> str:
    """SQL (a FROM item, for alias a): the allocations that may hold their GPU after `since` (SQL
    time) - every allocation whose ALLOCATION_END, in any of its runs, passes it, and a few that do
    not - read without joining the store's whole history. A reader that keeps only allocations
    ending after `since` gets the same rows from it as from `allocations`, and its cost grows with
    the allocations near its window, not with the store's years of them: those last seen within
    $max_gap of `since` or later (the tables' Parquet skips older row groups by their last_seen),
    and those of a job whose record or attempts start or end after it. Why these
    are all: a run's end is the job's end (else the last sighting plus $max_gap), or for an earlier
    attempt the least known of its end, the next attempt's start and the job's start (else the last
    sighting plus $max_gap) - each one of those times. `where`: a condition on the allocations'
    own columns (no alias) applied to both, which the reader would apply anyway (some GPUs);
    `keys`: one on the columns of a job's key alone (cluster, scheduler, job_key), applied to the
    jobs and attempts read too (one job's allocations: its key's rows alone). The second read takes
    $seen_floor (SEEN_FLOOR at `since` or earlier; NULL: none), so it skips the row groups of
    allocations last seen before any of those jobs was submitted: its cost follows the jobs open
    at `since`, not the store's age."""
    return f"""(SELECT * FROM allocations WHERE last_seen > {since} - to_seconds($max_gap) AND {where} AND {keys}
    UNION ALL
    SELECT * FROM allocations SEMI JOIN ({_open_after(since, "cluster, scheduler, job_key", keys)}) USING (cluster, scheduler, job_key)
    WHERE (last_seen > {since} - to_seconds($max_gap)) IS NOT TRUE AND ($seen_floor IS NULL OR last_seen >= $seen_floor)
      AND {where} AND {keys})"""


def _open_after(since: str, columns: str, keys: str = "true") -> str:
    """SQL: `columns` of the records and attempts that start or end after `since` (jobs and job_attempts). (Each time
    compared alone: a disjunction of two columns is not filtered inside the scan; a job twice in it is met once by a semi
    join.)"""
    return " UNION ALL ".join(f'SELECT {columns} FROM {table} WHERE {c} > {since} AND {keys}'
                              for table in ("jobs", "job_attempts") for c in ('"end"', "start"))


# The earliest an allocation that allocations_ending_after's second read keeps can have been last seen, for `since`
# = $since: $max_gap before the earliest submission among the runs it can belong to - the records and attempts that
# start or end after $since, and every attempt of their jobs (a requeued record's submission is the requeue's; its
# first attempt's is the job's); NULL (no floor) where one of those has no submission. Why: the job mapping sees a job
# on a GPU only once it was submitted (its clock within $max_gap of the scheduler's: a Kubernetes pod's devices are
# assigned after its creation, before its containers start), so no allocation of those jobs was last seen earlier;
# allocations_ending_after's first read keeps every allocation last seen within $max_gap of `since` or later. A floor
# at an earlier `since` is lower: bind one to every read at or after it (tests/test_allocation_reach.py).
SEEN_FLOOR = f"""
SELECT CASE WHEN count(*) = count(submit) THEN min(submit) - to_seconds($max_gap) END FROM (
    {_open_after("$since", "submit")}
    UNION ALL SELECT p.submit FROM job_attempts p
    SEMI JOIN ({_open_after("$since", "cluster, scheduler, job_key")}) r
      ON r.cluster = p.cluster AND r.scheduler = p.scheduler AND r.job_key = p.job_key)"""

# A sample's figures as the per-GPU line reads them, said once for the facts
# (gpufleet.collector.facts.SAMPLES) and the analytics' raw path (gpufleet.analytics.sql SAMPLE_ARRAYS,
# RAW_BUCKETS_*), so both apply one rule: NaN for a figure not reported (the columns reach numpy
# without a copy), a MIG instance's utilization its graphics-engine activity, nop = held with no
# compute process. {s}: the samples' table alias and a dot, or "".
LINE_COLUMNS = """coalesce(coalesce({s}gpu_util, {s}gr_engine_active * 100)::FLOAT, 'NaN'::FLOAT) AS util,
       coalesce({s}compute_processes = 0, false) AS nop"""
# ... and what the per-job detail adds up (memory high-water, MFU's tensor activity and SM clock)
LINE_DETAIL_COLUMNS = """coalesce({s}fb_used_mib::FLOAT, 'NaN'::FLOAT) AS fb, coalesce({s}tensor_active::FLOAT, 'NaN'::FLOAT) AS tensor,
       coalesce({s}sm_clock_mhz::FLOAT, 'NaN'::FLOAT) AS clock"""

# --- Clock-event reasons, and the runs of the fleet at a moment (gpufleet.analytics.fleet_now) ---

# DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits: thermal slowdown (SW, HW), power cap and brake, HW slowdown
THERMAL_BITS = 0x20 | 0x40
POWER_BITS = 0x04 | 0x80
HW_SLOWDOWN_BITS = 0x08


def same_gpu_hour(a: str, b: str, *cols: str) -> str:
    """Join condition: rows a and b are of the same GPU (or MIG instance) and the same `cols`;
    a NULL cluster, host or UUID matches a NULL (a source that does not say it)."""
    return " AND ".join([*(f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in ("cluster", "host", "gpu_uuid")), f"{a}.gi = {b}.gi",
                         *(f"{a}.{c} = {b}.{c}" for c in cols)])


# A sample as the fleet at a moment sees it (gpufleet.analytics.sql GPU_STATES): utilization from
# GPU_UTIL, or for a MIG instance its graphics-engine activity; processes as an integer.
NOW_COLUMNS = """gpu AS s_gpu, model AS s_model, mig_profile AS s_mig, ts,
           coalesce(gpu_util, gr_engine_active * 100)::DOUBLE AS util, fb_used_mib::DOUBLE AS fb_used_mib,
           gpu_temp_c::DOUBLE AS gpu_temp_c, mem_temp_c::DOUBLE AS mem_temp_c, power_w::DOUBLE AS power_w,
           xid_last, gpu_up::DOUBLE AS gpu_up, round(compute_processes)::BIGINT AS compute_processes, clocks_event_reasons,
           ecc_dbe_vol, remap_failure, sm_clock_mhz::DOUBLE AS sm_clock_mhz"""
NOW_NEWEST = ("s_gpu", "s_model", "s_mig", "ts", "util", "fb_used_mib", "gpu_temp_c", "mem_temp_c", "power_w", "xid_last", "gpu_up",
              "compute_processes", "clocks_event_reasons", "ecc_dbe_vol", "remap_failure", "sm_clock_mhz")

# One row per GPU (or MIG instance) and hour of the samples of {source} that pass {where}: what
# the fleet's idle and no-process runs at a moment compose from exactly, hour after hour
# (gpufleet.analytics.sql GPU_STATES), for the idle threshold $thr and gap $max_gap_us (microseconds):
#   now_first, now_last        the hour's first and last sample
#   now_last_busy              its last busy sample (utilization >= $thr); now_idle_after_busy the
#                              first idle one (utilization < $thr) after it; now_first_idle its first idle one
#   now_last_gap               its last sample that follows a gap longer than $max_gap within the hour;
#                              now_idle_in_stretch the first idle sample from it on (no gap: from the
#                              hour's first sample on)
#   now_last_proc, now_noproc_after_proc, now_first_noproc, now_noproc_in_stretch: the same for
#                              "some compute process" / "no compute process"
#   now_newest                 the hour's newest sample (NOW_NEWEST; one of them where two share a time)
# Fleet now runs it over the raw samples after the store's newest facts (whose parts carry the same
# marks: gpufleet.collector.facts.RUN_MARKS). Each GPU's samples are one integer (k)
# for the windows (on the four text columns they cost ~3x as much).
NOW_HOURS = f"""
WITH s AS NOT MATERIALIZED (
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, date_trunc('hour', ts) AS hour, {NOW_COLUMNS}
    FROM {{source}} WHERE {{where}}
), k AS (
    SELECT cluster, host, gpu_uuid, gi, hour, row_number() OVER () AS k FROM (SELECT DISTINCT cluster, host, gpu_uuid, gi, hour FROM s)
), n AS (
    SELECT k, ts, util, compute_processes,
           epoch_us(ts) - epoch_us(lag(ts) OVER w) > $max_gap_us AS after_gap,
           min(CASE WHEN util < $thr THEN ts END) OVER (w ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS next_idle,
           min(CASE WHEN compute_processes = 0 THEN ts END) OVER (w ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS next_noproc
    FROM s JOIN k ON {same_gpu_hour("s", "k", "hour")}
    WINDOW w AS (PARTITION BY k ORDER BY ts)
), r AS (
    -- (arg_max_null: the last busy sample's next idle one, also when it has none; arg_max would
    -- skip it for an earlier busy sample's)
    SELECT k, min(ts) AS now_first, max(ts) AS now_last,
           max(CASE WHEN util >= $thr THEN ts END) AS now_last_busy,
           arg_max_null(next_idle, CASE WHEN util >= $thr THEN ts END) AS now_idle_after_busy,
           min(CASE WHEN util < $thr THEN ts END) AS now_first_idle,
           max(CASE WHEN after_gap THEN ts END) AS now_last_gap,
           CASE WHEN now_last_gap IS NULL THEN now_first_idle
                ELSE arg_max_null(next_idle, CASE WHEN after_gap THEN ts END) END AS now_idle_in_stretch,
           max(CASE WHEN compute_processes > 0 THEN ts END) AS now_last_proc,
           arg_max_null(next_noproc, CASE WHEN compute_processes > 0 THEN ts END) AS now_noproc_after_proc,
           min(CASE WHEN compute_processes = 0 THEN ts END) AS now_first_noproc,
           CASE WHEN now_last_gap IS NULL THEN now_first_noproc
                ELSE arg_max_null(next_noproc, CASE WHEN after_gap THEN ts END) END AS now_noproc_in_stretch
    FROM n GROUP BY k
), newest AS (
    SELECT cluster, host, gpu_uuid, gi, hour, arg_max(struct_pack({", ".join(NOW_NEWEST)}), ts) AS now_newest
    FROM s GROUP BY cluster, host, gpu_uuid, gi, hour
)
SELECT k.cluster, k.host, k.gpu_uuid, k.gi, k.hour, r.* EXCLUDE (k), newest.now_newest
FROM k JOIN r USING (k) JOIN newest ON {same_gpu_hour("k", "newest", "hour")}
"""
