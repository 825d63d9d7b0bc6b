"""Background polling: NVML (or the simulator) and the mapping sources, off the scrape path.

Two loops run on their own cadences: telemetry (cheap, every `poll_interval`) and processes plus
job mapping (process lists take milliseconds per GPU, every `process_interval`). Each loop
publishes a fresh exposition; a scrape only reads the last one and never waits on NVML.
One GPU or source failing is recorded on that GPU or source; the rest carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from gpufleet.exporter.backends.base import Backend
from gpufleet.exposition import render
from gpufleet.exporter.jobmap.base import JobBinding, MappingSource
from gpufleet.exporter.jobreports import JobCheckpoint, JobReport, JobReportSource
from gpufleet.exporter.model import BackendUnavailable, GpuError, GpuIdentity
from gpufleet.exporter.snapshot import GpuState, Snapshot, SourceStatus, families

log = logging.getLogger(__name__)

PROCESS_SOURCE = "processes"
ALLOCATION_SOURCES = ("slurm_jobmap", "kubelet")  # who *holds* a GPU, as opposed to who runs on it


class Poller:
    def __init__(
        self,
        backend: Backend,
        sources: Sequence[MappingSource] = (),
        *,
        hostname: str,
        poll_interval: float = 5.0,
        process_interval: float = 15.0,
        device_map_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        retry_max: float = 60.0,
        job_reports: JobReportSource | None = None,
    ):
        self.backend = backend
        self.sources = list(sources)
        self.job_reports = job_reports  # throughput (MFU) and checkpoints jobs report about themselves
        self.poll_interval = poll_interval
        self.process_interval = process_interval
        self.device_map_file = Path(device_map_file) if device_map_file else None
        self.clock = clock
        self.retry_max = retry_max
        self._opened = False
        self._retry_delay = poll_interval
        self._next_open_attempt = 0.0
        self._last_open_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.snapshot = Snapshot(
            hostname=hostname,
            backend=backend.name,
            allocation_sources_enabled=any(s.name in ALLOCATION_SOURCES for s in self.sources),
        )
        self._exposition = render(families(self.snapshot))

    # --- the two cycles (public so tests and benchmarks can drive them without threads) ---

    def poll_telemetry(self) -> None:
        if not self._ensure_open():
            self._publish()
            return
        t0 = time.perf_counter()
        try:
            events = self.backend.xid_events()
        except Exception as e:  # noqa: BLE001 - a failing event API must not stop telemetry
            log.warning("reading XID events failed: %s", e)
            events = []
        with self._lock:
            states = {st.identity.index: st for st in self.snapshot.gpus}
        for ev in events:
            st = states.get(ev.gpu_index)
            if st is not None:
                st.xid_counts[ev.xid] = st.xid_counts.get(ev.xid, 0) + 1
                log.warning("GPU %d (%s) reported XID %d", ev.gpu_index, st.identity.uuid, ev.xid)
        ok = 0
        for st in states.values():
            try:
                reading = self.backend.read(st.identity)
            except GpuError as e:
                self._gpu_failed(st, e.reason, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - isolate one GPU's unexpected failure
                self._gpu_failed(st, "error", f"{type(e).__name__}: {e}")
                continue
            if st.error:
                log.info("GPU %d (%s) answers again", st.identity.index, st.identity.uuid)
            st.reading, st.error, st.error_message = reading, None, ""
            ok += 1
        self._record(self.backend.name, ok > 0 or not states, time.perf_counter() - t0, 0)
        self._record_backend_health()
        self._publish()

    def _record_backend_health(self) -> None:
        """The backend's optional sources (GPM): their own health rows, never the GPU's."""
        health = getattr(self.backend, "health", None)
        if health is None:
            return
        try:
            parts = health()
        except Exception as e:  # noqa: BLE001 - a health report must not stop telemetry
            log.warning("backend health report failed: %s", e)
            return
        for name, h in parts.items():
            self._record(name, h.success, h.duration_seconds, 0, reasons=h.problems)

    def poll_processes_and_jobs(self) -> None:
        if not self._opened:
            return
        with self._lock:
            states = list(self.snapshot.gpus)
        t0 = time.perf_counter()
        procs = {}
        for st in states:
            if st.error:
                st.processes = None
                continue
            try:
                st.processes = list(self.backend.processes(st.identity))
                procs[st.identity.index] = st.processes
            except GpuError as e:
                st.processes = None
                self._gpu_failed(st, e.reason, str(e))
            except Exception as e:  # noqa: BLE001
                st.processes = None
                log.warning("listing processes on GPU %d failed: %s", st.identity.index, e)
        self._record(PROCESS_SOURCE, True, time.perf_counter() - t0, 0)
        gpus = [st.identity for st in states]
        allocations: list[tuple[GpuIdentity, JobBinding]] = []
        process_jobs: list[tuple[GpuIdentity, JobBinding]] = []
        for source in self.sources:
            t0 = time.perf_counter()
            try:
                bindings = source.collect(gpus, procs)
            except Exception as e:  # noqa: BLE001 - any source failure is reported, not raised
                self._source_failed(source.name, e, time.perf_counter() - t0)
                continue
            problems = list(source.problems)
            resolved = []
            for b in bindings:
                g = resolve(gpus, b)
                if g is None:
                    problems.append(f"binding for unknown GPU (index={b.gpu_index}, uuid={b.gpu_uuid}): {b.job_id or b.pod}")
                    continue
                resolved.append((g, b if b.gpu_instance_id is not None or not b.gpu_uuid else _with_instance(g, b)))
            for p in problems[:5]:
                log.warning("%s: %s", source.name, p)
            (allocations if source.name in ALLOCATION_SOURCES else process_jobs).extend(resolved)
            self._record(source.name, True, time.perf_counter() - t0, len(problems))
        reports = self._read_job_reports()
        with self._lock:
            self.snapshot.allocations = allocations
            self.snapshot.process_jobs = process_jobs
            self.snapshot.job_reports = reports
        self._publish()

    def _read_job_reports(self) -> list[JobReport | JobCheckpoint]:
        if self.job_reports is None:
            return []
        t0 = time.perf_counter()
        try:
            reports = self.job_reports.read()
        except Exception as e:  # noqa: BLE001 - an unreadable directory is reported, not raised
            self._source_failed(self.job_reports.name, e, time.perf_counter() - t0)
            return []
        for p in self.job_reports.problems[:5]:
            log.warning("%s: %s", self.job_reports.name, p)
        self._record(self.job_reports.name, True, time.perf_counter() - t0, len(self.job_reports.problems))
        return reports

    # --- helpers ---

    def _ensure_open(self) -> bool:
        if self._opened:
            return True
        now = self.clock()
        if now < self._next_open_attempt:
            return False
        t0 = time.perf_counter()
        try:
            self.backend.open()
            devices = list(self.backend.devices())
            driver = self.backend.driver_version()
        except BackendUnavailable as e:
            msg = str(e)
            if msg != self._last_open_error:
                log.error("GPU backend %s unavailable: %s; serving exporter health only, retrying", self.backend.name, msg)
                self._last_open_error = msg
            self._next_open_attempt = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self.retry_max)
            self._record(self.backend.name, False, time.perf_counter() - t0, 0)
            return False
        log.info("GPU backend %s opened: %d GPUs, driver %s", self.backend.name, len(devices), driver or "unknown")
        self._opened, self._last_open_error, self._retry_delay = True, "", self.poll_interval
        with self._lock:
            self.snapshot.driver_version = driver
            self.snapshot.gpus = [GpuState(identity=d) for d in devices]
        if self.device_map_file:
            write_device_map(self.device_map_file, devices)
        return True

    def _gpu_failed(self, st: GpuState, reason: str, message: str) -> None:
        if st.error != reason:
            log.error("GPU %d (%s) failed: %s", st.identity.index, st.identity.uuid, message)
        st.error, st.error_message = reason, message

    def _source_failed(self, name: str, e: Exception, duration: float) -> None:
        with self._lock:
            prev = self.snapshot.sources.get(name)
        if prev is None or prev.success:
            log.error("job mapping source %s failed: %s", name, e)
        self._record(name, False, duration, 0)

    def _record(self, name: str, success: bool, duration: float, problems: int, reasons: dict[str, int] | None = None) -> None:
        """`reasons`: the source's own running count of problems by reason (replaces the last)."""
        with self._lock:
            st = self.snapshot.sources.setdefault(name, SourceStatus())
            st.success, st.duration_seconds = success, duration
            st.problems_total += problems
            if reasons is not None:
                st.problems_by_reason = dict(reasons)
                st.problems_total = sum(reasons.values())
            if success:
                st.last_success = self.clock()

    def _publish(self) -> None:
        with self._lock:
            body = render(families(self.snapshot))
        self._exposition = body

    def exposition(self) -> bytes:
        """The last rendered exposition; never blocks on NVML."""
        return self._exposition

    # --- threads ---

    def start(self) -> None:
        self._stop.clear()
        for target, interval in ((self.poll_telemetry, self.poll_interval), (self.poll_processes_and_jobs, self.process_interval)):
            t = threading.Thread(target=self._loop, args=(target, interval), daemon=True, name=target.__name__)
            t.start()
            self._threads.append(t)

    def _loop(self, step: Callable[[], None], interval: float) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                step()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("poll step %s failed", step.__name__)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        if self._opened:
            try:
                self.backend.close()
            finally:
                self._opened = False


