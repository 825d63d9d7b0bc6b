"""One scraped exposition (dcgm-exporter of any version, or the gpufleet exporter) -> canonical rows.

Pure: text in, a ParsedScrape out. What it tolerates is listed in shared/data/FORMATS.md §1-2:
metric names of every dcgm-exporter generation (gpufleet.collector.schema.METRIC_TO_COLUMN), labels read
by name in any order, `UUID`/`uuid`, `Hostname`/`hostname`, MIG rows keyed by (parent UUID,
GPU_I_ID), DCGM's blank sentinels, and three spellings of the Kubernetes workload labels. Also
utkuozdemir/nvidia_gpu_exporter's `nvidia_smi_*` families (schema.NVIDIA_SMI_TO_COLUMN): their
only label is `uuid` (lower-case, without `GPU-`), the index, model and driver come from
`nvidia_smi_index` / `nvidia_smi_gpu_info`.

What is accepted but doubtful is noted in `warnings` (a Hostname that is the exporter's pod name,
a last line without newline); the names of metric families nothing here reads are kept in
`unknown_names`, so that a body yielding no GPU rows can say what it held instead.

Lines are read by gpufleet.collector.exposition_fast, which pivots samples straight into the columns
built here. What depends only on a label set (host, row key, workload, hpc_job) is worked out
once per distinct label set, because dcgm-exporter repeats each GPU's labels on every family.
"""

from __future__ import annotations

import math
from bisect import bisect_left
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import chain
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import pyarrow as pa

from gpufleet.collector.exposition_fast import (BOM, DROP_ROW, KEEP, KEEP_ROW, MAX_CACHED, MAX_PROBLEMS, SKIP, Pivot,
                                                 _parse_block, _parse_value, scan)
from gpufleet.collector.schema import (METRIC_TO_COLUMN, NVIDIA_SMI_INDEX, NVIDIA_SMI_INFO, NVIDIA_SMI_PREFIX, SAMPLE_FIELDS,
                                       SAMPLE_SCHEMA)
from gpufleet.exposition import DCGM_BLANK_THRESHOLD  # blank DCGM values are not data


JOB_INFO = "gpufleet_gpu_job_info"
# Which exporter answered: the gpufleet exporter always publishes its build info.
GPUFLEET_BUILD_INFO = "gpufleet_build_info"
DCGM_EXPORTER, GPUFLEET = "dcgm-exporter", "gpufleet"
# When both exporters report one GPU (same host, UUID and MIG instance) in one scrape round -
# dcgm-exporter for DCP profiling, the gpufleet exporter for job mapping and GPM - each field
# is taken from the first exporter here that has a value for it: dcgm-exporter wins field by
# field, the gpufleet exporter fills the gaps (a field dcgm-exporter does not publish, or
# publishes blank). One row per GPU results, never two (which would count the GPU twice).
PRECEDENCE = (DCGM_EXPORTER, GPUFLEET)
# Read back from a TSDB, the two exporters' samples of one GPU carry their own scrape times: a
# gpufleet row within this many seconds of a dcgm-exporter row of the GPU folds into it (two
# 15 s scrape intervals); a farther one covers time dcgm-exporter did not, and stays.
PRECEDENCE_WITHIN_S = 30.0
# Throughput a job reported about itself (exporter/jobreports.py), per job and exporter host.
JOB_REPORTED_FLOPS = "gpufleet_job_reported_flops"
JOB_REPORTED_GPUS = "gpufleet_job_reported_gpus"
# The last checkpoint a job reported saving (exporter/jobreport.checkpoint_saved): when, how long it took
JOB_CHECKPOINT_TIME = "gpufleet_job_checkpoint_timestamp_seconds"
JOB_CHECKPOINT_DURATION = "gpufleet_job_checkpoint_duration_seconds"
JOB_CHECKPOINT_METRICS = (JOB_CHECKPOINT_TIME, JOB_CHECKPOINT_DURATION)
JOB_REPORT_METRICS = (JOB_REPORTED_FLOPS, JOB_REPORTED_GPUS) + JOB_CHECKPOINT_METRICS
# one series per GPU and intruding job (job_id label): the GPU's column is their sum
FOREIGN_PROCESSES = "gpufleet_gpu_foreign_processes"
# The split of a shared GPU among the jobs whose processes run on it, one series per GPU and job
# (job_id label): kept as share observations (ScrapeRows.shares) of GPUs two or more jobs shared.
JOB_SM_RATIO = "gpufleet_gpu_job_sm_utilization_ratio"
JOB_MEMORY_BYTES = "gpufleet_gpu_job_memory_used_bytes"
JOB_SHARE_METRICS = (JOB_SM_RATIO, JOB_MEMORY_BYTES)
# the jobs' SM ratios of one GPU in one scrape may exceed 1 in sum by this much (NVML rounding)
SHARE_SUM_TOLERANCE = 1e-6
# Series of these entities are not per-GPU values even when they carry a `gpu` label.
ENTITY_LABELS = ("nvlink", "nvswitch", "cpu", "cpucore")
# Workload label spellings, most specific first: after a Prometheus scrape with honorLabels
# false the workload's labels are renamed exported_*, and pod/namespace describe the exporter.
WORKLOAD_LABELS = (
    ("exported_namespace", "exported_pod"),
    ("namespace", "pod"),
    ("pod_namespace", "pod_name"),  # dcgm-exporter 1.x and --use-old-namespace
)
# dcgm-exporter's own pod labels, which leak onto idle GPUs' series: not a workload.
EXPORTER_NAMESPACE = "gpu-operator"
EXPORTER_POD_PREFIXES = ("nvidia-dcgm-exporter", "dcgm-exporter")
# Labels that name the node when dcgm-exporter's Hostname is its own pod name (GPU-operator and
# armada deployments without NODE_NAME): set by relabelling or by the operator, first wins.
NODE_LABELS = ("node", "kubernetes_node", "nodename")
MAX_UNKNOWN_NAMES = 10  # unknown family names kept per body, for the message
# nvidia_gpu_exporter's identity series, found before the samples are read
# nvidia_gpu_exporter's MIG mode and utilization series of a GPU (by its uuid label): nvidia-smi
# gives no utilization.gpu in MIG mode, so such a GPU has no utilization from that exporter
_SMI_MIG_RE = re.compile(r'^nvidia_smi_mig_mode_current\{[^}]*uuid="([^"]*)"[^}]*\} (\S+)', re.M)
_SMI_UTIL_RE = re.compile(r'^nvidia_smi_utilization_gpu_ratio\{[^}]*uuid="([^"]*)"', re.M)
MIG_NO_UTILIZATION = "MIG mode: utilization per instance needs dcgm-exporter or gpufleet's exporter"
_SMI_IDENTITY_RE = re.compile(f"^({NVIDIA_SMI_INDEX}|{NVIDIA_SMI_INFO})\\{{(.*)\\}} (\\S+)", re.M)

