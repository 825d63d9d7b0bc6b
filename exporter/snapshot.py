"""What one poll knows, and how it becomes metric families.

A Snapshot is built by the poller and turned into families by `families()`, a pure function,
so rendering can be tested without threads, NVML or sockets.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Sequence

from gpufleet.exposition import Family, Labels
from gpufleet.exporter.fields import DRIVER_LABEL, FIELDS, is_blank
from gpufleet.exporter.jobmap.base import JobBinding
from gpufleet.exporter.jobreports import JobCheckpoint, JobReport
from gpufleet.exporter.model import GpuIdentity, GpuProcess, GpuReading
from gpufleet.version import version



@dataclass
class GpuState:
    identity: GpuIdentity
    reading: GpuReading | None = None
    error: str | None = None  # reason word when the GPU failed its last poll
    error_message: str = ""
    processes: Sequence[GpuProcess] | None = None  # None: unknown (never polled or failed)
    xid_counts: dict[int, int] = field(default_factory=dict)


@dataclass
class SourceStatus:
    success: bool = False
    duration_seconds: float = 0.0
    last_success: float | None = None
    problems_total: int = 0
    problems_by_reason: dict[str, int] = field(default_factory=dict)  # sources that say why (nvml_gpm)


@dataclass
class Snapshot:
    hostname: str
    backend: str
    driver_version: str = ""
    gpus: list[GpuState] = field(default_factory=list)
    allocations: list[tuple[GpuIdentity, JobBinding]] = field(default_factory=list)
    process_jobs: list[tuple[GpuIdentity, JobBinding]] = field(default_factory=list)
    allocation_sources_enabled: bool = False
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    job_reports: list[JobReport | JobCheckpoint] = field(default_factory=list)


def _gpu_labels(s: Snapshot, g: GpuIdentity, gi: int | None = None) -> Labels:
    """The short label set of gpufleet's own per-GPU metrics: enough to join with DCGM rows."""
    labels: Labels = (("gpu", str(g.index)), ("UUID", g.uuid))
    if gi is not None:
        labels += (("GPU_I_ID", str(gi)),)
    return labels + (("Hostname", s.hostname),)


def _dcgm_labels(s: Snapshot, g: GpuIdentity, mig_profile: str | None = None, gi: int | None = None) -> Labels:
    """dcgm-exporter's label set, in its order: fixed labels, MIG labels, Hostname, then label-type fields."""
    labels: Labels = (("gpu", str(g.index)), ("UUID", g.uuid))
    if g.pci_bus_id:
        labels += (("pci_bus_id", g.pci_bus_id),)
    labels += (("device", g.device), ("modelName", g.model))
    if gi is not None:
        labels += (("GPU_I_PROFILE", mig_profile or ""), ("GPU_I_ID", str(gi)))
    labels += (("Hostname", s.hostname),)
    if s.driver_version:
        labels += ((DRIVER_LABEL, s.driver_version),)
    return labels


def _dcgm_families(s: Snapshot) -> list[Family]:
    fams = {name: Family(name, f.kind, f.help) for name, f in FIELDS.items()}
    for st in s.gpus:
        if st.reading is None or st.error:
            continue
        g = st.identity
        rows: list[tuple[Labels, dict[str, float]]]
        if g.mig_instances:
            rows = [
                (_dcgm_labels(s, g, m.profile, m.gpu_instance_id), st.reading.instance_fields.get(m.gpu_instance_id, {}))
                for m in g.mig_instances
            ]
        else:
            rows = [(_dcgm_labels(s, g), {})]
        for labels, inst in rows:
            for name, fam in fams.items():
                scope = FIELDS[name].scope
                if g.mig_instances and scope == "non_mig":
                    continue
                value = inst.get(name) if (g.mig_instances and scope == "instance") else st.reading.fields.get(name)
                if value is None or is_blank(value):
                    continue
                fam.add(labels, value)
    return list(fams.values())


def _job_labels(b: JobBinding) -> Labels:
    labels: Labels = (("scheduler", b.scheduler),)
    for key in ("job_id", "namespace", "pod", "container"):
        v = getattr(b, key)
        if v:
            labels += ((key, v),)
    return labels