def resolve(gpus: Sequence[GpuIdentity], b: JobBinding) -> GpuIdentity | None:
    """The GPU a binding names, by UUID (GPU or MIG) or by NVML index."""
    if b.gpu_uuid:
        for g in gpus:
            if g.uuid == b.gpu_uuid or any(m.uuid == b.gpu_uuid for m in g.mig_instances):
                return g
        return None
    return next((g for g in gpus if g.index == b.gpu_index), None)


def _with_instance(g: GpuIdentity, b: JobBinding) -> JobBinding:
    """Fill in the GPU instance id of a binding that named a MIG instance by its UUID."""
    m = next((m for m in g.mig_instances if m.uuid == b.gpu_uuid), None)
    return replace(b, gpu_index=g.index, gpu_instance_id=m.gpu_instance_id) if m else replace(b, gpu_index=g.index)


def write_device_map(path: Path, devices: Sequence[GpuIdentity]) -> None:
    """Publish index/minor/UUID for the Slurm prolog, which reaches GPUs through their device files
    (minor numbers) and needs the NVML index the job-mapping files are named by.

    Written atomically (temp file + rename) so a prolog never reads half a file.
    """
    lines = ["# index minor uuid pci_bus_id (written by gpufleet exporter)"]
    lines += [f"{d.index} {'-' if d.minor_number is None else d.minor_number} {d.uuid} {d.pci_bus_id or '-'}" for d in devices]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)
    except OSError as e:
        log.error("cannot write device map %s for the Slurm prolog: %s", path, e)