_INT_MIN = -(2**63)
_Y2000 = 946684800.0
CHECKPOINT_CLOCK_SKEW_S = 300.0  # a checkpoint time this far past the scrape is the node's clock, not the future
_FLOAT_COLUMNS = tuple(f.column for f in SAMPLE_FIELDS if not pa.types.is_integer(f.type))
_INT_COLUMNS = tuple(f.column for f in SAMPLE_FIELDS if pa.types.is_integer(f.type))
_I16_MAX = 2**15 - 1


@dataclass
class ParsedScrape:
    samples: pa.Table  # gpufleet.collector.schema.SAMPLE_SCHEMA, one row per (host, gpu_uuid, gpu_instance)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # inventory observations
    allocations: list[dict[str, Any]] = field(default_factory=list)  # job <-> GPU observations
    throughput: list[dict[str, Any]] = field(default_factory=list)  # job-reported FLOP/s observations
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # job-reported checkpoints (schema.JOB_CHECKPOINTS_DDL)
    shares: list[dict[str, Any]] = field(default_factory=list)  # per (GPU, job) split of a shared GPU
    rejected: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (kind, text), see ScrapeRows
    unknown_names: list[str] = field(default_factory=list)


@dataclass
class ScrapeRows:
    """A ParsedScrape whose sample rows are not an Arrow table yet: a scrape round turns all its
    targets' rows into one table (samples_table), since a table per target costs ~0.2 ms."""

    builder: _Builder
    order: list[int]  # the builder's rows to publish, in order
    source: str
    gpus: list[dict[str, Any]]
    allocations: list[dict[str, Any]]
    throughput: list[dict[str, Any]]
    rejected: int
    problems: list[str]
    shares: list[dict[str, Any]] = field(default_factory=list)  # per (GPU, job) split of a shared GPU
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # job-reported checkpoints (schema.JOB_CHECKPOINTS_DDL)
    # accepted but doubtful input (see the module doc): (kind, text), kind pod_hostname or no_final_newline
    warnings: list[tuple[str, str]] = field(default_factory=list)
    unknown_names: list[str] = field(default_factory=list)  # metric families not read, the first few

    @property
    def num_rows(self) -> int:
        return len(self.order)


def parse_exposition(
    text: str,
    *,
    ts: datetime,
    cluster: str,
    target: str,
    target_labels: Mapping[str, str] = {},
    source: str = "scrape",
) -> ParsedScrape:
    """Parse one scrape of `target` taken at `ts` (UTC; an aware time is converted, naive is UTC;
    kept to the millisecond, the samples' precision, in every output).

    Host: target_labels["node"] when set (operators set it when Hostname is a pod name), else
    the Hostname/hostname label, else the target's host part. Bad lines are counted in
    `rejected` and described (the first few) in `problems`; they never lose the good lines.
    """
    r = parse_rows(text, ts=ts, cluster=cluster, target=target, target_labels=target_labels, source=source)
    return ParsedScrape(samples=samples_table([r]), gpus=r.gpus, allocations=r.allocations,
                        throughput=r.throughput, checkpoints=r.checkpoints, shares=r.shares, rejected=r.rejected, problems=r.problems, warnings=r.warnings,
                        unknown_names=r.unknown_names)


