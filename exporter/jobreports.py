"""Read the throughput reports jobs write (exporter/jobreport.py), for gpufleet_job_reported_flops.

Each process poll reads the report directory: one JSON file per job. A report older than
`max_age` seconds (by the file's modification time) is dropped: the job ended or stopped
reporting, and an old figure must not pass for a current one. A garbled file (not JSON, wrong
fields, impossible numbers) is skipped and counted in the source's problems; the other reports
still publish. A missing directory means no job has reported yet: no reports, not a failure.

FLOP/s is worked out here when a job gave tokens/s and parameters: 6 x N x tokens/s (see
jobreport.py for what that formula leaves out); `basis` says which.

A checkpoint report (`<job>.checkpoint.json`, jobreport.checkpoint_saved) names the job's last
saved checkpoint: when, and how long saving it took. It is published while it is younger than
`checkpoint_max_age` (a day: jobs checkpoint far less often than they report throughput); the
collector keeps every distinct checkpoint time it sees. Reports are self-declared:
any process that can write the directory can report for any job, so the directory's permissions
are the trust boundary (e.g. mode 1777, like /tmp, so a job cannot replace another's file).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpufleet.exporter.jobmap.base import MappingError
from gpufleet.exporter.jobreport import CHECKPOINT_KIND, CHECKPOINT_SUFFIX, FORMAT_VERSION, JOB_ID_RE, K8S_NAME_RE

MAX_FILE_BYTES = 64 * 1024
MAX_FILES = 4096  # more than this is not a node's jobs: read the newest
CHECKPOINT_MAX_AGE = 86400.0  # seconds a checkpoint report is published after it was written


@dataclass(frozen=True)
class _Job:
    """Which job a report is about."""

    scheduler: str  # "slurm" | "kubernetes"
    job_id: str = ""
    namespace: str = ""
    pod: str = ""


@dataclass(frozen=True)
class JobReport(_Job):
    flops: float = 0.0  # achieved model FLOP/s
    basis: str = "flops"  # "flops" (reported) | "6N_tokens" (6 x parameters x tokens/s)
    gpus: int | None = None  # GPUs the figure covers; None: the job's allocation
    age_seconds: float = 0.0


@dataclass(frozen=True)
class JobCheckpoint(_Job):
    """The job's last saved checkpoint, as it reported it (jobreport.checkpoint_saved)."""

    saved_at: float = 0.0  # Unix time the checkpoint was saved
    duration_seconds: float | None = None  # how long saving it took; None: not reported
    age_seconds: float = 0.0


class JobReportSource:
    name = "job_reports"

    def __init__(self, directory: str | Path, *, max_age: float = 120.0, checkpoint_max_age: float = CHECKPOINT_MAX_AGE,
                 clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.max_age = max_age
        self.checkpoint_max_age = checkpoint_max_age
        self.clock = clock
        self._problems: list[str] = []

    @property
    def problems(self) -> list[str]:
        return self._problems

    def read(self) -> list[JobReport | JobCheckpoint]:
        """The fresh reports, one throughput report and one checkpoint per job (the newest when
        several files name the same job)."""
        self._problems = []
        try:
            entries = [e for e in os.scandir(self.directory) if not e.name.startswith(".")]  # dotfiles: writes in flight
        except FileNotFoundError:
            return []
        except OSError as e:
            raise MappingError(f"job report directory {self.directory} is unreadable: {e}") from None
        now = self.clock()
        found: list[tuple[float, JobReport | JobCheckpoint]] = []
        stats = []
        for entry in entries:
            try:
                st = entry.stat()
            except OSError:
                continue  # removed while we looked
            if entry.is_file():
                stats.append((st.st_mtime, st.st_size, entry))
            else:
                self._problems.append(f"{entry.path}: not a file")
        stats.sort(key=lambda t: t[0], reverse=True)
        if len(stats) > MAX_FILES:
            self._problems.append(f"{len(stats)} files in {self.directory}: read the newest {MAX_FILES}")
        for mtime, size, entry in stats[:MAX_FILES]:
            age = now - mtime
            checkpoint = entry.name.endswith(CHECKPOINT_SUFFIX)
            if age > (self.checkpoint_max_age if checkpoint else self.max_age):
                continue  # stale: the job ended or stopped reporting
            if not entry.name.endswith(".json"):
                self._problems.append(f"{entry.path}: not a <job>.json report")
                continue
            if size > MAX_FILE_BYTES:
                self._problems.append(f"{entry.path}: {size} bytes, larger than a report can be")
                continue
            try:
                doc = json.loads(Path(entry.path).read_bytes())
                found.append((mtime, parse_checkpoint(doc, age) if checkpoint else parse(doc, age)))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, UnicodeDecodeError) as e:
                self._problems.append(f"{entry.path}: {e}"[:300])
        newest: dict[tuple[str, str, str, str, str], JobReport | JobCheckpoint] = {}
        for _, r in sorted(found, key=lambda t: t[0], reverse=True):
            newest.setdefault((type(r).__name__, r.scheduler, r.job_id, r.namespace, r.pod), r)
        return [newest[k] for k in sorted(newest)]