def _gpufleet_families(s: Snapshot) -> list[Family]:
    up = Family("gpufleet_gpu_up", "gauge", "1 if the GPU answered its last poll; 0 with a reason label if it did not.")
    procs = Family("gpufleet_gpu_compute_processes", "gauge", "Compute processes running on the GPU (or MIG instance); absent when unknown.")
    xids = Family("gpufleet_gpu_xid_errors_total", "counter", "XID error events seen by this exporter since it started, by XID code.")
    info = Family(
        "gpufleet_gpu_job_info", "gauge",
        "The job or pod holding a GPU (1 per holder); join on Hostname, gpu, UUID with DCGM metrics.",
    )
    job_util = Family("gpufleet_gpu_job_sm_utilization_ratio", "gauge", "SM utilization of one job's processes on a GPU (NVML per-process utilization), 0-1.")
    job_mem = Family("gpufleet_gpu_job_memory_used_bytes", "gauge", "GPU memory used by one job's processes on a GPU.")
    foreign = Family("gpufleet_gpu_foreign_processes", "gauge", "Processes on a GPU whose Slurm job is not allocated that GPU.")

    for st in s.gpus:
        g = st.identity
        labels = _gpu_labels(s, g)
        if st.error:
            up.add(labels + (("reason", st.error),), 0)
        elif st.reading is not None:
            up.add(labels, 1)
        for code, n in sorted(st.xid_counts.items()):
            xids.add(labels + (("xid", str(code)),), n)
        if st.processes is not None and not st.error:
            if g.mig_instances:
                for m in g.mig_instances:
                    n = sum(1 for p in st.processes if p.gpu_instance_id == m.gpu_instance_id)
                    procs.add(_gpu_labels(s, g, m.gpu_instance_id), n)
            else:
                procs.add(labels, len(st.processes))

    def gi_of(b: JobBinding, g: GpuIdentity) -> int | None:
        return b.gpu_instance_id if g.mig_instances else None

    published: set[tuple] = set()
    pairs = list(s.allocations)
    if not s.allocation_sources_enabled:
        pairs += s.process_jobs
    for g, b in pairs:
        key = (g.index, gi_of(b, g), _job_labels(b))
        if key not in published:
            published.add(key)
            info.add(_gpu_labels(s, g, gi_of(b, g)) + _job_labels(b), 1)

    allocated = {(g.index, b.job_id) for g, b in s.allocations if b.job_id}
    states = {st.identity.index: st for st in s.gpus}
    per_job: dict[tuple[int, str], list[GpuProcess]] = {}
    foreign_counts: dict[tuple[int, str], int] = {}
    for g, b in s.process_jobs:
        st = states.get(g.index)
        proc = next((p for p in (st.processes or ()) if p.pid == b.pid), None) if st else None
        if proc is not None:
            per_job.setdefault((g.index, b.job_id), []).append(proc)
        if s.allocation_sources_enabled and (g.index, b.job_id) not in allocated:
            foreign_counts[(g.index, b.job_id)] = foreign_counts.get((g.index, b.job_id), 0) + 1
    for (index, job), plist in sorted(per_job.items()):
        labels = _gpu_labels(s, states[index].identity) + (("job_id", job),)
        sm = [p.sm_utilization for p in plist if p.sm_utilization is not None]
        if sm:
            job_util.add(labels, min(100.0, sum(sm)) / 100)
        mem = [p.used_memory_bytes for p in plist if p.used_memory_bytes is not None]
        if mem:
            job_mem.add(labels, sum(mem))
    for (index, job), n in sorted(foreign_counts.items()):
        foreign.add(_gpu_labels(s, states[index].identity) + (("job_id", job),), n)
    return [up, procs, xids, info, job_util, job_mem, foreign]


def _job_report_families(s: Snapshot) -> list[Family]:
    """What jobs report about their own throughput (exporter/jobreport.py): the input of MFU."""
    flops = Family(
        "gpufleet_job_reported_flops", "gauge",
        "Model FLOP/s a job reports achieving, over gpufleet_job_reported_gpus GPUs (else the job's allocation); "
        "basis: flops (reported) or 6N_tokens (6 x parameters x tokens/s, attention excluded).",
    )
    gpus = Family("gpufleet_job_reported_gpus", "gauge", "GPUs the job's reported FLOP/s covers (absent: the job's allocation).")
    saved = Family("gpufleet_job_checkpoint_timestamp_seconds", "gauge",
                   "Unix time the job's last checkpoint was saved, as the job reported it (work before it survives an interruption).")
    took = Family("gpufleet_job_checkpoint_duration_seconds", "gauge",
                  "How long saving the job's last checkpoint took, as the job reported it (absent: not reported).")
    for r in s.job_reports:
        labels: Labels = (("Hostname", s.hostname), ("scheduler", r.scheduler))
        labels += (("job_id", r.job_id),) if r.scheduler == "slurm" else (("namespace", r.namespace), ("pod", r.pod))
        if isinstance(r, JobCheckpoint):
            saved.add(labels, r.saved_at)
            if r.duration_seconds is not None:
                took.add(labels, r.duration_seconds)
            continue
        flops.add(labels + (("basis", r.basis),), r.flops)
        if r.gpus is not None:
            gpus.add(labels, r.gpus)
    return [flops, gpus, saved, took]


def _health_families(s: Snapshot) -> list[Family]:
    ok = Family("gpufleet_collector_success", "gauge", "1 if the source's last run succeeded.")
    dur = Family("gpufleet_collector_duration_seconds", "gauge", "How long the source's last run took.")
    last = Family("gpufleet_collector_last_success_timestamp_seconds", "gauge", "Unix time of the source's last successful run.")
    problems = Family(
        "gpufleet_collector_problems_total", "counter",
        "Bad entries a source skipped (junk lines, bad names, unknown GPUs), or failed calls (nvml_gpm: by reason).",
    )
    for name, st in sorted(s.sources.items()):
        labels: Labels = (("collector", name),)
        ok.add(labels, 1 if st.success else 0)
        dur.add(labels, round(st.duration_seconds, 6))
        if st.last_success is not None:
            last.add(labels, round(st.last_success, 3))
        if st.problems_by_reason:
            for reason, n in sorted(st.problems_by_reason.items()):
                problems.add(labels + (("reason", reason),), n)
        else:
            problems.add(labels, st.problems_total)
    build = Family("gpufleet_build_info", "gauge", "Build information of the gpufleet exporter.")
    build.add((("version", version()), ("backend", s.backend), ("python_version", platform.python_version())), 1)
    return [ok, dur, last, problems, build]


def families(s: Snapshot) -> list[Family]:
    return _dcgm_families(s) + _gpufleet_families(s) + _job_report_families(s) + _health_families(s)