def parse_rows(
    text: str,
    *,
    ts: datetime,
    cluster: str,
    target: str,
    target_labels: Mapping[str, str] = {},
    source: str = "scrape",
) -> ScrapeRows:
    """parse_exposition without the table: for callers that parse many scrapes into one."""
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc).replace(tzinfo=None)
    ts = ts.replace(microsecond=ts.microsecond // 1000 * 1000)
    b = _Builder(ts, cluster, host=target_labels.get("node") or None, default_host=target_host(target))
    if NVIDIA_SMI_PREFIX in text:
        b.read_smi_identity(text.removeprefix(BOM))  # the BOM would hide a first line's name from the regex
        b.note_smi_mig(text.removeprefix(BOM))
    lines = scan(text, pivot=Pivot(b.column_of, b.row_of))
    b.rejected, b.problems = lines.rejected, lines.problems
    b.warnings[:0] = [("no_final_newline", note) for note in lines.notes]
    for lineno, name, key, labels, value in lines.samples:  # what the pivot kept for us
        if name == JOB_INFO:
            b.job_info(lineno, key, labels, value)
        elif name in JOB_REPORT_METRICS:
            b.job_report(lineno, name, labels, value)
        elif name == FOREIGN_PROCESSES:
            b.foreign_processes(lineno, key, labels, value)
        elif name in JOB_SHARE_METRICS:
            b.job_share(lineno, name, key, labels, value)
        else:
            b.reject(lineno, b.reasons[key])
    shares = b.shared_gpus()
    b.problems.sort(key=lambda p: int(p.split(":", 1)[0].removeprefix("line ")))
    order = b.merge_parent_rows()
    return ScrapeRows(
        builder=b,
        order=order,
        source=source,
        gpus=b.inventory(order),
        allocations=list(b.allocations.values()),
        throughput=[r for r in b.reports.values() if r["flops"] is not None],
        checkpoints=[r for r in b.checkpoints.values() if r["saved_at"] is not None],
        shares=shares,
        rejected=b.rejected,
        problems=b.problems,
        warnings=b.warnings,
        unknown_names=b.unknown_names,
    )


def merge_exporters(parts: list[ScrapeRows], times: list[float] | None = None, within: float = 0.0) -> list[ScrapeRows]:
    """Parts with the rows two exporters both reported for one GPU folded into one, by
    PRECEDENCE per field (the loser's row is left out; its values fill the winner's gaps).
    Parts from one exporter only, or GPUs only one exporter reports, pass unchanged.

    One scrape round (`times` None): all parts were read at one moment. From a TSDB (`times`:
    each part's sample time), each exporter was scraped at its own moments: every winning row
    fills its gaps from the loser's row of the GPU nearest in time, and a loser's row within
    `within` seconds of a winning row is left out; a farther one covers time the winning exporter
    did not, and stays."""
    if len({p.builder.exporter for p in parts}) < 2:  # one kind of exporter: nothing to fold (the usual round)
        return parts
    held: dict[tuple[str, str, int | None], list[tuple[int, float, int, int]]] = {}
    for n, part in enumerate(parts):
        rank = PRECEDENCE.index(part.builder.exporter)
        t = times[n] if times is not None else 0.0
        info = part.builder.row_info
        for i in part.order:
            r = info[i]
            held.setdefault((r.host, r.uuid, r.instance), []).append((rank, t, n, i))
    dropped: dict[int, set[int]] = {}
    for rows in held.values():
        if len(rows) < 2:
            continue
        rows.sort()
        if times is None:
            _, _, wn, wi = rows[0]
            for _, _, ln, li in rows[1:]:
                _fold(parts[wn].builder, wi, parts[ln].builder, li)
                dropped.setdefault(ln, set()).add(li)
            continue
        winners = [r for r in rows if r[0] == rows[0][0]]
        losers = [r for r in rows if r[0] != rows[0][0]]
        for _, t, wn, wi in winners:
            near = _nearest(losers, t, within)
            if near is not None:
                _fold(parts[wn].builder, wi, parts[near[2]].builder, near[3])
        for _, t, ln, li in losers:
            if _nearest(winners, t, within) is not None:
                dropped.setdefault(ln, set()).add(li)
    for n, rows_out in dropped.items():
        parts[n].order = [i for i in parts[n].order if i not in rows_out]
    return parts


def _nearest(rows: list[tuple[int, float, int, int]], t: float, within: float) -> tuple[int, float, int, int] | None:
    """The row (sorted by time) nearest to t, if it lies within `within` seconds."""
    k = bisect_left(rows, t, key=lambda r: r[1])
    near = min(rows[max(k - 1, 0):k + 1], key=lambda r: abs(r[1] - t), default=None)
    return near if near is not None and abs(near[1] - t) <= within else None


def _fold(win: "_Builder", wi: int, lose: "_Builder", li: int) -> None:
    """Fill the winning row's missing values (and identity attributes) from the losing row."""
    for column, values in lose.values.items():
        v = values.get(li)
        if _is_data(v) and not _is_data(win.values.get(column, {}).get(wi)):
            win.values.setdefault(column, {})[wi] = v
    w, lr = win.row_info[wi], lose.row_info[li]
    w.mig_profile, w.model, w.driver = w.mig_profile or lr.mig_profile, w.model or lr.model, w.driver or lr.driver


def _is_data(v: Any) -> bool:
    return v is not None and v == v and v < DCGM_BLANK_THRESHOLD


def samples_table(parts: list[ScrapeRows]) -> pa.Table:
    """The sample rows of one or more parsed scrapes, in order, as one SAMPLE_SCHEMA table.

    Built column by column over all the scrapes at once: every pyarrow call costs microseconds,
    which adds up to milliseconds when each of 128 scrapes of 8 GPUs makes its own 49 arrays.
    """
    sizes = [p.num_rows for p in parts]
    n = sum(sizes)
    info = [p.builder.row_info[i] for p in parts for i in p.order]
    host, uuid, mig_profile, model = _arrays(pa.string(), [
        [r.host for r in info], [r.uuid for r in info], [r.mig_profile for r in info], [r.model for r in info]])
    gpu, instance = _arrays(pa.int16(), [[r.gpu for r in info], [r.instance for r in info]])
    fields: dict[str, pa.Array] = {}
    for type_, columns, convert in ((pa.float32(), _FLOAT_COLUMNS, _floats), (pa.int64(), _INT_COLUMNS, _ints)):
        present = [c for c in columns if any(p.builder.values.get(c) for p in parts)]
        flat: list[Any] = []  # the present columns one after the other, converted in one pass
        for c in present:
            for p, size in zip(parts, sizes):
                column = p.builder.values.get(c)
                flat.extend(map(column.get, p.order) if column else [None] * size)
        fields.update(zip(present, _slices(type_, convert(flat), n, len(present))))
        nulls = pa.nulls(n, type_)  # one all-null array, shared by every absent column
        fields.update((c, nulls) for c in columns if c not in fields)
    ts, cluster, source = _constant_columns([(p.builder.ts, p.builder.cluster, p.source, size) for p, size in zip(parts, sizes)])
    arrays = [ts, cluster, host, gpu, uuid, instance, mig_profile, model, source] + [fields[f.column] for f in SAMPLE_FIELDS]
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)