def parse(doc: object, age: float = 0.0) -> JobReport:
    """A report document -> JobReport; ValueError says what is wrong with it."""
    scheduler, job_id, namespace, pod = _identity(doc, None)
    flops, tokens, params = (_number(doc, k) for k in ("flops_per_second", "tokens_per_second", "parameters"))
    if flops is not None:
        basis = "flops"
    elif tokens is not None and params is not None and params > 0:
        flops, basis = 6.0 * params * tokens, "6N_tokens"
    else:
        raise ValueError("neither flops_per_second nor tokens_per_second with parameters > 0")
    gpus = doc.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus {gpus!r}: expected a whole number >= 1")
    return JobReport(scheduler, job_id, namespace, pod, flops, basis, gpus, age)


def parse_checkpoint(doc: object, age: float = 0.0) -> JobCheckpoint:
    """A checkpoint document -> JobCheckpoint; ValueError says what is wrong with it."""
    scheduler, job_id, namespace, pod = _identity(doc, CHECKPOINT_KIND)
    saved_at = _number(doc, "saved_at")
    if saved_at is None or saved_at <= 0:
        raise ValueError(f"saved_at {doc.get('saved_at')!r}: expected the Unix time the checkpoint was saved")
    return JobCheckpoint(scheduler, job_id, namespace, pod, saved_at, _number(doc, "duration_seconds"), age)


def _identity(doc: object, kind: str | None) -> tuple[str, str, str, str]:
    """(scheduler, job_id, namespace, pod) of a report document of `kind` (None: throughput), checked."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"version {doc.get('version')!r}: expected {FORMAT_VERSION}")
    if doc.get("kind") != kind:
        raise ValueError(f"kind {doc.get('kind')!r}: expected {kind or 'none (a throughput report)'}")
    scheduler = doc.get("scheduler")
    job_id, namespace, pod = (doc.get(k) or "" for k in ("job_id", "namespace", "pod"))
    if not all(isinstance(v, str) for v in (job_id, namespace, pod)):
        raise ValueError("job_id, namespace and pod must be strings")
    if scheduler == "slurm":
        if not JOB_ID_RE.match(job_id):
            raise ValueError(f"job_id {job_id[:60]!r} is not a Slurm job id")
        namespace = pod = ""
    elif scheduler == "kubernetes":
        if not (K8S_NAME_RE.match(namespace) and K8S_NAME_RE.match(pod)):
            raise ValueError(f"{namespace[:60]!r}/{pod[:60]!r} is not a Kubernetes namespace/pod")
        job_id = ""
    else:
        raise ValueError(f"scheduler {scheduler!r}: expected slurm or kubernetes")
    return scheduler, job_id, namespace, pod


def _number(doc: dict, key: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{key} {v!r}: expected a finite number >= 0")
    return float(v)