def target_host(target: str) -> str:
    """The host part of a scrape target: "10.0.0.5:9400" -> "10.0.0.5", "http://n1:9400/metrics" -> "n1"."""
    try:
        host = urlsplit(target if "://" in target else "//" + target).hostname
    except ValueError:
        host = None
    return host or target


@dataclass
class _Row:
    """The identity of one sample row, filled from whichever label sets name it."""

    host: str
    uuid: str
    instance: int | None
    gpu: int
    mig_profile: str | None = None
    model: str | None = None
    driver: str | None = None

    def absorb(self, series: _Series) -> None:
        if self.mig_profile is None:
            self.mig_profile = series.mig_profile
        if self.model is None:
            self.model = series.model
        if self.driver is None:
            self.driver = series.driver


@dataclass(frozen=True)
class _Series:
    """What a GPU series' label set says about its row: worked out once per label set and kept
    across scrapes (_LABEL_SETS), because every scrape repeats the same few label sets per GPU."""

    host: str
    uuid: str
    gpu: int
    instance: int | None
    mig_profile: str | None
    model: str | None
    driver: str | None
    jobs: tuple[tuple[str, str], ...]  # (scheduler, job key) the labels name as holding the GPU
    note: str | None = None  # a warning about the label set (a pod name for Hostname)


# What a label set means to the builder, which depends only on it and on the scrape's host
# override and default host: (label-set key, host, default host) -> row_of's reading (_series),
# and (JOB_INFO, label-set key, host, default host) -> job_info's (_holder). Forgotten all at
# once past MAX_CACHED, like exposition_fast's caches.
_LABEL_SETS: dict[tuple[Any, ...], Any] = {}


def _remember(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """_LABEL_SETS[key], made on first use."""
    value = _LABEL_SETS.get(key)
    if value is None:
        if len(_LABEL_SETS) >= MAX_CACHED:
            _LABEL_SETS.clear()
        value = _LABEL_SETS[key] = make()
    return value


def _job_of(labels: Mapping[str, str]) -> tuple[str, str]:
    """(scheduler, job key) a per-job series names by its scheduler, job_id or namespace/pod labels;
    the key is "" when none is usable."""
    scheduler = labels.get("scheduler") or "slurm"
    workload = _workload(labels) if scheduler == "kubernetes" else None
    job_key = "/".join(workload) if workload else ("" if scheduler == "kubernetes" else labels.get("job_id") or "")
    return scheduler, job_key if _utf8(job_key) else ""


class _Builder:
    """The state of one parse: rows, their columns, allocations, problems."""

    def __init__(self, ts: datetime, cluster: str, host: str | None, default_host: str):
        self.ts, self.cluster = ts, cluster
        self.host = host  # wins over the Hostname label
        self.default_host = default_host  # when there is no Hostname label
        self.rows: dict[tuple[str, str, int | None], int] = {}  # (host, uuid, instance) -> index
        self.row_info: list[_Row] = []
        self.values: dict[str, dict[int, Any]] = {}  # column -> row index -> value as parsed
        self.allocations: dict[tuple, dict[str, Any]] = {}
        self.reports: dict[tuple[str, str, str], dict[str, Any]] = {}  # (scheduler, job_key, host) -> observation
        self.checkpoints: dict[tuple[str, str], dict[str, Any]] = {}  # (scheduler, job_key) -> last checkpoint reported
        # (row, scheduler, job_key) -> [SM ratio, memory bytes, line numbers], None where not published
        self.shares: dict[tuple[int, str, str], list[Any]] = {}
        self.reasons: dict[object, str] = {}  # label-set key -> why its series are rejected
        self.exporter = DCGM_EXPORTER  # until a gpufleet_build_info line says otherwise
        self.rejected = 0
        self.problems: list[str] = []
        self.warnings: list[tuple[str, str]] = []
        self.unknown_names: list[str] = []
        # nvidia_gpu_exporter: uuid label -> (GPU index or None, model, driver); None when the
        # body has no nvidia_smi_* series. Part of the label-set cache keys: it changes meanings.
        self.smi: dict[str, tuple[int | None, str | None, str | None]] | None = None
        self.smi_key: tuple | None = None

    def warn(self, kind: str, text: str) -> None:
        if (kind, text) not in self.warnings and len(self.warnings) < MAX_PROBLEMS:
            self.warnings.append((kind, text))

    def read_smi_identity(self, text: str) -> None:
        """uuid -> (index, model, driver) from nvidia_smi_index{uuid} N and nvidia_smi_gpu_info{uuid,index,name,driver_version}."""
        smi: dict[str, list[Any]] = {}
        for name, block, value in _SMI_IDENTITY_RE.findall(text):
            labels = _parse_block(block)
            uuid = labels.get("uuid") if labels else None
            if not uuid:
                continue
            entry = smi.setdefault(uuid, [None, None, None])
            if name == NVIDIA_SMI_INDEX:
                v = _parse_value(value.strip())
                index = v if type(v) is int else (int(v) if isinstance(v, float) and v.is_integer() else None)
                entry[0] = index if index is not None and 0 <= index <= _I16_MAX else entry[0]
            else:
                index = _small_int(labels.get("index") or "")
                entry[0] = entry[0] if index is None else index
                entry[1] = labels.get("name") or None
                entry[2] = labels.get("driver_version") or None
        self.smi = {k: (v[0], v[1], v[2]) for k, v in smi.items()}
        self.smi_key = tuple(sorted(self.smi.items(), key=lambda kv: kv[0]))

    def note_smi_mig(self, text: str) -> None:
        """A GPU nvidia_gpu_exporter reports in MIG mode with no utilization: said (a warning the
        Health page lists), since its samples hold every other field and would pass unnoticed."""
        with_util = set(_SMI_UTIL_RE.findall(text))
        for uuid, value in _SMI_MIG_RE.findall(text):
            if value.strip() not in ("0", "0.0") and uuid not in with_util:
                index = (self.smi or {}).get(uuid, (None,))[0]
                self.warn("mig_no_utilization", f"GPU {uuid}{'' if index is None else f' (index {index})'} is in MIG mode and "
                          f"nvidia_gpu_exporter gives no utilization for it (nvidia-smi has none in MIG mode): none stored; "
                          f"{MIG_NO_UTILIZATION}")

    def reject(self, lineno: int, reason: str) -> None:
        self.rejected += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {lineno}: {reason}")

    # --- the pivot's questions ---

    def column_of(self, name: str) -> tuple[dict[int, Any] | None, float] | None:
        if name == JOB_INFO or name in JOB_REPORT_METRICS or name == FOREIGN_PROCESSES or name in JOB_SHARE_METRICS:
            return KEEP
        mapped = METRIC_TO_COLUMN.get(name)
        if mapped is None:
            if name == GPUFLEET_BUILD_INFO:
                self.exporter = GPUFLEET
            elif len(self.unknown_names) < MAX_UNKNOWN_NAMES:
                self.unknown_names.append(name)
            return SKIP  # a family the schema does not store: ignored, not rejected (named if nothing else is read)
        column, scale = mapped
        return self.values.setdefault(column, {}), scale

    def row_of(self, label_key: object, labels: Mapping[str, str]) -> int:
        """The row of a GPU series' label set, noting the workload or Slurm job it names.

        Series without a `gpu` label (NVSwitch, NVLink, CPU entities) are not GPU rows; an empty
        label counts as absent, as in Prometheus.
        """
        series = _remember((label_key, self.host, self.default_host, self.smi_key), lambda: self._series(labels))
        if type(series) is int:
            return series  # DROP_ROW
        if type(series) is str:
            self.reasons[label_key] = series
            return KEEP_ROW  # parse_exposition rejects each of its lines
        key = (series.host, series.uuid, series.instance)
        index = self.rows.get(key)
        if index is None:
            index = self.rows[key] = len(self.row_info)
            self.row_info.append(_Row(series.host, series.uuid, series.instance, series.gpu))
        self.row_info[index].absorb(series)
        if series.note:
            self.warn("pod_hostname", series.note)
        for scheduler, job in series.jobs:
            self.allocate(scheduler, job, series.host, series.uuid, series.instance, series.gpu)
        return index

    def _series(self, labels: Mapping[str, str]) -> _Series | int | str:
        """row_of's reading of a label set: DROP_ROW, a reason to reject it, or its _Series."""
        if any(k in labels for k in ENTITY_LABELS):
            return DROP_ROW
        if not labels.get("gpu") and (self.smi is None or not labels.get("uuid")):
            return DROP_ROW
        key = self._gpu_key(labels)
        if isinstance(key, str):
            return key
        smi = self.smi.get(labels["uuid"]) if self.smi and not labels.get("gpu") else None
        jobs = []
        workload = _workload(labels)
        if workload is not None and not _is_exporter_pod(*workload):
            jobs.append(("kubernetes", "/".join(workload)))
        job = labels.get("hpc_job")  # one series per job id; "0" is what some prologs write when idle
        if job and job != "0":
            jobs.append(("slurm", job))
        return _Series(*key, mig_profile=labels.get("GPU_I_PROFILE") or None,
                       model=labels.get("modelName") or (smi[1] if smi else None),
                       driver=labels.get("DCGM_FI_DRIVER_VERSION") or (smi[2] if smi else None), jobs=tuple(jobs),
                       note=_host_label(labels)[1] if self.host is None else None)

    def _gpu_key(self, labels: Mapping[str, str]) -> tuple[str, str, int, int | None] | str:
        """(host, uuid, gpu, instance) of a GPU series, or why it cannot have one."""
        if labels.get("gpu"):
            gpu = _small_int(labels["gpu"])
            if gpu is None:
                return f"bad gpu label {labels['gpu']!r}"
            uuid = labels.get("UUID") or labels.get("uuid")
        else:  # nvidia_gpu_exporter: `uuid` only, the index from its identity series
            uuid = labels.get("uuid")
            smi = (self.smi or {}).get(uuid or "")
            gpu = smi[0] if smi else None
            if gpu is None:
                return f"nvidia_smi series of uuid {uuid!r} without an index (no nvidia_smi_index or nvidia_smi_gpu_info for it)"
            uuid = smi_uuid(uuid)
        if not uuid:
            return "GPU series without a UUID label"
        instance = None
        if labels.get("GPU_I_ID"):  # MIG: the row is the instance, UUID is the parent's
            instance = _small_int(labels["GPU_I_ID"])
            if instance is None:
                return f"bad GPU_I_ID label {labels['GPU_I_ID']!r}"
        host = self.host or _host_label(labels)[0] or self.default_host
        for text in (host, uuid, labels.get("modelName"), labels.get("GPU_I_PROFILE"), labels.get("DCGM_FI_DRIVER_VERSION")):
            if text and not _utf8(text):
                return "label value is not valid UTF-8"
        return host, uuid, gpu, instance

    # --- allocations ---

    def foreign_processes(self, lineno: int, label_key: object, labels: Mapping[str, str], value: float) -> None:
        """gpufleet_gpu_foreign_processes{gpu,UUID,Hostname,job_id} N: added to the GPU row's column."""
        if not (value >= 0 and value != math.inf):
            self.reject(lineno, f"{FOREIGN_PROCESSES} value {value!r} is not a process count")
            return
        row = self._gpu_row(lineno, label_key, labels)
        if row is not None:
            column = self.values.setdefault(METRIC_TO_COLUMN[FOREIGN_PROCESSES][0], {})
            column[row] = column.get(row, 0.0) + value

    def _gpu_row(self, lineno: int, label_key: object, labels: Mapping[str, str]) -> int | None:
        """The GPU row a per-GPU job series adds to (row_of); None where it has none, the line
        rejected with its reason when its labels name no GPU row that could be kept."""
        row = self.row_of(label_key, labels)
        if row == KEEP_ROW:
            self.reject(lineno, self.reasons[label_key])
        return row if row >= 0 else None

    def job_share(self, lineno: int, name: str, label_key: object, labels: Mapping[str, str], value: float) -> None:
        """gpufleet_gpu_job_sm_utilization_ratio / _memory_used_bytes{gpu,UUID,Hostname,job_id}: one job's
        part of a GPU, paired by GPU row and job (shared_gpus keeps the GPUs two or more jobs shared)."""
        scheduler, job_key = _job_of(labels)
        if not job_key:
            self.reject(lineno, f"{name} without a usable job_id or namespace/pod")
            return
        sm = name == JOB_SM_RATIO
        if not (value >= 0 and value != math.inf) or (sm and value > 1):
            self.reject(lineno, f"{name} value {value!r} is not {'a ratio in 0-1' if sm else 'a byte count'}")
            return
        row = self._gpu_row(lineno, label_key, labels)
        if row is not None:
            entry = self.shares.setdefault((row, scheduler, job_key), [None, None, []])
            entry[0 if sm else 1] = float(value)
            entry[2].append(lineno)

    def shared_gpus(self) -> list[dict[str, Any]]:
        """The share observations of the GPUs two or more jobs shared in this scrape (a GPU one job
        holds alone is its samples' business: the table grows with shared GPUs, not with all).
        A GPU whose jobs' SM ratios sum past 1 is rejected whole: the split is not a split."""
        by_row: dict[int, list[tuple[str, str, list[Any]]]] = {}
        for (row, scheduler, job_key), entry in self.shares.items():
            by_row.setdefault(row, []).append((scheduler, job_key, entry))
        out = []
        for row, jobs in by_row.items():
            if len(jobs) < 2:
                continue
            info = self.row_info[row]
            total = sum(e[0] for _, _, e in jobs if e[0] is not None)
            if total > 1 + SHARE_SUM_TOLERANCE:
                for lineno in sorted(n for _, _, e in jobs for n in e[2]):
                    self.reject(lineno, f"{JOB_SM_RATIO} of the {len(jobs)} jobs on GPU {info.uuid} sum to {total:.3f}, more than 1")
                continue
            out += [{"ts": self.ts, "cluster": self.cluster, "host": info.host, "gpu_uuid": info.uuid,
                     "gpu_instance": -1 if info.instance is None else info.instance, "scheduler": scheduler,
                     "job_key": job_key, "sm_ratio": e[0], "memory_bytes": e[1]} for scheduler, job_key, e in jobs]
        return out

    def job_info(self, lineno: int, label_key: object, labels: Mapping[str, str], value: float) -> None:
        """gpufleet_gpu_job_info{gpu,UUID,[GPU_I_ID],Hostname,scheduler,job_id|namespace,pod} 1."""
        if not value > 0:  # 0 or NaN: not a holder
            return
        holder = _remember((JOB_INFO, label_key, self.host, self.default_host, self.smi_key), lambda: self._holder(labels))
        if type(holder) is str:
            self.reject(lineno, holder)
        elif holder:
            self.allocate(*holder)

    def _holder(self, labels: Mapping[str, str]) -> tuple[Any, ...] | str:
        """job_info's reading of a label set: allocate()'s arguments, () when the holder is the
        exporter's own pod, or why the line is rejected."""
        if not labels.get("gpu"):
            return "gpufleet_gpu_job_info without a gpu label"
        key = self._gpu_key(labels)
        if isinstance(key, str):
            return key
        host, uuid, gpu, instance = key
        scheduler = labels.get("scheduler") or ""
        job_id = labels.get("job_id")
        if scheduler == "kubernetes" or (not scheduler and not job_id):
            workload = _workload(labels)
            if workload is None:
                return "gpufleet_gpu_job_info without job_id or namespace/pod"
            return () if _is_exporter_pod(*workload) else ("kubernetes", "/".join(workload), host, uuid, instance, gpu)
        if job_id:
            return (scheduler or "slurm", job_id, host, uuid, instance, gpu)
        return f"gpufleet_gpu_job_info scheduler={scheduler!r} without job_id"

    def job_report(self, lineno: int, name: str, labels: Mapping[str, str], value: float) -> None:
        """gpufleet_job_reported_flops{Hostname,scheduler,job_id|namespace,pod,basis} FLOP/s and
        gpufleet_job_reported_gpus{...} (the GPUs that figure covers), paired by job and host."""
        scheduler, job_key = _job_of(labels)
        if not job_key:
            self.reject(lineno, f"{name} without a usable job_id or namespace/pod")
            return
        if name in JOB_CHECKPOINT_METRICS:
            self.job_checkpoint(lineno, name, scheduler, job_key, value)
            return
        if not (value >= 0 and value != math.inf) or (name == JOB_REPORTED_GPUS and (value < 1 or value != int(value))):
            self.reject(lineno, f"{name} value {value!r} is not a {'FLOP/s figure' if name == JOB_REPORTED_FLOPS else 'GPU count'}")
            return
        host = self.host or _host_label(labels)[0] or self.default_host
        obs = self.reports.setdefault((scheduler, job_key, host), {
            "ts": self.ts, "cluster": self.cluster, "scheduler": scheduler, "job_key": job_key, "host": host,
            "flops": None, "gpus": None, "basis": None,
        })
        if name == JOB_REPORTED_FLOPS:
            obs["flops"], obs["basis"] = float(value), labels.get("basis") or None
        else:
            obs["gpus"] = int(value)

    def job_checkpoint(self, lineno: int, name: str, scheduler: str, job_key: str, value: float) -> None:
        """gpufleet_job_checkpoint_timestamp_seconds (Unix time the job's last checkpoint was saved)
        and gpufleet_job_checkpoint_duration_seconds (how long saving it took), paired by job. A
        checkpoint saved after the scrape, or before 2000, is not a time this scrape can know."""
        if not (value >= 0 and value != math.inf) or (name == JOB_CHECKPOINT_TIME and not (
                _Y2000 <= value <= self.ts.replace(tzinfo=timezone.utc).timestamp() + CHECKPOINT_CLOCK_SKEW_S)):
            self.reject(lineno, f"{name} value {value!r} is not a {'time before the scrape' if name == JOB_CHECKPOINT_TIME else 'duration'}")
            return
        obs = self.checkpoints.setdefault((scheduler, job_key), {
            "cluster": self.cluster, "scheduler": scheduler, "job_key": job_key, "saved_at": None, "duration_s": None,
            "seen": self.ts,
        })
        if name == JOB_CHECKPOINT_TIME:
            obs["saved_at"] = datetime.fromtimestamp(round(value, 3), timezone.utc).replace(tzinfo=None)
        else:
            obs["duration_s"] = float(value)

    def allocate(self, scheduler: str, job_key: str, host: str, uuid: str, instance: int | None, gpu: int) -> None:
        if not _utf8(job_key):
            return
        gi = -1 if instance is None else instance
        key = (scheduler, job_key, host, uuid, gi)
        if key not in self.allocations:  # one observation per job and GPU per scrape
            self.allocations[key] = {
                "ts": self.ts, "cluster": self.cluster, "scheduler": scheduler, "job_key": job_key,
                "host": host, "gpu_uuid": uuid, "gpu_instance": gi, "gpu": gpu, "source": "exporter",
            }

    # --- output ---

    def merge_parent_rows(self) -> list[int]:
        """Row indexes to publish, after folding whole-GPU rows into that GPU's MIG instance rows.

        gpufleet publishes device-level series (gpufleet_gpu_up) once per GPU, without GPU_I_ID,
        while a MIG GPU's DCGM series are per instance. Like dcgm-exporter, which repeats device
        values on every instance row, copy them onto the instance rows instead of keeping a
        second, mostly empty row that would count the GPU twice.
        """
        instances: dict[tuple[str, str], list[int]] = {}
        for (host, uuid, instance), index in self.rows.items():
            if instance is not None:
                instances.setdefault((host, uuid), []).append(index)
        dropped: set[int] = set()
        for (host, uuid), children in instances.items():
            parent = self.rows.get((host, uuid, None))
            if parent is None:
                continue
            dropped.add(parent)
            for column in self.values.values():
                if parent in column:
                    v = column.pop(parent)
                    for child in children:
                        column.setdefault(child, v)
            p = self.row_info[parent]
            for child in children:
                c = self.row_info[child]
                c.model = c.model or p.model
                c.driver = c.driver or p.driver
        return [i for i in range(len(self.row_info)) if i not in dropped]

    def inventory(self, order: list[int]) -> list[dict[str, Any]]:
        def value(column: str, index: int) -> float | None:
            return _floats([self.values.get(column, {}).get(index)])[0]

        out = []
        for i in order:
            r = self.row_info[i]
            fb_total = value("fb_total_mib", i)
            if fb_total is None:
                parts = [value(c, i) for c in ("fb_used_mib", "fb_free_mib", "fb_reserved_mib")]
                fb_total = sum(parts) if None not in parts else None
            out.append({
                "ts": self.ts, "cluster": self.cluster, "host": r.host, "gpu_uuid": r.uuid,
                "gpu_instance": -1 if r.instance is None else r.instance, "gpu": r.gpu,
                "mig_profile": r.mig_profile, "model": r.model, "fb_total_mib": fb_total,
                "driver_version": r.driver,
            })
        return out


_CONSTANTS: dict[tuple[datetime, str, str, int], tuple[pa.Array, pa.Array, pa.Array]] = {}


def _constant_columns(runs: list[tuple[datetime, str, str, int]]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The ts, cluster and source columns of runs of (ts, cluster, source, rows). A scrape round
    is one run (its targets share them): made once with pa.repeat and kept, arrays being
    immutable; mixed runs (scrapes of different times) are converted value by value."""
    if len({r[:3] for r in runs}) > 1:
        return (pa.array([r[0] for r in runs for _ in range(r[3])], pa.timestamp("ms")),
                pa.array([r[1] for r in runs for _ in range(r[3])], pa.string()),
                pa.array([r[2] for r in runs for _ in range(r[3])], pa.string()))
    ts, cluster, source = runs[0][:3] if runs else (datetime(1970, 1, 1), "", "")
    key = (ts, cluster, source, sum(r[3] for r in runs))
    arrays = _CONSTANTS.get(key)
    if arrays is None:
        if len(_CONSTANTS) >= 64:
            _CONSTANTS.clear()
        arrays = _CONSTANTS[key] = (
            pa.repeat(pa.scalar(ts, pa.timestamp("ms")), key[3]), pa.repeat(pa.scalar(cluster, pa.string()), key[3]),
            pa.repeat(pa.scalar(source, pa.string()), key[3]))
    return arrays


def _arrays(type_: pa.DataType, columns: list[list[Any]]) -> list[pa.Array]:
    """Equal-length lists -> arrays, with one conversion for all (a slice each): every pa.array
    call costs microseconds, which adds up when a scrape has 8 GPUs and 40 columns."""
    if not columns:
        return []
    return _slices(type_, list(chain.from_iterable(columns)), len(columns[0]), len(columns))


def _slices(type_: pa.DataType, flat: list[Any], n: int, k: int) -> list[pa.Array]:
    """k columns of n values each, laid end to end in `flat` -> k arrays (one conversion)."""
    if not k:
        return []
    array = pa.array(flat, type_)
    return [array.slice(i * n, n) for i in range(k)]


def smi_uuid(uuid: str) -> str:
    """nvidia_gpu_exporter's `uuid` (nvidia-smi's without `GPU-`) as NVML, DCGM and Slurm write it."""
    return uuid if uuid[:4].upper() in ("GPU-", "MIG-") else "GPU-" + uuid


def is_exporter_pod_name(host: str) -> bool:
    """A Hostname that is dcgm-exporter's pod name (`nvidia-dcgm-exporter-sv6g2`), not a node."""
    return host.startswith(tuple(p + "-" for p in EXPORTER_POD_PREFIXES))


def _host_label(labels: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(host the labels name, a warning or None). A Hostname that is the exporter's pod name gives
    way to a node label (NODE_LABELS); without one it is kept, with a warning saying so."""
    host = labels.get("Hostname") or labels.get("hostname")
    if not host or not (is_exporter_pod_name(host) or host == labels.get("pod")):
        return host, None
    for key in NODE_LABELS:
        node = labels.get(key)
        if node:
            return node, f"Hostname {host!r} is the exporter's pod name; host taken from label {key}={node!r}"
    return host, (f"Hostname {host!r} is the exporter's pod name, not a node, and no {'/'.join(NODE_LABELS)} label names "
                  "the node: set one (a `node` target label) or NODE_NAME on the exporter")


def _workload(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, pod) named by the first workload-label spelling present; empty values are none."""
    for ns_key, pod_key in WORKLOAD_LABELS:
        pod = labels.get(pod_key)
        namespace = labels.get(ns_key)
        if pod and namespace:
            return namespace, pod
    return None


def _is_exporter_pod(namespace: str, pod: str) -> bool:
    return namespace == EXPORTER_NAMESPACE and pod.startswith(EXPORTER_POD_PREFIXES)


def _small_int(text: str) -> int | None:
    """A non-negative int16 label value (GPU index, GPU instance id), else None."""
    if not (text.isascii() and text.isdigit()):
        return None
    v = int(text)
    return v if v <= _I16_MAX else None


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, from bytes decoded with surrogateescape
        return False
    return True


def _floats(raw: list[Any]) -> list[float | None]:
    """Parsed values -> floats; DCGM blanks (and NaN) -> None."""
    return [None if v is None or v != v or v >= DCGM_BLANK_THRESHOLD else float(v) for v in raw]


def _ints(raw: list[Any]) -> list[int | None]:
    """Parsed values -> int64s; DCGM blanks, NaN, infinities and out-of-range values -> None."""
    return [v if type(v) is int and _INT_MIN <= v < DCGM_BLANK_THRESHOLD else _to_int(v) for v in raw]


def _to_int(v: Any) -> int | None:
    if v is None or type(v) is int or v != v or v in (math.inf, -math.inf):
        return None  # an int here is out of range
    v = round(v)
    return v if _INT_MIN <= v < DCGM_BLANK_THRESHOLD else None
